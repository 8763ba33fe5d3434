"""The core scheduler: request scheduling, loop driving, cross-request batching, placement.

It is a state machine testable with fake executors: :meth:`CoreScheduler.tick` plans one step
for every running request (through each request's :class:`LoopDriver`), groups the WorkUnits by
batch key across requests, places each batch on the least-loaded replica of its role, runs the
batches (concurrently across roles and replicas) and folds the results back. A request's units
of one role stay on the replica that ran its first unit of that role (the pool keeps the
request's resident state there); new requests go to the least-loaded replica. Every running request advances
one step per tick, so a long request is never starved behind short ones; preemption and
cancellation happen only between ticks, i.e. at step boundaries.

The embedded engine drives it with in-process executors; the scheduler service drives the same
class with remote executors that forward batches to role pools over gRPC.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import (
    Cancelled, DeadlineExceeded, ErrorInfo, FastVideoError, Internal, InvalidRequest, ResourceExhausted, Unavailable,
)
from fastvideo3.loop import LOOPS, LoopDriver, RequestContext
from fastvideo3.loop.protocol import StepResult
from fastvideo3.request.schema import ResolvedRequest
from fastvideo3.runtime.executor import Executor
from fastvideo3.runtime.workunit import WorkUnit
from fastvideo3.vocab import EventKind, LoopId, PROGRAM_LOOPS, Program, Role, RunStatus, TERMINAL_STATUSES, UnitKind

PROGRAM_T2V = PROGRAM_LOOPS[Program.T2V]
TERMINAL = TERMINAL_STATUSES
#: error codes after which the same request sent again (same id, same parameters) can succeed:
#: something outside the request failed (a replica, the store, a transfer, the load)
RETRYABLE_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "DATA_LOSS", "CANCELLED")


@dataclass
class Event:
    request_id: str
    seq: int
    kind: str  # accepted | queued | progress | artifact | error | finished
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestRun:
    request: ResolvedRequest
    card: ModelCard
    program: tuple[str, ...] = PROGRAM_T2V
    status: str = RunStatus.QUEUED
    loop_index: int = 0
    driver: LoopDriver | None = None
    ctx: RequestContext = field(default_factory=RequestContext)
    error: ErrorInfo | None = None
    created: float = field(default_factory=time.time)
    started: float | None = None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    cancel_requested: bool = False
    admission_waiting: bool = False  # queued inside the AdmissionController
    events: list[Event] = field(default_factory=list)
    #: role -> index of the replica holding this request's resident state for that role
    placement: dict[str, int] = field(default_factory=dict)
    #: inline artifacts returned by pools (e.g. the encoded video), by loop id
    artifacts: dict[str, bytes] = field(default_factory=dict)
    #: rebuilt from a checkpoint by a restarted scheduler (no client stream until one re-attaches)
    resumed: bool = False
    #: pipelined dispatch: a unit of this request is executing on a pool (it is not planned again,
    #: and cancel / deadline act when it returns: at the step boundary)
    in_flight: bool = False
    #: pipelined dispatch: a planned unit held back because its replica was busy (sent next round)
    pending: Any = None
    #: parked: its current loop waits for a healthy replica of this role (its last one was lost);
    #: until ``parked_until`` (monotonic), then it fails with ``parked_error``
    parked_role: str | None = None
    parked_until: float = 0.0
    parked_error: Any = None
    #: (loop id, fn(run, fresh driver) -> driver): when that loop next starts, ``fn`` picks up where
    #: it was (e.g. denoising continues from a snapshot after its lost inputs were encoded again)
    continue_loop: Any = None
    _seq: Any = field(default_factory=lambda: itertools.count())
    done_event: threading.Event = field(default_factory=threading.Event)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def deadline(self) -> float:
        return self.created + self.request.deadline_s

    @property
    def loop_id(self) -> str | None:
        return self.program[self.loop_index] if self.loop_index < len(self.program) else None

    def progress(self) -> tuple[int, int]:
        d = self.driver
        if d is not None and self.loop_id == LoopId.DIFFUSION_DENOISE:
            return d.state.step, d.state.num_steps  # type: ignore[attr-defined]
        return (self.request.num_inference_steps if self.loop_index > 1 else 0), self.request.num_inference_steps


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
        wake: Callable[[], None] | None = None,
        pricer: Any = None,
        admission: Any = None,
        telemetry: Any = None,
    ):
        """``pricer`` (runtime.pricing.Pricer) prices every unit in predicted GPU-seconds and
        calibrates on measured batches; ``admission`` (runtime.admission.AdmissionController)
        reserves a request's compute and memory before it starts stepping; ``telemetry``
        (telemetry.hooks.SchedulerTelemetry) records spans and metrics. All optional.

        ``pipelined`` (sends through the dispatch pool): a tick does not wait for the batches it sends.
        Each replica runs at most one batch of this scheduler at a time; a batch's results are
        applied when it returns (then ``wake`` is called), so a slow decode on the decoder pool
        never holds the next denoise round back, and units planned for a busy replica wait and
        join its next, larger batch."""
        self.executors = executors
        self.max_batch = max_batch
        self.max_running = max_running
        self.max_queued = max_queued
        self.on_event = on_event
        self.checkpoint = checkpoint
        # durability hooks (fastvideo3.runtime.checkpointer): ``admit_hook`` registers a request
        # before it is queued (raising refuses it); ``recover`` may move a request whose pool was
        # lost to another replica instead of failing it (True = it continues)
        self.admit_hook = admit_hook
        self.recover = recover
        # the denoise step a request's latest checkpoint was taken at (None: no checkpoint); it is
        # what a retry continues from, reported on every terminal error (``resume_from_step``)
        self.checkpoint_step = checkpoint_step
        self.pricer = pricer
        self.admission = admission
        if telemetry is None:
            from fastvideo3.telemetry.hooks import SchedulerTelemetry
            telemetry = SchedulerTelemetry()
        self.telemetry = telemetry
        self.runs: "OrderedDict[str, RequestRun]" = OrderedDict()
        self.inflight: dict[int, int] = {}  # id(executor) -> units in flight (placement)
        self.counters: dict[str, float] = {
            "ticks": 0, "units": 0, "batches": 0, "max_batch_units": 0, "multi_request_batches": 0,
            "admitted": 0, "refused": 0, "succeeded": 0, "failed": 0, "cancelled": 0,
        }
        self.batch_sizes: deque[int] = deque(maxlen=4096)  # recent diffusion_step batch sizes
        self._lock = threading.RLock()
        self._pool = (ThreadPoolExecutor(max_workers=dispatch_workers, thread_name_prefix="dispatch")
                      if parallel_dispatch or pipelined else None)
        self.pipelined = pipelined
        self.wake = wake
        self._busy: set[int] = set()  # id(executor) with a batch of this scheduler in flight (pipelined)
        self._registering: set[str] = set()  # request ids being registered by ``admit_hook``

    # -- requests ----------------------------------------------------------------------
    def submit(self, request: ResolvedRequest, card: ModelCard, *, program: tuple[str, ...] | None = None,
               ctx: RequestContext | Mapping[str, Any] | None = None, trace_parent: Any = None) -> RequestRun:
        """Queue a request. ``program`` is the loop sequence (default text-to-video); ``ctx`` seeds
        the context every loop's ``init`` sees (e.g. ``encode`` for the decode loop; a mapping of
        its keys is read as :meth:`RequestContext.from_dict` reads one)."""
        rid = request.request_id
        with self._lock:
            old = self.runs.get(rid)
            if (old is not None and old.status not in TERMINAL) or rid in self._registering:
                raise InvalidRequest("a request with this id is still running", field="request_id")
            queued = sum(r.status == RunStatus.QUEUED for r in self.runs.values()) + len(self._registering)
            if queued >= self.max_queued:
                self.counters["refused"] += 1
                self.telemetry.refused("queue", request.slo_class)
                raise ResourceExhausted(f"queue is full ({queued} waiting)", field="queue",
                                        limit=str(self.max_queued), retry_after_s=1.0)
            run = RequestRun(request=request, card=card, program=tuple(program or PROGRAM_T2V),
                             ctx=RequestContext.of(ctx))
            self._registering.add(rid)  # the id is taken while it is registered
        try:
            if self.admit_hook is not None:
                try:  # the state store, outside the lock: a slow store holds up no step of any request
                    self.admit_hook(run)
                except FastVideoError:
                    with self._lock:
                        self.counters["refused"] += 1
                    raise
        except BaseException:
            with self._lock:
                self._registering.discard(rid)
            raise
        with self._lock:
            self._registering.discard(rid)
            self.runs.pop(rid, None)
            self.runs[rid] = run
            self.counters["admitted"] += 1
            self.telemetry.submitted(request.request_id, card.model_id, request.slo_class, parent=trace_parent,
                                     created_s=run.created)
            self._emit(run, EventKind.ACCEPTED, {"model": card.model_id})
            self._emit(run, EventKind.QUEUED, {"position": queued})
            return run

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            run = self.runs.get(request_id)
            if run is None or run.status in TERMINAL:
                return False
            run.cancel_requested = True
            return True

    def get(self, request_id: str) -> RequestRun | None:
        return self.runs.get(request_id)

    def active(self) -> list[RequestRun]:
        return [r for r in self.runs.values() if r.status not in TERMINAL]

    def forget(self, request_id: str) -> None:
        with self._lock:
            run = self.runs.get(request_id)
            if run is not None and run.status in TERMINAL:
                del self.runs[request_id]

    def adopt(self, run: RequestRun) -> None:
        """Take over a run rebuilt from a checkpoint (a restarted scheduler resuming it). It is
        queued ahead of everything else and admitted again; its loop continues where it was."""
        with self._lock:
            old = self.runs.get(run.request_id)
            if old is not None and old.status not in TERMINAL:
                raise InvalidRequest("a request with this id is still running", field="request_id")
            run.status = RunStatus.QUEUED
            self.runs[run.request_id] = run
            self.runs.move_to_end(run.request_id, last=False)
            self.telemetry.submitted(run.request_id, run.card.model_id, run.request.slo_class, created_s=run.created)
            self._emit(run, EventKind.ACCEPTED, {"model": run.card.model_id, "resumed": True})

    # -- the tick ----------------------------------------------------------------------
    def tick(self) -> bool:
        """One scheduling round. Returns True when any work ran or any request changed state."""
        with self._lock:
            self.counters["ticks"] += 1
            changed = self._boundaries()
            units: list[tuple[WorkUnit, RequestRun]] = []
            for run in list(self.runs.values()):
                if run.status != RunStatus.RUNNING or run.in_flight:
                    continue
                if run.parked_role is not None and not self._unpark(run):
                    changed |= run.status in TERMINAL
                    continue
                if run.pending is not None:  # planned last round, its replica was busy
                    units.append((run.pending, run))
                    run.pending = None
                    continue
                try:
                    plan = self._next_plan(run)
                except FastVideoError as e:
                    self._terminate(run, RunStatus.FAILED, e)
                    changed = True
                    continue
                if plan is None:
                    changed = True
                    continue
                unit = WorkUnit.from_plan(plan, run.card.model_id, run.deadline)
                if self.pricer is not None:
                    self.pricer.price_unit(unit, run.card, run.request)
                self.telemetry.unit_planned(unit)
                units.append((unit, run))
        if not units:
            return changed
        if self.pipelined:
            return self._dispatch_pipelined(units) or changed
        self._dispatch(units)
        return True

    def _boundaries(self) -> bool:
        changed = False
        now = time.time()
        for run in list(self.runs.values()):
            if run.status in TERMINAL or run.in_flight:  # in flight: acted on at its step boundary
                continue
            if run.cancel_requested:
                self._terminate(run, RunStatus.CANCELLED,
                                Cancelled("cancelled by the client", request_id=run.request_id))
                changed = True
            elif now > run.deadline:
                self._terminate(run, RunStatus.FAILED,
                                DeadlineExceeded(f"deadline of {run.request.deadline_s:.1f}s passed", field="deadline_s"))
                changed = True
        if self.admission is not None:
            changed |= self._admission_events(self.admission.pump())
        running = sum(r.status == RunStatus.RUNNING for r in self.runs.values())
        for run in list(self.runs.values()):  # FIFO admission into the running set
            if running >= self.max_running:
                break
            if run.status == RunStatus.QUEUED and not run.admission_waiting and self._admit(run):
                running += 1
                changed = True
        self.telemetry.set_load(queued=sum(r.status == RunStatus.QUEUED for r in self.runs.values()), running=running)
        return changed

    def _admit(self, run: RequestRun) -> bool:
        """Reserve the request's compute and memory; start it when everything fits."""
        if self.admission is not None and self.admission.is_in_flight(run.request_id):
            self._start(run)  # reserved while every running slot was taken
            return True
        if self.admission is not None:
            from fastvideo3.runtime.admission import Admitted, Refused
            res = self.pricer.reservation(run.card, run.request, run.program) if self.pricer else None
            units = [res] if res is not None else []
            try:
                out = self.admission.try_admit(run.request_id, units, run.request.slo_class)
            except FastVideoError as e:
                self._terminate(run, RunStatus.FAILED, e)
                return False
            if isinstance(out, Refused):
                self._terminate(run, RunStatus.FAILED, out.error)
                return False
            if not isinstance(out, Admitted):
                run.admission_waiting = True
                return False
        self._start(run)
        return True

    def _start(self, run: RequestRun) -> None:
        run.status, run.started, run.admission_waiting = RunStatus.RUNNING, time.time(), False
        self.telemetry.admission(run.request_id, "admitted", start_s=run.created)
        self.telemetry.started(run.request_id, queued_since_s=run.created, started_s=run.started)

    def _admission_events(self, events) -> bool:
        from fastvideo3.runtime.admission import Admitted, Refused
        changed = False
        for ev in events:
            run = self.runs.get(ev.request_id)
            if run is None or run.status in TERMINAL:
                if isinstance(ev, Admitted):  # admitted after it ended: give it back at once
                    self.admission.release(ev.request_id)
                continue
            if isinstance(ev, Admitted):
                if sum(r.status == RunStatus.RUNNING for r in self.runs.values()) >= self.max_running:
                    run.admission_waiting = False  # reserved; it starts when a running slot frees
                else:
                    self._start(run)
                changed = True
            elif isinstance(ev, Refused):
                self._terminate(run, RunStatus.FAILED, ev.error)
                changed = True
        return changed

    def _next_plan(self, run: RequestRun):
        while True:
            if run.driver is None:
                loop_id = run.loop_id
                if loop_id is None:
                    self._finish(run)
                    return None
                loop = LOOPS[loop_id]()
                run.driver = LoopDriver(loop, loop.init(run.request, run.card, run.ctx))
                if run.continue_loop is not None and run.continue_loop[0] == loop_id:
                    fn, run.continue_loop = run.continue_loop[1], None
                    run.driver = fn(run, run.driver)
                run.phase_seconds.setdefault(loop_id, 0.0)
                self.telemetry.loop_started(run.request_id, loop_id)
            plan = run.driver.plan()
            if plan is not None:
                return plan
            result = run.driver.result
            run.ctx.add_loop_result(run.loop_id, result)
            self.telemetry.loop_finished(run.request_id)
            run.driver = None
            run.loop_index += 1

    def _dispatch(self, units: list[tuple[WorkUnit, RequestRun]]) -> None:
        jobs = self._jobs(units)
        t0 = time.perf_counter()
        if self._pool is not None and len(jobs) > 1:
            futures = [self._pool.submit(self._run_batch, b, ex) for b, ex in jobs]
            outs = [f.result() for f in futures]
        else:
            outs = [self._run_batch(b, ex) for b, ex in jobs]
        elapsed = time.perf_counter() - t0
        with self._lock:
            for (batch, _), results in zip(jobs, outs):
                self._record_batch(batch)
                for (unit, run), res in zip(batch, results):
                    self._apply(run, unit, res, elapsed)

    def _jobs(self, units: list[tuple[WorkUnit, RequestRun]]) -> list[tuple[list, Any]]:
        """Units grouped by (batch key, replica), split at ``max_batch``: ``[(batch, executor)]``."""
        groups: "OrderedDict[tuple, list[tuple[WorkUnit, RequestRun]]]" = OrderedDict()
        executors: dict[tuple, Any] = {}
        for (u, r), ex in zip(units, self._placements(units)):
            key = (u.batch_key, id(ex))
            groups.setdefault(key, []).append((u, r))
            executors[key] = ex
        return [(members[i : i + self.max_batch], executors[key])
                for key, members in groups.items() for i in range(0, len(members), self.max_batch)]

    def _dispatch_pipelined(self, units: list[tuple[WorkUnit, RequestRun]]) -> bool:
        """Send each batch whose replica is free, without waiting; hold the others' units.
        Returns True when a batch was sent."""
        sent = False
        with self._lock:
            jobs = self._jobs(units)
            for batch, ex in jobs:
                if ex is not None and id(ex) in self._busy:
                    for unit, run in batch:
                        run.pending = unit
                    continue
                if ex is not None:
                    self._busy.add(id(ex))
                for _, run in batch:
                    run.in_flight = True
                self._pool.submit(self._run_pipelined, batch, ex)
                sent = True
        return sent

    def _run_pipelined(self, batch, executor) -> None:
        t0 = time.perf_counter()
        try:
            results = self._run_batch(batch, executor)
        except BaseException as e:  # noqa: BLE001 - _run_batch answers errors itself; this is a bug guard
            err = ErrorInfo.of(Internal(f"{type(e).__name__}: {e}"))
            results = [StepResult(u.unit_id, u.request_id, ok=False, error=err) for u, _ in batch]
        elapsed = time.perf_counter() - t0
        try:
            with self._lock:
                try:
                    self._record_batch(batch)
                    for (unit, run), res in zip(batch, results):
                        self._apply(run, unit, res, elapsed)
                finally:
                    for _, run in batch:
                        run.in_flight = False
                    if executor is not None:
                        self._busy.discard(id(executor))
        finally:
            if self.wake is not None:
                self.wake()

    def _placements(self, units: list[tuple[WorkUnit, RequestRun]]) -> list[Any]:
        """The replica for each unit: the request's pinned replica of that role when it has one,
        else the least-loaded one (units in flight plus units placed in this tick)."""
        load: dict[tuple[str, int], int] = {}
        chosen: list[Any] = [None] * len(units)
        pending = []
        for n, (u, r) in enumerate(units):
            key = self.pool_key(u)
            idx = r.placement.get(key)
            if idx is not None and idx < len(self.executors.get(key) or []):
                load[(key, idx)] = load.get((key, idx), 0) + 1
                chosen[n] = self.executors[key][idx]
            else:
                pending.append(n)
        for n in pending:
            u, r = units[n]
            key = self.pool_key(u)
            replicas = self.executors.get(key) or []
            if not replicas:
                continue  # no pool serves this role: the batch fails with UNAVAILABLE
            healthy = [i for i in range(len(replicas)) if getattr(replicas[i], "healthy", True) is not False]
            idx = min(healthy or range(len(replicas)),
                      key=lambda i: (self.inflight.get(id(replicas[i]), 0) + load.get((key, i), 0), i))
            r.placement[key] = idx
            load[(key, idx)] = load.get((key, idx), 0) + 1
            chosen[n] = replicas[idx]
        return chosen

    def pool_key(self, unit: WorkUnit) -> str:
        """The pools a unit runs on: its role's, or — where the deployment gives each denoising
        expert its own pools (key ``denoiser:<expert>``) — the pools of the expert its step names."""
        expert = unit.params.get("expert") if unit.role == Role.DENOISER else None
        if expert is not None and f"{unit.role}:{expert}" in self.executors:
            return f"{unit.role}:{expert}"
        return unit.role

    def _run_batch(self, batch, executor) -> list[StepResult]:
        units = [u for u, _ in batch]
        err = None
        if executor is None:
            err = ErrorInfo.of(Unavailable(f"no pool serves role {batch[0][0].role!r}", field="role"))
        elif getattr(executor, "healthy", True) is False:  # routed around: fail fast, never hang on it
            err = ErrorInfo.of(Unavailable(f"{batch[0][0].role} replica {getattr(executor, 'target', '')} is not "
                                           "serving", field="role", details={"dispatch_failed": True}))
        if err is not None:
            results = [StepResult(u.unit_id, u.request_id, ok=False, error=err) for u in units]
            with self.telemetry.dispatch(units) as d:  # closes the units' spans
                d.done(results)
            if self.pricer is not None:
                self.pricer.forget([u.unit_id for u in units])
            return results
        key = id(executor)
        self.inflight[key] = self.inflight.get(key, 0) + len(batch)
        try:
            with self.telemetry.dispatch(units) as d:
                results = executor.execute(units)
                d.done(results)
            if len(results) != len(batch):
                raise Internal(f"executor returned {len(results)} results for {len(batch)} units")
            if self.pricer is not None:
                measured = max((r.measured_seconds for r in results), default=0.0)
                self.pricer.observe_batch([u.unit_id for u in units], measured)
            return results
        except Exception as e:  # noqa: BLE001 - a lost pool fails its batch, not the scheduler
            if self.pricer is not None:
                self.pricer.forget([u.unit_id for u in units])
            err = ErrorInfo.of(e)
            if err.code == "UNAVAILABLE":  # the pool itself failed (not one unit): recoverable
                err = dataclasses.replace(err, details={**err.details, "dispatch_failed": True})
            return [StepResult(u.unit_id, u.request_id, ok=False, error=err) for u, _ in batch]
        finally:
            self.inflight[key] -= len(batch)

    def _record_batch(self, batch) -> None:
        n = len(batch)
        kind = batch[0][0].kind
        multi = len({u.request_id for u, _ in batch}) > 1
        c = self.counters
        for prefix in ("", f"{kind}."):  # totals, and the same per WorkUnit kind
            c[prefix + "batches"] = c.get(prefix + "batches", 0) + 1
            c[prefix + "units"] = c.get(prefix + "units", 0) + n
            c[prefix + "max_batch_units"] = max(c.get(prefix + "max_batch_units", 0), n)
            c[prefix + "multi_request_batches"] = c.get(prefix + "multi_request_batches", 0) + multi
        if kind == UnitKind.DIFFUSION_STEP:
            self.batch_sizes.append(n)

    def _apply(self, run: RequestRun, unit: WorkUnit, res: StepResult, elapsed: float) -> None:
        if run.status in TERMINAL or run.driver is None:
            return
        loop_id = run.loop_id
        run.phase_seconds[loop_id] = run.phase_seconds.get(loop_id, 0.0) + elapsed
        if res.ok and res.inline:
            run.artifacts[loop_id] = res.inline
        if not res.ok and self.recover is not None and self.recover(run, unit, res):
            return  # moved to another replica; it continues from its last snapshot
        if not res.ok and res.error is not None and (res.error.details.get("dispatch_failed")
                                                     or res.error.details.get("lost_region")):
            self._terminate(run, RunStatus.FAILED, self._lost(run, unit, res.error))
            return
        try:
            run.driver.apply(res)
        except FastVideoError as e:
            self._terminate(run, RunStatus.FAILED, e)
            return
        except Exception as e:  # noqa: BLE001
            self._terminate(run, RunStatus.FAILED, Internal(f"{type(e).__name__}: {e}"))
            return
        if unit.kind == UnitKind.DIFFUSION_STEP:
            step, total = run.progress()
            self._emit(run, EventKind.PROGRESS, {"phase": "denoise", "step": step, "total": total})
        else:
            step, total = run.progress()
            self._emit(run, EventKind.PROGRESS, {"phase": loop_id, "step": step, "total": total})
        if self.checkpoint is not None:
            self.checkpoint(run)

    def park(self, run: RequestRun, role: str, wait_s: float, error: FastVideoError) -> None:
        """Hold ``run`` until a replica of ``role`` serves again (at most ``wait_s``, and never past
        its deadline); its current loop then runs again there. Fails it with ``error`` after that."""
        run.parked_role, run.parked_until, run.parked_error = role, time.monotonic() + wait_s, error
        run.placement.pop(role, None)
        run.driver = None  # the loop starts again (deterministic), on the replica that comes back

    def _unpark(self, run: RequestRun) -> bool:
        """True when a parked run may go on; fails it once its wait is over (lock held)."""
        replicas = self.executors.get(run.parked_role) or []
        if any(getattr(r, "healthy", True) is not False for r in replicas):
            run.parked_role, run.parked_error = None, None
            return True
        if time.monotonic() > run.parked_until:
            err, run.parked_role, run.parked_error = run.parked_error, None, None
            self._terminate(run, RunStatus.FAILED, err)
        return False

    def _lost(self, run: RequestRun, unit: WorkUnit, err: ErrorInfo) -> Unavailable:
        """The terminal error of a request whose replica was lost with none to take over: it names
        the role, the replica, the step reached and whether a checkpoint exists, and says what to
        do (the transport's own text is kept in ``details["cause"]``)."""
        idx = run.placement.get(unit.role)
        replicas = self.executors.get(unit.role) or []
        ex = replicas[idx] if idx is not None and idx < len(replicas) else None
        replica = str(getattr(ex, "replica_id", "") or getattr(ex, "target", "") or (idx if idx is not None else "?"))
        step, total = run.progress()
        ck = self.checkpoint_step(run) if self.checkpoint_step is not None else None
        healthy = sum(getattr(r, "healthy", True) is not False for r in replicas)
        where = "no healthy replica of the role is left" if not healthy else "no other replica could take it over"
        saved = (f"a checkpoint at step {ck} exists: sending the same request again (same id and parameters) "
                 f"resumes from it" if ck is not None else
                 "no checkpoint exists: sending the same request again (same id and parameters) starts it over")
        lost = "lost its region" if err.details.get("lost_region") else "was lost"
        from fastvideo3.errors import loss_report
        return Unavailable(
            f"{unit.role} replica {replica} {lost} at denoise step {step} of {total} and {where}; {saved}",
            field="role", limit=unit.role, step=step, retry_after_s=err.retry_after_s or 1.0,
            details={"cause": err.message, **loss_report(retryable=True, resume_from_step=ck or 0, role=unit.role,
                                                         replica=replica, step_reached=step,
                                                         checkpoint=ck is not None)})

    # -- terminal states -----------------------------------------------------------------
    def _finish(self, run: RequestRun) -> None:
        run.status = RunStatus.SUCCEEDED
        self.counters["succeeded"] += 1
        self._emit(run, EventKind.ARTIFACT, {"outputs": dict(run.ctx.refs), "phase_seconds": dict(run.phase_seconds),
                                     "artifacts": dict(run.artifacts)})
        self._settle(run)
        self._emit(run, EventKind.FINISHED, {"status": RunStatus.SUCCEEDED})
        run.done_event.set()

    def _terminate(self, run: RequestRun, status: str, exc: FastVideoError) -> None:
        if run.pending is not None:  # planned, never sent: no longer priced or traced
            unit, run.pending = run.pending, None
            if self.pricer is not None:
                self.pricer.forget([unit.unit_id])
            self.telemetry.dropped([unit], f"request {status.lower()} before dispatch")
        run.status = status
        run.error = ErrorInfo.of(exc)
        if "retryable" not in run.error.details:  # every terminal error says whether a retry can succeed
            from fastvideo3.errors import loss_report
            ck = self.checkpoint_step(run) if self.checkpoint_step is not None else None
            retry = run.error.code in RETRYABLE_CODES
            run.error = dataclasses.replace(run.error, details={
                **run.error.details, **loss_report(retryable=retry, resume_from_step=(ck or 0) if retry else None,
                                                   checkpoint=ck is not None)})
        run.driver = None
        self.counters["cancelled" if status == RunStatus.CANCELLED else "failed"] += 1
        self.release(run.request_id)
        self._settle(run)
        self._emit(run, EventKind.ERROR, {"error": run.error})
        self._emit(run, EventKind.FINISHED, {"status": status})
        run.done_event.set()

    def _settle(self, run: RequestRun) -> None:
        """Give back the request's admission reservation and close its telemetry."""
        if self.admission is not None:
            if self.admission.is_in_flight(run.request_id):
                self._admission_events(self.admission.release(run.request_id))
            elif self.admission.is_waiting(run.request_id):
                self._admission_events(self.admission.cancel(run.request_id))
        self.telemetry.finished(run.request_id, run.status, error=run.error)

    def release(self, request_id: str) -> None:
        """Free the request's resident data on every replica of every role."""
        for replicas in self.executors.values():
            for ex in replicas:
                try:
                    ex.release(request_id)
                except Exception:  # noqa: BLE001 - a dead pool has nothing left to free
                    pass

    def _emit(self, run: RequestRun, kind: str, data: dict) -> None:
        ev = Event(run.request_id, next(run._seq), kind, data)
        run.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
