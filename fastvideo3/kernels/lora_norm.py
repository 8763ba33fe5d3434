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

from fastvideo3.kernels import lora_common as lc
from fastvideo3.kernels.fused import _per_sample


@functools.lru_cache(maxsize=1)
def _tiles() -> None:
    """Define the column-chunk steps both kernels share, ``@triton.jit`` helpers (inlined), as
    globals of this module (where Triton's interpreter looks them up)."""
    global residual, normed
    import triton
    import triton.language as tl
    lc.jit()

    @triton.jit
    def residual(xa, B, s, has, X, Y, GATE, row, tok, o0, m_ok, D, sbs, sbo, gate_stride, offs_r,
                 BO: tl.constexpr, HAS_GATE: tl.constexpr, F32DOT: tl.constexpr, IEEE: tl.constexpr):
        # y + delta, gated, added into the residual x (stored); the stored chunk and its mask
        offs_o = o0 + tl.arange(0, BO)
        o_ok = offs_o < D
        mask = m_ok[:, None] & o_ok[None, :]
        ptr = tok[:, None] * D + offs_o[None, :]
        y = tl.load(Y + ptr, mask=mask, other=0.0).to(tl.float32)
        if has:
            d = lc.up(xa, B, s, sbs, sbo, offs_o, o_ok, offs_r, IEEE, F32DOT)
            y = (y + d).to(Y.dtype.element_ty).to(tl.float32)  # as the expand stores it
        if HAS_GATE:
            y = y * tl.load(GATE + row * gate_stride + offs_o, mask=o_ok, other=0.0).to(tl.float32)[None, :]
        x = tl.load(X + ptr, mask=mask, other=0.0).to(tl.float32)
        xr = (x + y).to(X.dtype.element_ty)  # rounded to storage before the norm reads it
        tl.store(X + ptr, xr, mask=mask)
        return xr, mask

    @triton.jit
    def normed(xr, A_, B_, row, offs_o, o_ok, a_stride, b_stride, mean, rstd, MODULATE: tl.constexpr):
        # the residual chunk xr (fp32) normed and modulated (or scaled and shifted), in fp32
        a = tl.load(A_ + row * a_stride + offs_o, mask=o_ok, other=0.0).to(tl.float32)
        b = tl.load(B_ + row * b_stride + offs_o, mask=o_ok, other=0.0).to(tl.float32)
        if MODULATE:
            a = a + 1.0
        return (xr - mean[:, None]) * rstd[:, None] * a[None, :] + b[None, :]


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl
    _tiles()

    @triton.jit
    def lora_add_norm(XA, B, SLOT, X, Y, GATE, A_, B_, H, N, D, eps, sab, sbs, sbo,
                      gate_stride, a_stride, b_stride,
                      R: tl.constexpr, BM: tl.constexpr, BO: tl.constexpr, HAS_GATE: tl.constexpr,
                      MODULATE: tl.constexpr, F32DOT: tl.constexpr, IEEE: tl.constexpr):
        row, slot, offs_m, offs_r = lc.row_tile(SLOT, BM, R)
        s = tl.maximum(slot, 0)
        m_ok = offs_m < N
        tok = (row * N + offs_m).to(tl.int64)  # token index in [B*N]
        xa = tl.load(XA + row * sab + offs_m[:, None] * R + offs_r[None, :],
                     mask=m_ok[:, None] & (offs_r[None, :] < R), other=0.0)  # unused without an adapter
        if F32DOT:
            xa = xa.to(tl.float32)
        total = tl.zeros((BM,), dtype=tl.float32)
        for o0 in range(0, D, BO):  # pass 1: y + delta, the gated residual, written; its row sums
            xr, mask = residual(xa, B, s, slot >= 0, X, Y, GATE, row, tok, o0, m_ok, D, sbs, sbo, gate_stride,
                                offs_r, BO, HAS_GATE, F32DOT, IEEE)
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
            h = normed(xr, A_, B_, row, offs_o, o_ok, a_stride, b_stride, mean, rstd, MODULATE)
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
    lc.check_impl(impl)
    import triton
    if not xa.is_contiguous() or up.stride(2) != 1:
        raise ValueError("the Triton path needs a contiguous xa and unit-stride up weights")
    vecs, strides = _modulation(x, gate, a, b)
    h = torch.empty_like(x)
    bm = _token_tile(n, bsz)
    _kernel()[(triton.cdiv(n, bm), bsz)](
        xa, up, slots, x, y, *vecs, h, n, d, eps, xa.stride(0), up.stride(0), up.stride(1), *strides,
        R=r, BM=bm, BO=128, HAS_GATE=gate is not None, MODULATE=modulate, **lc.dot_flags(x.dtype), num_warps=4)
    return h


