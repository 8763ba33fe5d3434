"""RELIABILITY 13 with caching on: the scheduler is SIGKILLed mid-denoise while the request's
DBCache (with TaylorSeer) is reusing residuals; restarted against the same Redis, it resumes
from the last checkpoint (the interceptor's JSON state in the LoopState, its residual tensors in
the denoiser's snapshot) and the client that re-attaches gets a video bit-identical to an
uninterrupted run with the same settings."""
from __future__ import annotations

import numpy as np
import pytest

from fastvideo3.errors import Unavailable
from tests.fleet_fixture import pool_describe
from tests.reliability.helpers import SMALL, pool_units, sched_counters, stream, stream_killing_scheduler

STEPS = 24
CACHE = {"policy": "dbcache", "front_blocks": 1, "back_blocks": 1, "threshold": 0.3, "warmup_steps": 2,
         "taylorseer": True}


@pytest.mark.timeout(300)
def test_scheduler_sigkill_with_caching_resumes_bit_identical(balanced):
    fleet = balanced
    prompt, seed = "a green triangle moving up", 12
    ref = stream(fleet.target, prompt, seed=seed, num_inference_steps=STEPS, cache=CACHE, **SMALL)
    assert ref.state == "SUCCEEDED", (ref.error, ref.error_event)
    settings = ref.events[0].data["resolved"]["cache"]  # the settings crossed the wire, in full
    assert settings["policy"] == "dbcache" and settings["taylorseer"] is True and settings["threshold"] == 0.3
    side = next(e.data["sidecar"] for e in ref.events if e.kind == "artifact" and e.data.get("sidecar"))
    assert side["cache"]["settings"] == settings and side["request"]["cache"] == settings  # provenance
    assert any(side["cache"]["reused_steps"].values())
    skipped = sum(pool_describe(t).counters.get("blocks_total", 0) - pool_describe(t).counters.get("blocks_computed", 0)
                  for t in [p.target for p in fleet.pools["denoiser"]])
    assert skipped > 0  # the denoisers reused middle blocks for it
    sched = fleet.process("scheduler")
    denoisers = [p.target for p in fleet.pools["denoiser"]]
    units_before = pool_units(denoisers)
    first = stream_killing_scheduler(fleet, prompt, seed=seed, num_inference_steps=STEPS, cache=CACHE,
                                     request_id="cache-resume-1", **SMALL)
    assert isinstance(first.error, Unavailable) and first.state is None
    fleet.restart(sched)
    resumed = stream(fleet.target, prompt, seed=seed, num_inference_steps=STEPS, cache=CACHE,
                     request_id="cache-resume-1", **SMALL)
    assert resumed.state == "SUCCEEDED", (resumed.error, resumed.error_event)
    assert STEPS <= pool_units(denoisers) - units_before <= STEPS + 3  # resumed, not restarted
    assert np.array_equal(resumed.frames(), ref.frames())
    counters = sched_counters(fleet.target)
    assert counters["state.resumed"] >= 1 and counters["state.resume_failed"] == 0
