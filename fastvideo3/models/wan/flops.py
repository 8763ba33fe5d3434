"""Wan's FLOP formulas: closed-form work counts of one DiT forward (FLOPs and bytes moved per
component, peak activation memory, resident memory). Pure Python, no torch: the scheduler's pricer
reads them through the Wan family object (models/wan/family.py).

DiT FLOP formula (one multiply-add = 2 FLOPs). With hidden size ``D = heads * head_dim``, FFN
width ``F``, text length ``T``, ``n = batch * cfg_branches`` sequences and
``L = (F_lat/pt) * (H_lat/ph) * (W_lat/pw)`` tokens per sequence, one forward costs ``n`` times:

    patch embed      2 * L * (C_in * pt*ph*pw) * D          (the conv3d is a matmul per patch)
    per block, times num_layers:
      self-attn proj   4 * 2 * L * D^2                      (Q, K, V, O)
      self-attn core   2 * 2 * L^2 * D                      (scores and values)
      cross-attn proj  2 * 2 * L * D^2 + 2 * 2 * T * D^2    (Q, O on video; K, V on text)
      cross-attn core  2 * 2 * L * T * D
      ffn              2 * 2 * L * D * F
    embedders        2 * T * (text_dim * D + D^2) + 2 * (freq_dim * D + D^2 + 6 * D^2)
    head             2 * L * D * (C_out * pt*ph*pw)

An image-to-video DiT (Wan2.1 I2V: ``image_dim`` set, ``I`` image tokens of width ``d_img``) adds:

    patch embed      as above, with C_in = 36 (latent, mask, image latent)
    per block:
      image K, V       2 * 2 * I * D^2                      (on the image tokens)
      image core       2 * 2 * L * I * D                    (its own softmax, summed with the text's)
    image embedder   2 * I * (d_img^2 + d_img * D)

Norms, modulation and RoPE are elementwise and left out (well under 1% at video sizes). For
Wan2.1 1.3B at 81 x 480 x 832 (latent 21 x 60 x 104, L = 32,760) this is about 283 TFLOP.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

@dataclass(frozen=True)
class DitConfig:
    """The shape of a Wan-style DiT (what the FLOP formula needs, nothing more)."""

    #: the model family whose formulas price this config (fastvideo3.card.family)
    family = "wan"

    num_layers: int
    num_heads: int
    head_dim: int
    ffn_dim: int
    text_dim: int = 4096
    freq_dim: int = 256
    in_channels: int = 16
    out_channels: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512
    #: image-to-video: the image encoder's width and token count (CLIP ViT-H/14: 1280, 257); None for T2V
    image_dim: int | None = None
    image_len: int = 0

    @property
    def hidden(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def patch_volume(self) -> int:
        pt, ph, pw = self.patch_size
        return pt * ph * pw

    def param_count(self) -> int:
        """Parameter count, biases and norm affines included (Wan2.1 1.3B gives ~1.42e9)."""
        d, f = self.hidden, self.ffn_dim
        attn = 4 * (d * d + d) + 2 * d  # q, k, v, o and the q/k RMSNorm weights
        block = 2 * attn + (d * f + f + f * d + d) + 2 * d + 6 * d  # + cross-norm, modulation
        patch = self.in_channels * self.patch_volume * d + d
        text = self.text_dim * d + d + d * d + d
        time = self.freq_dim * d + d + d * d + d + d * 6 * d + 6 * d
        head = d * self.out_channels * self.patch_volume + self.out_channels * self.patch_volume + 2 * d
        if self.image_dim:  # image K/V and their norm per block; the image embedder
            di = self.image_dim
            block += 2 * (d * d + d) + d
            head += di * di + di + di * d + d + 2 * di + 2 * d
        return self.num_layers * block + patch + text + time + head

    @classmethod
    def wan21_1_3b(cls) -> "DitConfig":
        return cls(num_layers=30, num_heads=12, head_dim=128, ffn_dim=8960)

    @classmethod
    def wan21_14b(cls) -> "DitConfig":
        return cls(num_layers=40, num_heads=40, head_dim=128, ffn_dim=13824)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["patch_size"] = list(self.patch_size)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DitConfig":
        return cls(**{**d, "patch_size": tuple(d.get("patch_size", (1, 2, 2)))})


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
        """Latent shape of a Wan VAE (causal in time: ``1 + (frames - 1) / 4``)."""
        st, sh, sw = stride
        return cls(1 + (frames - 1) // st, height // sh, width // sw, batch, cfg_branches)

    @property
    def sequences(self) -> int:
        return self.batch * self.cfg_branches

    def tokens(self, config: DitConfig) -> int:
        """Tokens per sequence: L = (F/pt) * (H/ph) * (W/pw)."""
        pt, ph, pw = config.patch_size
        return (self.latent_frames // pt) * (self.latent_height // ph) * (self.latent_width // pw)

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


def dit_forward_cost(config: DitConfig, shape: StepShape, *, weight_bytes_per_param: int = 2,
                     act_bytes: int = 2) -> DitForwardCost:
    """FLOPs and bytes moved of one forward (the formula in the module docstring).

    Bytes: each component's weights once per call (the CFG branches and samples are batched in
    one call), plus its input and output activations once per sequence. Attention is modelled
    flash-style: Q, K, V read once, O written once, no L x L matrix in memory.
    """
    d, f, t, nl = config.hidden, config.ffn_dim, config.text_len, config.num_layers
    n, tok = shape.sequences, shape.tokens(config)
    if tok <= 0:
        raise InvalidRequest("latent smaller than one patch", field="shape", limit=str(config.patch_size))
    wb, ab = weight_bytes_per_param, act_bytes
    pv_in, pv_out = config.in_channels * config.patch_volume, config.out_channels * config.patch_volume

    def lin(tokens: int, d_in: int, d_out: int, count: int = 1) -> ComponentCost:
        """``count`` linear layers, tokens x d_in -> tokens x d_out, per sequence."""
        return ComponentCost(
            flops=count * n * 2.0 * tokens * d_in * d_out,
            bytes=count * (d_in * d_out * wb + n * tokens * (d_in + d_out) * ab),
        )

    self_core = ComponentCost(n * 2 * 2.0 * tok * tok * d, n * 4.0 * tok * d * ab)
    cross_core = ComponentCost(n * 2 * 2.0 * tok * t * d, n * (2.0 * tok * d + 2.0 * t * d) * ab)
    components = {
        "patch_embed": lin(tok, pv_in, d),
        "self_attn_proj": lin(tok, d, d, count=4).scaled(nl),
        "self_attn_core": self_core.scaled(nl),
        "cross_attn_proj": lin(tok, d, d, count=2).scaled(nl),
        "cross_attn_kv": lin(t, d, d, count=2).scaled(nl),
        "cross_attn_core": cross_core.scaled(nl),
        "ffn": (lin(tok, d, f) + lin(tok, f, d)).scaled(nl),
        # text MLP; time MLP, whose second linear and 6-way projection are lumped as d -> 7d
        "embedders": lin(t, config.text_dim, d) + lin(t, d, d) + lin(1, config.freq_dim, d) + lin(1, d, 7 * d),
        "head": lin(tok, d, pv_out),
    }
    if config.image_dim:
        il, di = config.image_len, config.image_dim
        components["image_attn_kv"] = lin(il, d, d, count=2).scaled(nl)
        components["image_attn_core"] = ComponentCost(n * 2 * 2.0 * tok * il * d,
                                                      n * (2.0 * tok * d + 2.0 * il * d) * ab).scaled(nl)
        components["image_embedder"] = lin(il, di, di) + lin(il, di, d)
    return DitForwardCost(components, tok, float(config.param_count() * wb))


def dit_peak_activation_bytes(config: DitConfig, shape: StepShape, *, act_bytes: int = 2,
                              residual_bytes: int = 4) -> int:
    """Largest set of live activations in one forward (one block at a time; weights excluded).

    The residual stream stays live throughout (fp32 in Wan). On top of it, the attention phase
    holds the normed input, Q, K, V (plus rotated Q, K) and the output: 7 x L x D; the FFN phase
    holds the normed input and the hidden and activated tensors: L x D + 2 x L x F. Flash
    attention keeps no L x L matrix. The text context (K, V for one block) is added.
    """
    n, tok, d = shape.sequences, shape.tokens(config), config.hidden
    residual = n * tok * d * residual_bytes
    attn_phase = n * tok * d * 7 * act_bytes
    ffn_phase = n * tok * (d + 2 * config.ffn_dim) * act_bytes
    context = n * (config.text_len + config.image_len) * d * 3 * act_bytes
    return int(residual + max(attn_phase, ffn_phase) + context)


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


def dit_resident_memory(config: DitConfig, shape: StepShape, *, sampler_history: int = 2,
                        weight_bytes_per_param: int = 2, latent_bytes: int = 4,
                        embed_bytes: int = 2) -> ResidentMemory:
    """Weights, the fp32 latent, ``sampler_history`` latent-sized sampler buffers (multistep
    samplers keep past model outputs) and the prompt embeddings of every CFG branch."""
    latent = shape.batch * config.out_channels * shape.latent_frames * shape.latent_height \
        * shape.latent_width * latent_bytes
    embeds = shape.sequences * config.text_len * config.text_dim * embed_bytes
    if config.image_dim:  # the image's hidden states and its conditioning latent (mask + image latent)
        embeds += config.image_len * config.image_dim * embed_bytes + latent // config.out_channels * (
            config.in_channels - config.out_channels)
    return ResidentMemory(config.param_count() * weight_bytes_per_param, latent,
                          latent * sampler_history, embeds)
