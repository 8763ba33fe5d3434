"""Wan2.2 TI2V-5B layout served as text-to-video: the 48-channel VAE with 16x spatial compression
and per-token timesteps (``expand_timesteps``), against diffusers' WanPipeline on a tiny random
directory it wrote: C0 of the DiT (the reference gets per-token timesteps, as its pipeline passes
them), C1 of whole generations, the interleave gate, the card and the cost model's token count."""
import numpy as np
import pytest
import torch

from fastvideo3.card import get_card, resolve_card
from fastvideo3.models.wan.components import latent_shape, load_dit
from fastvideo3.parity import rel_error
from fastvideo3.engine import Engine
from tests.helpers_parity import dit_and_reference

pytestmark = pytest.mark.timeout(300)
OPTS = dict(num_frames=9, height=64, width=96, num_inference_steps=4)


@pytest.fixture(scope="module")
def ti2v_dir(tmp_path_factory):
    from fastvideo3.testing.synthetic_layouts import build_wan22_ti2v_dir
    return build_wan22_ti2v_dir(tmp_path_factory.mktemp("ti2v") / "wan22-ti2v", seed=3)


def test_c0_dit_matches_reference_with_per_token_timesteps(ti2v_dir):
    card, ours, _, ref = dit_and_reference(ti2v_dir)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 48, 3, 4, 6, generator=g)
    t = torch.tensor([977.0, 412.0])
    seq = 3 * (4 // 2) * (6 // 2)
    per_token = t[:, None].expand(2, seq)  # what WanPipeline passes with expand_timesteps and no image
    txt = torch.randn(2, 9, ref.config.text_dim, generator=g)
    with torch.no_grad():
        want = ref(x, per_token, txt, return_dict=False)[0]
        got = ours(x, t, txt)
    assert rel_error(got, want) <= card.parity.c0_dit_rel


@pytest.mark.parametrize("seed, guidance", [(0, 5.0), (5, 1.0)])
def test_c1_generation_matches_wanpipeline(ti2v_dir, seed, guidance):
    from diffusers import WanPipeline
    card = resolve_card(str(ti2v_dir))
    assert latent_shape(card, 9, 64, 96) == (48, 3, 4, 6)  # 16x spatial
    pipe = WanPipeline.from_pretrained(str(ti2v_dir))
    kw = dict(prompt="a red circle", negative_prompt="blurry", guidance_scale=guidance, **OPTS)
    want = pipe(**kw, generator=torch.Generator().manual_seed(seed), output_type="latent").frames
    want_frames = pipe(**kw, generator=torch.Generator().manual_seed(seed), output_type="np").frames[0]
    with Engine(card, keep_latents=True) as engine:
        video = engine.generate("a red circle", negative_prompt="blurry", guidance_scale=guidance, seed=seed, **OPTS)
    assert rel_error(video.latents, want) <= card.parity.c1_latents_rel
    assert video.frames.shape == want_frames.shape == (9, 64, 96, 3)  # not 128x192: the VAE is 16x
    assert float(np.abs(video.frames - want_frames).max()) <= card.parity.c1_frames_abs


def test_interleave_gate(ti2v_dir):
    card = resolve_card(str(ti2v_dir))
    reqs = [("a red circle moving left", 1), ("a blue square moving up", 22), ("green triangle spinning", 333)]
    with Engine(card, keep_latents=True, batching=False) as engine:
        serial = [engine.generate(p, seed=s, **OPTS).latents for p, s in reqs]
    with Engine(card, keep_latents=True, batching=True) as engine:
        runs = [engine.submit(p, seed=s, **OPTS) for p, s in reqs]
        engine.run()
        rows = engine.denoiser.counters["max_batch_rows"]
        batched = [engine.result(r).latents for r in runs]
    assert rows == 2 * len(reqs)
    for a, b in zip(batched, serial):
        assert rel_error(a, b) <= card.parity.c1_latents_rel
    assert not torch.equal(serial[0], serial[1])


def test_builtin_card_and_cost():
    from fastvideo3.request.schema import GenerateRequest, resolve
    from fastvideo3.models.wan.flops import StepShape, dit_forward_cost
    from fastvideo3.runtime.economy.pricing import Pricer, dit_config
    card = get_card("wan2.2-ti2v-5b")
    assert card.components["transformer"].config["in_channels"] == 48 and card.limits.size_multiple == 32
    assert (card.limits.default_height, card.limits.default_width, card.limits.fps) == (704, 1280, 24)
    req = resolve(GenerateRequest("x"), card)
    feats = Pricer().features("diffusion_step", card, req)
    assert (feats.shape.latent_height, feats.shape.latent_width) == (704 // 16, 1280 // 16)
    assert dit_forward_cost(dit_config(card), StepShape.from_video(121, 704, 1280, stride=(4, 16, 16))).flops > 0
