"""The dispatcher: runs the planner's batches on executors and frees what ended requests hold.

It owns everything of the scheduler that waits: the dispatch threads, each replica's busy
state (batches in flight) and in-flight unit counts, and the request ids each replica still has
to free. Two ways to run batches:

* synchronous (:meth:`Dispatcher.run`, the embedded engine): the round's batches run — on
  threads when ``parallel`` and there are several — and their results come back to the caller;
* pipelined (:meth:`Dispatcher.send`, the fleet): a batch runs on a dispatch thread and its
  results go to ``on_done`` when it returns; the caller never waits. A replica takes at most
  :meth:`depth` batches of this scheduler at a time: one for most pools; ``pipeline_depth``
  (2) for denoiser pools, so the next batch is already at the replica, its inputs being
  pulled, while the current one runs (double buffering; the planner keeps one unit per request
  in flight, so results of one request still apply in order), and for decoder pools, whose
  next batch decodes while the previous one's files are still encoding.

Freeing ended requests: the ids a replica must free ride on the next Execute sent to it (an
executor that :class:`~fastvideo3.runtime.scheduling.executor.CarriesReleases` puts them in the RPC; any
other is released just before the batch). A replica with nothing in flight and no running
request headed its way, a cancelled request, and ids that waited ``release_after_s`` without an
Execute to ride on get a Release call instead, off the caller's thread.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping

from fastvideo3.errors import ErrorInfo, FastVideoError, Internal, Unavailable
from fastvideo3.loop.protocol import StepResult
from fastvideo3.runtime.scheduling.executor import Addressed, CarriesReleases, Executor, is_healthy
from fastvideo3.runtime.scheduling.run import Batch, Ended
from fastvideo3.vocab import Role, RunStatus

log = logging.getLogger("fastvideo3.dispatcher")

#: on_done(batch, results, elapsed seconds, dispatched): a pipelined batch came back
Done = Callable[[Batch, list[StepResult], float, bool], None]


class Dispatcher:
    def __init__(self, executors: Mapping[str, list[Executor]], *, telemetry: Any, workers: int = 4,
                 threads: bool = False, pipeline_depth: int = 1, release_after_s: float = 1.0,
                 background_releases: bool = False):
        """``threads``: a dispatch thread pool (``workers`` threads). ``pipeline_depth``: batches a
        denoiser replica takes at once in pipelined mode. ``background_releases``: Release calls
        run on their own threads (the fleet) instead of the caller's."""
        self.telemetry = telemetry
        self.pipeline_depth = max(1, int(pipeline_depth))
        self.release_after_s = float(release_after_s)
        self.inflight: dict[int, int] = {}  # id(executor) -> units in flight (placement load)
        self.busy: dict[int, int] = {}  # id(executor) -> batches of this scheduler in flight
        self.counters: dict[str, float] = {"releases_carried": 0, "release_calls": 0, "releases_flushed": 0,
                                           "double_buffered": 0}
        self._pending: dict[int, dict[str, float]] = {}  # id(executor) -> {request id: queued at}
        self._mu = threading.Lock()
        self.set_executors(executors)
        self._threads = (ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dispatch") if threads else None)
        self._releaser = (ThreadPoolExecutor(max_workers=2, thread_name_prefix="release")
                          if background_releases else None)
        self._releasing: set[Future] = set()

    def set_executors(self, executors: Mapping[str, list[Executor]]) -> None:
        """Take a new replica table (e.g. wrapped executors); ids owed to a replica that left it
        are dropped with it."""
        with self._mu:
            self.executors = executors
            self._pool_of = {id(ex): key for key, reps in executors.items() for ex in reps}
            self._by_id = {id(ex): ex for reps in executors.values() for ex in reps}
            self._pending = {k: v for k, v in self._pending.items() if k in self._by_id}

    # -- capacity ----------------------------------------------------------------------
    def depth(self, executor: Any) -> int:
        """Batches this replica takes at once (pipelined mode)."""
        role = self._pool_of.get(id(executor), "").partition(":")[0]
        # a decoder's next batch runs its VAE call while the previous batch's files encode
        return self.pipeline_depth if role in (Role.DENOISER, Role.DECODER) else 1

    def capacity(self, executor: Any) -> tuple[int, int]:
        """(batches the replica takes now, batches of this scheduler in flight there)."""
        busy = self.busy.get(id(executor), 0)
        return self.depth(executor) - busy, busy

    def load(self, executor: Any) -> int:
        return self.inflight.get(id(executor), 0)

    def idle(self) -> bool:
        return not any(self.busy.values())

    # -- running batches ---------------------------------------------------------------
    def run(self, batches: list[Batch]) -> list[tuple[list[StepResult], bool]]:
        """Run the batches and return ``(results, dispatched)`` for each, in order."""
        if self._threads is not None and len(batches) > 1:
            futures = [self._threads.submit(self.execute, b) for b in batches]
            return [f.result() for f in futures]
        return [self.execute(b) for b in batches]

    def send(self, batch: Batch, on_done: Done) -> None:
        """Start ``batch`` on a dispatch thread (call with the scheduler's lock held: the replica's
        slot is taken here); ``on_done`` gets its results, then :meth:`settle` frees the slot."""
        if batch.executor is not None:
            k = id(batch.executor)
            if self.busy.get(k, 0):
                self.counters["double_buffered"] += 1  # sent beside a batch still running there
            self.busy[k] = self.busy.get(k, 0) + 1
        self._threads.submit(self._run_pipelined, batch, on_done)

    def settle(self, batch: Batch) -> None:
        """The batch's results were applied: its replica slot is free again."""
        if batch.executor is not None:
            k = id(batch.executor)
            self.busy[k] = max(0, self.busy.get(k, 0) - 1)

    def _run_pipelined(self, batch: Batch, on_done: Done) -> None:
        t0 = time.perf_counter()
        try:
            results, dispatched = self.execute(batch)
        except BaseException as e:  # noqa: BLE001 - execute answers errors itself; this is a bug guard
            err = ErrorInfo.of(Internal(f"{type(e).__name__}: {e}"))
            results, dispatched = [StepResult(u.unit_id, u.request_id, ok=False, error=err) for u in batch.work], False
        on_done(batch, results, time.perf_counter() - t0, dispatched)

    def execute(self, batch: Batch) -> tuple[list[StepResult], bool]:
        """Run one batch on its executor (with the ids it has to free riding along). Returns its
        results and whether the executor answered; a lost pool fails the batch, never raises."""
        units, ex = batch.work, batch.executor
        err = None
        if ex is None:
            err = ErrorInfo.of(Unavailable(f"no pool serves role {units[0].role!r}", field="role"))
        elif not is_healthy(ex):  # routed around: fail fast, never hang on it
            where = ex.target if isinstance(ex, Addressed) else ""
            err = ErrorInfo.of(Unavailable(f"{units[0].role} replica {where} is not "
                                           "serving", field="role", details={"dispatch_failed": True}))
        if err is not None:
            results = [StepResult(u.unit_id, u.request_id, ok=False, error=err) for u in units]
            with self.telemetry.dispatch(units) as d:  # closes the units' spans
                d.done(results)
            return results, False
        key = id(ex)
        with self._mu:
            self.inflight[key] = self.inflight.get(key, 0) + len(units)
            carried = self._pending.pop(key, {})
        try:
            with self.telemetry.dispatch(units) as d:
                results = self._call(ex, units, sorted(carried))
                d.done(results)
            if len(results) != len(units):
                raise Internal(f"executor returned {len(results)} results for {len(units)} units")
            if carried:
                self.counters["releases_carried"] += len(carried)
            return results, True
        except Exception as e:  # noqa: BLE001 - a lost pool fails its batch, not the scheduler
            if carried:  # not known to have arrived: they wait for the next call (idempotent)
                with self._mu:
                    self._pending.setdefault(key, {}).update(carried)
            err = ErrorInfo.of(e)
            if err.code == "UNAVAILABLE":  # the pool itself failed (not one unit): recoverable
                err = dataclasses.replace(err, details={**err.details, "dispatch_failed": True})
            return [StepResult(u.unit_id, u.request_id, ok=False, error=err) for u in units], False
        finally:
            with self._mu:
                self.inflight[key] -= len(units)

    @staticmethod
    def _call(ex: Executor, units, carried: list[str]) -> list[StepResult]:
        if carried and isinstance(ex, CarriesReleases):
            return ex.execute_after_release(carried, units)
        for rid in carried:
            try:
                ex.release(rid)
            except FastVideoError:
                pass
        return ex.execute(units)

    # -- freeing ended requests ----------------------------------------------------------
    def release_everywhere(self, request_id: str) -> None:
        """Free the request on every replica of every pool, now (Release calls on this thread)."""
        with self._mu:
            for ids in self._pending.values():
                ids.pop(request_id, None)
        for replicas in self.executors.values():
            for ex in replicas:
                self._release(ex, request_id)

    def release_ended(self, ended: Ended, then: Callable[[], None] | None = None,
                      expecting: set[tuple[str, int]] = frozenset()) -> None:
        """Free an ended request on the replicas that ran its units: one with a batch in flight,
        or ``expecting`` work (a running request's next unit goes there), gets the id on its next
        Execute; any other — and every one, for a cancelled request — a Release call. ``then``
        runs once those calls returned (on a release thread when there are some)."""
        now_calls: list[Executor] = []
        with self._mu:
            for pool, idx in ended.replicas:
                replicas = self.executors.get(pool) or []
                if idx >= len(replicas):
                    continue
                ex = replicas[idx]
                busy = self.busy.get(id(ex), 0) > 0 or (pool, idx) in expecting
                if ended.status != RunStatus.CANCELLED and busy:
                    self._pending.setdefault(id(ex), {})[ended.request_id] = time.monotonic()
                else:
                    now_calls.append(ex)
        self._calls([(ex, ended.request_id) for ex in now_calls], then)

    def flush_releases(self, max_age_s: float | None = None) -> int:
        """Release calls for ids that waited ``max_age_s`` (default ``release_after_s``) with no
        Execute to ride on; returns how many were sent."""
        age = self.release_after_s if max_age_s is None else max_age_s
        now, due = time.monotonic(), []
        with self._mu:
            for key, ids in self._pending.items():
                for rid in [r for r, t in ids.items() if now - t >= age]:
                    del ids[rid]
                    due.append((self._by_id[key], rid))
        if due:
            self.counters["releases_flushed"] += len(due)
            self._calls(due, None)
        return len(due)

    def forget_pending(self, request_id: str) -> None:
        """A new request takes this id: what its predecessor left is freed now, before it runs."""
        with self._mu:
            owed = [self._by_id[k] for k, ids in self._pending.items() if ids.pop(request_id, None) is not None]
        for ex in owed:
            self._release(ex, request_id)

    def pending_releases(self) -> int:
        with self._mu:
            return sum(len(ids) for ids in self._pending.values())

    def _calls(self, calls: list[tuple[Executor, str]], then: Callable[[], None] | None) -> None:
        def work() -> None:
            try:
                for ex, rid in calls:
                    self._release(ex, rid)
            finally:
                if then is not None:
                    then()

        if self._releaser is None or not calls:
            work()
            return
        fut = self._releaser.submit(work)
        with self._mu:
            self._releasing.add(fut)
        fut.add_done_callback(self._release_done)

    def _release_done(self, fut: Future) -> None:
        with self._mu:
            self._releasing.discard(fut)
        if fut.exception() is not None:
            log.error("releasing an ended request failed: %s", fut.exception())

    def _release(self, ex: Executor, request_id: str) -> None:
        self.counters["release_calls"] += 1
        try:
            ex.release(request_id)
        except Exception:  # noqa: BLE001 - a dead pool has nothing left to free
            pass

    def drain_releases(self, timeout_s: float = 30.0) -> bool:
        """Wait for the Release calls under way (and what runs after them); True if none is left."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._mu:
                left = list(self._releasing)
            if not left:
                return True
            left[0].exception(timeout=max(0.0, end - time.monotonic()))
        return False

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._releaser is not None:
            self._releaser.shutdown(wait=False)


__all__ = ["Dispatcher", "Done"]
