"""HunyuanVideo-1.5's FLOP formula: closed-form work of one DiT forward, its peak activations and
resident memory. Pure Python, no torch: the pricer reads them through the family object.

One multiply-add = 2 FLOPs. Hidden ``D = heads * head_dim``, FFN width ``F = mlp_ratio * D``,
``L = (F_lat/pt) * (H_lat/p) * (W_lat/p)`` video tokens, ``T1`` Qwen and ``T2`` ByT5 text tokens
(priced at the packed lengths, 1000 and 256: an upper bound, since padding is never computed),
``T = T1 + T2``, ``n = batch * cfg_branches`` sequences. One forward costs ``n`` times:

    patch embed      2 * L * (C_in * pt*p*p) * D
    per dual-stream block, times num_layers:
      projections      2 * (L + T) * 4 * D^2            (Q, K, V, O of both streams)
      joint attention  2 * 2 * (L + T)^2 * D            (scores and values over video + text)
      ffn              2 * 2 * (L + T) * D * F           (both streams)
      modulation       2 * 2 * 6 * D^2                   (the two AdaLN-Zero projections)
    token refiner    num_refiner_layers * (2 * T1 * (4 * D^2 + 8 * D^2) + 2 * 2 * T1^2 * D + 2 * 2 * D^2)
                     + 2 * T1 * text_dim * D + 2 * (256 * D + text_dim * D + 2 * D^2)
    ByT5 projection  2 * T2 * (text_dim_2 * 2048 + 2048^2 + 2048 * D)
    time embedding   2 * (256 * D + D^2)
    head             2 * L * D * (C_out * pt*p*p) + 2 * 2 * D^2

Norms, RoPE and residual adds are elementwise and left out. For the 480p card at 121 x 480 x 848
(latent 31 x 30 x 53, L = 49,290) one conditional forward is about 1.4 PFLOP, four fifths of
it the joint attention.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any, Mapping

from fastvideo3.models.flops import ComponentCost, DitForwardCost, DitShape, ResidentMemory, StepShape, linear_cost

BYT5_HIDDEN = 2048
#: DitConfig's fields under their diffusers config names (the others are spelt alike)
_DIFFUSERS_KEYS = {"num_heads": "num_attention_heads", "head_dim": "attention_head_dim",
                   "text_dim": "text_embed_dim", "text_dim_2": "text_embed_2_dim", "image_dim": "image_embed_dim"}
_REQUIRED = ("num_layers", "num_heads", "head_dim")


@dataclass(frozen=True)
class DitConfig(DitShape):
    """The shape of a HunyuanVideo-1.5 DiT (what the FLOP formula needs)."""

    #: the model family whose formulas price this config (fastvideo3.card.family)
    family = "hunyuan15"

    num_layers: int = 54
    num_heads: int = 16
    head_dim: int = 128
    mlp_ratio: float = 4.0
    num_refiner_layers: int = 2
    text_dim: int = 3584
    text_dim_2: int = 1472
    image_dim: int = 1152
    in_channels: int = 65
    out_channels: int = 32
    patch_size: tuple[int, int, int] = (1, 1, 1)
    text_len: int = 1000
    text_len_2: int = 256

    @property
    def ffn_dim(self) -> int:
        return int(self.hidden * self.mlp_ratio)

    @classmethod
    def from_transformer_config(cls, c: Mapping[str, Any]) -> "DitConfig":
        """The shape of a checkpoint's transformer config (diffusers' names); a key it lacks
        keeps this class's default, except the three that size every block."""
        kw: dict[str, Any] = {}
        for f in fields(cls):
            key = _DIFFUSERS_KEYS.get(f.name, f.name)
            if f.name == "patch_size":
                default = f.default
                pt, p = int(c.get("patch_size_t", default[0])), int(c.get("patch_size", default[1]))
                kw[f.name] = (pt, p, p)
            elif key in c:
                kw[f.name] = type(f.default)(c[key]) if f.default is not MISSING else int(c[key])
            elif f.name in _REQUIRED:
                raise KeyError(f"the transformer config has no {key!r}")
        return cls(**kw)

    def param_count(self) -> int:
        """Every parameter of the checkpoint (the image projection included): 8.33e9 at 480p/720p."""
        d, f, hd = self.hidden, self.ffn_dim, self.head_dim
        lin = lambda i, o: i * o + o  # noqa: E731
        block = (2 * lin(d, 6 * d) + 8 * lin(d, d) + 4 * hd + 2 * (lin(d, f) + lin(f, d)))
        refiner_block = 4 * d + 4 * lin(d, d) + lin(d, 4 * d) + lin(4 * d, d) + lin(d, 2 * d)
        refiner = (lin(256, d) + lin(d, d) + lin(self.text_dim, d) + lin(d, d) + lin(self.text_dim, d)
                   + self.num_refiner_layers * refiner_block)
        byt5 = 2 * self.text_dim_2 + lin(self.text_dim_2, BYT5_HIDDEN) + lin(BYT5_HIDDEN, BYT5_HIDDEN) \
            + lin(BYT5_HIDDEN, d)
        image = 2 * self.image_dim + lin(self.image_dim, self.image_dim) + lin(self.image_dim, d) + 2 * d
        patch = self.in_channels * self.patch_volume * d + d
        head = lin(d, 2 * d) + lin(d, self.out_channels * self.patch_volume)
        return (self.num_layers * block + refiner + byt5 + image + patch + lin(256, d) + lin(d, d) + 3 * d + head)


