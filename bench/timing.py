"""Timing helpers the benchmarks in bench/ share: CUDA-event and wall-clock milliseconds of one
call, the medians of repeated calls, synchronised wall-clock seconds of repeated calls, and a
CUDA profile of one call. Imported as the sibling module ``timing`` (bench/ is on sys.path when a
bench script runs)."""
from __future__ import annotations

import time

import torch


def cuda_ms(fn) -> float:
    """Milliseconds of one call of ``fn`` between two CUDA events (the end event waited on)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def wall_ms(fn) -> float:
    """Milliseconds of one call of ``fn`` by the wall clock (no synchronisation)."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def cuda_times(fn, warmup: int, iters: int) -> list[float]:
    """``warmup`` untimed calls, a device synchronisation, then the CUDA-event ms of ``iters`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return [cuda_ms(fn) for _ in range(iters)]


def synced_seconds(fn, repeats: int, sync) -> tuple[float, list[float], object]:
    """Seconds of a first call of ``fn`` and of ``repeats`` later calls, each between two
    ``sync()`` calls, and the last output. One output is alive at a time (large ones add up)."""
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        del out
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return first, times, out


def upper_median(times: list[float]) -> float:
    """The middle value of ``times`` (the upper one of an even count)."""
    return sorted(times)[len(times) // 2]


def cuda_profile(fn):
    """A torch profiler (CUDA activity) of one call of ``fn``, after one untimed call."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof
