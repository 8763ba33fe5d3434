"""``fsum64`` on the device in one pass: a Triton kernel, optionally fused with the copy.

The digest is the one :mod:`fastvideo3.transport.checksum` defines (two 64-bit wrap-around sums
over the little-endian 32-bit words, ``s1 = sum(w_i)``, ``s2 = sum(i * w_i)``, i from 1, a
trailing partial word zero-padded). Integer sums are exact and order-free, so each program sums
one block of words and a second tiny reduction adds the per-block partials: the same digest as
the host code for the same bytes.

:func:`copy_and_fsum64` reads the source once, writes the destination and sums what it read: a
fetch that must copy and verify moves the bytes through memory once instead of twice (copy,
then checksum the copy). The sum is over the bytes as loaded, so a mismatch still means the
source bytes were not the published ones.

Used when Triton is importable and the tensor is on a CUDA device, or anywhere with
``TRITON_INTERPRET=1`` (how the CPU tests prove the digests equal). Returns ``None`` when it
cannot run (no Triton, misaligned data); callers fall back to the torch implementation. On a GPU,
an (address, size) pair that repeats runs from a captured CUDA graph (see :class:`_GraphCache`).
"""
from __future__ import annotations

import os

import numpy as np
import torch

_MASK64 = (1 << 64) - 1
BLOCK_WORDS = 8192  # 32 KiB per program: enough bytes in flight per SM to reach HBM speed
_KERNEL: list = []  # [{name: kernel}] once Triton has been imported, [None] if it cannot be


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


VARIANTS = ("atomic", "loop", "block")


class KernelConfig:
    """How the digest kernel is launched (benchmarks compare settings; the defaults are measured).

    ``loop``: a persistent grid of at most ``programs_per_sm`` programs per multiprocessor, each
    striding over ``block``-word tiles and keeping its sums in registers, so a 64 MiB digest
    reduces a few hundred partials instead of thousands. ``atomic``: the same grid, each program
    adding its two sums into one pair with integer atomics (wrap-around adds: the same residues),
    so two numbers come back. ``block``: one program per tile.
    ``pinned``: partial sums come back through pinned host memory (an asynchronous copy and a
    stream wait instead of a pageable copy).
    """

    def __init__(self, variant: str = "atomic", block: int = 2048, warps: int = 8, programs_per_sm: int = 4,
                 pinned: bool = True) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"device checksum variant must be one of {', '.join(VARIANTS)}, not {variant!r}")
        self.variant, self.block, self.warps = variant, block, warps
        self.programs_per_sm, self.pinned = programs_per_sm, pinned
        self._key = (variant, block, warps, programs_per_sm, pinned)

    def key(self) -> tuple:
        return self._key

    def as_dict(self) -> dict:
        return dict(zip(("variant", "block", "warps", "programs_per_sm", "pinned"), self.key()))


CONFIG = KernelConfig()
_SM_COUNT: dict = {}


def configure(**settings) -> KernelConfig:
    """Replace the launch settings (see :class:`KernelConfig`); returns the new configuration."""
    global CONFIG
    CONFIG = KernelConfig(**{**CONFIG.as_dict(), **settings})
    return CONFIG


