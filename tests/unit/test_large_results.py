"""Inline results larger than a gRPC message: a pool holds them back and the scheduler streams them
(services/common/artifacts.py, RolePool.ReadArtifact). A decoder's batch of two 33x480x832 float32
``.npy`` files is ~316 MB, over the 256 MiB message limit; before the hold-back it failed every such
request with RESOURCE_EXHAUSTED."""
from __future__ import annotations

import time
from contextlib import contextmanager

import grpc
import pytest

from fastvideo3.card.registry import resolve_card
from fastvideo3.errors import NotFound, ResourceExhausted
from fastvideo3.loop.protocol import StepResult
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.v1 import common_pb2, pool_pb2, pool_pb2_grpc, work_pb2
from fastvideo3.vocab import Role, UnitKind
from services.common import artifacts
from services.common.artifacts import ArtifactStore, hold_back_large
from services.common.pool import PoolConfig, RolePoolServicer
from services.common.server import MAX_MESSAGE_BYTES, ServiceHost
from services.scheduler.remote import RemoteExecutor

pytestmark = pytest.mark.timeout(180)


def test_store_reads_once_in_order_then_forgets():
    store = ArtifactStore(budget_bytes=100)
    aid = store.put("r1", bytes(range(50)))
    assert store.held_bytes == 50 and len(store) == 1
    got = list(store.chunks(aid, chunk_bytes=16))
    assert [len(c) for c, _ in got] == [16, 16, 16, 2] and {t for _, t in got} == {50}
    assert b"".join(c for c, _ in got) == bytes(range(50))
    assert store.held_bytes == 0 and len(store) == 0
    with pytest.raises(NotFound) as e:
        list(store.chunks(aid))
    assert e.value.field == "artifact_id"


def test_store_budget_release_and_expiry():
    store = ArtifactStore(budget_bytes=100, ttl_s=0.2)
    store.put("r1", b"x" * 60)
    with pytest.raises(ResourceExhausted) as e:
        store.put("r2", b"y" * 60)
    assert (e.value.field, e.value.limit) == ("artifact_budget_bytes", "100")
    assert store.release("r1") == 1 and store.held_bytes == 0
    store.put("r2", b"y" * 60)
    time.sleep(0.3)  # a scheduler that never came back for it: expired on the next put
    store.put("r3", b"z" * 60)
    assert store.counters["artifacts_expired"] == 1 and store.held_bytes == 60


def test_hold_back_keeps_small_results_inline_and_bounds_the_reply(monkeypatch):
    monkeypatch.setattr(artifacts, "INLINE_RESULT_BYTES", 40)
    monkeypatch.setattr(artifacts, "INLINE_REPLY_BYTES", 50)
    store = ArtifactStore(budget_bytes=1000)
    wire = [work_pb2.StepResult(unit_id=f"u{i}", request_id=f"r{i}", ok=True, inline_data=b"a" * n)
            for i, n in enumerate([30, 45, 30, 0, 10])]
    hold_back_large(wire, store)
    # 30 stays; 45 is over the per-result bound; 30 more would pass the reply bound; 10 fits
    assert [len(r.inline_data) for r in wire] == [30, 0, 0, 0, 10]
    assert [r.artifact_bytes for r in wire] == [0, 45, 30, 0, 0]
    assert all(r.ok for r in wire) and len(store) == 2


def test_hold_back_fails_only_the_result_that_does_not_fit(monkeypatch):
    monkeypatch.setattr(artifacts, "INLINE_RESULT_BYTES", 10)
    store = ArtifactStore(budget_bytes=50)
    wire = [work_pb2.StepResult(unit_id=f"u{i}", request_id=f"r{i}", ok=True, inline_data=b"a" * 40) for i in range(2)]
    hold_back_large(wire, store)
    assert wire[0].ok and wire[0].artifact_id
    assert not wire[1].ok and common_pb2.Error.Code.Name(wire[1].error.code) == "RESOURCE_EXHAUSTED" and wire[1].error.field == "artifact_budget_bytes"
    assert not wire[1].inline_data and not wire[1].artifact_id


