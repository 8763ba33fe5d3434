"""The Wan family object: what card/, loop/, runtime/ and the fake pools know of Wan, through
:mod:`fastvideo3.card.family`. Torch-free; the weights code (components.py, checkpoint.py) is
imported only when a checkpoint directory is read.
"""
from __future__ import annotations

from pathlib import Path

from fastvideo3.card.family import register_family
from fastvideo3.card.spec import ModelCard
from fastvideo3.models.family_base import PackagedFamily
from fastvideo3.models.wan import flops

#: the Wan VAE is causal in time: 1 + (frames - 1) / 4 latent frames
TEMPORAL_STRIDE = 4
WEIGHTS_DIR = Path(__file__).resolve().parents[2] / "weights"


def vae_spatial_scale(card: ModelCard) -> int:
    """The VAE's spatial compression the card declares (Wan2.1: 8; Wan2.2 TI2V-5B: 16)."""
    return int(card.components["vae"].config.get("scale_factor_spatial", 8)) if "vae" in card.components else 8


def latent_stride(card: ModelCard) -> tuple[int, int, int]:
    """(temporal, height, width) compression of the card's VAE."""
    s = vae_spatial_scale(card)
    return (TEMPORAL_STRIDE, s, s)


def latent_shape(card: ModelCard, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
    """(C, F_lat, H_lat, W_lat) for a request: 4x temporal, and the spatial compression the card's
    VAE declares (8x unless it says otherwise: Wan2.2 TI2V-5B's is 16x). C is what the DiT
    predicts (``out_channels``; an I2V DiT takes more channels in: the image conditioning)."""
    cfg = card.components["transformer"].config
    c = int(cfg.get("out_channels", cfg.get("in_channels", 16)))
    s = vae_spatial_scale(card)
    return (c, (frames - 1) // TEMPORAL_STRIDE + 1, height // s, width // s)


def dit_config(card: ModelCard) -> flops.DitConfig:
    c = card.components["transformer"].config
    return flops.DitConfig(
        num_layers=int(c["num_layers"]), num_heads=int(c["num_attention_heads"]), head_dim=int(c["attention_head_dim"]),
        ffn_dim=int(c["ffn_dim"]), text_dim=int(c.get("text_dim", 4096)), freq_dim=int(c.get("freq_dim", 256)),
        in_channels=int(c.get("in_channels", 16)), out_channels=int(c.get("out_channels", 16)),
        patch_size=tuple(c.get("patch_size", (1, 2, 2))), text_len=int(card.max_text_tokens),
        **_image(card),
    )


def _image(card: ModelCard) -> dict:
    """The I2V DiT's image width and token count (the card's image encoder declares the count)."""
    dim = card.components["transformer"].config.get("image_dim")
    if not dim or "image_encoder" not in card.components:
        return {}
    return {"image_dim": int(dim), "image_len": int(card.components["image_encoder"].config.get("tokens", 257))}


#: Wan2.1 / Wan2.2 text-to-video (and the tiny cards of the same architecture)
WAN = register_family(PackagedFamily("wan", "fastvideo3.models.wan", flops, latent_shape, latent_stride, dit_config,
                                     WEIGHTS_DIR))
