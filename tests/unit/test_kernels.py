"""The fused ops' PyTorch path against the reference model's own expressions, and the Triton
kernels against both, on a CPU through Triton's interpreter.

The Triton checks live in ``test_kernels_triton.py``. Triton chooses between compiling and
interpreting when a kernel is defined, so they run here in a child pytest with
``TRITON_INTERPRET=1`` (on a CUDA machine that file runs compiled, in-process, as well).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fastvideo3.kernels import add_norm, qk_norm_rope, triton_available
from fastvideo3.kernels.fused import RopeGrid
from fastvideo3.models.wan.dit import _layer_norm_fp32, apply_rope, rope_tables
from tests.helpers_env import triton_interpreter_env

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_add_norm_torch_matches_block_expressions():
    g = torch.Generator().manual_seed(0)
    b, n, d = 2, 7, 48
    x = torch.randn(b, n, d, generator=g).bfloat16()
    y = torch.randn(b, n, d, generator=g).bfloat16()
    gate, scale, shift = (torch.randn(b, 1, d, generator=g) for _ in range(3))
    # what Block.forward does: gated residual, then the modulated fp32 norm
    x_ref = (x.float() + y * gate).type_as(x)
    h_ref = (_layer_norm_fp32(x_ref, 1e-6) * (1 + scale) + shift).type_as(x)
    xx = x.clone()
    h = add_norm(xx, y, gate[:, 0], scale[:, 0], shift[:, 0], modulate=True, eps=1e-6, impl="torch")
    assert torch.equal(xx, x_ref) and torch.equal(h, h_ref)
    # ungated residual + affine norm (the cross-attention path)
    w, bias = torch.randn(d, generator=g), torch.randn(d, generator=g)
    xx = x.clone()
    h = add_norm(xx, y, None, w, bias, modulate=False, eps=1e-6, impl="torch")
    assert torch.equal(xx, x + y)
    assert torch.equal(h, _layer_norm_fp32(x + y, 1e-6, w, bias).type_as(x))


def test_qk_norm_rope_torch_matches_attention_expressions():
    g = torch.Generator().manual_seed(1)
    b, grid, heads, hd = 2, (2, 3, 4), 3, 16
    n, d = grid[0] * grid[1] * grid[2], heads * hd
    qkv = torch.randn(b, n, 3 * d, generator=g)
    wq, wk = torch.rand(d, generator=g) + 0.5, torch.rand(d, generator=g) + 0.5
    cos, sin = rope_tables(hd, 8)
    hw = 2 * (hd // 6)
    rope = RopeGrid(cos, sin, grid, hd - 2 * hw, hw)
    out = qk_norm_rope(qkv, torch.stack([wq, wk]), parts=2, eps=1e-6, heads=heads, rope=rope, impl="torch")
    c, s = rope.tables()
    c, s = c.view(1, n, 1, hd), s.view(1, n, 1, hd)
    for part, w in enumerate((wq, wk)):
        ref = F.rms_norm(qkv[..., part * d:(part + 1) * d], (d,), w, 1e-6).unflatten(2, (heads, hd))
        ref = apply_rope(ref, c, s).flatten(2)
        torch.testing.assert_close(out[..., part * d:(part + 1) * d], ref, atol=1e-5, rtol=1e-5)


def test_rope_grid_tables_match_the_models_rope():
    from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig
    cfg = WanDiTConfig(num_attention_heads=2, attention_head_dim=16, text_dim=8, freq_dim=8, ffn_dim=8,
                       num_layers=1, rope_max_seq_len=16)
    model = WanDiT(cfg)
    cos, sin = model.rope(3, 4, 5)
    hw = 2 * (16 // 6)
    grid = RopeGrid(model.rope_cos, model.rope_sin, (3, 4, 5), 16 - 2 * hw, hw)
    c, s = grid.tables()
    assert torch.equal(c, cos.view(60, 16)) and torch.equal(s, sin.view(60, 16))


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the Triton file runs in-process already")
def test_triton_kernels_under_the_interpreter():
    env = triton_interpreter_env()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_kernels_triton.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=110,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]
