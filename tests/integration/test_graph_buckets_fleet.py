"""The denoiser service's warm phase and its trace, in a real fleet on a CPU: the pool's Describe
says what the warm phase did (graphs are captured on CUDA only, so here: none, and why), and every
denoise step's ``pool.execute`` span says the step ran eagerly, why, and with no padding rows.
The CPU path of bucket choice and padding itself is tests/unit/test_graph_buckets.py."""
import json

import pytest

from fastvideo3.client import FleetClient
from fastvideo3.telemetry import names as N
from fastvideo3.vocab import UnitKind
from tests.fleet_fixture import pool_describe, traced_fleet_fixtures

pytestmark = pytest.mark.timeout(400)

# the denoiser's --graph-buckets is left at its default
trace_file, fleet = traced_fleet_fixtures(("denoiser",), trace_scheduler=False,
                                          roles=("encoder", "denoiser", "decoder"))


def test_a_cpu_pool_says_it_captured_nothing_and_its_steps_say_eager(fleet, trace_file):
    d = pool_describe(fleet.pools["denoiser"][0].target)
    assert list(d.graph_buckets) == []  # the typed field: nothing captured
    diagnostics = json.loads(d.diagnostics_json)["executor"]  # for people reading a Describe: why
    assert diagnostics["graph_capture"] == "none: graphs are captured on CUDA only"
    with FleetClient(fleet.target) as c:
        c.generate("a cat", num_frames=5, height=32, width=32, num_inference_steps=3, seed=1, output_format="npy")
    counters = pool_describe(fleet.pools["denoiser"][0].target).counters
    assert counters["eager_forwards"] >= 3 and counters["graph_forwards"] == 0
    fleet.stop()  # SIGTERM: the pool flushes its spans
    spans = [json.loads(line) for line in trace_file.read_text().splitlines() if line.strip()]
    steps = [s["attributes"] for s in spans if s["name"] == N.SPAN_POOL_EXECUTE
             and s["attributes"].get(N.A_KIND) == UnitKind.DIFFUSION_STEP]
    assert len(steps) >= 3
    for a in steps:
        assert a[N.A_GRAPH_BUCKET] == N.GRAPH_EAGER and a[N.A_GRAPH_EAGER_REASON] == "no_graphs"
        assert a[N.A_GRAPH_PADDING_ROWS] == 0
