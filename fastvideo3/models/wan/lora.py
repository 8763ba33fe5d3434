"""LoRA adapters for the Wan DiT: the published file layouts, an explicit key map, strict loading.

Two layouts are read, each through an explicit table generated from the DiT config (as the base
checkpoint's key map is):

* diffusers / PEFT: ``transformer.blocks.N.attn1.to_q.lora_A.weight`` ``[r, in]`` and
  ``...lora_B.weight`` ``[out, r]`` (what ``WanPipeline.save_lora_weights`` writes); the
  scaling is 1 (PEFT's ``lora_alpha = r`` default for a file without an adapter config);
* the original Wan trainer: ``diffusion_model.blocks.N.self_attn.q.lora_down.weight`` ``[r, in]``,
  ``...lora_up.weight`` ``[out, r]`` and an optional scalar ``...alpha`` (scaling ``alpha / r``).

The adapted layers are the ten Linear layers of every block (:data:`ADAPTED_LAYERS`). A key
outside the table, a tensor of the wrong shape, a down weight without its up weight (or the
reverse) or a file mixing layouts is refused by name. An adapter's version is the sha256 of its
tensors' content (names, dtypes, shapes, bytes), so the same weights in a renamed file keep their
version and any changed byte makes a new one.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo3.errors import FailedPrecondition, InvalidRequest

#: block-relative names of the layers an adapter may touch, and their Wan-trainer names
ADAPTED_LAYERS = {
    "attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k", "attn1.to_v": "self_attn.v",
    "attn1.to_out.0": "self_attn.o",
    "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k", "attn2.to_v": "cross_attn.v",
    "attn2.to_out.0": "cross_attn.o",
    "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2",
}
LAYOUTS = ("diffusers", "wan")
MAX_RANK = 512


def layer_shapes(cfg) -> dict[str, tuple[int, int]]:
    """Our layer name (``blocks.N.attn1.to_q``) -> (in_features, out_features)."""
    d, f = cfg.inner_dim, cfg.ffn_dim
    out = {}
    for i in range(cfg.num_layers):
        for name in ADAPTED_LAYERS:
            shape = {"ffn.net.0.proj": (d, f), "ffn.net.2": (f, d)}.get(name, (d, d))
            out[f"blocks.{i}.{name}"] = shape
    return out


def self_attn_qkv(i: int) -> list[str]:
    """Block ``i``'s self-attention Q, K, V: the fused QKV projection's outputs, in order."""
    return [f"blocks.{i}.attn1.{p}" for p in ("to_q", "to_k", "to_v")]


def cross_kv(num_layers: int) -> list[str]:
    """Every block's cross-attention K and V, interleaved per block as the fast path's fused
    text K/V projection lays them out: ``[k_0, v_0, k_1, v_1, ...]``."""
    return [f"blocks.{i}.attn2.{p}" for i in range(num_layers) for p in ("to_k", "to_v")]


def lora_groups(cfg) -> dict[str, list[str]]:
    """The adapted layers that share an input in the fast path, by group name (an
    AdapterStore's ``groups``): one per block's QKV, and one for all cross-attention K/V."""
    groups = {f"blocks.{i}.attn1.qkv": self_attn_qkv(i) for i in range(cfg.num_layers)}
    groups["cross_kv"] = cross_kv(cfg.num_layers)
    return groups


def lora_key_map(cfg, layout: str) -> dict[str, tuple[str, str]]:
    """File key -> (our layer name, part) with part in ``down``, ``up``, ``alpha``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    table = {}
    for i in range(cfg.num_layers):
        for ours, wan in ADAPTED_LAYERS.items():
            layer = f"blocks.{i}.{ours}"
            if layout == "diffusers":
                table[f"transformer.{layer}.lora_A.weight"] = (layer, "down")
                table[f"transformer.{layer}.lora_B.weight"] = (layer, "up")
            else:
                base = f"diffusion_model.blocks.{i}.{wan}"
                table[f"{base}.lora_down.weight"] = (layer, "down")
                table[f"{base}.lora_up.weight"] = (layer, "up")
                table[f"{base}.alpha"] = (layer, "alpha")
    return table


def detect_layout(keys) -> str:
    keys = list(keys)
    if not keys:
        raise InvalidRequest("the adapter file holds no tensors", field="adapter")
    diff = [k for k in keys if k.startswith("transformer.")]
    wan = [k for k in keys if k.startswith("diffusion_model.")]
    if diff and wan:
        raise InvalidRequest(f"mixes diffusers ({diff[0]}) and Wan-trainer ({wan[0]}) keys", field="adapter")
    if not diff and not wan:
        raise InvalidRequest(f"unknown key {sorted(keys)[0]!r}: expected 'transformer.*' (diffusers/PEFT) or "
                             "'diffusion_model.*' (Wan trainer) names", field="adapter")
    return "diffusers" if diff else "wan"


def content_digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous().cpu().reshape(-1)
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + h.hexdigest()[:32]


@dataclass
class LoraAdapter:
    """One adapter, in our layer names: ``layers[name] = (down [r, in], up [out, r])`` in fp32 with
    the ``alpha / r`` scaling folded into ``up``."""

    adapter_id: str
    version: str
    layout: str
    rank: int
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.layers.values())

    def describe(self) -> dict:
        return {"id": self.adapter_id, "version": self.version, "layout": self.layout, "rank": self.rank,
                "layers": len(self.layers), "bytes": self.nbytes}


