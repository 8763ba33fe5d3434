"""The pool executor protocol. The same executor object serves embedded mode (called directly)
and a role-pool service (called by its gRPC servicer)."""
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
