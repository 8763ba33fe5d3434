"""Shared machinery of the transport backends: the owner's ledger of resident buffers
(keyed by request), counters, deadlines, and the buffer trailer used by slab backends.

Backends subclass :class:`TransportBase` and implement ``_publish`` / ``_fetch`` / ``_free``;
the base does validation, bookkeeping, checksum verification and error accounting, so every
backend counts and releases the same way.
"""
from __future__ import annotations

import itertools
import math
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from fastvideo3.errors import (
    DataLoss, DeadlineExceeded, FailedPrecondition, FastVideoError, InvalidRequest, NotFound,
)
from fastvideo3.transport import checksum as _checksum
from fastvideo3.transport.ref import TensorRef, dtype_name

# Slab buffers end with a 64-byte trailer after the data (data stays at offset 0, aligned):
# magic, generation, nbytes. A reader compares the generation with the ref's to tell a live
# buffer from a released-and-reused one (NotFound rather than a confusing DataLoss).
TRAILER_BYTES = 64
_TRAILER = struct.Struct("<8sQQ")
TRAILER_MAGIC = b"FV3TREF1"


def trailer_offset(nbytes: int) -> int:
    return (nbytes + TRAILER_BYTES - 1) // TRAILER_BYTES * TRAILER_BYTES


def slab_bytes_needed(nbytes: int) -> int:
    return trailer_offset(nbytes) + TRAILER_BYTES


def pack_trailer(generation: int, nbytes: int) -> bytes:
    return _TRAILER.pack(TRAILER_MAGIC, generation, nbytes).ljust(TRAILER_BYTES, b"\0")


def unpack_trailer(raw: bytes) -> tuple[bytes, int, int]:
    return _TRAILER.unpack_from(raw, 0)


class Deadline:
    """A point in monotonic time; ``deadline_s`` must be a positive finite number of seconds."""

    def __init__(self, deadline_s: float) -> None:
        if not isinstance(deadline_s, (int, float)) or math.isnan(deadline_s) or deadline_s <= 0:
            raise DeadlineExceeded(f"deadline_s must be > 0, got {deadline_s!r}", field="deadline_s")
        self.deadline_s = float(deadline_s)
        self.end = time.monotonic() + self.deadline_s

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def check(self, what: str) -> None:
        if self.expired():
            raise DeadlineExceeded(f"{what}: deadline of {self.deadline_s:.3f}s exceeded",
                                   field="deadline_s", limit=f"{self.deadline_s:.3f}s")


@dataclass
class Resident:
    """One published buffer. ``pins`` counts in-flight serves; freeing waits for them."""

    ref: TensorRef
    request_id: str
    payload: Any
    pins: int = 0
    released: bool = False


_COUNTERS = ("buffers_created", "buffers_released", "resident_buffers", "resident_bytes",
             "fetches", "fetch_bytes", "fetch_errors", "checksum_failures", "deadline_failures",
             "served", "served_bytes")


