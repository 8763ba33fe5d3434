"""A content-addressed feature cache: reference-counted entries, LRU eviction under a byte budget.

Contract:
  * ``lookup(key, holder)`` returns the cached value (and makes ``holder`` reference it) or
    None; hits and misses are counted.
  * ``insert(key, value, holder)`` stores a value referenced by ``holder`` and returns the value
    kept (an entry inserted concurrently under the same key wins, so holders share one value).
  * ``release(holder)`` drops every reference ``holder`` holds (a request releases its entries
    when it ends, whatever way it ends). Idempotent.
  * Only unreferenced entries are evicted, least recently used first, whenever the bytes held
    exceed ``max_bytes``; referenced entries may keep the cache over budget until released
    (``over_budget`` counts those moments). ``max_bytes=0`` disables storing entirely.

Values are tensors (or anything with ``numel()``/``element_size()``); a cached tensor must not
be mutated by its users. Thread-safe.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fastvideo3.cache.key import CacheKey


def _nbytes(value: Any) -> int:
    try:
        return int(value.numel() * value.element_size())
    except AttributeError:
        return len(value)


@dataclass
class _Entry:
    value: Any
    nbytes: int
    holders: set[str] = field(default_factory=set)


class FeatureCache:
    def __init__(self, max_bytes: int = 256 << 20):
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: "OrderedDict[str, _Entry]" = OrderedDict()
        self._held: dict[str, set[str]] = {}  # holder -> entry digests
        self._bytes = 0
        self._lock = threading.Lock()
        self.counters = {"hits": 0, "misses": 0, "inserts": 0, "evictions": 0, "over_budget": 0}

    def lookup(self, key: CacheKey, holder: str) -> Any | None:
        d = key.digest()
        with self._lock:
            entry = self._entries.get(d)
            if entry is None:
                self.counters["misses"] += 1
                return None
            self.counters["hits"] += 1
            self._entries.move_to_end(d)
            self._hold(d, entry, holder)
            return entry.value

    def insert(self, key: CacheKey, value: Any, holder: str) -> Any:
        if self.max_bytes == 0:
            return value
        d = key.digest()
        with self._lock:
            entry = self._entries.get(d)
            if entry is None:
                entry = _Entry(value, _nbytes(value))
                self._entries[d] = entry
                self._bytes += entry.nbytes
                self.counters["inserts"] += 1
            self._entries.move_to_end(d)
            self._hold(d, entry, holder)
            self._evict()
            return entry.value

    def release(self, holder: str) -> int:
        """Drop every reference of ``holder``; returns how many it held."""
        with self._lock:
            digests = self._held.pop(holder, set())
            for d in digests:
                entry = self._entries.get(d)
                if entry is not None:
                    entry.holders.discard(holder)
            self._evict()
            return len(digests)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held.clear()
            self._bytes = 0

    def __contains__(self, key: CacheKey) -> bool:
        with self._lock:
            return key.digest() in self._entries

    def refcount(self, key: CacheKey) -> int:
        with self._lock:
            entry = self._entries.get(key.digest())
            return len(entry.holders) if entry else 0

    def stats(self) -> dict[str, float]:
        with self._lock:
            referenced = sum(1 for e in self._entries.values() if e.holders)
            return {**self.counters, "entries": len(self._entries), "bytes": self._bytes,
                    "max_bytes": self.max_bytes, "referenced_entries": referenced, "holders": len(self._held)}

    # -- internals (lock held) -----------------------------------------------------------
    def _hold(self, d: str, entry: _Entry, holder: str) -> None:
        entry.holders.add(holder)
        self._held.setdefault(holder, set()).add(d)

    def _evict(self) -> None:
        if self._bytes <= self.max_bytes:
            return
        for d in [d for d, e in self._entries.items() if not e.holders]:  # LRU first
            if self._bytes <= self.max_bytes:
                break
            self._bytes -= self._entries.pop(d).nbytes
            self.counters["evictions"] += 1
        if self._bytes > self.max_bytes:
            self.counters["over_budget"] += 1
