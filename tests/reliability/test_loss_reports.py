"""RELIABILITY 18 (loss reports) through every front door, on real processes: a fleet of no-op
pools with ONE denoiser, a scheduler checkpointing to a real redis-server, and the OpenAI-style
gateway (``python -m fleet.gateway``) in front of it.

* The only denoiser is SIGKILLed mid-denoise: the request fails with UNAVAILABLE whose report
  names the role, the replica, the step reached, that a checkpoint exists and ``retryable``
  (``resume_from_step`` = that checkpoint), in the client's error event and in GetRequest — not
  the transport's ``Stream removed`` text. Once a denoiser serves again, the same request sent
  again (same id, same parameters) continues from ``resume_from_step`` and succeeds.
* The same loss under a gateway job: the failed job's ``error`` carries ``retryable``,
  ``resume_from_step`` and ``lost`` (role, replica, step reached, checkpoint).
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from fastvideo3.client import FleetClient
from fleet.launcher import REPO_ROOT, free_port
from tests.fleet_fixture import START_TIMEOUT_S, dump_logs, wait_until
from tests.reliability.helpers import BUDGETS, SMALL, pool_units, sched_pools, stream

NS = "rel-loss"
STEPS = 400  # 0.05 s each: long enough to be killed mid-denoise
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def lone(real_redis, tmp_path_factory):
    from fleet.launcher import LocalFleet
    logs = tmp_path_factory.mktemp("loss-logs")
    fleet = LocalFleet("wan-tiny", fake=True, roles=("encoder", "denoiser", "decoder"), log_dir=logs,
                       scheduler_args=["--state-store", real_redis.url, "--state-namespace", NS, "--state-ttl", "120",
                                       "--checkpoint-every", "1", "--health-interval", "0.5",
                                       "--health-timeout", "0.5", *BUDGETS],
                       pool_args={"denoiser": ["--fake-step-seconds", "0.05"]})
    gateway = None
    try:
        fleet.start(timeout_s=START_TIMEOUT_S)
        port = free_port()
        with open(logs / "gateway.log", "ab") as log:
            gateway = subprocess.Popen([sys.executable, "-m", "fleet.gateway", "--scheduler", fleet.target,
                                        "--port", str(port), "--state-store", real_redis.url,
                                        "--state-namespace", NS + "-gw", "--exit-with-parent"],
                                       cwd=str(REPO_ROOT), stdout=log, stderr=subprocess.STDOUT)
        fleet.gateway = f"http://127.0.0.1:{port}"
        wait_until(lambda: _http(fleet.gateway + "/readyz", quiet=True), 60, "the gateway to be ready", 0.25)
        yield fleet
    except BaseException:
        dump_logs(fleet)
        raise
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(30)
        fleet.stop()


def _http(url: str, body: dict | None = None, quiet: bool = False):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except OSError:
        if quiet:
            return None
        raise


def _kill_denoiser_at_step(fleet, step_seen):
    """Wait until ``step_seen()`` is true, then SIGKILL the only denoiser; the kill's time."""
    wait_until(step_seen, 60, "the request to be denoising", 0.05)
    t = time.monotonic()
    fleet.kill(fleet.pools["denoiser"][0])
    return t


def test_last_denoiser_lost_the_report_names_it_and_a_retry_continues(lone):
    fleet = lone
    params = dict(seed=4, num_inference_steps=STEPS, request_id="lost-1", **SMALL)
    steps: list[int] = []
    outs = {}
    t = threading.Thread(target=lambda: outs.update(first=stream(
        fleet.target, "lost", on_event=lambda o, e: e.kind == "progress" and e.data["phase"] == "denoise"
        and steps.append(e.data["step"]), **params)), daemon=True)
    t.start()
    t_kill = _kill_denoiser_at_step(fleet, lambda: len(steps) >= 5)
    t.join(60)
    out = outs["first"]
    assert out.state == "FAILED" and out.t_end - t_kill < 10.0, (out.error, out.error_event)
    ev = out.error_event
    assert ev["code"] == "UNAVAILABLE" and ev["retryable"] is True, ev
    assert ev["loss"]["role"] == "denoiser" and ev["loss"]["replica"] == "denoiser-0", ev
    assert ev["loss"]["step_reached"] >= 5 and ev["loss"]["checkpoint"] is True, ev
    assert "denoiser replica denoiser-0" in ev["message"] and "Stream removed" not in ev["message"], ev
    resume = ev["resume_from_step"]
    # checkpoints are written beside the steps, not on their path: the kill, right after the 5th
    # progress event, may beat the newest one to the store, never the one a step before it
    assert max(1, ev["loss"]["step_reached"] - 2) <= resume <= ev["loss"]["step_reached"], ev
    with FleetClient(fleet.target) as c:
        status = c.get("lost-1")
    assert status["state"] == "FAILED" and status["error"]["retryable"] is True, status
    assert status["error"]["resume_from_step"] == resume and status["error"]["loss"]["replica"] == "denoiser-0"
    # a denoiser serves again: the same request (same id and parameters) continues from its checkpoint
    denoiser = fleet.restart(fleet.pools["denoiser"][0])
    wait_until(lambda: all(sched_pools(fleet.target).values()), 15, "the scheduler to see the denoiser again")
    before = pool_units([denoiser.target])
    again = stream(fleet.target, "lost", **params)
    assert again.state == "SUCCEEDED", (again.error, again.error_event)
    ran = again.denoise_steps()
    assert ran and ran[0] == resume + 1 and ran[-1] == STEPS, ran[:3]
    assert pool_units([denoiser.target]) - before == STEPS - resume  # nothing before the checkpoint again


def test_a_gateway_job_whose_last_denoiser_died_carries_the_report(lone):
    fleet = lone
    job = _http(fleet.gateway + "/v1/videos", {"model": "wan-tiny", "prompt": "lost behind the gateway",
                                                "size": "32x32", "fastvideo3": {"steps": STEPS, "frames": 9,
                                                                                "seed": 8}})

    def denoising():
        j = _http(f"{fleet.gateway}/v1/videos/{job['id']}")
        return j["status"] == "in_progress" and (j.get("fastvideo3") or {}).get("phase") == "denoise" \
            and j.get("progress", 0) >= 2

    _kill_denoiser_at_step(fleet, denoising)
    try:
        done = wait_until(lambda: (j := _http(f"{fleet.gateway}/v1/videos/{job['id']}"))["status"]
                          in ("failed", "completed") and j, 30, "the job to end", 0.2)
    finally:
        fleet.restart(fleet.pools["denoiser"][0])
        wait_until(lambda: all(sched_pools(fleet.target).values()), 15, "the scheduler to see the denoiser again")
    assert done["status"] == "failed", done
    err = done["error"]
    assert err["retryable"] is True and isinstance(err["resume_from_step"], int), err
    assert err["lost"]["role"] == "denoiser" and err["lost"]["replica"] == "denoiser-0", err
    assert err["lost"]["checkpoint"] is True and err["lost"]["step_reached"] >= err["resume_from_step"], err
    assert "denoiser-0" in err["message"] and "Stream removed" not in err["message"], err
