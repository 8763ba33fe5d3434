"""The scheduler's state-store writes, off the step path.

A :class:`~fastvideo3.runtime.durability.checkpointer.Checkpointer` with a writer hands it the writes that
would otherwise run on the scheduler's tick thread (or under its lock): checkpoints and the
ends of requests. One background thread performs them in the order they were made, so one
request's checkpoints precede its end; a checkpoint superseded by a newer one of the same
request before it was written is skipped (only the newest matters for a resume). While the
store is slow or frozen, steps go on at their own pace; only durability lags (and a request's
``finished`` to its client, which follows its end write or that write's deferral). Ends deferred
by an outage are retried whenever the writer is idle.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable

log = logging.getLogger("fastvideo3.checkpointer")


class StoreWriter:
    def __init__(self, checkpointer):
        self.cp = checkpointer
        self._jobs: deque = deque()
        self._queued: dict = {}  # request -> its newest RunRecord not yet written
        self._cv = threading.Condition()
        self._busy = False
        self._thread = threading.Thread(target=self._loop, name="state-writer", daemon=True)

    def start(self) -> "StoreWriter":
        self._thread.start()
        return self

    def checkpoint(self, record) -> None:
        """Queue ``record``; it replaces one of the same request still queued, in its place."""
        with self._cv:
            fresh = record.request_id not in self._queued
            self._queued[record.request_id] = record
            if fresh:
                self._jobs.append(("checkpoint", record.request_id, None))
            self._cv.notify_all()

    def finish(self, run, then: Callable[[], None] | None) -> None:
        """Queue the request's end (artifact index, video, status), then ``then()``."""
        with self._cv:
            self._queued.pop(run.request_id, None)  # ended: a checkpoint not yet written is moot
            self._jobs.append(("finish", run, then))
            self._cv.notify_all()

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued write was tried; False on timeout."""
        end = time.monotonic() + timeout_s
        with self._cv:
            while self._jobs or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._busy = False
                self._cv.notify_all()  # drain() waits for an idle writer
                while not self._jobs:
                    if not self._cv.wait(timeout=max(0.1, self.cp.retry_s)) and self.cp.pending_ends:
                        break  # ends deferred by an outage: try them again
                job = self._jobs.popleft() if self._jobs else None
                record = self._queued.pop(job[1], None) if job is not None and job[0] == "checkpoint" else None
                self._busy = True
            try:
                if job is None:
                    self.cp._flush_now()
                elif job[0] == "checkpoint":
                    if record is not None:
                        self.cp._write(record)
                else:
                    try:
                        self.cp._finish(job[1])
                    finally:
                        if job[2] is not None:
                            job[2]()
            except Exception:  # noqa: BLE001 - the writer must outlive one bad write
                log.exception("state-store write failed")
