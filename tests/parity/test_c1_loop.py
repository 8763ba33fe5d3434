"""C1 loop parity: a whole generation through fastvideo3 vs diffusers' WanPipeline, and the
interleave gate: requests interleaved step by step through one denoiser equal serial runs."""
import numpy as np
import pytest
import torch

from fastvideo3.card import resolve_card
from fastvideo3.parity import rel_error
from fastvideo3.engine import Engine

pytestmark = pytest.mark.timeout(300)
OPTS = dict(num_frames=9, height=32, width=48, num_inference_steps=4)


def _reference(path, prompt, seed, guidance, negative="", flow_shift=None):
    from diffusers import WanPipeline
    pipe = WanPipeline.from_pretrained(str(path))
    if flow_shift is not None:
        pipe.scheduler = pipe.scheduler.__class__.from_config(pipe.scheduler.config, flow_shift=flow_shift, shift=flow_shift)
    kw = dict(prompt=prompt, negative_prompt=negative, guidance_scale=guidance, **OPTS)
    lat = pipe(**kw, generator=torch.Generator().manual_seed(seed), output_type="latent").frames
    frames = pipe(**kw, generator=torch.Generator().manual_seed(seed), output_type="np").frames[0]
    return lat, frames


@pytest.mark.parametrize("scheduler, seed, guidance, flow_shift", [
    ("unipc", 0, 5.0, None),
    ("unipc", 3, 1.0, 5.0),
    ("euler", 7, 3.5, None),
])
def test_c1_generation_matches_wanpipeline(tmp_path, scheduler, seed, guidance, flow_shift):
    from fastvideo3.testing.synthetic_wan import build_wan_dir
    path = build_wan_dir(tmp_path / "wan", preset="tiny", seed=seed, scheduler=scheduler, flow_shift=3.0)
    card = resolve_card(str(path))
    prompt = "a red circle moving left on a white background"
    want_lat, want_frames = _reference(path, prompt, seed, guidance, "blurry", flow_shift)
    with Engine(card, keep_latents=True) as engine:
        video = engine.generate(prompt, negative_prompt="blurry", seed=seed, guidance_scale=guidance,
                                flow_shift=flow_shift, **OPTS)
    assert rel_error(video.latents, want_lat) <= card.parity.c1_latents_rel
    assert video.frames.shape == want_frames.shape
    assert float(np.abs(video.frames - want_frames).max()) <= card.parity.c1_frames_abs


REQS = [("a red circle moving left", 1), ("a blue square moving up", 22), ("green triangle spinning", 333)]


def _serial(card):
    with Engine(card, keep_latents=True, batching=False) as engine:
        return [engine.generate(p, seed=s, **OPTS).latents for p, s in REQS]


def _interleaved(card, batching):
    with Engine(card, keep_latents=True, batching=batching) as engine:
        runs = [engine.submit(p, seed=s, **OPTS) for p, s in REQS]
        engine.run()
        counters = dict(engine.denoiser.counters)
        return [engine.result(r).latents for r in runs], counters


def test_interleave_gate(tiny_wan_dir):
    card = resolve_card(str(tiny_wan_dir))
    serial = _serial(card)
    inter, counters = _interleaved(card, batching=False)
    assert counters["max_batch_rows"] == 2  # one request per forward (cond+uncond), never mixed
    for a, b in zip(inter, serial):
        assert torch.equal(a, b), "interleaving through one executor changed a request's result"
    batched, counters = _interleaved(card, batching=True)
    assert counters["max_batch_rows"] == 2 * len(REQS)  # one forward served every request
    for a, b in zip(batched, serial):
        assert rel_error(a, b) <= card.parity.c1_latents_rel
    assert not torch.equal(serial[0], serial[1])
