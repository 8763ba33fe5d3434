"""Stage 2 of the tiny recipe: the DiT and the text encoder, trained jointly with flow matching.

The models are the serving models, built by the serving loaders from a card
(:func:`~fastvideo3.models.wan.components.load_dit`, :class:`~fastvideo3.models.wan.components.TextEncoder`)
and switched to the train profile (grad on); the text path is the serving ``TextEncoder.forward``
(same tokenizer, same prompt cleaning, same trimming). Captions are dropped to the empty prompt
with probability ``cond_dropout`` so the serving CFG's unconditional branch (negative prompt
``""``) is a trained quantity. An EMA of both is what ships.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import torch

from fastvideo3.training.checkpoint import EMA
from fastvideo3.training.data import ShapesDataset
from fastvideo3.training.flow import SigmaSampler, flow_matching_loss


@dataclass
class DiTTrainConfig:
    steps: int = 4000
    batch_size: int = 32
    lr: float = 1e-3
    text_lr: float = 5e-4
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    cond_dropout: float = 0.1
    flow_shift: float = 3.0
    ema_decay: float = 0.995
    reuse: int = 3  # optimizer steps per encoded batch (fresh noise and sigma each time)
    shape_weight: float = 4.0  # extra loss weight on latent cells the moving shape touches
    seed: int = 2
    time_budget_s: float | None = None  # the lr schedule runs on elapsed/budget when set
    log_every: int = 50


@dataclass
class TrainLog:
    steps: int = 0
    seconds: float = 0.0
    samples: int = 0
    losses: list[tuple[int, float, float]] = field(default_factory=list)  # step, mean loss, seconds


class JointTrainer:
    """One optimizer over the DiT and the text encoder; :meth:`step` is one update."""

    def __init__(self, dit, text_encoder, cfg: DiTTrainConfig, device: str = "cpu"):
        self.dit, self.text, self.cfg, self.device = dit, text_encoder, cfg, device
        dit.train().requires_grad_(True)
        text_encoder.model.train().requires_grad_(True)
        self.opt = torch.optim.AdamW(
            [{"params": list(dit.parameters()), "lr": cfg.lr, "base_lr": cfg.lr},
             {"params": list(text_encoder.model.parameters()), "lr": cfg.text_lr, "base_lr": cfg.text_lr}],
            weight_decay=cfg.weight_decay, betas=(0.9, 0.99),
        )
        self.sigmas = SigmaSampler(cfg.flow_shift, device=device)
        self.gen = torch.Generator(device=device).manual_seed(cfg.seed)
        self.rng = random.Random(cfg.seed)
        self.ema_dit = EMA(dit, cfg.ema_decay)
        self.ema_text = EMA(text_encoder.model, cfg.ema_decay)

    def set_progress(self, step: int, progress: float) -> float:
        """Warm-up then cosine decay to ``min_lr_ratio``; ``progress`` in [0, 1]."""
        c = self.cfg
        scale = min(1.0, (step + 1) / c.warmup)
        scale *= c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        for g in self.opt.param_groups:
            g["lr"] = g["base_lr"] * scale
        return scale

    def captions(self, captions: list[str]) -> list[str]:
        return ["" if self.rng.random() < self.cfg.cond_dropout else c for c in captions]

    def loss(self, x0: torch.Tensor, captions: list[str], weight: torch.Tensor | None = None) -> torch.Tensor:
        text = self.text.forward(captions)
        sigma, t = self.sigmas(x0.shape[0], self.gen)
        eps = torch.randn(x0.shape, generator=self.gen, device=x0.device)
        return flow_matching_loss(self.dit, x0, text, sigma, t, eps, weight)

    def step(self, x0: torch.Tensor, captions: list[str], weight: torch.Tensor | None = None) -> float:
        loss = self.loss(x0, self.captions(captions), weight)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in self.opt.param_groups for p in g["params"]], 1.0)
        self.opt.step()
        self.ema_dit.update(self.dit)
        self.ema_text.update(self.text.model)
        return float(loss.detach())


def latent_shape_weight(video: torch.Tensor, extra: float) -> torch.Tensor:
    """``1 + extra`` on latent cells (and their neighbours) that the shape covers in ``video``
    ([B, 3, 4k+1, H, W]); 1 elsewhere. Shape ``[B, 1, k+1, H/8, W/8]``."""
    from fastvideo3.training.vae import shape_mask
    m = shape_mask(video)  # [B, 1, F, H, W]
    b, _, f, h, w = m.shape
    m = torch.cat([m[:, :, :1].expand(b, 1, 3, h, w), m], dim=2)  # the VAE's causal grouping
    m = m.reshape(b, 1, (f + 3) // 4, 4, h // 8, 8, w // 8, 8).amax(dim=(3, 5, 7))
    m = torch.nn.functional.max_pool3d(m, (1, 3, 3), stride=1, padding=(0, 1, 1))
    return 1.0 + extra * m


def train_dit(trainer: JointTrainer, codec, data: ShapesDataset, log=print) -> TrainLog:
    """Render -> encode (frozen VAE) -> flow-matching updates, until steps or the time budget end."""
    c = trainer.cfg
    out = TrainLog()
    t0 = time.perf_counter()
    window: list[float] = []
    step = 0
    batch_index = 0
    while step < c.steps:
        elapsed = time.perf_counter() - t0
        if c.time_budget_s is not None and elapsed > c.time_budget_s:
            break
        video, captions = data.batch(batch_index, c.batch_size, trainer.device)
        batch_index += 1
        x0 = codec.encode(video)
        weight = latent_shape_weight(video, c.shape_weight) if c.shape_weight else None
        for _ in range(c.reuse):
            progress = (elapsed / c.time_budget_s) if c.time_budget_s else step / c.steps
            trainer.set_progress(step, progress)
            window.append(trainer.step(x0, captions, weight))
            out.samples += c.batch_size
            if step % c.log_every == 0:
                out.losses.append((step, sum(window) / len(window), round(time.perf_counter() - t0, 2)))
                log(f"dit step {step} loss {out.losses[-1][1]:.4f} ({out.losses[-1][2]:.0f}s)")
                window = []
            step += 1
            if step >= c.steps:
                break
    out.steps = step
    out.seconds = time.perf_counter() - t0
    return out
