"""Inline results too large for one Execute reply, held in the pool until the scheduler reads them.

A decoder returns the encoded file (mp4, npy) of each request in its StepResult. An 81x480x832
clip as float32 ``.npy`` is ~390 MB and a batch of decodes adds up, while a gRPC message is bounded
(``services/common/server.py`` MAX_MESSAGE_BYTES). So the pool keeps every reply under
:data:`INLINE_REPLY_BYTES`: a result that would push the reply past it (or that alone exceeds
:data:`INLINE_RESULT_BYTES`) is put in this store and its StepResult names it
(``artifact_id``, ``artifact_bytes``) instead; the scheduler then streams it with
``RolePool.ReadArtifact`` in :data:`CHUNK_BYTES` chunks.

Nothing is held forever: an artifact is dropped once it has been read to the end, when its request
is released (Release, or ``finished_request_ids`` on the next Execute), or ``ttl_s`` after it was
stored (a scheduler that died before reading it). The store has a byte budget; a result that does
not fit once expired ones are gone fails its unit with ``RESOURCE_EXHAUSTED`` naming the budget.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

from fastvideo3.errors import ErrorInfo, NotFound, ResourceExhausted
from services.common import convert

#: the most bytes of inline results one Execute reply carries (the rest is held back)
INLINE_REPLY_BYTES = 32 << 20
#: a single inline result larger than this is always held back
INLINE_RESULT_BYTES = 16 << 20
#: ReadArtifact's chunk size
CHUNK_BYTES = 4 << 20
DEFAULT_BUDGET_BYTES = 8 << 30
DEFAULT_TTL_S = 600.0


@dataclass
class _Held:
    request_id: str
    data: bytes
    stored: float = field(default_factory=time.monotonic)


class ArtifactStore:
    """Held-back inline results by id (thread-safe); see the module docstring."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES, ttl_s: float = DEFAULT_TTL_S):
        self.budget_bytes = int(budget_bytes)
        self.ttl_s = float(ttl_s)
        self._held: dict[str, _Held] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.counters = {"artifacts_held": 0, "artifact_bytes_held": 0, "artifacts_read": 0,
                         "artifacts_expired": 0, "artifacts_released": 0}

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._held)

    def put(self, request_id: str, data: bytes) -> str:
        """Hold ``data`` for ``request_id``; returns its artifact id."""
        with self._lock:
            self._expire(time.monotonic())
            if self._bytes + len(data) > self.budget_bytes:
                raise ResourceExhausted(
                    f"a {len(data)}-byte result does not fit beside the {self._bytes} bytes of results not yet read",
                    field="artifact_budget_bytes", limit=str(self.budget_bytes), request_id=request_id)
            aid = f"art-{uuid.uuid4().hex}"
            self._held[aid] = _Held(request_id, data)
            self._bytes += len(data)
            self.counters["artifacts_held"] += 1
            self.counters["artifact_bytes_held"] += len(data)
            return aid

    def chunks(self, artifact_id: str, chunk_bytes: int = CHUNK_BYTES):
        """``(data, total_bytes)`` pairs of the artifact, in order; it is dropped after the last."""
        with self._lock:
            held = self._held.get(artifact_id)
        if held is None:
            raise NotFound(f"no held result {artifact_id!r} (read already, released or expired after "
                           f"{self.ttl_s:.0f} s)", field="artifact_id")
        view, total = memoryview(held.data), len(held.data)
        for start in range(0, max(total, 1), chunk_bytes):
            yield bytes(view[start:start + chunk_bytes]), total
        self._drop(artifact_id, "artifacts_read")

    def release(self, request_id: str) -> int:
        """Drop every artifact of ``request_id``; returns how many."""
        with self._lock:
            ids = [aid for aid, h in self._held.items() if h.request_id == request_id]
        for aid in ids:
            self._drop(aid, "artifacts_released")
        return len(ids)

    def _drop(self, artifact_id: str, counter: str) -> None:
        with self._lock:
            held = self._held.pop(artifact_id, None)
            if held is not None:
                self._bytes -= len(held.data)
                self.counters[counter] += 1

    def _expire(self, now: float) -> None:  # under the lock
        for aid in [aid for aid, h in self._held.items() if now - h.stored > self.ttl_s]:
            held = self._held.pop(aid)
            self._bytes -= len(held.data)
            self.counters["artifacts_expired"] += 1


def hold_back_large(results, store: ArtifactStore) -> None:
    """Move inline data out of wire StepResults (in place, in order) until the reply's inline bytes
    are within :data:`INLINE_REPLY_BYTES` and none alone exceeds :data:`INLINE_RESULT_BYTES`. A
    result that cannot be held fails with the store's error."""
    total = 0
    for r in results:
        n = len(r.inline_data)
        if not n:
            continue
        if n <= INLINE_RESULT_BYTES and total + n <= INLINE_REPLY_BYTES:
            total += n
            continue
        try:
            r.artifact_id = store.put(r.request_id, bytes(r.inline_data))
            r.artifact_bytes = n
        except ResourceExhausted as e:
            r.ok = False
            r.error.CopyFrom(convert.error_to_wire(ErrorInfo.of(e), r.request_id))
        r.inline_data = b""
