"""Wan2.1 image-to-video against diffusers' WanImageToVideoPipeline on a tiny random directory it
wrote (fastvideo3/testing/synthetic_layouts.build_wan21_i2v_dir): C0 of the I2V DiT, of the CLIP image
encoder and of the image latent conditioning, C1 of whole generations, the interleave gate with
step batching across requests with different images, and the cost model's FLOPs of the I2V DiT.

diffusers 0.42's I2V pipeline calls ``ftfy`` unconditionally (its WanPipeline only when ftfy is
installed); ftfy is not installed here, so the reference cleans prompts with WanPipeline's own
function, which is what it does without ftfy (and what our text encoder does).
"""
import io

import numpy as np
import pytest
import torch

from fastvideo3.card import get_card, resolve_card
from fastvideo3.models.wan.components import load_dit
from fastvideo3.parity import rel_error
from fastvideo3.engine import Engine
from tests.helpers_parity import dit_and_reference

pytestmark = pytest.mark.timeout(600)
OPTS = dict(num_frames=9, height=32, width=48, num_inference_steps=4)
PROMPT = "a red circle moving left on a white background"


def png(seed: int, size=(56, 40)) -> bytes:
    from PIL import Image
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def pil(data: bytes):
    from PIL import Image
    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.fixture(scope="module")
def i2v_dir(tmp_path_factory):
    from fastvideo3.testing.synthetic_layouts import build_wan21_i2v_dir
    return build_wan21_i2v_dir(tmp_path_factory.mktemp("i2v") / "wan21-i2v", seed=7)


@pytest.fixture(scope="module")
def pipe(i2v_dir):
    import diffusers.pipelines.wan.pipeline_wan as wan_t2v
    import diffusers.pipelines.wan.pipeline_wan_i2v as wan_i2v
    from diffusers import WanImageToVideoPipeline
    mp = pytest.MonkeyPatch()
    if not wan_i2v.is_ftfy_available():
        mp.setattr(wan_i2v, "prompt_clean", wan_t2v.prompt_clean)
    yield WanImageToVideoPipeline.from_pretrained(str(i2v_dir))
    mp.undo()


def test_directory_resolves_to_the_tiny_i2v_card(i2v_dir):
    card = resolve_card(str(i2v_dir))
    assert card.model_id == "wan2.1-i2v-tiny"
    assert {"image_encoder", "image_processor"} <= set(card.components)
    assert card.components["transformer"].config["in_channels"] == 36
    assert card.components["image_encoder"].config["tokens"] == 17  # (32 / 8)^2 + 1


def test_c0_dit_matches_reference(i2v_dir):
    card, ours, digest, ref = dit_and_reference(i2v_dir)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 36, 3, 4, 6, generator=g)
    t = torch.tensor([977.0, 412.0])
    txt = torch.randn(2, 512, ref.config.text_dim, generator=g)  # the reference splits image tokens at 512
    img = torch.randn(2, 17, ref.config.image_dim, generator=g)
    other = torch.randn(2, 17, ref.config.image_dim, generator=g)
    with torch.no_grad():
        want = ref(x, t, txt, encoder_hidden_states_image=img, return_dict=False)[0]
        got = ours(x, t, txt, image=img)
        moved = ours(x, t, txt, image=other)
    assert got.shape == (2, 16, 3, 4, 6)
    assert rel_error(got, want) <= card.parity.c0_dit_rel
    assert rel_error(moved, want) > 100 * card.parity.c0_dit_rel  # the image cross-attention is live
    assert digest.startswith("sha256:")


def test_c0_fast_path_matches_reference(i2v_dir):
    from fastvideo3.models.wan.fast import FastWanDiT
    card = resolve_card(str(i2v_dir))
    ours, _ = load_dit(card, "cpu", torch.float32)
    g = torch.Generator().manual_seed(2)
    x, t = torch.randn(2, 36, 3, 4, 6, generator=g), torch.tensor([600.0, 20.0])
    txt, img = torch.randn(2, 512, 32, generator=g), torch.randn(2, 17, 32, generator=g)
    with torch.no_grad():
        want = ours(x, t, txt, image=img)
        fast = FastWanDiT(ours, share_weights=False)
        got = fast(x, t, txt, image=img)
        stage = fast.embed(x, t, txt, img)
        staged = fast.head(stage, fast.run_blocks(stage, stage.x, 0, fast.num_blocks))
    assert rel_error(got, want) <= card.parity.c0_dit_rel
    assert rel_error(staged, want) <= card.parity.c0_dit_rel
    with pytest.raises(ValueError, match="image"):
        fast(x, t, txt)


