"""A fast direction probe for training: sample, decode and score without the serving engine.

The serving rollout (:class:`~fastvideo3.training.rollout.Rollout`) is the measurement that
counts (``bench/quality.py``); this probe is the cheap one a training loop can afford every
minute. It samples with plain Euler steps on the serving schedule (``make_schedule("euler")``),
classifier-free guidance against the empty prompt, decodes with the VAE and reads color,
direction and travel back with :class:`~fastvideo3.models.reward.adherence.AdherenceScorer`.

    res = direction_probe(dit, text, codec, eval_prompts(), seeds=[0, 1], frames=33, size=128)
    res["direction"], res["adherence"], res["median_travel"]
"""
from __future__ import annotations

import contextlib
import statistics

import torch

from fastvideo3.loop.samplers import make_schedule
from fastvideo3.models.reward.adherence import AdherenceScorer
from fastvideo3.training.data import to_frames


def _autocast(device: str, dtype: torch.dtype | None):
    if dtype is None or not str(device).startswith("cuda"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=dtype)


@torch.no_grad()
def sample(dit, text_encoder, prompts: list[str], seeds: list[int], latent_shape: tuple[int, int, int, int],
           steps: int = 12, guidance: float = 3.0, flow_shift: float = 3.0, device: str = "cpu",
           autocast: torch.dtype | None = None, batch: int = 64) -> torch.Tensor:
    """Normalised latents ``[B, C, F, H, W]``: Euler on the serving schedule, CFG against ``""``."""
    sched = make_schedule("euler", steps, flow_shift)
    was_training = dit.training
    dit.eval()
    outs = []
    for i in range(0, len(prompts), batch):
        ps, ss = prompts[i : i + batch], seeds[i : i + batch]
        x = torch.stack([torch.randn(latent_shape, generator=torch.Generator().manual_seed(int(s))) for s in ss])
        x = x.to(device)
        with _autocast(device, autocast):
            cond = text_encoder.encode(ps)
            uncond = text_encoder.encode([""] * len(ps)) if guidance != 1.0 else None
        for k, t in enumerate(sched.timesteps):
            ts = torch.full((len(ps),), float(t), device=device)
            with _autocast(device, autocast):
                if uncond is None:
                    v = dit(x, ts, cond).float()
                else:
                    vc, vu = dit(torch.cat([x, x]), torch.cat([ts, ts]), torch.cat([cond, uncond])).float().chunk(2)
                    v = vu + guidance * (vc - vu)
            x = x + (sched.sigmas[k + 1] - sched.sigmas[k]) * v
        outs.append(x.float())
    dit.train(was_training)
    return torch.cat(outs)


@torch.no_grad()
def decode(codec, z: torch.Tensor, batch: int = 16) -> torch.Tensor:
    """Normalised latents -> videos ``[B, 3, F, H, W]`` in [-1, 1] (the serving decoder's inverse)."""
    out = []
    for i in range(0, z.shape[0], batch):
        out.append(codec.vae.decode(z[i : i + batch] * codec.std + codec.mean).sample.float().clamp(-1, 1))
    return torch.cat(out)


def score_videos(videos: torch.Tensor, prompts: list[str]) -> dict:
    scorer = AdherenceScorer()
    rows = [scorer.score(to_frames(v).cpu(), p) for v, p in zip(videos, prompts)]
    n = len(rows)
    travel = [float(r.get("travel", 0.0)) for r in rows]
    got = [r.get("direction", "none") for r in rows]
    return {
        "clips": n,
        "adherence": sum(r["adherent"] for r in rows) / n,
        "color": sum(r["color_ok"] for r in rows) / n,
        "direction": sum(r["direction_ok"] for r in rows) / n,
        "median_travel": round(statistics.median(travel), 4),
        "directions_seen": {d: got.count(d) for d in sorted(set(got))},
    }


def direction_probe(dit, text_encoder, codec, prompts: list[str], seeds: list[int], frames: int, size: int,
                    steps: int = 12, guidance: float = 3.0, flow_shift: float = 3.0, device: str = "cpu",
                    autocast: torch.dtype | None = None) -> dict:
    """Every prompt x every seed: sample, decode, score. ``direction`` is the share of clips whose
    detected motion direction is the prompted one (chance 0.25)."""
    ps = [p for p in prompts for _ in seeds]
    ss = [s for _ in prompts for s in seeds]
    shape = (codec.mean.shape[1], (frames - 1) // 4 + 1, size // 8, size // 8)
    z = sample(dit, text_encoder, ps, ss, shape, steps, guidance, flow_shift, device, autocast)
    res = score_videos(decode(codec, z), ps)
    res.update(steps=steps, guidance=guidance)
    return res
