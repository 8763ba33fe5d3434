"""One trace per request across the real multi-process fleet: the scheduler's WorkUnit spans
are the parents of the pools' execute spans (W3C context through gRPC metadata + WorkUnit)."""
import json
from collections import defaultdict

import pytest

from fastvideo3.client import FleetClient
from tests.fleet_fixture import traced_fleet_fixtures

pytestmark = pytest.mark.timeout(400)

ROLES = ("encoder", "denoiser", "decoder")
trace_file, fleet = traced_fleet_fixtures(ROLES, trace_scheduler=True, roles=ROLES)


def _spans(path):
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def test_one_trace_per_request_and_pool_spans_are_children_of_unit_spans(fleet, trace_file):
    ids = []
    with FleetClient(fleet.target) as c:
        for i in range(3):
            v = c.generate(f"a cat number {i}", num_frames=5, height=32, width=32, num_inference_steps=3, seed=i,
                           output_format="npy")
            ids.append(v.request_id)
    fleet.stop()  # SIGTERM: every process flushes its spans

    spans = _spans(trace_file)
    by_id = {s["span_id"]: s for s in spans}
    roots = [s for s in spans if s["name"] == "fastvideo3.request"]
    assert len(roots) >= 3
    req_trace = {}
    for s in roots:
        rid = s["attributes"].get("fastvideo3.request_id")
        req_trace[rid] = s["trace_id"]
    assert set(ids) <= set(req_trace) and len({req_trace[r] for r in ids}) == 3  # one trace each

    per_trace = defaultdict(list)
    for s in spans:
        per_trace[s["trace_id"]].append(s)
    for rid in ids:
        tr = per_trace[req_trace[rid]]
        names = {s["name"] for s in tr}
        units = [s for s in tr if s["name"] == "fastvideo3.unit"]
        pool = [s for s in tr if s["name"] == "fastvideo3.pool.execute"]
        assert units and pool, names
        assert len(pool) == len(units)  # every unit ran once in a pool, inside this request's trace
        for p in pool:
            parent = by_id[p["parent_id"]]
            assert parent["name"] == "fastvideo3.unit" and parent["trace_id"] == p["trace_id"]
            assert p["attributes"].get("fastvideo3.request_id", rid) == rid
        kinds = {u["attributes"].get("fastvideo3.kind") for u in units}
        assert {"encoder_chunk", "diffusion_step", "vae_tile"} <= kinds
        assert all("fastvideo3.predicted_gpu_s" in u["attributes"] for u in units)
        # spans from more than one process share the trace
        assert len({s["attributes"].get("service.name", s.get("service")) for s in tr}) >= 2