def test_c0_image_encoder_matches_reference(i2v_dir, pipe):
    from fastvideo3.models.wan.image import ImageEncoder
    card = resolve_card(str(i2v_dir))
    enc = ImageEncoder(card, "cpu", torch.float32)
    image = pil(png(3))
    want = pipe.encode_image(image, torch.device("cpu"))  # penultimate hidden states
    got = enc.encode([image])
    assert got.shape == want.shape == (1, 17, 32)
    assert rel_error(got, want) <= card.parity.c0_text_rel


def test_c0_image_latent_matches_reference(i2v_dir, pipe):
    from fastvideo3.models.wan.components import VideoDecoder, encode_image_condition
    from fastvideo3.models.wan.image import vae_pixels
    card = resolve_card(str(i2v_dir))
    image = pil(png(4))
    pixels = pipe.video_processor.preprocess(image, height=32, width=48).to(torch.float32)
    ours_pixels = vae_pixels(image, 32, 48)
    assert torch.equal(ours_pixels, pixels)  # the same Lanczos resize and [-1, 1] scaling
    _, want = pipe.prepare_latents(pixels, 1, 16, 32, 48, 9, torch.float32, torch.device("cpu"),
                                   torch.Generator().manual_seed(0))
    got = encode_image_condition(VideoDecoder(card), ours_pixels, 9)
    assert got.shape == want.shape == (1, 20, 3, 4, 6)
    assert rel_error(got, want) <= card.parity.c0_vae_abs


@pytest.mark.parametrize("seed, guidance", [(0, 5.0), (5, 1.0)])
def test_c1_generation_matches_wanimagetovideopipeline(i2v_dir, pipe, seed, guidance):
    card = resolve_card(str(i2v_dir))
    data = png(10 + seed)
    kw = dict(image=pil(data), prompt=PROMPT, negative_prompt="blurry", guidance_scale=guidance, **OPTS)
    want = pipe(**kw, generator=torch.Generator().manual_seed(seed), output_type="latent").frames
    want_frames = pipe(**kw, generator=torch.Generator().manual_seed(seed), output_type="np").frames[0]
    with Engine(card, keep_latents=True) as engine:
        video = engine.generate(PROMPT, negative_prompt="blurry", guidance_scale=guidance, seed=seed, image=data,
                                **OPTS)
    assert rel_error(video.latents, want) <= card.parity.c1_latents_rel
    assert video.frames.shape == want_frames.shape == (9, 32, 48, 3)
    assert float(np.abs(video.frames - want_frames).max()) <= card.parity.c1_frames_abs
    assert video.metadata["weights"]["image_encoder"].startswith("sha256:")


def test_interleave_gate_and_step_batching_across_images(i2v_dir):
    """Three requests with different images and prompts: batched (their steps share DiT forwards)
    equals serial, and each request keeps its own image conditioning inside the batch."""
    card = resolve_card(str(i2v_dir))
    reqs = [("a red circle moving left", 1, png(21)), ("a blue square moving up", 22, png(22)),
            ("a red circle moving left", 1, png(23))]  # same prompt and seed as the first: only the image differs
    with Engine(card, keep_latents=True, batching=False) as engine:
        serial = [engine.generate(p, seed=s, image=im, **OPTS).latents for p, s, im in reqs]
    with Engine(card, keep_latents=True, batching=True) as engine:
        runs = [engine.submit(p, seed=s, image=im, **OPTS) for p, s, im in reqs]
        engine.run()
        rows = engine.denoiser.counters["max_batch_rows"]
        batched = [engine.result(r).latents for r in runs]
    assert rows == 2 * len(reqs)  # every request's cond and uncond rows in one forward
    for a, b in zip(batched, serial):
        assert rel_error(a, b) <= card.parity.c1_latents_rel
    assert rel_error(serial[0], serial[2]) > 1e-3  # the image conditions the result


