"""What every family's FLOP formulas share: the step shape, per-component costs, resident memory
and the linear-layer cost. Pure Python, no torch (the scheduler's pricer imports the formulas).

Family-neutral: each family's ``flops`` module holds its own DiT config and formulas and builds
them from these.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from fastvideo3.errors import InvalidRequest


class DitShape:
    """The members every family's DiT config (a frozen dataclass with ``num_heads``, ``head_dim``
    and ``patch_size``) derives the same way."""

    @property
    def hidden(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def patch_volume(self) -> int:
        pt, ph, pw = self.patch_size
        return pt * ph * pw

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["patch_size"] = list(self.patch_size)
        return d


@dataclass(frozen=True)
class StepShape:
    """One denoise step: ``batch`` samples, each run ``cfg_branches`` times, on one latent size."""

    latent_frames: int
    latent_height: int
    latent_width: int
    batch: int = 1
    cfg_branches: int = 1

    @classmethod
    def from_video(cls, frames: int, height: int, width: int, *, batch: int = 1, cfg_branches: int = 1,
                   stride: tuple[int, int, int] = (4, 8, 8)) -> "StepShape":
        """Latent shape of a VAE causal in time: ``1 + (frames - 1) / stride_t`` (Wan's stride by default)."""
        st, sh, sw = stride
        return cls(1 + (frames - 1) // st, height // sh, width // sw, batch, cfg_branches)

    @property
    def sequences(self) -> int:
        return self.batch * self.cfg_branches

    def tokens(self, config) -> int:
        """Tokens per sequence: L = (F/pt) * (H/ph) * (W/pw)."""
        pt, ph, pw = config.patch_size
        return (self.latent_frames // pt) * (self.latent_height // ph) * (self.latent_width // pw)

    def require_tokens(self, config) -> int:
        """:meth:`tokens`, refusing a latent smaller than one patch (no token to price)."""
        tok = self.tokens(config)
        if tok <= 0:
            raise InvalidRequest("latent smaller than one patch", field="shape", limit=str(config.patch_size))
        return tok

    def latent_bytes(self, channels: int, bytes_per_value: int) -> int:
        """Bytes of the step's latent at ``channels`` channels."""
        return self.batch * channels * self.latent_frames * self.latent_height * self.latent_width * bytes_per_value

    def key(self) -> str:
        return f"f{self.latent_frames}h{self.latent_height}w{self.latent_width}b{self.batch}c{self.cfg_branches}"


@dataclass(frozen=True)
class ComponentCost:
    flops: float
    bytes: float  # weights read once per forward plus activations read and written

    def __add__(self, other: "ComponentCost") -> "ComponentCost":
        return ComponentCost(self.flops + other.flops, self.bytes + other.bytes)

    def scaled(self, k: float) -> "ComponentCost":
        return ComponentCost(self.flops * k, self.bytes * k)


def linear_cost(n: int, weight_bytes: int, act_bytes: int) -> Callable[..., ComponentCost]:
    """``lin(tokens, d_in, d_out, count=1)``: the cost of ``count`` linear layers, tokens x d_in ->
    tokens x d_out per sequence, over ``n`` sequences in one call (weights read once, activations
    once per sequence)."""

    def lin(tokens: int, d_in: int, d_out: int, count: int = 1) -> ComponentCost:
        return ComponentCost(
            flops=count * n * 2.0 * tokens * d_in * d_out,
            bytes=count * (d_in * d_out * weight_bytes + n * tokens * (d_in + d_out) * act_bytes),
        )

    return lin


@dataclass(frozen=True)
class DitForwardCost:
    """Work of one DiT call over all ``batch * cfg_branches`` sequences, per component."""

    components: dict[str, ComponentCost]
    tokens: int
    weight_bytes: float

    @property
    def flops(self) -> float:
        return sum(c.flops for c in self.components.values())

    @property
    def bytes(self) -> float:
        return sum(c.bytes for c in self.components.values())


@dataclass(frozen=True)
class ResidentMemory:
    """Bytes that stay on the device across steps. ``per_request`` is what admission reserves;
    the weights are charged once to the pool (its memory budget is net of them)."""

    weights: int
    latent: int
    sampler_history: int
    text_embeds: int

    @property
    def per_request(self) -> int:
        return self.latent + self.sampler_history + self.text_embeds

    @property
    def total(self) -> int:
        return self.weights + self.per_request
