"""Fused norm kernels of the Wan DiT block: residual + LayerNorm + modulation, QK RMSNorm + RoPE.

Each op has a Triton kernel and a PyTorch twin with the same contract (see the package
docstring). The Triton kernels are compiled on first use, so importing this module needs no
Triton; one program handles one token row (of one part, for Q/K), which fits the widest Wan
row (5,120) in registers.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _rms_norm_rope() -> None:
    """Define ``rms_norm_rope``, a ``@triton.jit`` helper (inlined where called), as a global of
    this module (Triton's interpreter looks a kernel's helpers up there): RMSNorm of one row read
    as [pairs, 2] with part ``part``'s weight, then with ROPE the 3-D RoPE of token ``row``.
    Used by the QK norm kernel."""
    global rms_norm_rope
    global tl  # the interpreter wants triton.language among a jit function's globals
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm_rope(x, w_ptr, part, pair, offs, mask, row, rows_per_sample, grid_h, grid_w, D, eps,
                      cos_ptr, sin_ptr, table_stride,
                      ROPE: tl.constexpr, HEAD_DIM: tl.constexpr, T_DIM: tl.constexpr, H_DIM: tl.constexpr):
        w = tl.load(w_ptr + part * D + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(tl.sum(x * x, axis=1), axis=0) / D + eps)
        y = x * rstd * w
        if ROPE:
            tok = row % rows_per_sample
            f = tok // (grid_h * grid_w)
            hh = (tok // grid_w) % grid_h
            ww = tok % grid_w
            dh = (pair * 2) % HEAD_DIM
            pos = tl.where(dh < T_DIM, f, tl.where(dh < T_DIM + H_DIM, hh, ww))
            pmask = pair * 2 < D
            c = tl.load(cos_ptr + pos * table_stride + dh, mask=pmask, other=0.0).to(tl.float32)
            s = tl.load(sin_ptr + pos * table_stride + dh, mask=pmask, other=0.0).to(tl.float32)
            ye, yo = tl.split(y)
            y = tl.join(ye * c - yo * s, ye * s + yo * c)
        return y


@functools.lru_cache(maxsize=1)
def _kernels():
    """Define the kernels on first use: Triton decides at decoration time whether to compile
    or interpret, so this must run after the caller has chosen (TRITON_INTERPRET)."""
    import triton
    import triton.language as tl
    _rms_norm_rope()

    global add_norm_rows  # a helper of two kernels: a global, where Triton's interpreter looks

    @triton.jit
    def add_norm_rows(x_ptr, y_ptr, h_ptr, hs_ptr, rows, rmask, cols, gate, a, b, D, eps,
                      HAS_Y: tl.constexpr, HAS_GATE: tl.constexpr, QUANT: tl.constexpr):
        # rows [R] of width D (cols [1, BLOCK]); gate, a (1 already added when modulating) and b
        # loaded by the caller, [R or 1, BLOCK] fp32
        mask = rmask[:, None] & (cols < D)
        offs = rows[:, None] * D + cols
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_Y:
            y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            if HAS_GATE:
                y = y * gate
            # the residual is rounded to its storage dtype before the norm reads it, as in the reference
            xr = (x + y).to(x_ptr.dtype.element_ty)
            tl.store(x_ptr + offs, xr, mask=mask)
            x = xr.to(tl.float32)
        mean = tl.sum(x, axis=1) / D
        diff = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=1) / D + eps)
        h = diff * rstd[:, None] * a + b
        if QUANT:  # e4m3 out with this row's scale (the next GEMM's per-token activation scale)
            amax = tl.maximum(tl.max(tl.abs(tl.where(mask, h, 0.0)), axis=1), 1e-12)
            hq = tl.clamp(h * (448.0 / amax)[:, None], -448.0, 448.0)
            tl.store(hs_ptr + rows, amax / 448.0, mask=rmask)
            tl.store(h_ptr + offs, hq.to(h_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
        else:
            tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def add_norm_kernel(
        x_ptr, y_ptr, gate_ptr, a_ptr, b_ptr, h_ptr, hs_ptr,
        M, rows_per_sample, D, eps,
        gate_stride, a_stride, b_stride,
        HAS_Y: tl.constexpr, HAS_GATE: tl.constexpr, MODULATE: tl.constexpr, QUANT: tl.constexpr,
        BLOCK: tl.constexpr, ROWS: tl.constexpr,
    ):
        # ROWS token rows per program, each BLOCK (the row padded to a power of two) wide; each
        # row's modulation read for it
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        rmask = rows < M
        sample = (rows // rows_per_sample)[:, None]
        cols = tl.arange(0, BLOCK)[None, :]
        mask = rmask[:, None] & (cols < D)
        gate = 0.0
        if HAS_GATE:
            gate = tl.load(gate_ptr + sample * gate_stride + cols, mask=mask, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + sample * a_stride + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + sample * b_stride + cols, mask=mask, other=0.0).to(tl.float32)
        if MODULATE:
            a = a + 1.0
        add_norm_rows(x_ptr, y_ptr, h_ptr, hs_ptr, rows, rmask, cols, gate, a, b, D, eps, HAS_Y, HAS_GATE, QUANT)

    @triton.jit
    def add_norm_loop_kernel(
        x_ptr, y_ptr, gate_ptr, a_ptr, b_ptr, h_ptr, hs_ptr,
        rows_per_sample, D, eps,
        gate_stride, a_stride, b_stride,
        HAS_Y: tl.constexpr, HAS_GATE: tl.constexpr, MODULATE: tl.constexpr, QUANT: tl.constexpr,
        BLOCK: tl.constexpr, LOOP: tl.constexpr,
    ):
        # grid (sample, block of LOOP rows): the sample's modulation read once, then its rows one
        # at a time (the same values as add_norm_kernel)
        sample = tl.program_id(0).to(tl.int64)
        first = tl.program_id(1).to(tl.int64) * LOOP
        cols = tl.arange(0, BLOCK)[None, :]
        cmask = cols < D
        gate = 0.0
        if HAS_GATE:
            gate = tl.load(gate_ptr + sample * gate_stride + cols, mask=cmask, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + sample * a_stride + cols, mask=cmask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + sample * b_stride + cols, mask=cmask, other=0.0).to(tl.float32)
        if MODULATE:
            a = a + 1.0
        for r in range(LOOP):
            tok = first + r + tl.arange(0, 1)
            add_norm_rows(x_ptr, y_ptr, h_ptr, hs_ptr, sample * rows_per_sample + tok, tok < rows_per_sample, cols,
                          gate, a, b, D, eps, HAS_Y, HAS_GATE, QUANT)

    @triton.jit
    def qk_norm_rope_kernel(
        in_ptr, in_stride, out_ptr, out_stride, w_ptr,
        cos_ptr, sin_ptr, table_stride,
        rows_per_sample, grid_h, grid_w, D, eps,
        ROPE: tl.constexpr, HEAD_DIM: tl.constexpr, T_DIM: tl.constexpr, H_DIM: tl.constexpr,
        HALF: tl.constexpr,
    ):
        # one program per (token row, part); the row is read as [pairs, 2] so each rotation
        # pair is split out in registers and joined back before one contiguous store
        row = tl.program_id(0).to(tl.int64)
        part = tl.program_id(1)
        pair = tl.arange(0, HALF)
        offs = pair[:, None] * 2 + tl.arange(0, 2)[None, :]
        mask = offs < D
        src = in_ptr + row * in_stride + part * D
        x = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
        y = rms_norm_rope(x, w_ptr, part, pair, offs, mask, row, rows_per_sample, grid_h, grid_w, D, eps,
                          cos_ptr, sin_ptr, table_stride, ROPE, HEAD_DIM, T_DIM, H_DIM)
        tl.store(out_ptr + row * out_stride + part * D + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    return add_norm_kernel, qk_norm_rope_kernel, add_norm_loop_kernel


#: token rows per program of the Triton add_norm
ADD_NORM_ROWS = 1
#: rows a program of the looped add_norm walks (0: the per-row kernel). The looped kernel reads the
#: sample's modulation (three fp32 rows, 18 KB at 1,536 columns) once a program instead of once a
#: row; not yet timed on a GPU (bench/fp8_kernels_probe.py has it), so off
ADD_NORM_LOOP = 0


def _launch_shape(d: int, per_warp: int) -> tuple[int, int]:
    """Block width (the row padded to a power of two) and warps, ``per_warp`` columns per warp."""
    import triton
    block = triton.next_power_of_2(d)
    return block, max(4, min(16, block // per_warp))


def _per_sample(t: torch.Tensor, batch: int, d: int, name: str) -> tuple[torch.Tensor, int]:
    """A [B, D] (any row stride) or [D] vector -> (tensor, stride between samples)."""
    if t.dim() == 1:
        if t.shape[0] != d:
            raise ValueError(f"{name}: expected [{d}], got {list(t.shape)}")
        return t, 0
    if t.dim() != 2 or t.shape[-1] != d or t.shape[0] not in (1, batch) or t.stride(-1) != 1:
        raise ValueError(f"{name}: expected [B, {d}] with unit inner stride, got {list(t.shape)} {t.stride()}")
    return t, (t.stride(0) if t.shape[0] == batch else 0)


def add_norm(x: torch.Tensor, y: torch.Tensor | None, gate: torch.Tensor | None,
             a: torch.Tensor, b: torch.Tensor, *, modulate: bool, eps: float,
             impl: str = "torch", fp8: bool = False, rows: int | None = None, warps_override: int | None = None,
             loop: int | None = None):
    """Fused residual update and LayerNorm; returns the normed activations.

    ``x`` [B, L, D] contiguous is the residual stream. If ``y`` [B, L, D] is given, ``x`` is
    updated **in place** to ``x + y * gate`` (``gate`` [B, D] or None for 1), rounded to
    ``x.dtype``. The result is ``LayerNorm(x) * (1 + a) + b`` when ``modulate`` (time
    modulation; ``a`` = scale, ``b`` = shift, [B, D] fp32), else ``LayerNorm(x) * a + b`` (an
    affine norm; ``a`` = weight, ``b`` = bias, [D]), computed in fp32 and rounded to ``x.dtype``.
    With ``fp8`` the normed activations are instead quantized from fp32 to e4m3 with one scale
    per row, and ``(e4m3 [B, L, D], fp32 scale [B, L, 1])`` is returned (the input of an FP8
    GEMM; see :mod:`fastvideo3.kernels.fp8`). ``rows`` (a power of two, default
    :data:`ADD_NORM_ROWS`) token rows go to one Triton program; ``warps_override`` sets its warps
    (both for the bench's probes). ``loop`` (default :data:`ADD_NORM_LOOP`; 0 for none): a program
    walks that many rows of one sample instead, its modulation read once (the same values).
    """
    if x.dim() != 3 or not x.is_contiguous():
        raise ValueError("add_norm: x must be a contiguous [B, L, D] tensor")
    bsz, length, d = x.shape
    if y is not None and (y.shape != x.shape or not y.is_contiguous()):
        raise ValueError("add_norm: y must be contiguous and shaped like x")
    if impl == "torch":
        return _add_norm_torch(x, y, gate, a, b, modulate=modulate, eps=eps, fp8=fp8)
    gate_t, gate_stride = _per_sample(gate, bsz, d, "gate") if gate is not None else (x, 0)
    a_t, a_stride = _per_sample(a, bsz, d, "a")
    b_t, b_stride = _per_sample(b, bsz, d, "b")
    h = torch.empty_like(x, dtype=torch.float8_e4m3fn if fp8 else x.dtype)
    hs = torch.empty(bsz, length, 1, dtype=torch.float32, device=x.device) if fp8 else h
    import triton
    block, warps = _launch_shape(d, 256)
    rows = rows or ADD_NORM_ROWS
    loop = ADD_NORM_LOOP if loop is None else loop
    m = bsz * length
    flags = dict(HAS_Y=y is not None, HAS_GATE=gate is not None, MODULATE=modulate, QUANT=fp8, BLOCK=block)
    if loop:
        _kernels()[2][(bsz, triton.cdiv(length, loop))](
            x, y if y is not None else x, gate_t, a_t, b_t, h, hs, length, d, eps, gate_stride, a_stride, b_stride,
            LOOP=loop, num_warps=warps_override or warps, **flags)
    else:
        _kernels()[0][(triton.cdiv(m, rows),)](
            x, y if y is not None else x, gate_t, a_t, b_t, h, hs, m, length, d, eps, gate_stride, a_stride, b_stride,
            ROWS=rows, num_warps=warps_override or min(16, warps * rows), **flags)
    return (h, hs) if fp8 else h


def _add_norm_torch(x, y, gate, a, b, *, modulate, eps, fp8=False):
    if y is not None:
        upd = y.float() if gate is None else y.float() * gate.float().reshape(-1, 1, x.shape[-1])
        x.copy_((x.float() + upd).to(x.dtype))
    n = F.layer_norm(x.float(), (x.shape[-1],), eps=eps)
    a32, b32 = a.float(), b.float()
    if a32.dim() == 2:
        a32, b32 = a32.unsqueeze(1), b32.unsqueeze(1)
    h = n * ((1 + a32) if modulate else a32) + b32
    if fp8:
        from fastvideo3.kernels.fp8 import quantize_rows
        return quantize_rows(h, impl="torch")
    return h.to(x.dtype)


@dataclass(frozen=True)
class RopeGrid:
    """Wan's 3-D RoPE for one latent grid: per-axis cos/sin tables ([max_len, head_dim] fp32,
    each frequency repeated twice), the token grid (frames, height, width) in patches, and the
    head-dim split (the first ``t_dim`` columns follow the frame, the next ``h_dim`` the row,
    the rest the column)."""

    cos: torch.Tensor
    sin: torch.Tensor
    grid: tuple[int, int, int]
    t_dim: int
    h_dim: int

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-token [L, head_dim] cos/sin (for the PyTorch path)."""
        f, h, w = self.grid
        d = self.cos.shape[1]
        splits = [self.t_dim, self.h_dim, d - self.t_dim - self.h_dim]

        def grid(table: torch.Tensor) -> torch.Tensor:
            t, hh, ww = table.split(splits, dim=1)
            parts = [t[:f].view(f, 1, 1, -1).expand(f, h, w, -1), hh[:h].view(1, h, 1, -1).expand(f, h, w, -1),
                     ww[:w].view(1, 1, w, -1).expand(f, h, w, -1)]
            return torch.cat(parts, dim=-1).reshape(f * h * w, d)

        return grid(self.cos), grid(self.sin)


