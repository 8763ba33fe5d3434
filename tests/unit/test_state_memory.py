"""The in-process StateStore: expiry on a fake clock, sharing for restarts, threads, make_store.

The contract every backend shares is tested in ``tests/integration/test_state_redis.py``
(memory and Redis side by side); this file covers what is particular to the memory backend.
"""
from __future__ import annotations

import threading

import pytest

from fastvideo3.errors import InvalidRequest, Unavailable
from fastvideo3.state import (
    INFLIGHT,
    Checkpoint,
    MemoryData,
    MemoryStateStore,
    StateStore,
    StoreConfig,
    make_store,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.mark.timeout(60)
def test_ended_request_expires_after_ttl_on_the_clock(clock: FakeClock) -> None:
    store = MemoryStateStore(StoreConfig(ttl_after_end_s=30), clock=clock)
    store.put_request("r1", {"prompt": "a cat"})
    assert store.checkpoint("r1", 3, b"state-3")
    assert store.put_artifact("r1", "video", {"bytes": 10})
    assert store.end_request("r1", "SUCCEEDED")

    clock.advance(29.9)
    assert store.status("r1") == "SUCCEEDED"
    assert store.get_request("r1") == {"prompt": "a cat"}
    assert store.load_checkpoint("r1") == Checkpoint(3, b"state-3")
    assert len(store.keys_for("r1")) == 3

    clock.advance(0.1)
    assert store.keys_for("r1") == []
    assert store.get_request("r1") is None
    assert store.status("r1") is None
    assert store.load_checkpoint("r1") is None
    assert store.artifacts("r1") == {}
    assert store.list_inflight() == []
    # Nothing lingers in the backing either: expiry removed the keys themselves.
    assert store._data.values == {}
    assert store._data.expires_at == {}


@pytest.mark.timeout(60)
def test_inflight_requests_never_expire(clock: FakeClock) -> None:
    store = MemoryStateStore(StoreConfig(ttl_after_end_s=1), clock=clock)
    store.put_request("live", {})
    store.checkpoint("live", 0, b"x")
    clock.advance(10**6)
    assert store.list_inflight() == ["live"]
    assert store.load_checkpoint("live") == Checkpoint(0, b"x")


@pytest.mark.timeout(60)
def test_reusing_an_ended_id_cancels_its_expiry(clock: FakeClock) -> None:
    store = MemoryStateStore(StoreConfig(ttl_after_end_s=5), clock=clock)
    store.put_request("r", {"n": 1})
    store.checkpoint("r", 7, b"old")
    store.end_request("r", "CANCELLED")
    clock.advance(1)
    store.put_request("r", {"n": 2})
    clock.advance(100)  # well past the old expiry
    assert store.get_request("r") == {"n": 2}
    assert store.status("r") == INFLIGHT
    assert store.load_checkpoint("r") is None
    assert store.list_inflight() == ["r"]


@pytest.mark.timeout(60)
def test_a_reused_id_expires_on_its_own_end_not_the_earlier_one(clock: FakeClock) -> None:
    store = MemoryStateStore(StoreConfig(ttl_after_end_s=10), clock=clock)
    store.put_request("r", {"gen": 1})
    store.end_request("r", "FAILED")  # would expire at t0 + 10
    clock.advance(4)
    store.put_request("r", {"gen": 2})
    store.end_request("r", "SUCCEEDED")  # expires at t0 + 14
    clock.advance(8)  # past the first end's expiry, before the second's
    assert store.get_request("r") == {"gen": 2}
    assert store.status("r") == "SUCCEEDED"
    clock.advance(2)
    assert store.keys_for("r") == []


@pytest.mark.timeout(60)
def test_stores_sharing_data_see_each_other_like_a_restart(clock: FakeClock) -> None:
    data = MemoryData()
    first = MemoryStateStore(data=data, clock=clock)
    first.put_request("a", {"k": 1})
    first.checkpoint("a", 4, b"four")
    first.close()
    with pytest.raises(Unavailable, match="memory://"):
        first.list_inflight()

    second = MemoryStateStore(data=data, clock=clock)
    second.ping()
    assert second.list_inflight() == ["a"]
    assert second.load_checkpoint("a") == Checkpoint(4, b"four")


@pytest.mark.timeout(60)
def test_returned_values_are_copies() -> None:
    store = MemoryStateStore()
    store.put_request("r", {"nested": {"x": [1, 2]}})
    got = store.get_request("r")
    assert got is not None
    got["nested"]["x"].append(3)
    assert store.get_request("r") == {"nested": {"x": [1, 2]}}
    blob = bytearray(b"abc")
    store.checkpoint("r", 1, blob)
    blob[0] = ord("z")
    assert store.load_checkpoint("r") == Checkpoint(1, b"abc")


@pytest.mark.timeout(60)
def test_concurrent_threads_keep_invariants() -> None:
    store = MemoryStateStore()
    n_threads, n_requests, n_steps = 8, 25, 5
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for r in range(n_requests):
                rid = f"t{t}-r{r}"
                store.put_request(rid, {"t": t, "r": r})
                for step in range(n_steps):
                    assert store.checkpoint(rid, step, f"{rid}:{step}".encode())
                if r % 2 == 0:
                    assert store.end_request(rid, "SUCCEEDED")
                if r % 5 == 0:
                    store.delete_request(rid)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []

    expected_inflight = sorted(
        f"t{t}-r{r}" for t in range(n_threads) for r in range(n_requests) if r % 2 and r % 5
    )
    assert store.list_inflight() == expected_inflight
    for t in range(n_threads):
        for r in range(n_requests):
            rid = f"t{t}-r{r}"
            if r % 5 == 0:
                assert store.keys_for(rid) == []
            else:
                assert store.load_checkpoint(rid) == Checkpoint(n_steps - 1, f"{rid}:{n_steps - 1}".encode())


@pytest.mark.timeout(60)
def test_make_store_picks_the_backend_from_the_url() -> None:
    assert isinstance(make_store(None), MemoryStateStore)
    memory = make_store("memory://", StoreConfig(namespace="dep-a"))
    assert isinstance(memory, MemoryStateStore)
    assert isinstance(memory, StateStore)
    assert memory.config.namespace == "dep-a"

    from fastvideo3.state.redis_store import RedisStateStore

    redis_store = make_store("redis://127.0.0.1:6390/2", StoreConfig(timeout_s=0.5))
    assert isinstance(redis_store, RedisStateStore)  # built without connecting
    assert isinstance(redis_store, StateStore)
    assert redis_store.address == "redis://127.0.0.1:6390/2"
    redis_store.close()

    for bad in ("postgres://x", "", "memory", "http://127.0.0.1:6379"):
        with pytest.raises(InvalidRequest) as info:
            make_store(bad)
        assert info.value.field == "state_url"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"namespace": ""}, "namespace"),
        ({"namespace": "has space"}, "namespace"),
        ({"ttl_after_end_s": 0}, "state.ttl_after_end_s"),
        ({"ttl_after_end_s": float("nan")}, "state.ttl_after_end_s"),
        ({"timeout_s": -1}, "state.timeout_s"),
        ({"timeout_s": float("inf")}, "state.timeout_s"),
    ],
)
def test_store_config_rejects_bad_values(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        StoreConfig(**kwargs)
    assert info.value.field == field


@pytest.mark.timeout(60)
def test_store_config_defaults() -> None:
    config = StoreConfig()
    assert config.namespace == "fastvideo3"
    assert config.ttl_after_end_s == 3600
    assert 0 < config.timeout_s <= 2.5