def test_cost_model_counts_the_image_cross_attention():
    from fastvideo3.models.wan.family import dit_config
    from fastvideo3.models.wan.flops import StepShape, dit_forward_cost
    from fastvideo3.request.schema import GenerateRequest, resolve
    from fastvideo3.runtime.economy.pricing import Pricer
    i2v, t2v = get_card("wan2.1-i2v-14b-480p"), get_card("wan2.1-t2v-14b")
    ci, ct = dit_config(i2v), dit_config(t2v)
    assert (ci.in_channels, ci.image_dim, ci.image_len) == (36, 1280, 257)
    shape = StepShape.from_video(81, 480, 832, cfg_branches=2)
    a, b = dit_forward_cost(ci, shape), dit_forward_cost(ct, shape)
    n, tok, d, il, layers = 2, 21 * 30 * 52, 5120, 257, 40
    assert a.tokens == b.tokens == tok
    image = (n * 2 * 2.0 * il * d * d * layers + n * 2 * 2.0 * tok * il * d * layers
             + n * 2.0 * il * (1280 * 1280 + 1280 * d))
    patch = n * 2.0 * tok * (36 - 16) * 4 * d
    assert a.flops - b.flops == pytest.approx(image + patch, rel=1e-9)
    assert ci.param_count() - ct.param_count() == pytest.approx(
        layers * (2 * (d * d + d) + d) + (1280 * 1280 + 1280 + 1280 * d + d + 2 * 1280 + 2 * d) + 20 * 4 * d, rel=0)
    req = resolve(GenerateRequest("x", image=png(1, size=(832, 480))), i2v)
    feats = Pricer().features("diffusion_step", i2v, req)
    assert feats.config.image_len == 257 and feats.shape.latent_height == 60


def test_encoder_caches_image_embeddings_by_image_digest(i2v_dir):
    """The image's digest is in the CacheKey of its embeddings: the same image is a hit across
    requests, another image (same prompts) a miss."""
    from fastvideo3.cache import TextFeatureCache
    from fastvideo3.loop.params import EncoderChunkParams
    from fastvideo3.request.image import validate_image
    from fastvideo3.runtime.pool.executors import EncoderExecutor
    from fastvideo3.runtime.scheduling.workunit import WorkUnit
    from fastvideo3.transport import make_transport
    card = resolve_card(str(i2v_dir))
    transport = make_transport("inproc", owner="t")
    enc = EncoderExecutor(card, transport, "cpu", "fp32", cache=TextFeatureCache())

    def unit(rid, data):
        img = validate_image(data, 32, 48)
        return WorkUnit(unit_id=f"u-{rid}", request_id=rid, loop_id="text_encode", kind="encoder_chunk",
                        role="encoder", card_id=card.model_id, shape_sig="s",
                        params=EncoderChunkParams(prompts={"prompt_embeds": "a"}, image=img.data_b64,
                                                  image_digest=img.digest))
    a, b, c = (enc.execute([unit(r, d)])[0] for r, d in (("r1", png(1)), ("r2", png(1)), ("r3", png(2))))
    assert a.ok and b.ok and c.ok and "image_embeds" in a.outputs
    stats = enc.cache.stats()
    # prompts: a miss then two hits; images: a miss, a hit (same digest), a miss (another image)
    assert (stats["hits"], stats["misses"]) == (3, 3)
    got = [transport.fetch(r.outputs["image_embeds"], deadline_s=10.0) for r in (a, b, c)]
    assert torch.equal(got[0], got[1]) and not torch.equal(got[0], got[2])
    for r in ("r1", "r2", "r3"):
        enc.release(r)
    transport.close()


def test_image_encoder_refuses_what_its_files_do_not_hold(i2v_dir, tmp_path):
    import json
    import shutil
    from fastvideo3.card.registry import bind_checkpoint
    from fastvideo3.errors import CardError
    from fastvideo3.models.wan.image import ImageEncoder
    d = tmp_path / "d"
    shutil.copytree(i2v_dir, d)
    cfg_path = d / "image_encoder" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    card = bind_checkpoint(resolve_card(str(i2v_dir)), d)
    cfg_path.write_text(json.dumps({**cfg, "architectures": ["CLIPVisionModelWithProjection"]}))
    with pytest.raises(CardError) as e:  # the projection the class has is not in the files
        ImageEncoder(card)
    assert e.value.field == "image_encoder" and "visual_projection" in e.value.message
    cfg_path.write_text(json.dumps({**cfg, "architectures": ["SiglipVisionModel"]}))
    with pytest.raises(CardError) as e:
        ImageEncoder(card)
    assert e.value.field == "components.image_encoder.config.architectures"
