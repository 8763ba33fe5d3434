"""Segmented low-rank delta in two passes, for a group of layers that share one input.

``lora_group_delta_(x, y, a, b, slots, scales, groups)`` adds, for every batch row ``r`` with
``slots[r] >= 0`` and every member ``g`` of the group,

    y[r, :, g*OUT_G:(g+1)*OUT_G] += scales[r] * (x[r] @ a[s, g*R:(g+1)*R].T) @ b[s, g*OUT_G:(g+1)*OUT_G].T

with ``s = slots[r]``. ``a`` is ``[S, G*R, K]`` (the members' down weights stacked along the
rank axis), ``b`` ``[S, G*OUT_G, R]`` (their up weights stacked along the output axis) and ``y``
``[B, N, G*OUT_G]`` the members' outputs side by side -- a fused QKV output, or every block's
cross-attention K and V. ``G = 1`` is a single layer.

Why two passes (``impl="triton"``): the one-pass kernel (:mod:`fastvideo3.kernels.lora`) keeps
a token tile's down projection in registers, so when there are few token tiles (short clips) it
splits the output columns over programs that each re-read their tile's whole input row -- for
the FFN's second layer (8960 inputs) that is several reads of its largest activation per call.
Here the *shrink* reads ``x`` once for all members (``xa = scale * x @ a.T``, ``[B, N, G*R]``,
fp32 accumulation, rounded once to the activation dtype) and the *expand* reads that small
tensor and updates ``y`` in place over a grid of (output tile, token tile, row) programs
(fp32 accumulation, the sum with ``y`` rounded once; optionally the tanh GELU on every row, the
FFN's first layer). Both skip rows without an adapter (the GELU pass still visits them). The
numerics are those of the one-pass kernel. Two launches per group, whatever the mix of adapters.

``impl="torch"``: the one-pass module's PyTorch path, member by member.
"""
from __future__ import annotations

import functools

import torch

from fastvideo3.kernels import lora_common as lc
from fastvideo3.kernels.lora import lora_delta_

#: aim for at least this many shrink programs (two per SM of an H200) before shrinking BM
SHRINK_PROGRAMS = 264


