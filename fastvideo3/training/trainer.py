"""Stage 2 of the tiny recipe: the DiT and the text encoder, trained jointly with flow matching.

The models are the serving models, built by the serving loaders from a card
(:func:`~fastvideo3.models.wan.components.load_dit`, :class:`~fastvideo3.models.wan.components.TextEncoder`)
and switched to the train profile (grad on); the text path is the serving ``TextEncoder.forward``
(same tokenizer, same prompt cleaning, same trimming). Captions are dropped to the empty prompt
with probability ``cond_dropout`` so the serving CFG's unconditional branch (negative prompt
``""``) is a trained quantity. An EMA of both is what ships.
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass, field

import torch

from fastvideo3.models.reward.adherence import MOTIONS, parse_prompt
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
    # direction groups (ShapesDataset.group_batch): each scene in all four directions, one
    # noise draw and one sigma per group, so the loss differences inside a group come from the
    # direction word alone
    groups: bool = False
    # weight of an auxiliary direction classifier on the text encoder's mean-pooled output (the
    # head is a training-only module): keeps the four direction words apart in what the DiT's
    # cross-attention reads
    text_aux: float = 0.0
    autocast: str | None = None  # "bf16": the forward passes under CUDA bf16 autocast


@dataclass
class TrainLog:
    steps: int = 0
    seconds: float = 0.0
    samples: int = 0
    losses: list[tuple[int, float, float]] = field(default_factory=list)  # step, mean loss, seconds
    probes: list[dict] = field(default_factory=list)
    batch_index: int = 0  # the next batch a continuing run should draw


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
        self.aux_head = torch.nn.Linear(text_encoder.dim, len(MOTIONS)).to(device)
        if cfg.text_aux:
            self.opt.add_param_group({"params": list(self.aux_head.parameters()), "lr": cfg.text_lr,
                                      "base_lr": cfg.text_lr, "weight_decay": 0.0})
        self.last_aux: float | None = None

    def autocast(self):
        if self.cfg.autocast == "bf16" and str(self.device).startswith("cuda"):
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

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
        with self.autocast():
            text = self.text.forward(captions)
        b = x0.shape[0]
        if self.cfg.groups and b % len(MOTIONS) == 0:  # one noise draw and sigma per direction group
            g = len(MOTIONS)
            sigma, t = self.sigmas(b // g, self.gen)
            sigma, t = sigma.repeat_interleave(g), t.repeat_interleave(g)
            eps = torch.randn((b // g, *x0.shape[1:]), generator=self.gen, device=x0.device).repeat_interleave(g, 0)
        else:
            sigma, t = self.sigmas(b, self.gen)
            eps = torch.randn(x0.shape, generator=self.gen, device=x0.device)
        with self.autocast():
            loss = flow_matching_loss(self.dit, x0, text, sigma, t, eps, weight)
        if self.cfg.text_aux:
            loss = loss + self.cfg.text_aux * self.aux_loss(text, captions)
        return loss

    def aux_loss(self, text: torch.Tensor, captions: list[str]) -> torch.Tensor:
        """Cross-entropy of the direction read from the mean-pooled text embedding (captions
        dropped to "" are left out)."""
        names = list(MOTIONS)
        keep = [i for i, c in enumerate(captions) if c]
        labels = []
        for i in keep:
            f = parse_prompt(captions[i])
            labels.append(names.index(f.motion) if f is not None else -100)
        if not keep:
            return text.sum() * 0.0
        t = text[keep].float()
        n = t.abs().sum(-1).gt(0).sum(1, keepdim=True).clamp(min=1)
        logits = self.aux_head(t.sum(1) / n)
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels, device=logits.device), ignore_index=-100)
        self.last_aux = float(loss.detach())
        return loss

    def state(self) -> dict:
        """What a later chunk needs to continue: raw weights (fp16), EMA bookkeeping, the aux head
        and the generators. The EMA weights themselves are the shipped files. The optimizer's
        moments are not kept (they would triple the file); a resumed chunk warms up again."""
        half = lambda m: {k: (v.half() if v.is_floating_point() else v).cpu() for k, v in m.state_dict().items()}  # noqa: E731
        return {"dit": half(self.dit), "text": half(self.text.model), "aux_head": self.aux_head.state_dict(),
                "ema_updates": self.ema_dit.updates, "gen": self.gen.get_state(), "rng": self.rng.getstate()}

    def load_state(self, st: dict) -> None:
        with torch.no_grad():
            for mod, key in ((self.dit, "dit"), (self.text.model, "text")):
                own = mod.state_dict()
                for k, v in st[key].items():
                    own[k].copy_(v.to(own[k].dtype))
        self.aux_head.load_state_dict(st["aux_head"])
        self.ema_dit.updates = self.ema_text.updates = int(st["ema_updates"])
        try:
            self.gen.set_state(st["gen"])
        except (RuntimeError, TypeError):  # another device's generator: keep this one's seed
            pass
        self.rng.setstate(st["rng"])

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


def train_dit(trainer: JointTrainer, codec, data: ShapesDataset, log=print, probe=None,
              probe_every_s: float | None = None, stop=None, start_batch: int = 0) -> TrainLog:
    """Render -> encode (frozen VAE) -> flow-matching updates, until steps or the time budget end.

    ``probe()`` (a dict) runs every ``probe_every_s`` seconds and once at the end; its results go
    into ``TrainLog.probes``; training stops early when ``stop(result)`` is true. Batches are
    numbered from ``start_batch`` (a resumed chunk sees new clips). The time spent probing counts
    against the budget."""
    c = trainer.cfg
    out = TrainLog()
    t0 = time.perf_counter()
    window: list[float] = []
    step = 0
    batch_index = start_batch
    next_probe = probe_every_s if probe_every_s else None
    stopped = False

    def run_probe() -> bool:
        t = time.perf_counter()
        res = probe()
        res = {"step": step, "seconds": round(time.perf_counter() - t0, 1),
               "probe_seconds": round(time.perf_counter() - t, 1), **res}
        out.probes.append(res)
        log(f"probe at step {step}: direction {res.get('direction')} color {res.get('color')} "
            f"caption-probe direction {res.get('direction_acc')} gap {res.get('direction_gap')} color {res.get('color_acc')} "
            f"adherence {res.get('adherence')} travel {res.get('median_travel')} ({res['probe_seconds']}s)")
        return bool(stop and stop(res))

    while step < c.steps:
        elapsed = time.perf_counter() - t0
        if c.time_budget_s is not None and elapsed > c.time_budget_s:
            break
        if probe is not None and next_probe is not None and elapsed >= next_probe:
            next_probe = elapsed + probe_every_s
            if run_probe():
                stopped = True
                break
        if c.groups:
            video, captions = data.group_batch(batch_index, max(1, c.batch_size // len(MOTIONS)), trainer.device)
        else:
            video, captions = data.batch(batch_index, c.batch_size, trainer.device)
        batch_index += 1
        x0 = codec.encode(video).float()  # fp32 targets (the VAE is cheap)
        weight = latent_shape_weight(video, c.shape_weight) if c.shape_weight else None
        for _ in range(c.reuse):
            progress = (elapsed / c.time_budget_s) if c.time_budget_s else step / c.steps
            trainer.set_progress(step, progress)
            window.append(trainer.step(x0, captions, weight))
            out.samples += len(captions)
            if step % c.log_every == 0:
                out.losses.append((step, sum(window) / len(window), round(time.perf_counter() - t0, 2)))
                aux = f" aux {trainer.last_aux:.3f}" if trainer.last_aux is not None else ""
                log(f"dit step {step} loss {out.losses[-1][1]:.4f}{aux} ({out.losses[-1][2]:.0f}s)")
                window = []
            step += 1
            if step >= c.steps:
                break
    if probe is not None and not stopped:
        run_probe()
    out.steps = step
    out.batch_index = batch_index
    out.seconds = time.perf_counter() - t0
    return out
