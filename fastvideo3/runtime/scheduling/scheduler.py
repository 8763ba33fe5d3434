"""The core scheduler: a :class:`~fastvideo3.runtime.scheduling.planner.Planner` and a
:class:`~fastvideo3.runtime.scheduling.dispatcher.Dispatcher` wired together under one lock.

:meth:`CoreScheduler.tick` is one round: the planner decides (step boundaries, admission, one
unit per running request, batches across requests, placement), the dispatcher runs the batches,
and the planner folds the results back. Every running request advances one step per round, so
a long request is never starved behind short ones; preemption and cancellation happen only
between rounds, i.e. at step boundaries.

Two modes. Synchronous (the embedded engine, tests): ``tick`` runs the round's batches and
applies their results before it returns; an ended request is freed on every replica at once.
Pipelined (the scheduler service): ``tick`` sends the batches and returns; each batch's results
are applied when it comes back (then ``wake`` is called), so a slow decode never holds the next
denoise round back, units planned for a busy replica join its next, larger batch, and a denoiser
replica gets its next batch before the current one returns (double buffering). Ended requests
are then freed through :meth:`release_ended` (their ids ride on each replica's next Execute).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import FastVideoError, Unavailable
from fastvideo3.loop import RequestContext
from fastvideo3.loop.protocol import StepResult
from fastvideo3.request.schema import ResolvedRequest
from fastvideo3.runtime.scheduling.dispatcher import Dispatcher
from fastvideo3.runtime.scheduling.executor import Executor
from fastvideo3.runtime.scheduling.planner import Planner
from fastvideo3.runtime.scheduling.run import PROGRAM_T2V, RETRYABLE_CODES, TERMINAL, Batch, Ended, Event, RequestRun
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.vocab import RunStatus

#: snapshots (RPCs to the replicas holding the requests) a batch's results may take at once
SNAPSHOT_WORKERS = 8

__all__ = ["CoreScheduler", "Event", "PROGRAM_T2V", "RETRYABLE_CODES", "RequestRun", "TERMINAL"]


def _planner_attr(name: str, *, settable: bool = False) -> property:
    """The planner's attribute ``name``, as an attribute of the scheduler that owns it."""
    def read(self):
        return getattr(self.planner, name)

    def write(self, value) -> None:
        setattr(self.planner, name, value)

    return property(read, write if settable else None, doc=f"The planner's ``{name}``.")