def qk_norm_rope(src: torch.Tensor, weight: torch.Tensor, *, parts: int, eps: float,
                 heads: int, rope: RopeGrid | None = None, impl: str = "torch") -> torch.Tensor:
    """RMSNorm across heads, then (optionally) RoPE, of the first ``parts`` D-wide column blocks.

    ``src`` [B, L, k*D] (rows contiguous, k >= parts) is a projection output, e.g. the fused
    QKV of self-attention (parts=2: Q and K) or the Q of cross-attention (parts=1).
    ``weight`` [parts, D] holds each part's RMSNorm weight. Returns [B, L, parts*D] in
    ``src.dtype``, fp32 math inside.
    """
    bsz, length, width = src.shape
    d = weight.shape[-1]
    if weight.shape != (parts, d) or width < parts * d or src.stride(-1) != 1 or src.stride(0) != length * src.stride(1):
        raise ValueError(f"qk_norm_rope: bad shapes src={list(src.shape)} weight={list(weight.shape)}")
    head_dim = d // heads
    if rope is not None and rope.grid[0] * rope.grid[1] * rope.grid[2] != length:
        raise ValueError(f"qk_norm_rope: rope grid {rope.grid} does not hold {length} tokens")
    if impl == "torch":
        return _qk_norm_rope_torch(src, weight, parts=parts, eps=eps, heads=heads, rope=rope)
    if d % 2 or not weight.is_contiguous():
        raise ValueError("qk_norm_rope: the width must be even and the weight contiguous")
    out = torch.empty(bsz, length, parts * d, dtype=src.dtype, device=src.device)
    block, warps = _launch_shape(d, 512)
    cos = rope.cos if rope is not None else weight
    sin = rope.sin if rope is not None else weight
    _kernels()[1][(bsz * length, parts)](
        src, src.stride(1), out, out.stride(1), weight,
        cos, sin, cos.stride(0),
        length, rope.grid[1] if rope else 1, rope.grid[2] if rope else 1, d, eps,
        ROPE=rope is not None, HEAD_DIM=head_dim,
        T_DIM=rope.t_dim if rope else 0, H_DIM=rope.h_dim if rope else 0, HALF=block // 2, num_warps=warps,
    )
    return out


def _qk_norm_rope_torch(src, weight, *, parts, eps, heads, rope):
    d = weight.shape[-1]
    cos = sin = None
    if rope is not None:
        cos, sin = rope.tables()
        cos, sin = cos.view(1, -1, 1, cos.shape[-1]), sin.view(1, -1, 1, sin.shape[-1])
    outs = []
    for p in range(parts):
        v = F.rms_norm(src[..., p * d:(p + 1) * d].float(), (d,), eps=eps) * weight[p].float()
        if rope is not None:
            v = v.unflatten(-1, (heads, -1))
            x1, x2 = v.unflatten(-1, (-1, 2)).unbind(-1)
            c, s = cos[..., 0::2], sin[..., 1::2]
            v = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-3)
        outs.append(v)
    return torch.cat(outs, dim=-1).to(src.dtype)