def parse_lora(tensors: dict[str, torch.Tensor], cfg, adapter_id: str, max_rank: int = MAX_RANK) -> LoraAdapter:
    """Map a LoRA state dict onto our layers, refusing unknown or mis-shaped keys by name."""
    layout = detect_layout(tensors)
    table, shapes = lora_key_map(cfg, layout), layer_shapes(cfg)
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key in sorted(tensors):
        if key not in table:
            raise InvalidRequest(f"unknown key {key!r} (not an adapted layer of this model in the {layout} layout)",
                                 field="adapter")
        layer, part = table[key]
        parts.setdefault(layer, {})[part] = tensors[key]
    layers, rank = {}, 0
    for layer, p in sorted(parts.items()):
        if "down" not in p or "up" not in p:
            missing = "up" if "down" in p else "down"
            raise InvalidRequest(f"layer {layer} has no {missing} weight", field="adapter")
        down, up = p["down"], p["up"]
        k_in, k_out = shapes[layer]
        r = down.shape[0] if down.dim() == 2 else -1
        if down.dim() != 2 or down.shape[1] != k_in or not 1 <= r <= max_rank:
            raise InvalidRequest(f"{layer} down weight has shape {tuple(down.shape)}, expected [r, {k_in}] "
                                 f"with 1 <= r <= {max_rank}", field="adapter", limit=f"r <= {max_rank}")
        if tuple(up.shape) != (k_out, r):
            raise InvalidRequest(f"{layer} up weight has shape {tuple(up.shape)}, expected [{k_out}, {r}]",
                                 field="adapter")
        scale = 1.0
        if "alpha" in p:
            alpha = p["alpha"]
            if alpha.numel() != 1 or not torch.isfinite(alpha.float()).all():
                raise InvalidRequest(f"{layer} alpha must be one finite number", field="adapter")
            scale = float(alpha.float().item()) / r
        if not (torch.isfinite(down.float()).all() and torch.isfinite(up.float()).all()):
            raise InvalidRequest(f"{layer} holds non-finite values", field="adapter")
        layers[layer] = (down.detach().float().contiguous(), (up.detach().float() * scale).contiguous())
        rank = max(rank, r)
    return LoraAdapter(adapter_id, content_digest(tensors), layout, rank, layers)


def load_lora_file(path: str | Path, cfg, adapter_id: str, max_rank: int = MAX_RANK) -> LoraAdapter:
    from safetensors import safe_open
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if len(files) != 1:
            raise InvalidRequest(f"{path.name}/ holds {len(files)} safetensors files, expected one",
                                 field="adapter_path")
        path = files[0]
    if not path.is_file():
        raise InvalidRequest(f"no such adapter file {path.name}", field="adapter_path")
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return parse_lora(tensors, cfg, adapter_id, max_rank)


def _linear(model: torch.nn.Module, layer: str) -> torch.nn.Module:
    mod = model
    for p in layer.split("."):
        mod = mod[int(p)] if p.isdigit() else getattr(mod, p)
    return mod


def adapted_linears(model: torch.nn.Module, cfg) -> dict[str, torch.nn.Module]:
    return {name: _linear(model, name) for name in layer_shapes(cfg)}


@torch.no_grad()
def merge_into_(model: torch.nn.Module, adapter: LoraAdapter, scale: float) -> None:
    """``W += scale * up @ down`` in place for every adapted layer (computed in fp32, rounded
    once). In place keeps views shared with the fast path's fused weights valid."""
    for layer, (down, up) in adapter.layers.items():
        lin = _linear(model, layer)
        if not isinstance(lin, torch.nn.Linear):
            raise FailedPrecondition(f"{layer} is not a plain Linear ({type(lin).__name__}); "
                                     "merging needs bf16/fp16/fp32 weights", field="merge_adapter")
        w = lin.weight
        w.copy_((w.float() + scale * (up.to(w.device) @ down.to(w.device))).to(w.dtype))
