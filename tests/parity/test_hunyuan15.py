"""HunyuanVideo-1.5 against diffusers on a tiny random directory written by diffusers itself
(``HunyuanVideo15Pipeline.save_pretrained``): C0 parity of the DiT, the text encoders and the VAE,
C1 parity of a whole generation against ``HunyuanVideo15Pipeline``, the interleave gate and step
batching across two requests. Tolerances come from the card's ParitySpec."""
import numpy as np
import pytest
import torch

from fastvideo3.card import resolve_card
from fastvideo3.errors import FailedPrecondition
from fastvideo3.parity import rel_error
from fastvideo3.engine import Engine

pytestmark = pytest.mark.timeout(300)
OPTS = dict(num_frames=5, height=16, width=32, num_inference_steps=2)
PROMPT = 'a cat holding a sign that says "HELLO" walks on grass'


@pytest.fixture(scope="module")
def hy_dir(tiny_hunyuan15_dir):
    return tiny_hunyuan15_dir


@pytest.fixture(scope="module")
def pipe(hy_dir):
    from diffusers import HunyuanVideo15Pipeline
    return HunyuanVideo15Pipeline.from_pretrained(str(hy_dir))


def test_directory_resolves_to_the_tiny_card(hy_dir):
    card = resolve_card(str(hy_dir))
    assert card.model_id == "hunyuanvideo-1.5-tiny" and card.family == "hunyuan15"
    assert card.denoise.sampler.flow_shift == 7.0 and card.limits.default_guidance == 6.0
    assert card.parity.reference == "diffusers.HunyuanVideo15Pipeline"


def test_c0_dit_matches_diffusers(hy_dir, pipe):
    from fastvideo3.models.hunyuan15.components import load_dit
    from fastvideo3.models.hunyuan15.dit import pack_text
    card = resolve_card(str(hy_dir))
    ours, digest = load_dit(card)
    assert digest.startswith("sha256:")
    cfg, g = ours.cfg, torch.Generator().manual_seed(0)
    b = 2  # two rows with different valid text lengths (and one with glyph text, one without)
    lat = torch.randn(b, 4, 3, 4, 6, generator=g)
    t = torch.tensor([937.5, 210.0])
    e1, e2 = torch.randn(b, cfg.text_len, 16, generator=g), torch.randn(b, cfg.text_len_2, 32, generator=g)
    m1, m2 = torch.zeros(b, cfg.text_len, dtype=torch.long), torch.zeros(b, cfg.text_len_2, dtype=torch.long)
    m1[0, :40], m1[1, :9], m2[0, :12] = 1, 1, 1
    with torch.no_grad():
        want = pipe.transformer(torch.cat([lat, torch.zeros(b, 5, 3, 4, 6)], 1), t, e1, m1,
                                encoder_hidden_states_2=e2, encoder_attention_mask_2=m2,
                                image_embeds=torch.zeros(b, 729, 12), return_dict=False)[0]
        got = ours(lat, t, pack_text(e1, m1, e2, m2, cfg.text_dim))
    assert rel_error(got, want) <= card.parity.c0_dit_rel


def test_c0_text_encoders_and_vae_match_diffusers(hy_dir, pipe):
    from fastvideo3.models.hunyuan15.components import TextEncoder, VideoDecoder
    from fastvideo3.models.hunyuan15.dit import unpack_text, HunyuanDiTConfig
    card = resolve_card(str(hy_dir))
    enc = TextEncoder(card)
    cfg = HunyuanDiTConfig.from_dict(card.components["transformer"].config)
    prompts = [PROMPT, ""]
    with torch.no_grad():
        q, m, b5, m2 = unpack_text(enc.encode(prompts), cfg)
        for i, p in enumerate(prompts):
            want = pipe.encode_prompt(p, device="cpu", dtype=torch.float32)
            assert torch.equal(m[i].long(), want[1][0].long()) and torch.equal(m2[i].long(), want[3][0].long())
            assert rel_error(q[i], want[0][0]) <= card.parity.c0_text_rel
            assert rel_error(b5[i], want[2][0]) <= card.parity.c0_text_rel if m2[i].any() else not b5[i].any()
        assert m2[0].any() and not m2[1].any()  # the quoted glyph text reaches ByT5; no quote, no tokens
        z = torch.randn(2, 4, 3, 4, 8, generator=torch.Generator().manual_seed(1))
        frames = VideoDecoder(card).decode(z)  # a batch of two: each latent decoded as diffusers does one
        ref = np.concatenate([pipe.video_processor.postprocess_video(
            pipe.vae.decode(z[i : i + 1] / pipe.vae.config.scaling_factor, return_dict=False)[0], output_type="np")
            for i in range(2)])
    assert frames.shape == ref.shape == (2, 5, 16, 32, 3)
    assert float(np.abs(frames.numpy() - ref).max()) <= card.parity.c0_vae_abs
    from fastvideo3.runtime.pool.vae_executor import DecoderExecutor
    from fastvideo3.transport import make_transport
    pool = DecoderExecutor(card, make_transport("inproc", owner="hy-decoder"), "cpu")
    assert pool.describe()["decode"] == {"max_decode_batch": pool.max_decode_batch, "fast": False, "time_chunk": 1,
                                         "channels_last": False, "fused": False}  # diffusers' decode, described


