"""The LoRA shrink with split-K and tiles the GPU picks: ``x @ a[slot].T`` per row, for one
layer or a group of layers that share ``x``.

``lora_shrink_split(x, a, slots, scales, groups, split)`` computes, for every batch row ``r``
with ``slots[r] >= 0`` and every member ``g``, ``x[r] @ a[slots[r], g*R:(g+1)*R].T`` (fp32
accumulation) as :func:`fastvideo3.kernels.lora_grouped.lora_shrink` does, with two changes:

* *split-K*: with ``split > 1`` the K axis is cut into ``split`` chunks, one program each, so a
  layer with a long input and few token tiles (the FFN's second layer at short clips: K = 8960,
  1,280 tokens a row) streams its input through every SM. The result is then the fp32,
  *unscaled* partial sums ``[split, B, N, G*R]``; the consumer
  (:func:`fastvideo3.kernels.lora_norm.lora_add_norm_next`) sums them in a fixed order, scales
  and rounds once (no atomics: the same bits every run). With ``split == 1`` the result is the
  scaled down projection rounded once to the activation dtype, ``[B, N, G*R]``, as
  ``lora_shrink`` returns it;
* *autotune*: on CUDA the token tile, K tile, warps and stages come from
  ``triton.autotune`` keyed on (N, K, G, R, split); the first call of each key benchmarks the
  configs (so it must not happen inside a CUDA graph capture: warm up first). If autotuning
  fails, the fixed tiles are used from then on and :func:`status` says why.

Rows without an adapter are left unwritten. ``impl="torch"``: the same sums in PyTorch.
"""
from __future__ import annotations

import functools

import torch

from fastvideo3.kernels.lora import _interpreting

#: the fixed tiles (the interpreter's, and the fallback when autotuning fails)
DEFAULT_TILES = {"BM": 32, "BK": 64}
#: aim for at least this many programs (four per SM of an H200) before splitting K
SPLIT_PROGRAMS = 528
MAX_SPLIT = 8
_STATE = {"autotune": True, "fallback": None}


def status() -> dict:
    """Whether the autotuned kernel is in use, why not if it is not, and the configs it chose."""
    out = {"autotune": _STATE["autotune"] and not _interpreting(), "fallback": _STATE["fallback"]}
    tuner = _kernels.cache_info().currsize and _kernels()[1]
    chosen = getattr(tuner, "cache", None) or {}
    out["chosen"] = {str(tuple(k[:5])): str(v) for k, v in chosen.items()}
    return out


def set_autotune(on: bool) -> None:
    _STATE["autotune"] = bool(on)


@functools.lru_cache(maxsize=1)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def shrink_split(X, OUT, A, SLOT, SCALE, N, K, G, sxb, sxn, sas, sar, sob, son,
                     R: tl.constexpr, SPLIT: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
                     IEEE: tl.constexpr, F32DOT: tl.constexpr):
        pid0 = tl.program_id(0)  # member fastest, then the K chunk
        g = pid0 % G
        part = pid0 // G
        pid_m = tl.program_id(1)
        row = tl.program_id(2)
        slot = tl.load(SLOT + row)
        if slot >= 0:
            offs_m = pid_m * BM + tl.arange(0, BM)
            offs_r = tl.arange(0, R)
            m_ok = offs_m[:, None] < N
            chunk = tl.cdiv(tl.cdiv(K, SPLIT), BK) * BK
            k_begin = part * chunk
            k_end = tl.minimum(k_begin + chunk, K)
            acc = tl.zeros((BM, R), dtype=tl.float32)
            a_base = A + slot * sas + (g * R + offs_r[None, :]) * sar
            for k0 in range(k_begin, k_end, BK):
                offs_k = k0 + tl.arange(0, BK)
                k_ok = offs_k < k_end
                x = tl.load(X + row * sxb + offs_m[:, None] * sxn + offs_k[None, :], mask=m_ok & k_ok[None, :],
                            other=0.0)
                a = tl.load(a_base + offs_k[:, None], mask=k_ok[:, None], other=0.0)
                if F32DOT:
                    x, a = x.to(tl.float32), a.to(tl.float32)
                if IEEE:
                    acc += tl.dot(x, a, input_precision="ieee")
                else:
                    acc += tl.dot(x, a)
            mask = m_ok & (offs_r[None, :] < R)
            if SPLIT == 1:
                ptr = OUT + row * sob + offs_m[:, None] * son + g * R + offs_r[None, :]
                tl.store(ptr, (acc * tl.load(SCALE + row)).to(OUT.dtype.element_ty), mask=mask)
            else:
                ptr = OUT + (part * tl.num_programs(2) + row).to(tl.int64) * sob + offs_m[:, None] * son \
                    + g * R + offs_r[None, :]
                tl.store(ptr, acc, mask=mask)

    configs = [triton.Config({"BM": bm, "BK": bk}, num_warps=w, num_stages=st)
               for bm, bk, w, st in ((16, 64, 4, 3), (16, 128, 4, 3), (32, 64, 4, 3), (32, 128, 4, 3),
                                     (32, 64, 4, 4), (64, 64, 4, 3), (64, 64, 8, 3), (64, 128, 8, 3))]
    kw = dict(configs=configs, key=["N", "K", "G", "R", "SPLIT"])
    try:  # short benchmarks: the kernels take microseconds
        tuned = triton.autotune(**kw, do_bench=lambda fn, quantiles: triton.testing.do_bench(
            fn, warmup=5, rep=20, quantiles=quantiles))(shrink_split)
    except TypeError:  # an older triton.autotune without do_bench
        tuned = triton.autotune(**kw)(shrink_split)
    return shrink_split, tuned


