"""Stage 1 of the tiny recipe: the tiny VAE trained on the procedural clips.

The card's VAE config picks the module (:func:`fastvideo3.models.wan.components.build_vae`): the
recipe uses the patch autoencoder with the Wan latent layout, which trains in minutes on a CPU;
any module with the ``AutoencoderKLWan`` encode/decode API trains the same way. The objective is a KL-regularised autoencoder: L1 + L2 reconstruction, weighted up on the shape
(it covers a few percent of the pixels and carries everything the prompt asks for), plus a
small KL term so the latent space stays smooth for the DiT. After training, per-channel latent
statistics are measured and written into the VAE config (``latents_mean`` / ``latents_std``),
which is exactly how the serving decoder de-normalises latents, so the DiT sees unit-scale
latents in training and in serving alike.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from fastvideo3.models.reward.adherence import MOTIONS
from fastvideo3.training.data import ShapesDataset


@dataclass
class VAETrainConfig:
    steps: int = 2000
    batch_size: int = 8
    frames: int = 17
    height: int = 64
    width: int = 64
    lr: float = 1e-3
    kl_weight: float = 2e-4
    shape_weight: float = 4.0  # extra reconstruction weight on shape pixels
    motion_frames: int = 33  # clips show the serving clip's per-frame speed
    crop: int | None = 64  # train on crops around the shape (full-scale scenes, 1/4 of the pixels)
    seed: int = 1
    time_budget_s: float | None = None  # stop early when this wall time is spent
    log_every: int = 25


@dataclass
class VAETrainResult:
    steps: int
    seconds: float
    losses: list[tuple[int, float, float, float]] = field(default_factory=list)  # step, total, rec, kl


def build_vae(config: dict):
    from fastvideo3.models.wan.components import build_vae as build
    return build(config)


def shape_mask(x: torch.Tensor) -> torch.Tensor:
    """1 where a pixel differs from its clip's background (the top-left pixel is always background)."""
    bg = x[:, :, :, :1, :1]
    return ((x - bg).abs().sum(dim=1, keepdim=True) > 0.05).float()


def vae_loss(vae, x: torch.Tensor, cfg: VAETrainConfig, generator: torch.Generator | None = None):
    post = vae.encode(x).latent_dist
    z = post.mean + post.std * torch.randn(post.mean.shape, generator=generator, device=x.device)
    rec = vae.decode_raw(z) if hasattr(vae, "decode_raw") else vae.decode(z).sample
    w = 1.0 + cfg.shape_weight * shape_mask(x)
    err = rec - x
    rec_loss = (w * (err.abs() + err.square())).mean()
    kl = 0.5 * (post.mean.square() + post.var - 1.0 - post.logvar).mean()
    return rec_loss + cfg.kl_weight * kl, rec_loss.detach(), kl.detach()


def train_vae(vae, cfg: VAETrainConfig, device: str = "cpu", log=print) -> VAETrainResult:
    data = ShapesDataset(seed=cfg.seed, frames=cfg.frames, height=cfg.height, width=cfg.width,
                         motion_frames=cfg.motion_frames)
    vae.to(device).train().requires_grad_(True)
    opt = torch.optim.AdamW(vae.parameters(), lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    res = VAETrainResult(0, 0.0)
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        if cfg.time_budget_s is not None and time.perf_counter() - t0 > cfg.time_budget_s:
            break
        lr = cfg.lr * min(1.0, (step + 1) / 100)  # short warm-up
        for g in opt.param_groups:
            g["lr"] = lr
        x = crops(data, step, cfg, device)
        loss, rec, kl = vae_loss(vae, x, cfg, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        res.steps = step + 1
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            total = float(loss.detach())
            res.losses.append((step, total, float(rec), float(kl)))
            log(f"vae step {step} loss {total:.4f} rec {float(rec):.4f} kl {float(kl):.3f} "
                f"({time.perf_counter() - t0:.0f}s)")
    res.seconds = time.perf_counter() - t0
    vae.eval().requires_grad_(False)
    return res


def crops(data: ShapesDataset, step: int, cfg: VAETrainConfig, device) -> torch.Tensor:
    """Batch ``step`` of ``data``, cropped to ``cfg.crop`` around each shape's mid-clip position
    (jittered), so the autoencoder sees the serving scale at a quarter of the cost."""
    scenes = [data.scene(step * cfg.batch_size + i) for i in range(cfg.batch_size)]
    x = data.render(scenes, device)
    if not cfg.crop or cfg.crop >= min(data.height, data.width):
        return x
    c = cfg.crop
    rng = data.rng(10**9 + step)
    out = []
    for sc, clip in zip(scenes, x):
        dx, dy = MOTIONS[sc.motion]
        side = min(data.height, data.width)
        cx = (sc.start[0] + 0.5 * data.span * dx * sc.travel) * side
        cy = (sc.start[1] + 0.5 * data.span * dy * sc.travel) * side
        x0 = int(min(max(cx - c / 2 + rng.uniform(-c / 4, c / 4), 0), data.width - c))
        y0 = int(min(max(cy - c / 2 + rng.uniform(-c / 4, c / 4), 0), data.height - c))
        out.append(clip[:, :, y0 : y0 + c, x0 : x0 + c])
    return torch.stack(out)


@torch.no_grad()
def latent_stats(vae, data: ShapesDataset, clips: int = 64, batch_size: int = 8, device: str = "cpu"):
    """Per-channel mean and std of the posterior mean over ``clips`` clips of ``data``."""
    zs = []
    for step in range(max(1, clips // batch_size)):
        x, _ = data.batch(10_000 + step, batch_size, device)
        zs.append(vae.encode(x).latent_dist.mean.float())
    z = torch.cat(zs).transpose(0, 1).flatten(1)  # [C, N]
    return [round(float(v), 5) for v in z.mean(1)], [round(float(v), 5) for v in z.std(1).clamp_min(1e-3)]


@torch.no_grad()
def roundtrip_check(vae, data: ShapesDataset, clips: int = 16, device: str = "cpu") -> dict:
    """Encode -> decode held-out clips: PSNR, and the adherence scorer on the reconstructions
    against their captions (the ceiling of everything trained on top of this VAE)."""
    from fastvideo3.models.reward.adherence import AdherenceScorer
    from fastvideo3.training.data import to_frames
    scorer = AdherenceScorer()
    psnr, ok = [], []
    for i in range(clips):
        x, caps = data.batch(20_000 + i, 1, device)
        rec = vae.decode(vae.encode(x).latent_dist.mean).sample
        mse = float(((rec - x) / 2).square().mean())
        psnr.append(10 * torch.log10(torch.tensor(1.0 / max(mse, 1e-10))).item())
        ok.append(scorer.score(to_frames(rec[0]).cpu(), caps[0])["adherent"])
    return {"psnr_db": round(sum(psnr) / len(psnr), 2), "adherence": sum(ok) / len(ok), "clips": clips}


class LatentCodec:
    """Clips -> normalised latents with the trained VAE's encoder: ``(mode - mean) / std``, the
    inverse of the serving decoder's de-normalisation."""

    def __init__(self, vae, device: str = "cpu"):
        c = vae.config
        self.vae = vae
        self.mean = torch.tensor(c.latents_mean, device=device).view(1, -1, 1, 1, 1)
        self.std = torch.tensor(c.latents_std, device=device).view(1, -1, 1, 1, 1)

    @torch.no_grad()
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        return (self.vae.encode(video).latent_dist.mean.float() - self.mean) / self.std
