"""The FP8 kernels' alternative formulations (the bench times them against the defaults) compute
the defaults' values: the FFN-in GEMM through tensor descriptors (one tile a program, and
persistent) against its pointer kernel, and the QKV pass read flat against its pairs kernel.

Triton kernels: these run on a GPU, or on a CPU under Triton's interpreter (in a child process
started by test_fp8_kernel_variants_interpreter.py, so ``TRITON_INTERPRET`` never leaks into other
tests). Under the interpreter a variant must equal its default bit for bit (both go through the
same fp32 -> e4m3 cast there, which rounds some values at binade boundaries a step apart from
PyTorch's, so against the PyTorch twin only most codes agree); on a GPU, within one step.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [
    pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRET),
                       reason="needs a GPU, or the Triton interpreter: on a CPU "
                              "test_fp8_kernel_variants_interpreter.py runs this file in a child process"),
    pytest.mark.timeout(300),
]

DEV = "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"
STEP, TINY = 0.125, 2.0 ** -9  # one e4m3 step at the top of a binade; the subnormal step


def _same(a: torch.Tensor, b: torch.Tensor, *, steps: int = 1) -> None:
    if INTERPRET:
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    else:
        x, y = a.float(), b.float()
        assert ((x - y).abs() <= steps * STEP * y.abs() + 4 * TINY).all()
        assert (x == y).float().mean() > 0.9


def _mostly_like_twin(q: torch.Tensor, twin: torch.Tensor, share: float) -> None:
    assert (q.float() == twin.float()).float().mean() > share


@pytest.mark.parametrize("shape", [(100, 96, 192), (70, 64, 200)])  # 200 columns: not 16-byte aligned
def test_ffn_in_tma_kernels_equal_the_pointer_kernel(shape):
    from fastvideo3.kernels.fp8 import quantize_rows, quantize_weight
    from fastvideo3.kernels.fp8_gemm import CONFIGS, KERNELS, ffn_in_gelu_fp8, weight_stats
    m, k, n = shape
    g = torch.Generator(device=DEV).manual_seed(n)
    xq, xs = quantize_rows(torch.randn(2, m, k, generator=g, device=DEV).bfloat16())
    wq, ws = quantize_weight(torch.randn(n, k, generator=g, device=DEV) / math.sqrt(k))
    bias = (0.1 * torch.randn(n, generator=g, device=DEV)).bfloat16()
    stats = weight_stats(wq, ws, bias)
    twin_q, twin_s = ffn_in_gelu_fp8(xq, xs, wq, ws, bias, *stats, impl="torch")
    # the interpreter takes small tiles (the same code; the tiles only set how it is cut up)
    configs = [(32, 64, 32, 4, 4, 2, kind) for kind in KERNELS] if INTERPRET else \
        [(32, 64, 32, 4, 4, 2, "pointer")] + [c for c in CONFIGS if c[6] != "pointer"]
    ref_q, ref_s = ffn_in_gelu_fp8(xq, xs, wq, ws, bias, *stats, impl="triton", config=configs[0])
    torch.testing.assert_close(ref_s, twin_s, rtol=1e-5, atol=0)
    _mostly_like_twin(ref_q, twin_q, 0.9)
    for cfg in configs[1:]:
        q, s = ffn_in_gelu_fp8(xq, xs, wq, ws, bias, *stats, impl="triton", config=cfg)
        assert q.shape == (2, m, n) and s.shape == (2, m, 1)
        torch.testing.assert_close(s, ref_s, rtol=0, atol=0)
        _same(q, ref_q, steps=2)


def test_ffn_in_rejects_an_unknown_kernel():
    from fastvideo3.kernels.fp8 import quantize_rows, quantize_weight
    from fastvideo3.kernels.fp8_gemm import ffn_in_gelu_fp8, weight_stats
    xq, xs = quantize_rows(torch.randn(1, 16, 32, device=DEV))
    wq, ws = quantize_weight(torch.randn(48, 32, device=DEV))
    bias = torch.zeros(48, device=DEV).bfloat16()
    with pytest.raises(ValueError, match="kernel must be one of"):
        ffn_in_gelu_fp8(xq, xs, wq, ws, bias, *weight_stats(wq, ws, bias), impl="triton",
                        config=(32, 64, 32, 4, 4, 2, "wgmma"))


def _qkv_case(seed: int, heads: int, hd: int, grid=(2, 3, 5)):
    from fastvideo3.kernels.fp8 import qk_scale_bound
    from fastvideo3.kernels.fused import RopeGrid
    from fastvideo3.models.wan.dit import rope_tables
    d, n = heads * hd, grid[0] * grid[1] * grid[2]
    g = torch.Generator(device=DEV).manual_seed(seed)
    qkv = torch.randn(2, n, 3 * d, generator=g, device=DEV).bfloat16()
    norm = torch.rand(2, d, generator=g, device=DEV) + 0.5
    cos, sin = rope_tables(hd, 16)
    rope = RopeGrid(cos.to(DEV), sin.to(DEV), grid, hd - 2 * (2 * (hd // 6)), 2 * (hd // 6))
    bounds = torch.stack([qk_scale_bound(norm[0], heads), qk_scale_bound(norm[1], heads)])
    return qkv, norm, rope, bounds, heads


@pytest.mark.parametrize("heads,hd", [(2, 64), (3, 32)])  # 96 columns: a padded row
@pytest.mark.parametrize("scales", ["bound", "smooth_k"])
@pytest.mark.parametrize("split", [False, True])
def test_qkv_flat_kernel_equals_the_pairs_kernel(heads, hd, scales, split):
    from fastvideo3.kernels.fp8 import _launch_qkv, qk_stats, qkv_fp8
    from fastvideo3.kernels.fused import qk_norm_rope
    qkv, norm, rope, bounds, heads = _qkv_case(heads * hd, heads, hd)
    twin_q, scales_t = qkv_fp8(qkv, norm, bounds, heads=heads, eps=1e-6, rope=rope, impl="torch", scales=scales,
                               split=split)
    mean = None
    if scales == "smooth_k":
        qk = qk_norm_rope(qkv, norm, parts=2, eps=1e-6, heads=heads, rope=rope, impl="torch")
        mean = qk_stats(qk, heads, True)[1]
    pairs = _launch_qkv(qkv, norm, 1.0 / scales_t, mean, rope, heads=heads, eps=1e-6, split=split, kernel="pairs")
    flat = _launch_qkv(qkv, norm, 1.0 / scales_t, mean, rope, heads=heads, eps=1e-6, split=split, kernel="flat")
    assert flat.shape == twin_q.shape == pairs.shape
    _mostly_like_twin(pairs, twin_q, 0.9)
    if INTERPRET:  # the two formulations round their fp32 products in a different order
        a, b = flat.float(), pairs.float()
        assert ((a - b).abs() <= STEP * b.abs() + TINY).all() and (a == b).float().mean() > 0.98
    else:
        _same(flat, pairs)


def test_qkv_fp8_rejects_an_unknown_kernel():
    from fastvideo3.kernels.fp8 import qkv_fp8
    qkv, norm, rope, bounds, heads = _qkv_case(1, 2, 64)
    with pytest.raises(ValueError, match="kernel must be one of"):
        qkv_fp8(qkv, norm, bounds, heads=heads, eps=1e-6, rope=rope, kernel="tiles")


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("modulate,has_y,has_gate", [(True, True, True), (False, True, False), (True, False, False)])
def test_looped_add_norm_equals_the_per_row_kernel(fp8, modulate, has_y, has_gate):
    from fastvideo3.kernels import add_norm
    g = torch.Generator(device=DEV).manual_seed(int(fp8) + 2 * modulate + 4 * has_y)
    b, n, d = 2, 37, 96  # 37 rows: not a multiple of the loop; 96 columns: a padded row
    x = torch.randn(b, n, d, generator=g, device=DEV).bfloat16()
    y = torch.randn(b, n, d, generator=g, device=DEV).bfloat16() if has_y else None
    gate = torch.randn(b, d, generator=g, device=DEV) if has_gate else None
    a = torch.randn(b, d, generator=g, device=DEV) if modulate else torch.randn(d, generator=g, device=DEV)
    shift = torch.randn_like(a)
    outs = []
    for loop in (0, 8):
        xi = x.clone()
        out = add_norm(xi, y, gate, a, shift, modulate=modulate, eps=1e-6, impl="triton", fp8=fp8, loop=loop)
        outs.append((xi, out))
    (x0, h0), (x1, h1) = outs
    assert torch.equal(x0, x1)
    if fp8:
        assert torch.equal(h0[1], h1[1])
        _same(h1[0], h0[0])
    else:
        assert torch.equal(h0, h1)
    if INTERPRET and has_y:  # the interpreter truncates fp32 -> bf16 (the residual): no twin check
        return
    twin = add_norm(x.clone(), y, gate, a, shift, modulate=modulate, eps=1e-6, impl="torch", fp8=fp8)
    if fp8:
        torch.testing.assert_close(h1[1], twin[1], rtol=1e-5, atol=0)
    else:
        torch.testing.assert_close(h1.float(), twin.float(), rtol=1e-2, atol=1e-2)