def choose_split(n: int, bsz: int, groups: int, k: int) -> int:
    """K chunks so that a shrink with few token tiles still launches ~SPLIT_PROGRAMS programs
    (each chunk at least 1024 inputs); 1 when the tokens alone fill the GPU."""
    tiles = -(-n // 64) * bsz * groups
    if tiles >= SPLIT_PROGRAMS:
        return 1
    return max(1, min(MAX_SPLIT, k // 1024, -(-SPLIT_PROGRAMS // tiles)))


def lora_shrink_split(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor, scales: torch.Tensor,
                      groups: int = 1, split: int = 1, impl: str = "triton") -> torch.Tensor:
    """See the module docstring: ``[B, N, G*R]`` scaled (``split == 1``) or fp32 unscaled
    partial sums ``[split, B, N, G*R]``."""
    bsz, n, k = x.shape
    if a.dim() != 3 or a.shape[2] != k or a.shape[1] % groups or groups < 1:
        raise ValueError(f"x {tuple(x.shape)}, a {tuple(a.shape)}: a must be [S, G*R, K] with G={groups}")
    if slots.shape != (bsz,) or scales.shape != (bsz,):
        raise ValueError("slots and scales need one entry per row")
    if not 1 <= split <= MAX_SPLIT:
        raise ValueError(f"split must be in [1, {MAX_SPLIT}], got {split}")
    r = a.shape[1] // groups
    if impl == "torch":
        parts = torch.zeros(split, bsz, n, groups * r, device=x.device, dtype=torch.float32)
        chunk = -(-k // split)
        for row in range(bsz):  # host sync: the CPU path only
            s = int(slots[row])
            if s < 0:
                continue
            for p in range(split):
                ks = slice(p * chunk, min(k, (p + 1) * chunk))
                parts[p, row] = torch.matmul(x[row, :, ks].float(), a[s, :, ks].float().t())
        if split == 1:
            return (parts[0] * scales.view(-1, 1, 1)).to(x.dtype)
        return parts
    if impl != "triton":
        raise ValueError(f"impl must be 'triton' or 'torch', got {impl!r}")
    import triton
    if x.stride(2) != 1 or a.stride(2) != 1:
        raise ValueError("the Triton path needs unit stride along the feature dims")
    if r < 16 or r & (r - 1):
        raise ValueError(f"the Triton path needs a power-of-two rank >= 16, got {r}")
    if split == 1:
        out = torch.empty(bsz, n, groups * r, device=x.device, dtype=x.dtype)
        sob, son = out.stride(0), out.stride(1)
    else:
        out = torch.empty(split, bsz, n, groups * r, device=x.device, dtype=torch.float32)
        sob, son = out.stride(1), out.stride(2)
    plain, tuned = _kernels()
    args = (x, out, a, slots, scales, n, k, groups, x.stride(0), x.stride(1), a.stride(0), a.stride(1), sob, son)
    flags = dict(R=r, SPLIT=split, IEEE=x.dtype == torch.float32,
                 F32DOT=x.dtype == torch.float32 or _interpreting())
    if _STATE["autotune"] and not _interpreting() and x.is_cuda:
        try:
            tuned[lambda meta: (groups * split, triton.cdiv(n, meta["BM"]), bsz)](*args, **flags)
            return out
        except Exception as e:  # noqa: BLE001 - any tuning failure: the fixed tiles from now on
            if torch.cuda.is_current_stream_capturing():
                raise
            _STATE["autotune"], _STATE["fallback"] = False, f"{type(e).__name__}: {e}"[:300]
    bm = DEFAULT_TILES["BM"]
    plain[(groups * split, triton.cdiv(n, bm), bsz)](*args, **flags, **DEFAULT_TILES)
    return out