class TransportBase:
    """Owner ledger + reader accounting shared by every backend (see ``base.Transport``)."""

    backend = ""
    # Backends that stage bytes in host memory verify the host copy inside ``_fetch`` (before
    # any copy to a device) instead of having the base verify the returned tensor.
    verifies_in_fetch = False

    def __init__(self, owner: str, *, device: str | torch.device | None = "cpu",
                 checksum: str = "auto") -> None:
        if not isinstance(owner, str) or not owner:
            raise InvalidRequest("owner must be a non-empty string", field="transport.owner")
        self.owner = owner
        self.device = torch.device(device) if device is not None else None
        self.checksum_algorithm = checksum
        _checksum.pick_algorithm(checksum, torch.device("cpu"))  # fail fast on a bad name
        self._lock = threading.RLock()
        self._resident: dict[str, Resident] = {}
        self._by_request: dict[str, list[str]] = {}
        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._seq = itertools.count()
        self._closed = False
        self._generations = itertools.count(1)
        self._generation_lock = threading.Lock()

    # ------------------------------------------------------------------ backend hooks
    def _publish(self, buffer_id: str, tensor: torch.Tensor, csum_algo: str) -> tuple[Any, str, dict]:
        """Snapshot ``tensor``; return (payload, checksum, descriptor). Clean up on failure."""
        raise NotImplementedError

    def _staging_device(self, tensor: torch.Tensor) -> torch.device:
        """Where the owner's copy lives (the checksum is computed there)."""
        return tensor.device

    def _free(self, payload: Any) -> None:
        """Free one buffer's payload (give its slab back)."""
        raise NotImplementedError

    def _fetch(self, ref: TensorRef, deadline: Deadline, copy: bool,
               out: torch.Tensor | None) -> torch.Tensor:
        """Return the ref's tensor, or fill and return ``out`` (verified by the base unless
        ``verifies_in_fetch``). Release reader resources on failure."""
        raise NotImplementedError

    def _resident_bytes(self, ref: TensorRef) -> torch.Tensor:
        """A uint8 view of the owner's stored bytes (used by ``transport.testing``)."""
        raise NotImplementedError

    def _close_backend(self) -> None:
        """Free slabs, stop servers, drop connections."""

    def _backend_stats(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ slab helpers
    def _next_generation(self) -> int:
        """A published buffer's generation: never reused by this owner, so a reader tells the
        buffer its ref names from a released slab that now holds another."""
        with self._generation_lock:
            return next(self._generations)

    def _stage(self, data: torch.Tensor, tensor: torch.Tensor, csum_algo: str) -> tuple[str, int]:
        """Copy ``tensor``'s bytes into ``data`` (a uint8 view of a slab, exactly their length),
        checksum the staged copy and give it its generation: (checksum, generation)."""
        if data.numel():
            data.copy_(_checksum.byte_view(tensor))
        return _checksum.compute(data, csum_algo), self._next_generation()

    # ------------------------------------------------------------------ owner side
    def publish(self, request_id: str, name: str, tensor: torch.Tensor) -> TensorRef:
        if self._closed:
            raise FailedPrecondition(f"{self.backend} transport of {self.owner} is closed")
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequest("request_id must be a non-empty string", field="request_id")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("name must be a non-empty string", field="name")
        if not isinstance(tensor, torch.Tensor):
            raise InvalidRequest(f"expected a torch.Tensor, got {type(tensor).__name__}", field="tensor")
        dtype = dtype_name(tensor.dtype)
        algo = _checksum.pick_algorithm(self.checksum_algorithm, self._staging_device(tensor))
        buffer_id = f"{request_id}/{name}#{next(self._seq)}"
        payload, csum, descriptor = self._publish(buffer_id, tensor.detach(), algo)
        ref = TensorRef(self.owner, buffer_id, dtype, tuple(tensor.shape),
                        tensor.numel() * tensor.element_size(), csum, self.backend, descriptor)
        with self._lock:
            self._resident[buffer_id] = Resident(ref, request_id, payload)
            self._by_request.setdefault(request_id, []).append(buffer_id)
            self._counters["buffers_created"] += 1
            self._counters["resident_buffers"] += 1
            self._counters["resident_bytes"] += ref.nbytes
        return ref

    def release(self, request_id: str) -> int:
        with self._lock:
            ids = self._by_request.pop(request_id, [])
            entries = [self._resident.pop(b) for b in ids if b in self._resident]
        for entry in entries:
            self._drop(entry)
        return len(entries)

    def release_ref(self, ref: TensorRef) -> bool:
        with self._lock:
            entry = self._resident.pop(ref.buffer_id, None)
            if entry is None:
                return False
            ids = self._by_request.get(entry.request_id, [])
            if ref.buffer_id in ids:
                ids.remove(ref.buffer_id)
            if not ids:
                self._by_request.pop(entry.request_id, None)
        self._drop(entry)
        return True

    def _drop(self, entry: Resident) -> None:
        with self._lock:
            self._counters["buffers_released"] += 1
            self._counters["resident_buffers"] -= 1
            self._counters["resident_bytes"] -= entry.ref.nbytes
            entry.released = True
            free_now = entry.pins == 0
        if free_now:
            self._free(entry.payload)

    def _pin(self, buffer_id: str) -> Resident | None:
        """Hold a resident buffer while it is being served (``None`` if it is gone)."""
        with self._lock:
            entry = self._resident.get(buffer_id)
            if entry is not None:
                entry.pins += 1
            return entry

    def _unpin(self, entry: Resident) -> None:
        with self._lock:
            entry.pins -= 1
            free_now = entry.released and entry.pins == 0
        if free_now:
            self._free(entry.payload)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counters[key] += n

    # ------------------------------------------------------------------ reader side
    def fetch(self, ref: TensorRef, *, deadline_s: float, copy: bool = False,
              out: torch.Tensor | None = None) -> torch.Tensor:
        deadline = Deadline(deadline_s)
        if not isinstance(ref, TensorRef):
            raise InvalidRequest(f"expected a TensorRef, got {type(ref).__name__}", field="ref")
        ref.validate()
        if ref.backend != self.backend:
            raise InvalidRequest(f"ref is served by {ref.backend!r}, not {self.backend!r}",
                                 field="backend", limit=self.backend)
        if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != ref.torch_dtype
                                or tuple(out.shape) != ref.shape or not out.is_contiguous()):
            raise InvalidRequest(f"out must be a contiguous {ref.dtype} tensor of shape {list(ref.shape)}",
                                 field="out")
        try:
            result = self._fetch(ref, deadline, copy, out)
            if not self.verifies_in_fetch:
                self._verify(result, ref)
        except DataLoss:
            self._count("checksum_failures")
            self._count("fetch_errors")
            raise
        except DeadlineExceeded:
            self._count("deadline_failures")
            self._count("fetch_errors")
            raise
        except FastVideoError:
            self._count("fetch_errors")
            raise
        if out is None and self.device is not None and result.device != self.device:
            result = result.to(self.device)
        with self._lock:
            self._counters["fetches"] += 1
            self._counters["fetch_bytes"] += ref.nbytes
        return result

    # ------------------------------------------------------------------ both
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            requests = list(self._by_request)
        for request_id in requests:
            self.release(request_id)
        self._close_backend()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {"backend": self.backend, "owner": self.owner, **self._counters}
        out.setdefault("slabs_created", 0)
        out.setdefault("slabs_destroyed", 0)
        out.setdefault("slab_bytes", 0)
        out.update(self._backend_stats())
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _verify(tensor: torch.Tensor, ref: TensorRef) -> None:
        _checksum.verify(tensor, ref.checksum, what=f"{ref.owner}:{ref.buffer_id}")

    @staticmethod
    def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
        """A flat uint8 view of a contiguous tensor (writes go to the tensor)."""
        return tensor.reshape(-1).view(torch.uint8)

    def _lookup(self, ref: TensorRef) -> Resident:
        with self._lock:
            entry = self._resident.get(ref.buffer_id)
        if entry is None:
            raise NotFound(f"{self.owner} holds no buffer {ref.buffer_id!r}", field="buffer_id")
        return entry
