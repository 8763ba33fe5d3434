"""CFG as a policy over one shared denoise body.

The policy fixes the branch vocabulary and the combine formula; whether branches run as two
forwards (``classic``) or one batched forward (``batched``) is a dispatch detail the executor
reads from :func:`branches`. ``none`` is the single-branch identity policy.
"""
from __future__ import annotations

import torch

POLICIES = ("none", "classic", "batched")


def branches(policy: str) -> tuple[str, ...]:
    return ("cond",) if policy == "none" else ("cond", "uncond")


def combine(policy: str, preds: dict[str, torch.Tensor], guidance: float) -> torch.Tensor:
    if policy == "none":
        return preds["cond"]
    cond, uncond = preds["cond"], preds["uncond"]
    return uncond + guidance * (cond - uncond)


#: the embeds each CFG branch conditions on
BRANCH_EMBEDS = {"cond": "prompt_embeds", "uncond": "negative_embeds"}


def branch_rows(chunk, branch_set) -> tuple[list, list[float], list, list[tuple[int, str]]]:
    """The rows of one DiT forward over ``chunk`` (``(unit, region)`` pairs, a region holding the
    request's latent and embeds) for the CFG branches in ``branch_set``: latents, timesteps, text
    embeds, and ``(chunk index, branch)`` per row."""
    lat, ts, txt, index = [], [], [], []
    for i, (unit, reg) in enumerate(chunk):
        for b in branch_set:
            lat.append(reg.latent)
            ts.append(float(unit.params["timestep"]))
            txt.append(reg.embeds[BRANCH_EMBEDS[b]])
            index.append((i, b))
    return lat, ts, txt, index
