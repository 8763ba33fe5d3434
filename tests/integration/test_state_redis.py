"""The StateStore contract, on the memory backend and on a real Redis server side by side,
plus what only Redis has: outages (server stopped, server hung) and its key expiry.

Tests share one session Redis (``redis_url``) and keep apart by a fresh namespace each; outage
tests start their own server so they can stop it.
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import Callable, Iterator

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from fastvideo3.errors import InvalidRequest, Unavailable
from fastvideo3.state import INFLIGHT, Checkpoint, MemoryData, MemoryStateStore, StateStore, StoreConfig
from fastvideo3.state.redis_store import RedisStateStore
from tests.redis_server import redis_process_fixture, redis_url  # noqa: F401  (redis_url is a fixture)

TTL_S = 30.0


class Backend:
    """Builds stores on one shared backing, so a new store models a restarted scheduler."""

    name: str

    def store(self, namespace: str) -> StateStore:
        raise NotImplementedError

    def assert_expires(self, store: StateStore, keys: list[str]) -> None:
        """The keys are readable now and expire within ``TTL_S``."""
        raise NotImplementedError

    def assert_no_expiry(self, store: StateStore, keys: list[str]) -> None:
        raise NotImplementedError


class MemoryBackend(Backend):
    name = "memory"

    def __init__(self) -> None:
        self.data = MemoryData()
        self.now = 0.0

    def store(self, namespace: str) -> StateStore:
        config = StoreConfig(namespace=namespace, ttl_after_end_s=TTL_S)
        return MemoryStateStore(config, data=self.data, clock=lambda: self.now)

    def assert_expires(self, store: StateStore, keys: list[str]) -> None:
        assert set(keys) <= set(self._existing(keys))
        self.now += TTL_S - 0.01
        assert self._existing(keys) == keys
        self.now += 0.02
        assert self._existing(keys) == []

    def assert_no_expiry(self, store: StateStore, keys: list[str]) -> None:
        self.now += 10 * TTL_S
        assert self._existing(keys) == keys

    def _existing(self, keys: list[str]) -> list[str]:
        probe = self.store("probe")  # any store sweeps the shared data
        probe.ping()
        probe.list_inflight()
        return [k for k in keys if k in self.data.values]


class RedisBackend(Backend):
    name = "redis"

    def __init__(self, url: str) -> None:
        self.url = url
        self.raw = redis.Redis.from_url(url, socket_timeout=2)

    def store(self, namespace: str) -> StateStore:
        return RedisStateStore(self.url, StoreConfig(namespace=namespace, ttl_after_end_s=TTL_S))

    def assert_expires(self, store: StateStore, keys: list[str]) -> None:
        for key in keys:
            pttl = self.raw.pttl(key)
            assert 0 < pttl <= TTL_S * 1000, (key, pttl)

    def assert_no_expiry(self, store: StateStore, keys: list[str]) -> None:
        for key in keys:
            assert self.raw.pttl(key) == -1, key  # exists, no expiry


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        yield MemoryBackend()
    else:
        made = RedisBackend(request.getfixturevalue("redis_url"))
        yield made
        made.raw.close()


@pytest.fixture
def ns() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(backend: Backend, ns: str) -> Iterator[StateStore]:
    made = backend.store(ns)
    yield made
    made.close()


# --- the shared contract -------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_put_and_get_request(store: StateStore) -> None:
    meta = {"prompt": "a red fox", "frames": 33, "guidance": 5.0, "tags": ["x", "y"], "opt": None}
    store.put_request("req-1", meta)
    assert store.get_request("req-1") == meta
    assert store.status("req-1") == INFLIGHT
    assert store.get_request("unknown") is None
    assert store.status("unknown") is None
    assert store.load_checkpoint("req-1") is None
    assert store.artifacts("req-1") == {}
    store.ping()


@pytest.mark.timeout(60)
def test_checkpoint_overwrite_keeps_only_the_latest(store: StateStore, ns: str) -> None:
    store.put_request("r", {})
    every_byte = bytes(range(256))
    for step in range(5):
        assert store.checkpoint("r", step, every_byte + f"step-{step}".encode())
    assert store.load_checkpoint("r") == Checkpoint(4, every_byte + b"step-4")
    # Last write wins even when it names an earlier step (a resumed run re-doing step 2).
    assert store.checkpoint("r", 2, b"")
    assert store.load_checkpoint("r") == (2, b"")
    assert f"{ns}:req:r:ckpt" in store.keys_for("r")


@pytest.mark.timeout(60)
def test_new_store_resumes_what_the_old_one_wrote(backend: Backend, ns: str) -> None:
    before = backend.store(ns)
    for rid in ("a", "b", "c"):
        before.put_request(rid, {"id": rid})
        before.checkpoint(rid, 1, f"{rid}-1".encode())
    before.checkpoint("b", 6, b"b-6")
    before.put_artifact("b", "preview", {"step": 6})
    before.end_request("c", "SUCCEEDED")
    before.close()
    with pytest.raises(Unavailable):
        before.get_request("a")

    after = backend.store(ns)  # the restarted scheduler
    try:
        assert after.list_inflight() == ["a", "b"]
        assert after.get_request("b") == {"id": "b"}
        assert after.load_checkpoint("a") == Checkpoint(1, b"a-1")
        assert after.load_checkpoint("b") == Checkpoint(6, b"b-6")
        assert after.artifacts("b") == {"preview": {"step": 6}}
        assert after.status("c") == "SUCCEEDED"
        assert after.checkpoint("b", 7, b"b-7")
        assert after.load_checkpoint("b") == Checkpoint(7, b"b-7")
    finally:
        after.close()


@pytest.mark.timeout(60)
def test_list_inflight_tracks_put_end_delete(store: StateStore) -> None:
    assert store.list_inflight() == []
    for rid in ("c", "a", "b", "d"):
        store.put_request(rid, {})
    assert store.list_inflight() == ["a", "b", "c", "d"]
    assert store.end_request("b", "FAILED")
    store.delete_request("c")
    assert store.list_inflight() == ["a", "d"]
    assert store.end_request("a", "SUCCEEDED")
    assert store.end_request("d", "CANCELLED")
    assert store.list_inflight() == []


@pytest.mark.timeout(60)
def test_end_request_sets_expiry_on_every_key_once(backend: Backend, store: StateStore, ns: str) -> None:
    store.put_request("r", {"p": 1})
    store.checkpoint("r", 3, b"three")
    store.put_artifact("r", "video", {"bytes": 99})
    keys = [f"{ns}:req:r:meta", f"{ns}:req:r:ckpt", f"{ns}:req:r:artifacts"]
    assert store.keys_for("r") == keys
    backend.assert_no_expiry(store, keys)

    assert store.end_request("r", "SUCCEEDED")
    assert store.status("r") == "SUCCEEDED"
    assert "r" not in store.list_inflight()
    # Exactly one terminal status: a second end changes nothing.
    assert not store.end_request("r", "FAILED")
    assert store.status("r") == "SUCCEEDED"
    assert not store.end_request("never-put", "FAILED")
    assert store.keys_for("never-put") == []
    backend.assert_expires(store, keys)


@pytest.mark.timeout(60)
def test_media_and_end_info_expire_with_the_request(backend: Backend, store: StateStore, ns: str) -> None:
    store.put_request("m", {"p": 1})
    assert store.put_media("m", "video.npy", b"\x00bytes")
    assert store.media("m", "video.npy") == b"\x00bytes" and store.media("m", "other") is None
    assert f"{ns}:req:m:media" in store.keys_for("m")
    assert store.end_info("m") is None
    assert store.end_request("m", "FAILED", {"error": {"code": "UNAVAILABLE", "details": {"retryable": True}}})
    assert store.end_info("m") == {"error": {"code": "UNAVAILABLE", "details": {"retryable": True}}}
    assert not store.put_media("m", "late", b"x")  # only while in flight
    backend.assert_expires(store, store.keys_for("m"))
    store.put_request("m", {"p": 2})  # a reused id starts clean: no old media, no old end
    assert store.media("m", "video.npy") is None and store.end_info("m") is None
    store.delete_request("m")
    assert store.keys_for("m") == []


@pytest.mark.timeout(60)
def test_lease_has_one_holder(backend: Backend, store: StateStore) -> None:
    assert store.lease_holder("scheduler") == ""
    assert store.acquire_lease("scheduler", "a@h:1", 30.0) == "a@h:1"
    assert store.acquire_lease("scheduler", "b@h:2", 30.0) == "a@h:1"  # held: b is told who holds it
    assert store.acquire_lease("scheduler", "a@h:1", 30.0) == "a@h:1"  # renewed by its holder
    store.release_lease("scheduler", "b@h:2")  # not b's: nothing happens
    assert store.lease_holder("scheduler") == "a@h:1"
    store.release_lease("scheduler", "a@h:1")
    assert store.acquire_lease("scheduler", "b@h:2", 30.0) == "b@h:2"


@pytest.mark.timeout(60)
def test_writes_after_end_or_delete_are_refused(backend: Backend, store: StateStore) -> None:
    store.put_request("ended", {})
    store.checkpoint("ended", 1, b"one")
    store.end_request("ended", "CANCELLED")
    assert not store.checkpoint("ended", 2, b"two")  # a step that finished after the cancel
    assert not store.put_artifact("ended", "video", {})
    assert store.load_checkpoint("ended") == Checkpoint(1, b"one")
    assert store.artifacts("ended") == {}
    backend.assert_expires(store, store.keys_for("ended"))

    store.put_request("gone", {})
    store.delete_request("gone")
    assert not store.checkpoint("gone", 1, b"x")
    assert not store.put_artifact("gone", "video", {})
    assert store.keys_for("gone") == []
    assert not store.checkpoint("never-put", 0, b"x")
    assert store.keys_for("never-put") == []


@pytest.mark.timeout(60)
def test_namespaces_are_isolated(backend: Backend, ns: str) -> None:
    one, two = backend.store(ns + "-one"), backend.store(ns + "-two")
    try:
        one.put_request("same-id", {"dep": 1})
        two.put_request("same-id", {"dep": 2})
        one.checkpoint("same-id", 1, b"one")
        assert two.load_checkpoint("same-id") is None
        assert one.get_request("same-id") == {"dep": 1}
        assert two.get_request("same-id") == {"dep": 2}
        one.end_request("same-id", "SUCCEEDED")
        assert one.list_inflight() == []
        assert two.list_inflight() == ["same-id"]
        two.delete_request("same-id")
        assert one.get_request("same-id") == {"dep": 1}
        assert all(key.startswith(ns + "-one:") for key in one.keys_for("same-id"))
        assert two.keys_for("same-id") == []
    finally:
        one.close()
        two.close()


@pytest.mark.timeout(60)
def test_delete_leaves_no_key(store: StateStore, ns: str) -> None:
    store.put_request("r", {"x": 1})
    assert store.keys_for("r") == [f"{ns}:req:r:meta"]
    store.checkpoint("r", 0, b"s")
    store.put_artifact("r", "video", {"uri": "mem://1"})
    assert len(store.keys_for("r")) == 3
    store.delete_request("r")
    assert store.keys_for("r") == []
    assert store.get_request("r") is None
    assert store.load_checkpoint("r") is None
    assert store.list_inflight() == []
    store.delete_request("r")  # idempotent
    store.put_request("e", {})
    store.end_request("e", "SUCCEEDED")
    store.delete_request("e")  # deleting an ended request drops it before its expiry
    assert store.keys_for("e") == []


@pytest.mark.timeout(60)
def test_artifacts_record_and_replace(store: StateStore) -> None:
    store.put_request("r", {})
    assert store.put_artifact("r", "video", {"uri": "v1", "bytes": 10})
    assert store.put_artifact("r", "preview", {"uri": "p1"})
    assert store.put_artifact("r", "video", {"uri": "v2", "bytes": 20})
    assert store.artifacts("r") == {"video": {"uri": "v2", "bytes": 20}, "preview": {"uri": "p1"}}
    assert store.artifacts("other") == {}


@pytest.mark.timeout(60)
def test_reused_id_starts_clean(backend: Backend, store: StateStore, ns: str) -> None:
    store.put_request("r", {"gen": 1})
    store.checkpoint("r", 9, b"nine")
    store.put_artifact("r", "video", {})
    store.end_request("r", "CANCELLED")
    store.put_request("r", {"gen": 2})
    assert store.status("r") == INFLIGHT
    assert store.get_request("r") == {"gen": 2}
    assert store.load_checkpoint("r") is None
    assert store.artifacts("r") == {}
    assert store.list_inflight() == ["r"]
    backend.assert_no_expiry(store, [f"{ns}:req:r:meta"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "call, field",
    [
        (lambda s: s.put_request("", {}), "request_id"),
        (lambda s: s.put_request("has space", {}), "request_id"),
        (lambda s: s.put_request("x" * 300, {}), "request_id"),
        (lambda s: s.put_request(7, {}), "request_id"),
        (lambda s: s.put_request("r", ["not", "a", "dict"]), "meta"),
        (lambda s: s.put_request("r", {"f": object()}), "meta"),
        (lambda s: s.put_request("r", {"nan": float("nan")}), "meta"),
        (lambda s: s.checkpoint("r", -1, b""), "step"),
        (lambda s: s.checkpoint("r", True, b""), "step"),
        (lambda s: s.checkpoint("r", 1, "text"), "loop_state"),
        (lambda s: s.put_artifact("r", "", {}), "artifact"),
        (lambda s: s.end_request("r", INFLIGHT), "status"),
        (lambda s: s.end_request("r", ""), "status"),
    ],
)
def test_bad_input_is_rejected_before_any_write(
    store: StateStore, call: Callable[[StateStore], object], field: str,
) -> None:
    with pytest.raises(InvalidRequest) as info:
        call(store)
    assert info.value.field == field
    assert store.keys_for("r") == []
    assert store.list_inflight() == []


@pytest.mark.timeout(60)
def test_readers_never_see_a_torn_checkpoint(backend: Backend, ns: str) -> None:
    writer, reader = backend.store(ns), backend.store(ns)
    writer.put_request("r", {})
    stop = threading.Event()
    torn: list[object] = []
    reads = 0

    def read_loop() -> None:
        nonlocal reads
        while not stop.is_set():
            got = reader.load_checkpoint("r")
            reads += 1
            if got is not None and got.loop_state != str(got.step).encode() * 1000:
                torn.append(got.step)

    thread = threading.Thread(target=read_loop)
    thread.start()
    try:
        for step in range(300):
            writer.checkpoint("r", step, str(step).encode() * 1000)
    finally:
        stop.set()
        thread.join(timeout=30)
        writer.close()
        reader.close()
    assert not thread.is_alive()
    assert reads > 0
    assert torn == []


@pytest.mark.timeout(60)
def test_racing_checkpoints_and_end_leave_no_unexpiring_key(backend: Backend, ns: str) -> None:
    stores = [backend.store(ns) for _ in range(4)]
    for i in range(20):
        rid = f"r{i}"
        stores[0].put_request(rid, {})
        barrier = threading.Barrier(len(stores))

        def checkpoint_loop(store: StateStore, rid: str = rid, barrier: threading.Barrier = barrier) -> None:
            barrier.wait(timeout=10)
            for step in range(20):
                store.checkpoint(rid, step, b"s")

        threads = [threading.Thread(target=checkpoint_loop, args=(s,)) for s in stores[1:]]
        for thread in threads:
            thread.start()
        barrier.wait(timeout=10)
        assert stores[0].end_request(rid, "CANCELLED")
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)
        # Whatever interleaving happened, every key the request has will expire.
        backend.assert_expires(stores[0], stores[0].keys_for(rid))
    for store in stores:
        store.close()


# --- Redis only: outages -------------------------------------------------------------------


own_server = redis_process_fixture()


def _outage_calls(store: StateStore) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("ping", store.ping),
        ("put_request", lambda: store.put_request("new", {})),
        ("get_request", lambda: store.get_request("r")),
        ("checkpoint", lambda: store.checkpoint("r", 2, b"two")),
        ("load_checkpoint", lambda: store.load_checkpoint("r")),
        ("list_inflight", store.list_inflight),
        ("end_request", lambda: store.end_request("r", "FAILED")),
        ("keys_for", lambda: store.keys_for("r")),
    ]


@pytest.mark.timeout(60)
def test_stopped_server_fails_fast_then_recovers(own_server) -> None:
    store = RedisStateStore(own_server.url, StoreConfig(timeout_s=1.0))
    store.put_request("r", {})
    store.checkpoint("r", 1, b"one")
    own_server.stop()
    for name, call in _outage_calls(store):
        start = time.monotonic()
        with pytest.raises(Unavailable) as info:
            call()
        elapsed = time.monotonic() - start
        assert elapsed < 5.0, (name, elapsed)
        assert f"127.0.0.1:{own_server.port}" in info.value.message
        assert info.value.code == "UNAVAILABLE"

    own_server.start()  # same port, empty (no persistence)
    store.ping()  # the same store object reconnects on its own
    assert store.list_inflight() == []
    store.put_request("r2", {"after": True})
    assert store.checkpoint("r2", 0, b"zero")
    assert store.load_checkpoint("r2") == Checkpoint(0, b"zero")
    store.close()


@pytest.mark.timeout(60)
def test_hung_server_times_out_instead_of_hanging(own_server) -> None:
    store = RedisStateStore(own_server.url, StoreConfig(timeout_s=1.0))
    store.put_request("r", {})
    own_server.pause()
    try:
        for name, call in _outage_calls(store)[:4]:
            start = time.monotonic()
            with pytest.raises(Unavailable) as info:
                call()
            elapsed = time.monotonic() - start
            # One socket timeout (1 s) and no pile of retries: the server really hung, and the
            # call gave up on the first timeout.
            assert 0.9 <= elapsed < 5.0, (name, elapsed)
            assert f"127.0.0.1:{own_server.port}" in info.value.message
    finally:
        own_server.resume()
    store.ping()
    assert store.get_request("r") == {}
    store.close()


@pytest.mark.timeout(60)
def test_unreachable_address_fails_fast() -> None:
    # A port nothing listens on: connection refused, reported at once with the address.
    from tests.redis_server import free_port

    port = free_port()
    store = RedisStateStore(f"redis://127.0.0.1:{port}/3", StoreConfig(timeout_s=1.0))
    start = time.monotonic()
    with pytest.raises(Unavailable, match=f"redis://127.0.0.1:{port}/3"):
        store.list_inflight()
    assert time.monotonic() - start < 5.0
    store.close()


# --- differential property test: Redis behaves exactly like memory ---------------------------


class SameBehaviour(RuleBasedStateMachine):
    url = ""

    def __init__(self) -> None:
        super().__init__()
        ns = f"p-{uuid.uuid4().hex[:12]}"
        config = StoreConfig(namespace=ns, ttl_after_end_s=TTL_S)
        self.memory = MemoryStateStore(config)
        self.redis = RedisStateStore(self.url, config)

    def both(self, call: Callable[[StateStore], object]) -> object:
        left, right = call(self.memory), call(self.redis)
        assert left == right
        return left

    @rule(rid=st.sampled_from("abc"), n=st.integers(0, 2))
    def put(self, rid: str, n: int) -> None:
        self.both(lambda s: s.put_request(rid, {"n": n}))

    @rule(rid=st.sampled_from("abc"), step=st.integers(0, 9), blob=st.binary(max_size=8))
    def checkpoint(self, rid: str, step: int, blob: bytes) -> None:
        self.both(lambda s: s.checkpoint(rid, step, blob))

    @rule(rid=st.sampled_from("abc"), name=st.sampled_from(["v", "p"]))
    def artifact(self, rid: str, name: str) -> None:
        self.both(lambda s: s.put_artifact(rid, name, {"name": name}))

    @rule(rid=st.sampled_from("abc"), status=st.sampled_from(["SUCCEEDED", "FAILED"]))
    def end(self, rid: str, status: str) -> None:
        self.both(lambda s: s.end_request(rid, status))

    @rule(rid=st.sampled_from("abc"))
    def delete(self, rid: str) -> None:
        self.both(lambda s: s.delete_request(rid))

    @invariant()
    def observables_agree(self) -> None:
        self.both(lambda s: s.list_inflight())
        for rid in "abc":
            self.both(lambda s: s.get_request(rid))
            self.both(lambda s: s.status(rid))
            self.both(lambda s: s.load_checkpoint(rid))
            self.both(lambda s: s.artifacts(rid))
            self.both(lambda s: s.keys_for(rid))

    def teardown(self) -> None:
        for rid in "abc":
            self.redis.delete_request(rid)
        self.redis.close()


@pytest.mark.timeout(60)
def test_redis_behaves_like_memory(redis_url: str) -> None:  # noqa: F811
    SameBehaviour.url = redis_url
    run_state_machine_as_test(
        SameBehaviour,
        settings=settings(
            max_examples=40, stateful_step_count=25, deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
