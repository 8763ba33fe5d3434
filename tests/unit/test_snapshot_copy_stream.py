"""A denoiser snapshot copies its region beside the batch in flight (CUDA), not behind it.

With double-buffered dispatch the next batch is queued on the device while a request that just
finished its step is being checkpointed. Copied on the stream the steps run on, the snapshot
waited for that whole batch, and the request missed the next one: a gap in the denoiser at every
checkpoint. The region records an event after its step; the copy waits for that event alone.
"""
from __future__ import annotations

import pytest
import torch

CUDA = torch.cuda.is_available()
#: GPU clock cycles of the stand-in for the batch in flight (~1 s on a data-centre GPU)
BUSY_CYCLES = 2_000_000_000


def _executor():
    pytest.importorskip("pydantic")  # the card layer (absent on some GPU images)
    from fastvideo3.models.wan.cards import wan_tiny
    from fastvideo3.runtime.pool.executors import DenoiserExecutor
    from fastvideo3.transport import make_transport
    return DenoiserExecutor(wan_tiny(), make_transport("inproc", owner="snap"), "cuda")


def _region(latent, ready):
    from fastvideo3.loop.samplers import SamplerHistory
    from fastvideo3.runtime.pool.dit_executor import Region
    return Region(latent=latent, history=SamplerHistory(order=2), step=3, ready=ready)


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
