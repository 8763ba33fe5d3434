"""A pool's Describe facts are typed fields: built from the executor's describe() dict by
services/common/description.py, read by the scheduler without parsing JSON."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from fastvideo3.transport.base import TransportCaps
from fastvideo3.v1 import pool_pb2
from services.common.description import (
    TYPED_KEYS, current_adapters, diagnostics, executor_fields, transport_caps,
)

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]

DENOISER = {
    "role": "denoiser", "card": "wan-tiny", "device": "cpu", "precision": "fp32", "weights_digest": "sha256:ab",
    "counters": {"units": 3}, "transport": {"resident_buffers": 1}, "resident_regions": 2,
    "experts": ["transformer"], "dit_path": "fast",
    "adapters": {"mode": "per_row", "merged": None, "slots": 8, "max_rank": 64, "kernel": "torch",
                 "device_bytes": 10, "host_bytes": 20, "host_max_bytes": 30, "widened_weight_bytes": 0,
                 "widen_cache_bytes": 0, "counters": {"loads": 2},
                 "adapters": [{"id": "style", "version": "v1", "current": False, "rank": 4, "bytes": 5, "slot": None,
                               "in_use": 0, "source": "a.safetensors"},
                              {"id": "style", "version": "v2", "current": True, "rank": 4, "bytes": 5, "slot": 1,
                               "in_use": 2, "source": "b.safetensors"}]},
    "graph_buckets": [{"batch": 4, "signature": "4x16x3x4x4", "capture_s": 0.25, "memory_bytes": 1 << 20},
                      "2x16x3x4x4"],
    "parallel": {"spec": "ulysses2", "kind": "sp_ulysses", "cfg": 1, "ring": 1, "ulysses": 2, "world": 2,
                 "pad": True, "rank": 0, "backend": "gloo", "rank_pids": [11, 12], "broken": ""},
    "runtime_export": {"fingerprint": "fnv1a64:1"},
}


def test_the_executor_facts_become_typed_fields():
    d = pool_pb2.PoolDescription(**executor_fields(DENOISER, role="denoiser", fake=False))
    assert (d.precision, d.weights_digest) == ("fp32", "sha256:ab")
    assert (d.executor.kind, d.executor.fake, d.executor.resident_regions) == ("fast", False, 2)
    assert list(d.executor.experts) == ["transformer"]
    assert (d.parallel.spec, d.parallel.world, d.parallel.pad, list(d.parallel.rank_pids)) == ("ulysses2", 2, True,
                                                                                              [11, 12])
    assert d.adapters.mode == "per_row" and not d.adapters.HasField("merged")
    assert [(e.id, e.version, e.current, e.slot) for e in d.adapters.entries] == [
        ("style", "v1", False, -1), ("style", "v2", True, 1)]
    assert current_adapters(d) == {"style": "v2"}
    measured, named = d.graph_buckets
    assert (measured.batch, measured.signature, measured.capture_s, measured.memory_bytes) == (
        4, "4x16x3x4x4", 0.25, 1 << 20)
    assert (named.batch, named.signature, named.capture_s) == (0, "2x16x3x4x4", 0.0)  # a bare key: nothing measured


def test_reward_merged_and_fake_executors():
    reward = pool_pb2.PoolDescription(**executor_fields({"scorers": {"clip": "1"}}, role="reward", fake=False))
    assert dict(reward.scorers) == {"clip": "1"} and reward.executor.kind == "reward"
    assert not reward.HasField("parallel") and not reward.HasField("adapters")
    merged = executor_fields({"adapters": {"mode": "merged", "merged": {"id": "s", "version": "v", "scale": 0.8}}},
                             role="denoiser", fake=False)["adapters"]
    assert (merged.merged.id, merged.merged.scale) == ("s", 0.8) and current_adapters(
        pool_pb2.PoolDescription(adapters=merged)) == {}
    fake = pool_pb2.PoolDescription(**executor_fields({"fake": True, "device": "cpu (fake)"}, role="decoder",
                                                      fake=False))
    assert (fake.executor.kind, fake.executor.fake) == ("fake", True)
    dec = pool_pb2.PoolDescription(**executor_fields({"decode": {"max_decode_batch": 4, "fast": True, "time_chunk": 8,
                                                                 "channels_last": False, "fused": True}}, role="decoder",
                                                      fake=False))
    assert (dec.executor.kind, dec.executor.decoder.max_decode_batch, dec.executor.decoder.time_chunk,
            dec.executor.decoder.fused) == ("decoder", 4, 8, True)


def test_the_diagnostics_hold_only_what_no_field_holds():
    out = json.loads(diagnostics({"uptime_s": 1.0}, DENOISER))
    assert out["uptime_s"] == 1.0 and out["executor"]["runtime_export"] == {"fingerprint": "fnv1a64:1"}
    assert not set(out["executor"]) & set(TYPED_KEYS)
    assert json.loads(diagnostics({"uptime_s": 1.0}, None)) == {"uptime_s": 1.0}


def test_transport_caps_come_from_the_typed_fields():
    d = pool_pb2.PoolDescription(replica_id="r", transport_backends=["shm", "grpc"], host_id="h", process_id="p")
    assert transport_caps(d) == TransportCaps(("shm", "grpc"), "h", "p")
    from fastvideo3.errors import InvalidRequest
    with pytest.raises(InvalidRequest) as e:
        transport_caps(pool_pb2.PoolDescription(replica_id="r"))
    assert e.value.field == "host_id"


def _reads_of(attr: str, tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.ctx, ast.Load)]


def test_no_fleet_component_reads_the_diagnostics():
    found = []
    for top in ("services", "fleet"):
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text())
            found += [f"{path.relative_to(ROOT)}:{line}" for line in _reads_of("diagnostics_json", tree)]
    assert found == []
    assert _reads_of("diagnostics_json", ast.parse("x = json.loads(d.diagnostics_json)\n")) == [1]  # the check sees one
    assert _reads_of("diagnostics_json", ast.parse("d.diagnostics_json = '{}'\n")) == []  # writing is fine
