"""RELIABILITY 13 with step batching on: the scheduler is SIGKILLed mid-denoise while two requests
share every denoise batch, restarted against the same Redis, and both clients re-attach beside a
new request; each video is bit-identical to the request's uninterrupted run alone.

The scheduler here checkpoints every step to the real redis-server, so batch-invariant mode is on
by default (``--batch-invariant auto``): every denoise forward runs at the max batch (4 units),
padded, and the bucket is pinned in each request's checkpointed state. It routes to denoiser-0
only, so concurrent requests share its batches. (The main reliability scheduler runs
``--no-batching``; its resume test stays as it is.)
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from fastvideo3.client import FleetClient
from fastvideo3.errors import Unavailable
from tests.fleet_fixture import pool_describe, wait_until
from tests.reliability.helpers import BUDGETS, SMALL, stream, store_leftovers

NS = "rel-batched"
STEPS = 24
SPECS = {"batched-a": ("a red circle moving left", 31), "batched-b": ("a blue square moving up", 32)}
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def batched(real_fleet):
    d0 = real_fleet.pools["denoiser"][0].target
    target = real_fleet.add_scheduler(
        ["--state-store", real_fleet.redis.url, "--state-namespace", NS, "--state-ttl", "120",
         "--checkpoint-every", "1", "--max-batch", "4", "--pools", f"denoiser={d0}",
         "--health-interval", "0.5", "--health-timeout", "0.5", *BUDGETS], name="scheduler-batched")
    yield real_fleet, target, d0
    wait_until(lambda: not store_leftovers(real_fleet.redis.url, NS), 10, "no orphaned state-store keys")


def _run(target: str, rid: str, **kw):
    prompt, seed = SPECS[rid]
    return stream(target, prompt, seed=seed, num_inference_steps=STEPS, request_id=rid, **SMALL, **kw)


def test_scheduler_sigkill_with_batching_on_resumes_bit_identical(batched, balanced):
    fleet, target, d0 = batched
    with FleetClient(target) as c:
        assert c.describe()["description"]["batch_invariant_bucket"] == 4  # auto: durable checkpoints
    refs = {}
    for rid, (prompt, seed) in SPECS.items():  # each alone (its own id, so the ids below are fresh)
        out = stream(target, prompt, seed=seed, num_inference_steps=STEPS, **SMALL)
        assert out.state == "SUCCEEDED", (out.error, out.error_event)
        refs[rid] = out.frames()
    before = pool_describe(d0).counters
    sched = fleet.process("scheduler-batched")
    outs: dict = {}

    def kill_at_step(out, ev):
        if ev.kind == "progress" and ev.data["phase"] == "denoise" and ev.data["step"] == 10:
            fleet.kill(sched)

    threads = [threading.Thread(target=lambda r=r: outs.__setitem__(r, _run(target, r, on_event=kill_at_step)))
               for r in SPECS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for rid, out in outs.items():
        assert isinstance(out.error, Unavailable) and out.state is None, rid  # the streams died with it
    assert max(s for out in outs.values() for s in out.denoise_steps()) >= 10  # whichever got there first
    mid = pool_describe(d0).counters
    # the two shared batches before the kill: fewer forwards than units
    assert mid["units"] - before["units"] > mid["forwards"] - before["forwards"]
    fleet.restart(sched)
    mate = {}
    threads = [threading.Thread(target=lambda r=r: outs.__setitem__(r, _run(target, r))) for r in SPECS]
    threads.append(threading.Thread(target=lambda: mate.setdefault("out", stream(
        target, "a new batch-mate", seed=33, num_inference_steps=6, **SMALL))))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert mate["out"].state == "SUCCEEDED"
    for rid, out in outs.items():
        assert out.state == "SUCCEEDED", (rid, out.error, out.error_event)
        assert out.events[0].kind == "accepted"
        assert np.array_equal(out.frames(), refs[rid]), f"{rid} differs from its uninterrupted run alone"
    with FleetClient(target) as c:
        counters = c.describe()["counters"]
    assert counters["state.resumed"] == 2 and counters["state.resume_failed"] == 0
    assert counters["diffusion_step.multi_request_batches"] >= 1  # batching on after the restart too
    assert pool_describe(d0).counters["padding_rows"] > mid["padding_rows"]
