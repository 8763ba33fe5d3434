"""The StateStore seam: where the scheduler keeps what it needs to resume a request.

The scheduler checkpoints each request's small, serializable LoopState here at step
boundaries. After a scheduler restart, :meth:`StateStore.list_inflight` names the requests
that had not ended, and :meth:`StateStore.load_checkpoint` gives back the last step each one
reached. Tensors never come here: a LoopState names pool-resident regions by reference.

Two backends implement the protocol: :class:`~fastvideo3.state.memory.MemoryStateStore`
(embedded mode, tests) and :class:`~fastvideo3.state.redis_store.RedisStateStore` (a fleet).
:func:`fastvideo3.state.make_store` picks one from a URL.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from fastvideo3.errors import InvalidRequest

#: Status of a request that has been put and not yet ended.
INFLIGHT = "INFLIGHT"

#: Longest request id, artifact name or namespace the stores accept.
MAX_NAME_CHARS = 256


class Checkpoint(NamedTuple):
    """The latest checkpoint of one request: the step it was taken after, and the LoopState bytes."""

    step: int
    loop_state: bytes


@dataclass(frozen=True)
class StoreConfig:
    """Settings shared by every backend.

    ``namespace`` prefixes every key, so deployments sharing one server never see each other's
    requests. ``ttl_after_end_s`` is how long an ended request's keys stay readable (for status
    queries) before they expire. ``timeout_s`` bounds each network operation (connect, send,
    receive); a call against a hung store raises ``Unavailable`` after about one of these, and
    against a stopped one at once (one immediate reconnect is allowed, so a restarted server is
    picked up by the next call).
    """

    namespace: str = "fastvideo3"
    ttl_after_end_s: float = 3600.0
    timeout_s: float = 2.0

    def __post_init__(self) -> None:
        check_name(self.namespace, "namespace")
        if not (math.isfinite(self.ttl_after_end_s) and self.ttl_after_end_s > 0):
            raise InvalidRequest(
                f"must be a positive number of seconds, got {self.ttl_after_end_s!r}",
                field="state.ttl_after_end_s", limit="> 0",
            )
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise InvalidRequest(
                f"must be a positive number of seconds, got {self.timeout_s!r}",
                field="state.timeout_s", limit="> 0",
            )


@runtime_checkable
class StateStore(Protocol):
    """Per-request durable state: metadata, the latest LoopState checkpoint, artifact records.

    Contract (both backends; the shared contract tests hold them to it):

    * **Namespaced.** Every key starts with ``config.namespace``; two stores with different
      namespaces on one server share nothing, including the in-flight set.
    * **Lifecycle.** ``put_request`` registers a request and puts it in flight. It replaces any
      earlier request with the same id: old metadata, checkpoint, artifacts, terminal status and
      expiry are discarded (this is how an id is reused). Resuming after a restart must *not*
      call it again; it reads ``list_inflight`` / ``get_request`` / ``load_checkpoint``.
      ``end_request`` moves an in-flight request to a terminal status exactly once, removes it
      from the in-flight set and gives all its keys a ``ttl_after_end_s`` expiry.
      ``delete_request`` removes everything at once, in any state.
    * **Writes only while in flight.** ``checkpoint`` and ``put_artifact`` write nothing and
      return False unless the request is in flight, so a step that finishes after its request was
      cancelled or deleted cannot leave an orphaned key behind.
    * **Atomic checkpoints.** A reader sees either the previous checkpoint or the new one, never
      a mix of one's step and the other's bytes. Only the latest written checkpoint is kept
      (last write wins; steps are recorded, not compared).
    * **Fail fast.** A store that cannot be reached raises ``fastvideo3.errors.Unavailable``
      naming the store's address, within the bound set by ``config.timeout_s``; no call hangs.
      Malformed ids, names or metadata raise ``InvalidRequest`` before any I/O.
    * **Copies out.** Returned dicts are fresh copies; metadata must be JSON-serializable.
    * **Restart-safe.** A new store object on the same server (or the same
      ``MemoryData``) sees everything the old one wrote.
    """

    config: StoreConfig

    @property
    def address(self) -> str:
        """Where the store lives, for messages (never includes a password)."""
        ...

    def put_request(self, request_id: str, meta: dict[str, Any]) -> None:
        """Register ``request_id`` with ``meta`` and put it in flight (replacing any earlier one)."""
        ...

    def get_request(self, request_id: str) -> dict[str, Any] | None:
        """The metadata given to ``put_request``, or None if unknown, deleted or expired."""
        ...

    def status(self, request_id: str) -> str | None:
        """``INFLIGHT``, the terminal status given to ``end_request``, or None if unknown."""
        ...

    def checkpoint(self, request_id: str, step: int, loop_state: bytes) -> bool:
        """Atomically replace the request's checkpoint. False (nothing written) if not in flight."""
        ...

    def load_checkpoint(self, request_id: str) -> Checkpoint | None:
        """The latest checkpoint as ``(step, loop_state)``, or None if there is none."""
        ...

    def put_artifact(self, request_id: str, name: str, meta: dict[str, Any]) -> bool:
        """Record (or replace) artifact ``name``. False (nothing written) if not in flight."""
        ...

    def artifacts(self, request_id: str) -> dict[str, dict[str, Any]]:
        """Every artifact record of the request, by name (empty if none)."""
        ...

    def list_inflight(self) -> list[str]:
        """Ids of the requests put and not yet ended or deleted, sorted."""
        ...

    def end_request(self, request_id: str, status: str, info: dict[str, Any] | None = None) -> bool:
        """Mark the request terminal with ``status`` (and ``info``: e.g. its error, JSON); True if
        this call ended it.

        Ending a request that is already ended, deleted or unknown changes nothing and returns
        False: a request has exactly one terminal status.
        """
        ...

    def end_info(self, request_id: str) -> dict[str, Any] | None:
        """The ``info`` given to ``end_request`` (None if not ended, or none was given)."""
        ...

    def put_media(self, request_id: str, name: str, data: bytes) -> bool:
        """Keep a finished output's bytes (it expires with the request). False if not in flight."""
        ...

    def media(self, request_id: str, name: str) -> bytes | None:
        """The bytes given to ``put_media``, or None."""
        ...

    def acquire_lease(self, name: str, owner: str, ttl_s: float) -> str:
        """Take the lease ``name`` for ``owner`` if it is free, or extend it if ``owner`` holds it
        (one atomic step); returns the holder after the call ("" if none)."""
        ...

    def lease_holder(self, name: str) -> str:
        """Who holds the lease ``name`` now ("" if nobody)."""
        ...

    def release_lease(self, name: str, owner: str) -> None:
        """Give the lease up if ``owner`` holds it."""
        ...

    def delete_request(self, request_id: str) -> None:
        """Remove every key of the request and drop it from the in-flight set. Idempotent."""
        ...

    def keys_for(self, request_id: str) -> list[str]:
        """The store keys that currently exist for this request (for resource-balance checks)."""
        ...

    def ping(self) -> None:
        """Return if the store answers; raise ``Unavailable`` otherwise."""
        ...

    def close(self) -> None:
        """Release connections. Further calls raise ``Unavailable``. Idempotent."""
        ...


