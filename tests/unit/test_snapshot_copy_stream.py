"""A denoiser snapshot is taken beside the batch in flight, not behind it.

With double-buffered dispatch the replica runs the next batch while a request that just finished
its step is being checkpointed. A snapshot that waited for that batch (for the executor's lock,
which a batch holds throughout, or, on CUDA, behind the batch's kernels on the steps' stream)
held the request out of the next batch: a gap in the denoiser at every checkpoint. The snapshot
takes no executor lock, and on CUDA copies on its own stream after an event its step recorded.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

CUDA = torch.cuda.is_available()
#: GPU clock cycles of the stand-in for the batch in flight (~1 s on a data-centre GPU)
BUSY_CYCLES = 2_000_000_000


def _executor(device: str = "cuda"):
    pytest.importorskip("pydantic")  # the card layer (absent on some GPU images)
    from fastvideo3.models.wan.cards import wan_tiny
    from fastvideo3.runtime.pool.executors import DenoiserExecutor
    from fastvideo3.transport import make_transport
    return DenoiserExecutor(wan_tiny(), make_transport("inproc", owner="snap"), device)


def _region(latent, ready):
    from fastvideo3.loop.samplers import SamplerHistory
    from fastvideo3.runtime.pool.dit_executor import Region
    return Region(latent=latent, history=SamplerHistory(order=2), step=3, ready=ready)


def test_a_snapshot_does_not_wait_for_the_batch_holding_the_executor():
    ex = _executor("cpu")
    latent = torch.randn(1, 16, 3, 8, 8)
    ex.regions["r"] = _region(latent, None)
    held, done = threading.Event(), threading.Event()

    def batch_in_flight():  # what Execute does for the whole batch
        with ex._lock:
            held.set()
            done.wait(10)

    t = threading.Thread(target=batch_in_flight, daemon=True)
    t.start()
    assert held.wait(5)
    try:
        with ThreadPoolExecutor(1) as pool:
            blob = pool.submit(ex.snapshot, "r").result(timeout=5)
            in_flight = not done.is_set()
    finally:
        done.set()
        t.join(10)
    assert in_flight
    assert ex.restore("r2", blob) == 3
    assert torch.equal(ex.regions["r2"].latent, latent)


def test_a_region_that_steps_during_its_snapshot_is_refused_not_torn(monkeypatch):
    from fastvideo3.errors import Unavailable
    from fastvideo3.runtime.pool import resident
    ex = _executor("cpu")
    ex.regions["r"] = _region(torch.randn(1, 16, 3, 8, 8), None)
    real = resident.snapshot_regions

    def stepping(*args, **kw):  # a step of the same request lands while the bytes are made
        blob = real(*args, **kw)
        ex.regions["r"].latent = torch.zeros(1, 16, 3, 8, 8)
        ex.regions["r"].step += 1
        return blob

    monkeypatch.setattr(resident, "snapshot_regions", stepping)
    with pytest.raises(Unavailable, match="changed while it was being snapshotted"):
        ex.snapshot("r")
    monkeypatch.setattr(resident, "snapshot_regions", real)
    assert ex.restore("r2", ex.snapshot("r")) == 4


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_snapshot_copies_beside_the_batch_queued_after_its_step():
    ex = _executor()
    latent = torch.randn(1, 16, 3, 8, 8, device="cuda")
    ready = torch.cuda.Event()
    ready.record()
    ex.regions["r"] = _region(latent, ready)
    torch.cuda._sleep(BUSY_CYCLES)  # the next batch, queued on the steps' stream after the step
    blob = ex.snapshot("r")
    still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert still_busy, "the snapshot waited for the batch queued after its step"
    assert ex.restore("r2", blob) == 3
    assert torch.equal(ex.regions["r2"].latent, latent)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_a_region_without_its_step_event_is_copied_in_stream_order():
    # a restored region (no step ran here yet) has no event: its copy is ordered after everything
    # queued, which is always correct
    ex = _executor()
    latent = torch.randn(1, 16, 3, 8, 8, device="cuda")
    ex.regions["r"] = _region(latent, None)
    torch.cuda._sleep(BUSY_CYCLES)
    blob = ex.snapshot("r")
    assert torch.cuda.current_stream().query(), "a copy in stream order finishes after the queued work"
    assert ex.restore("r2", blob) == 3
    assert torch.equal(ex.regions["r2"].latent, latent)
