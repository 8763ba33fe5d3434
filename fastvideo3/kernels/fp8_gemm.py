"""The FFN's first FP8 GEMM with its bias, tanh-GELU and the next GEMM's e4m3 cast in the epilogue.

Unfused, the FFN's hidden layer costs a bf16 write of ``[M, 4D]`` by the GEMM and a read of it by
the bias + GELU + per-token quantizer (:func:`~fastvideo3.kernels.fp8.bias_gelu_quant`): that pass
is 5% of the 1.3B forward. Here one Triton GEMM computes ``gelu_tanh(x @ W.T + b)`` tile by tile
and writes it as e4m3 straight away.

A tile sees only its own columns, so the per-token scale of the output cannot be its row's amax.
It is a bound instead, known before the GEMM: with ``x = xq * sa`` (e4m3 rows, ``|xq| <= 448``)
and ``W``'s rows of norm at most ``w_norm``,

    |x_m . w_n + b_n| <= 448 * sqrt(K) * sa_m * w_norm + max |b|       (Cauchy-Schwarz)

and ``|gelu(z)| <= max(|z|, 0.17)``. So ``scale_m = bound_m / 448`` never saturates. It sits
above the row's true amax by a factor of roughly ``amax / rms`` of ``x`` times ``sqrt(K) / 4``
(tens, not thousands); e4m3 keeps its full 2^-4 relative step over 2^15 of range below 448, so
only values under ~1/500 of the row's largest lose precision, and those add little to the next
GEMM's sums. The next GEMM reads the scale like any per-token one.

``impl="torch"`` computes the same contract (the same bound) in PyTorch: the CPU reference.
"""
from __future__ import annotations

import functools
import math
import os

import torch
import torch.nn.functional as F

from fastvideo3.kernels.fp8 import E4M3, E4M3_MAX
from fastvideo3.kernels.lora_common import interpreting

#: the smallest bound a row's scale takes: the magnitude of GELU's negative lobe (min ~ -0.17)
GELU_FLOOR = 0.17
#: launch configurations (block M, N, K, group M, warps, stages, kernel); the fastest pointer one
#: took 0.876 ms at the 1.3B FFN's shape on an H100 (32,760 x 1,536 -> 8,960) against 1.151
#: for cuBLAS + the quantizing pass (bench/results/fp8_gemm_probe_h100.json; cuBLAS's GEMM alone took
#: 0.654). ``kernel``: ``"pointer"`` (masked pointer loads), ``"tma"`` (tensor-memory-accelerator
#: loads and store, one tile a program) or ``"tma_persistent"`` (one program per multiprocessor
#: walking the tiles; its loops are not flattened: Triton 3.6 failed to compile the flattened one in
#: TritonGPUFuseNestedLoops). The TMA kernels need 16-byte aligned rows (K and N multiples of 16);
#: other shapes take the pointer kernel at the same tiles.
CONFIGS = ((128, 256, 64, 8, 8, 5, "pointer"), (128, 256, 128, 8, 8, 4, "pointer"),
           (256, 128, 128, 8, 8, 4, "pointer"), (128, 128, 128, 8, 4, 5, "pointer"),
           (128, 256, 64, 8, 8, 5, "tma"), (128, 256, 128, 8, 8, 4, "tma"), (128, 128, 128, 8, 4, 5, "tma"),
           (128, 256, 64, 8, 8, 4, "tma_persistent"), (128, 256, 128, 8, 8, 3, "tma_persistent"))
KERNELS = ("pointer", "tma", "tma_persistent")
#: the persistent TMA kernel at 128x256x128, 3 stages: the fastest of CONFIGS on an H100 at the 1.3B
#: FFN-in shape (0.787 ms against 0.876-0.971 for the pointer configs,
#: bench/results/fp8_gemm_probe_variants_h100.json)
DEFAULT_CONFIG = CONFIGS[8]
#: an index into CONFIGS that overrides the default (a bench choosing the fastest on its card)
CONFIG_ENV = "FASTVIDEO3_FP8_FFN_CONFIG"


def row_bound_scales(x_scale: torch.Tensor, k: int, w_norm: float | torch.Tensor,
                     bias_amax: float | torch.Tensor) -> torch.Tensor:
    """The output scales [M] (fp32) of :func:`ffn_in_gelu_fp8`: ``max(448 sqrt(k) sa w_norm +
    max|b|, 0.17) / 448`` for input scales ``x_scale`` [M] or [M, 1]."""
    sa = x_scale.reshape(-1).float()
    bound = E4M3_MAX * math.sqrt(k) * sa * w_norm + bias_amax
    return bound.clamp_min(GELU_FLOOR) / E4M3_MAX


