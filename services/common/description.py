"""A pool's Describe answer: the executor's ``describe()`` dict turned into typed
``PoolDescription`` fields, once, here.

Every fact another process acts on (state, precision, weights digest, transport caps, the
parallel plan, scorers, adapters, graph buckets) is a typed field; the scheduler reads those
fields and nothing else. What is left of the executor's dict (its counters, transport
statistics, the runtime export's names) goes to ``diagnostics_json`` for people reading a
Describe; nothing in the fleet parses it.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from fastvideo3.v1 import pool_pb2

#: executor describe() keys that become typed fields (and so leave the diagnostics)
TYPED_KEYS = ("precision", "weights_digest", "scorers", "adapters", "parallel", "graph_buckets", "experts",
              "resident_regions", "dit_path", "fake", "decode")


def executor_fields(d: Mapping[str, Any], *, role: str, fake: bool) -> dict[str, Any]:
    """The typed ``PoolDescription`` fields from an executor's ``describe()`` dict."""
    out: dict[str, Any] = {
        "precision": str(d.get("precision", "")), "weights_digest": str(d.get("weights_digest", "")),
        "executor": pool_pb2.ExecutorSummary(
            kind="fake" if fake or d.get("fake") else str(d.get("dit_path") or role), fake=bool(fake or d.get("fake")),
            resident_regions=int(d.get("resident_regions", 0)), experts=[str(e) for e in d.get("experts") or ()]),
        "scorers": {str(k): str(v) for k, v in (d.get("scorers") or {}).items()},
        "graph_buckets": [graph_bucket(b) for b in d.get("graph_buckets") or ()],
    }
    if d.get("decode"):
        dec = d["decode"]
        out["executor"].decoder.CopyFrom(pool_pb2.DecoderSettings(
            max_decode_batch=int(dec.get("max_decode_batch", 0)), fast=bool(dec.get("fast")),
            time_chunk=int(dec.get("time_chunk") or 0), channels_last=bool(dec.get("channels_last")),
            fused=bool(dec.get("fused"))))
    if d.get("parallel"):
        out["parallel"] = parallel_info(d["parallel"])
    if d.get("adapters"):
        out["adapters"] = adapter_state(d["adapters"])
    return out


def graph_bucket(b: Any) -> pool_pb2.GraphBucket:
    """A bucket as the executor reports it: a dict ``{batch, signature, capture_s, memory_bytes, replay_ms}``,
    or only its shape key (a string: the bucket is prepared, nothing about it measured)."""
    if isinstance(b, Mapping):
        return pool_pb2.GraphBucket(batch=int(b.get("batch", 0)), signature=str(b.get("signature", "")),
                                    capture_s=float(b.get("capture_s", 0.0)),
                                    memory_bytes=int(b.get("memory_bytes", 0)),
                                    replay_ms=float(b.get("replay_ms", 0.0)))
    return pool_pb2.GraphBucket(signature=str(b))


def parallel_info(p: Mapping[str, Any]) -> pool_pb2.ParallelInfo:
    return pool_pb2.ParallelInfo(
        spec=str(p.get("spec", "")), kind=str(p.get("kind", "")), cfg=int(p.get("cfg", 1)), ring=int(p.get("ring", 1)),
        ulysses=int(p.get("ulysses", 1)), world=int(p.get("world", 1)), pad=bool(p.get("pad", True)),
        rank=int(p.get("rank", 0)), backend=str(p.get("backend", "")),
        rank_pids=[int(x) for x in p.get("rank_pids") or ()], broken=str(p.get("broken") or ""))


def adapter_state(a: Mapping[str, Any]) -> pool_pb2.AdapterState:
    msg = pool_pb2.AdapterState(
        mode=str(a.get("mode", "")), slots=int(a.get("slots", 0)), max_rank=int(a.get("max_rank", 0)),
        kernel=str(a.get("kernel", "")), device_bytes=int(a.get("device_bytes", 0)),
        host_bytes=int(a.get("host_bytes", 0)), host_max_bytes=int(a.get("host_max_bytes", 0)),
        widened_weight_bytes=int(a.get("widened_weight_bytes", 0)),
        widen_cache_bytes=int(a.get("widen_cache_bytes", 0)),
        entries=[pool_pb2.AdapterEntry(id=str(e["id"]), version=str(e["version"]), current=bool(e.get("current")),
                                       rank=int(e.get("rank", 0)), bytes=int(e.get("bytes", 0)),
                                       slot=int(e["slot"]) if e.get("slot") is not None else -1,
                                       in_use=int(e.get("in_use", 0)), source=str(e.get("source") or ""))
                 for e in a.get("adapters") or ()],
        counters={str(k): float(v) for k, v in (a.get("counters") or {}).items()})
    if a.get("merged"):
        m = a["merged"]
        msg.merged.CopyFrom(pool_pb2.MergedAdapter(id=str(m["id"]), version=str(m["version"]),
                                                   scale=float(m.get("scale", 1.0))))
    return msg


def diagnostics(info: Mapping[str, Any], executor: Mapping[str, Any] | None) -> str:
    """``diagnostics_json``: ``info`` plus what of the executor's dict no typed field holds."""
    out = dict(info)
    if executor is not None:
        out["executor"] = {k: v for k, v in executor.items() if k not in TYPED_KEYS}
    return json.dumps(out, default=str)


def current_adapters(description: pool_pb2.PoolDescription) -> dict[str, str]:
    """id -> version of the adapters a replica serves new requests with."""
    return {e.id: e.version for e in description.adapters.entries if e.current}


def transport_caps(description: pool_pb2.PoolDescription):
    """The replica's :class:`~fastvideo3.transport.base.TransportCaps`, from its typed fields."""
    from fastvideo3.errors import InvalidRequest
    from fastvideo3.transport.base import TransportCaps
    if not description.host_id:
        raise InvalidRequest(f"replica {description.replica_id or '?'} reports no host_id (still loading?)",
                             field="host_id")
    return TransportCaps(tuple(description.transport_backends), description.host_id, description.process_id)