def test_system_prompt_is_the_pipelines():
    import inspect
    from diffusers import HunyuanVideo15Pipeline
    from fastvideo3.models.hunyuan15.components import SYSTEM_MESSAGE
    params = inspect.signature(HunyuanVideo15Pipeline._get_mllm_prompt_embeds).parameters
    assert params["system_message"].default == SYSTEM_MESSAGE and params["crop_start"].default == 108


@pytest.mark.parametrize("seed, guidance", [(3, 4.5), (5, 1.0)])
def test_c1_generation_matches_hunyuanvideo15_pipeline(hy_dir, pipe, seed, guidance):
    from diffusers.guiders import ClassifierFreeGuidance
    card = resolve_card(str(hy_dir))
    pipe.guider = ClassifierFreeGuidance(guidance_scale=guidance)
    want = pipe(prompt=PROMPT, negative_prompt="blurry", generator=torch.Generator().manual_seed(seed),
                output_type="latent", **OPTS).frames
    with torch.no_grad():  # the pipeline's own decode of its latents
        frames = pipe.video_processor.postprocess_video(
            pipe.vae.decode(want / pipe.vae.config.scaling_factor, return_dict=False)[0], output_type="np")[0]
    with Engine(card, keep_latents=True) as engine:
        video = engine.generate(PROMPT, negative_prompt="blurry", seed=seed, guidance_scale=guidance, **OPTS)
    assert rel_error(video.latents, want) <= card.parity.c1_latents_rel
    assert video.frames.shape == frames.shape == (5, 16, 32, 3)
    assert float(np.abs(video.frames - frames).max()) <= card.parity.c1_frames_abs


REQS = [('a red circle moving left, the word "GO"', 1), ("a blue square moving up", 22)]


def test_interleave_gate_and_step_batching(hy_dir):
    card = resolve_card(str(hy_dir))
    with Engine(card, keep_latents=True, batching=False) as engine:
        serial = [engine.generate(p, seed=s, **OPTS).latents for p, s in REQS]
        runs = [engine.submit(p, seed=s, **OPTS) for p, s in REQS]
        engine.run()
        inter = [engine.result(r).latents for r in runs]
        assert engine.denoiser.counters["max_batch_rows"] == 2  # one request per forward, never mixed
    for a, b in zip(inter, serial):
        assert torch.equal(a, b), "interleaving through one executor changed a request's result"
    with Engine(card, keep_latents=True, batching=True) as engine:
        runs = [engine.submit(p, seed=s, **OPTS) for p, s in REQS]
        engine.run()
        batched = [engine.result(r).latents for r in runs]
        assert engine.denoiser.counters["max_batch_rows"] == 2 * len(REQS)  # one forward served both
        with pytest.raises(FailedPrecondition, match="no LoRA adapters"):  # its DiT adapts no layers
            engine.denoiser.load_adapter("style", tensors={})
    for a, b in zip(batched, serial):
        assert rel_error(a, b) <= card.parity.c1_latents_rel
    assert not torch.equal(serial[0], serial[1])


def test_fast_forward_is_the_reference_function(hy_dir):
    from fastvideo3.models.hunyuan15.components import fast_dit, load_dit
    from fastvideo3.models.hunyuan15.dit import pack_text
    model, _ = load_dit(resolve_card(str(hy_dir)))
    cfg, g = model.cfg, torch.Generator().manual_seed(2)
    m1, m2 = torch.zeros(1, cfg.text_len), torch.zeros(1, cfg.text_len_2)
    m1[0, :30] = 1
    args = (torch.randn(1, 4, 2, 4, 4, generator=g), torch.tensor([500.0]),
            pack_text(torch.randn(1, cfg.text_len, 16, generator=g), m1, torch.randn(1, cfg.text_len_2, 32), m2,
                      cfg.text_dim))
    with torch.no_grad():
        want = model(*args)
        fast = fast_dit(model)
        assert fast.backend == "sdpa" and fast.capturable is False  # eager: host-read text lengths
        assert torch.equal(fast(*args), want)
