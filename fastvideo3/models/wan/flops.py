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

from dataclasses import dataclass
from typing import Any

from fastvideo3.models.flops import ComponentCost, DitForwardCost, DitShape, ResidentMemory, StepShape, linear_cost


@dataclass(frozen=True)
class DitConfig(DitShape):
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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DitConfig":
        return cls(**{**d, "patch_size": tuple(d.get("patch_size", (1, 2, 2)))})


def dit_forward_cost(config: DitConfig, shape: StepShape, *, weight_bytes_per_param: int = 2,
                     act_bytes: int = 2) -> DitForwardCost:
    """FLOPs and bytes moved of one forward (the formula in the module docstring).

    Bytes: each component's weights once per call (the CFG branches and samples are batched in
    one call), plus its input and output activations once per sequence. Attention is modelled
    flash-style: Q, K, V read once, O written once, no L x L matrix in memory.
    """
    d, f, t, nl = config.hidden, config.ffn_dim, config.text_len, config.num_layers
    n, tok = shape.sequences, shape.require_tokens(config)
    wb, ab = weight_bytes_per_param, act_bytes
    pv_in, pv_out = config.in_channels * config.patch_volume, config.out_channels * config.patch_volume
    lin = linear_cost(n, wb, ab)
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


def dit_resident_memory(config: DitConfig, shape: StepShape, *, sampler_history: int = 2,
                        weight_bytes_per_param: int = 2, latent_bytes: int = 4,
                        embed_bytes: int = 2) -> ResidentMemory:
    """Weights, the fp32 latent, ``sampler_history`` latent-sized sampler buffers (multistep
    samplers keep past model outputs) and the prompt embeddings of every CFG branch."""
    latent = shape.latent_bytes(config.out_channels, latent_bytes)
    embeds = shape.sequences * config.text_len * config.text_dim * embed_bytes
    if config.image_dim:  # the image's hidden states and its conditioning latent (mask + image latent)
        embeds += config.image_len * config.image_dim * embed_bytes + latent // config.out_channels * (
            config.in_channels - config.out_channels)
    return ResidentMemory(config.param_count() * weight_bytes_per_param, latent,
                          latent * sampler_history, embeds)