def _kernel(name: str = "block"):
    """The compiled-on-first-launch kernels; imported lazily (Triton's import is not free)."""
    if not _KERNEL:
        try:
            import triton
            import triton.language as tl
        except Exception:  # Triton is optional: GPU images have it, CPU hosts may not
            _KERNEL.append(None)
            return None

        @triton.jit
        def fsum64_kernel(src, dst, partials, n_words, BLOCK: tl.constexpr, COPY: tl.constexpr):
            pid = tl.program_id(0)
            offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n_words
            w = tl.load(src + offs, mask=mask, other=0)
            if COPY:
                tl.store(dst + offs, w, mask=mask)
            # uint32 word -> int64 without sign extension; products and sums wrap mod 2**64
            w64 = w.to(tl.int64) & 0xFFFFFFFF
            tl.store(partials + pid * 2, tl.sum(w64, axis=0))
            tl.store(partials + pid * 2 + 1, tl.sum(w64 * (offs + 1), axis=0))

        @triton.jit
        def fsum64_loop_kernel(src, dst, partials, n_words, BLOCK: tl.constexpr, COPY: tl.constexpr,
                               ATOMIC: tl.constexpr):
            pid = tl.program_id(0)
            start = pid.to(tl.int64) * BLOCK
            step = tl.num_programs(0).to(tl.int64) * BLOCK
            lane = tl.arange(0, BLOCK)
            acc1 = tl.zeros([BLOCK], dtype=tl.int64)
            acc2 = tl.zeros([BLOCK], dtype=tl.int64)
            for base in range(start, n_words, step):
                offs = base + lane
                mask = offs < n_words
                w = tl.load(src + offs, mask=mask, other=0)
                if COPY:
                    tl.store(dst + offs, w, mask=mask)
                w64 = w.to(tl.int64) & 0xFFFFFFFF
                acc1 += w64
                acc2 += w64 * (offs + 1)
            if ATOMIC:
                tl.atomic_add(partials, tl.sum(acc1, axis=0))
                tl.atomic_add(partials + 1, tl.sum(acc2, axis=0))
            else:
                tl.store(partials + pid * 2, tl.sum(acc1, axis=0))
                tl.store(partials + pid * 2 + 1, tl.sum(acc2, axis=0))

        _KERNEL.append({"block": fsum64_kernel, "loop": fsum64_loop_kernel})
    return _KERNEL[0][name] if _KERNEL[0] is not None else None