class _BigDecoder:
    """An executor whose every unit returns ``size`` bytes inline (as a decoder returns its file)."""

    def __init__(self, size: int):
        self.size = size

    def execute(self, units):
        return [StepResult(u.unit_id, u.request_id, inline=bytes([i % 251]) * self.size, payload={"n": self.size})
                for i, u in enumerate(units)]

    def release(self, request_id: str) -> None:
        pass

    def describe(self) -> dict:
        return {"role": "decoder", "device": "cpu", "precision": "fp32", "weights_digest": ""}


class _NoTransport:
    @contextmanager
    def use(self, backend):
        yield

    def stats(self) -> dict:
        return {}


@pytest.fixture
def decoder_pool():
    card = resolve_card("wan-tiny")
    host = ServiceHost(["fastvideo3.v1.RolePool"], "127.0.0.1", 0)
    servicer = RolePoolServicer(PoolConfig(role=Role.DECODER, port=0), host, "decoder@test")
    pool_pb2_grpc.add_RolePoolServicer_to_server(servicer, host.server)
    port = host.start()
    host.set_serving(True)
    remote = RemoteExecutor(Role.DECODER, f"127.0.0.1:{port}", rpc_timeout_s=120.0)
    yield servicer, remote, card
    remote.channel.close()
    host.server.stop(None).wait(5.0)  # no grace period: no thread outlives the test


def _units(card, n: int) -> list[WorkUnit]:
    return [WorkUnit(unit_id=f"u{i}", request_id=f"req{i}", loop_id="decode", kind=UnitKind.VAE_TILE,
                     role=Role.DECODER, card_id=card.model_id, shape_sig="s") for i in range(n)]


def test_a_batch_over_the_message_limit_arrives_whole(decoder_pool):
    servicer, remote, card = decoder_pool
    size = 158 << 20  # one 33x480x832 float32 clip as .npy, roughly; two exceed the limit
    assert 2 * size > MAX_MESSAGE_BYTES
    servicer.attach(_BigDecoder(size), _NoTransport(), card)
    results = remote.execute(_units(card, 2))
    assert [r.ok for r in results] == [True, True]
    assert [len(r.inline) for r in results] == [size, size]
    assert results[0].inline[:3] == b"\x00\x00\x00" and results[1].inline[-3:] == b"\x01\x01\x01"
    assert results[1].payload == {"n": size}
    assert remote.counters["artifact_reads"] == 2 and remote.counters["artifact_bytes"] == 2 * size
    assert len(servicer.artifacts) == 0  # read to the end: forgotten


def test_without_the_hold_back_the_same_batch_is_refused(decoder_pool, monkeypatch):
    """The failure the hold-back removes, reproduced: it is what the test above would see."""
    servicer, remote, card = decoder_pool
    monkeypatch.setattr(artifacts, "INLINE_RESULT_BYTES", 1 << 40)
    monkeypatch.setattr(artifacts, "INLINE_REPLY_BYTES", 1 << 40)
    servicer.attach(_BigDecoder(140 << 20), _NoTransport(), card)
    with pytest.raises(ResourceExhausted):
        remote.execute(_units(card, 2))


def test_released_request_drops_its_held_result(decoder_pool):
    servicer, remote, card = decoder_pool
    servicer.attach(_BigDecoder(artifacts.INLINE_RESULT_BYTES + 1), _NoTransport(), card)
    req = pool_pb2.ExecuteRequest(units=[], batch_id="b")
    from services.common import convert
    req.units.extend(convert.unit_to_wire(u, "") for u in _units(card, 1))
    resp = remote.stub.Execute(req, timeout=30)
    (held,) = resp.results
    assert held.artifact_id and not held.inline_data and len(servicer.artifacts) == 1
    remote.stub.Release(pool_pb2.ReleaseRequest(request_id="req0"), timeout=10)
    assert len(servicer.artifacts) == 0
    with pytest.raises(grpc.RpcError) as e:
        list(remote.stub.ReadArtifact(pool_pb2.ReadArtifactRequest(artifact_id=held.artifact_id), timeout=10))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "artifact_id" in e.value.details()