def weight_stats(w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor) -> tuple[float, float]:
    """(max row norm of the dequantized weight, max |bias|) for e4m3 ``w`` [N, K], scale [N]:
    computed once at load, the inputs of :func:`row_bound_scales`. Rounded up by 2^-20 so the
    bound still holds after the fp32 arithmetic."""
    norms = (w.float() * w_scale.float()[:, None]).norm(dim=1)
    return float(norms.max()) * (1 + 2 ** -20), float(bias.float().abs().max()) * (1 + 2 ** -20)


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl
    global tile_coords, gelu_e4m3  # the kernels' helpers: globals, where Triton's interpreter looks

    @triton.jit
    def tile_coords(tile, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
        # grouped order: GROUP_M row blocks share their column blocks while they are in L2
        num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
        first_m = (tile // (GROUP_M * num_n)) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        return first_m + (tile % (GROUP_M * num_n)) % size_m, (tile % (GROUP_M * num_n)) // size_m

    @triton.jit
    def gelu_e4m3(acc, sa_ptr, sw_ptr, b_ptr, s_ptr, rows, cols, pid_n, M, N, bound_k, bias_amax,
                  FAST_TANH: tl.constexpr):
        # the epilogue: dequantize, bias, tanh-GELU, divide by the row's bound scale (stored once,
        # by the first column block); returns the clamped values to cast
        rmask, cmask = rows < M, cols < N
        sa = tl.load(sa_ptr + rows, mask=rmask, other=0.0)
        sw = tl.load(sw_ptr + cols, mask=cmask, other=0.0)
        bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        z = acc * sa[:, None] * sw[None, :] + bias[None, :]
        u = 0.7978845608028654 * (z + 0.044715 * z * z * z)
        if FAST_TANH:
            t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32,
                                          is_pure=True, pack=1)
        else:
            t = 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)
        g = 0.5 * z * (1.0 + t)
        bound = tl.maximum(bound_k * sa + bias_amax, 0.17)
        if pid_n == 0:
            tl.store(s_ptr + rows, bound / 448.0, mask=rmask)
        return tl.clamp(g * (448.0 / bound)[:, None], -448.0, 448.0)

    @triton.jit
    def ffn_in_kernel(a_ptr, sa_ptr, w_ptr, sw_ptr, b_ptr, q_ptr, s_ptr, M, N, K, bound_k, bias_amax,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                      FAST_TANH: tl.constexpr, IMPRECISE: tl.constexpr):
        pid_m, pid_n = tile_coords(tl.program_id(0), M, N, BM, BN, GROUP_M)
        rows = pid_m.to(tl.int64) * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        ks = tl.arange(0, BK)
        rmask, cmask = rows < M, cols < N
        a_ptrs = a_ptr + rows[:, None] * K + ks[None, :]
        w_ptrs = w_ptr + cols[None, :].to(tl.int64) * K + ks[:, None]  # [BK, BN]: W's rows, K-major
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, K, BK):
            kmask = (k0 + ks) < K
            a = tl.load(a_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=kmask[:, None] & cmask[None, :], other=0.0)
            if IMPRECISE:
                acc = tl.dot(a, w, acc)
            else:  # partial sums promoted to fp32 every 32 products, as cuBLAS does without fast accumulation
                acc = tl.dot(a, w, acc, max_num_imprecise_acc=32)
            a_ptrs += BK
            w_ptrs += BK
        q = gelu_e4m3(acc, sa_ptr, sw_ptr, b_ptr, s_ptr, rows, cols, pid_n, M, N, bound_k, bias_amax, FAST_TANH)
        tl.store(q_ptr + rows[:, None] * N + cols[None, :], q.to(q_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=rmask[:, None] & cmask[None, :])

    @triton.jit
    def ffn_in_tma_kernel(a_desc, sa_ptr, w_desc, sw_ptr, b_ptr, q_desc, s_ptr, M, N, K, bound_k, bias_amax,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                          FAST_TANH: tl.constexpr, IMPRECISE: tl.constexpr, PROGRAMS: tl.constexpr):
        # the same contract through tensor descriptors (out-of-bounds reads are zeros, writes
        # dropped); PROGRAMS 0: one tile a program, else that many programs each walking the tiles
        # (persistent; the tile loop is not flattened into the K loop)
        num_tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
        step = PROGRAMS if PROGRAMS > 0 else num_tiles
        for tile in range(tl.program_id(0), num_tiles, step):
            pid_m, pid_n = tile_coords(tile, M, N, BM, BN, GROUP_M)
            off_m, off_n = pid_m * BM, pid_n * BN
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            for kk in range(tl.cdiv(K, BK)):
                a = a_desc.load([off_m, kk * BK])
                w = w_desc.load([off_n, kk * BK])
                if IMPRECISE:
                    acc = tl.dot(a, w.T, acc)
                else:
                    acc = tl.dot(a, w.T, acc, max_num_imprecise_acc=32)
            rows = off_m.to(tl.int64) + tl.arange(0, BM)
            cols = off_n + tl.arange(0, BN)
            q = gelu_e4m3(acc, sa_ptr, sw_ptr, b_ptr, s_ptr, rows, cols, pid_n, M, N, bound_k, bias_amax, FAST_TANH)
            q_desc.store([off_m, off_n], q.to(tl.float8e4nv, fp_downcast_rounding="rtne"))  # E4M3

    return ffn_in_kernel, ffn_in_tma_kernel


def ffn_in_gelu_fp8(xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor,
                    bias: torch.Tensor, w_norm: float, bias_amax: float, *, fast_accum: bool = False,
                    impl: str = "torch", config: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``gelu_tanh((xq * x_scale) @ (wq * w_scale[:, None]).T + bias)`` as e4m3 ``[..., N]`` with
    per-row scales ``[..., 1]`` from :func:`row_bound_scales` (``w_norm``, ``bias_amax`` from
    :func:`weight_stats`). ``xq`` [..., K] e4m3, ``x_scale`` [..., 1]; ``wq`` [N, K] e4m3,
    ``w_scale`` [N]; ``bias`` [N]. ``config`` picks one of :data:`CONFIGS` (the bench's probe)."""
    lead, k = xq.shape[:-1], xq.shape[-1]
    n = wq.shape[0]
    a = xq.reshape(-1, k)
    sa = x_scale.reshape(-1).float().contiguous()
    m = a.shape[0]
    if impl == "torch" or (xq.device.type != "cuda" and not interpreting()):
        s = row_bound_scales(sa, k, w_norm, bias_amax)
        y = (a.float() * sa[:, None]) @ (wq.float() * w_scale.float()[:, None]).t() + bias.float()
        g = F.gelu(y, approximate="tanh")
        q = (g / s[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        return q.view(*lead, n), s.view(*lead, 1)
    import triton
    if not (a.is_contiguous() and wq.is_contiguous()):
        raise ValueError("ffn_in_gelu_fp8: x and W must be contiguous")
    bm, bn, bk, group, warps, stages, kind = config or _default_config()
    if kind not in KERNELS:
        raise ValueError(f"ffn_in_gelu_fp8: kernel must be one of {KERNELS}, got {kind!r}")
    q = torch.empty(m, n, dtype=E4M3, device=xq.device)
    s = torch.empty(m, dtype=torch.float32, device=xq.device)
    sw, b = w_scale.float().contiguous(), bias.contiguous()
    scalars = (m, n, k, E4M3_MAX * math.sqrt(k) * w_norm, bias_amax)
    flags = dict(BM=bm, BN=bn, BK=bk, GROUP_M=group, FAST_TANH=not interpreting(),
                 IMPRECISE=fast_accum or interpreting(), num_warps=warps, num_stages=stages)
    pointer, tma = _kernel()
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    if kind == "pointer" or k % 16 or n % 16:  # TMA rows must be 16-byte aligned
        pointer[(tiles,)](a, sa, wq, sw, b, q, s, *scalars, **flags)
    else:
        from triton.tools.tensor_descriptor import TensorDescriptor
        programs = min(_sm_count(xq.device), tiles) if kind == "tma_persistent" else 0
        tma[(programs or tiles,)](
            TensorDescriptor.from_tensor(a, [bm, bk]), sa, TensorDescriptor.from_tensor(wq, [bn, bk]), sw, b,
            TensorDescriptor.from_tensor(q, [bm, bn]), s, *scalars, PROGRAMS=programs, **flags)
    return q.view(*lead, n), s.view(*lead, 1)


@functools.lru_cache(maxsize=1)
def _default_config() -> tuple:
    raw = os.environ.get(CONFIG_ENV, "")
    if not raw:
        return DEFAULT_CONFIG
    if not raw.isdigit() or int(raw) >= len(CONFIGS):
        raise ValueError(f"{CONFIG_ENV} must be an index below {len(CONFIGS)}, got {raw!r}")
    return CONFIGS[int(raw)]


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":  # the interpreter: a few programs still walk several tiles each
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
