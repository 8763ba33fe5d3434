"""A reusable pool of large buffers ("slabs") for transport backends.

Creating a buffer is the expensive part of a transfer: a shared-memory segment is created and
its pages reserved; NIXL memory is registered with the NIC/UCX. So owners and readers keep
released slabs and hand them to the next buffer that fits. Capacities are rounded to size
classes (steps of 1/4 of a power of two, at most 25% waste) so slabs are reusable across
slightly different sizes; free slabs beyond ``max_cached_bytes`` are destroyed, oldest first.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable

MIN_SLAB_BYTES = 64 * 1024
PAGE = 4096


def size_class(nbytes: int, minimum: int = MIN_SLAB_BYTES) -> int:
    """The slab capacity used for a buffer of ``nbytes``."""
    if nbytes <= minimum:
        return minimum
    top = 1 << (nbytes - 1).bit_length()  # smallest power of two >= nbytes
    step = top // 8  # classes top/2 * {1, 1.25, 1.5, 1.75, 2}
    cap = top // 2
    while cap < nbytes:
        cap += step
    return (cap + PAGE - 1) // PAGE * PAGE


class Slab:
    """One buffer of ``capacity`` bytes; ``handle`` is whatever the backend needs."""

    __slots__ = ("slab_id", "capacity", "handle")

    def __init__(self, slab_id: int, capacity: int, handle: Any) -> None:
        self.slab_id = slab_id
        self.capacity = capacity
        self.handle = handle


class SlabPool:
    """Thread-safe acquire/give_back of slabs made by ``create(capacity)``."""

    def __init__(
        self,
        create: Callable[[int], Any],
        destroy: Callable[[Any], None],
        *,
        max_cached_bytes: int = 1 << 30,
        minimum: int = MIN_SLAB_BYTES,
        can_reuse: Callable[[Any], bool] | None = None,
    ) -> None:
        self._create = create
        self._destroy = destroy
        # A free slab whose handle fails this check (e.g. a reader still maps it) is neither
        # handed out again nor evicted; it stays free until the check passes.
        self._can_reuse = can_reuse
        self._max_cached = max_cached_bytes
        self._minimum = minimum
        self._free: OrderedDict[int, Slab] = OrderedDict()  # oldest first
        self._lock = threading.Lock()
        self._next_id = 0
        self.created = 0
        self.destroyed = 0
        self.bytes_total = 0
        self.bytes_free = 0

    def acquire(self, nbytes: int) -> Slab:
        """A slab with ``capacity >= nbytes``: a free one of the right class, else a new one."""
        want = size_class(nbytes, self._minimum)
        with self._lock:
            best = None
            for slab in self._free.values():
                if want <= slab.capacity <= 2 * want and (best is None or slab.capacity < best.capacity):
                    if self._can_reuse is None or self._can_reuse(slab.handle):
                        best = slab
            if best is not None:
                del self._free[best.slab_id]
                self.bytes_free -= best.capacity
                return best
            slab_id = self._next_id
            self._next_id += 1
        handle = self._create(want)  # outside the lock: may be slow; may raise
        with self._lock:
            self.created += 1
            self.bytes_total += want
        return Slab(slab_id, want, handle)

    def give_back(self, slab: Slab) -> None:
        """Return a slab for reuse; evict the oldest free slabs past the cache limit."""
        evicted = []
        with self._lock:
            self._free[slab.slab_id] = slab
            self.bytes_free += slab.capacity
            for old in list(self._free.values()):  # oldest first
                if self.bytes_free <= self._max_cached:
                    break
                if self._can_reuse is not None and not self._can_reuse(old.handle):
                    continue  # still in use by a reader: evicted on a later give_back
                del self._free[old.slab_id]
                self.bytes_free -= old.capacity
                evicted.append(old)
        for old in evicted:
            self.discard(old)

    def discard(self, slab: Slab) -> None:
        """Destroy a slab now (it must not be in the free list)."""
        try:
            self._destroy(slab.handle)
        finally:
            with self._lock:
                self.destroyed += 1
                self.bytes_total -= slab.capacity

    def clear(self) -> None:
        """Destroy every free slab (slabs in use stay alive until given back)."""
        with self._lock:
            slabs = list(self._free.values())
            self._free.clear()
            self.bytes_free = 0
        for slab in slabs:
            self.discard(slab)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"slabs_created": self.created, "slabs_destroyed": self.destroyed,
                    "slab_bytes": self.bytes_total, "slab_bytes_free": self.bytes_free}
