"""Triton kernels against their PyTorch twins, and the Triton fast path against the model.

Runs compiled on a CUDA device, or on a CPU under ``TRITON_INTERPRET=1`` (``test_kernels.py``
starts it that way in a child process); skipped otherwise. Inputs are random and drawn fresh
per case; outputs are compared everywhere, so an unwritten element fails.
"""
from __future__ import annotations

import os

import pytest
import torch

from tests.helpers_triton import CUDA, DEV, INTERPRET, MARKS  # noqa: E402 - skips without triton

pytestmark = MARKS
WIDTHS = [48, 1536, 5120] if CUDA else [48]

from fastvideo3.kernels import add_norm, qk_norm_rope  # noqa: E402
from fastvideo3.kernels.fused import RopeGrid  # noqa: E402
from fastvideo3.models.wan.components import keep_reference_fp32  # noqa: E402
from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig, rope_tables  # noqa: E402


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(got).all()
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    else:  # one rounding apart at most: a bf16 ulp (the interpreter truncates where a GPU rounds to nearest)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=8e-3)
        assert float((got.float() - want.float()).norm() / want.float().norm()) < (8e-3 if INTERPRET else 3e-3)


def _poison(nbytes: int) -> None:
    """Leave NaNs in the allocator's next free block, so an unwritten output shows."""
    if CUDA:
        torch.full((nbytes // 4 + 1,), float("nan"), device=DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", WIDTHS)
@pytest.mark.parametrize("mode", ["norm_only", "gated_modulated", "residual_modulated", "gated_affine"])
def test_add_norm_matches_torch(dtype, d, mode):
    g = _gen(d + len(mode))
    b, n = 2, 3
    x = torch.randn(b, n, d, generator=g, device=DEV).to(dtype)
    y = None if mode == "norm_only" else torch.randn(b, n, d, generator=g, device=DEV).to(dtype)
    mod = torch.randn(3, b, 6, d, generator=g, device=DEV)  # the fast path slices per-block chunks like this
    gate = mod[1, :, 2] if mode.startswith("gated") else None
    if mode == "gated_affine":
        a, bias, modulate = torch.randn(d, generator=g, device=DEV), torch.randn(d, generator=g, device=DEV), False
    else:
        a, bias, modulate = mod[2, :, 1], mod[2, :, 0], True
    x_ref, x_tri = x.clone(), x.clone()
    want = add_norm(x_ref, y, gate, a, bias, modulate=modulate, eps=1e-6, impl="torch")
    _poison(x.numel() * x.element_size())
    got = add_norm(x_tri, y, gate, a, bias, modulate=modulate, eps=1e-6, impl="triton")
    _close(x_tri, x_ref, dtype)
    _close(got, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [3] + ([12, 40] if CUDA else []))
@pytest.mark.parametrize("rope", [True, False])
def test_qk_norm_rope_matches_torch(dtype, heads, rope):
    g = _gen(heads * 2 + rope)
    hd = 128 if CUDA else 16
    grid = (3, 4, 5) if CUDA else (2, 2, 3)
    b, n, d = 2, grid[0] * grid[1] * grid[2], heads * hd
    parts = 2 if rope else 1
    src = torch.randn(b, n, 3 * d, generator=g, device=DEV).to(dtype) * 3  # rows with stride 3D, like fused QKV
    w = (torch.rand(parts, d, generator=g, device=DEV) + 0.5).to(dtype)
    hw = 2 * (hd // 6)
    cos, sin = rope_tables(hd, 16)
    spec = RopeGrid(cos.to(DEV), sin.to(DEV), grid, hd - 2 * hw, hw) if rope else None
    want = qk_norm_rope(src, w, parts=parts, eps=1e-6, heads=heads, rope=spec, impl="torch")
    _poison(want.numel() * want.element_size())
    got = qk_norm_rope(src, w, parts=parts, eps=1e-6, heads=heads, rope=spec, impl="triton")
    _close(got, want, dtype)


def _tiny_dit(dtype: torch.dtype) -> WanDiT:
    torch.manual_seed(0)
    cfg = WanDiTConfig(num_attention_heads=2, attention_head_dim=16, text_dim=32, freq_dim=32, ffn_dim=64,
                       num_layers=2, rope_max_seq_len=32)
    model = WanDiT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif p.ndim > 1 and "scale_shift_table" not in name:
                p.normal_(0, 0.2)
    if dtype != torch.float32:
        model.to(dtype)
        keep_reference_fp32(model)
    return model.to(DEV)


# the interpreter spends ~20 ms per program: one precision there, both on a GPU
@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if CUDA else []))
def test_fast_dit_with_triton_kernels_matches_the_model(dtype):
    from fastvideo3.models.wan.fast import FastWanDiT
    model = _tiny_dit(dtype)
    g = _gen(7)
    x = torch.randn(2, 16, 2, 4, 4, generator=g, device=DEV).to(dtype)
    t = torch.tensor([999.0, 3.0], device=DEV)
    text = torch.randn(2, 5, 32, generator=g, device=DEV).to(dtype)
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # the reference's patch conv would run in TF32 on a GPU
    try:
        with torch.no_grad():
            want = model(x, t, text)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    fast = FastWanDiT(model, kernels="triton", attention="sdpa")
    got = fast(x, t, text)
    assert got.shape == want.shape and got.dtype == want.dtype
    rel = float((got.float() - want.float()).norm() / want.float().norm())
    assert rel < (1e-5 if dtype == torch.float32 else 2e-2), rel
