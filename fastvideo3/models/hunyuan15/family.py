"""The HunyuanVideo-1.5 family object: what card/, loop/, runtime/ and the fake pools know of
HunyuanVideo-1.5, through :mod:`fastvideo3.card.family`. Torch-free; the weights code
(components.py, checkpoint.py) is imported only when a checkpoint directory is read.
"""
from __future__ import annotations

from fastvideo3.card.family import register_family
from fastvideo3.card.spec import ModelCard
from fastvideo3.models.family_base import PackagedFamily
from fastvideo3.models.hunyuan15 import flops


def latent_stride(card: ModelCard) -> tuple[int, int, int]:
    """(temporal, height, width) compression of the card's VAE (HunyuanVideo-1.5: 4, 16, 16)."""
    v = card.components["vae"].config
    s = int(v.get("spatial_compression_ratio", 16))
    return int(v.get("temporal_compression_ratio", 4)), s, s


def latent_shape(card: ModelCard, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
    """(C, F_lat, H_lat, W_lat): the VAE is causal in time, ``1 + (frames - 1) / t`` latent frames."""
    t, s, _ = latent_stride(card)
    c = int(card.components["vae"].config.get("latent_channels", 32))
    return (c, (frames - 1) // t + 1, height // s, width // s)


def dit_config(card: ModelCard) -> flops.DitConfig:
    return flops.DitConfig.from_transformer_config(card.components["transformer"].config)


#: HunyuanVideo-1.5 text-to-video (diffusers' HunyuanVideo15Pipeline layout); it ships no weights
HUNYUAN15 = register_family(PackagedFamily("hunyuan15", "fastvideo3.models.hunyuan15", flops,
                                           latent_shape, latent_stride, dit_config))
