"""What the scheduler keeps of a request (:class:`RequestRun`), the events it emits, and the
types the planner hands the dispatcher (:class:`Batch`, :class:`Ended`)."""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import ErrorInfo
from fastvideo3.loop import LoopDriver, RequestContext
from fastvideo3.request.schema import ResolvedRequest
from fastvideo3.runtime.scheduling.executor import Executor
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.vocab import LoopId, PROGRAM_LOOPS, Program, RunStatus, TERMINAL_STATUSES

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
    #: every (pool key, replica index) a unit of this request was sent to: what frees it at the end
    touched: set[tuple[str, int]] = field(default_factory=set)
    #: (pool key, replica index) its latest unit was sent to: where its next one likely goes
    last_replica: tuple[str, int] | None = None
    #: inline artifacts returned by pools (e.g. the encoded video), by loop id
    artifacts: dict[str, bytes] = field(default_factory=dict)
    #: rebuilt from a checkpoint by a restarted scheduler (no client stream until one re-attaches)
    resumed: bool = False
    #: a unit of this request is executing on a pool (it is not planned again, and cancel /
    #: deadline act when it returns: at the step boundary)
    in_flight: bool = False
    #: held at a step boundary while its checkpoint's snapshot is taken (nothing planned for it)
    snapshotting: bool = False
    #: a planned unit held back because its replica had no free slot (sent next round)
    pending: Any = None
    #: its priced work (GPU-seconds of its current unit times the unit's steps; 0: unpriced),
    #: which orders it against other requests wanting the same replica
    work_s: float = 0.0
    #: parked: its current loop waits for a healthy replica of this role (its last one was lost);
    #: until ``parked_until`` (the planner's clock), then it fails with ``parked_error``
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


@dataclass
class Batch:
    """Units of one batch key for one replica: what the dispatcher sends in one Execute."""

    units: list[tuple[WorkUnit, RequestRun]]
    pool: str  # the pool key (a role, or ``denoiser:<expert>``)
    replica: int | None  # index into the pool's replicas; None: no pool serves the role
    executor: Executor | None

    @property
    def work(self) -> list[WorkUnit]:
        return [u for u, _ in self.units]


@dataclass(frozen=True)
class Ended:
    """A request that reached a terminal state, and the replicas that may hold something of it."""

    request_id: str
    status: str
    replicas: tuple[tuple[str, int], ...]


__all__ = ["Batch", "Ended", "Event", "PROGRAM_T2V", "RETRYABLE_CODES", "RequestRun", "TERMINAL"]
