"""bench/serving.py runs every part end to end on the CPU at tiny size (the real fleet, diffusers'
WanPipeline on the same random directory, the mixed and open-loop workloads, span files) and
writes the summary the H200 run fills; ``--merge`` of the parts' JSON rebuilds the same summary."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]
BENCH = Path(__file__).resolve().parents[2] / "bench"
REPO = BENCH.parent

TOP_KEYS = ("steps", "requests", "denoiser_utilization", "speedup_vs_request_at_a_time", "speedup_vs_diffusers",
            "rows_per_s_fraction_of_flop_bound")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "serving.py"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_serving_bench_all_parts_on_cpu(tiny_wan_dir, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    common = ["--card", str(tiny_wan_dir), "--device", "cpu", "--requests", "2", "--frames", "5", "--size", "32x32",
              "--guidance", "5", "--time-limit", "700"]
    # two calls, as on the GPU: the step counts' bursts and diffusers in one, mixed + open loop in the other
    p = _run([*common, "--steps", "2,3", "--parts", "batching,request,diffusers", "--diffusers-requests", "1",
              "--log-dir", str(tmp_path / "la"), "--out", str(a)], 800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    p = _run([*common, "--steps", "2,3", "--parts", "mixed,open_loop", "--capacity-from", str(a),
              "--mixed-small", "2", "--mixed-large", "1", "--large-frames", "9", "--large-size", "64x64",
              "--mixed-steps", "2", "--open-loop-s", "6", "--open-loop-warm-s", "1", "--open-loop-rate", "2",
              "--graph-rows", "2,1", "--log-dir", str(tmp_path / "lb"), "--out", str(b)], 800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # --graph-rows: the fleet served a card file declaring the workload's shape as its buckets
    assert json.loads(b.read_text())["run"]["card_graph_buckets"] == {
        "rows": [1, 2], "shapes": [{"frames": 5, "height": 32, "width": 32}]}
    assert json.loads((tmp_path / "lb" / "serving_card.json").read_text())["graph_buckets"]["rows"] == [1, 2]

    first = json.loads(a.read_text())
    s = first["summary"]
    for k in TOP_KEYS:
        assert _finite(s[k]), (k, s[k])
    assert [x["steps"] for x in s["summaries"]] == [2, 3]
    for x in s["summaries"]:
        assert all(_finite(x[k]) for k in TOP_KEYS), x
        assert x["utilization_source"] == "spans"
    burst = first["run"]["bursts"]["3"]["step_batching"]
    br = burst["breakdown"]
    assert br["requests"] == 2 and br["pools"]["denoiser"]["batches"] >= 3
    assert {"queue_wait", "admission", "unit_queue_wait", "dispatch"} <= set(br["scheduler_phases"])
    assert {"encoder", "denoiser", "decoder"} <= set(br["execute_by_role"])
    assert br["denoiser_gap_parts"]["scheduler"]["count"] >= 1
    assert burst["decode"]["units"] == 2

    out = tmp_path / "merged.json"
    p = _run(["--merge", str(a), str(b), "--out", str(out)], 120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    merged = json.loads(out.read_text())
    m = merged["summary"]
    assert [x["steps"] for x in m["summaries"]] == [2, 3]
    assert m["speedup_vs_diffusers"] == s["speedup_vs_diffusers"]
    ol = m["open_loop"]
    assert ol["arrivals"] >= 3 and ol["completed"] == ol["arrivals"]
    for k in ("denoiser_utilization", "latency_p50_s", "latency_p95_s", "rate_per_s", "offered_denoiser_utilization"):
        assert _finite(ol[k]), (k, ol)
    mx = m["mixed"]
    for k in ("large_latency_ratio_vs_alone", "small_latency_ratio_vs_alone"):
        assert _finite(mx[k]), (k, mx)


def test_serving_bench_refuses_bad_options(tmp_path):
    p = _run(["--device", "cpu", "--parts", "batching,nope"], 120)
    assert p.returncode == 2 and "--parts must be a subset" in p.stderr
    p = _run(["--device", "cpu", "--graph-rows", "1,x"], 120)
    assert p.returncode == 2 and "--graph-rows must be integers" in p.stderr
    p = _run(["--device", "cpu", "--open-loop-load", "5"], 120)
    assert p.returncode == 2 and "--open-loop-load must be in" in p.stderr


def test_dit_bounds_from_the_buckets_replay_times():
    """The summary's ``dit_bounds``: the DiT's own ms per row per bucket (warm-up replays at the
    bursts' shape only), the gain over a lone request's rows it allows, and the FLOP-bound ceiling."""
    sys.path.insert(0, str(BENCH))
    try:
        from serving_summary import step_summary
    finally:
        sys.path.remove(str(BENCH))
    buckets = [{"batch": r, "signature": "16x5x32x32.t512", "replay_ms": ms} for r, ms in ((2, 16.0), (8, 56.0))]
    buckets.append({"batch": 2, "signature": "16x9x60x104.t512", "replay_ms": 900.0})  # another shape: ignored
    result = {"workload": {"frames": 17, "size": "256x256", "cfg": True},
              "run": {"pools": {"denoiser-0": {"graph_buckets": buckets}},
                      "bursts": {"8": {"step_batching": {"requests": 4, "completed": 4, "wall_s": 2.0,
                                                         "pool_busy_s": {"denoiser": 1.0},
                                                         "denoise": {"dit_rows": 100}}}}},
              "flops": {"per_row": {"flops": 1e12}}, "matmul_peak": {"flops_per_s": 200e12}}
    b = step_summary(result, 8)["dit_bounds"]
    assert b["replay_ms_per_row"] == {"2": 8.0, "8": 7.0} and b["best_ms_per_row"] == 7.0
    assert b["speedup_vs_request_at_a_time_bound"] == round(8.0 / 7.0, 3)
    assert b["rows_per_s_fraction_of_flop_bound_bound"] == round(1000 / 7.0 / 200, 4)  # bound: 200 rows/s
    assert b["service_ms_per_row"] == 10.0  # 100 rows in 1 s of busy time
    result["run"]["pools"]["denoiser-0"]["graph_buckets"] = buckets[2:]
    assert "dit_bounds" not in step_summary(result, 8)


def test_offered_utilization_is_the_rate_times_a_requests_busy_seconds_in_the_bursts():
    sys.path.insert(0, str(BENCH))
    try:
        from serving_summary import offered_utilization
    finally:
        sys.path.remove(str(BENCH))
    ol = {"rate_per_s": 2.0, "rate_basis": {"denoiser_busy_s_per_request_by_steps": {"8": 0.1, "50": 0.5}},
          "by_steps": {"8": {"completed": 30}, "50": {"completed": 10}}}
    assert offered_utilization(ol) == round(2.0 * (30 * 0.1 + 10 * 0.5) / 40, 4)  # 0.4
    assert offered_utilization({**ol, "rate_basis": {}}) is None  # no bursts to price a request by
    assert offered_utilization({**ol, "by_steps": {}}) is None