def _modulation(x, gate, a, b):
    """The gate and the norm's scale and shift as the kernels take them: (tensors, sample strides)."""
    bsz, _, d = x.shape
    gate_t, gate_stride = _per_sample(gate, bsz, d, "gate") if gate is not None else (x, 0)
    a_t, a_stride = _per_sample(a, bsz, d, "a")
    b_t, b_stride = _per_sample(b, bsz, d, "b")
    return (gate_t, a_t, b_t), (gate_stride, a_stride, b_stride)


def _token_tile(n: int, bsz: int) -> int:
    """16-token tiles when 32-token ones would be few (fewer than two per SM of an H200)."""
    import triton
    return 32 if triton.cdiv(n, 32) * bsz >= 264 else 16


# -- the two-pass variant, with the next layer's shrink fused in -------------------------------
#: the autotuner's candidates: token tile, column chunks of the two sweeps, warps
NORM_CONFIGS = [({"BM": bm, "BO": bo, "BO2": bo2}, w) for bm, bo, bo2, w in (
    (16, 128, 64, 4), (16, 256, 64, 4), (16, 256, 128, 8), (32, 128, 64, 4), (32, 256, 64, 8), (16, 128, 64, 8),
    (16, 512, 128, 8), (16, 1024, 128, 8))]
