"""AdmissionController: reservation before admission, priced in predicted GPU-seconds.

One controller guards one pool. It holds

* per SLO class (``interactive``, ``batch``, ...): a compute budget, the predicted GPU-seconds
  allowed in flight at once, and a bound on how many requests may wait;
* one memory budget shared by all classes, in bytes of resident plus peak activation memory
  (the pool's device memory net of its weights and a headroom).

Rules, each one a test in ``tests/unit/test_admission.py``:

1. **All or nothing.** A request's units (its samples, or the units it will have in flight at
   once) are reserved together: compute AND memory AND the jumbo rule must all allow the whole
   sum, or nothing is reserved. Peaks are summed: the units may run in one batch.
2. **Never admitted to fail later.** A unit whose peak alone, or a request whose memory sum,
   exceeds the whole memory budget is refused at once (``field="memory"``); a request whose
   GPU-seconds exceed its class's whole compute budget likewise (``field="compute"``).
3. **FIFO per class, bounded.** A request waits behind every earlier waiter of its class. Past
   ``queue_bound`` waiters, or after ``max_wait_s`` of waiting, it is refused with
   RESOURCE_EXHAUSTED and a ``retry_after_s`` estimate. Classes are served in configured order.
4. **Jumbo work never overlaps latency-sensitive work.** A request is jumbo when flagged or when
   any unit's prediction exceeds ``jumbo_threshold_s``. While jumbo work is in flight,
   non-jumbo requests of latency-sensitive classes wait; while those are in flight, jumbo work
   waits. So a jumbo is not starved, once a jumbo has headed its queue for
   ``jumbo_drain_after_s``, new latency-sensitive work waits too, letting the pool drain.
5. **Refunds never license optimism.** ``refund`` and ``release`` return at most what the
   request still holds: measured-below-predicted is recorded as realized savings, and no budget
   ever shows more room than its cap.

Pure logic: time comes from an injected clock, nothing sleeps. Waiters move only in
``pump()`` (which ``release``, ``refund`` and ``cancel`` call), and the events it returns are how
the caller learns of them. Thread-safe.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from fastvideo3.errors import FailedPrecondition, InvalidRequest, NotFound, ResourceExhausted

_EPS = 1e-9


@dataclass(frozen=True)
class Reservation:
    """What one unit (or a request, summed) holds while in flight."""

    gpu_seconds: float
    resident_bytes: int = 0
    peak_bytes: int = 0

    @property
    def memory_bytes(self) -> int:
        return self.resident_bytes + self.peak_bytes

    @classmethod
    def of(cls, prediction: Any) -> "Reservation":
        """From a cost-model Prediction (anything with the three fields)."""
        return cls(prediction.gpu_seconds, prediction.resident_bytes, prediction.peak_bytes)

    @classmethod
    def total(cls, units: Iterable["Reservation"]) -> "Reservation":
        units = list(units)
        return cls(sum(u.gpu_seconds for u in units), sum(u.resident_bytes for u in units),
                   sum(u.peak_bytes for u in units))


@dataclass(frozen=True)
class SloClass:
    name: str
    compute_budget_s: float  # predicted GPU-seconds in flight at once
    queue_bound: int = 64  # waiters beyond this are refused
    max_wait_s: float = 60.0  # a waiter older than this is refused
    latency_sensitive: bool = False  # never co-scheduled with jumbo work


@dataclass(frozen=True)
class AdmissionConfig:
    memory_budget_bytes: int
    classes: tuple[SloClass, ...] = (
        SloClass("interactive", compute_budget_s=8.0, queue_bound=32, max_wait_s=10.0, latency_sensitive=True),
        SloClass("batch", compute_budget_s=120.0, queue_bound=256, max_wait_s=600.0),
    )
    jumbo_threshold_s: float = 5.0
    jumbo_drain_after_s: float | None = 2.0  # None: never hold latency-sensitive work for a jumbo
    drain_rate: float = 1.0  # GPU-seconds retired per second (about the pool's device count)
    min_retry_after_s: float = 0.1


@dataclass(frozen=True)
class _Decision:
    """What every outcome names: the request it decides and the SLO class it was asked under."""

    request_id: str
    slo_class: str


@dataclass(frozen=True)
class Admitted(_Decision):
    reservation: Reservation
    jumbo: bool = False


@dataclass(frozen=True)
class Wait(_Decision):
    ahead: int  # waiters of the same class in front of it
    reason: str  # "queue", "compute", "memory" or "jumbo"


@dataclass(frozen=True)
class Refused(_Decision):
    retry_after_s: float | None  # None: retrying the same request can never succeed
    error: ResourceExhausted


Outcome = Admitted | Wait | Refused


@dataclass
class _Entry:
    request_id: str
    cls: SloClass
    reservation: Reservation  # as admitted; never changes
    held: Reservation  # what it still holds (refunds lower it)
    jumbo: bool
    since: float  # enqueue (waiting) or admission (in flight) time


@dataclass
class ClassCounters:
    """Per-class numbers for metrics. Totals only grow; the rest are current values."""

    admitted: int = 0
    refused: int = 0
    expired: int = 0
    cancelled: int = 0
    waiting: int = 0
    in_flight: int = 0
    reserved_gpu_seconds: float = 0.0
    reserved_bytes: int = 0
    refunded_gpu_seconds: float = 0.0  # handed back early through refund()
    measured_savings_s: float = 0.0  # reserved minus measured, at release, when positive
    overrun_s: float = 0.0  # measured minus reserved, at release, when positive


@dataclass
class _ClassState:
    cls: SloClass
    queue: deque[_Entry] = field(default_factory=deque)
    counters: ClassCounters = field(default_factory=ClassCounters)


class AdmissionController:
    """The reservation gate of one pool (see the module docstring for its rules)."""

    def __init__(self, config: AdmissionConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        if config.memory_budget_bytes <= 0:
            raise InvalidRequest("memory budget must be positive", field="memory_budget_bytes", limit="> 0")
        if not config.classes or len({c.name for c in config.classes}) != len(config.classes):
            raise InvalidRequest("SLO classes must be non-empty and uniquely named", field="classes")
        self.config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._classes: dict[str, _ClassState] = {c.name: _ClassState(c) for c in config.classes}
        self._waiting: dict[str, _Entry] = {}
        self._in_flight: dict[str, _Entry] = {}
        self._memory_reserved = 0

    # -- the gate --------------------------------------------------------------------------

    def try_admit(self, request_id: str, units: list[Reservation], slo_class: str = "batch",
                  jumbo: bool = False) -> Outcome:
        """Admit now, queue, or refuse. Asking again for a waiter reports its place (its units
        are not re-read); asking for a request already in flight is a FailedPrecondition."""
        with self._lock:
            if request_id in self._in_flight:
                raise FailedPrecondition(f"request {request_id!r} is already admitted",
                                         field="request_id", request_id=request_id)
            if request_id in self._waiting:
                entry = self._waiting[request_id]
                return Wait(request_id, entry.cls.name, self._ahead(entry), self._blocker(entry))
            state = self._class(slo_class)
            total = self._validate(units)
            is_jumbo = jumbo or any(u.gpu_seconds > self.config.jumbo_threshold_s for u in units)
            entry = _Entry(request_id, state.cls, total, total, is_jumbo, self._clock())
            never = self._never_fits(entry, units)
            if never is not None:
                state.counters.refused += 1
                return never
            if not state.queue and self._blocker(entry) == "":
                return self._admit(entry)
            if len(state.queue) >= state.cls.queue_bound:
                state.counters.refused += 1
                return self._refuse(entry, "queue", f"queue full: {len(state.queue)} waiting",
                                    str(state.cls.queue_bound), extra_s=total.gpu_seconds)
            state.queue.append(entry)
            self._waiting[request_id] = entry
            state.counters.waiting += 1
            return Wait(request_id, state.cls.name, len(state.queue) - 1, self._blocker(entry) or "queue")

    def pump(self) -> list[Admitted | Refused]:
        """Refuse waiters past ``max_wait_s``, then admit queue heads that now fit, classes in
        configured order, strictly FIFO within a class. Returns what changed."""
        with self._lock:
            now = self._clock()
            events: list[Admitted | Refused] = []
            for state in self._classes.values():
                for entry in [e for e in state.queue if now - e.since > state.cls.max_wait_s]:
                    self._dequeue(entry)
                    state.counters.expired += 1
                    state.counters.refused += 1
                    events.append(self._refuse(entry, "wait", f"waited {now - entry.since:.1f}s",
                                               f"{state.cls.max_wait_s}s", extra_s=entry.reservation.gpu_seconds))
            for state in self._classes.values():
                while state.queue and self._blocker(state.queue[0]) == "":
                    entry = state.queue[0]
                    self._dequeue(entry)
                    events.append(self._admit(entry))
            return events

    def release(self, request_id: str, measured_gpu_seconds: float | None = None) -> list[Admitted | Refused]:
        """Return everything the request still holds; exactly once per admitted request.

        ``measured_gpu_seconds`` feeds the savings and overrun counters only: the budget gets
        back what was held, never more, however fast the work turned out to be."""
        with self._lock:
            entry = self._in_flight.pop(request_id, None)
            if entry is None:
                raise NotFound(f"request {request_id!r} holds no reservation", field="request_id",
                               request_id=request_id)
            self._give_back(entry, entry.held)
            counters = self._classes[entry.cls.name].counters
            counters.in_flight -= 1
            if measured_gpu_seconds is not None and math.isfinite(measured_gpu_seconds):
                delta = entry.reservation.gpu_seconds - measured_gpu_seconds
                counters.measured_savings_s += max(0.0, delta)
                counters.overrun_s += max(0.0, -delta)
            return self.pump()

    def refund(self, request_id: str, gpu_seconds: float = 0.0, resident_bytes: int = 0,
               peak_bytes: int = 0) -> list[Admitted | Refused]:
        """Give back part of an in-flight reservation (work that turned out cheaper: a skipped
        step, an early stop). Clamped to what the request still holds."""
        with self._lock:
            entry = self._in_flight.get(request_id)
            if entry is None:
                raise NotFound(f"request {request_id!r} holds no reservation", field="request_id",
                               request_id=request_id)
            held = entry.held
            back = Reservation(min(max(0.0, gpu_seconds), held.gpu_seconds),
                               min(max(0, resident_bytes), held.resident_bytes),
                               min(max(0, peak_bytes), held.peak_bytes))
            entry.held = Reservation(held.gpu_seconds - back.gpu_seconds,
                                     held.resident_bytes - back.resident_bytes,
                                     held.peak_bytes - back.peak_bytes)
            self._give_back(entry, back)
            self._classes[entry.cls.name].counters.refunded_gpu_seconds += back.gpu_seconds
            return self.pump()

    def cancel(self, request_id: str) -> list[Admitted | Refused]:
        """Withdraw a waiter, or release an in-flight request. Unknown ids are NotFound."""
        with self._lock:
            entry = self._waiting.get(request_id)
            if entry is not None:
                self._dequeue(entry)
                self._classes[entry.cls.name].counters.cancelled += 1
                return self.pump()
            if request_id in self._in_flight:
                self._classes[self._in_flight[request_id].cls.name].counters.cancelled += 1
                return self.release(request_id)
            raise NotFound(f"request {request_id!r} is neither waiting nor admitted",
                           field="request_id", request_id=request_id)

    # -- introspection ---------------------------------------------------------------------

    def is_in_flight(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._in_flight

    def is_waiting(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._waiting

    def in_flight_ids(self) -> list[str]:
        with self._lock:
            return list(self._in_flight)

    def counters(self) -> dict[str, Any]:
        """A snapshot for metrics export (plain numbers, JSON-safe)."""
        with self._lock:
            return {
                "memory_budget_bytes": self.config.memory_budget_bytes,
                "memory_reserved_bytes": self._memory_reserved,
                "jumbo_in_flight": sum(1 for e in self._in_flight.values() if e.jumbo),
                "classes": {
                    name: {**vars(s.counters), "compute_budget_s": s.cls.compute_budget_s}
                    for name, s in self._classes.items()
                },
            }

    # -- internals -------------------------------------------------------------------------

    def _class(self, name: str) -> _ClassState:
        state = self._classes.get(name)
        if state is None:
            raise InvalidRequest(f"unknown SLO class {name!r}", field="slo_class",
                                 limit=", ".join(self._classes))
        return state

    @staticmethod
    def _validate(units: list[Reservation]) -> Reservation:
        if not units:
            raise InvalidRequest("a request must reserve at least one unit", field="units", limit=">= 1")
        for u in units:
            if not (math.isfinite(u.gpu_seconds) and u.gpu_seconds >= 0
                    and u.resident_bytes >= 0 and u.peak_bytes >= 0):
                raise InvalidRequest(f"invalid reservation {u}", field="units",
                                     limit="finite, non-negative")
        return Reservation.total(units)

    def _never_fits(self, entry: _Entry, units: list[Reservation]) -> Refused | None:
        budget = self.config.memory_budget_bytes
        worst = max(u.peak_bytes for u in units)
        if worst > budget:
            return self._refuse(entry, "memory", f"a unit's peak activation memory ({worst} B) exceeds "
                                "the pool's memory budget", f"{budget} B", never=True)
        if entry.reservation.memory_bytes > budget:
            return self._refuse(entry, "memory", f"resident + peak memory ({entry.reservation.memory_bytes}"
                                " B) exceeds the pool's memory budget", f"{budget} B", never=True)
        if entry.reservation.gpu_seconds > entry.cls.compute_budget_s * (1 + _EPS):
            return self._refuse(entry, "compute", f"{entry.reservation.gpu_seconds:.3g} predicted "
                                f"GPU-seconds exceed the {entry.cls.name!r} class budget",
                                f"{entry.cls.compute_budget_s} GPU-s", never=True)
        return None

    def _blocker(self, entry: _Entry) -> str:
        """Why ``entry`` cannot be admitted right now ("" when it can)."""
        state = self._classes[entry.cls.name]
        need = entry.reservation
        if state.counters.reserved_gpu_seconds + need.gpu_seconds > entry.cls.compute_budget_s * (1 + _EPS):
            return "compute"
        if self._memory_reserved + need.memory_bytes > self.config.memory_budget_bytes:
            return "memory"
        if entry.jumbo:
            if any(e.cls.latency_sensitive and not e.jumbo for e in self._in_flight.values()):
                return "jumbo"
        elif entry.cls.latency_sensitive:
            if any(e.jumbo for e in self._in_flight.values()) or self._draining_for_jumbo(entry):
                return "jumbo"
        return ""

    def _draining_for_jumbo(self, entry: _Entry) -> bool:
        """True when a jumbo has headed its queue for ``jumbo_drain_after_s`` and holding
        latency-sensitive work would help it in: it is not stuck on its own class's budget."""
        after = self.config.jumbo_drain_after_s
        if after is None:
            return False
        now = self._clock()
        for state in self._classes.values():
            head = state.queue[0] if state.queue else None
            if (head is not None and head is not entry and head.jumbo and now - head.since >= after
                    and self._blocker(head) != "compute"):
                return True
        return False

    def _ahead(self, entry: _Entry) -> int:
        return self._classes[entry.cls.name].queue.index(entry)

    def _admit(self, entry: _Entry) -> Admitted:
        state = self._classes[entry.cls.name]
        entry.since = self._clock()
        self._in_flight[entry.request_id] = entry
        state.counters.admitted += 1
        state.counters.in_flight += 1
        state.counters.reserved_gpu_seconds += entry.held.gpu_seconds
        state.counters.reserved_bytes += entry.held.memory_bytes
        self._memory_reserved += entry.held.memory_bytes
        return Admitted(entry.request_id, entry.cls.name, entry.reservation, entry.jumbo)

    def _give_back(self, entry: _Entry, back: Reservation) -> None:
        # Clamp at zero: float round-off must never show more room than the cap.
        c = self._classes[entry.cls.name].counters
        c.reserved_gpu_seconds = max(0.0, c.reserved_gpu_seconds - back.gpu_seconds)
        if not any(e.cls is entry.cls for e in self._in_flight.values()):
            c.reserved_gpu_seconds = 0.0  # the class is idle: drop accumulated round-off
        c.reserved_bytes = max(0, c.reserved_bytes - back.memory_bytes)
        self._memory_reserved = max(0, self._memory_reserved - back.memory_bytes)

    def _dequeue(self, entry: _Entry) -> None:
        state = self._classes[entry.cls.name]
        state.queue.remove(entry)
        del self._waiting[entry.request_id]
        state.counters.waiting -= 1

    def _refuse(self, entry: _Entry, what: str, message: str, limit: str, *, extra_s: float = 0.0,
                never: bool = False) -> Refused:
        retry = None if never else self._retry_after(entry.cls, extra_s)
        error = ResourceExhausted(message, field=what, limit=limit, retry_after_s=retry,
                                  request_id=entry.request_id,
                                  details={"slo_class": entry.cls.name})
        return Refused(entry.request_id, entry.cls.name, retry, error)

    def _retry_after(self, cls: SloClass, extra_s: float) -> float:
        """Seconds until the class could plausibly hold this work behind everything queued:
        the backlog above the budget, retired at ``drain_rate`` GPU-seconds per second."""
        state = self._classes[cls.name]
        queued = sum(e.reservation.gpu_seconds for e in state.queue)
        backlog = state.counters.reserved_gpu_seconds + queued + extra_s - cls.compute_budget_s
        return max(self.config.min_retry_after_s, backlog / self.config.drain_rate)
