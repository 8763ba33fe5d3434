"""RELIABILITY 2, 4, 5, 13 on the real multi-process fleet (see conftest.py), plus the RolePool
Snapshot/Restore contract.

* 13 — the scheduler is SIGKILLed mid-denoise and restarted against the same Redis: the
  request continues from its last checkpoint; a client re-attaches with a Generate carrying
  the same request id and gets a video bit-identical to an uninterrupted run.
* 5 — a denoiser is SIGKILLed mid-request: its requests continue on the other replica from
  their last snapshot (bit-identical), or fail UNAVAILABLE within 10 s where no replica is
  left; an executor that raises at step N fails only that request.
* 2 — many requests, some cancelled at random steps: cancelled ones end CANCELLED within one
  step and leave nothing behind (and their ids can be reused); the others are bit-identical to
  serial runs.
* 4 — every test here ends with the ``balanced`` check (pool buffers and transport
  registrations released, no orphaned state-store key).
"""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from fastvideo3.card.registry import resolve_card
from fastvideo3.client import FleetClient
from fastvideo3.errors import Unavailable
from fastvideo3.loop import DenoiseLoop, RequestContext
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.v1 import pool_pb2
from services.common import convert
from tests.fleet_fixture import pool_describe, pool_stub, wait_until
from tests.reliability.conftest import REAL_CARD, pool_targets
from tests.reliability.helpers import (
    SMALL, once_at_step, pool_error, pool_units, release_everywhere, run_all, sched_counters, sched_pools, store_keys,
    stream, stream_killing_scheduler,
)

STEPS = 24
_refs: dict[tuple, np.ndarray] = {}


def reference(fleet, prompt: str, seed: int, steps: int = STEPS) -> np.ndarray:
    """The uninterrupted output, run alone on the main scheduler (cached per session)."""
    key = (prompt, seed, steps)
    if key not in _refs:
        out = stream(fleet.target, prompt, seed=seed, num_inference_steps=steps, **SMALL)
        assert out.state == "SUCCEEDED", (out.error, out.error_event)
        _refs[key] = out.frames()
    return _refs[key]


@pytest.mark.timeout(240)
def test_scheduler_sigkill_mid_denoise_resumes_bit_identical(balanced):
    fleet = balanced
    ref = reference(fleet, "a red circle moving left", 11)
    sched = fleet.process("scheduler")
    denoisers = [p.target for p in fleet.pools["denoiser"]]
    units_before = pool_units(denoisers)
    first = stream_killing_scheduler(fleet, "a red circle moving left", seed=11, num_inference_steps=STEPS,
                                     request_id="resume-1", **SMALL)
    assert isinstance(first.error, Unavailable) and first.state is None  # the stream died with it
    assert max(first.denoise_steps()) >= 10
    fleet.restart(sched)
    resumed = stream(fleet.target, "a red circle moving left", seed=11, num_inference_steps=STEPS,
                     request_id="resume-1", **SMALL)  # re-attach: same id, same parameters
    assert resumed.state == "SUCCEEDED", (resumed.error, resumed.error_event)
    assert resumed.events[0].kind == "accepted"
    # it went on from its last checkpoint: at most a couple of steps ran twice (not all ten)
    assert STEPS <= pool_units(denoisers) - units_before <= STEPS + 3
    assert np.array_equal(resumed.frames(), ref)  # bit-identical to the uninterrupted run
    counters = sched_counters(fleet.target)
    assert counters["state.resumed"] == 1 and counters["state.resume_failed"] == 0
    from fastvideo3.state import StoreConfig, make_store
    store = make_store(fleet.redis.url, StoreConfig(namespace=fleet.namespace))
    try:
        assert store.status("resume-1") == "SUCCEEDED"
        assert list(store.artifacts("resume-1")) == ["video.npy"]
    finally:
        store.close()


