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
