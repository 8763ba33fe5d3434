"""Durability pieces in one process (CPU, no fleet): the checkpoint blob, the resident snapshot
codec and its fingerprint binding, and a whole crash-and-resume over in-process executors —
the same Checkpointer and CoreScheduler the scheduler service runs, with a "crash" that drops
the scheduler object and a new one resuming from the same store."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastvideo3
from fastvideo3.errors import DataLoss
from fastvideo3.export.errors import FingerprintMismatch
from fastvideo3.loop.samplers import SamplerHistory
from fastvideo3.runtime.pool.resident import pool_identity, restore_regions, snapshot_regions
from fastvideo3.runtime.durability.resume import RunRecord
from fastvideo3.state import MemoryData, MemoryStateStore
from tests.helpers_resume import checkpointed_schedulers, engine_pools, tick_until_done, tick_until_step

KW = dict(num_frames=9, height=32, width=32, num_inference_steps=10, seed=3)


def test_run_record_round_trips_and_refuses_damage():
    rec = RunRecord(request={"request_id": "r"}, card_id="c", program=["a"], loop_index=0, loop_id="a",
                    loop_state='{"step": 4}', ctx={"k": [1, 2.5]}, placement={"denoiser": 1}, created=1.0,
                    started=2.0, snapshot=b"\x00snap\xff", snapshot_role="denoiser", snapshot_fingerprint="f")
    back = RunRecord.from_bytes(rec.to_bytes())
    assert back.to_bytes() == rec.to_bytes() and back.step == 4 and back.snapshot == b"\x00snap\xff"
    blob = rec.to_bytes()
    for bad in (blob[:-1], b"nope" + blob, blob[:-3] + b"xyz"):
        with pytest.raises(DataLoss):
            RunRecord.from_bytes(bad)


def test_resident_snapshot_is_exact_and_bound_to_the_runtime_identity():
    hist = SamplerHistory(order=2)
    hist.model_outputs = [None, torch.randn(1, 4, 2, 2)]
    hist.last_sample, hist.lower_order_nums, hist.this_order = torch.randn(1, 4, 2, 2), 1, 1
    latent = torch.randn(1, 4, 2, 2)
    ident = pool_identity("w1", "fp32", "cpu")
    blob = snapshot_regions(ident, latent, hist, 5)
    lat, h, step = restore_regions(ident, blob)
    assert step == 5 and torch.equal(lat, latent) and torch.equal(h.last_sample, hist.last_sample)
    assert h.model_outputs[0] is None and torch.equal(h.model_outputs[1], hist.model_outputs[1])
    assert (h.lower_order_nums, h.this_order) == (1, 1)
    for other in (pool_identity("w2", "fp32", "cpu"), pool_identity("w1", "bf16", "cpu")):
        with pytest.raises(FingerprintMismatch):
            restore_regions(other, blob)


@pytest.mark.timeout(180)
def test_crash_and_resume_in_process_is_bit_identical():
    with fastvideo3.Engine("wan-tiny-seeded") as engine:
        ref = engine.generate("a red circle", **KW).frames
        pools = engine_pools(engine)
        data = MemoryData()
        scheduler = checkpointed_schedulers(pools, data, every=3)

        first, _ = scheduler()
        run = first.submit(engine.resolve("a red circle", request_id="crashy", **KW), engine.card)
        tick_until_step(first, run, 7)  # the "crash" comes after step 7; the last checkpoint is at step 6
        del first
        second, cp = scheduler()
        assert cp.resume(engine.card) == ["crashy"]
        resumed = second.get("crashy")
        assert resumed.resumed and resumed.driver.state.step == 6
        tick_until_done(second, resumed)
        engine.scheduler = second  # collect the frames through the same transport
        assert np.array_equal(engine.result(resumed).frames, ref)
        store = MemoryStateStore(data=data)
        assert store.list_inflight() == ["crashy"]  # the service ends it (FleetRuntime.finish); do it here
        cp.finish(resumed)
        assert store.list_inflight() == [] and store.status("crashy") == "SUCCEEDED"


@pytest.mark.timeout(180)
def test_crash_and_resume_with_batching_on_is_bit_identical_in_batch_invariant_mode():
    """The same crash with step batching on: the request shares its batches with other requests
    before the crash and with others after it; batch-invariant mode (a bucket of 4 units pinned in
    its denoise state) keeps it bit-identical to its uninterrupted run alone."""
    with fastvideo3.Engine("wan-tiny-seeded", max_batch=4, batch_invariant=True) as engine:
        ref = engine.generate("a red circle", **KW).frames
        pools = engine_pools(engine)
        data = MemoryData()
        ctx = {"batch_bucket": 4}
        scheduler = checkpointed_schedulers(pools, data, every=3, max_batch=4)

        def mate(sched, name, **kw):
            return sched.submit(engine.resolve(name, request_id=name.replace(" ", "-"), **{**KW, **kw}), engine.card,
                                ctx=ctx)

        first, _ = scheduler()
        run = first.submit(engine.resolve("a red circle", request_id="crashy-batched", **KW), engine.card, ctx=ctx)
        mate(first, "mate one", seed=8)
        mate(first, "mate two", seed=9, num_inference_steps=5)
        tick_until_step(first, run, 7)
        assert first.counters["multi_request_batches"] >= 5
        del first
        second, cp = scheduler()
        assert "crashy-batched" in cp.resume(engine.card)
        for rid in [r for r in list(second.runs) if r != "crashy-batched"]:  # the old mates end here
            second.cancel(rid)
        mate(second, "mate three", seed=10, num_inference_steps=3)
        resumed = second.get("crashy-batched")
        assert resumed.resumed and resumed.driver.state.step == 6 and resumed.driver.state.batch_bucket == 4
        tick_until_done(second, resumed)
        assert second.counters["multi_request_batches"] >= 1
        engine.scheduler = second
        assert np.array_equal(engine.result(resumed).frames, ref)
