"""RELIABILITY 19 (cheapest recovery) on the real multi-process fleet (see conftest.py).

The decoder is SIGKILLed after the last denoise step, while it decodes (its fetch of the final
latents is stalled 3 s by the ``stall:decode-victim`` fault, so the decode is certainly in
flight), and started again. The request waits for a decoder to serve again and decodes again
from the final latents the denoiser still holds: the video arrives, bit-identical to an
uninterrupted run, and no denoise step runs twice.

The denoiser holding the final latents is SIGKILLed the same way: the other denoiser goes back
to the snapshot taken before the last step, runs that one step, and decoding starts over. The
encoder and the request's denoiser are SIGKILLed mid-denoise: the request moves to the other
denoiser, finds its embeddings gone with the encoder, waits for the encoder to come back,
encodes again and denoises on from its snapshot. Both videos are bit-identical.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.fleet_fixture import health, pool_describe, wait_until
from tests.reliability.helpers import SMALL, once_at_step, pool_units, sched_counters, sched_pools, stream
from tests.reliability.test_recovery import _regions, reference

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


def _holder(fleet):
    """The denoiser process holding the (only) running request's regions."""
    held = [p for p in fleet.pools["denoiser"] if _regions(p.target) >= 1]
    assert len(held) == 1, [(p.name, _regions(p.target)) for p in fleet.pools["denoiser"]]
    return held[0]


def _units(target: str) -> int:
    return int(pool_describe(target).counters.get("units", 0))


@pytest.mark.timeout(240)
def test_denoiser_sigkill_after_the_last_step_redoes_one_step_and_decodes(balanced):
    fleet = balanced
    ref = reference(fleet, "latents lost", 52, steps=STEPS)
    remade_before = sched_counters(fleet.target).get("state.inputs_remade", 0)
    state: dict = {}

    def at_last_step(out, ev):
        if ev.kind == "progress" and ev.data["phase"] == "denoise" and ev.data["step"] == STEPS and not state:
            victim = _holder(fleet)  # the decoder is now stalled fetching the final latents from it
            survivor = next(p for p in fleet.pools["denoiser"] if p is not victim)
            state.update(victim=victim, survivor=survivor, units=_units(survivor.target))
            fleet.kill(victim)

    out = stream(fleet.target, "latents lost", seed=52, num_inference_steps=STEPS, request_id="latents-lost",
                 on_event=at_last_step, **SMALL)
    try:
        assert out.state == "SUCCEEDED", (out.error, out.error_event)
        assert np.array_equal(out.frames(), ref)
        assert _units(state["survivor"].target) - state["units"] == 1  # only the last step ran again
        assert sched_counters(fleet.target)["state.inputs_remade"] == remade_before + 1
    finally:
        fleet.restart(state["victim"])


@pytest.mark.timeout(300)
def test_encoder_and_denoiser_sigkill_mid_denoise_re_encodes_and_denoises_on(balanced):
    fleet = balanced
    # a replica restarted by an earlier test may still be loading: the move needs a serving spare
    for proc in fleet.pools["denoiser"] + fleet.pools["encoder"]:
        wait_until(lambda p=proc: health(p.target) == "SERVING", timeout_s=120, what=f"{proc.name} serving")
        # and as the scheduler sees it: its health watch marks a restarted replica a moment later
        wait_until(lambda p=proc: sched_pools(fleet.target).get(p.target), timeout_s=60,
                   what=f"the scheduler sees {proc.name} healthy")
    steps = 12
    ref = reference(fleet, "encoded twice", 53, steps=steps)
    encoder = fleet.pools["encoder"][0]
    remade_before = sched_counters(fleet.target).get("state.inputs_remade", 0)
    state: dict = {}
    back = threading.Event()

    def crash():
        victim = _holder(fleet)
        state["victim"] = victim
        fleet.kill(encoder)
        fleet.kill(victim)
        fleet.restart(encoder)  # the request waits for it: its embeddings died with the old one
        back.set()

    out = stream(fleet.target, "encoded twice", seed=53, num_inference_steps=steps, request_id="encoded-twice",
                 on_event=once_at_step(5, lambda: threading.Thread(target=crash, daemon=True).start()), **SMALL)
    try:
        assert back.wait(120)
        assert out.state == "SUCCEEDED", (out.error, out.error_event)
        assert np.array_equal(out.frames(), ref)
        assert sched_counters(fleet.target)["state.inputs_remade"] == remade_before + 1
        steps_seen = out.denoise_steps()
        assert steps_seen.count(1) == 1  # denoising went on from its snapshot, not from the start
    finally:
        if "victim" in state:
            fleet.restart(state["victim"])
