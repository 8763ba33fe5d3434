"""RELIABILITY 19 (cheapest recovery) on the real multi-process fleet (see conftest.py).

The decoder is SIGKILLed after the last denoise step, while it decodes (its fetch of the final
latents is stalled 3 s by the ``stall:decode-victim`` fault, so the decode is certainly in
flight), and started again. The request waits for a decoder to serve again and decodes again
from the final latents the denoiser still holds: the video arrives, bit-identical to an
uninterrupted run, and no denoise step runs twice.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.reliability.helpers import SMALL, pool_units, sched_counters, stream
from tests.reliability.test_recovery import reference

STEPS = 8


@pytest.mark.timeout(240)
def test_decoder_sigkill_after_the_last_step_re_decodes_bit_identical(balanced):
    fleet = balanced
    ref = reference(fleet, "decoded twice", 51, steps=STEPS)
    decoder = fleet.pools["decoder"][0]
    denoisers = [p.target for p in fleet.pools["denoiser"]]
    units_before = pool_units(denoisers)
    parked_before = sched_counters(fleet.target).get("state.parked", 0)
    bounced = threading.Event()

    def kill_and_restart():
        fleet.kill(decoder)
        fleet.restart(decoder)
        bounced.set()

    def at_last_step(out, ev):
        if ev.kind == "progress" and ev.data["phase"] == "denoise" and ev.data["step"] == STEPS \
                and not bounced.is_set() and not getattr(at_last_step, "fired", False):
            at_last_step.fired = True
            threading.Thread(target=kill_and_restart, daemon=True).start()

    out = stream(fleet.target, "decoded twice", seed=51, num_inference_steps=STEPS, request_id="decode-victim",
                 on_event=at_last_step, **SMALL)
    assert bounced.wait(120)
    assert out.state == "SUCCEEDED", (out.error, out.error_event)
    assert np.array_equal(out.frames(), ref)  # re-decoded from the same final latents
    assert pool_units(denoisers) - units_before == STEPS  # nothing was denoised again
    assert sched_counters(fleet.target)["state.parked"] == parked_before + 1
