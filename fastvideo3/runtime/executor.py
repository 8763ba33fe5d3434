"""The pool executor protocol. The same executor object serves embedded mode (called directly)
and a role-pool service (called by its gRPC servicer); the scheduler holds a list of them per role
(local executors, or services/scheduler/remote.py's stubs of remote replicas).

An executor may also be :class:`Resumable` (its pool keeps per-request state it can snapshot and
restore: the denoiser) and may report :attr:`healthy` (a remote replica the scheduler watches).
:func:`is_resumable` and :func:`is_healthy` are how callers ask."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from fastvideo3.loop.protocol import StepResult
from fastvideo3.runtime.workunit import WorkUnit


@runtime_checkable
class Executor(Protocol):
    role: str

    def execute(self, batch: list[WorkUnit]) -> list[StepResult]:
        """Run a batch; return one StepResult per unit, in order. A unit's failure is reported in
        its own result (ok=False) and never fails its batch-mates."""

    def release(self, request_id: str) -> None:
        """Free everything held for the request (resident regions, published buffers). Idempotent."""

    def describe(self) -> dict:
        """Role, cards, counters (resident regions, cache stats), transport backends."""


@runtime_checkable
class Resumable(Protocol):
    """The optional part of an executor whose pool keeps resident per-request state."""

    def snapshot(self, request_id: str) -> bytes:
        """The request's state regions as one blob bound to this executor's runtime fingerprint."""

    def restore(self, request_id: str, blob: bytes) -> int | None:
        """Make the request's regions resident again from ``blob``; the step it was taken at."""


def is_resumable(executor: object) -> bool:
    return isinstance(executor, Resumable)


def is_healthy(executor: object) -> bool:
    """False only for an executor that says it is not (``healthy = False``); local ones do not say."""
    return getattr(executor, "healthy", True) is not False


__all__ = ["Executor", "Resumable", "is_healthy", "is_resumable"]
