"""Video jobs in the state store, keyed by the fleet's request id.

A job's record is a StateStore request in the gateway's own namespace (so it never mixes with
the scheduler's keys on a shared Redis): ``put_request`` stores the record as created,
``put_artifact(id, "job", ...)`` each later version while the job runs, and ``end_request``
(after the final version) starts the record's TTL, the same as the media's. A restarted gateway
finds the jobs it had not finished in ``list_inflight``. Listing needs an index the StateStore
protocol does not have: a sorted set by creation time in Redis (``<namespace>:videos``), a dict
in memory; ids whose record expired are dropped from it as listing meets them.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, TypeVar

from fastvideo3.errors import Unavailable
from fastvideo3.state import StoreConfig, make_store

T = TypeVar("T")
TERMINAL = ("completed", "failed")
JOB_ARTIFACT = "job"


class MemoryIndex:
    """Job ids by creation time, in process memory."""

    def __init__(self) -> None:
        self._items: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, job_id: str, created: float) -> None:
        with self._lock:
            self._items[job_id] = created

    def remove(self, job_id: str) -> None:
        with self._lock:
            self._items.pop(job_id, None)

    def ordered(self, descending: bool) -> list[str]:
        with self._lock:
            return [k for k, _ in sorted(self._items.items(), key=lambda kv: (kv[1], kv[0]), reverse=descending)]

    def close(self) -> None:
        pass


class RedisIndex:
    """Job ids by creation time in one Redis sorted set."""

    def __init__(self, url: str, key: str, timeout_s: float) -> None:
        import redis
        self._redis = redis
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._key = key

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (self._redis.RedisError, OSError) as exc:
            raise Unavailable(f"job index unavailable during {what}: {type(exc).__name__}: {exc}") from exc

    def add(self, job_id: str, created: float) -> None:
        self._call("add", lambda: self._client.zadd(self._key, {job_id: created}))

    def remove(self, job_id: str) -> None:
        self._call("remove", lambda: self._client.zrem(self._key, job_id))

    def ordered(self, descending: bool) -> list[str]:
        fn = self._client.zrevrange if descending else self._client.zrange
        return [m.decode() for m in self._call("list", lambda: fn(self._key, 0, -1))]

    def close(self) -> None:
        self._client.close()


class JobStore:
    """Job records (plain dicts, see :mod:`fleet.gateway.app` for their fields) and their index."""

    def __init__(self, url: str | None, *, namespace: str = "fastvideo3-gateway", ttl_s: float = 3600.0,
                 timeout_s: float = 2.0) -> None:
        self.store = make_store(url, StoreConfig(namespace=namespace, ttl_after_end_s=ttl_s, timeout_s=timeout_s))
        redis_url = url if url and url != "memory://" else None
        self.index = RedisIndex(redis_url, f"{namespace}:videos", timeout_s) if redis_url else MemoryIndex()

    @property
    def address(self) -> str:
        return self.store.address

    def create(self, job: dict[str, Any]) -> None:
        self.store.put_request(job["id"], job)
        # microseconds: jobs created one after another never tie (a tie would order them by id)
        self.index.add(job["id"], float(job.get("created_at_us") or job["created_at_ms"] * 1000))

    def update(self, job: dict[str, Any]) -> bool:
        """Write a newer version of a running job; False if it was ended or deleted meanwhile."""
        return self.store.put_artifact(job["id"], JOB_ARTIFACT, job)

    def finish(self, job: dict[str, Any]) -> bool:
        """Write the final version and end the record (its TTL starts)."""
        if not self.update(job):
            return False
        return self.store.end_request(job["id"], job["status"])

    def get(self, job_id: str) -> dict[str, Any] | None:
        meta = self.store.get_request(job_id)
        if meta is None:
            return None
        return self.store.artifacts(job_id).get(JOB_ARTIFACT) or meta

    def delete(self, job_id: str) -> None:
        self.store.delete_request(job_id)
        self.index.remove(job_id)

    def inflight(self) -> list[str]:
        return self.store.list_inflight()

    def page(self, *, after: str | None, limit: int, descending: bool,
             visible: Callable[[dict[str, Any]], bool]) -> tuple[list[dict[str, Any]], bool] | None:
        """Up to ``limit`` visible jobs after ``after`` in creation order, and whether more follow.
        None if ``after`` is not a listed job."""
        ids = self.index.ordered(descending)
        start = 0
        if after:
            if after not in ids:
                return None
            start = ids.index(after) + 1
        out: list[dict[str, Any]] = []
        for job_id in ids[start:]:
            job = self.get(job_id)
            if job is None:  # expired: forget it
                self.index.remove(job_id)
                continue
            if not visible(job):
                continue
            if len(out) == limit:
                return out, True
            out.append(job)
        return out, False

    def ping(self) -> None:
        self.store.ping()

    def close(self) -> None:
        self.store.close()
        self.index.close()


def now_ms() -> int:
    return int(time.time() * 1000)


def now_us() -> int:
    return time.time_ns() // 1000
