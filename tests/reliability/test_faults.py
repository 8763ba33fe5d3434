"""Request-fatal faults stay request-local, on the real fleet (faults armed per request id, see
conftest.py). Every test ends with the ``balanced`` resource check (RELIABILITY 4).

* A NaN watch on the denoise step aborts only the request whose latents went non-finite
  (ABORTED, naming the step) while its batch-mates in the same batch finish correctly.
* RELIABILITY 10 (second half): a forced out-of-memory fails one request only
  (RESOURCE_EXHAUSTED, field ``memory``) and the next request succeeds.
* RELIABILITY 11: a dropped, corrupted or stalled transfer fails that request within the
  transfer timeout with NOT_FOUND / DATA_LOSS / DEADLINE_EXCEEDED, releases its registrations
  and never yields a video.
* RELIABILITY 9 (transfer part): a descriptor whose shape disagrees with its bytes is refused
  with INVALID_ARGUMENT naming ``nbytes``, and the pool allocates nothing for it.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.transport.ref import TensorRef
from fastvideo3.v1 import pool_pb2
from services.common import convert
from tests.fleet_fixture import health, pool_describe, pool_stub, wait_until
from tests.reliability.conftest import FETCH_TIMEOUT_S
from tests.reliability.helpers import SMALL, sched_counters, sched_pools, stream

STEPS = 8
#: the NaN test's batch-mates run longer than the victim, so its first steps always meet them
MATE_STEPS = 3 * STEPS


@pytest.mark.timeout(180)
def test_nan_aborts_only_its_request_while_batch_mates_finish(balanced):
    fleet = balanced
    # an earlier test may have restarted denoiser-0: start once the pool serves and the one-replica
    # scheduler's health watch sees it so (its counters then count this test's batches)
    d0 = fleet.pools["denoiser"][0]
    wait_until(lambda: health(d0.target) == "SERVING", timeout_s=120, what="denoiser-0 serving")
    wait_until(lambda: sched_pools(fleet.one).get(d0.target), timeout_s=60,
               what="the one-replica scheduler sees denoiser-0 healthy")
    prompts = {"nan-mate-0": ("a red ball", 51), "nan-mate-1": ("a green tree", 52)}
    # the mates run three times the victim's steps and the victim joins once both step: its steps
    # 0-2 (NaN at 2) then share every batch with them however slowly the machine admits it
    mate_kw = dict(num_inference_steps=MATE_STEPS, **SMALL)
    refs = {rid: stream(fleet.target, p, seed=s, **mate_kw).frames() for rid, (p, s) in prompts.items()}
    before = sched_counters(fleet.one)
    stepping = {rid: threading.Event() for rid in prompts}

    def on_event(out, ev):
        if ev.kind == "progress" and ev.data["phase"] == "denoise" and out.request_id in stepping:
            stepping[out.request_id].set()

    results: dict[str, object] = {}

    def mate(rid: str, prompt: str, seed: int) -> None:
        results[rid] = stream(fleet.one, prompt, seed=seed, request_id=rid, on_event=on_event, **mate_kw)

    threads = [threading.Thread(target=mate, args=(rid, p, s), daemon=True) for rid, (p, s) in prompts.items()]
    for t in threads:
        t.start()
    assert all(e.wait(60) for e in stepping.values()), "the mates never started stepping"
    victim = stream(fleet.one, "victim", seed=50, num_inference_steps=STEPS, request_id="nan-victim", **SMALL)
    for t in threads:
        t.join(timeout=120)
    mates = [results[rid] for rid in prompts]
    after = sched_counters(fleet.one)
    key = "diffusion_step.multi_request_batches"
    assert after.get(key, 0) > before.get(key, 0)  # the victim and its mates shared batches
    cfg = victim.events[0].data["resolved"]["cfg_policy"]  # one DiT row per unit, two with batched CFG
    rows = pool_describe(fleet.pools["denoiser"][0].target).counters["max_batch_rows"]
    assert rows >= 3 * (2 if cfg == "batched" else 1), rows  # all three ran in one forward
    assert victim.state == "FAILED"
    err = victim.error_event
    assert err["code"] == "ABORTED" and err["step"] == 2 and "non-finite" in err["message"], err
    assert not victim.artifact()
    for out in mates:
        assert out.state == "SUCCEEDED", (out.request_id, out.error_event)
        frames = out.frames()
        assert np.isfinite(frames).all()
        np.testing.assert_allclose(frames, refs[out.request_id], atol=1e-3)  # batching reorders sums only


@pytest.mark.timeout(120)
def test_forced_oom_fails_one_request_and_the_next_succeeds(balanced):
    fleet = balanced
    victim = stream(fleet.target, "too big", seed=1, num_inference_steps=4, request_id="oom-victim", **SMALL)
    assert victim.state == "FAILED"
    err = victim.error_event
    assert err["code"] == "RESOURCE_EXHAUSTED" and err["field"] == "memory" and err["step"] == 1, err
    nxt = stream(fleet.target, "fits", seed=2, num_inference_steps=4, **SMALL)
    assert nxt.state == "SUCCEEDED"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind, code", [("drop", "NOT_FOUND"), ("corrupt", "DATA_LOSS"),
                                        ("stall", "DEADLINE_EXCEEDED")])
def test_transfer_fault_fails_that_request_within_the_transfer_timeout(balanced, kind, code):
    fleet = balanced
    t0 = time.monotonic()
    out = stream(fleet.target, "a transfer goes wrong", seed=3, num_inference_steps=4, request_id=f"xfer-{kind}",
                 **SMALL)
    elapsed = out.t_end - t0
    assert out.state == "FAILED", (out.state, out.error)
    assert out.error_event["code"] == code, out.error_event
    assert out.error_event["step"] == 0  # the denoiser's first step pulls the embeddings
    assert not out.artifact() and not out.denoise_steps()  # never a video, not a single step
    assert elapsed < FETCH_TIMEOUT_S + 5.0, elapsed
    ok = stream(fleet.target, "the next one is fine", seed=4, num_inference_steps=4, **SMALL)
    assert ok.state == "SUCCEEDED"


@pytest.mark.timeout(60)
def test_descriptor_whose_shape_disagrees_with_its_bytes_is_refused(balanced):
    fleet = balanced
    d0 = fleet.pools["denoiser"][0].target
    ref = TensorRef(owner="encoder-0", buffer_id="bogus/prompt_embeds#1", dtype="float32", shape=(1, 64, 64),
                    nbytes=12, checksum="fsum64:0", backend="shm")  # built as a wire message would bring it
    unit = WorkUnit("u-bad", "bad-descriptor", "diffusion_denoise", "diffusion_step", "denoiser", "wan-tiny-seeded",
                    "sig", inputs={"prompt_embeds": ref}, step=0,
                    params={"step": 0, "seed": 0, "latent_shape": [16, 3, 4, 4], "cfg_policy": "none",
                            "timestep": 999.0, "sigmas": [1.0, 0.0], "guidance": 1.0, "sampler": "euler",
                            "final": True})
    resp = pool_stub(d0).Execute(pool_pb2.ExecuteRequest(units=[convert.unit_to_wire(unit)]), timeout=30)
    res = convert.result_from_wire(resp.results[0])
    assert not res.ok and res.error.code == "INVALID_ARGUMENT" and res.error.field == "nbytes", res.error
    assert pool_describe(d0).resident_buffers == 0  # nothing allocated for it