def _programs(n_words: int, device: torch.device) -> int:
    """How many programs a digest of ``n_words`` words launches under the current settings."""
    cfg = CONFIG
    tiles = -(-n_words // (BLOCK_WORDS if cfg.variant == "block" else cfg.block))
    if cfg.variant == "block" or not tiles:
        return tiles
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in _SM_COUNT:
            _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
        cap = _SM_COUNT[index] * cfg.programs_per_sm
    else:  # the interpreter: a few programs, so striding is exercised
        cap = 3
    return min(tiles, cap)


def available(device: torch.device) -> bool:
    """Whether the kernels can run for tensors on ``device``."""
    if device.type == "cuda":
        return _kernel() is not None
    return device.type == "cpu" and _interpreting() and _kernel() is not None


# Up to this many programs, their partial sums come to the host in one small copy and are added
# there (numpy, wrapping mod 2**64): one device->host transfer instead of a reduction kernel plus
# a transfer, which matters for the per-fetch latency. Beyond it, the device adds them first.
_HOST_REDUCE_MAX_PROGRAMS = 4096


def _digest(partials: torch.Tensor, tail: bytes, n4_words: int) -> str:
    if not partials.numel():
        s1 = s2 = 0
    elif partials.numel() <= 2 * _HOST_REDUCE_MAX_PROGRAMS:
        # the copy waits for the kernel
        return _host_digest(_to_host(partials), tail, n4_words)
    else:  # int64 sums wrap on overflow (two's complement): the same residues
        sums = partials.view(-1, 2).sum(dim=0).tolist()
        s1, s2 = sums[0] & _MASK64, sums[1] & _MASK64
    return _finish(s1, s2, tail, n4_words)


def _host_digest(host_partials: torch.Tensor, tail: bytes, n4_words: int) -> str:
    """The digest from per-program partial sums already in host memory."""
    if host_partials.numel() == 2:  # one pair (the atomic kernel): no reduction left
        s1, s2 = host_partials.tolist()
        return _finish(s1 & _MASK64, s2 & _MASK64, tail, n4_words)
    # uint64 sums wrap, which is the mod 2**64 the digest wants
    sums = host_partials.numpy().view(np.uint64).reshape(-1, 2).sum(axis=0, dtype=np.uint64)
    return _finish(int(sums[0]), int(sums[1]), tail, n4_words)


def _finish(s1: int, s2: int, tail: bytes, n4_words: int) -> str:
    if tail:
        w = int.from_bytes(tail.ljust(4, b"\0"), "little")
        s1 = (s1 + w) & _MASK64
        s2 = (s2 + w * (n4_words + 1)) & _MASK64
    return f"{s1:016x}{s2:016x}"


def _to_host(partials: torch.Tensor) -> torch.Tensor:
    if partials.device.type != "cuda" or not CONFIG.pinned:
        return partials.cpu()
    host = torch.empty(partials.shape, dtype=partials.dtype, pin_memory=True)
    host.copy_(partials, non_blocking=True)
    torch.cuda.current_stream(partials.device).synchronize()
    return host


def _launch(src_u8: torch.Tensor, dst_u8: torch.Tensor | None) -> str | None:
    n = src_u8.numel()
    n4 = n - n % 4
    if n4 and (src_u8.data_ptr() % 4 or (dst_u8 is not None and dst_u8.data_ptr() % 4)):
        return None
    n_words = n4 // 4
    device = src_u8.device
    grid = _programs(n_words, device)
    tail = b""
    if n != n4:
        if dst_u8 is not None:
            dst_u8[n4:].copy_(src_u8[n4:])
        tail = bytes(src_u8[n4:].cpu().tolist())
    if grid and device.type == "cuda":
        digest = _GRAPHS.run(src_u8, dst_u8, n4, grid, tail)
        if digest is not None:
            return digest
    partials = torch.empty(_partials_len(grid), dtype=torch.int64, device=device)
    if grid:
        _run_kernel(src_u8, dst_u8, n4, grid, partials)
    return _digest(partials, tail, n_words)


def _partials_len(grid: int) -> int:
    """Length of the int64 buffer a launch of ``grid`` programs writes its sums to."""
    return 2 if CONFIG.variant == "atomic" and grid else 2 * grid


def _run_kernel(src_u8: torch.Tensor, dst_u8: torch.Tensor | None, n4: int, grid: int,
                partials: torch.Tensor) -> None:
    device = src_u8.device
    src_w = src_u8[:n4].view(torch.int32)
    dst_w = dst_u8[:n4].view(torch.int32) if dst_u8 is not None else src_w
    # Triton launches on the current device: switch only when the data lives elsewhere.
    switch = device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device()
    cfg = CONFIG
    with torch.cuda.device(device) if switch else _nullctx():
        if cfg.variant in ("loop", "atomic"):
            atomic = cfg.variant == "atomic"
            if atomic:
                partials.zero_()
            _kernel("loop")[(grid,)](src_w, dst_w, partials, n4 // 4, BLOCK=cfg.block,
                                     COPY=dst_u8 is not None, ATOMIC=atomic, num_warps=cfg.warps)
        else:
            _kernel("block")[(grid,)](src_w, dst_w, partials, n4 // 4, BLOCK=BLOCK_WORDS,
                                      COPY=dst_u8 is not None, num_warps=cfg.warps)


class _GraphCache:
    """CUDA graphs of the kernel for (device, source, destination, size) keys that repeat.

    A Triton launch costs tens of microseconds of Python on every call; a replayed graph a few.
    Fetches from a mapped slab repeat their addresses (the slab is mapped once; a warm ``out=``
    buffer or a recycled allocation repeats the destination), so a key seen twice is captured
    and replayed from then on, with its own partial-sums buffer. The first capture in a process
    is checked against a plain launch; any failure turns graphs off for the process and the
    plain launch answers. Bounded (LRU); a lock serialises replays of one key.
    """

    MAX_KEYS = 32

    def __init__(self) -> None:
        import threading
        from collections import OrderedDict

        self.enabled = True
        self.checked = False
        self.entries: OrderedDict = OrderedDict()  # key -> None (seen once) | (graph, partials, host, lock)
        self.lock = threading.Lock()
        self.captures = 0
        self.replays = 0

    def run(self, src_u8, dst_u8, n4: int, grid: int, tail: bytes) -> str | None:
        if not self.enabled:
            return None
        key = (src_u8.device.index, src_u8.data_ptr(), dst_u8.data_ptr() if dst_u8 is not None else 0, n4,
               CONFIG.key())
        with self.lock:
            entry = self.entries.get(key, False)
            if entry is False:  # first sighting: remember it, launch plainly
                self.entries[key] = None
                self._trim()
                return None
            self.entries.move_to_end(key)
        try:
            if entry is None:
                entry = self._capture(src_u8, dst_u8, n4, grid, tail)
                if entry is None:
                    return None
                with self.lock:
                    self.entries[key] = entry
                    self._trim()
            graph, partials, host, lock = entry
            index = src_u8.device.index
            if index is not None and index != torch.cuda.current_device():
                with lock, torch.cuda.device(index):
                    return self._replay(graph, partials, host, tail, n4)
            with lock:
                return self._replay(graph, partials, host, tail, n4)
        except Exception:  # noqa: BLE001 - graphs are an optimisation: fall back, for good
            self.enabled = False
            return None

    def _replay(self, graph, partials, host, tail: bytes, n4: int) -> str:
        graph.replay()  # on the current stream, after whatever the caller queued there
        self.replays += 1
        if host is not None:  # the graph copied the sums to pinned host memory
            torch.cuda.current_stream().synchronize()
            return _host_digest(host, tail, n4 // 4)
        return _digest(partials, tail, n4 // 4)

    def _capture(self, src_u8, dst_u8, n4: int, grid: int, tail: bytes):
        import threading

        device = src_u8.device
        partials = torch.empty(_partials_len(grid), dtype=torch.int64, device=device)
        # Small partial sums come back inside the graph (a copy node into pinned memory): a replay
        # then costs one launch and one stream wait. If that cannot be captured, the kernel alone is.
        host = None
        if device.type == "cuda" and CONFIG.pinned and grid <= _HOST_REDUCE_MAX_PROGRAMS:
            host = torch.empty(partials.numel(), dtype=torch.int64, pin_memory=True)
        with torch.cuda.device(device):
            torch.cuda.current_stream(device).synchronize()
            graph = None
            for with_copy in ((True, False) if host is not None else (False,)):
                graph = torch.cuda.CUDAGraph()
                try:
                    # thread_local: other threads (e.g. a NIXL/UCX progress thread) may keep calling CUDA
                    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                        _run_kernel(src_u8, dst_u8, n4, grid, partials)
                        if with_copy:
                            host.copy_(partials, non_blocking=True)
                    break
                except Exception:  # noqa: BLE001 - retried without the copy node, then given up
                    if not with_copy:
                        raise
                    host = None
            self.captures += 1
            if not self.checked:  # the first capture must agree with a plain launch
                graph.replay()
                if host is not None:
                    torch.cuda.current_stream(device).synchronize()
                    got = _host_digest(host, tail, n4 // 4)
                else:
                    got = _digest(partials, tail, n4 // 4)
                plain = torch.empty_like(partials)
                _run_kernel(src_u8, dst_u8, n4, grid, plain)
                if got != _digest(plain, tail, n4 // 4):
                    self.enabled = False
                    return None
                self.checked = True
        return graph, partials, host, threading.Lock()

    def _trim(self) -> None:
        while len(self.entries) > self.MAX_KEYS:
            self.entries.popitem(last=False)


_GRAPHS = _GraphCache()


def graph_stats() -> dict:
    """How often the kernel ran from a captured graph (for benchmarks and Describe)."""
    return {"enabled": _GRAPHS.enabled, "captures": _GRAPHS.captures, "replays": _GRAPHS.replays,
            "keys": len(_GRAPHS.entries), "kernel": CONFIG.as_dict()}


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fsum64(data_u8: torch.Tensor) -> str | None:
    """The fsum64 hex digest of a flat uint8 tensor, or ``None`` if the kernel cannot run."""
    if not available(data_u8.device):
        return None
    return _launch(data_u8, None)


def copy_and_fsum64(dst_u8: torch.Tensor, src_u8: torch.Tensor) -> str | None:
    """Copy ``src_u8`` into ``dst_u8`` (flat uint8, same length, same device) and return the
    fsum64 digest of the bytes copied, in one pass; ``None`` if the kernel cannot run (nothing
    is copied then)."""
    if dst_u8.numel() != src_u8.numel():
        raise ValueError("copy_and_fsum64: sizes differ")
    if dst_u8.device != src_u8.device or not available(src_u8.device):
        return None
    return _launch(src_u8, dst_u8)
