"""Checkpoints of the tiny recipe: safetensors files in the shipped-weights layout, and an EMA.

A shipped component is one safetensors file holding the module's state dict (tied parameters
stored once, under their first name), optionally stored in fp16 to keep the package small;
:func:`fastvideo3.models.wan.components.load_shipped` reads it back strictly.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def shippable_state(module: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    seen: set[int] = set()
    out = {}
    for k, v in module.state_dict().items():
        if v.data_ptr() in seen:  # a tied parameter: keep the first name only
            continue
        seen.add(v.data_ptr())
        t = v.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[k] = t.contiguous()
    return out


def save_shipped(module: torch.nn.Module, path: str | Path, dtype: torch.dtype | None = None,
                 metadata: dict | None = None) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in (metadata or {}).items()}
    save_file(shippable_state(module, dtype), str(p), metadata=meta)
    return p


class EMA:
    """Exponential moving average of a module's floating-point parameters (a frozen copy)."""

    def __init__(self, module: torch.nn.Module, decay: float = 0.999):
        self.decay = decay
        self.shadow = copy.deepcopy(module).eval().requires_grad_(False)
        self.updates = 0

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))  # warm start
        for s, p in zip(self.shadow.parameters(), module.parameters()):
            s.lerp_(p.detach(), 1.0 - d)
