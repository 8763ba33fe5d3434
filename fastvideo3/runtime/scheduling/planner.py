"""The planner: which step of which request runs next, in which batch, on which replica.

It is the pure half of the scheduler (vLLM v1's split): :meth:`Planner.schedule` returns the
batches of one round and :meth:`Planner.update_from_output` folds a batch's results back. It
owns the requests (:class:`RequestRun`), their loop drivers, admission, pricing and placement
decisions and the request events; it starts no thread, waits on nothing and calls no
executor (the replica table is read for its size and health only). Time comes from an
injected clock. :mod:`fastvideo3.runtime.scheduling.dispatcher` runs what it plans;
:class:`~fastvideo3.runtime.scheduling.scheduler.CoreScheduler` wires the two and holds the lock.

One round: requests at a step boundary are cancelled, expired or admitted (FIFO, under
``max_running``); every running request with no unit in flight plans its next step through its
:class:`LoopDriver`; units are grouped by batch key across requests and placed (a request's
units of one role stay on the replica that ran its first one: the pool keeps its resident
state there; new requests go to the least-loaded replica) and cut at ``max_batch``, or at the cohort cap
where one is given (:mod:`fastvideo3.runtime.scheduling.cohorts`). A request
has at most one unit in flight, so its results apply in order. A batch for a replica with no
free slot is held back and its units join that replica's next batch.

Requests that ended are listed by :meth:`Planner.take_ended` with the replicas that ran their
units: freeing what those replicas hold is the dispatcher's job.
"""
from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Mapping

from fastvideo3.errors import (
    Cancelled, DeadlineExceeded, ErrorInfo, FastVideoError, Internal, InvalidRequest, ResourceExhausted, Unavailable,
    loss_report,
)
from fastvideo3.loop import LOOPS, LoopDriver
from fastvideo3.loop.protocol import StepResult
from fastvideo3.request.schema import ResolvedRequest
from fastvideo3.runtime.scheduling.executor import Executor, is_healthy, replica_name
from fastvideo3.runtime.scheduling.run import PROGRAM_T2V, RETRYABLE_CODES, TERMINAL, Batch, Ended, Event, RequestRun
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.vocab import EventKind, Role, RunStatus, UnitKind

#: capacity(executor) -> (batches it may take now, batches of it in flight), or None: no limit
Capacity = Callable[[Any], "tuple[int, int] | None"]


