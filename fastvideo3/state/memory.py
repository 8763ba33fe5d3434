"""In-process StateStore for embedded mode and tests.

It keeps the same key layout as the Redis backend (so ``keys_for`` names the same keys) in a
:class:`MemoryData` object. Several store objects may share one ``MemoryData``: that is how tests
model a scheduler restart. Expiry is lazy: an expired key disappears the next time any call
looks at the store, measured on an injectable clock.
"""
from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fastvideo3.errors import Unavailable
from fastvideo3.state.base import INFLIGHT, Checkpoint, StoreConfig, StoreLayout, decode_meta, encode_meta

Clock = Callable[[], float]


@dataclass
class MemoryData:
    """The backing of one or more memory stores: key -> value, key -> expiry time, one lock.

    Values are ``dict`` (hashes), ``set`` (the in-flight set) or ``Checkpoint``. ``deadlines``
    is a heap of (expiry time, key) so a sweep touches only what is due; an entry whose time
    no longer matches ``expires_at`` is stale and skipped.
    """

    values: dict[str, Any] = field(default_factory=dict)
    expires_at: dict[str, float] = field(default_factory=dict)
    deadlines: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)


class MemoryStateStore(StoreLayout):
    """A thread-safe StateStore held in process memory. See ``StateStore`` for the contract."""

    def __init__(
        self,
        config: StoreConfig | None = None,
        *,
        data: MemoryData | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.config = config or StoreConfig()
        self._data = data if data is not None else MemoryData()
        self._clock = clock
        self._closed = False

    @property
    def address(self) -> str:
        return f"memory://{self.config.namespace}"

    # --- internals (call with the lock held) ---------------------------------------------

    def _open(self) -> MemoryData:
        if self._closed:
            raise Unavailable(f"state store at {self.address} is closed")
        return self._data

    def _sweep(self, data: MemoryData) -> None:
        now = self._clock()
        while data.deadlines and data.deadlines[0][0] <= now:
            deadline, key = heapq.heappop(data.deadlines)
            if data.expires_at.get(key) == deadline:
                del data.expires_at[key]
                data.values.pop(key, None)

    def _locked(self) -> MemoryData:
        data = self._open()
        self._sweep(data)
        return data

    def _add_inflight(self, data: MemoryData, request_id: str) -> None:
        data.values.setdefault(self._inflight_key, set()).add(request_id)

    def _drop_inflight(self, data: MemoryData, request_id: str) -> None:
        key = self._inflight_key
        members = data.values.get(key)
        if members is not None:
            members.discard(request_id)
            if not members:  # like Redis: an empty set is no key at all
                del data.values[key]

    def _is_inflight(self, data: MemoryData, meta_key: str) -> bool:
        record = data.values.get(meta_key)
        return record is not None and record["status"] == INFLIGHT

    def _if_inflight(self, meta_key: str, write: Callable[[MemoryData], None]) -> bool:
        """Run ``write(data)`` under the lock only if the request is in flight; True if it ran."""
        with self._data.lock:
            data = self._locked()
            if not self._is_inflight(data, meta_key):
                return False
            write(data)
            return True

    # --- the protocol ----------------------------------------------------------------------

    def put_request(self, request_id: str, meta: dict[str, Any]) -> None:
        meta_key, ckpt_key, art_key = self._keys(request_id)
        text = encode_meta(meta)
        with self._data.lock:
            data = self._locked()
            for key in (meta_key, ckpt_key, art_key, self._media_key(request_id)):
                data.values.pop(key, None)
                data.expires_at.pop(key, None)
            data.values[meta_key] = {"meta": text, "status": INFLIGHT}
            self._add_inflight(data, request_id)

    def get_request(self, request_id: str) -> dict[str, Any] | None:
        meta_key, _, _ = self._keys(request_id)
        with self._data.lock:
            record = self._locked().values.get(meta_key)
            return None if record is None else decode_meta(record["meta"])

    def status(self, request_id: str) -> str | None:
        meta_key, _, _ = self._keys(request_id)
        with self._data.lock:
            record = self._locked().values.get(meta_key)
            return None if record is None else record["status"]

    def checkpoint(self, request_id: str, step: int, loop_state: bytes) -> bool:
        meta_key, ckpt_key, _ = self._keys(request_id)
        snapshot = self._checkpoint_of(step, loop_state)

        def write(data: MemoryData) -> None:
            data.values[ckpt_key] = snapshot

        return self._if_inflight(meta_key, write)

    def load_checkpoint(self, request_id: str) -> Checkpoint | None:
        _, ckpt_key, _ = self._keys(request_id)
        with self._data.lock:
            return self._locked().values.get(ckpt_key)

    def put_artifact(self, request_id: str, name: str, meta: dict[str, Any]) -> bool:
        meta_key, _, art_key = self._keys(request_id)
        text = self._artifact_text(name, meta)
        return self._if_inflight(meta_key, lambda data: data.values.setdefault(art_key, {}).update({name: text}))

    def artifacts(self, request_id: str) -> dict[str, dict[str, Any]]:
        _, _, art_key = self._keys(request_id)
        with self._data.lock:
            records = self._locked().values.get(art_key, {})
            return {name: decode_meta(text) for name, text in records.items()}

    def list_inflight(self) -> list[str]:
        with self._data.lock:
            return sorted(self._locked().values.get(self._inflight_key, ()))

    def end_request(self, request_id: str, status: str, info: dict[str, Any] | None = None) -> bool:
        keys = self._all_keys(request_id)
        end = self._end_text(status, info)

        def write(data: MemoryData) -> None:
            data.values[keys[0]]["status"] = status
            if end is not None:
                data.values[keys[0]]["end"] = end
            deadline = self._clock() + self.config.ttl_after_end_s
            for key in keys:
                if key in data.values:
                    data.expires_at[key] = deadline
                    heapq.heappush(data.deadlines, (deadline, key))
            self._drop_inflight(data, request_id)

        return self._if_inflight(keys[0], write)

    def end_info(self, request_id: str) -> dict[str, Any] | None:
        meta_key, _, _ = self._keys(request_id)
        with self._data.lock:
            record = self._locked().values.get(meta_key)
            return None if record is None or "end" not in record else decode_meta(record["end"])

    def put_media(self, request_id: str, name: str, data: bytes) -> bool:
        meta_key, _, _ = self._keys(request_id)
        blob = self._media_blob(name, data)
        key = self._media_key(request_id)
        return self._if_inflight(meta_key, lambda values: values.values.setdefault(key, {}).update({name: blob}))

    def media(self, request_id: str, name: str) -> bytes | None:
        key = self._media_key(request_id)
        with self._data.lock:
            return self._locked().values.get(key, {}).get(name)

    def acquire_lease(self, name: str, owner: str, ttl_s: float) -> str:
        key = self._lease_key(name)
        self._owner(owner)
        with self._data.lock:
            data = self._locked()
            held = data.values.get(key)
            if held is None or held == owner:
                data.values[key] = owner
                deadline = self._clock() + ttl_s
                data.expires_at[key] = deadline
                heapq.heappush(data.deadlines, (deadline, key))
                return owner
            return held

    def lease_holder(self, name: str) -> str:
        key = self._lease_key(name)
        with self._data.lock:
            return self._locked().values.get(key) or ""

    def release_lease(self, name: str, owner: str) -> None:
        key = self._lease_key(name)
        with self._data.lock:
            data = self._locked()
            if data.values.get(key) == owner:
                data.values.pop(key, None)
                data.expires_at.pop(key, None)

    def delete_request(self, request_id: str) -> None:
        keys = self._all_keys(request_id)
        with self._data.lock:
            data = self._locked()
            for key in keys:
                data.values.pop(key, None)
                data.expires_at.pop(key, None)
            self._drop_inflight(data, request_id)

    def keys_for(self, request_id: str) -> list[str]:
        keys = self._all_keys(request_id)
        with self._data.lock:
            data = self._locked()
            return [key for key in keys if key in data.values]

    def ping(self) -> None:
        with self._data.lock:
            self._open()

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"MemoryStateStore({self.address!r})"
