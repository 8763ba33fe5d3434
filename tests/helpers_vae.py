"""Tiny random ``AutoencoderKLWan`` models for the fused-decoder tests."""
from __future__ import annotations

import torch
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

#: tiny decoders: Wan2.1's layout, and Wan2.2's (residual up blocks, 2x2 patches, DupUp3D shortcuts)
WAN21 = dict(base_dim=16, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True])
WAN22 = dict(base_dim=16, decoder_base_dim=16, z_dim=8, in_channels=12, out_channels=12, patch_size=2,
             scale_factor_spatial=16, is_residual=True, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
             temperal_downsample=[False, True, True])


def tiny_vae(cfg: dict, seed: int = 0) -> AutoencoderKLWan:
    """A random tiny ``AutoencoderKLWan``, its norms' gammas (ones at init) drawn too."""
    torch.manual_seed(seed)
    m = AutoencoderKLWan(**cfg).eval().requires_grad_(False)
    for mod in m.modules():
        if isinstance(mod, WanRMS_norm):
            mod.gamma.normal_(1.0, 0.3)
    return m