@pytest.mark.timeout(240)
def test_denoiser_sigkill_requests_resume_on_the_other_replica(balanced):
    fleet = balanced
    prompts = [("a blue square", 21), ("waves at sunset", 22)]
    refs = [reference(fleet, p, s) for p, s in prompts]
    victim = fleet.pools["denoiser"][0]
    both_running = threading.Barrier(4, timeout=60)
    killed = threading.Event()
    seen: dict[str, float] = {}

    at_step_4 = once_at_step(4, both_running.wait)

    def progress(out, ev):
        at_step_4(out, ev)
        if ev.kind == "progress" and ev.data["phase"] == "denoise" and killed.is_set() and out.request_id not in seen:
            seen[out.request_id] = time.monotonic()  # first progress after the kill

    jobs = [(fleet.target, p, dict(seed=s, num_inference_steps=STEPS, request_id=f"crash-{i}", on_event=progress,
                                   **SMALL)) for i, (p, s) in enumerate(prompts)]
    lone = {}  # a request on the scheduler that only knows denoiser-0: nowhere to go

    def lone_request():
        lone["out"] = stream(fleet.one, "alone", seed=5, num_inference_steps=200, request_id="crash-lone",
                             on_event=once_at_step(4, both_running.wait), **SMALL)

    t_lone = threading.Thread(target=lone_request, daemon=True)
    t_lone.start()
    outs: list = []
    t_jobs = threading.Thread(target=lambda: outs.extend(run_all(jobs)), daemon=True)
    t_jobs.start()
    both_running.wait()
    assert _regions(victim.target) >= 2  # the lone request and at least one of the others
    t_kill = time.monotonic()
    fleet.kill(victim)
    killed.set()
    t_jobs.join(timeout=120)
    t_lone.join(timeout=60)
    for out, ref in zip(outs, refs):
        assert out.state == "SUCCEEDED", (out.request_id, out.error, out.error_event)
        assert np.array_equal(out.frames(), ref), out.request_id  # resumed from its snapshot, exactly
        assert seen.get(out.request_id, t_kill) - t_kill < 10.0
    assert sched_counters(fleet.target)["state.recovered"] >= 1
    lost = lone["out"]
    assert lost.state == "FAILED" and lost.error_event["code"] == "UNAVAILABLE", (lost.error, lost.error_event)
    assert lost.t_end - t_kill < 10.0  # failed fast: never hangs on a dead replica
    # the error says what was lost and what to do (not the transport's "Stream removed" text)
    ev = lost.error_event
    assert ev["retryable"] is True and ev["loss"]["role"] == "denoiser", ev
    assert ev["loss"]["replica"] == "denoiser-0" and ev["loss"]["step_reached"] >= 4, ev
    assert "Stream removed" not in ev["message"] and "denoiser replica denoiser-0" in ev["message"], ev
    assert 0 <= ev["resume_from_step"] <= ev["loss"]["step_reached"]
    with FleetClient(fleet.one) as c:
        status = c.get("crash-lone")  # GetRequest carries the same report
    assert status["error"]["retryable"] is True and status["error"]["loss"]["replica"] == "denoiser-0"
    # the other pools kept serving, and the replaced replica is used again once it is back
    fleet.restart(victim)
    for target in (fleet.target, fleet.one):
        wait_until(lambda: all(sched_pools(target).values()), 15, f"{target} to see every pool healthy")
    assert stream(fleet.one, "after", seed=6, num_inference_steps=3, **SMALL).state == "SUCCEEDED"


def _regions(target: str) -> int:
    return int(pool_describe(target).executor.resident_regions)


@pytest.mark.timeout(180)
def test_executor_raising_at_step_n_fails_only_that_request(balanced):
    fleet = balanced
    ref = reference(fleet, "a calm lake", 41, steps=8)
    victim, mate = run_all([(fleet.target, "boom", dict(seed=1, num_inference_steps=8, request_id="raise-victim",
                                                         **SMALL)),
                            (fleet.target, "a calm lake", dict(seed=41, num_inference_steps=8, **SMALL))])
    assert victim.state == "FAILED" and victim.error_event["code"] == "INTERNAL"
    assert victim.error_event["step"] == 2 and max(victim.denoise_steps()) == 2
    assert mate.state == "SUCCEEDED" and np.array_equal(mate.frames(), ref)


