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

#: launch at least this many programs when the output can be split (a few per SM of an H200)
MIN_PROGRAMS = 528


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl

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
            has = slot >= 0
            s = tl.maximum(slot, 0)
            scale = tl.where(has, tl.load(SCALE + row), 0.0)  # a row without an adapter adds zeros
            offs_m = pid_m * BM + tl.arange(0, BM)
            offs_r = tl.arange(0, R)
            m_ok = offs_m[:, None] < N
            acc = tl.zeros((BM, R), dtype=tl.float32)
            for k0 in range(0, K, BK):
                offs_k = k0 + tl.arange(0, BK)
                k_ok = offs_k < K
                x = tl.load(X + row * sxb + offs_m[:, None] * sxn + offs_k[None, :], mask=m_ok & k_ok[None, :],
                            other=0.0)
                a = tl.load(A + s * sas + offs_r[None, :] * sar + offs_k[:, None], mask=k_ok[:, None], other=0.0)
                if F32DOT:
                    x, a = x.to(tl.float32), a.to(tl.float32)
                if IEEE:
                    acc += tl.dot(x, a, input_precision="ieee")
                else:
                    acc += tl.dot(x, a)
            xa = (acc * scale).to(X.dtype.element_ty)
            if F32DOT:
                xa = xa.to(tl.float32)
            for o0 in range(o_begin, o_end, BO):
                offs_o = o0 + tl.arange(0, BO)
                o_ok = offs_o < o_end
                bt = tl.load(B + s * sbs + offs_o[None, :] * sbo + offs_r[:, None], mask=o_ok[None, :], other=0.0)
                if F32DOT:
                    bt = bt.to(tl.float32)
                if IEEE:
                    d = tl.dot(xa, bt, input_precision="ieee")
                else:
                    d = tl.dot(xa, bt)
                ptr = Y + row * syb + offs_m[:, None] * syn + offs_o[None, :]
                mask = m_ok & o_ok[None, :]
                out = tl.load(ptr, mask=mask, other=0.0).to(tl.float32) + d
                if GELU:  # tanh GELU: 0.5 * (1 + tanh(u)) == sigmoid(2u)
                    out = out * tl.sigmoid(1.5957691216057308 * (out + 0.044715 * out * out * out))
                tl.store(ptr, out.to(Y.dtype.element_ty), mask=mask)

    return segmented_lora


def _check(x, y, a, b, slots, scales) -> None:
    if x.dim() != 3 or y.dim() != 3 or x.shape[:2] != y.shape[:2]:
        raise ValueError(f"x {tuple(x.shape)} and y {tuple(y.shape)} must be [B, N, K] and [B, N, OUT]")
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[1] != b.shape[2]:
        raise ValueError(f"a {tuple(a.shape)} / b {tuple(b.shape)} must be [S, R, K] / [S, OUT, R]")
    if a.shape[2] != x.shape[2] or b.shape[1] != y.shape[2]:
        raise ValueError(f"adapter dims {tuple(a.shape)}/{tuple(b.shape)} do not fit "
                         f"x {tuple(x.shape)} y {tuple(y.shape)}")
    if slots.shape != (x.shape[0],) or scales.shape != (x.shape[0],):
        raise ValueError("slots and scales need one entry per row")


def lora_delta_(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
                scales: torch.Tensor, impl: str = "torch", act: str | None = None) -> torch.Tensor:
    """Add each row's low-rank delta into ``y`` (see the module docstring); returns ``y``.
    ``slots``: int32 [B] (-1: no adapter), ``scales``: fp32 [B], both on ``x``'s device.
    ``act="gelu_tanh"``: then apply the tanh GELU to every row of ``y`` in the same pass (the
    FFN's first layer, whose activation follows the delta)."""
    _check(x, y, a, b, slots, scales)
    if act not in (None, "gelu_tanh"):
        raise ValueError(f"act must be None or 'gelu_tanh', got {act!r}")
    if impl == "triton":
        return _triton(x, y, a, b, slots, scales, act == "gelu_tanh")
    if impl != "torch":
        raise ValueError(f"impl must be 'triton' or 'torch', got {impl!r}")
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


def _interpreting() -> bool:
    # Triton's CPU interpreter computes bf16/fp16 tl.dot wrongly (checked with triton 3.9):
    # there the operands go up to fp32 first, which is what the GPU's tensor cores accumulate in
    import os
    return os.environ.get("TRITON_INTERPRET") == "1"


def _triton(x, y, a, b, slots, scales, gelu: bool = False):
    import triton
    if x.stride(2) != 1 or y.stride(2) != 1 or a.stride(2) != 1 or b.stride(2) != 1:
        raise ValueError("the Triton path needs unit stride along the feature dims")
    bsz, n, k = x.shape
    out, r = y.shape[2], a.shape[1]
    if r < 16 or r & (r - 1):
        raise ValueError(f"the Triton path needs a power-of-two rank >= 16, got {r}")
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
                    R=r, BM=bm, BK=64, BO=bo, IEEE=x.dtype == torch.float32,
                    F32DOT=x.dtype == torch.float32 or _interpreting(), GELU=gelu)
    return y
