"""A Wan2.1 image-to-video request served end to end by a fleet (one process per role, over
gRPC): the image travels in the Generate request, the encoder pool returns its CLIP hidden states,
the decoder pool's vae_encode returns the first-frame image latent, the denoiser conditions every
step on both, and the frames match diffusers' WanImageToVideoPipeline. A bad image is
INVALID_ARGUMENT naming ``image`` at the edge, and nothing is left resident afterwards."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from fastvideo3.client import FleetClient
from fastvideo3.errors import InvalidRequest
from fleet.launcher import LocalFleet
from tests.fleet_fixture import pool_describe, running

pytestmark = pytest.mark.timeout(600)
OPTS = dict(num_frames=9, height=32, width=48, num_inference_steps=3)
PROMPT = "a red circle moving left on a white background"


def _png(seed: int, size=(56, 40)) -> bytes:
    from PIL import Image
    arr = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def i2v_dir(tmp_path_factory):
    from fastvideo3.testing.synthetic_layouts import build_wan21_i2v_dir
    return build_wan21_i2v_dir(tmp_path_factory.mktemp("i2v") / "wan21-i2v", seed=11)


@pytest.fixture(scope="module")
def fleet(i2v_dir, tmp_path_factory):
    f = LocalFleet(str(i2v_dir), roles=("encoder", "denoiser", "decoder"), log_dir=tmp_path_factory.mktemp("logs"))
    with running(f) as started:
        yield started


def test_i2v_request_served_end_to_end(fleet, i2v_dir):
    import diffusers.pipelines.wan.pipeline_wan as wan_t2v
    import diffusers.pipelines.wan.pipeline_wan_i2v as wan_i2v
    from diffusers import WanImageToVideoPipeline
    from PIL import Image
    data = _png(5)
    with pytest.MonkeyPatch.context() as mp:  # diffusers 0.42's I2V pipeline needs ftfy (see test_wan21_i2v.py)
        if not wan_i2v.is_ftfy_available():
            mp.setattr(wan_i2v, "prompt_clean", wan_t2v.prompt_clean)
        pipe = WanImageToVideoPipeline.from_pretrained(str(i2v_dir))
        want = pipe(image=Image.open(io.BytesIO(data)).convert("RGB"), prompt=PROMPT, negative_prompt="blurry",
                    guidance_scale=5.0, **OPTS, generator=torch.Generator().manual_seed(4), output_type="np").frames[0]
    with FleetClient(fleet.target, timeout_s=300) as c:
        video = c.generate(PROMPT, negative_prompt="blurry", guidance_scale=5.0, seed=4, image=data,
                           output_format="npy", **OPTS)
        for bad, words in ((b"not an image", "decodable"), (_png(1, size=(64, 64)), "aspect"),
                           ("http://127.0.0.1:9/x.png", "not fetched"), (None, "needs an image")):
            with pytest.raises(InvalidRequest) as e:  # validated before anything is queued
                c.generate(PROMPT, image=bad, output_format="npy", **OPTS)
            assert e.value.field == "image" and words in e.value.message, (e.value.field, e.value.message)
    frames = video.frames
    assert frames.shape == want.shape == (9, 32, 48, 3)
    assert float(np.abs(frames - np.clip(want, 0, 1)).max()) <= 1e-3
    dec = pool_describe(fleet.pools["decoder"][0].target)
    assert "vae_encode" in dec.kinds
    for role in ("encoder", "denoiser", "decoder"):  # the image embeddings and latent are released too
        assert pool_describe(fleet.pools[role][0].target).resident_buffers == 0
