"""The telemetry hooks the runtime calls: one object for the scheduler, one for a pool.

Each wraps a :class:`~fastvideo3.telemetry.tracing.Tracing` (default: the process's, see
``init_tracing``) and an optional :class:`~fastvideo3.telemetry.metrics.ServiceMetrics`, so
the scheduler and the pool servicer add one call per event and never touch spans or metric
families themselves. With tracing off and no metrics every hook returns at once.

Who observes what (so nothing is counted twice when the scheduler and pools share a process):

* scheduler: request spans, loop and unit spans, the batch span; queue depth, in-flight,
  admitted / refused / finished counters, batch sizes;
* pool: pool batch and execute spans, transfer spans; step latency, predicted vs measured
  GPU-seconds, resident buffers, transfer bytes.

Scheduler call order for one request (``CoreScheduler`` names in brackets)::

    submitted(rid, card, slo_class, created_s=run.created)        [submit]
    started(rid, queued_since_s=run.created, started_s=run.started) [_boundaries QUEUED->RUNNING]
    loop_started(rid, loop_id) ... loop_finished(rid)             [_next_plan: driver made / done]
    unit_planned(unit)                                            [tick, after WorkUnit.from_plan]
    with dispatch(units) as d: results = executor.execute(units); d.done(results)   [_run_batch]
    finished(rid, status, error=run.error)                        [_finish / _terminate]

Live spans of requests in flight are held here, keyed by request id, and dropped by
``finished``: they are observability handles, not request state (a restarted scheduler
starts new request spans; nothing here is checkpointed).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from fastvideo3.telemetry import names as N
from fastvideo3.telemetry.tracing import NOOP_SPAN, TraceSpan, Tracing, get_tracing, unit_shares


def _ns(seconds: float | None) -> int | None:
    """Epoch seconds (``time.time()``, what the scheduler records) to span nanoseconds."""
    return None if seconds is None else int(seconds * 1e9)


@dataclass
class _Live:
    span: TraceSpan
    slo_class: str
    loop: TraceSpan = NOOP_SPAN


class SchedulerTelemetry:
    """Hooks for the scheduler (see the module docstring for the call order)."""

    def __init__(self, tracing: Tracing | None = None, metrics: Any = None) -> None:
        self._tracing = tracing
        self.metrics = metrics
        self._live: dict[str, _Live] = {}
        self._units: dict[str, tuple[TraceSpan, int]] = {}  # unit id -> (unit span, planned at ns)
        self._lock = threading.Lock()

    @property
    def tracing(self) -> Tracing:
        return self._tracing if self._tracing is not None else get_tracing()

    # -- requests ----------------------------------------------------------------------------

    def submitted(self, request_id: str, card: str, slo_class: str, *, parent: Any = None,
                  created_s: float | None = None) -> None:
        """A request was accepted. ``parent``: the caller's trace context (gRPC metadata)."""
        tracing = self.tracing
        if not tracing.enabled:
            return
        span = tracing.request_span(request_id, card, slo_class, parent=parent, start_ns=_ns(created_s))
        with self._lock:
            self._live[request_id] = _Live(span, slo_class)

    def started(self, request_id: str, *, queued_since_s: float, started_s: float | None = None) -> None:
        """QUEUED -> RUNNING: records the queue wait."""
        live = self._live.get(request_id)
        if live is not None:
            self.tracing.phase_span(live.span, "queue_wait", start_ns=_ns(queued_since_s),
                                    end_ns=_ns(started_s if started_s is not None else time.time()))

    def admission(self, request_id: str, outcome: str, *, start_s: float, end_s: float | None = None,
                  reason: str | None = None, slo_class: str | None = None) -> None:
        """One admission decision: ``outcome`` is ``admitted``, ``waiting`` or ``refused``
        (``reason``: the refusal's field). Records the phase and the admitted/refused counters."""
        live = self._live.get(request_id)
        cls = slo_class or (live.slo_class if live is not None else "all")
        if live is not None:
            self.tracing.phase_span(live.span, "admission", start_ns=_ns(start_s),
                                    end_ns=_ns(end_s if end_s is not None else time.time()),
                                    outcome=outcome, reason=reason)
        if self.metrics is not None:
            if outcome == "admitted":
                self.metrics.observe_admitted(cls)
            elif outcome == "refused":
                self.metrics.observe_refused(reason or "unknown", cls)

    def refused(self, reason: str, slo_class: str = "all") -> None:
        """A request refused before it had a span (e.g. the scheduler's queue was full)."""
        if self.metrics is not None:
            self.metrics.observe_refused(reason, slo_class)

    def finished(self, request_id: str, status: str, error: Any = None) -> None:
        """The request turned terminal (SUCCEEDED, FAILED, CANCELLED)."""
        with self._lock:
            live = self._live.pop(request_id, None)
        if live is not None:
            live.loop.end()
            live.span.finish(status=status, error=error)
        if self.metrics is not None:
            self.metrics.observe_finished(status, getattr(error, "code", "") if error is not None else "")

    def set_load(self, queued: int, running: int, slo_class: str = "all") -> None:
        """Queue depth and in-flight requests (call once per tick, or per state change)."""
        if self.metrics is not None:
            self.metrics.set_queue_depth(queued, slo_class)
            self.metrics.set_inflight(running, slo_class)

    # -- loops and units ---------------------------------------------------------------------

    def loop_started(self, request_id: str, loop_id: str) -> None:
        live = self._live.get(request_id)
        if live is not None:
            live.loop.end()
            live.loop = self.tracing.loop_span(live.span, loop_id, request_id=request_id)

    def loop_finished(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is not None:
            live.loop.end()
            live.loop = NOOP_SPAN

    def unit_planned(self, unit: Any) -> None:
        """A WorkUnit was made: starts its span and writes the span's context into ``unit.trace``."""
        live = self._live.get(unit.request_id)
        if live is None:
            return
        parent = live.loop if live.loop.recording else live.span
        span = self.tracing.unit_span(unit, parent=parent, slo_class=live.slo_class)
        with self._lock:
            self._units[unit.unit_id] = (span, time.time_ns())

    def dispatch(self, units: Sequence[Any], *, role: str | None = None) -> "_Dispatch | _NoDispatch":
        """Wrap one batch's Execute call: the batch span is current inside (so
        ``inject_metadata()`` carries it to the pool); ``done(results)`` ends the unit spans."""
        if not units or (not self.tracing.enabled and self.metrics is None):
            return _NO_DISPATCH
        return _Dispatch(self, units, role)

    def dropped(self, units: Sequence[Any], why: str) -> None:
        """Units that were planned but never sent (their request ended first): end their spans."""
        now = time.time_ns()
        for held in self._take_units(units):
            if held is not None:
                held[0].finish(measured_s=None, error=why, end_ns=now)

    def _take_units(self, units: Sequence[Any]) -> list[tuple[TraceSpan, int] | None]:
        with self._lock:
            return [self._units.pop(u.unit_id, None) for u in units]


class _Dispatch:
    def __init__(self, owner: SchedulerTelemetry, units: Sequence[Any], role: str | None) -> None:
        self.owner = owner
        self.units = list(units)
        self.role = role or getattr(self.units[0], "role", "")
        self.batch = owner.tracing.batch_span(self.units, role=self.role)
        self._start_ns = 0
        self._open = True

    def __enter__(self) -> "_Dispatch":
        self._start_ns = time.time_ns()
        self.batch.__enter__()
        m = self.owner.metrics
        if m is not None:
            m.observe_batch(len(self.units), self.role, self.units[0].kind)
        return self

    def done(self, results: Sequence[Any], error: Any = None) -> None:
        """End every unit's span with its result (measured GPU-seconds: the batch's
        ``measured_seconds`` shared by prediction; failed units marked). A unit without a
        result is failed with ``error``."""
        if not self._open:
            return
        self._open = False
        tracing, now = self.owner.tracing, time.time_ns()
        predicted = [u.resources.gpu_seconds for u in self.units]
        batch_s = max((getattr(r, "measured_seconds", 0.0) for r in results), default=0.0)
        shares = unit_shares(batch_s, predicted)
        for n, (unit, held) in enumerate(zip(self.units, self.owner._take_units(self.units))):
            if held is None:
                continue
            span, planned_ns = held
            tracing.phase_span(span, "unit_queue_wait", start_ns=planned_ns, end_ns=self._start_ns)
            tracing.phase_span(span, "dispatch", start_ns=self._start_ns, end_ns=now)
            res = results[n] if n < len(results) else None
            failed = res is None or not getattr(res, "ok", True)
            why = (getattr(res, "error", None) or error or "no result") if failed else None
            span.set(N.A_BATCH_SIZE, len(self.units))
            span.finish(measured_s=shares[n] if res is not None else None, error=why, end_ns=now)

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._open:  # the call raised, or done() was never called: no results for anyone
            self.done([], exc)
        return self.batch.__exit__(exc_type, exc, tb)


class _NoDispatch:
    def __enter__(self) -> "_NoDispatch":
        return self

    def done(self, results: Sequence[Any], error: Any = None) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        return False


_NO_DISPATCH = _NoDispatch()


class PoolTelemetry:
    """Hooks for a role pool's servicer (or an embedded executor wrapper)."""

    def __init__(self, role: str, *, tracing: Tracing | None = None, metrics: Any = None,
                 replica: str | None = None) -> None:
        self.role = role
        self.replica = replica
        self._tracing = tracing
        self.metrics = metrics

    @property
    def tracing(self) -> Tracing:
        return self._tracing if self._tracing is not None else get_tracing()

    def run_batch(self, units: Sequence[Any], execute: Callable[[list[Any]], list[Any]], *,
                  metadata: Any = None) -> list[Any]:
        """``execute(units)`` inside the batch's spans; then step latency and predicted vs
        measured GPU-seconds per unit. ``metadata``: the Execute call's invocation metadata."""
        units = list(units)
        if not units:
            return execute(units)
        t0 = time.perf_counter()
        with self.tracing.pool_batch(units, role=self.role, parent=metadata, replica=self.replica) as pb:
            results = execute(units)
            pb.finish(results)
        wall = time.perf_counter() - t0
        m = self.metrics
        if m is not None:
            m.observe_step(self.role, units[0].kind, wall)
            batch_s = max((getattr(r, "measured_seconds", 0.0) for r in results), default=0.0) or wall
            predicted = [u.resources.gpu_seconds for u in units]
            for u, p, share, r in zip(units, predicted, unit_shares(batch_s, predicted), results):
                if p > 0 and getattr(r, "ok", True):
                    m.observe_prediction(self.role, u.kind, p, share)
        return results

    def transfer(self, backend: str, nbytes: int, *, parent: Any = None, request_id: str | None = None,
                 direction: str = "pull", src: str | None = None, dst: str | None = None) -> "_Transfer":
        """``with pool.transfer("nixl", n, parent=unit.trace): ...``: a span and the transfer metrics."""
        span = self.tracing.transfer_span(backend, nbytes, parent=parent, request_id=request_id, src=src, dst=dst)
        return _Transfer(self.metrics, span, backend, nbytes, direction)

    def set_resident(self, buffers: int, nbytes: int | None = None) -> None:
        if self.metrics is not None:
            self.metrics.set_resident(buffers, nbytes, role=self.role)


class _Transfer:
    def __init__(self, metrics: Any, span: TraceSpan, backend: str, nbytes: int, direction: str) -> None:
        self.metrics, self.span = metrics, span
        self.backend, self.nbytes, self.direction = backend, nbytes, direction
        self._t0 = 0.0

    def __enter__(self) -> TraceSpan:
        self._t0 = time.perf_counter()
        return self.span.__enter__()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.metrics is not None and exc is None:
            self.metrics.observe_transfer(self.backend, self.nbytes, time.perf_counter() - self._t0, self.direction)
        return self.span.__exit__(exc_type, exc, tb)
