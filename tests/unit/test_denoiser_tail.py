"""A denoise batch's host read runs after the executor's lock.

Under the lock a batch queues its forward and sampler steps on the device; its one host read (the
finiteness checks and latent norms) and its StepResults come after the lock is released. With
double-buffered dispatch the next batch is waiting on that lock: it queues its own inputs and
forward while the first batch's device work finishes, so the device does not idle on the host
between the two. Results, failures and the busy-time counter are as before."""
from __future__ import annotations

import threading

import pytest
import torch

from fastvideo3.loop.params import DiffusionStepParams
from fastvideo3.models.wan.cards import wan_tiny_seeded
from fastvideo3.models.wan.family import latent_shape
from fastvideo3.runtime.pool.dit_executor import DenoiserExecutor
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.transport.inproc import InprocHub, InprocTransport
from fastvideo3.vocab import Role, Sampler, UnitKind

pytestmark = pytest.mark.timeout(120)
FRAMES, SIZE = 5, 32


def _setup():
    card = wan_tiny_seeded()
    hub = InprocHub()
    ex = DenoiserExecutor(card, InprocTransport("denoiser-0", hub=hub), "cpu")
    encoder = InprocTransport("encoder-0", hub=hub)
    embeds = torch.randn(1, card.max_text_tokens, ex.dit.cfg.text_dim, generator=torch.Generator().manual_seed(1))
    return card, ex, encoder, embeds


def _unit(card, ref, rid: str, final: bool = False) -> WorkUnit:
    shape = list(latent_shape(card, FRAMES, SIZE, SIZE))
    params = DiffusionStepParams(step=0, timestep=900.0, sigmas=[0.9, 0.5, 0.0], guidance=1.0, cfg_policy="none",
                                 sampler=Sampler.EULER, solver_order=1, seed=3, latent_shape=shape, final=final)
    return WorkUnit(unit_id=f"{rid}-0", request_id=rid, loop_id="diffusion_denoise", kind=UnitKind.DIFFUSION_STEP,
                    role=Role.DENOISER, card_id=card.model_id, shape_sig=f"s|{shape}", params=params,
                    inputs={"prompt_embeds": ref}, step=0)


def test_the_next_batch_takes_the_lock_while_the_first_batch_reads_its_results():
    card, ex, encoder, embeds = _setup()
    a = _unit(card, encoder.publish("a", "prompt_embeds", embeds), "a")
    b = _unit(card, encoder.publish("b", "prompt_embeds", embeds), "b")
    in_tail, b_entered = threading.Event(), threading.Event()
    run, execute = ex._run, ex._execute

    def run_a(chunk, results):  # batch a's tail waits until batch b is inside the executor
        tail = run(chunk, results)
        if chunk[0][0].request_id != "a":
            return tail

        def waiting_tail():
            in_tail.set()
            assert b_entered.wait(10), "batch b could not take the executor's lock during a's tail"
            tail()
        return waiting_tail

    def execute_b(batch):
        if batch[0].request_id == "b":
            b_entered.set()
        return execute(batch)

    ex._run, ex._execute = run_a, execute_b
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("a", ex.execute([a])), daemon=True)
    t.start()
    assert in_tail.wait(10)
    [rb] = ex.execute([b])  # takes the lock while a's tail is still waiting
    t.join(10)
    [ra] = out["a"]
    assert ra.ok and rb.ok, (ra.error, rb.error)
    assert ex.regions["a"].step == 1 and ex.regions["b"].step == 1
    assert ra.metrics["finite"] == 1.0 and ra.metrics["latent_norm"] > 0
    assert ex.counters["batches"] == 2 and ex.counters["units"] == 2
    # busy time is the union of the two batches' times: b started inside a's window, so the union
    # is less than the sum of the two
    assert max(ra.measured_seconds, rb.measured_seconds) <= ex.counters["busy_seconds"] + 1e-6
    assert ex.counters["busy_seconds"] < ra.measured_seconds + rb.measured_seconds


def test_a_non_finite_step_fails_its_unit_and_drops_its_final_latents():
    card, ex, encoder, embeds = _setup()
    bad = _unit(card, encoder.publish("bad", "prompt_embeds", embeds), "bad", final=True)
    good = _unit(card, encoder.publish("good", "prompt_embeds", embeds), "good", final=True)
    ex.fault_hook = lambda unit, latent: latent * float("nan") if unit.request_id == "bad" else latent
    rbad, rgood = ex.execute([bad, good])
    assert not rbad.ok and "non-finite" in rbad.error.message, rbad.error
    assert "bad" not in ex.regions
    assert rgood.ok and "latents" in rgood.outputs and ex.regions["good"].step == 1
    assert ex.counters["failed_units"] == 1
    # only the good request's final latents stay published (the failed one's were released)
    assert ex.transport.stats()["resident_buffers"] == 1
    ex.release("good")
    assert ex.transport.stats()["resident_buffers"] == 0


def test_the_tail_can_be_kept_under_the_lock_for_an_a_b_run(monkeypatch):
    from fastvideo3.runtime.pool import dit_executor
    monkeypatch.setenv(dit_executor.TAIL_ENV, "lock")
    card, ex, encoder, embeds = _setup()
    assert ex.tail_after_lock is False
    tails = []
    run = ex._run
    ex._run = lambda chunk, results: tails.append(run(chunk, results)) or tails[-1]
    [res] = ex.execute([_unit(card, encoder.publish("a", "prompt_embeds", embeds), "a")])
    assert res.ok and tails == [None]  # the chunk's tail ran inside _run, under the lock
    monkeypatch.setenv(dit_executor.TAIL_ENV, "later")
    with pytest.raises(ValueError, match="FASTVIDEO3_DENOISER_TAIL must be 'after' or 'lock'"):
        _setup()
