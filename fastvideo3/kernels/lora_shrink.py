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

from fastvideo3.kernels import lora_common as lc

#: the fixed tiles (the interpreter's, and the fallback when autotuning fails) and the candidates
DEFAULT_TILES = ({"BM": 32, "BK": 64}, 4)
SHRINK_CONFIGS = [({"BM": bm, "BK": bk}, w) for bm, bk, w in (
    (16, 64, 4), (16, 128, 4), (32, 64, 4), (32, 128, 4), (64, 64, 4), (64, 64, 8), (64, 128, 8))]
#: aim for at least this many programs (four per SM of an H200) before splitting K
SPLIT_PROGRAMS = 528
MAX_SPLIT = 8
_STATE = {"autotune": True, "fallback": None}


_TUNERS: dict[str, object] = {}


def status() -> dict:
    """Whether the autotuned kernels are in use, why not if they are not, and the configs chosen
    (by kernel, then by key)."""
    out = {"autotune": _STATE["autotune"] and not lc.interpreting(), "fallback": _STATE["fallback"], "chosen": {}}
    for name, tuner in _TUNERS.items():
        out["chosen"][name] = {str(tuple(k)[:len(tuner.keys)]): str(v) for k, v in getattr(tuner, "cache", {}).items()}
    return out


def launch(name: str, kernel, configs: list[tuple[dict, int]], key: list[str], grid, args: tuple, flags: dict,
           default: tuple[dict, int], restore: tuple[str, ...] = (), cuda: bool = True) -> None:
    """Launch a Triton ``kernel`` with its tiles picked by ``triton.autotune`` over ``configs``
    (``(meta, num_warps)`` pairs) keyed on the ``key`` arguments; ``restore`` names the tensors the
    kernel updates in place (restored between the benchmark runs). ``grid(meta)`` gives the
    grid. Under the interpreter, off CUDA, with autotuning off, or once it failed (recorded in
    :func:`status`): the ``default`` tiles."""
    import triton
    if _STATE["autotune"] and cuda and not lc.interpreting():
        tuner = _TUNERS.get(name)
        try:
            if tuner is None:
                cfgs = [triton.Config(meta, num_warps=w, num_stages=3) for meta, w in configs]
                kw = dict(configs=cfgs, key=key, restore_value=list(restore) or None)
                try:  # short benchmarks: the kernels take microseconds
                    tuner = triton.autotune(**kw, do_bench=lambda fn, quantiles: triton.testing.do_bench(
                        fn, warmup=5, rep=20, quantiles=quantiles))(kernel)
                except TypeError:  # an older triton.autotune without do_bench
                    tuner = triton.autotune(**kw)(kernel)
                _TUNERS[name] = tuner
            tuner[grid](*args, **flags)
            return
        except Exception as e:  # noqa: BLE001 - any tuning failure: the fixed tiles from now on
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise
            _STATE["autotune"], _STATE["fallback"] = False, f"{name}: {type(e).__name__}: {e}"[:300]
    meta, warps = default
    kernel[grid(meta)](*args, **flags, **meta, num_warps=warps)


def set_autotune(on: bool) -> None:
    _STATE["autotune"] = bool(on)


@functools.lru_cache(maxsize=1)
def _kernels():
    import triton
    import triton.language as tl
    lc.jit()

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
            a_base = A + slot * sas + (g * R + offs_r[None, :]) * sar
            acc = lc.down(X, a_base, row, sxb, sxn, offs_m, m_ok, k_begin, k_end, BM, R, BK, IEEE, F32DOT)
            mask = m_ok & (offs_r[None, :] < R)
            if SPLIT == 1:
                ptr = OUT + row * sob + offs_m[:, None] * son + g * R + offs_r[None, :]
                tl.store(ptr, (acc * tl.load(SCALE + row)).to(OUT.dtype.element_ty), mask=mask)
            else:
                ptr = OUT + (part * tl.num_programs(2) + row).to(tl.int64) * sob + offs_m[:, None] * son \
                    + g * R + offs_r[None, :]
                tl.store(ptr, acc, mask=mask)

    return shrink_split


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
    lc.check_rows(slots, scales, bsz)
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
    lc.check_impl(impl)
    import triton
    lc.check_unit_stride(x, a)
    lc.check_rank(r)
    if split == 1:
        out = torch.empty(bsz, n, groups * r, device=x.device, dtype=x.dtype)
        sob, son = out.stride(0), out.stride(1)
    else:
        out = torch.empty(split, bsz, n, groups * r, device=x.device, dtype=torch.float32)
        sob, son = out.stride(1), out.stride(2)
    args = (x, out, a, slots, scales, n, k, groups, x.stride(0), x.stride(1), a.stride(0), a.stride(1), sob, son)
    flags = dict(R=r, SPLIT=split, **lc.dot_flags(x.dtype))
    launch("shrink", _kernels(), SHRINK_CONFIGS, ["N", "K", "G", "R", "SPLIT"],
           lambda meta: (groups * split, triton.cdiv(n, meta["BM"]), bsz), args, flags, DEFAULT_TILES, cuda=x.is_cuda)
    return out
