"""A patch autoencoder with the Wan2.1 VAE's latent layout, small enough to train on a CPU.

The tiny recipe's VAE. It keeps everything the rest of the runtime relies on from the Wan VAE:
16 latent channels, 8x spatial and 4x causal temporal compression (frame 0 is its own latent
frame; every later latent frame covers 4 frames, so ``F = 4k + 1`` frames give ``k + 1`` latent
frames), ``latents_mean`` / ``latents_std`` de-normalisation, and the ``encode(x).latent_dist`` /
``decode(z, return_dict=False)`` calls of ``diffusers.AutoencoderKLWan``. Inside, it is a
per-latent-frame 2-D network: each 4x8x8 pixel patch is flattened (space- and time-to-depth),
mapped to a Gaussian posterior by a 1x1 / 3x3 / 1x1 conv stack over the latent grid, and
decoded by a 3x3 / 3x3 / 1x1 conv stack back to a 4x8x8 patch. Frame 0 is encoded as four
copies of itself and decoded from the last of the four.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

PATCH, TPATCH = 8, 4


@dataclass
class Posterior:
    mean: torch.Tensor
    logvar: torch.Tensor

    @property
    def std(self) -> torch.Tensor:
        return torch.exp(0.5 * self.logvar)

    @property
    def var(self) -> torch.Tensor:
        return torch.exp(self.logvar)

    def mode(self) -> torch.Tensor:
        return self.mean


class PatchVAE(nn.Module):
    """``encode([B, 3, 4k+1, H, W]) -> latent_dist over [B, z, k+1, H/8, W/8]``; ``decode`` inverts."""

    def __init__(self, z_dim: int = 16, enc_dim: int = 64, dec_dim: int = 96,
                 latents_mean: list[float] | None = None, latents_std: list[float] | None = None, **_):
        super().__init__()
        d = 3 * TPATCH * PATCH * PATCH
        self.z_dim = z_dim
        self.enc_in = nn.Conv2d(d, enc_dim, 1)
        self.enc_mid = nn.Conv2d(enc_dim, enc_dim, 3, padding=1)
        self.enc_out = nn.Conv2d(enc_dim, 2 * z_dim, 1)
        self.dec_in = nn.Conv2d(z_dim, dec_dim, 3, padding=1)
        self.dec_mid = nn.Conv2d(dec_dim, dec_dim, 3, padding=1)
        self.dec_out = nn.Conv2d(dec_dim, d, 1)
        self.config = SimpleNamespace(
            z_dim=z_dim, temperal_downsample=[False, True, True],
            latents_mean=list(latents_mean or [0.0] * z_dim), latents_std=list(latents_std or [1.0] * z_dim),
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.enc_in.weight.dtype

    def register_to_config(self, **kw) -> None:
        for k, v in kw.items():
            setattr(self.config, k, v)

    # -- layout -----------------------------------------------------------------------------
    @staticmethod
    def to_patches(x: torch.Tensor) -> torch.Tensor:
        """[B, 3, 4k+1, H, W] -> [B*(k+1), 3*4*8*8, H/8, W/8] (frame 0 repeated to a full group)."""
        b, c, f, h, w = x.shape
        if (f - 1) % TPATCH or h % PATCH or w % PATCH:
            raise ValueError(f"video {tuple(x.shape)} is not [B, 3, 4k+1, 8m, 8n]")
        x = torch.cat([x[:, :, :1].expand(b, c, TPATCH - 1, h, w), x], dim=2)
        t = x.shape[2] // TPATCH
        x = x.reshape(b, c, t, TPATCH, h // PATCH, PATCH, w // PATCH, PATCH)
        x = x.permute(0, 2, 1, 3, 5, 7, 4, 6)  # b, t, c, tp, p, p, h', w'
        return x.reshape(b * t, c * TPATCH * PATCH * PATCH, h // PATCH, w // PATCH)

    @staticmethod
    def from_patches(p: torch.Tensor, b: int) -> torch.Tensor:
        """Inverse of :meth:`to_patches`, keeping the last frame of group 0 as frame 0."""
        bt, _, hh, ww = p.shape
        t = bt // b
        x = p.reshape(b, t, 3, TPATCH, PATCH, PATCH, hh, ww).permute(0, 2, 1, 3, 6, 4, 7, 5)
        x = x.reshape(b, 3, t * TPATCH, hh * PATCH, ww * PATCH)
        return x[:, :, TPATCH - 1:]

    # -- the diffusers-shaped API -------------------------------------------------------------
    def encode(self, x: torch.Tensor) -> SimpleNamespace:
        b = x.shape[0]
        h = F.silu(self.enc_in(self.to_patches(x)))
        h = self.enc_out(F.silu(self.enc_mid(h)))
        h = h.reshape(b, -1, *h.shape[1:]).transpose(1, 2)  # [B, 2z, T, h, w]
        mean, logvar = h.chunk(2, dim=1)
        return SimpleNamespace(latent_dist=Posterior(mean, logvar.clamp(-30.0, 20.0)))

    def decode_raw(self, z: torch.Tensor) -> torch.Tensor:
        """Latents -> video without the output clamp (the training objective's view)."""
        b, c, t, hh, ww = z.shape
        h = z.transpose(1, 2).reshape(b * t, c, hh, ww)
        h = F.silu(self.dec_in(h))
        h = self.dec_out(F.silu(self.dec_mid(h)))
        return self.from_patches(h, b)

    def decode(self, z: torch.Tensor, return_dict: bool = True):
        out = self.decode_raw(z).clamp(-1.0, 1.0)
        return SimpleNamespace(sample=out) if return_dict else (out,)
