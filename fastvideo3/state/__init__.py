"""Durable per-request state: the StateStore protocol, its backends, and ``make_store``.

``make_store(None)`` or ``make_store("memory://")`` gives the in-process store of embedded
mode; ``make_store("redis://host:port/db")`` gives the fleet's Redis store.
"""
from __future__ import annotations

from fastvideo3.errors import InvalidRequest
from fastvideo3.state.base import INFLIGHT, Checkpoint, StateStore, StoreConfig
from fastvideo3.state.memory import MemoryData, MemoryStateStore

__all__ = [
    "INFLIGHT",
    "Checkpoint",
    "MemoryData",
    "MemoryStateStore",
    "StateStore",
    "StoreConfig",
    "make_store",
]

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def make_store(url: str | None = None, config: StoreConfig | None = None) -> StateStore:
    """The StateStore a URL names: None / ``memory://`` -> memory, ``redis://...`` -> Redis.

    Building a Redis store does not connect; call ``ping()`` to fail fast at startup.
    """
    if url is None or url == "memory://":
        return MemoryStateStore(config)
    if isinstance(url, str) and url.startswith(_REDIS_SCHEMES):
        # Imported here so embedded mode never needs the redis package.
        from fastvideo3.state.redis_store import RedisStateStore

        return RedisStateStore(url, config)
    raise InvalidRequest(
        f"unknown state store URL {url!r}", field="state_url",
        limit="memory:// or redis://host:port/db (rediss://, unix:// also accepted)",
    )
