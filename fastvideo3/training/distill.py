"""Stage 3 of the tiny recipe: a 4-step student distilled from the teacher's rollouts (reflow).

The teacher's samples come from :class:`~fastvideo3.training.rollout.Rollout`, i.e. from the
serving loop itself (multi-step UniPC with classifier-free guidance, batched across requests),
with capture ``"endpoints"``: each record holds the noise the request started from and the
final latent it reached. The student (initialised from the teacher, conditional branch only)
learns flow matching on these *coupled* pairs at the sigmas of its own 4-step Euler schedule:

    x_k = (1 - sigma_k) * x0_teacher + sigma_k * noise        target = noise - x0_teacher

If the student fits, its Euler steps stay on the straight line from ``noise`` to
``x0_teacher``, so 4 steps (one conditional forward each) land on the teacher's 2 x N-forward
sample: guidance and the step count are both distilled into the weights. The text encoder
stays frozen (the 4-step card shares the teacher's).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from fastvideo3.training.checkpoint import EMA
from fastvideo3.training.flow import SigmaSampler, noised
from fastvideo3.vocab import Sampler


@dataclass
class DistillConfig:
    steps: int = 2000
    batch_size: int = 64
    lr: float = 2e-4
    warmup: int = 50
    student_steps: int = 4
    student_sampler: str = Sampler.EULER
    flow_shift: float = 3.0
    dense_fraction: float = 0.25  # share of samples at any sigma of the dense grid (regularises)
    ema_decay: float = 0.995
    seed: int = 3
    time_budget_s: float | None = None
    log_every: int = 50


@dataclass
class DistillLog:
    steps: int = 0
    seconds: float = 0.0
    pairs: int = 0
    losses: list[tuple[int, float, float]] = field(default_factory=list)


class PairSet:
    """Teacher pairs on one device: noise, final latent and the prompt embedding of each."""

    def __init__(self, records, text_encoder, device: str = "cpu"):
        recs = [r for r in records if r.noise is not None and r.final_latent is not None]
        if not recs:
            raise ValueError("no rollout record carries noise and a final latent (capture='endpoints')")
        self.noise = torch.cat([r.noise for r in recs]).to(device)
        self.x0 = torch.cat([r.final_latent for r in recs]).to(device, torch.float32)
        self.prompts = [r.prompt for r in recs]
        with torch.no_grad():
            self.text = torch.cat([text_encoder.encode(self.prompts[i : i + 128])
                                   for i in range(0, len(recs), 128)]).to(device)

    def __len__(self) -> int:
        return len(self.prompts)


def distill_student(student, pairs: PairSet, cfg: DistillConfig, device: str = "cpu", log=print):
    """Reflow the student on teacher pairs. Returns (EMA student, log)."""
    student.train().requires_grad_(True)
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))
    own = SigmaSampler(cfg.flow_shift, (cfg.student_sampler, cfg.student_steps), device=device)
    dense = SigmaSampler(cfg.flow_shift, device=device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    ema = EMA(student, cfg.ema_decay)
    out = DistillLog(pairs=len(pairs))
    t0 = time.perf_counter()
    window: list[float] = []
    for step in range(cfg.steps):
        if cfg.time_budget_s is not None and time.perf_counter() - t0 > cfg.time_budget_s:
            break
        for g in opt.param_groups:
            g["lr"] = cfg.lr * min(1.0, (step + 1) / cfg.warmup)
        idx = torch.randint(len(pairs), (cfg.batch_size,), generator=gen, device=device)
        n_dense = int(round(cfg.batch_size * cfg.dense_fraction))
        s1, t1 = own(cfg.batch_size - n_dense, gen)
        s2, t2 = dense(n_dense, gen)
        sigma, t = torch.cat([s1, s2]), torch.cat([t1, t2])
        x0, eps = pairs.x0[idx], pairs.noise[idx]
        pred = student(noised(x0, eps, sigma), t, pairs.text[idx])
        loss = (pred.float() - (eps - x0)).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        ema.update(student)
        window.append(float(loss.detach()))
        if step % cfg.log_every == 0:
            out.losses.append((step, sum(window) / len(window), round(time.perf_counter() - t0, 2)))
            log(f"distill step {step} loss {out.losses[-1][1]:.4f} ({out.losses[-1][2]:.0f}s)")
            window = []
        out.steps = step + 1
    out.seconds = time.perf_counter() - t0
    student.eval().requires_grad_(False)
    return ema.shadow, out
