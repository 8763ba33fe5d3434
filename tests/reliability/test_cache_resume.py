"""Crash and resume mid-request with caching on: the interceptor's JSON state travels in the
checkpointed LoopState and its tensors in the resident snapshot, so the resumed request makes
the same decisions from the same residuals and its video is bit-identical to an uninterrupted
run. Same Checkpointer and CoreScheduler as the scheduler service, in one process; the denoiser
loses the request's region at the crash, so the snapshot is all that carries the residuals."""
from __future__ import annotations

import numpy as np
import pytest

import fastvideo3
from fastvideo3.state import MemoryData
from tests.helpers_resume import checkpointed_schedulers, engine_pools, tick_until_done, tick_until_step

KW = dict(num_frames=9, height=32, width=32, num_inference_steps=12, seed=3)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cache", [
    {"policy": "dbcache", "front_blocks": 1, "back_blocks": 1, "threshold": 0.3, "warmup_steps": 2,
     "taylorseer": True},
    {"policy": "teacache", "threshold": 0.3, "warmup_steps": 2},
])
def test_crash_and_resume_with_caching_is_bit_identical(cache):
    with fastvideo3.Engine("wan-tiny-seeded") as engine:
        ref = engine.generate("a red circle", cache=cache, **KW)
        reused = next(iter(ref.metadata["cache"]["reused_steps"].values()))
        assert any(s < 6 for s in reused) and any(s >= 6 for s in reused)  # reuse on both sides of the crash
        pools = engine_pools(engine)
        data = MemoryData()
        scheduler = checkpointed_schedulers(pools, data, every=3)

        first, _ = scheduler()
        run = first.submit(engine.resolve("a red circle", request_id="crashy", cache=cache, **KW), engine.card)
        tick_until_step(first, run, 7)  # the crash comes after step 7; the last checkpoint is at step 6
        assert run.driver.state.plugin_state  # the interceptor's state is in the LoopState
        del first
        engine.denoiser.regions.clear()  # the region (latent and residuals) is lost with the crash
        second, cp = scheduler()
        assert cp.resume(engine.card) == ["crashy"]
        resumed = second.get("crashy")
        assert resumed.resumed and resumed.driver.state.step == 6
        assert engine.denoiser.regions["crashy"].plugin  # the residuals came back from the snapshot
        tick_until_done(second, resumed)
        engine.scheduler = second
        video = engine.result(resumed)
        assert np.array_equal(video.frames, ref.frames)
        assert video.metadata["cache"]["reused_steps"] == ref.metadata["cache"]["reused_steps"]
        cp.finish(resumed)
