"""StateStore on a Redis server, for a fleet.

Key layout, for namespace ``ns`` and request ``id``:

* ``ns:req:id:meta``      hash: ``meta`` (JSON text), ``status`` (``INFLIGHT`` or terminal)
* ``ns:req:id:ckpt``      hash: ``step``, ``blob`` (the LoopState bytes)
* ``ns:req:id:artifacts`` hash: artifact name -> JSON text
* ``ns:req:id:media``     hash: output name -> bytes (the finished video)
* ``ns:inflight``         set of request ids not yet ended
* ``ns:lease:name``       string: the holder of a lease (SET NX PX; the scheduler leader)

Writes that depend on the request being in flight (``checkpoint``, ``put_artifact``,
``end_request``) WATCH the request's meta key, read its status and commit in MULTI/EXEC; a
concurrent end or delete touches the meta key, so the transaction aborts and is re-checked.
No write can therefore land on an ended or deleted request and outlive its expiry.

Every call runs under socket timeouts with one immediate reconnect after a connection error
(so a restarted server is picked up on the next call); connection failures and timeouts become
``Unavailable`` naming the server.
"""
from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import (
    BusyLoadingError,
    ConnectionError as RedisConnectionError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TimeoutError as RedisTimeoutError,
    WatchError,
)
from redis.retry import Retry

from fastvideo3.errors import Internal, InvalidRequest, Unavailable
from fastvideo3.state.base import INFLIGHT, Checkpoint, StoreConfig, StoreLayout, decode_meta, encode_meta

T = TypeVar("T")

# A WATCH transaction is retried while other writers touch the same request's meta key;
# such conflicts are rare (one scheduler owns a request), so a few attempts suffice.
_MAX_WATCH_ATTEMPTS = 8

# Server replies that mean "cannot serve now", as opposed to a bug in how we call it.
_OUTAGE_REPLIES = ("OOM", "MASTERDOWN", "NOREPLICAS", "CLUSTERDOWN", "TRYAGAIN")


