"""Segmented low-rank delta: each row of a batch gets its own LoRA adapter (or none).

``lora_delta_(x, y, a, b, slots, scales)`` adds, for every batch row ``r`` with ``slots[r] >= 0``,

    y[r] += scales[r] * (x[r] @ a[slots[r]].T) @ b[slots[r]].T

in place. ``a`` is ``[S, R, K]`` and ``b`` ``[S, OUT, R]``: the stacked down/up weights of the
adapters resident in ``S`` slots, zero-padded to one rank ``R`` (padding adds exact zeros), so a
batch that mixes adapters is one launch per adapted layer whatever the mix (what Punica's SGMV
and S-LoRA do for language models). ``x`` is ``[B, N, K]``, ``y`` ``[B, N, OUT]``; both may be
strided views along the last dimension (a slice of a fused QKV output).

Numerics (both implementations): the down projection accumulates in fp32, is scaled, then
rounded once to the activation dtype; the up projection accumulates in fp32 and the sum with
``y`` is rounded once -- as PEFT's ``lora_B(lora_A(x)) * scaling`` added to the base output.

``impl="triton"``: one fused kernel (down projection of a token tile kept in registers, then
the up projection tile by tile, added into ``y``); rows without an adapter exit at once. When
there are few token tiles (short clips) the output columns are split over more programs, each
recomputing its tile's rank-``R`` down projection. On a CPU it runs only under
``TRITON_INTERPRET=1``. ``impl="torch"``: a loop over the slots in use.
"""
from __future__ import annotations

import functools

import torch

from fastvideo3.kernels import lora_common as lc

#: launch at least this many programs when the output can be split (a few per SM of an H200)
MIN_PROGRAMS = 528


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl
    lc.jit()

    @triton.jit
    def segmented_lora(X, Y, A, B, SLOT, SCALE, N, K, OUT, OSPLIT,
                       sxb, sxn, syb, syn, sas, sar, sbs, sbo,
                       R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BO: tl.constexpr,
                       IEEE: tl.constexpr, F32DOT: tl.constexpr, GELU: tl.constexpr):
        pid_m = tl.program_id(0)
        row = tl.program_id(1)
        o_begin = tl.program_id(2) * OSPLIT  # this program's share of the output columns
        o_end = tl.minimum(o_begin + OSPLIT, OUT)
        slot = tl.load(SLOT + row)
        go = slot >= 0  # rows without an adapter are left as they are ...
        if GELU:
            go = slot >= -1  # ... unless every row gets the activation
        if go:
            has, s, scale = lc.adapter(slot, SCALE, row)  # a row without an adapter adds zeros
            offs_m = pid_m * BM + tl.arange(0, BM)
            offs_r = tl.arange(0, R)
            m_ok = offs_m[:, None] < N
            acc = tl.zeros((BM, R), dtype=tl.float32)
            for k0 in range(0, K, BK):  # not lc.down: its hoisted weight pointers compile differently here
                offs_k = k0 + tl.arange(0, BK)
                k_ok = offs_k < K
                x = tl.load(X + row * sxb + offs_m[:, None] * sxn + offs_k[None, :], mask=m_ok & k_ok[None, :],
                            other=0.0)
                a = tl.load(A + s * sas + offs_r[None, :] * sar + offs_k[:, None], mask=k_ok[:, None], other=0.0)
                acc = lc.mma(acc, x, a, IEEE, F32DOT)
            xa = (acc * scale).to(X.dtype.element_ty)
            if F32DOT:
                xa = xa.to(tl.float32)
            for o0 in range(o_begin, o_end, BO):
                offs_o = o0 + tl.arange(0, BO)
                o_ok = offs_o < o_end
                d = lc.up(xa, B, s, sbs, sbo, offs_o, o_ok, offs_r, IEEE, F32DOT)
                ptr = Y + row * syb + offs_m[:, None] * syn + offs_o[None, :]
                mask = m_ok & o_ok[None, :]
                out = tl.load(ptr, mask=mask, other=0.0).to(tl.float32) + d
                if GELU:
                    out = lc.gelu_tanh(out)
                tl.store(ptr, out.to(Y.dtype.element_ty), mask=mask)

    return segmented_lora


def lora_delta_(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
                scales: torch.Tensor, impl: str = "torch", act: str | None = None) -> torch.Tensor:
    """Add each row's low-rank delta into ``y`` (see the module docstring); returns ``y``.
    ``slots``: int32 [B] (-1: no adapter), ``scales``: fp32 [B], both on ``x``'s device.
    ``act="gelu_tanh"``: then apply the tanh GELU to every row of ``y`` in the same pass (the
    FFN's first layer, whose activation follows the delta)."""
    lc.check_operands(x, y, a, b, slots, scales)
    lc.check_act(act)
    if impl != "torch":
        lc.check_impl(impl)
        return _triton(x, y, a, b, slots, scales, act == "gelu_tanh")
    acc = y.float() if act else None  # with the activation: round once, after it
    for s in torch.unique(slots).tolist():  # host sync: the CPU path only
        if s < 0:
            continue
        rows = (slots == s).nonzero().flatten()
        xa = torch.matmul(x[rows].float(), a[s].float().t()) * scales[rows].view(-1, 1, 1)
        d = torch.matmul(xa.to(x.dtype).float(), b[s].float().t())
        if acc is not None:
            acc[rows] += d
        else:
            y[rows] = (y[rows].float() + d).to(y.dtype)
    if acc is not None:
        y.copy_(torch.nn.functional.gelu(acc, approximate="tanh").to(y.dtype))
    return y


def _triton(x, y, a, b, slots, scales, gelu: bool = False):
    import triton
    lc.check_unit_stride(x, y, a, b)
    bsz, n, k = x.shape
    out, r = y.shape[2], a.shape[1]
    lc.check_rank(r)
    bm, bo = (64 if n >= 64 else 16), 64
    # few token tiles (short clips): split the output columns over more programs so the GPU fills
    # up; each recomputes its tile's down projection (cheap: rank columns only)
    tiles = triton.cdiv(n, bm) * bsz
    splits = max(1, min(triton.cdiv(MIN_PROGRAMS, tiles), triton.cdiv(out, bo)))
    osplit = triton.cdiv(triton.cdiv(out, splits), bo) * bo
    grid = (triton.cdiv(n, bm), bsz, triton.cdiv(out, osplit))
    _kernel()[grid](x, y, a, b, slots, scales, n, k, out, osplit,
                    x.stride(0), x.stride(1), y.stride(0), y.stride(1),
                    a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                    R=r, BM=bm, BK=64, BO=bo, GELU=gelu, **lc.dot_flags(x.dtype))
    return y
