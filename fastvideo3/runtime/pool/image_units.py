"""The image-to-video parts of the encoder and decoder executors (runtime/pool/executors.py, vae_executor.py).

- :func:`image_embeds`: the encoder pool's CLIP hidden states of a unit's image, cached (when the
  pool has a feature cache) under a CacheKey holding the image's digest and the encoder's weights.
- :func:`vae_encode`: the decoder pool's ``vae_encode`` unit: the image resized to the request's
  size and encoded as the first frame, published as ``image_latents``.

The math is the model family's (models/wan/image.py); these only decode the unit's image and
publish what comes out.
"""
from __future__ import annotations

import base64

import torch

from fastvideo3.errors import InvalidRequest
from fastvideo3.loop.protocol import StepResult


def image_embeds(executor, unit) -> torch.Tensor:
    """The unit's image's CLIP hidden states ``[1, T_img, image_dim]``."""
    from fastvideo3.models.wan.image import open_rgb
    enc = executor.image_encoder
    if enc is None:
        raise InvalidRequest(f"card {executor.card.model_id} has no image encoder", field="image", limit="unset")

    def run() -> torch.Tensor:
        return enc.encode([open_rgb(base64.b64decode(unit.params["image"]))])
    store = getattr(executor.cache, "cache", None)  # the text cache's FeatureCache, when there is one
    if store is None:
        return run()
    from fastvideo3.cache.key import CacheKey
    digest = unit.params.get("image_digest") or ""
    key = CacheKey(model_id=executor.card.model_id, component_id="image_encoder", weights_version=enc.digest,
                   precision="fp32", device=str(executor.device).split(":")[0], max_len=0, shape_sig="images=1",
                   input_hash=digest, image_digest=digest)
    hit = store.lookup(key, unit.request_id)
    return hit if hit is not None else store.insert(key, run(), unit.request_id)


def vae_encode(executor, unit) -> StepResult:
    """An image-to-video request's image latent conditioning, published as ``image_latents``."""
    from fastvideo3.models.wan.components import encode_image_condition
    from fastvideo3.models.wan.image import open_rgb, vae_pixels
    p = unit.params
    if "image_encoder" not in executor.card.components:
        raise InvalidRequest(f"card {executor.card.model_id} is not image-to-video", field="image", limit="unset")
    pixels = vae_pixels(open_rgb(base64.b64decode(p["image"])), int(p["height"]), int(p["width"]))
    cond = executor.on_vae_thread(encode_image_condition, executor.vae, pixels, int(p["num_frames"])).contiguous()
    ref = executor.transport.publish(unit.request_id, "image_latents", cond)
    return StepResult(unit.unit_id, unit.request_id, outputs={"image_latents": ref},
                      payload={"image_latents_shape": list(cond.shape)})
