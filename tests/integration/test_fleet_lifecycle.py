"""Health lifecycle at shutdown, on a fleet of no-op pools (``--fake``: no model math).

SIGTERM turns health NOT_SERVING at once, new work is refused with UNAVAILABLE, in-flight work
drains to completion, then the process exits 0 — for the scheduler and for a pool.
"""
from __future__ import annotations

import signal
import threading

import pytest

from fastvideo3.client import FleetClient, error_from_rpc
from fastvideo3.errors import Unavailable
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.v1 import pool_pb2
from services.common import convert
from tests.fleet_fixture import fleet_fixture, pool_describe, pool_stub, wait_until, went_not_serving

fleet = fleet_fixture(scope="module", fake=True, roles=("encoder", "denoiser", "decoder"),
                      pool_args={"denoiser": ["--fake-step-seconds", "0.05"]})


@pytest.mark.timeout(120)
def test_fake_fleet_serves_a_request(fleet):
    with FleetClient(fleet.target) as c:
        video = c.generate("no math", output_format="npy", num_inference_steps=3)
    assert video.frames.shape == (1, 2, 2, 3) and video.sidecar["request"]["num_inference_steps"] == 3


@pytest.mark.timeout(120)
def test_pool_sigterm_goes_not_serving_drains_in_flight_and_exits(fleet):
    pool = fleet.spawn_pool("denoiser", ["--fake-step-seconds", "3.0"])
    stub = pool_stub(pool.target)
    unit = WorkUnit(unit_id="u1", request_id="drain-1", loop_id="diffusion_denoise", kind="diffusion_step",
                    role="denoiser", card_id="wan-tiny", shape_sig="diffusion_step|fake", step=0, total=1,
                    params={"step": 0, "final": True, "latent_shape": [16, 3, 8, 8], "cfg_policy": "none"})
    out: dict = {}

    def execute() -> None:
        try:
            out["reply"] = stub.Execute(pool_pb2.ExecuteRequest(units=[convert.unit_to_wire(unit)]), timeout=30)
        except Exception as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=execute)
    t.start()
    wait_until(lambda: pool_describe(pool.target).counters.get("inflight_rpcs", 0) >= 1, 10, "the Execute in flight")
    pool.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: went_not_serving(pool), 10, "health NOT_SERVING after SIGTERM")
    with pytest.raises(Exception) as refused:  # new work during the drain is refused
        stub.Execute(pool_pb2.ExecuteRequest(units=[convert.unit_to_wire(unit)]), timeout=5)
    assert isinstance(error_from_rpc(refused.value), Unavailable)
    t.join(timeout=30)
    assert "error" not in out, out.get("error")
    res = convert.result_from_wire(out["reply"].results[0])
    assert res.ok and "latents" in res.outputs  # the in-flight unit finished
    assert pool.proc.wait(timeout=30) == 0


@pytest.mark.timeout(120)
def test_scheduler_sigterm_drains_running_requests(fleet):
    sched = fleet.process("scheduler")
    with FleetClient(fleet.target, timeout_s=60) as c:
        events = []
        stream = c.stream("a request that outlives the SIGTERM", output_format="npy", num_inference_steps=40)
        for ev in stream:
            events.append(ev)
            if ev.kind == "progress" and ev.data["phase"] == "denoise" and ev.data["step"] == 2:
                sched.proc.send_signal(signal.SIGTERM)
                wait_until(lambda: went_not_serving(sched), 10, "scheduler NOT_SERVING")
                with pytest.raises(Unavailable):
                    c.generate("too late", output_format="npy", num_inference_steps=1)
    assert events[-1].kind == "finished" and events[-1].data["state"] == "SUCCEEDED"
    assert [e for e in events if e.kind == "progress" and e.data["phase"] == "denoise"][-1].data["step"] == 40
    assert sched.proc.wait(timeout=30) == 0
    assert pool_describe(fleet.pools["denoiser"][0].target).resident_buffers == 0
