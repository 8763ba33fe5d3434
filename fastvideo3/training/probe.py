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
from fastvideo3.vocab import Sampler


def _autocast(device: str, dtype: torch.dtype | None):
    if dtype is None or not str(device).startswith("cuda"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=dtype)


@torch.no_grad()
def sample(dit, text_encoder, prompts: list[str], seeds: list[int], latent_shape: tuple[int, int, int, int],
           steps: int = 12, guidance: float = 3.0, flow_shift: float = 3.0, device: str = "cpu",
           autocast: torch.dtype | None = None, batch: int = 64) -> torch.Tensor:
    """Normalised latents ``[B, C, F, H, W]``: Euler on the serving schedule, CFG against ``""``."""
    sched = make_schedule(Sampler.EULER, steps, flow_shift)
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


@torch.no_grad()
def caption_probe(dit, text_encoder, codec, data, clips: int = 32, sigmas=(0.6, 0.85, 0.95), device: str = "cpu",
                  autocast: torch.dtype | None = None, start: int = 50_000) -> dict:
    """Does the DiT read the direction word? A diffusion-classifier test on held-out clips.

    Each clip is noised (fixed noise, each sigma) and the DiT's flow-matching error is measured
    under its own caption and under the three captions that differ only in the direction word
    (and, separately, the four other colors). ``direction_acc`` is the share of (clip, sigma)
    cases where the true direction gives the smallest error (chance 0.25); ``direction_gap``
    the mean relative error increase of a wrong direction. Much cheaper and more sensitive than
    sampling: it moves long before sampled clips follow the prompt."""
    from fastvideo3.models.reward.adherence import COLORS, MOTIONS
    from fastvideo3.training.flow import noised
    was_training = dit.training
    dit.eval()
    scenes = [data.scene(start + i) for i in range(clips)]
    video = data.render(scenes, device)
    x0 = torch.cat([codec.encode(video[i : i + 8]) for i in range(0, clips, 8)]).float()
    gen = torch.Generator().manual_seed(1234)
    eps = torch.randn(x0.shape, generator=gen).to(device)
    out: dict = {}
    for field_name, values in (("direction", list(MOTIONS)), ("color", list(COLORS))):
        correct, gaps, n = 0, [], 0
        by_sigma = {}
        for s in sigmas:
            sig = torch.full((clips,), float(s), device=device)
            xt = noised(x0, eps, sig)
            target = eps - x0
            errs = []
            for v in values:
                caps = []
                for sc in scenes:
                    f = sc.fields
                    f = type(f)(v, f.shape, f.motion, f.background) if field_name == "color" else \
                        type(f)(f.color, f.shape, v, f.background)
                    caps.append(f.caption())
                with _autocast(device, autocast):
                    text = text_encoder.encode(caps)
                    pred = torch.cat([dit(xt[i : i + 16], sig[i : i + 16] * 1000, text[i : i + 16])
                                      for i in range(0, clips, 16)]).float()
                errs.append((pred - target).square().flatten(1).mean(1))
            e = torch.stack(errs, 1)  # [clips, values]
            truth = torch.tensor([values.index(getattr(sc, "motion" if field_name == "direction" else "color"))
                                  for sc in scenes], device=e.device)
            ok = (e.argmin(1) == truth).float()
            true_e = e.gather(1, truth[:, None])
            wrong = (e.sum(1, keepdim=True) - true_e) / (len(values) - 1)
            gap = ((wrong - true_e) / true_e.clamp(min=1e-8)).squeeze(1)
            correct += float(ok.sum())
            n += clips
            gaps.append(float(gap.mean()))
            by_sigma[str(s)] = round(float(ok.mean()), 3)
        out[f"{field_name}_acc"] = round(correct / n, 3)
        out[f"{field_name}_gap"] = round(sum(gaps) / len(gaps), 4)
        out[f"{field_name}_acc_by_sigma"] = by_sigma
    dit.train(was_training)
    return out
