"""The LoRA expand fused with the residual update and LayerNorm that follow a layer.

In the Wan block the self-attention output, the cross-attention output and the FFN's second
layer each feed :func:`fastvideo3.kernels.fused.add_norm` (``x += gate * y``, then the
LayerNorm of ``x``). ``lora_add_norm(xa, up, slots, x, y, gate, a, b, ...)`` does what

    lora_group_delta_ expand (y[r] += xa[r] @ up[slots[r]].T, rounded to y's dtype)
    add_norm(x, y, gate, a, b, ...)

do, in one pass over ``y``: the delta is added in registers, so ``y`` is read once and never
written back (the separate expand reads and writes it). ``xa`` is the shrink's output
(:func:`fastvideo3.kernels.lora_grouped.lora_shrink`, already scaled). Rows without an adapter
get ``y`` as it is. The LayerNorm is computed over column chunks in three passes over the row
tile (the residual written, its sum, its centred sum of squares, then the normed output; the
re-reads hit L2), in fp32 as ``add_norm`` does; the sums run in another order, so results
agree with ``add_norm`` to fp32 rounding, not bit for bit.
"""
from __future__ import annotations

import functools

import torch

from fastvideo3.kernels.fused import _per_sample
from fastvideo3.kernels.lora import _interpreting


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def lora_add_norm(XA, B, SLOT, X, Y, GATE, A_, B_, H, N, D, eps, sab, sbs, sbo,
                      gate_stride, a_stride, b_stride,
                      R: tl.constexpr, BM: tl.constexpr, BO: tl.constexpr, HAS_GATE: tl.constexpr,
                      MODULATE: tl.constexpr, F32DOT: tl.constexpr, IEEE: tl.constexpr):
        pid_m = tl.program_id(0)
        row = tl.program_id(1)
        slot = tl.load(SLOT + row)
        s = tl.maximum(slot, 0)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_r = tl.arange(0, R)
        m_ok = offs_m < N
        tok = (row * N + offs_m).to(tl.int64)  # token index in [B*N]
        xa = tl.load(XA + row * sab + offs_m[:, None] * R + offs_r[None, :],
                     mask=m_ok[:, None] & (offs_r[None, :] < R), other=0.0)  # unused without an adapter
        if F32DOT:
            xa = xa.to(tl.float32)
        total = tl.zeros((BM,), dtype=tl.float32)
        for o0 in range(0, D, BO):  # pass 1: y + delta, the gated residual, written; its row sums
            offs_o = o0 + tl.arange(0, BO)
            o_ok = offs_o < D
            mask = m_ok[:, None] & o_ok[None, :]
            ptr = tok[:, None] * D + offs_o[None, :]
            y = tl.load(Y + ptr, mask=mask, other=0.0).to(tl.float32)
            if slot >= 0:
                bt = tl.load(B + s * sbs + offs_o[None, :] * sbo + offs_r[:, None], mask=o_ok[None, :], other=0.0)
                if F32DOT:
                    bt = bt.to(tl.float32)
                if IEEE:
                    d = tl.dot(xa, bt, input_precision="ieee")
                else:
                    d = tl.dot(xa, bt)
                y = (y + d).to(Y.dtype.element_ty).to(tl.float32)  # as the expand stores it
            if HAS_GATE:
                y = y * tl.load(GATE + row * gate_stride + offs_o, mask=o_ok, other=0.0).to(tl.float32)[None, :]
            x = tl.load(X + ptr, mask=mask, other=0.0).to(tl.float32)
            xr = (x + y).to(X.dtype.element_ty)  # rounded to storage before the norm reads it
            tl.store(X + ptr, xr, mask=mask)
            total += tl.sum(tl.where(mask, xr.to(tl.float32), 0.0), axis=1)
        tl.debug_barrier()  # the residual tile this program wrote is read back below
        mean = total / D
        sq = tl.zeros((BM,), dtype=tl.float32)
        for o0 in range(0, D, BO):  # pass 2: centred sum of squares
            offs_o = o0 + tl.arange(0, BO)
            mask = m_ok[:, None] & (offs_o < D)[None, :]
            xr = tl.load(X + tok[:, None] * D + offs_o[None, :], mask=mask, other=0.0).to(tl.float32)
            diff = tl.where(mask, xr - mean[:, None], 0.0)
            sq += tl.sum(diff * diff, axis=1)
        rstd = 1.0 / tl.sqrt(sq / D + eps)
        for o0 in range(0, D, BO):  # pass 3: the normed (and modulated) output
            offs_o = o0 + tl.arange(0, BO)
            o_ok = offs_o < D
            mask = m_ok[:, None] & o_ok[None, :]
            ptr = tok[:, None] * D + offs_o[None, :]
            xr = tl.load(X + ptr, mask=mask, other=0.0).to(tl.float32)
            a = tl.load(A_ + row * a_stride + offs_o, mask=o_ok, other=0.0).to(tl.float32)
            b = tl.load(B_ + row * b_stride + offs_o, mask=o_ok, other=0.0).to(tl.float32)
            if MODULATE:
                a = a + 1.0
            h = (xr - mean[:, None]) * rstd[:, None] * a[None, :] + b[None, :]
            tl.store(H + ptr, h.to(H.dtype.element_ty), mask=mask)

    return lora_add_norm