@functools.lru_cache(maxsize=1)
def _kernels():
    import triton
    import triton.language as tl
    lc.jit()

    @triton.jit
    def shrink(X, XA, A, SLOT, SCALE, N, K, sxb, sxn, sab, sas, sar,
               R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, F32DOT: tl.constexpr):
        g = tl.program_id(0)  # the member, fastest: the members of one token tile share its x in L2
        pid_m = tl.program_id(1)
        row = tl.program_id(2)
        slot = tl.load(SLOT + row)
        if slot >= 0:
            scale = tl.load(SCALE + row)
            offs_m = pid_m * BM + tl.arange(0, BM)
            offs_r = tl.arange(0, R)
            m_ok = offs_m[:, None] < N
            a_base = A + slot * sas + (g * R + offs_r[None, :]) * sar
            acc = lc.down(X, a_base, row, sxb, sxn, offs_m, m_ok, 0, K, BM, R, BK, IEEE, F32DOT)
            ptr = XA + row * sab + offs_m[:, None] * (R * tl.num_programs(0)) + g * R + offs_r[None, :]
            tl.store(ptr, (acc * scale).to(XA.dtype.element_ty), mask=m_ok & (offs_r[None, :] < R))

    @triton.jit
    def expand(XA, Y, B, SLOT, N, OUT, OUT_G, sab, syb, syn, sbs, sbo,
               R: tl.constexpr, BM: tl.constexpr, BO: tl.constexpr, IEEE: tl.constexpr, F32DOT: tl.constexpr,
               GELU: tl.constexpr):
        pid_o = tl.program_id(0)  # output tiles fastest: they share the token tile's xa
        pid_m = tl.program_id(1)
        row = tl.program_id(2)
        slot = tl.load(SLOT + row)
        go = slot >= 0
        if GELU:
            go = slot >= -1  # every row gets the activation
        if go:
            o0 = pid_o * BO
            g = o0 // OUT_G  # BO divides OUT_G when the group has several members
            offs_m = pid_m * BM + tl.arange(0, BM)
            offs_o = o0 + tl.arange(0, BO)
            offs_r = tl.arange(0, R)
            m_ok = offs_m[:, None] < N
            o_ok = offs_o < OUT
            mask = m_ok & o_ok[None, :]
            ptr = Y + row * syb + offs_m[:, None] * syn + offs_o[None, :]
            out = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
            if slot >= 0:
                s = tl.maximum(slot, 0)
                width = R * (OUT // OUT_G)
                xa = tl.load(XA + row * sab + offs_m[:, None] * width + g * R + offs_r[None, :],
                             mask=m_ok & (offs_r[None, :] < R), other=0.0)
                bt = tl.load(B + s * sbs + offs_o[None, :] * sbo + offs_r[:, None], mask=o_ok[None, :], other=0.0)
                out = lc.mma(out, xa, bt, IEEE, F32DOT)
            if GELU:
                out = lc.gelu_tanh(out)
            tl.store(ptr, out.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def widen(X, XW, A, SLOT, SCALE, N, K, sxb, sxn, swb, swn, sas, sar, BLOCKS,
              R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, F32DOT: tl.constexpr):
        row, slot, offs_m, offs_r = lc.row_tile(SLOT, BM, R)
        has, s, scale = lc.adapter(slot, SCALE, row)
        m_ok = offs_m[:, None] < N
        acc = tl.zeros((BM, R), dtype=tl.float32)
        for k0 in range(0, K, BK):
            offs_k = k0 + tl.arange(0, BK)
            k_ok = offs_k < K
            mask = m_ok & k_ok[None, :]
            x = tl.load(X + row * sxb + offs_m[:, None] * sxn + offs_k[None, :], mask=mask, other=0.0)
            tl.store(XW + row * swb + offs_m[:, None] * swn + offs_k[None, :], x, mask=mask)  # the copy
            a = tl.load(A + s * sas + offs_r[None, :] * sar + offs_k[:, None], mask=k_ok[:, None], other=0.0)
            acc = lc.mma(acc, x, a, IEEE, F32DOT)
        xa = tl.where(has, acc * scale, 0.0).to(XW.dtype.element_ty)
        zero = tl.zeros((BM, R), dtype=XW.dtype.element_ty)
        r_ok = m_ok & (offs_r[None, :] < R)
        for j in range(0, BLOCKS):  # the row's slot block gets its down projection, the others zeros
            val = tl.where(j == slot, xa, zero)
            tl.store(XW + row * swb + offs_m[:, None] * swn + K + j * R + offs_r[None, :], val, mask=r_ok)

    return shrink, expand, widen


def lora_group_delta_(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
                      scales: torch.Tensor, groups: int = 1, impl: str = "torch",
                      act: str | None = None) -> torch.Tensor:
    """Add each row's low-rank delta of every group member into ``y`` (see the module
    docstring); returns ``y``. ``slots`` int32 [B] (-1: none), ``scales`` fp32 [B], on ``x``'s
    device. ``act="gelu_tanh"`` applies the tanh GELU to all of ``y`` afterwards, in the same
    pass (``groups == 1`` only). No host synchronisation on the Triton path."""
    lc.check_operands(x, y, a, b, slots, scales, groups)
    lc.check_act(act)
    if act and groups != 1:
        raise ValueError("act applies to a single layer (groups == 1)")
    if impl == "torch":
        r, og = a.shape[1] // groups, y.shape[2] // groups
        for g in range(groups):
            lora_delta_(x, y[..., g * og:(g + 1) * og], a[:, g * r:(g + 1) * r], b[:, g * og:(g + 1) * og],
                        slots, scales, impl="torch", act=act)
        return y
    lc.check_impl(impl)
    lc.check_unit_stride(x, y, a, b)
    lc.check_rank(a.shape[1] // groups)
    return lora_expand_(lora_shrink(x, a, slots, scales, groups), y, b, slots, groups, act == "gelu_tanh")


def lora_expand_(xa: torch.Tensor, y: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, groups: int = 1,
                 gelu: bool = False) -> torch.Tensor:
    """The Triton expand alone: ``y[r, :, member g] += xa[r, :, g*R:(g+1)*R] @ b[slots[r], member g].T``
    in place (then the tanh GELU on every row with ``gelu``); ``xa`` ``[B, N, G*R]`` contiguous,
    the shrink's scaled output (:func:`lora_shrink`, or a fused one). Returns ``y``."""
    import triton
    bsz, n, out = y.shape
    r = b.shape[2]
    if xa.shape != (bsz, n, groups * r) or not xa.is_contiguous() or b.shape[1] != out or out % groups:
        raise ValueError(f"xa {tuple(xa.shape)} (contiguous), y {tuple(y.shape)}, b {tuple(b.shape)} do not fit "
                         f"{groups} member(s)")
    lc.check_unit_stride(y, b)
    og = out // groups
    bo = 64
    if groups > 1 and og % bo:
        bo = 32 if og % 32 == 0 else 16
        if og % bo:
            raise ValueError(f"a member's output width {og} must be a multiple of 16")
    bm_e = 64 if n >= 64 else 16
    args = (xa, y, b, slots, n, out, og, xa.stride(0), y.stride(0), y.stride(1), b.stride(0), b.stride(1))
    flags = dict(R=r, **lc.dot_flags(y.dtype), GELU=gelu)
    if bo != 64 or (groups > 1 and og % 128):  # the candidates need BO | a member's width
        _kernels()[1][(triton.cdiv(out, bo), triton.cdiv(n, bm_e), bsz)](*args, **flags, BM=bm_e, BO=bo)
        return y
    from fastvideo3.kernels.lora_shrink import launch
    # y is updated in place: restored between the tuner's runs
    launch("expand", _kernels()[1], EXPAND_CONFIGS, ["N", "OUT", "OUT_G", "R", "GELU"],
           lambda meta: (triton.cdiv(out, meta["BO"]), triton.cdiv(n, meta["BM"]), bsz), args, flags,
           ({"BM": bm_e, "BO": bo}, 4), restore=("Y",), cuda=y.is_cuda)
    return y


#: the expand's autotune candidates (token tile, output tile, warps)
EXPAND_CONFIGS = [({"BM": bm, "BO": bo}, w) for bm, bo, w in (
    (64, 64, 4), (64, 128, 4), (32, 128, 4), (64, 128, 8), (128, 64, 4), (128, 128, 8))]


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor, scales: torch.Tensor,
                groups: int = 1) -> torch.Tensor:
    """The Triton shrink alone: ``[B, N, G*R]``, member ``g``'s columns ``scales[r] * x[r] @
    a[slots[r], g*R:(g+1)*R].T`` (rounded once); rows without an adapter are left unwritten."""
    import triton
    lc.check_unit_stride(x, a)
    bsz, n, k = x.shape
    r = a.shape[1] // groups
    if r < 16 or r & (r - 1) or a.shape[1] % groups or a.shape[2] != k:
        raise ValueError(f"a {tuple(a.shape)} must be [S, G*R, {k}] with a power-of-two R >= 16, G={groups}")
    bm = _shrink_tile(n, bsz * groups)
    xa = torch.empty(bsz, n, groups * r, device=x.device, dtype=x.dtype)
    _kernels()[0][(groups, triton.cdiv(n, bm), bsz)](
        x, xa, a, slots, scales, n, k, x.stride(0), x.stride(1), xa.stride(0), a.stride(0), a.stride(1),
        R=r, BM=bm, BK=64, **lc.dot_flags(x.dtype))
    return xa


def _shrink_tile(n: int, rows: int) -> int:
    """The token tile of a shrink over ``rows`` (batch rows times members) of ``n`` tokens."""
    import triton
    bm = 64 if n >= 64 else 16
    while bm > 16 and triton.cdiv(n, bm) * rows < SHRINK_PROGRAMS:
        bm //= 2  # few token tiles: smaller ones, so the input streams through more SMs
    return bm


def lora_widen(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor, scales: torch.Tensor, blocks: int,
               impl: str = "torch") -> torch.Tensor:
    """The input of a *widened* GEMM: ``[x | E]``, ``[B, N, K + blocks*R]``, where ``E`` holds, in
    the ``R`` columns of block ``slots[r]``, row ``r``'s scaled down projection
    ``scales[r] * x[r] @ a[slots[r]].T`` (fp32 accumulation, rounded once) and zeros in every
    other block (and everywhere for a row without an adapter). Then

        [x | E] @ [W | up[0] | up[1] | ... | up[blocks-1]].T == x @ W.T + delta

    one GEMM with ``blocks*R`` more inputs adds the delta inside the layer's own GEMM, in its
    fp32 accumulator and before its epilogue (the FFN's fused GELU stays fused). Slots
    ``>= blocks`` are not allowed. :func:`widen_weight` builds the matching weight."""
    bsz, n, k = x.shape
    r = a.shape[1]
    if a.dim() != 3 or a.shape[2] != k or slots.shape != (bsz,) or scales.shape != (bsz,):
        raise ValueError(f"x {tuple(x.shape)}, a {tuple(a.shape)}: a must be [S, R, K]; one slot/scale per row")
    if not 1 <= blocks <= a.shape[0]:
        raise ValueError(f"blocks must be in [1, {a.shape[0]}], got {blocks}")
    if impl == "torch":
        xw = torch.zeros(bsz, n, k + blocks * r, device=x.device, dtype=x.dtype)
        xw[..., :k] = x
        for row in range(bsz):  # host sync: the CPU path only
            s = int(slots[row])
            if s >= 0:
                xa = torch.matmul(x[row].float(), a[s].float().t()) * scales[row]
                xw[row, :, k + s * r:k + (s + 1) * r] = xa.to(x.dtype)
        return xw
    lc.check_impl(impl)
    import triton
    lc.check_unit_stride(x, a)
    lc.check_rank(r)
    xw = torch.empty(bsz, n, k + blocks * r, device=x.device, dtype=x.dtype)
    bm = _shrink_tile(n, bsz)
    _kernels()[2][(triton.cdiv(n, bm), bsz)](
        x, xw, a, slots, scales, n, k, x.stride(0), x.stride(1), xw.stride(0), xw.stride(1),
        a.stride(0), a.stride(1), blocks, R=r, BM=bm, BK=64, **lc.dot_flags(x.dtype))
    return xw


def widen_weight(w: torch.Tensor, b: torch.Tensor, blocks: int) -> torch.Tensor:
    """``[W | up[0] | ... | up[blocks-1]]``: ``w`` ``[OUT, K]``, ``b`` (the up weights) ``[S, OUT, R]``
    -> ``[OUT, K + blocks*R]`` (a copy; the matching input is :func:`lora_widen`'s)."""
    out, r = b.shape[1], b.shape[2]
    if w.shape[0] != out:
        raise ValueError(f"weight {tuple(w.shape)} and up weights {tuple(b.shape)} differ in outputs")
    return torch.cat([w, b[:blocks].permute(1, 0, 2).reshape(out, blocks * r).to(w.dtype)], dim=1)


#: achieved bf16 GEMM FLOPs per byte of HBM traffic on an H200 (~700 TFLOP/s : ~3.8 TB/s):
#: the exchange rate of :func:`widen_pays`
FLOPS_PER_BYTE = 180.0


def widen_pays(k: int, out: int, extra: int, element_bytes: int) -> bool:
    """Whether widening a layer's GEMM by ``extra`` inputs (blocks*R) beats the two-pass delta.
    Per token the widened GEMM does ``2*extra*out`` more FLOPs and writes the ``k``-wide copy of
    its input; the expand it replaces reads and writes the ``out``-wide output (the shrink's read
    of the input is common to both)."""
    return 2.0 * extra * out / FLOPS_PER_BYTE < (2 * out - k) * element_bytes