class CoreScheduler:
    def __init__(
        self,
        executors: dict[str, list[Executor]],
        *,
        max_batch: int = 16,
        max_running: int = 64,
        max_queued: int = 256,
        on_event: Callable[[Event], None] | None = None,
        checkpoint: Callable[[RequestRun], None] | None = None,
        admit_hook: Callable[[RequestRun], None] | None = None,
        recover: Callable[[RequestRun, WorkUnit, StepResult], bool] | None = None,
        checkpoint_step: Callable[[RequestRun], int | None] | None = None,
        parallel_dispatch: bool = False,
        dispatch_workers: int = 4,
        pipelined: bool = False,
        pipeline_depth: int = 2,
        split_min_units: int = 0,
        release_after_s: float = 1.0,
        wake: Callable[[], None] | None = None,
        pricer: Any = None,
        admission: Any = None,
        telemetry: Any = None,
        snapshots: Any = None,
        batch_cap: Callable[[WorkUnit, Any], int | None] | None = None,
    ):
        """``pricer`` (runtime.pricing.Pricer), ``admission`` (runtime.admission.AdmissionController),
        ``telemetry`` (telemetry.hooks.SchedulerTelemetry): see :class:`Planner`. ``admit_hook``
        registers a request before it is queued (raising refuses it); it runs outside the lock.

        ``pipelined``: see the module docstring. ``pipeline_depth``: batches a denoiser replica
        takes at once there; ``split_min_units``: a denoise round at least this large for an idle
        denoiser replica is cut in two so the halves alternate (0: off); ``release_after_s``: how
        long an ended request's id waits for an Execute to ride on before a Release call.
        ``batch_cap``: the planner's cohort cap (:mod:`fastvideo3.runtime.scheduling.cohorts`).
        ``snapshots`` (pipelined; the Checkpointer): checkpoint snapshots the applied results ask
        for are taken by the batch's dispatch thread outside the lock (``take_snapshots``,
        ``run_snapshot``, ``finish_snapshot``), while their requests wait at the step boundary."""
        self.admit_hook = admit_hook
        self.pipelined = pipelined
        self.split_min_units = int(split_min_units) if pipelined else 0
        self.wake = wake
        self.snapshots = snapshots if pipelined else None
        if self.snapshots is not None:
            self.snapshots.defer_snapshots = True
        self._lock = threading.RLock()
        self._snap_pool, self._snap_lock = None, threading.Lock()  # the snapshot threads, made on first use
        self.dispatcher = Dispatcher(executors, telemetry=None, workers=dispatch_workers,
                                     threads=parallel_dispatch or pipelined,
                                     pipeline_depth=pipeline_depth if pipelined else 1,
                                     release_after_s=release_after_s, background_releases=pipelined)
        self.planner = Planner(executors, max_batch=max_batch, max_running=max_running, max_queued=max_queued,
                               on_event=on_event, checkpoint=checkpoint, recover=recover,
                               checkpoint_step=checkpoint_step, pricer=pricer, admission=admission,
                               telemetry=telemetry, load=self.dispatcher.load, batch_cap=batch_cap)
        self.dispatcher.telemetry = self.planner.telemetry
        self._ended: dict[str, Ended] = {}  # pipelined: ended requests waiting for release_ended

    # -- the replica table -------------------------------------------------------------
    @property
    def executors(self) -> dict[str, list[Executor]]:
        return self.planner.executors

    @executors.setter
    def executors(self, executors: dict[str, list[Executor]]) -> None:
        """Replace the replica table (e.g. with wrapped executors): the planner and the
        dispatcher both take it."""
        with self._lock:
            self.planner.executors = executors
            self.dispatcher.set_executors(executors)

    # -- what the planner holds (read, and where settable set, through the scheduler) ------
    runs = _planner_attr("runs")
    counters = _planner_attr("counters")
    batch_sizes = _planner_attr("batch_sizes")
    max_batch = _planner_attr("max_batch")
    max_running = _planner_attr("max_running")
    max_queued = _planner_attr("max_queued")
    telemetry = _planner_attr("telemetry")
    admission = _planner_attr("admission")
    pricer = _planner_attr("pricer", settable=True)
    on_event = _planner_attr("on_event", settable=True)

    @property
    def inflight(self) -> dict[int, int]:
        """id(executor) -> units in flight there."""
        return self.dispatcher.inflight

    @property
    def lock(self) -> threading.RLock:
        """Held while requests change state; no event is emitted while a caller holds it."""
        return self._lock

    # -- requests ----------------------------------------------------------------------
    def submit(self, request: ResolvedRequest, card: ModelCard, *, program: tuple[str, ...] | None = None,
               ctx: RequestContext | Mapping[str, Any] | None = None, trace_parent: Any = None) -> RequestRun:
        """Queue a request. ``program`` is the loop sequence (default text-to-video); ``ctx`` seeds
        the context every loop's ``init`` sees (e.g. ``encode`` for the decode loop; a mapping of
        its keys is read as :meth:`RequestContext.from_dict` reads one)."""
        rid = request.request_id
        with self._lock:
            queued = self.planner.reserve(request)
            run = RequestRun(request=request, card=card, program=tuple(program or PROGRAM_T2V),
                             ctx=RequestContext.of(ctx))
        try:
            self.dispatcher.forget_pending(rid)  # an earlier request of this id: freed before this one runs
            if self.admit_hook is not None:
                # the state store, outside the lock: a slow store holds up no step of any request
                self.admit_hook(run)
        except BaseException as e:
            with self._lock:
                self.planner.unreserve(rid, refused=isinstance(e, FastVideoError))
            raise
        with self._lock:
            return self.planner.add(run, queued, trace_parent)

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            return self.planner.cancel(request_id)

    def get(self, request_id: str) -> RequestRun | None:
        return self.planner.get(request_id)

    def active(self) -> list[RequestRun]:
        return self.planner.active()

    def forget(self, request_id: str) -> None:
        with self._lock:
            self.planner.forget(request_id)

    def adopt(self, run: RequestRun) -> None:
        """Take over a run rebuilt from a checkpoint (a restarted scheduler resuming it). It is
        queued ahead of everything else and admitted again; its loop continues where it was."""
        with self._lock:
            self.planner.adopt(run)
        self.dispatcher.forget_pending(run.request_id)

    def retain(self, run: RequestRun) -> RequestRun:
        """Keep an ended run read back from the state store; returns the run kept under its id
        (another one, when a submit took the id meanwhile)."""
        with self._lock:
            current = self.planner.get(run.request_id)
            if current is not None:
                return current
            self.planner.runs[run.request_id] = run
            return run

    # -- the round ---------------------------------------------------------------------
    def tick(self) -> bool:
        """One scheduling round. Returns True when any work ran or any request changed state."""
        with self._lock:
            if self.pipelined:
                batches = self.planner.schedule(self.dispatcher.capacity, split_min_units=self.split_min_units)
                for b in batches:
                    self.dispatcher.send(b, self._done)
                self._collect_ended()
                return bool(batches) or self.planner.changed
            batches = self.planner.schedule()
            changed = self.planner.changed
            self._collect_ended()
        if not batches:
            return changed
        t0 = time.perf_counter()
        outs = self.dispatcher.run(batches)
        elapsed = time.perf_counter() - t0
        with self._lock:
            for batch, (results, dispatched) in zip(batches, outs):
                self.planner.update_from_output(batch, results, elapsed, dispatched=dispatched)
            self._collect_ended()
        return True

    def _done(self, batch: Batch, results: list[StepResult], elapsed: float, dispatched: bool) -> None:
        """A pipelined batch came back (on its dispatch thread). Snapshots its results asked for
        are taken here, outside the lock; the replica's slot is freed once they are."""
        jobs: list = []
        try:
            with self._lock:
                try:
                    self.planner.update_from_output(batch, results, elapsed, dispatched=dispatched)
                finally:
                    jobs = self.snapshots.take_snapshots() if self.snapshots is not None else []
                    if not jobs:
                        self.dispatcher.settle(batch)
                self._collect_ended()
            if jobs:
                self._snapshot(jobs, batch)
        finally:
            if self.wake is not None:
                self.wake()

    def _snapshot(self, jobs: list, batch: Batch) -> None:
        """The snapshots a batch's results asked for, taken side by side (each an RPC to the
        replica that holds the request; a burst's requests reach a checkpoint step together, and
        one after another they held the replica's next batch for tens of milliseconds)."""
        taken: dict[int, Any] = {}
        try:
            if len(jobs) == 1:
                taken[0] = self.snapshots.run_snapshot(jobs[0])
            else:
                pool = self._snapshot_pool()
                futures = {n: pool.submit(self.snapshots.run_snapshot, job) for n, job in enumerate(jobs)}
                for n, fut in futures.items():
                    taken[n] = fut.result()
        finally:
            with self._lock:
                for n, job in enumerate(jobs):
                    self.snapshots.finish_snapshot(job, taken.get(n))
                self.dispatcher.settle(batch)
                self._collect_ended()

    def _snapshot_pool(self):
        with self._snap_lock:
            if self._snap_pool is None:
                from concurrent.futures import ThreadPoolExecutor
                self._snap_pool = ThreadPoolExecutor(max_workers=SNAPSHOT_WORKERS, thread_name_prefix="snapshot")
            return self._snap_pool

    def _collect_ended(self) -> None:
        """Ended requests (lock held): the synchronous mode frees a failed or cancelled one on every
        replica now (a succeeded one keeps its outputs until its caller released them); the
        pipelined mode keeps them for :meth:`release_ended`."""
        for ended in self.planner.take_ended():
            if self.pipelined:
                self._ended[ended.request_id] = ended
            elif ended.status != RunStatus.SUCCEEDED:
                self.dispatcher.release_everywhere(ended.request_id)

    def release_ended(self, request_id: str, then: Callable[[], None] | None = None) -> None:
        """Free an ended request on the replicas that ran it (pipelined mode; see
        :meth:`Dispatcher.release_ended`), then call ``then``."""
        with self._lock:
            ended = self._ended.pop(request_id, None)
            expecting = self.planner.expecting()
        if ended is None:  # not ended here (e.g. read back from the store): every replica
            run = self.planner.get(request_id)
            where = tuple((k, i) for k, reps in self.executors.items() for i in range(len(reps)))
            ended = Ended(request_id, run.status if run is not None else RunStatus.CANCELLED, where)
        self.dispatcher.release_ended(ended, then, expecting)

    def flush_releases(self) -> int:
        """Release calls for ended requests whose ids found no Execute to ride on in time."""
        return self.dispatcher.flush_releases()

    def flush_releases_now(self) -> int:
        """Release calls for every ended request id still waiting for an Execute."""
        return self.dispatcher.flush_releases(0.0)

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait for the Release calls under way; True when none is left."""
        return self.dispatcher.drain_releases(timeout_s)

    def in_flight(self) -> bool:
        """Whether a batch of this scheduler is still running on some replica."""
        return not self.dispatcher.idle()

    def pool_key(self, unit: WorkUnit) -> str:
        return self.planner.pool_key(unit)

    def park(self, run: RequestRun, role: str, wait_s: float, error: FastVideoError) -> None:
        self.planner.park(run, role, wait_s, error)

    def lost(self, run: RequestRun, unit: WorkUnit, err) -> Unavailable:
        return self.planner.lost(run, unit, err)

    def emit(self, run: RequestRun, kind: str, data: dict) -> None:
        self.planner.emit(run, kind, data)

    def terminate(self, run: RequestRun, status: str, exc: FastVideoError) -> None:
        with self._lock:
            self.planner.terminate(run, status, exc)
            self._collect_ended()

    _terminate = terminate
    _lost = lost
    _emit = emit

    def release(self, request_id: str) -> None:
        """Free the request's resident data on every replica of every role, now."""
        self.dispatcher.release_everywhere(request_id)

    def close(self) -> None:
        self.dispatcher.close()
        if self._snap_pool is not None:
            self._snap_pool.shutdown(wait=False)
