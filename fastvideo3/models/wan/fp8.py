"""The Wan DiT under the ``fp8_e4m3`` precision: its blocks' linear layers in e4m3.

Which layers: every Linear inside a block (self-attention Q, K, V and output, cross-attention
Q, K, V and output, the FFN's two). They hold ~all of the forward's GEMM FLOPs. The patch
embedding, condition embedder and output head stay in the activation dtype (bf16), as do the
norms, the modulation and RoPE (fp32 inside, as in the reference).

A quantized layer is an :class:`Fp8Linear`: ``weight`` e4m3 [N, K], ``weight_scale`` fp32 [N]
(one per output channel), ``bias`` bf16 [N]. Its state-dict names are those of a pre-quantized
checkpoint (``<layer>.weight`` in e4m3 next to ``<layer>.weight_scale``), which the
``wan_dit_diffusers_fp8_v1`` key map lists. A bf16 checkpoint is quantized at load by
:func:`quantize_dit_`.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from fastvideo3.kernels.fp8 import ATTENTION_SCALES, E4M3, fp8_linear, quantize_rows, quantize_weight

#: the block-relative names of the quantized Linear layers
FP8_LINEARS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
               "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
               "ffn.net.0.proj", "ffn.net.2")
#: what the precision means, recorded with the weights digest (identity and provenance)
FP8_SCHEME = ("fp8_e4m3(weights=per-channel,activations=per-{act},layers=blocks.linear,attention={attn},"
              "accumulation={acc})")
#: per-token activations on the fast path may take scales bounded before they are computed
#: (fast_fp8.py), named in the scheme as ``token/bounded-<what>``: the FFN's hidden layer by default
#: (BOUNDED_ENV=0 turns it off: a per-token amax pass instead), the attention outputs where
#: BOUNDED_ATTENTION_OUT_ENV=1 (off by default: it timed no faster on an H100 or an H200)
BOUNDED_ENV = "FASTVIDEO3_FP8_BOUNDED"
BOUNDED_ATTENTION_OUT_ENV = "FASTVIDEO3_FP8_BOUNDED_ATTENTION_OUT"


def bounded_scales_enabled() -> bool:
    """Whether the fast path fuses the FFN-in GEMM with bounded scales (unless ``FASTVIDEO3_FP8_BOUNDED=0``)."""
    return os.environ.get(BOUNDED_ENV, "1") != "0"


def bounded_attention_out_enabled() -> bool:
    """Whether the fast path casts attention outputs with the bound max |V|
    (``FASTVIDEO3_FP8_BOUNDED_ATTENTION_OUT=1``)."""
    return os.environ.get(BOUNDED_ATTENTION_OUT_ENV) == "1"


class Fp8Linear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` held in e4m3 per output channel and ``x`` quantized on the
    fly per token (``activation_scaling="token"``) or per tensor (``"tensor"``)."""

    def __init__(self, in_features: int, out_features: int, *, activation_scaling: str = "token",
                 device=None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        if activation_scaling not in ("token", "tensor"):
            raise ValueError(f"activation_scaling must be 'token' or 'tensor', got {activation_scaling!r}")
        self.in_features, self.out_features = in_features, out_features
        self.activation_scaling = activation_scaling
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=E4M3, device=device))
        self.register_buffer("weight_scale", torch.empty(out_features, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False)

    @classmethod
    def from_linear(cls, lin: nn.Linear, activation_scaling: str = "token") -> "Fp8Linear":
        out = cls(lin.in_features, lin.out_features, activation_scaling=activation_scaling, device="meta",
                  dtype=lin.bias.dtype)
        w, s = quantize_weight(lin.weight)
        out.weight, out.weight_scale = w, s
        out.bias = nn.Parameter(lin.bias.detach(), requires_grad=False)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, xs = quantize_rows(x, per_tensor=self.activation_scaling == "tensor",
                               impl="triton" if x.is_cuda else "torch")
        return fp8_linear(xq, xs, self.weight, self.weight_scale, self.bias, out_dtype=self.bias.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, e4m3 per-channel, act={self.activation_scaling}"


def _parent(root: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    *path, leaf = dotted.split(".")
    mod = root
    for p in path:
        mod = mod[int(p)] if p.isdigit() else getattr(mod, p)
    return mod, leaf


def _set(parent: nn.Module, leaf: str, module: nn.Module) -> None:
    if leaf.isdigit():
        parent[int(leaf)] = module
    else:
        setattr(parent, leaf, module)


@torch.no_grad()
def quantize_dit_(model: nn.Module, activation_scaling: str = "token", attention: str = "fp8",
                  accumulation: str = "fp32", attention_scales: str = "bound") -> nn.Module:
    """Replace every block Linear of a loaded WanDiT by its :class:`Fp8Linear`, in place (the
    weights are quantized where they are: on the GPU at load). ``attention`` ("fp8" or "bf16")
    ``accumulation`` ("fp32" or "fast") and ``attention_scales`` (:data:`ATTENTION_SCALES`) are
    recorded on the model for the fast path. Returns ``model``."""
    _record(model, attention, accumulation, attention_scales)
    for block in model.blocks:
        for name in FP8_LINEARS:
            parent, leaf = _parent(block, name)
            lin = parent[int(leaf)] if leaf.isdigit() else getattr(parent, leaf)
            if isinstance(lin, nn.Linear):
                _set(parent, leaf, Fp8Linear.from_linear(lin, activation_scaling))
    return model


def fp8_skeleton_(model: nn.Module, activation_scaling: str = "token", attention: str = "fp8",
                  accumulation: str = "fp32", dtype: torch.dtype = torch.bfloat16,
                  attention_scales: str = "bound") -> nn.Module:
    """On a WanDiT built on the meta device: put empty :class:`Fp8Linear` layers where the block
    Linears are, so a pre-quantized checkpoint loads into them (``load_state_dict(assign=True)``)."""
    _record(model, attention, accumulation, attention_scales)
    for block in model.blocks:
        for name in FP8_LINEARS:
            parent, leaf = _parent(block, name)
            lin = parent[int(leaf)] if leaf.isdigit() else getattr(parent, leaf)
            _set(parent, leaf, Fp8Linear(lin.in_features, lin.out_features, activation_scaling=activation_scaling,
                                         device="meta", dtype=dtype))
    return model


def _record(model: nn.Module, attention: str, accumulation: str, attention_scales: str) -> None:
    if attention_scales not in ATTENTION_SCALES:
        raise ValueError(f"attention_scales must be one of {ATTENTION_SCALES}, got {attention_scales!r}")
    model.fp8_attention, model.fp8_fast_accum = attention == "fp8", accumulation == "fast"
    model.fp8_attention_scales = attention_scales


def scheme_name(activation_scaling: str, attention: str, accumulation: str, attention_scales: str = "bound") -> str:
    """:data:`FP8_SCHEME` filled in; FP8 attention with other than the default bound scales is
    named with them (``attention=fp8/smooth_k``), and per-token activations with what takes
    bounded scales (``token/bounded-ffn-hidden+attention-out``), so the digest tells the schemes apart."""
    attn = attention if attention != "fp8" or attention_scales == "bound" else f"fp8/{attention_scales}"
    act = activation_scaling
    if activation_scaling == "token":
        bounded = [what for what, on in (("ffn-hidden", bounded_scales_enabled()),
                                         ("attention-out", bounded_attention_out_enabled())) if on]
        if bounded:
            act = "token/bounded-" + "+".join(bounded)
    return FP8_SCHEME.format(act=act, attn=attn, acc=accumulation)


def is_fp8(model: nn.Module) -> bool:
    return isinstance(model.blocks[0].attn1.to_q, Fp8Linear)


def wan_dit_fp8_key_map(cfg) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The diffusers-format key map plus one ``<layer>.weight_scale`` [N] per quantized layer
    (whose ``<layer>.weight`` is then e4m3)."""
    from fastvideo3.models.wan.checkpoint import wan_dit_key_map
    table = wan_dit_key_map(cfg)
    for i in range(cfg.num_layers):
        for name in FP8_LINEARS:
            key = f"blocks.{i}.{name}.weight"
            n = table[key][1][0]
            table[f"blocks.{i}.{name}.weight_scale"] = (f"blocks.{i}.{name}.weight_scale", (n,))
    return table


def fp8_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A quantized model's state dict in the pre-quantized checkpoint layout (for saving one)."""
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}
