"""FP8 (e4m3) building blocks of the DiT's linear layers and self-attention.

The scheme behind the precision ``fp8_e4m3``:

* weights: e4m3 with one fp32 scale per output channel (``scale[n] = amax(|W[n, :]|) / 448``);
* activations: e4m3 with one fp32 scale per token, computed from the row being quantized
  (dynamic; ``scale[m] = amax(|x[m, :]|) / 448``), or one per tensor where a card asks for it;
* GEMMs: ``torch._scaled_mm`` with row-wise scales (``scale_a`` [M, 1], ``scale_b`` [1, N],
  fp32) accumulating in fp32 on the tensor cores, bf16 out; on a CPU the same product is
  computed from the dequantized operands (the reference the tests use). torchao's float8
  row-wise linear issues this same call for its GEMM and is not on the GPU image, so we call
  it directly and keep the quantization in our own fused kernels (measured at Wan's shapes on
  an H200: 820-1,300 TFLOP/s against 650-810 in bf16, bench/results/denoiser_fp8_h200.json);
* self-attention: FlashAttention-3's FP8 forward with one descale per (sample, head) for Q, K
  and V (see :func:`qkv_fp8`).

``x / scale`` never exceeds 448 (the largest finite e4m3) by construction; values are clamped to
±448 before the cast anyway, so a saturating cast and a non-saturating one agree. Every op has a
Triton kernel (CUDA) and a PyTorch twin (``impl="torch"``) with the same contract, as in
:mod:`fastvideo3.kernels.fused`.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from fastvideo3.kernels.lora_common import interpreting

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
#: a row (or channel) whose amax is below this is scaled as if its amax were this (no 0/0)
AMAX_FLOOR = 1e-12
#: compute capability from which the tensor cores have an e4m3 path (Ada 8.9, Hopper 9.0, ...)
FP8_MIN_CAPABILITY = (8, 9)
#: rows up to this many columns (padded to a power of two) are quantized from registers in one read;
#: wider rows take two reads (the second from L2). 4096: two reads for the FFN's 8,960 columns were
#: the faster on an H100 (482 us against 496 us in one read, bench/results/fp8_kernels_probe_h100.json);
#: 16384 (one read for every Wan row) is selectable for the bench (--row-register-width).
ROW_REGISTER_WIDTH = 4096
#: token rows per program of the Triton QKV norm + RoPE + e4m3 pass
QKV_ROWS = 2
#: its warps at QKV_ROWS (None: by the row width); 2 rows over 4 warps timed fastest on an H200
#: (323 ms a 1.3B forward against 327 for 1 row over 4, bench/results/denoiser_fp8_qkv_h200.json)
QKV_WARPS: int | None = 4
#: the QKV pass's kernel: ``"pairs"`` (a row read as [pairs, 2], rotation pairs split out in
#: registers) or ``"flat"`` (the row read flat, each element's rotation partner read again from L1)
QKV_KERNEL = "pairs"
QKV_KERNELS = ("pairs", "flat")


# ------------------------------------------------------------------------------------- device
def fp8_device_problem(device: torch.device | str) -> str | None:
    """None if ``device`` runs e4m3 GEMMs on its tensor cores, else why not (one phrase)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return f"device {dev.type} has no FP8 tensor-core path (a CUDA GPU of compute capability >= 8.9 is required)"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    cap = torch.cuda.get_device_capability(dev)
    if cap < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(dev)
        return (f"device {name} (compute capability {cap[0]}.{cap[1]}) has no FP8 tensor-core path "
                f"(compute capability >= {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} is required)")
    return None


# ------------------------------------------------------------------------------ quantization math
def _scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    return amax.float().clamp_min(AMAX_FLOOR) / E4M3_MAX


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel e4m3 of a Linear weight ``w`` [N, K] -> (e4m3 [N, K], fp32 scale [N])."""
    if w.dim() != 2:
        raise ValueError(f"quantize_weight: expected [N, K], got {list(w.shape)}")
    scale = _scale_from_amax(w.detach().abs().amax(dim=1))
    q = (w.detach().float() / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def quantize_rows(x: torch.Tensor, *, per_tensor: bool = False,
                  impl: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic e4m3 of activations ``x`` [..., K] -> (e4m3 [..., K], fp32 scale [..., 1]): one
    scale per row (token), or one for the whole tensor repeated per row when ``per_tensor``."""
    if per_tensor:
        scale = _scale_from_amax(x.detach().abs().amax())
        q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        return q, scale.expand(*x.shape[:-1], 1).contiguous()
    if impl == "torch" or x.device.type != "cuda":
        scale = _scale_from_amax(x.detach().abs().amax(dim=-1, keepdim=True))
        return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale
    return _launch_rows(x, None, gelu=False)