def lora_add_norm(xa: torch.Tensor, up: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                  gate: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, *, modulate: bool, eps: float,
                  impl: str = "torch") -> torch.Tensor:
    """``y += xa @ up[slot].T`` per row (rounded to ``y.dtype``), then ``add_norm(x, y, gate, a,
    b)``: ``x`` updated in place, the normed activations returned (see the module docstring).
    ``xa`` ``[B, N, R]`` (scaled down projections; any value where ``slots < 0``), ``up``
    ``[S, D, R]``. ``impl="torch"``: the two steps as written (``y`` is updated in place)."""
    bsz, n, d = x.shape
    r = up.shape[2]
    if (x.dim() != 3 or not x.is_contiguous() or y.shape != x.shape or not y.is_contiguous()
            or xa.shape != (bsz, n, r) or up.shape[1] != d or slots.shape != (bsz,)):
        raise ValueError(f"x {tuple(x.shape)}, y {tuple(y.shape)} (contiguous), xa {tuple(xa.shape)}, "
                         f"up {tuple(up.shape)}, slots {tuple(slots.shape)} do not fit")
    if impl == "torch":
        from fastvideo3.kernels.fused import add_norm
        for row in range(bsz):  # host sync: the CPU path only
            s = int(slots[row])
            if s >= 0:
                y[row] = (y[row].float() + xa[row].float() @ up[s].float().t()).to(y.dtype)
        return add_norm(x, y, gate, a, b, modulate=modulate, eps=eps, impl="torch")
    if impl != "triton":
        raise ValueError(f"impl must be 'triton' or 'torch', got {impl!r}")
    import triton
    if not xa.is_contiguous() or up.stride(2) != 1:
        raise ValueError("the Triton path needs a contiguous xa and unit-stride up weights")
    gate_t, gate_stride = _per_sample(gate, bsz, d, "gate") if gate is not None else (x, 0)
    a_t, a_stride = _per_sample(a, bsz, d, "a")
    b_t, b_stride = _per_sample(b, bsz, d, "b")
    h = torch.empty_like(x)
    bm = 32 if triton.cdiv(n, 32) * bsz >= 264 else 16  # 16-token tiles when there are few (two per SM)
    _kernel()[(triton.cdiv(n, bm), bsz)](
        xa, up, slots, x, y, gate_t, a_t, b_t, h, n, d, eps, xa.stride(0), up.stride(0), up.stride(1),
        gate_stride, a_stride, b_stride,
        R=r, BM=bm, BO=128, HAS_GATE=gate is not None, MODULATE=modulate,
        F32DOT=x.dtype == torch.float32 or _interpreting(), IEEE=x.dtype == torch.float32, num_warps=4)
    return h