def dit_forward_cost(config: DitConfig, shape: StepShape, *, weight_bytes_per_param: int = 2,
                     act_bytes: int = 2) -> DitForwardCost:
    """FLOPs and bytes of one forward (the formula in the module docstring). Bytes: each
    component's weights once per call plus its activations once per sequence; attention is
    flash-style (Q, K, V read once, O written once)."""
    d, f, nl = config.hidden, config.ffn_dim, config.num_layers
    t1, t2 = config.text_len, config.text_len_2
    n, tok = shape.sequences, shape.require_tokens(config)
    wb, ab = weight_bytes_per_param, act_bytes
    joint = tok + t1 + t2
    lin = linear_cost(n, wb, ab)

    def core(tokens: int) -> ComponentCost:
        return ComponentCost(n * 2 * 2.0 * tokens * tokens * d, n * 4.0 * tokens * d * ab)

    refiner = (lin(t1, d, d, count=4) + lin(t1, d, 4 * d) + lin(t1, 4 * d, d) + core(t1)
               + lin(1, d, 2 * d)).scaled(config.num_refiner_layers)
    components = {
        "patch_embed": lin(tok, config.in_channels * config.patch_volume, d),
        "attn_proj": lin(joint, d, d, count=4).scaled(nl),
        "attn_core": core(joint).scaled(nl),
        "ffn": (lin(joint, d, f) + lin(joint, f, d)).scaled(nl),
        "modulation": lin(1, d, 6 * d, count=2).scaled(nl),
        "token_refiner": refiner + lin(t1, config.text_dim, d) + lin(1, 256, d) + lin(1, d, d)
        + lin(1, config.text_dim, d) + lin(1, d, d),
        "byt5_projection": lin(t2, config.text_dim_2, BYT5_HIDDEN) + lin(t2, BYT5_HIDDEN, BYT5_HIDDEN)
        + lin(t2, BYT5_HIDDEN, d),
        "time_embed": lin(1, 256, d) + lin(1, d, d),
        "head": lin(tok, d, config.out_channels * config.patch_volume) + lin(1, d, 2 * d),
    }
    return DitForwardCost(components, tok, float(config.param_count() * wb))


def dit_peak_activation_bytes(config: DitConfig, shape: StepShape, *, act_bytes: int = 2) -> int:
    """Largest set of live activations of one block: both streams' residuals, and either the
    attention phase (normed input, Q, K, V, output: 5 x (L + T) x D) or the FFN phase (normed
    input, hidden and activated: (L + T) x (D + 2F))."""
    n, d = shape.sequences, config.hidden
    joint = shape.tokens(config) + config.text_len + config.text_len_2
    residual = n * joint * d * act_bytes
    return int(residual + n * joint * max(5 * d, d + 2 * config.ffn_dim) * act_bytes)


def dit_resident_memory(config: DitConfig, shape: StepShape, *, sampler_history: int = 0,
                        weight_bytes_per_param: int = 2, latent_bytes: int = 4,
                        embed_bytes: int = 2) -> ResidentMemory:
    """Weights, the fp32 latent, the sampler's latent-sized buffers and the packed text
    conditioning of every CFG branch."""
    latent = shape.latent_bytes(config.out_channels, latent_bytes)
    width = max(config.text_dim, config.text_dim_2) + 1
    embeds = shape.sequences * (config.text_len + config.text_len_2) * width * embed_bytes
    return ResidentMemory(config.param_count() * weight_bytes_per_param, latent, latent * sampler_history, embeds)
