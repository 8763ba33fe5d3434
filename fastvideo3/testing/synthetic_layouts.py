"""Random tiny checkpoints of the layouts next to Wan2.1 T2V, written by diffusers' own classes.

- :func:`build_wan22_moe_dir`: Wan2.2 A14B text-to-video (``WanPipeline`` with ``transformer``
  for high noise, ``transformer_2`` for low noise, ``boundary_ratio``).
- :func:`build_wan22_ti2v_dir`: Wan2.2 TI2V-5B (``expand_timesteps``; the 48-channel VAE with
  16x spatial compression).
- :func:`build_wan21_i2v_dir`: Wan2.1 image-to-video (``WanImageToVideoPipeline``: a CLIP image
  encoder and processor, a DiT with image cross-attention and 36 input channels).
- :func:`build_hunyuan15_dir`: the HunyuanVideo-1.5 transformer and VAE under a
  ``HunyuanVideo15Pipeline`` index (text encoders left out).

Each loads with the matching diffusers pipeline (given any component left out explicitly); the
loaders use them to prove they load what they implement and refuse, by name, what they do not.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from fastvideo3.testing.synthetic_wan import (
    TINY_TRANSFORMER, TINY_VAE, _module_seed, build_wan_dir, write_random_transformer,
)
from fastvideo3.vocab import Sampler

#: the Wan2.2 VAE's layout at a tiny width: 48 latent channels, a 2x2 input patch, 16x spatial
TINY_WAN22_VAE: dict[str, Any] = {
    "base_dim": 4, "decoder_base_dim": 4, "z_dim": 48, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1,
    "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0, "is_residual": True,
    "in_channels": 12, "out_channels": 12, "patch_size": 2, "scale_factor_temporal": 4, "scale_factor_spatial": 16,
    "latents_mean": [0.0] * 48, "latents_std": [1.0] * 48,
}


def _patch_index(root: Path, **updates) -> None:
    p = root / "model_index.json"
    index = json.loads(p.read_text())
    index.update(updates)
    p.write_text(json.dumps(index, indent=2) + "\n")


def build_wan22_moe_dir(path: str | Path, *, seed: int = 0, boundary_ratio: float = 0.875,
                        transformer_config: dict | None = None, scheduler: str = Sampler.UNIPC, flow_shift: float = 3.0,
                        dtype: torch.dtype | None = None, **kw) -> Path:
    """A two-expert Wan2.2 T2V directory: ``transformer`` and ``transformer_2`` share one
    architecture and differ in their random weights (seeds ``seed`` and ``seed + 1000``)."""
    cfg = dict(transformer_config or TINY_TRANSFORMER)
    root = build_wan_dir(path, seed=seed, transformer_config=cfg, scheduler=scheduler, flow_shift=flow_shift,
                         dtype=dtype, **kw)
    write_random_transformer(cfg, root / "transformer_2", seed=seed + 1000, dtype=dtype or torch.float32)
    _patch_index(root, transformer_2=["diffusers", "WanTransformer3DModel"], boundary_ratio=boundary_ratio)
    return root


def build_wan22_ti2v_dir(path: str | Path, *, seed: int = 0) -> Path:
    """A tiny TI2V-5B-layout directory: 48-channel DiT, the Wan2.2 VAE, ``expand_timesteps``."""
    cfg = {**TINY_TRANSFORMER, "in_channels": 48, "out_channels": 48}
    root = build_wan_dir(path, seed=seed, transformer_config=cfg, vae_config=TINY_WAN22_VAE)
    _patch_index(root, expand_timesteps=True)
    return root


def build_wan21_i2v_dir(path: str | Path, *, seed: int = 0) -> Path:
    """A tiny Wan2.1 I2V directory: CLIP vision encoder + processor, a DiT with image cross-attention
    (``image_dim``, ``added_kv_proj_dim``) and 16 + 4 + 16 input channels."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    inner = TINY_TRANSFORMER["num_attention_heads"] * TINY_TRANSFORMER["attention_head_dim"]
    cfg = {**TINY_TRANSFORMER, "in_channels": 36, "out_channels": 16, "image_dim": 32, "added_kv_proj_dim": inner}
    root = build_wan_dir(path, seed=seed, transformer_config=cfg, vae_config=TINY_VAE)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_module_seed(seed, "image_encoder"))
        enc = CLIPVisionModel(CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, image_size=32, patch_size=8)).eval()
    enc.save_pretrained(root / "image_encoder")
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(
        root / "image_processor")
    _patch_index(root, _class_name="WanImageToVideoPipeline", image_encoder=["transformers", "CLIPVisionModel"],
                 image_processor=["transformers", "CLIPImageProcessor"])
    return root


def build_hunyuan15_dir(path: str | Path, *, seed: int = 0) -> Path:
    """The HunyuanVideo-1.5 transformer and VAE at a tiny size under its pipeline's index."""
    import diffusers
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Transformer3DModel

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_module_seed(seed, "transformer"))
        HunyuanVideo15Transformer3DModel(
            in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
            num_refiner_layers=1, text_embed_dim=32, text_embed_2_dim=32, image_embed_dim=32,
            rope_axes_dim=(4, 6, 6)).save_pretrained(root / "transformer")
        AutoencoderKLHunyuanVideo15(latent_channels=4, block_out_channels=(8, 8, 8, 8, 8), layers_per_block=1,
                                    spatial_compression_ratio=16).save_pretrained(root / "vae")
    FlowMatchEulerDiscreteScheduler(shift=7.0).save_pretrained(root / "scheduler")
    index = {"_class_name": "HunyuanVideo15Pipeline", "_diffusers_version": diffusers.__version__,
             "transformer": ["diffusers", "HunyuanVideo15Transformer3DModel"],
             "vae": ["diffusers", "AutoencoderKLHunyuanVideo15"],
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": [None, None], "tokenizer": [None, None], "text_encoder_2": [None, None],
             "tokenizer_2": [None, None], "guider": [None, None]}
    (root / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    return root