# --- helpers shared by the backends ------------------------------------------------------


class StoreLayout:
    """The key layout both backends share (see the Redis module's docstring), under the store's
    ``config.namespace``, and the checked, encoded form of each value written: each key is built
    from an id or name checked first, and each write's input is checked and encoded here, so both
    backends refuse the same input, store the same forms and ``keys_for`` names the same keys."""

    config: StoreConfig

    def _keys(self, request_id: str) -> tuple[str, str, str]:
        """The (meta, checkpoint, artifacts) keys of one request."""
        base = f"{self.config.namespace}:req:{check_name(request_id, 'request_id')}"
        return f"{base}:meta", f"{base}:ckpt", f"{base}:artifacts"

    def _media_key(self, request_id: str) -> str:
        """The hash of a request's finished outputs (name -> bytes); it expires with the request."""
        return f"{self.config.namespace}:req:{check_name(request_id, 'request_id')}:media"

    def _all_keys(self, request_id: str) -> tuple[str, str, str, str]:
        """Every key of one request: meta, checkpoint, artifacts and media."""
        return (*self._keys(request_id), self._media_key(request_id))

    def _lease_key(self, name: str) -> str:
        return f"{self.config.namespace}:lease:{check_name(name, 'lease')}"

    @property
    def _inflight_key(self) -> str:
        return f"{self.config.namespace}:inflight"

    def _checkpoint_of(self, step: Any, loop_state: Any) -> Checkpoint:
        return Checkpoint(check_step(step), check_blob(loop_state))

    def _artifact_text(self, name: Any, meta: Any) -> str:
        check_name(name, "artifact")
        return encode_meta(meta, "artifact_meta")

    def _end_text(self, status: Any, info: Any) -> str | None:
        """The end record's JSON text (None without ``info``), after checking ``status``."""
        check_status(status)
        return encode_meta(info, "end_info") if info is not None else None

    def _media_blob(self, name: Any, data: Any) -> bytes:
        check_name(name, "media")
        return check_blob(data)

    def _owner(self, owner: Any) -> str:
        return check_name(owner, "owner")


def check_name(value: Any, field: str) -> str:
    """Validate an id, artifact name or namespace: a non-empty printable string, no whitespace."""
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"must be a non-empty string, got {value!r}", field=field)
    if len(value) > MAX_NAME_CHARS:
        raise InvalidRequest(
            f"is {len(value)} characters long", field=field, limit=f"<= {MAX_NAME_CHARS} characters",
        )
    if not value.isprintable() or any(ch.isspace() for ch in value):
        raise InvalidRequest(f"must be printable with no whitespace, got {value!r}", field=field)
    return value


def check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidRequest(f"must be a non-negative int, got {step!r}", field="step", limit=">= 0")
    return step


def check_blob(loop_state: Any) -> bytes:
    if not isinstance(loop_state, (bytes, bytearray, memoryview)):
        raise InvalidRequest(
            f"must be bytes, got {type(loop_state).__name__}", field="loop_state",
        )
    return bytes(loop_state)


def check_status(status: Any) -> str:
    check_name(status, "status")
    if status == INFLIGHT:
        raise InvalidRequest(f"{INFLIGHT!r} is not a terminal status", field="status")
    return status


def encode_meta(meta: Any, field: str = "meta") -> str:
    """JSON text of a metadata dict; both backends store this form, so both reject the same input."""
    if not isinstance(meta, dict):
        raise InvalidRequest(f"must be a dict, got {type(meta).__name__}", field=field)
    try:
        return json.dumps(meta, sort_keys=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"must be JSON-serializable: {exc}", field=field) from None


def decode_meta(text: str | bytes) -> dict[str, Any]:
    return json.loads(text)