class Planner:
    def __init__(self, executors: Mapping[str, list[Executor]], *, max_batch: int = 16, max_running: int = 64,
                 max_queued: int = 256, on_event: Callable[[Event], None] | None = None,
                 checkpoint: Callable[[RequestRun], None] | None = None,
                 recover: Callable[[RequestRun, WorkUnit, StepResult], bool] | None = None,
                 checkpoint_step: Callable[[RequestRun], int | None] | None = None,
                 pricer: Any = None, admission: Any = None, telemetry: Any = None,
                 load: Callable[[Any], int] | None = None, clock: Callable[[], float] = time.time,
                 batch_cap: Callable[[WorkUnit, Any], int | None] | None = None):
        """``executors``: the replica table, per pool key (read for size and health only).
        ``load(executor)``: units in flight there (least-loaded placement; default none).
        ``checkpoint`` is called after each applied result, ``recover`` may move a request whose
        replica was lost (True: it continues), ``checkpoint_step`` says where a retry resumes.
        ``pricer`` prices units and reservations, ``admission`` reserves a request's compute and
        memory before it steps, ``telemetry`` records spans; all optional. ``batch_cap(unit,
        executor)``: units at most in one batch of that unit's kind and shape on that replica, below
        ``max_batch`` (None: no cap; see :mod:`fastvideo3.runtime.scheduling.cohorts`)."""
        self.executors = executors
        self.max_batch = max_batch
        self.max_running = max_running
        self.max_queued = max_queued
        self.on_event = on_event
        self.checkpoint = checkpoint
        self.recover = recover
        self.checkpoint_step = checkpoint_step
        self.pricer = pricer
        self.admission = admission
        if telemetry is None:
            from fastvideo3.telemetry.hooks import SchedulerTelemetry
            telemetry = SchedulerTelemetry()
        self.telemetry = telemetry
        self.load = load or (lambda ex: 0)
        self.clock = clock
        self.batch_cap = batch_cap
        self.cohort_caps: dict[str, int] = {}  # shape signature -> the cap its last batch was cut at
        self.runs: "OrderedDict[str, RequestRun]" = OrderedDict()
        self.counters: dict[str, float] = {
            "ticks": 0, "units": 0, "batches": 0, "max_batch_units": 0, "multi_request_batches": 0,
            "admitted": 0, "refused": 0, "succeeded": 0, "failed": 0, "cancelled": 0, "cohort_capped_batches": 0,
        }
        self.batch_sizes: deque[int] = deque(maxlen=4096)  # recent diffusion_step batch sizes
        self.registering: set[str] = set()  # request ids being registered outside the planner
        self.changed = False  # whether the last schedule() changed any request's state
        self._ended: list[Ended] = []

    # -- requests ----------------------------------------------------------------------
    def reserve(self, request: ResolvedRequest) -> int:
        """Take the request's id for a submit (refused if it runs or the queue is full); returns
        its queue position. :meth:`add` or :meth:`unreserve` follows."""
        rid = request.request_id
        old = self.runs.get(rid)
        if (old is not None and old.status not in TERMINAL) or rid in self.registering:
            raise InvalidRequest("a request with this id is still running", field="request_id")
        queued = sum(r.status == RunStatus.QUEUED for r in self.runs.values()) + len(self.registering)
        if queued >= self.max_queued:
            self.counters["refused"] += 1
            self.telemetry.refused("queue", request.slo_class)
            raise ResourceExhausted(f"queue is full ({queued} waiting)", field="queue",
                                    limit=str(self.max_queued), retry_after_s=1.0)
        self.registering.add(rid)
        return queued

    def unreserve(self, request_id: str, refused: bool = False) -> None:
        self.registering.discard(request_id)
        if refused:
            self.counters["refused"] += 1

    def add(self, run: RequestRun, queued: int, trace_parent: Any = None) -> RequestRun:
        rid = run.request_id
        self.registering.discard(rid)
        self.runs.pop(rid, None)
        self.runs[rid] = run
        self.counters["admitted"] += 1
        self.telemetry.submitted(rid, run.card.model_id, run.request.slo_class, parent=trace_parent,
                                 created_s=run.created)
        self.emit(run, EventKind.ACCEPTED, {"model": run.card.model_id})
        self.emit(run, EventKind.QUEUED, {"position": queued})
        return run

    def cancel(self, request_id: str) -> bool:
        """Mark the request cancelled: it gets no further unit, and the result of a unit in
        flight is dropped when it returns (its step boundary)."""
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
        run = self.runs.get(request_id)
        if run is not None and run.status in TERMINAL:
            del self.runs[request_id]

    def adopt(self, run: RequestRun) -> None:
        """Take over a run rebuilt from a checkpoint: queued ahead of everything, admitted again."""
        old = self.runs.get(run.request_id)
        if old is not None and old.status not in TERMINAL:
            raise InvalidRequest("a request with this id is still running", field="request_id")
        run.status = RunStatus.QUEUED
        self.runs[run.request_id] = run
        self.runs.move_to_end(run.request_id, last=False)
        self.telemetry.submitted(run.request_id, run.card.model_id, run.request.slo_class, created_s=run.created)
        self.emit(run, EventKind.ACCEPTED, {"model": run.card.model_id, "resumed": True})

    def expecting(self) -> set[tuple[str, int]]:
        """Replicas a running request's next unit is likely to go to (its latest one's)."""
        return {r.last_replica for r in self.runs.values() if r.status == RunStatus.RUNNING and r.last_replica}

    def take_ended(self) -> list[Ended]:
        """Requests that ended since the last call (their replicas' data is to be freed)."""
        out, self._ended = self._ended, []
        return out

    # -- one round ---------------------------------------------------------------------
    def schedule(self, capacity: Capacity | None = None, *, split_min_units: int = 0) -> list[Batch]:
        """Plan one round; returns its batches (the runs in them are marked in flight).

        ``capacity(executor)``: ``(free slots, batches in flight)`` of that replica (None: no
        limit). A replica with a batch in flight gets no other one and the units wait to join its
        next batch, except for double buffering: with ``split_min_units`` (0: off), a round of
        at least that many diffusion steps for an idle replica with two free slots is cut in two
        halves sent back to back, and a round of at least half that many is sent beside the
        batch in flight (so the halves alternate: one runs while the other's inputs arrive)."""
        self.counters["ticks"] += 1
        changed = self._boundaries()
        units: list[tuple[WorkUnit, RequestRun]] = []
        for run in list(self.runs.values()):
            if run.status != RunStatus.RUNNING or run.in_flight or run.snapshotting:
                continue
            if run.parked_role is not None and not self._unpark(run):
                changed |= run.status in TERMINAL
                continue
            if run.pending is not None:  # planned last round, its replica had no free slot
                units.append((run.pending, run))
                run.pending = None
                continue
            try:
                plan = self._next_plan(run)
            except FastVideoError as e:
                self.terminate(run, RunStatus.FAILED, e)
                changed = True
                continue
            if plan is None:
                changed = True
                continue
            unit = WorkUnit.from_plan(plan, run.card.model_id, run.deadline)
            if self.pricer is not None:
                self.pricer.price_unit(unit, run.card, run.request)
                run.work_s = unit.resources.gpu_seconds * (unit.total or 1)
            self.telemetry.unit_planned(unit)
            units.append((unit, run))
        batches = self._batches(units, capacity, split_min_units)
        self.changed = changed
        return batches

    def _batches(self, units, capacity: Capacity | None, split_min_units: int) -> list[Batch]:
        groups: "OrderedDict[tuple, list[tuple[WorkUnit, RequestRun]]]" = OrderedDict()
        where: dict[tuple, tuple[str, int | None, Any]] = {}
        for (u, r), (pool, idx, ex) in zip(units, self._placements(units)):
            key = (u.batch_key, pool, idx)
            groups.setdefault(key, []).append((u, r))
            where[key] = (pool, idx, ex)
        state: dict[int, list[int] | None] = {}  # id(executor) -> [free slots, batches in flight]
        out: list[Batch] = []
        now = self.clock()
        in_flight = self._slowdowns_in_flight(now) if split_min_units > 0 else None
        for key, members in self._ordered(groups, now):
            pool, idx, ex = where[key]
            if ex is not None and id(ex) not in state:
                cap = capacity(ex) if capacity is not None else None
                state[id(ex)] = list(cap) if cap is not None else None
            st = state.get(id(ex)) if ex is not None else None
            dbuf = split_min_units > 0 and members[0][0].kind == UnitKind.DIFFUSION_STEP
            size = self._batch_size(members[0][0], ex, len(members))
            if st is not None and dbuf and st[1] == 0 and st[0] >= 2 and len(members) >= split_min_units:
                size = min(size, (len(members) + 1) // 2)  # two halves, sent back to back
            for i in range(0, len(members), size):
                chunk = members[i : i + size]
                if st is not None:
                    # a replica runs one batch at a time, unless the next one is large enough to
                    # double-buffer; otherwise its units wait and join the replica's next batch
                    second = dbuf and len(chunk) >= max(1, split_min_units // 2)
                    # a decode batch goes beside the one in flight: its VAE call runs while the
                    # other's files encode (the decoder serializes its VAE calls itself); the
                    # replica's depth (its free slots) bounds how many
                    second = second or members[0][0].kind == UnitKind.VAE_TILE
                    if second and in_flight and id(ex) in in_flight:  # beside a batch of far more slowed-down
                        # requests, it would hold their next step behind it: it waits instead
                        second = 2 * max(self._slowdown(r, now) for _, r in chunk) >= in_flight[id(ex)]
                    if st[0] <= 0 or (st[1] > 0 and not second):
                        for unit, run in chunk:
                            run.pending = unit
                        continue
                    st[0], st[1] = st[0] - 1, st[1] + 1
                    if in_flight is not None and any(r.work_s > 0 for _, r in chunk):
                        most = max(self._slowdown(r, now) for _, r in chunk)
                        in_flight[id(ex)] = max(in_flight.get(id(ex), most), most)
                for _, run in chunk:
                    run.in_flight = True
                    if idx is not None:
                        run.touched.add((pool, idx))
                        run.last_replica = (pool, idx)
                out.append(Batch(chunk, pool, idx, ex))
        return out

    def _batch_size(self, unit: WorkUnit, ex: Any, waiting: int) -> int:
        """Units per batch for a group like ``unit``'s on replica ``ex``: ``max_batch``, or the
        cohort cap where one applies and is smaller (counted when it cuts the group)."""
        size = self.max_batch
        if self.batch_cap is None or ex is None:
            return size
        cap = self.batch_cap(unit, ex)
        if cap is not None and cap < size:
            size = max(1, int(cap))
            self.cohort_caps[unit.shape_sig] = size
            if waiting > size:
                self.counters["cohort_capped_batches"] += 1
        return size

    def _slowdown(self, run: RequestRun, now: float) -> float:
        """Time since the request started over its priced work (GPU-seconds; 0 when unpriced)."""
        return max(0.0, now - (run.started or run.created)) / run.work_s if run.work_s > 0 else 0.0

    def _rank(self, run: RequestRun, now: float) -> tuple[float, float]:
        """A request's place when batches compete for a replica, lowest first: its slowdown,
        negated; equal ones (to the millisecond of slowdown), the smaller work."""
        return -round(self._slowdown(run, now), 3), max(run.work_s, 1e-6)

    def _ordered(self, groups, now: float) -> list:
        """The round's batch groups, the one holding the most slowed-down request first.

        A replica runs one batch at a time, so the group planned first takes it and the others
        wait: in arrival order, a large clip's steps would hold every small request behind them.
        By slowdown, a small request that has waited a second outranks a large one that has
        waited as long, and a large request still rises as it waits: none is held back for good.
        Unpriced rounds (no pricer) keep arrival order."""
        if len(groups) < 2 or not any(r.work_s > 0 for g in groups.values() for _, r in g):
            return list(groups.items())
        ranked = sorted(enumerate(groups.items()), key=lambda g: (min(self._rank(r, now) for _, r in g[1][1]), g[0]))
        return [item for _, item in ranked]

    def _slowdowns_in_flight(self, now: float) -> dict[int, float]:
        """id(executor) -> the highest slowdown among the (priced) requests in flight there."""
        most: dict[int, float] = {}
        for run in self.runs.values():
            if run.in_flight and run.work_s > 0 and run.last_replica is not None:
                pool, idx = run.last_replica
                replicas = self.executors.get(pool) or []
                if idx < len(replicas):
                    key = id(replicas[idx])
                    most[key] = max(most.get(key, 0.0), self._slowdown(run, now))
        return most

    def _placements(self, units) -> list[tuple[str, int | None, Any]]:
        """(pool key, replica index, executor) for each unit: the request's pinned replica of that
        pool when it has one, else the least-loaded healthy one (units in flight plus units placed
        in this round)."""
        load: dict[tuple[str, int], int] = {}
        chosen: list[tuple[str, int | None, Any]] = [("", None, None)] * len(units)
        pending = []
        for n, (u, r) in enumerate(units):
            key = self.pool_key(u)
            idx = r.placement.get(key)
            if idx is not None and idx < len(self.executors.get(key) or []):
                load[(key, idx)] = load.get((key, idx), 0) + 1
                chosen[n] = (key, idx, self.executors[key][idx])
            else:
                chosen[n] = (key, None, None)
                pending.append(n)
        for n in pending:
            u, r = units[n]
            key = self.pool_key(u)
            replicas = self.executors.get(key) or []
            if not replicas:
                continue  # no pool serves this role: the batch fails with UNAVAILABLE
            healthy = [i for i in range(len(replicas)) if is_healthy(replicas[i])]
            idx = min(healthy or range(len(replicas)),
                      key=lambda i: (self.load(replicas[i]) + load.get((key, i), 0), i))
            r.placement[key] = idx
            load[(key, idx)] = load.get((key, idx), 0) + 1
            chosen[n] = (key, idx, replicas[idx])
        return chosen

    def pool_key(self, unit: WorkUnit) -> str:
        """The pools a unit runs on: its role's, or — where the deployment gives each denoising
        expert its own pools (key ``denoiser:<expert>``) — the pools of the expert its step names."""
        expert = unit.params.get("expert") if unit.role == Role.DENOISER else None
        if expert is not None and f"{unit.role}:{expert}" in self.executors:
            return f"{unit.role}:{expert}"
        return unit.role

    def update_from_output(self, batch: Batch, results: list[StepResult], elapsed: float, *,
                           dispatched: bool = True) -> None:
        """Fold a batch's results back (in unit order). ``dispatched``: the executor answered
        (its measured time calibrates the pricer); False: the batch never ran. A run that was
        cancelled or ended meanwhile drops its result."""
        try:
            if self.pricer is not None:
                ids = [u.unit_id for u in batch.work]
                if dispatched:
                    self.pricer.observe_batch(ids, max((r.measured_seconds for r in results), default=0.0))
                else:
                    self.pricer.forget(ids)
            self._record_batch(batch)
            for (unit, run), res in zip(batch.units, results):
                run.in_flight = False
                self._apply(run, unit, res, elapsed)
        finally:
            for _, run in batch.units:
                run.in_flight = False

    # -- step boundaries ---------------------------------------------------------------
    def _boundaries(self) -> bool:
        changed = False
        now = self.clock()
        for run in list(self.runs.values()):
            if run.status in TERMINAL or run.in_flight or run.snapshotting:  # acted on at its boundary
                continue
            if run.cancel_requested:
                self.terminate(run, RunStatus.CANCELLED,
                               Cancelled("cancelled by the client", request_id=run.request_id))
                changed = True
            elif now > run.deadline:
                late = DeadlineExceeded(f"deadline of {run.request.deadline_s:.1f}s passed", field="deadline_s")
                self.terminate(run, RunStatus.FAILED, late)
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
            from fastvideo3.runtime.economy.admission import Admitted, Refused
            res = self.pricer.reservation(run.card, run.request, run.program) if self.pricer else None
            units = [res] if res is not None else []
            try:
                out = self.admission.try_admit(run.request_id, units, run.request.slo_class)
            except FastVideoError as e:
                self.terminate(run, RunStatus.FAILED, e)
                return False
            if isinstance(out, Refused):
                self.terminate(run, RunStatus.FAILED, out.error)
                return False
            if not isinstance(out, Admitted):
                run.admission_waiting = True
                return False
        self._start(run)
        return True

    def _start(self, run: RequestRun) -> None:
        run.status, run.started, run.admission_waiting = RunStatus.RUNNING, self.clock(), False
        self.telemetry.admission(run.request_id, "admitted", start_s=run.created)
        self.telemetry.started(run.request_id, queued_since_s=run.created, started_s=run.started)

    def _admission_events(self, events) -> bool:
        from fastvideo3.runtime.economy.admission import Admitted, Refused
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
                self.terminate(run, RunStatus.FAILED, ev.error)
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

    # -- results -----------------------------------------------------------------------
    def _record_batch(self, batch: Batch) -> None:
        n = len(batch.units)
        kind = batch.units[0][0].kind
        multi = len({u.request_id for u, _ in batch.units}) > 1
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
        if run.cancel_requested:  # dropped: the request ends at this step boundary (next round)
            return
        loop_id = run.loop_id
        run.phase_seconds[loop_id] = run.phase_seconds.get(loop_id, 0.0) + elapsed
        if res.ok and res.inline:
            run.artifacts[loop_id] = res.inline
        if not res.ok and self.recover is not None and self.recover(run, unit, res):
            return  # moved to another replica; it continues from its last snapshot
        if not res.ok and res.error is not None and (res.error.details.get("dispatch_failed")
                                                     or res.error.details.get("lost_region")):
            self.terminate(run, RunStatus.FAILED, self.lost(run, unit, res.error))
            return
        try:
            run.driver.apply(res)
        except FastVideoError as e:
            self.terminate(run, RunStatus.FAILED, e)
            return
        except Exception as e:  # noqa: BLE001
            self.terminate(run, RunStatus.FAILED, Internal(f"{type(e).__name__}: {e}"))
            return
        step, total = run.progress()
        phase = "denoise" if unit.kind == UnitKind.DIFFUSION_STEP else loop_id
        self.emit(run, EventKind.PROGRESS, {"phase": phase, "step": step, "total": total})
        if self.checkpoint is not None:
            self.checkpoint(run)

    def park(self, run: RequestRun, role: str, wait_s: float, error: FastVideoError) -> None:
        """Hold ``run`` until a replica of ``role`` serves again (at most ``wait_s``, and never past
        its deadline); its current loop then runs again there. Fails it with ``error`` after that."""
        run.parked_role, run.parked_until, run.parked_error = role, self.clock() + wait_s, error
        run.placement.pop(role, None)
        run.driver = None  # the loop starts again (deterministic), on the replica that comes back

    def _unpark(self, run: RequestRun) -> bool:
        """True when a parked run may go on; fails it once its wait is over."""
        replicas = self.executors.get(run.parked_role) or []
        if any(is_healthy(r) for r in replicas):
            run.parked_role, run.parked_error = None, None
            return True
        if self.clock() > run.parked_until:
            err, run.parked_role, run.parked_error = run.parked_error, None, None
            self.terminate(run, RunStatus.FAILED, err)
        return False

    def lost(self, run: RequestRun, unit: WorkUnit, err: ErrorInfo) -> Unavailable:
        """The terminal error of a request whose replica was lost with none to take over: it names
        the role, the replica, the step reached and whether a checkpoint exists, and says what to
        do (the transport's own text is kept in ``details["cause"]``)."""
        idx = run.placement.get(unit.role)
        replicas = self.executors.get(unit.role) or []
        ex = replicas[idx] if idx is not None and idx < len(replicas) else None
        replica = replica_name(ex, str(idx) if idx is not None else "?")
        step, total = run.progress()
        ck = self.checkpoint_step(run) if self.checkpoint_step is not None else None
        healthy = sum(is_healthy(r) for r in replicas)
        where = "no healthy replica of the role is left" if not healthy else "no other replica could take it over"
        saved = (f"a checkpoint at step {ck} exists: sending the same request again (same id and parameters) "
                 f"resumes from it" if ck is not None else
                 "no checkpoint exists: sending the same request again (same id and parameters) starts it over")
        lost = "lost its region" if err.details.get("lost_region") else "was lost"
        return Unavailable(
            f"{unit.role} replica {replica} {lost} at denoise step {step} of {total} and {where}; {saved}",
            field="role", limit=unit.role, step=step, retry_after_s=err.retry_after_s or 1.0,
            details={"cause": err.message, **loss_report(retryable=True, resume_from_step=ck or 0, role=unit.role,
                                                         replica=replica, step_reached=step,
                                                         checkpoint=ck is not None)})

    # -- terminal states ---------------------------------------------------------------
    def _finish(self, run: RequestRun) -> None:
        run.status = RunStatus.SUCCEEDED
        self.counters["succeeded"] += 1
        self.emit(run, EventKind.ARTIFACT, {"outputs": dict(run.ctx.refs), "phase_seconds": dict(run.phase_seconds),
                                            "artifacts": dict(run.artifacts)})
        self._settle(run)
        self._ended.append(self._ended_of(run))
        self.emit(run, EventKind.FINISHED, {"status": RunStatus.SUCCEEDED})
        run.done_event.set()

    def terminate(self, run: RequestRun, status: str, exc: FastVideoError) -> None:
        """End ``run`` with ``status`` and the error ``exc`` (marked retryable or not)."""
        if run.pending is not None:  # planned, never sent: no longer priced or traced
            unit, run.pending = run.pending, None
            if self.pricer is not None:
                self.pricer.forget([unit.unit_id])
            self.telemetry.dropped([unit], f"request {status.lower()} before dispatch")
        run.status = status
        run.error = ErrorInfo.of(exc)
        if "retryable" not in run.error.details:  # every terminal error says whether a retry can succeed
            ck = self.checkpoint_step(run) if self.checkpoint_step is not None else None
            retry = run.error.code in RETRYABLE_CODES
            run.error = dataclasses.replace(run.error, details={
                **run.error.details, **loss_report(retryable=retry, resume_from_step=(ck or 0) if retry else None,
                                                   checkpoint=ck is not None)})
        run.driver = None
        self.counters["cancelled" if status == RunStatus.CANCELLED else "failed"] += 1
        self._ended.append(self._ended_of(run))
        self._settle(run)
        self.emit(run, EventKind.ERROR, {"error": run.error})
        self.emit(run, EventKind.FINISHED, {"status": status})
        run.done_event.set()

    def _ended_of(self, run: RequestRun) -> Ended:
        where = set(run.touched) | set(run.placement.items())
        return Ended(run.request_id, run.status, tuple(sorted(where)))

    def _settle(self, run: RequestRun) -> None:
        """Give back the request's admission reservation and close its telemetry."""
        if self.admission is not None:
            if self.admission.is_in_flight(run.request_id):
                self._admission_events(self.admission.release(run.request_id))
            elif self.admission.is_waiting(run.request_id):
                self._admission_events(self.admission.cancel(run.request_id))
        self.telemetry.finished(run.request_id, run.status, error=run.error)

    def emit(self, run: RequestRun, kind: str, data: dict) -> None:
        ev = Event(run.request_id, next(run._seq), kind, data)
        run.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)


__all__ = ["Batch", "Ended", "Event", "PROGRAM_T2V", "Planner", "RETRYABLE_CODES", "RequestRun", "TERMINAL"]
