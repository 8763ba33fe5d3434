"""The C0 DiT parity tests' pair: our DiT loaded from a synthetic diffusers folder's card and
diffusers' WanTransformer3DModel from the same folder, both fp32 on the CPU."""
from __future__ import annotations

import torch

from fastvideo3.card import resolve_card
from fastvideo3.models.wan.components import load_dit


def dit_and_reference(model_dir):
    """(card, our DiT, its weights digest, diffusers' transformer in eval mode) for ``model_dir``."""
    from diffusers import WanTransformer3DModel
    card = resolve_card(str(model_dir))
    ours, digest = load_dit(card, "cpu", torch.float32)
    ref = WanTransformer3DModel.from_pretrained(str(model_dir / "transformer")).eval()
    return card, ours, digest, ref
