"""A Wan DiT of the tiny cards' config with seeded weights, for the DiT and FP8 tests."""
from __future__ import annotations

import torch


def tiny_card_dit_bf16(seed: int = 0):
    """The tiny cards' DiT config (patch (1, 4, 4), 9 heads of 32) with seeded weights, all bf16."""
    from fastvideo3.models.wan.cards import TINY_DIT
    from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig
    torch.manual_seed(seed)
    model = WanDiT(WanDiTConfig.from_dict(TINY_DIT))
    for name, p in model.named_parameters():
        if p.ndim >= 2 and "scale_shift_table" not in name:
            torch.nn.init.normal_(p, std=0.05)
    return model.to(torch.bfloat16).eval().requires_grad_(False)
