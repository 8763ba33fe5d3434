"""DiT building blocks whose math is the same in more than one model family.

Family-neutral: the families import these; nothing here knows a family. A piece belongs here only
when every family that uses it computes exactly this (the families' parity tests hold them to
their references). Parameter names match the diffusers checkpoints the families load.
"""
from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, Callable, ClassVar, Self

import torch
import torch.nn.functional as F
from torch import nn

#: the forward's optional observer, ``tap(name, tensor)`` (the parity tooling records named taps)
Tap = Callable[[str, torch.Tensor], None] | None


def tapped(tap: Tap, name: str, x: torch.Tensor) -> torch.Tensor:
    """``x``, shown to ``tap`` as ``name`` first when there is a tap."""
    if tap:
        tap(name, x)
    return x


class DitConfigBase:
    """What every family's DiT config (a frozen dataclass with ``num_attention_heads`` and
    ``attention_head_dim``) reads and derives the same way."""

    #: the fields a JSON config gives as lists
    tuple_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        """The config of a checkpoint's config dict: the dataclass's own fields only (a checkpoint
        config carries more), ``tuple_fields`` made tuples."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        for name in cls.tuple_fields:
            if name in kw:
                kw[name] = tuple(kw[name])
        return cls(**kw)

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim


def timestep_embedding(t: torch.Tensor, dim: int = 256) -> torch.Tensor:
    """Sinusoidal embedding, cos first (flip_sin_to_cos), no frequency shift."""
    half = dim // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half
    emb = t[:, None].float() * torch.exp(exponent)[None, :]
    return torch.cat([torch.cos(emb), torch.sin(emb)], dim=-1)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class Linear2(nn.Module):
    """linear_1 -> act -> linear_2 (names match the checkpoint)."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, act: nn.Module):
        super().__init__()
        self.linear_1 = nn.Linear(d_in, d_hidden)
        self.act = act
        self.linear_2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class FeedForward(nn.Module):
    """proj -> ``act`` -> out, ``dim -> hidden -> out`` (``out`` defaults to ``dim``)."""

    def __init__(self, dim: int, hidden: int, act: Callable[[torch.Tensor], torch.Tensor], out: int | None = None):
        super().__init__()
        # net.0.proj / net.2 mirror the checkpoint layout (net.1 is a parameter-free dropout)
        self.net = nn.ModuleList([nn.Module(), nn.Identity(), nn.Linear(hidden, out or dim)])
        self.net[0].proj = nn.Linear(dim, hidden)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](self.act(self.net[0].proj(x)))
