"""The Wan VAE's channel RMS norm (diffusers' ``WanRMS_norm``), optionally followed by SiLU, in
one pass over the activations.

diffusers computes ``F.normalize(x.float(), dim=1).to(x.dtype) * sqrt(C) * gamma + bias`` and
then ``SiLU``: six full passes over a decoder activation (the fp32 copy, the norm, the division,
three products/sums) plus the SiLU's. :func:`rms_norm_silu` reads ``x`` once and writes the
result once, into a fresh tensor or into ``out`` (a view of the next causal convolution's padded
input, so that convolution's copy disappears too).

``impl="triton"`` runs one program per block of rows of one sample, a row being one
``(t, h, w)`` position's ``C`` channels: a contiguous run in a channels-last tensor (the
layout cuDNN's channels-last convolutions write); a channels-first tensor works too (coalesced
across positions instead). It accumulates the row's sum of squares in fp32 and rounds to the
activation dtype after each step where diffusers rounds (the normalised value, ``* sqrt(C)``,
``* gamma``, ``+ bias``, SiLU), so it differs from diffusers only in the last fp32 bits before
those roundings (the sum's order, one correctly rounded reciprocal per row, the GPU's fast
``exp``). A layout whose spatial dims do not collapse to one strided run, a gamma of another
dtype than ``x``, or ``impl="torch"`` take the PyTorch twin: diffusers' own expression.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from fastvideo3.kernels.fused import triton_available

#: elements of ``x`` one Triton program handles (rows x padded channels)
TILE = 4096


def _low_precision(dtype: torch.dtype) -> bool:
    """Whether diffusers normalises in fp32 for this dtype (``WanRMS_norm.forward``'s test)."""
    return dtype in (torch.float16, torch.bfloat16) or any(t in str(dtype) for t in ("float4_", "float8_"))


def row_layout(t: torch.Tensor) -> tuple[int, int, int] | None:
    """``(sample, position, channel)`` strides of ``t`` [B, C, *spatial] when its spatial dims
    collapse to one run of positions a fixed stride apart (channels-last, channels-first, or a
    time slice of either); None otherwise."""
    if t.dim() < 3:
        return None
    pstride, expected = None, None
    for d in range(t.dim() - 1, 1, -1):
        if t.shape[d] == 1:
            continue
        if pstride is None:
            pstride = t.stride(d)
        elif t.stride(d) != expected:
            return None
        expected = t.stride(d) * t.shape[d]
    return t.stride(0), 1 if pstride is None else pstride, t.stride(1)


def _torch(x: torch.Tensor, gamma: torch.Tensor, bias, eps: float, silu: bool, scale: float) -> torch.Tensor:
    g = gamma.reshape(x.shape[1], *[1] * (x.dim() - 2))
    b = bias.reshape(g.shape) if isinstance(bias, torch.Tensor) else bias
    n = F.normalize(x.float() if _low_precision(x.dtype) else x, dim=1, eps=eps).to(x.dtype)
    y = n * scale * g + b
    return F.silu(y) if silu else y


@functools.lru_cache(maxsize=1)
def _kernel():
    """Define the kernel on first use (Triton decides at definition whether to interpret)."""
    import triton
    import triton.language as tl

    # P (positions per sample) only bounds the mask: not specialising it keeps one compiled
    # variant per layer width and layout instead of one per frame count
    @triton.jit(do_not_specialize=["P"])
    def rms_norm_silu_kernel(x_ptr, g_ptr, b_ptr, o_ptr, P, C, scale, eps,
                             xsb, xsp, xsc, osb, osp, osc,
                             HAS_BIAS: tl.constexpr, SILU: tl.constexpr, ROUND: tl.constexpr,
                             BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        # grid (position blocks, samples): no per-row division to find a row's sample
        sample = tl.program_id(1).to(tl.int64)
        pos = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        cols64 = cols.to(tl.int64)
        mask = (pos < P)[:, None] & cmask[None, :]
        x = tl.load(x_ptr + (sample * xsb + pos * xsp)[:, None] + (cols64 * xsc)[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        # F.normalize: x / max(||x||, eps); one reciprocal per row (the sum's order already moves
        # the last fp32 bit, and a division per element would make this pass compute-bound).
        # IEEE-rounded sqrt and division: on CUDA, tl.sqrt and `/` are approximate (a few ulps
        # off per row, which flips more of the bf16 roundings after it); once per row, free here
        inv = tl.div_rn(1.0, tl.maximum(tl.sqrt_rn(tl.sum(x * x, axis=1)), eps))
        y = x * inv[:, None]
        odt = o_ptr.dtype.element_ty
        if ROUND:  # diffusers rounds to the activation dtype after each op
            y = y.to(odt).to(tl.float32)
        y = y * scale
        if ROUND:
            y = y.to(odt).to(tl.float32)
        y = y * tl.load(g_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            if ROUND:
                y = y.to(odt).to(tl.float32)
            y = y + tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        if SILU:
            if ROUND:
                y = y.to(odt).to(tl.float32)
            y = y / (1.0 + tl.exp(-y))
        tl.store(o_ptr + (sample * osb + pos * osp)[:, None] + (cols64 * osc)[None, :], y.to(odt), mask=mask)

    return rms_norm_silu_kernel


def default_impl(x: torch.Tensor) -> str:
    """``triton`` for a CUDA tensor when Triton is installed, else ``torch``."""
    return "triton" if x.is_cuda and triton_available() else "torch"


def rms_norm_silu(x: torch.Tensor, gamma: torch.Tensor, bias: torch.Tensor | float | None = None,
                  eps: float = 1e-12, silu: bool = False, *, scale: float | None = None,
                  out: torch.Tensor | None = None, impl: str | None = None) -> torch.Tensor:
    """``WanRMS_norm`` over dim 1 of ``x`` [B, C, *spatial] (``gamma``/``bias``: C values, any
    broadcastable shape), then SiLU when ``silu``; ``scale`` defaults to ``sqrt(C)``. Written to
    ``out`` (shaped like ``x``, any strides) when given, else to a tensor like ``x`` (its memory
    format kept). Returns the result."""
    c = x.shape[1]
    scale = c ** 0.5 if scale is None else scale
    bias = None if isinstance(bias, (int, float)) and bias == 0 else bias
    if out is not None and out.shape != x.shape:
        raise ValueError(f"rms_norm_silu: out {list(out.shape)} is not shaped like x {list(x.shape)}")
    impl = impl or default_impl(x)
    if impl not in ("torch", "triton"):
        raise ValueError(f"rms_norm_silu: impl must be 'torch' or 'triton', got {impl!r}")
    fits = (impl == "triton" and x.numel() > 0 and gamma.dtype == x.dtype and gamma.numel() == c
            and (out is None or out.dtype == x.dtype)
            and (bias is None or (isinstance(bias, torch.Tensor) and bias.dtype == x.dtype and bias.numel() == c)))
    xs = row_layout(x) if fits else None
    if xs is not None and out is None:
        out = torch.empty_like(x)
    os_ = row_layout(out) if xs is not None else None
    if os_ is None:
        y = _torch(x, gamma, 0.0 if bias is None else bias, eps, silu, scale)
        return y if out is None else out.copy_(y)
    import triton
    block_c = triton.next_power_of_2(c)
    block_r = max(1, TILE // block_c)
    g = gamma.reshape(c).contiguous()
    b = bias.reshape(c).contiguous() if bias is not None else g
    positions = x.numel() // (c * x.shape[0])
    _kernel()[(triton.cdiv(positions, block_r), x.shape[0])](
        x, g, b, out, positions, c, float(scale), float(eps), *xs, *os_,
        HAS_BIAS=bias is not None, SILU=silu, ROUND=x.dtype != torch.float32,
        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)
    return out
