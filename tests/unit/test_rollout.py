"""Rollout = the serving loop + behavior capture, and the 4-step card's recipe teeth."""
import numpy as np
import pytest
import torch

from fastvideo3.card import get_card
from fastvideo3.errors import RecipeMismatch
from fastvideo3.loop.samplers import make_schedule
from fastvideo3.models.wan.components import shipped_digest, shipped_path
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.engine import Engine
from fastvideo3.training.rollout import BehaviorCapture, Rollout

SMALL = dict(num_frames=9, height=32, width=32)
PROMPT = "a red circle moving left on a white background"


@pytest.fixture(scope="module")
def engine():
    e = Engine("wan-tiny", keep_latents=True)
    yield e
    e.close()


@pytest.mark.timeout(60)
def test_rollout_final_sample_equals_the_served_sample_bit_for_bit(engine):
    served = engine.generate(PROMPT, seed=11, num_inference_steps=3, **SMALL)
    (rec,) = Rollout(engine, capture="all").run([PROMPT], [11], decode=True, num_inference_steps=3, **SMALL)
    assert torch.equal(rec.final_latent, served.latents)
    assert np.array_equal(rec.frames.numpy(), served.frames)
    # the capture is what the served request did, step by step
    sched = make_schedule(rec.sampler, 3, rec.flow_shift)
    assert [s.step for s in rec.steps] == [0, 1, 2]
    assert [s.timestep for s in rec.steps] == sched.timesteps
    assert [s.sigma for s in rec.steps] == sched.sigmas[:-1] and rec.steps[-1].sigma_next == 0.0
    assert all(s.guidance == served.metadata["request"]["guidance_scale"] for s in rec.steps)
    for a, b in zip(rec.steps, rec.steps[1:]):
        assert torch.equal(a.latent_out, b.latent_in)
    assert torch.equal(rec.steps[-1].latent_out, rec.final_latent)
    noise = torch.randn([1, *rec.final_latent.shape[1:]], generator=torch.Generator().manual_seed(11))
    assert torch.equal(rec.noise, noise)  # the denoiser's seeded initial latent
    assert [round(s.latent_out_norm, 4) for s in rec.steps] == [round(n, 4) for n in served.metadata["latent_norms"]]
    assert rec.weights_version == served.metadata["weights"] and rec.seed == 11
    assert rec.to_dict()["steps"][0]["cfg_policy"] == served.metadata["request"]["cfg_policy"]
    # capture is switched off again and nothing stays resident
    assert engine.denoiser.observers == [] and engine.denoiser.describe()["resident_regions"] == 0


@pytest.mark.timeout(60)
def test_rollout_batches_a_group_through_the_scheduler(engine):
    before = dict(engine.scheduler.counters)
    recs = Rollout(engine, capture="endpoints").run([PROMPT] * 3, [1, 2, 3], num_inference_steps=2, **SMALL)
    assert [r.seed for r in recs] == [1, 2, 3] and all(r.frames is None for r in recs)
    assert all(r.noise is not None and r.steps[0].latent_out is None for r in recs)  # endpoints only
    assert all(torch.equal(r.steps[-1].latent_out, r.final_latent) for r in recs)
    assert not torch.equal(recs[0].final_latent, recs[1].final_latent)
    after = engine.scheduler.counters
    assert after["multi_request_batches"] > before["multi_request_batches"]  # the group shared DiT batches
    assert engine.transport.stats()["resident_buffers"] == 0


@pytest.mark.timeout(10)
def test_capture_modes():
    with pytest.raises(ValueError):
        BehaviorCapture("everything")
    assert BehaviorCapture("norms").take("nobody") == []


@pytest.mark.timeout(60)
def test_4step_card_serves_4_euler_steps_and_refuses_50():
    card = get_card("wan-tiny-4step")
    r = card.recipe
    assert (r.method, r.assumes_steps, r.assumes_sampler, r.parents) == ("step_distill", 4, "euler", ["wan-tiny"])
    ok = resolve(GenerateRequest(prompt=PROMPT), card)
    assert (ok.num_inference_steps, ok.sampler, ok.cfg_policy) == (4, "euler", "none")
    with pytest.raises(RecipeMismatch) as e:
        resolve(GenerateRequest(prompt=PROMPT, num_inference_steps=50), card)
    assert e.value.code == "FAILED_PRECONDITION" and e.value.field == "num_inference_steps" and e.value.limit == "4"
    with pytest.raises(RecipeMismatch) as e:
        resolve(GenerateRequest(prompt=PROMPT, sampler="unipc"), card)
    assert e.value.field == "sampler"
    with Engine(card) as eng:
        with pytest.raises(RecipeMismatch):
            eng.generate(PROMPT, num_inference_steps=50, **SMALL)
        video = eng.generate(PROMPT, seed=0, **SMALL)
        assert video.metadata["request"]["num_inference_steps"] == 4
        assert eng.denoiser.counters["rows"] == 4  # one conditional DiT evaluation per step
        w = video.metadata["weights"]
    teacher = get_card("wan-tiny")
    # its own DiT; the text encoder and the VAE are the teacher's files
    assert w["transformer"] != shipped_digest(shipped_path(teacher, "transformer"))
    assert w["vae"] == shipped_digest(shipped_path(teacher, "vae"))
    assert w["text_encoder"] == shipped_digest(shipped_path(teacher, "text_encoder"))


@pytest.mark.timeout(20)
def test_trained_cards_carry_their_recipe():
    teacher = get_card("wan-tiny")
    assert teacher.recipe.method == "flow_matching" and teacher.recipe.data_contract == "procedural shapes v1"
    assert teacher.recipe.assumes_loop == "diffusion_denoise" and teacher.recipe.assumes_precision == "fp32"
    assert "bench/train_tiny.py" in teacher.recipe.training_command
    assert {c.source for c in teacher.components.values()} == {"shipped"}
    assert get_card("wan-tiny-seeded").recipe.method == "seeded"