@functools.lru_cache(maxsize=1)
def _kernel2():
    import triton
    import triton.language as tl
    _tiles()

    @triton.jit
    def add_norm_next_kernel(XA, SCALE, B, SLOT, X, Y, GATE, A_, B_, H, AN, E,
                             N, D, eps, sab, sbs, sbo, gate_stride, a_stride, b_stride, sh, se, sans, sanr, E_COLS,
                             R: tl.constexpr, SPLIT: tl.constexpr, BM: tl.constexpr, BO: tl.constexpr,
                             BO2: tl.constexpr, HAS_GATE: tl.constexpr, MODULATE: tl.constexpr,
                             NEXT: tl.constexpr, WIDE: tl.constexpr, RN: tl.constexpr, EW: tl.constexpr,
                             F32DOT: tl.constexpr, IEEE: tl.constexpr):
        row, slot, offs_m, offs_r = lc.row_tile(SLOT, BM, R)
        has, s, scale = lc.adapter(slot, SCALE, row)
        m_ok = offs_m < N
        tok = (row * N + offs_m).to(tl.int64)  # token index in [B*N]
        rmask = m_ok[:, None] & (offs_r[None, :] < R)
        if SPLIT == 0:  # the shrink's scaled output, in the activation dtype
            xa = tl.load(XA + row * sab + offs_m[:, None] * R + offs_r[None, :], mask=rmask, other=0.0)
        else:  # split-K partial sums (fp32, unscaled): summed, scaled and rounded once here
            acc0 = tl.zeros((BM, R), dtype=tl.float32)
            for p in range(SPLIT):
                acc0 += tl.load(XA + (p * tl.num_programs(1) + row).to(tl.int64) * sab + offs_m[:, None] * R
                                + offs_r[None, :], mask=rmask, other=0.0)  # unwritten (unused) without an adapter
            xa = (acc0 * scale).to(X.dtype.element_ty)
        if F32DOT:
            xa = xa.to(tl.float32)
        # pass 1: y + delta, the gated residual written; per-chunk mean and centred sum of squares
        # combined as Chan et al. do (numerically as stable as the centred two-pass form)
        mean = tl.zeros((BM,), dtype=tl.float32)
        m2 = tl.zeros((BM,), dtype=tl.float32)
        for o0 in range(0, D, BO):
            xr, mask = residual(xa, B, s, has, X, Y, GATE, row, tok, o0, m_ok, D, sbs, sbo, gate_stride, offs_r,
                                BO, HAS_GATE, F32DOT, IEEE)
            xf = tl.where(mask, xr.to(tl.float32), 0.0)
            cnt = tl.minimum(D - o0, BO) * 1.0
            cmean = tl.sum(xf, axis=1) / cnt
            cd = tl.where(mask, xf - cmean[:, None], 0.0)
            cm2 = tl.sum(cd * cd, axis=1)
            seen = o0 * 1.0
            tot = seen + cnt
            delta = cmean - mean
            mean = mean + delta * (cnt / tot)
            m2 = m2 + cm2 + delta * delta * (seen * cnt / tot)
        tl.debug_barrier()  # the residual tile this program wrote is read back below
        rstd = 1.0 / tl.sqrt(m2 / D + eps)
        offs_e = tl.arange(0, EW)  # the row's own down projection: RN columns (a group's: C)
        e_ok = offs_e < RN
        acc = tl.zeros((BM, EW), dtype=tl.float32)
        for o0 in range(0, D, BO2):  # pass 2: the normed (and modulated) output, and the next shrink
            offs_o = o0 + tl.arange(0, BO2)
            o_ok = offs_o < D
            mask = m_ok[:, None] & o_ok[None, :]
            xr = tl.load(X + tok[:, None] * D + offs_o[None, :], mask=mask, other=0.0).to(tl.float32)
            h = normed(xr, A_, B_, row, offs_o, o_ok, a_stride, b_stride, mean, rstd, MODULATE).to(H.dtype.element_ty)
            tl.store(H + tok[:, None] * sh + offs_o[None, :], h, mask=mask)
            if NEXT:
                an = tl.load(AN + s * sans + offs_e[None, :] * sanr + offs_o[:, None],
                             mask=o_ok[:, None] & e_ok[None, :], other=0.0)  # scale 0 without an adapter
                acc = lc.mma(acc, tl.where(mask, h, 0.0), an, IEEE, F32DOT)
        if NEXT:
            e = (acc * scale).to(H.dtype.element_ty)  # zero where the row has no adapter
            e_mask = m_ok[:, None] & e_ok[None, :]
            if WIDE:  # the widened input: block `slot` holds this row's down projection, the others zeros
                zero = tl.zeros((BM, EW), dtype=H.dtype.element_ty)
                for j in range(0, E_COLS // RN):
                    tl.store(E + tok[:, None] * se + j * RN + offs_e[None, :], tl.where(j == slot, e, zero),
                             mask=e_mask)
            else:
                tl.store(E + tok[:, None] * se + offs_e[None, :], e, mask=e_mask)

    return add_norm_next_kernel


def lora_add_norm_next(xa: torch.Tensor | None, scales: torch.Tensor, up: torch.Tensor, slots: torch.Tensor,
                   x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor,
                   *, modulate: bool, eps: float, xa_parts: torch.Tensor | None = None,
                   next_down: torch.Tensor | None = None, wide: int = 0, impl: str = "torch"):
    """:func:`lora_add_norm` (two passes over the row tile) that may also run the *next* layer's
    shrink on the normed activations it writes, so that layer never re-reads its input.

    The delta's down projection comes as ``xa`` (scaled, activation dtype, ``[B, N, R]``) or as
    ``xa_parts`` (a split-K shrink's fp32 unscaled partial sums ``[SPLIT, B, N, R]``; summed,
    scaled by ``scales`` and rounded once here). ``next_down``: the next layer's stacked down
    weights ``[S, C, D]``; then the return value is ``(h, e)``:

    * ``wide == 0``: ``e`` is ``[B, N, C]``, ``scales[r] * h[r] @ next_down[slot].T`` (a
      group's stacked shrink, e.g. a fused QKV's);
    * ``wide = blocks``: ``C`` is the rank ``R'`` and ``e`` is the whole ``[B, N, D + blocks*R']``
      buffer ``[h | E]`` (``h`` is its first ``D`` columns; ``E`` holds the down projection in
      block ``slots[r]``, zeros elsewhere): the input of the next layer's widened GEMM, as
      :func:`~fastvideo3.kernels.lora_grouped.lora_widen` builds it.

    Without ``next_down`` just ``h``. ``impl="torch"``: the same steps in PyTorch."""
    bsz, n, d = x.shape
    r = up.shape[2]
    if (x.dim() != 3 or not x.is_contiguous() or y.shape != x.shape or not y.is_contiguous() or up.shape[1] != d
            or slots.shape != (bsz,) or scales.shape != (bsz,) or (xa is None) == (xa_parts is None)):
        raise ValueError(f"x {tuple(x.shape)}, y {tuple(y.shape)} (contiguous), up {tuple(up.shape)}, slots "
                         f"{tuple(slots.shape)}, scales {tuple(scales.shape)}; give one of xa and xa_parts")
    if xa is not None and xa.shape != (bsz, n, r):
        raise ValueError(f"xa {tuple(xa.shape)} must be [{bsz}, {n}, {r}]")
    if xa_parts is not None and (xa_parts.dim() != 4 or xa_parts.shape[1:] != (bsz, n, r)
                                 or xa_parts.dtype != torch.float32):
        raise ValueError(f"xa_parts {tuple(xa_parts.shape)} must be fp32 [SPLIT, {bsz}, {n}, {r}]")
    cols = 0
    if next_down is not None:
        if next_down.dim() != 3 or next_down.shape[2] != d:
            raise ValueError(f"next_down {tuple(next_down.shape)} must be [S, C, {d}]")
        if wide and not 1 <= wide <= next_down.shape[0]:
            raise ValueError(f"wide must be in [1, {next_down.shape[0]}], got {wide}")
        cols = wide * next_down.shape[1] if wide else next_down.shape[1]
    buf = torch.empty(bsz, n, d + cols, device=x.device, dtype=x.dtype) if wide else None
    h = buf[..., :d] if wide else torch.empty_like(x)
    e = (buf[..., d:] if wide else torch.empty(bsz, n, cols, device=x.device, dtype=x.dtype)) if cols else None
    if impl == "torch":
        if xa is None:
            xa = (xa_parts.sum(0) * scales.view(-1, 1, 1)).to(x.dtype)
        h.copy_(lora_add_norm(xa, up, slots, x, y, gate, a, b, modulate=modulate, eps=eps, impl="torch"))
        if e is not None:
            e.zero_()
            for row in range(bsz):  # host sync: the CPU path only
                sl = int(slots[row])
                if sl < 0:
                    continue
                p = (torch.matmul(h[row].float(), next_down[sl].float().t()) * scales[row]).to(x.dtype)
                c = next_down.shape[1]
                if wide:
                    e[row, :, sl * c:(sl + 1) * c] = p
                else:
                    e[row] = p
        return (h, buf if wide else e) if e is not None else h
    lc.check_impl(impl)
    import triton
    if up.stride(2) != 1 or (xa is not None and not xa.is_contiguous()) or (
            xa_parts is not None and not xa_parts.is_contiguous()):
        raise ValueError("the Triton path needs contiguous xa (or partials) and unit-stride up weights")
    if next_down is not None and next_down.stride(2) != 1:
        raise ValueError("the Triton path needs unit-stride next_down weights")
    lc.check_rank(r)
    vecs, strides = _modulation(x, gate, a, b)
    src = xa if xa is not None else xa_parts
    sab = src.stride(0) if xa is not None else src.stride(1)
    an = next_down if next_down is not None else x
    rn = next_down.shape[1] if next_down is not None else 16
    ew = max(16, triton.next_power_of_2(rn))
    from fastvideo3.kernels.lora_shrink import launch
    bm = _token_tile(n, bsz)
    args = (src, scales, up, slots, x, y, *vecs, h, an, e if e is not None else h,
            n, d, eps, sab, up.stride(0), up.stride(1), *strides,
            h.stride(1), e.stride(1) if e is not None else 0, an.stride(0), an.stride(1) if cols else 0, cols)
    flags = dict(R=r, SPLIT=0 if xa is not None else xa_parts.shape[0], HAS_GATE=gate is not None,
                 MODULATE=modulate, NEXT=next_down is not None, WIDE=bool(wide), RN=rn, EW=ew, **lc.dot_flags(x.dtype))
    # x is updated in place: restored between the tuner's runs
    launch("add_norm_next", _kernel2(), NORM_CONFIGS, ["N", "D", "R", "SPLIT", "HAS_GATE", "NEXT", "WIDE", "RN"],
           lambda meta: (triton.cdiv(n, meta["BM"]), bsz), args, flags,
           ({"BM": bm, "BO": 128, "BO2": 64}, 4), restore=("X",), cuda=x.is_cuda)
    return (h, buf if wide else e) if e is not None else h