class RedisStateStore(StoreLayout):
    """A StateStore on one Redis server. See ``StateStore`` for the contract."""

    def __init__(self, url: str, config: StoreConfig | None = None) -> None:
        self.config = config or StoreConfig()
        timeout = self.config.timeout_s
        try:
            self._client = redis.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                # One immediate retry on a connection error only: it replaces a pooled connection
                # that died with a restarted server. Timeouts are not retried, so a hung server
                # is reported after one timeout rather than a series of them.
                retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
                retry_on_timeout=False,
                health_check_interval=0,
                decode_responses=False,
            )
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(f"not a usable Redis URL: {exc}", field="state_url") from None
        self._address = _describe(self._client)
        self._closed = False

    @property
    def address(self) -> str:
        return self._address

    # --- internals -------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` against the server, turning driver errors into typed errors."""
        if self._closed:
            raise Unavailable(f"state store at {self._address} is closed")
        try:
            return fn()
        except (RedisConnectionError, RedisTimeoutError, BusyLoadingError, ReadOnlyError, OSError) as exc:
            raise Unavailable(
                f"state store at {self._address} unavailable during {what}: {type(exc).__name__}: {exc}",
                details={"address": self._address},
            ) from exc
        except ResponseError as exc:
            if str(exc).startswith(_OUTAGE_REPLIES):
                raise Unavailable(
                    f"state store at {self._address} refused {what}: {exc}",
                    details={"address": self._address},
                ) from exc
            raise Internal(f"state store at {self._address} rejected {what}: {exc}") from exc
        except WatchError as exc:
            raise Unavailable(
                f"state store at {self._address}: {what} kept conflicting or lost its connection",
                details={"address": self._address},
            ) from exc
        except RedisError as exc:
            raise Internal(f"state store at {self._address} failed {what}: {exc}") from exc

    def _if_inflight(self, meta_key: str, write: Callable[[Any], None]) -> bool:
        """Run ``write(pipe)`` in MULTI/EXEC only if the request is in flight; True if it ran.

        WATCH makes EXEC fail if the meta key changed after we read the status (an end, a
        delete or a re-put raced us); we then read the status again.
        """
        for _ in range(_MAX_WATCH_ATTEMPTS):
            with self._client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(meta_key)
                    if pipe.hget(meta_key, "status") != INFLIGHT.encode():
                        pipe.unwatch()
                        return False
                    pipe.multi()
                    write(pipe)
                    pipe.execute()
                    return True
                except WatchError:
                    continue
        raise WatchError(f"{_MAX_WATCH_ATTEMPTS} attempts conflicted on {meta_key}")

    # --- the protocol ----------------------------------------------------------------------

    def put_request(self, request_id: str, meta: dict[str, Any]) -> None:
        meta_key, ckpt_key, art_key = self._keys(request_id)
        text = encode_meta(meta)

        def run() -> None:
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(meta_key, ckpt_key, art_key, self._media_key(request_id))  # any expiry too
            pipe.hset(meta_key, mapping={"meta": text, "status": INFLIGHT})
            pipe.sadd(self._inflight_key, request_id)
            pipe.execute()

        self._call("put_request", run)

    def get_request(self, request_id: str) -> dict[str, Any] | None:
        meta_key, _, _ = self._keys(request_id)
        raw = self._call("get_request", lambda: self._client.hget(meta_key, "meta"))
        return None if raw is None else decode_meta(raw)

    def status(self, request_id: str) -> str | None:
        meta_key, _, _ = self._keys(request_id)
        raw = self._call("status", lambda: self._client.hget(meta_key, "status"))
        return None if raw is None else raw.decode()

    def checkpoint(self, request_id: str, step: int, loop_state: bytes) -> bool:
        meta_key, ckpt_key, _ = self._keys(request_id)
        snapshot = self._checkpoint_of(step, loop_state)
        fields = {"step": snapshot.step, "blob": snapshot.loop_state}
        return self._call(
            "checkpoint", lambda: self._if_inflight(meta_key, lambda p: p.hset(ckpt_key, mapping=fields)),
        )

    def load_checkpoint(self, request_id: str) -> Checkpoint | None:
        _, ckpt_key, _ = self._keys(request_id)
        # One HMGET reads both fields of one hash at one instant: never a torn pair.
        step, blob = self._call("load_checkpoint", lambda: self._client.hmget(ckpt_key, ["step", "blob"]))
        if step is None or blob is None:
            return None
        return Checkpoint(int(step), bytes(blob))

    def put_artifact(self, request_id: str, name: str, meta: dict[str, Any]) -> bool:
        meta_key, _, art_key = self._keys(request_id)
        text = self._artifact_text(name, meta)
        return self._call(
            "put_artifact", lambda: self._if_inflight(meta_key, lambda p: p.hset(art_key, name, text)),
        )

    def artifacts(self, request_id: str) -> dict[str, dict[str, Any]]:
        _, _, art_key = self._keys(request_id)
        raw = self._call("artifacts", lambda: self._client.hgetall(art_key))
        return {name.decode(): decode_meta(text) for name, text in raw.items()}

    def list_inflight(self) -> list[str]:
        raw = self._call("list_inflight", lambda: self._client.smembers(self._inflight_key))
        return sorted(member.decode() for member in raw)

    def end_request(self, request_id: str, status: str, info: dict[str, Any] | None = None) -> bool:
        keys = self._all_keys(request_id)
        end = self._end_text(status, info)
        ttl_ms = max(1, round(self.config.ttl_after_end_s * 1000))

        def write(pipe: Any) -> None:
            pipe.hset(keys[0], "status", status)
            if end is not None:
                pipe.hset(keys[0], "end", end)
            for key in keys:
                pipe.pexpire(key, ttl_ms)
            pipe.srem(self._inflight_key, request_id)

        return self._call("end_request", lambda: self._if_inflight(keys[0], write))

    def end_info(self, request_id: str) -> dict[str, Any] | None:
        meta_key, _, _ = self._keys(request_id)
        raw = self._call("end_info", lambda: self._client.hget(meta_key, "end"))
        return None if raw is None else decode_meta(raw)

    def put_media(self, request_id: str, name: str, data: bytes) -> bool:
        meta_key, _, _ = self._keys(request_id)
        blob = self._media_blob(name, data)
        key = self._media_key(request_id)
        return self._call("put_media", lambda: self._if_inflight(meta_key, lambda p: p.hset(key, name, blob)))

    def media(self, request_id: str, name: str) -> bytes | None:
        key = self._media_key(request_id)
        raw = self._call("media", lambda: self._client.hget(key, name))
        return None if raw is None else bytes(raw)

    # One atomic step: take a free lease, or extend it when ``owner`` holds it; reply the holder.
    _LEASE = ("local h = redis.call('GET', KEYS[1]) "
              "if (not h) or h == ARGV[1] then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return ARGV[1] end "
              "return h")
    _RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"

    def acquire_lease(self, name: str, owner: str, ttl_s: float) -> str:
        key = self._lease_key(name)
        self._owner(owner)
        ttl_ms = str(max(1, round(ttl_s * 1000)))
        held = self._call("acquire_lease", lambda: self._client.eval(self._LEASE, 1, key, owner, ttl_ms))
        return held.decode() if isinstance(held, bytes) else str(held or "")

    def lease_holder(self, name: str) -> str:
        key = self._lease_key(name)
        held = self._call("lease_holder", lambda: self._client.get(key))
        return held.decode() if held else ""

    def release_lease(self, name: str, owner: str) -> None:
        key = self._lease_key(name)
        self._call("release_lease", lambda: self._client.eval(self._RELEASE, 1, key, owner))

    def delete_request(self, request_id: str) -> None:
        keys = self._all_keys(request_id)

        def run() -> None:
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(*keys)
            pipe.srem(self._inflight_key, request_id)
            pipe.execute()

        self._call("delete_request", run)

    def keys_for(self, request_id: str) -> list[str]:
        keys = self._all_keys(request_id)

        def run() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.exists(key)
            return pipe.execute()

        found = self._call("keys_for", run)
        return [key for key, present in zip(keys, found) if present]

    def ping(self) -> None:
        self._call("ping", self._client.ping)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()

    def __repr__(self) -> str:
        return f"RedisStateStore({self._address!r}, namespace={self.config.namespace!r})"


def _describe(client: redis.Redis) -> str:
    """``redis://host:port/db`` (or the socket path) of a client, without credentials."""
    pool = client.connection_pool
    kw = pool.connection_kwargs
    if kw.get("path"):
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    scheme = "rediss" if "SSL" in pool.connection_class.__name__ else "redis"
    return f"{scheme}://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


def wait_for_ping(url: str, deadline_s: float) -> None:
    """Poll ``url`` with PING until it answers or ``deadline_s`` passes (then ``Unavailable``)."""
    store = RedisStateStore(url, StoreConfig(timeout_s=0.5))
    end = time.monotonic() + deadline_s
    try:
        while True:
            try:
                store.ping()
                return
            except Unavailable:
                if time.monotonic() >= end:
                    raise
                time.sleep(0.02)
    finally:
        store.close()
