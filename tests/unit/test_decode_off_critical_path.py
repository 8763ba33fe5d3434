"""A batched decode is off the denoiser's critical path: with the service's pipelined dispatch,
two requests that reach the decoder together are decoded in one batch, and while that batch runs
(seconds) a third request's denoise steps keep being dispatched (no-op executors, no processes)."""
from __future__ import annotations

import time

import pytest

from fastvideo3.card import get_card
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.scheduling.scheduler import CoreScheduler
from services.common.fake import FakeExecutor

pytestmark = pytest.mark.timeout(60)
CARD = get_card("wan-tiny")
DECODE_S, STEP_S = 1.0, 0.01


class _Timed(FakeExecutor):
    def __init__(self, role, step_seconds):
        super().__init__(role, CARD, transport=None, step_seconds=step_seconds)
        self.calls: list[tuple[float, float, list[str]]] = []

    def execute(self, batch):
        t0 = time.monotonic()
        out = super().execute(batch)
        self.calls.append((t0, time.monotonic(), [u.request_id for u in batch]))
        return out


def _req(rid: str, steps: int):
    return resolve(GenerateRequest(prompt=rid, request_id=rid, num_inference_steps=steps, num_frames=9,
                                   height=64, width=64), CARD)


def test_decode_batch_runs_beside_denoise_steps():
    den, dec = _Timed("denoiser", STEP_S), _Timed("decoder", DECODE_S)
    sched = CoreScheduler({"encoder": [_Timed("encoder", 0.0)], "denoiser": [den], "decoder": [dec]},
                          pipelined=True)
    runs = [sched.submit(_req(rid, steps), CARD) for rid, steps in (("short-a", 1), ("short-b", 1), ("long", 60))]
    deadline = time.monotonic() + 30
    while sched.active() and time.monotonic() < deadline:
        sched.tick()
        time.sleep(0.002)
    assert all(r.status == "SUCCEEDED" for r in runs), [(r.request_id, r.status) for r in runs]
    first = dec.calls[0]
    assert sorted(first[2]) == ["short-a", "short-b"]  # the two decodes in one batch
    start, end = first[0], first[1]
    during = [c for c in den.calls if start < c[0] < end and "long" in c[2]]
    # a tick that waited for the decode would dispatch at most one step in that second
    assert len(during) >= 10, (len(during), end - start)
