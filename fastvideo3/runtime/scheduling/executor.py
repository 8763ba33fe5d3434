"""The pool executor protocol. The same executor object serves embedded mode (called directly)
and a role-pool service (called by its gRPC servicer); the scheduler holds a list of them per role
(local executors, or services/scheduler/remote.py's stubs of remote replicas).

:class:`Executor` is the contract every one keeps. The optional parts are protocols of their
own, asked with ``isinstance`` (all are ``runtime_checkable``), never by probing names:

* :class:`Resumable`: its pool keeps per-request state it can snapshot and restore (the denoiser);
* :class:`Monitored`: it reports ``healthy`` (a remote replica the scheduler watches); one that
  does not is taken as healthy;
* :class:`Addressed`: it stands for a replica elsewhere (an address and a replica id);
* :class:`Fingerprinted`: it knows the runtime fingerprint its snapshots are bound to;
* :class:`CarriesReleases`: its Execute call can carry ids of ended requests to free first;
* :class:`Identified`: it has a model-runtime identity (what a pool's fingerprint is made of);
* :class:`TakesAdapters`: it loads and unloads LoRA adapters while serving;
* :class:`PullsInputs`: it pulls its inputs from other pools, under ``fetch_deadline_s``;
* :class:`Prefetches`: it can pull a batch's inputs before it takes its step lock.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from fastvideo3.loop.protocol import StepResult
from fastvideo3.runtime.scheduling.workunit import WorkUnit


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


@runtime_checkable
class Monitored(Protocol):
    """An executor whose replica can be lost: ``healthy`` follows its health checks (and is set
    False by the scheduler when a dispatch to it failed)."""

    healthy: bool


@runtime_checkable
class Addressed(Protocol):
    """An executor standing for a replica elsewhere: ``target`` is its address, ``replica_id``
    its name (from Describe; the address until then)."""

    target: str
    replica_id: str


@runtime_checkable
class Fingerprinted(Protocol):
    """An executor that knows its replica's runtime fingerprint (from Describe)."""

    fingerprint: str


@runtime_checkable
class CarriesReleases(Protocol):
    """An executor whose Execute can carry the ids of ended requests: the replica frees them
    on receipt, before it runs the batch (no Release call of its own)."""

    def execute_after_release(self, finished_request_ids: list[str], batch: list[WorkUnit]) -> list[StepResult]:
        """Free ``finished_request_ids`` (idempotent), then run ``batch`` as :meth:`Executor.execute`."""


@runtime_checkable
class Identified(Protocol):
    """An executor with a model-runtime identity (fastvideo3.runtime.pool.resident.pool_identity)."""

    @property
    def identity(self) -> Any: ...


@runtime_checkable
class TakesAdapters(Protocol):
    def load_adapter(self, adapter_id: str, path: str | None = None, tensors: dict | None = None) -> dict: ...

    def unload_adapter(self, adapter_id: str, wait_s: float = 0.0) -> list[str]: ...


@runtime_checkable
class PullsInputs(Protocol):
    fetch_deadline_s: float


@runtime_checkable
class Prefetches(Protocol):
    """An executor that can pull a batch's inputs before it runs the batch (outside its step
    lock), so a batch queued behind the running one starts with its inputs in place."""

    def prefetch(self, batch: list[WorkUnit]) -> None: ...


def is_resumable(executor: object) -> bool:
    return isinstance(executor, Resumable)


def is_healthy(executor: object) -> bool:
    """False only for an executor that says it is not; one that is not :class:`Monitored` is."""
    return not isinstance(executor, Monitored) or executor.healthy is not False


def replica_name(executor: object, default: str = "") -> str:
    """How errors name the replica: its id, else its address, else ``default`` (a local executor)."""
    if isinstance(executor, Addressed):
        return str(executor.replica_id or executor.target or default)
    return default


def fingerprint_of(executor: object) -> str:
    """The runtime fingerprint a snapshot from ``executor`` is bound to ("" when it does not say)."""
    return str(executor.fingerprint or "") if isinstance(executor, Fingerprinted) else ""


__all__ = ["Addressed", "CarriesReleases", "Executor", "Fingerprinted", "Identified", "Monitored", "Prefetches", "PullsInputs",
           "Resumable", "TakesAdapters", "fingerprint_of", "is_healthy", "is_resumable", "replica_name"]