def bias_gelu_quant(y: torch.Tensor, bias: torch.Tensor, *, impl: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """``gelu_tanh(y + bias)`` quantized per row: the FFN's first GEMM output (no bias applied)
    into the second GEMM's e4m3 input, in one pass. Returns (e4m3 [..., K], fp32 [..., 1])."""
    if impl == "torch" or y.device.type != "cuda":
        h = F.gelu(y.float() + bias.float(), approximate="tanh")
        return quantize_rows(h, impl="torch")
    return _launch_rows(y, bias, gelu=True)


def quantize_bounded(x: torch.Tensor, scale: torch.Tensor, *, impl: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 of ``x`` [B, ..., K] with one scale per sample known in advance (``scale`` [B], fp32, a
    bound of ``|x| / 448`` that the caller guarantees, e.g. an attention output's from its values'
    amax): an elementwise pass with no row reduction. Returns (e4m3 like ``x``, the scale as the
    per-row [B, ..., 1] a GEMM reads). Values are clamped to +-448 (a bound met with rounding)."""
    b = x.shape[0]
    scale = scale.reshape(b).float()
    rows_scale = scale.view(b, *([1] * (x.dim() - 1))).expand(*x.shape[:-1], 1).contiguous()
    if impl == "torch" or x.device.type != "cuda":
        q = (x.float() * (1.0 / rows_scale)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)  # as the kernel rounds
        return q, rows_scale
    import triton
    xc = x.contiguous()
    q = torch.empty(x.shape, dtype=E4M3, device=x.device)
    n = xc.numel()
    block = 4096
    _kernels()[3][(triton.cdiv(n, block),)](xc, (1.0 / scale).contiguous(), q, n, n // b, BLOCK=block, num_warps=8)
    return q, rows_scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of an e4m3 tensor with a broadcastable scale."""
    return q.float() * scale


# ----------------------------------------------------------------------------------------- GEMM
@functools.lru_cache(maxsize=None)
def _scaled_mm_takes_bias(device: str) -> bool:
    """Whether ``torch._scaled_mm`` accepts a bf16 bias with row-wise scales here (probed once)."""
    a = torch.ones(16, 16, device=device).to(E4M3)
    s_a = torch.ones(16, 1, device=device)
    s_b = torch.ones(1, 16, device=device)
    try:
        torch._scaled_mm(a, a.t(), scale_a=s_a, scale_b=s_b, bias=torch.ones(16, device=device, dtype=torch.bfloat16),
                         out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def fp8_linear(xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor,
               bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
               fast_accum: bool = False) -> torch.Tensor:
    """``(xq * x_scale) @ (wq * w_scale[:, None]).T + bias`` with e4m3 ``xq`` [..., K] (per-row
    scale [..., 1]) and ``wq`` [N, K] (per-channel scale [N]); returns [..., N] in ``out_dtype``.
    CUDA: one ``torch._scaled_mm``; its partial sums are promoted to fp32 unless ``fast_accum``
    (then they stay in the tensor cores' narrower FP8 accumulator: faster, less exact).
    Elsewhere: the same product in fp32 (``fast_accum`` has no meaning there)."""
    lead, k = xq.shape[:-1], xq.shape[-1]
    a, sa = xq.reshape(-1, k), x_scale.reshape(-1, 1).float()
    n = wq.shape[0]
    if xq.device.type == "cuda":
        sb = w_scale.float().view(1, n)
        if bias is not None and not _scaled_mm_takes_bias(str(xq.device)):
            out = torch._scaled_mm(a, wq.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype, use_fast_accum=fast_accum)
            out = out + bias.to(out_dtype)
        else:
            out = torch._scaled_mm(a, wq.t(), scale_a=sa, scale_b=sb, bias=None if bias is None else bias.to(out_dtype),
                                   out_dtype=out_dtype, use_fast_accum=fast_accum)
    else:
        out = (a.float() * sa) @ (wq.float() * w_scale.float().view(n, 1)).t()
        if bias is not None:
            out = out + bias.float()
        out = out.to(out_dtype)
    return out.view(*lead, n)


# ------------------------------------------------------------------------------ Triton kernels
@functools.lru_cache(maxsize=1)
def _kernels():
    import triton
    import triton.language as tl
    global act_chunk, store_e4m3  # the kernels' helpers: globals, where Triton's interpreter looks

    @triton.jit
    def act_chunk(x_ptr, b_ptr, rows, rmask, cc, K, GELU: tl.constexpr, FAST_TANH: tl.constexpr):
        # columns cc of the rows (bias + tanh-GELU first with GELU), fp32, and their mask
        m = rmask[:, None] & (cc < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * K + cc[None, :], mask=m, other=0.0).to(tl.float32)
        if GELU:  # bias + tanh-GELU: x * (1 + tanh(u)) / 2
            x = x + tl.load(b_ptr + cc, mask=cc < K, other=0.0).to(tl.float32)[None, :]
            u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            if FAST_TANH:  # one special-function op (relative error ~2^-11, far below e4m3's 2^-4)
                t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32,
                                              is_pure=True, pack=1)
            else:  # the interpreter: tanh from exp (an exp and a division per element)
                t = 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)
            x = tl.where(m, 0.5 * x * (1.0 + t), 0.0)
        return x, m

    @triton.jit
    def store_e4m3(q_ptr, rows, cc, K, x, inv, m):
        q = tl.clamp(x * inv[:, None], -448.0, 448.0)
        tl.store(q_ptr + rows[:, None] * K + cc[None, :], q.to(q_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=m)

    @triton.jit
    def rows_kernel(x_ptr, b_ptr, q_ptr, s_ptr, M, K, GELU: tl.constexpr, ROWS: tl.constexpr,
                    CHUNK: tl.constexpr, NCHUNK: tl.constexpr, TAIL: tl.constexpr, FAST_TANH: tl.constexpr):
        # ROWS rows per program: (optional bias + tanh-GELU), each row's amax, e4m3 out + scale.
        # NCHUNK 1: the row is held in registers as a CHUNK-wide tile plus, when TAIL > 0, a
        # TAIL-wide one after it (both powers of two: 8,960 columns are 8,192 + 1,024 lanes, not
        # 16,384), read once. A row over NCHUNK > 1 chunks is read twice (amax, then quantize;
        # the second read hits L2).
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        rmask = rows < M
        cols = tl.arange(0, CHUNK)
        if NCHUNK == 1:
            x, m = act_chunk(x_ptr, b_ptr, rows, rmask, cols, K, GELU, FAST_TANH)
            amax = tl.max(tl.abs(x), axis=1)
            if TAIL > 0:
                tcols = CHUNK + tl.arange(0, TAIL)
                xt, mt = act_chunk(x_ptr, b_ptr, rows, rmask, tcols, K, GELU, FAST_TANH)
                amax = tl.maximum(amax, tl.max(tl.abs(xt), axis=1))
            amax = tl.maximum(amax, 1e-12)
            inv = 448.0 / amax
            store_e4m3(q_ptr, rows, cols, K, x, inv, m)
            if TAIL > 0:
                store_e4m3(q_ptr, rows, tcols, K, xt, inv, mt)
        else:
            amax = tl.zeros([ROWS], dtype=tl.float32)
            for c in range(NCHUNK):
                x, m = act_chunk(x_ptr, b_ptr, rows, rmask, c * CHUNK + cols, K, GELU, FAST_TANH)
                amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
            amax = tl.maximum(amax, 1e-12)
            inv = 448.0 / amax
            for c in range(NCHUNK):
                cc = c * CHUNK + cols
                x, m = act_chunk(x_ptr, b_ptr, rows, rmask, cc, K, GELU, FAST_TANH)
                store_e4m3(q_ptr, rows, cc, K, x, inv, m)
        tl.store(s_ptr + rows, amax / 448.0, mask=rmask)

    @triton.jit
    def head_amax_kernel(src_ptr, row_stride, out_ptr, n, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
        # grid (sample, row block, head): max |x| of one head over ROWS tokens, folded into
        # out[sample, head] (fp32, starts at 0) with an atomic max
        sample = tl.program_id(0).to(tl.int64)
        rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
        head = tl.program_id(2)
        cols = tl.arange(0, HEAD_DIM)
        m = (rows < n)[:, None]
        x = tl.load(src_ptr + (sample * n + rows)[:, None] * row_stride + head * HEAD_DIM + cols[None, :],
                    mask=m, other=0.0).to(tl.float32)
        tl.atomic_max(out_ptr + sample * tl.num_programs(2) + head, tl.max(tl.max(tl.abs(x), axis=1), axis=0))

    @triton.jit
    def qkv_kernel(
        in_ptr, out_ptr, w_ptr, inv_ptr, mean_ptr,
        cos_ptr, sin_ptr, table_stride,
        M, row_stride, out_row_stride, out_part_stride, rows_per_sample, batch, grid_h, grid_w, D, eps,
        HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, T_DIM: tl.constexpr, H_DIM: tl.constexpr,
        HALF: tl.constexpr, SMOOTH: tl.constexpr, ROWS: tl.constexpr,
    ):
        # one program per (ROWS token rows, part): Q and K get RMSNorm across heads + 3-D RoPE (K
        # then minus its per-sample token mean when SMOOTH), V passes through; each is multiplied
        # by its per-(sample, head) inverse scale and stored as e4m3 at out_ptr + part *
        # out_part_stride + row * out_row_stride (the [.., 3D] layout, or Q, K, V each
        # contiguous). A row is read as [pairs, 2], so each rotation pair is split out in
        # registers and joined back before one contiguous store.
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        part = tl.program_id(1)
        rmask = rows < M
        sample = rows // rows_per_sample
        pair = tl.arange(0, HALF)
        offs = pair[:, None] * 2 + tl.arange(0, 2)[None, :]  # [P, 2]
        cmask = offs < D
        mask = rmask[:, None, None] & cmask[None, :, :]  # [R, P, 2]
        src = rows[:, None, None] * row_stride + part * D + offs[None, :, :]
        x = tl.load(in_ptr + src, mask=mask, other=0.0).to(tl.float32)
        if part < 2:
            w = tl.load(w_ptr + part * D + offs, mask=cmask, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(tl.sum(x * x, axis=2), axis=1) / D + eps)
            x = x * rstd[:, None, None] * w[None, :, :]
            tok = rows % rows_per_sample
            f = (tok // (grid_h * grid_w))[:, None]
            hh = ((tok // grid_w) % grid_h)[:, None]
            ww = (tok % grid_w)[:, None]
            dh = ((pair * 2) % HEAD_DIM)[None, :]
            pos = tl.where(dh < T_DIM, f, tl.where(dh < T_DIM + H_DIM, hh, ww))  # [R, P]
            pmask = rmask[:, None] & (pair * 2 < D)[None, :]
            c = tl.load(cos_ptr + pos * table_stride + dh, mask=pmask, other=0.0).to(tl.float32)
            s = tl.load(sin_ptr + pos * table_stride + dh, mask=pmask, other=0.0).to(tl.float32)
            xe, xo = tl.split(x)
            x = tl.join(xe * c - xo * s, xe * s + xo * c)
        if SMOOTH:
            if part == 1:
                x = x - tl.load(mean_ptr + sample[:, None, None] * D + offs[None, :, :], mask=mask, other=0.0)
        head = offs // HEAD_DIM
        inv = tl.load(inv_ptr + (part * batch + sample[:, None, None]) * HEADS + head[None, :, :],
                      mask=mask, other=0.0)
        q = tl.clamp(x * inv, -448.0, 448.0)
        dst = part * out_part_stride + rows[:, None, None] * out_row_stride + offs[None, :, :]
        tl.store(out_ptr + dst, q.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)

    @triton.jit
    def qkv_flat_kernel(
        in_ptr, out_ptr, w_ptr, inv_ptr, mean_ptr,
        cos_ptr, sin_ptr, table_stride,
        M, row_stride, out_row_stride, out_part_stride, rows_per_sample, batch, grid_h, grid_w, D, eps,
        HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, T_DIM: tl.constexpr, H_DIM: tl.constexpr,
        BLOCK: tl.constexpr, SMOOTH: tl.constexpr, ROWS: tl.constexpr,
    ):
        # qkv_kernel's contract with the row read flat, [ROWS, BLOCK]: each element's rotation
        # partner (column ^ 1) is read a second time (from L1) instead of splitting pairs out in
        # registers, and the cos/sin tables (each frequency repeated twice) are read at every column
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        part = tl.program_id(1)
        rmask = rows < M
        sample = rows // rows_per_sample
        cols = tl.arange(0, BLOCK)
        cmask = cols < D
        mask = rmask[:, None] & cmask[None, :]
        src = in_ptr + rows[:, None] * row_stride + part * D
        x = tl.load(src + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if part < 2:
            partner = cols ^ 1
            xp = tl.load(src + partner[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + part * D + cols, mask=cmask, other=0.0).to(tl.float32)
            wp = tl.load(w_ptr + part * D + partner, mask=cmask, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
            tok = rows % rows_per_sample
            f = (tok // (grid_h * grid_w))[:, None]
            hh = ((tok // grid_w) % grid_h)[:, None]
            ww = (tok % grid_w)[:, None]
            dh = (cols % HEAD_DIM)[None, :]
            pos = tl.where(dh < T_DIM, f, tl.where(dh < T_DIM + H_DIM, hh, ww))  # [R, C]
            c = tl.load(cos_ptr + pos * table_stride + dh, mask=mask, other=0.0).to(tl.float32)
            s = tl.load(sin_ptr + pos * table_stride + dh, mask=mask, other=0.0).to(tl.float32)
            # (e, o) -> (e c - o s, e s + o c): the even column takes its partner with a minus
            sign = tl.where(cols % 2 == 0, -1.0, 1.0)[None, :]
            x = (x * w[None, :] * c + sign * (xp * wp[None, :]) * s) * rstd[:, None]
        if SMOOTH:
            if part == 1:
                x = x - tl.load(mean_ptr + sample[:, None] * D + cols[None, :], mask=mask, other=0.0)
        head = cols // HEAD_DIM
        inv = tl.load(inv_ptr + (part * batch + sample[:, None]) * HEADS + head[None, :], mask=mask, other=0.0)
        q = tl.clamp(x * inv, -448.0, 448.0)
        dst = part * out_part_stride + rows[:, None] * out_row_stride + cols[None, :]
        tl.store(out_ptr + dst, q.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)

    @triton.jit
    def scaled_cast_kernel(x_ptr, inv_ptr, q_ptr, n, per_sample, BLOCK: tl.constexpr):
        # e4m3 of x times its sample's inverse scale: an elementwise pass, no reduction
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
        inv = tl.load(inv_ptr + offs // per_sample, mask=m, other=0.0)
        q = tl.clamp(x * inv, -448.0, 448.0)
        tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=m)

    return rows_kernel, qkv_kernel, head_amax_kernel, scaled_cast_kernel, qkv_flat_kernel


def row_tiles(k: int) -> tuple[int, int]:
    """The register tiles one row of ``k`` columns is held in: the widest power of two not over
    ``k`` and, for the rest, the next power of two (0 when none is left)."""
    head = 1 << (k.bit_length() - 1)
    rest = k - head
    return head, (1 << (rest - 1).bit_length()) if rest else 0


def _launch_rows(x: torch.Tensor, bias: torch.Tensor | None, *, gelu: bool, tiles: bool = False,
                 warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton row quantizer. ``tiles``: a row read once is held in two power-of-two tiles
    (:func:`row_tiles`), else padded to one; ``warps`` overrides the launch's warp count (both
    for bench/fp8_kernels_probe.py). Tiles are off: on an H100 the FFN's bias + GELU at 32,760 x
    8,960 took 611-638 us in tiles against 496 us padded and 482 us in two reads
    (bench/results/fp8_kernels_probe_h100.json)."""
    import triton
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    m = x2.shape[0]
    q = torch.empty(x2.shape, dtype=E4M3, device=x.device)
    s = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    chunk, tail = row_tiles(k) if tiles else (triton.next_power_of_2(k), 0)
    lanes = chunk + tail
    if lanes <= ROW_REGISTER_WIDTH:
        # the whole row in registers, read once (and the GELU computed once); narrow rows several
        # per program, wide ones (Wan's 5,120 / 8,960 / 13,824) one per program over 16 warps
        nchunk, rows = 1, max(1, min(8, 4096 // triton.next_power_of_2(lanes)))
        elems = rows * lanes
        nwarps = 4 if elems <= 2048 else (8 if elems <= 4096 else 16)
    else:  # wider rows: amax over chunks, then a second (L2) read to quantize
        chunk, tail, nchunk, rows, nwarps = 2048, 0, triton.cdiv(k, 2048), 1, 8
    _kernels()[0][(triton.cdiv(m, rows),)](x2, bias if bias is not None else x2, q, s, m, k, GELU=gelu, ROWS=rows,
                                          CHUNK=chunk, NCHUNK=nchunk, TAIL=tail,
                                          FAST_TANH=not interpreting(), num_warps=warps or nwarps)
    return q.view(*x.shape), s.view(*x.shape[:-1], 1)


def head_amax(src: torch.Tensor, heads: int, impl: str = "torch") -> torch.Tensor:
    """max |src| per (sample, head) of ``src`` [B, L, heads*head_dim] (rows may be strided, the
    last dim contiguous) -> fp32 [B, heads]."""
    b, n, d = src.shape
    hd = d // heads
    if impl == "torch" or src.device.type != "cuda":
        return src.view(b, n, heads, hd).abs().amax(dim=(1, 3)).float()
    import triton
    if src.stride(-1) != 1 or src.stride(0) != n * src.stride(1):
        raise ValueError("head_amax: rows must be evenly strided with a contiguous last dim")
    out = torch.zeros(b, heads, dtype=torch.float32, device=src.device)
    rows = 64
    _kernels()[2][(b, triton.cdiv(n, rows), heads)](src, src.stride(1), out, n, ROWS=rows, HEAD_DIM=hd, num_warps=4)
    return out


# ------------------------------------------------------------------------------ FP8 attention
def qk_scale_bound(norm_weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Per-head scales of RMS-normed Q or K that can never saturate: after an RMSNorm across
    ``D`` columns each element is at most ``sqrt(D)`` in magnitude before its weight, and RoPE
    only rotates pairs within a head. ``norm_weight`` [D] -> fp32 [heads]. Being a bound, it
    costs no pass over the data; e4m3 keeps ~2^-4 relative precision over 2^15 of range below it."""
    d = norm_weight.shape[-1]
    w = norm_weight.detach().float().abs().view(heads, d // heads).amax(dim=1)
    return (math.sqrt(d) * w).clamp_min(AMAX_FLOOR) / E4M3_MAX


#: how Q and K of the FP8 self-attention are scaled (the card's ``fp8.attention_scales``):
#: ``bound``: the static :func:`qk_scale_bound` of the RMSNorm weights (no pass over the data);
#: ``amax``: the measured per-(sample, head) amax of the normed, rotated Q and K (one more pass);
#: ``smooth_k``: as ``amax``, K first minus its per-(sample, channel) mean over the tokens
#: (SageAttention's smoothing: softmax is invariant to it, and K's shared offset no longer spends
#: e4m3 range). V always uses its measured per-(sample, head) amax.
ATTENTION_SCALES = ("bound", "amax", "smooth_k")


def qk_stats(qk: torch.Tensor, heads: int, smooth_k: bool, impl: str = "torch"
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """From the normed, rotated ``qk`` [B, L, 2D]: the amax-derived scales [2, B, heads] of Q and
    K and, when ``smooth_k``, K's per-(sample, channel) mean over the tokens [B, D] (fp32). The K
    scale then bounds ``|k - mean|`` by ``amax|k| + max|mean|`` per head, so it never saturates
    without a further pass."""
    b, n, width = qk.shape
    d = width // 2
    amax_q = head_amax(qk[..., :d], heads, impl)
    amax_k = head_amax(qk[..., d:], heads, impl)
    mean = None
    if smooth_k:
        mean = qk[..., d:].mean(dim=1, dtype=torch.float32)  # [B, D], no fp32 copy of K
        amax_k = amax_k + mean.abs().view(b, heads, d // heads).amax(dim=2)
    scales = torch.stack([amax_q, amax_k]).clamp_min(AMAX_FLOOR) / E4M3_MAX
    return scales, mean


def qkv_fp8(qkv: torch.Tensor, norm: torch.Tensor, qk_scales: torch.Tensor, *, heads: int, eps: float,
            rope, impl: str = "torch", scales: str = "bound", rows: int | None = None,
            warps: int | None = None, split: bool = False, kernel: str | None = None,
            v_scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused self-attention projection ``qkv`` [B, L, 3D] (bf16) -> e4m3 [B, L, 3D] holding
    RMSNorm+RoPE'd Q and K and plain V, and their descales [3, B, heads] (fp32). ``scales`` picks
    Q's and K's (:data:`ATTENTION_SCALES`): ``bound`` uses ``qk_scales`` [2, heads]
    (:func:`qk_scale_bound`); ``amax`` / ``smooth_k`` measure them (:func:`qk_stats`), the
    latter storing ``K - mean(K)`` (attention's output is unchanged by it). V uses its measured
    per-(sample, head) amax. ``norm`` [2, D] are the Q and K RMSNorm weights; ``rope`` a
    :class:`RopeGrid`. Q, K and V are each read once by the quantizing pass; ``amax`` and
    ``smooth_k`` add one norm+RoPE pass for their statistics. ``split``: the output is [3, B, L, D]
    instead, Q, K and V each contiguous. ``kernel``: one of :data:`QKV_KERNELS` (default
    :data:`QKV_KERNEL`), the Triton pass's formulation (the same values). ``v_scales`` [B, heads]:
    V's scales given by the caller, a bound of ``amax / 448`` per (sample, head) (then V is not
    measured; values over the bound are clamped to +-448)."""
    if scales not in ATTENTION_SCALES:
        raise ValueError(f"attention scales must be one of {ATTENTION_SCALES}, got {scales!r}")
    if kernel is not None and kernel not in QKV_KERNELS:
        raise ValueError(f"qkv_fp8: kernel must be one of {QKV_KERNELS}, got {kernel!r}")
    b, n, width = qkv.shape
    d = width // 3
    hd = d // heads
    if v_scales is None:
        v_amax = head_amax(qkv[..., 2 * d:], heads, impl)  # [B, H]
        v_scale = (v_amax.clamp_min(AMAX_FLOOR) / E4M3_MAX).view(1, b, heads)
    elif tuple(v_scales.shape) != (b, heads):
        raise ValueError(f"qkv_fp8: v_scales must be [{b}, {heads}], got {list(v_scales.shape)}")
    else:
        v_scale = v_scales.float().view(1, b, heads)
    mean, qk = None, None
    if scales == "bound":
        qk_s = qk_scales.float().view(2, 1, heads).expand(2, b, heads)
    else:
        from fastvideo3.kernels.fused import qk_norm_rope
        qk = qk_norm_rope(qkv, norm, parts=2, eps=eps, heads=heads, rope=rope, impl=impl)
        qk_s, mean = qk_stats(qk, heads, scales == "smooth_k", impl)
    all_scales = torch.cat([qk_s, v_scale])  # [3, B, H]
    if impl == "torch" or qkv.device.type != "cuda":
        if qk is None:
            from fastvideo3.kernels.fused import qk_norm_rope
            qk = qk_norm_rope(qkv, norm, parts=2, eps=eps, heads=heads, rope=rope, impl="torch")
        qk = qk.float()
        if mean is not None:
            qk = torch.cat([qk[..., :d], qk[..., d:] - mean[:, None, :]], dim=-1)
        full = torch.cat([qk, qkv[..., 2 * d:].float()], dim=-1).view(b, n, 3, heads, hd)
        inv = (1.0 / all_scales).permute(1, 0, 2).reshape(b, 1, 3, heads, 1)
        q = (full * inv).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).view(b, n, 3 * d)
        if split:
            q = q.view(torch.uint8).view(b, n, 3, d).permute(2, 0, 1, 3).contiguous().view(E4M3)
        return q, all_scales
    return _launch_qkv(qkv, norm, 1.0 / all_scales, mean, rope, heads=heads, eps=eps, rows=rows,
                       warps=warps, split=split, kernel=kernel), all_scales


def _launch_qkv(qkv: torch.Tensor, norm: torch.Tensor, inv: torch.Tensor, mean: torch.Tensor | None, rope, *,
                heads: int, eps: float, rows: int | None = None, warps: int | None = None,
                split: bool = False, kernel: str | None = None) -> torch.Tensor:
    """The quantizing pass of :func:`qkv_fp8` (Triton): ``inv`` [3, B, H] inverse scales, ``mean``
    [B, D] K's token mean to subtract (or None); ``rows`` token rows a program (default
    :data:`QKV_ROWS`), ``warps`` its warps (both for the bench's probes)."""
    import triton
    if not (qkv.is_contiguous() and norm.is_contiguous()):
        raise ValueError("qkv_fp8: qkv and norm must be contiguous")
    b, n, width = qkv.shape
    d = width // 3
    out = torch.empty((3, b, n, d) if split else (b, n, 3 * d), dtype=E4M3, device=qkv.device)
    inv = inv.float().contiguous()
    block = triton.next_power_of_2(d)
    if rows is None and warps is None:
        rows, warps = QKV_ROWS, QKV_WARPS
    rows = rows or QKV_ROWS
    kernel = kernel or QKV_KERNEL
    if kernel not in QKV_KERNELS:
        raise ValueError(f"qkv_fp8: kernel must be one of {QKV_KERNELS}, got {kernel!r}")
    args = (qkv, out, norm, inv, mean.float().contiguous() if mean is not None else inv,
            rope.cos, rope.sin, rope.cos.stride(0), b * n, 3 * d, d if split else 3 * d, b * n * d if split else d,
            n, b, rope.grid[1], rope.grid[2], d, eps)
    consts = dict(HEADS=heads, HEAD_DIM=d // heads, T_DIM=rope.t_dim, H_DIM=rope.h_dim, SMOOTH=mean is not None,
                  ROWS=rows, num_warps=warps or max(4, min(16, rows * block // 512)))
    grid = (triton.cdiv(b * n, rows), 3)
    if kernel == "flat":
        _kernels()[4][grid](*args, BLOCK=block, **consts)
    else:
        _kernels()[1][grid](*args, HALF=block // 2, **consts)
    return out


def fp8_attention_available(device: torch.device | str, head_dim: int) -> bool:
    """Whether FP8 self-attention can run: the FA3 wheel imports, Hopper, a head dim it builds."""
    from fastvideo3.kernels.attention import attention_available
    return head_dim in (64, 128, 256) and attention_available("fa3", device)


def attention_fp8(qkv_q: torch.Tensor, scales: torch.Tensor, heads: int) -> torch.Tensor:
    """Softmax attention on the e4m3 output of :func:`qkv_fp8` ([B, L, 3D] or [3, B, L, D], and
    [3, B, H] descales) through
    FlashAttention-3's FP8 forward; returns bf16 [B, L, H, head_dim]."""
    from fastvideo3.kernels.attention import _fa3
    fn = _fa3()
    if fn is None:
        raise RuntimeError("FP8 attention needs the fa3_fwd wheel (FlashAttention-3 forward)")
    if qkv_q.dim() == 4:  # [3, B, L, D]: Q, K and V each contiguous (qkv_fp8(split=True))
        _, b, n, d = qkv_q.shape
        q, k, v = (qkv_q[i].view(b, n, heads, d // heads) for i in range(3))
    else:
        b, n, width = qkv_q.shape
        d = width // 3
        q, k, v = (qkv_q[..., i * d:(i + 1) * d].view(b, n, heads, d // heads) for i in range(3))
    out = fn(q, k, v, q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])
    return out[0] if isinstance(out, tuple) else out
