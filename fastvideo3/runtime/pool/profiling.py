"""A torch profiler over a window of a pool's batches, for finding where a batch's time goes.

Set ``FASTVIDEO3_PROFILE_BATCHES=DIR,START,COUNT`` in a pool's environment: its executor profiles
batches ``START`` to ``START+COUNT-1`` (counted from 0, per process) and then writes to ``DIR``:

* ``<role>-<pid>.txt``: the operators by device time and by host time (``key_averages`` tables);
* ``<role>-<pid>.json``: the window's wall time, busy time, summed kernel time and the device idle
  share, so the host overhead of a batch is a number rather than a guess.

Nothing is profiled without the variable; with it, only the window pays the profiler's overhead.
A bad value is refused when the pool starts, naming the variable.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass

from fastvideo3.errors import InvalidRequest

log = logging.getLogger(__name__)

ENV = "FASTVIDEO3_PROFILE_BATCHES"
MAX_COUNT = 1000


@dataclass(frozen=True)
class Window:
    directory: str
    start: int
    count: int


def window_from_env(environ=os.environ) -> Window | None:
    raw = environ.get(ENV, "").strip()
    if not raw:
        return None
    parts = raw.split(",")
    if len(parts) != 3 or not parts[0]:
        raise InvalidRequest(f"{ENV}={raw!r}: expected DIR,START,COUNT", field=ENV, limit="DIR,START,COUNT")
    try:
        start, count = int(parts[1]), int(parts[2])
    except ValueError:
        raise InvalidRequest(f"{ENV}={raw!r}: START and COUNT must be integers", field=ENV) from None
    if start < 0 or not 1 <= count <= MAX_COUNT:
        raise InvalidRequest(f"{ENV}={raw!r}: START >= 0 and 1 <= COUNT <= {MAX_COUNT}", field=ENV,
                             limit=f"COUNT <= {MAX_COUNT}")
    return Window(parts[0], start, count)


class BatchProfiler:
    """``with profiler.batch(): ...`` around each batch; profiles the window's batches only."""

    def __init__(self, window: Window, role: str) -> None:
        self.window, self.role = window, role
        self.seen = 0
        self._prof = None
        self._t0 = 0.0
        self.busy_s = 0.0
        self.done = False

    def batch(self) -> "_Batch":
        return _Batch(self)

    def _enter(self) -> None:
        if self.done or self.seen != self.window.start or self._prof is not None:
            return
        from torch.profiler import ProfilerActivity, profile
        import torch
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._prof = profile(activities=acts)
        self._prof.__enter__()
        self._t0 = time.perf_counter()
        log.info("profiling batches %d..%d", self.window.start, self.window.start + self.window.count - 1)

    def _exit(self, busy_s: float) -> None:
        self.seen += 1
        if self._prof is None:
            return
        self.busy_s += busy_s
        if self.seen < self.window.start + self.window.count:
            return
        wall = time.perf_counter() - self._t0
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.done = True
        try:
            self._write(prof, wall)
        except Exception:  # noqa: BLE001 - a profile that cannot be written must not fail a batch
            log.exception("writing the batch profile failed")

    def _write(self, prof, wall: float) -> None:
        os.makedirs(self.window.directory, exist_ok=True)
        stem = os.path.join(self.window.directory, f"{self.role}-{os.getpid()}")
        import torch
        from torch.autograd import DeviceType
        averages = prof.key_averages()
        # the kernels' own rows (the operators above them would count their time twice)
        kernel_us = sum(getattr(e, "device_time_total", 0.0) for e in averages
                        if getattr(e, "device_type", None) == DeviceType.CUDA)
        with open(stem + ".txt", "w") as f:
            for key in ("self_device_time_total", "cpu_time_total"):
                f.write(f"# sorted by {key}\n")
                try:
                    f.write(averages.table(sort_by=key, row_limit=45))
                except Exception as e:  # noqa: BLE001 - e.g. no device events on a CPU pool
                    f.write(f"(not available: {e})")
                f.write("\n\n")
        summary = {"role": self.role, "batches": self.window.count, "first_batch": self.window.start,
                   "wall_s": round(wall, 6), "busy_s": round(self.busy_s, 6),
                   "kernel_s": round(kernel_us / 1e6, 6) if torch.cuda.is_available() else None,
                   # the share of the batches' busy time no kernel ran: host overhead on the step path
                   "device_idle_fraction_of_busy": (round(1 - kernel_us / 1e6 / self.busy_s, 4)
                                                    if self.busy_s and torch.cuda.is_available() else None)}
        with open(stem + ".json", "w") as f:
            json.dump(summary, f, indent=1)
        log.info("batch profile written to %s.{txt,json}: %s", stem, summary)


class _Batch:
    def __init__(self, owner: BatchProfiler) -> None:
        self.owner = owner
        self.t0 = 0.0

    def __enter__(self) -> None:
        self.owner._enter()
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.owner._exit(time.perf_counter() - self.t0)