@pytest.mark.timeout(300)
def test_abort_mid_denoise_cancelled_end_within_a_step_others_bit_identical(balanced):
    fleet = balanced
    rng = random.Random(7)
    specs = [(f"abort prompt {i}", 30 + i) for i in range(6)]
    cancel_at = {i: rng.randint(2, STEPS - 4) for i in rng.sample(range(6), 3)}
    refs = {i: reference(fleet, p, s) for i, (p, s) in enumerate(specs) if i not in cancel_at}
    after_ack: dict[str, list[int]] = {}
    at_ack: dict[str, int] = {}

    def make_hook(i):
        def hook(out, ev):
            rid = out.request_id
            if rid in after_ack and ev.kind == "progress":
                after_ack[rid].append(ev.data["step"])
            if i in cancel_at and ev.kind == "progress" and ev.data["phase"] == "denoise" \
                    and ev.data["step"] == cancel_at[i] and rid not in after_ack:
                with FleetClient(fleet.target) as c:
                    assert c.cancel(rid, reason="test")
                    at_ack[rid] = c.get(rid)["step"]  # where the server was when it acknowledged
                after_ack[rid] = []
        return hook

    outs = run_all([(fleet.target, p, dict(seed=s, num_inference_steps=STEPS, request_id=f"abort-{i}",
                                           on_event=make_hook(i), **SMALL)) for i, (p, s) in enumerate(specs)])
    for i, out in enumerate(outs):
        if i in cancel_at:
            assert out.state == "CANCELLED", (out.request_id, out.state, out.error)
            # ended within one step of the acknowledgement
            assert max(after_ack[out.request_id], default=0) <= at_ack[out.request_id] + 1
            assert not out.artifact()
            assert store_keys(fleet.redis.url, fleet.namespace, out.request_id) == []
        else:
            assert out.state == "SUCCEEDED" and np.array_equal(out.frames(), refs[i]), out.request_id
    reused = next(i for i in cancel_at)
    again = stream(fleet.target, specs[reused][0], seed=specs[reused][1], num_inference_steps=STEPS,
                   request_id=f"abort-{reused}", **SMALL)  # a cancelled id can be used again
    assert again.state == "SUCCEEDED"
    assert np.array_equal(again.frames(), reference(fleet, *specs[reused]))


@pytest.mark.timeout(240)
def test_snapshot_restores_only_onto_a_matching_fingerprint(balanced):
    fleet = balanced
    card = resolve_card(REAL_CARD)
    enc, d0, d1 = (fleet.pools["encoder"][0].target, fleet.pools["denoiser"][0].target,
                   fleet.pools["denoiser"][1].target)
    bf16 = fleet.spawn_pool("denoiser", ["--precision", "bf16"])
    rid = "fp-probe"
    try:
        req = resolve(GenerateRequest(prompt="probe", request_id=rid, guidance_scale=1.0, num_inference_steps=4,
                                      **SMALL), card)
        chunk = WorkUnit("u-enc", rid, "text_encode", "encoder_chunk", "encoder", card.model_id, "enc",
                         params={"prompts": {"prompt_embeds": "probe"}})
        res = _execute(enc, chunk)
        loop = DenoiseLoop()
        state = loop.init(req, card, RequestContext(refs={"prompt_embeds": res.outputs["prompt_embeds"]}))
        step0 = WorkUnit.from_plan(loop.next(state), card.model_id)
        assert _execute(d0, step0).ok
        snap = pool_stub(d0).Snapshot(pool_pb2.SnapshotRequest(request_id=rid), timeout=10)
        assert snap.runtime_fingerprint == pool_describe(d0).runtime_fingerprint
        assert list(snap.regions)[:2] == ["latent", "history.meta"]
        # another precision is another runtime: refused before anything is written
        other = pool_describe(bf16.target).runtime_fingerprint
        assert other != snap.runtime_fingerprint
        for fp in ("", snap.runtime_fingerprint):
            err = pool_error(pool_stub(bf16.target).Restore, pool_pb2.StateSnapshot(
                request_id=rid, blob=snap.blob, runtime_fingerprint=fp), timeout=10)
            assert err is not None and err.code == "FAILED_PRECONDITION", err
            assert err.field in ("fingerprint", "runtime_fingerprint")
        assert pool_describe(bf16.target).resident_buffers == 0
        bad = bytearray(snap.blob)
        bad[-1] ^= 0xFF
        err = pool_error(pool_stub(d1).Restore, pool_pb2.StateSnapshot(request_id=rid, blob=bytes(bad)), timeout=10)
        assert err is not None and err.code == "DATA_LOSS"
        # same fingerprint: the request continues on the other replica, exactly as it would have
        pool_stub(d1).Restore(pool_pb2.StateSnapshot(request_id=rid, blob=snap.blob, checksum=snap.checksum),
                              timeout=10)
        state = state.model_copy(update={"step": 1})
        step1 = WorkUnit.from_plan(loop.next(state), card.model_id)
        a, b = _execute(d0, step1), _execute(d1, step1)
        assert a.ok and b.ok and a.metrics["latent_norm"] == b.metrics["latent_norm"]
    finally:
        release_everywhere(pool_targets(fleet) + [bf16.target], rid)
        fleet.terminate(bf16)
        fleet.standalone.remove(bf16)


def _execute(target: str, unit: WorkUnit):
    resp = pool_stub(target).Execute(pool_pb2.ExecuteRequest(units=[convert.unit_to_wire(unit)]), timeout=60)
    return convert.result_from_wire(resp.results[0])
