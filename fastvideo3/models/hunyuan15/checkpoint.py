"""Checkpoint loading for HunyuanVideo-1.5: the explicit key map, strict checks, the directory's card.

The DiT component names key map ``hunyuan15_dit_diffusers_v1``: checkpoint key -> (our parameter
name, expected shape), generated from the card's architecture config. Loading refuses any missing,
unexpected or mis-shaped key, naming it, and reads tensors from memory-mapped safetensors straight
into parameters built on the meta device.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from fastvideo3.errors import CardError
from fastvideo3.models.checkpoint import checked_tensors, same_value, slug
from fastvideo3.vocab import LoopId


def hunyuan15_dit_key_map(cfg) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Checkpoint key -> (our parameter name, shape) of a diffusers-format HunyuanVideo-1.5 transformer."""
    d, f, hd = cfg.inner_dim, cfg.ffn_dim, cfg.attention_head_dim
    t1, t2, img = cfg.text_embed_dim, cfg.text_embed_2_dim, cfg.image_embed_dim
    pt, p = cfg.patch_size_t, cfg.patch_size
    table: dict[str, tuple[int, ...]] = {}

    def linear(name: str, d_in: int, d_out: int) -> None:
        table[f"{name}.weight"], table[f"{name}.bias"] = (d_out, d_in), (d_out,)

    def norm(name: str, dim: int) -> None:
        table[f"{name}.weight"], table[f"{name}.bias"] = (dim,), (dim,)

    table["x_embedder.proj.weight"], table["x_embedder.proj.bias"] = (d, cfg.in_channels, pt, p, p), (d,)
    norm("image_embedder.norm_in", img)
    linear("image_embedder.linear_1", img, img)
    linear("image_embedder.linear_2", img, d)
    norm("image_embedder.norm_out", d)
    c = "context_embedder."
    linear(c + "time_text_embed.timestep_embedder.linear_1", 256, d)
    linear(c + "time_text_embed.timestep_embedder.linear_2", d, d)
    linear(c + "time_text_embed.text_embedder.linear_1", t1, d)
    linear(c + "time_text_embed.text_embedder.linear_2", d, d)
    linear(c + "proj_in", t1, d)
    for i in range(cfg.num_refiner_layers):
        r = f"{c}token_refiner.refiner_blocks.{i}."
        norm(r + "norm1", d)
        norm(r + "norm2", d)
        for proj in ("to_q", "to_k", "to_v", "to_out.0"):
            linear(r + "attn." + proj, d, d)
        linear(r + "ff.net.0.proj", d, 4 * d)
        linear(r + "ff.net.2", 4 * d, d)
        linear(r + "norm_out.linear", d, 2 * d)
    norm("context_embedder_2.norm", t2)
    linear("context_embedder_2.linear_1", t2, 2048)
    linear("context_embedder_2.linear_2", 2048, 2048)
    linear("context_embedder_2.linear_3", 2048, d)
    linear("time_embed.timestep_embedder.linear_1", 256, d)
    linear("time_embed.timestep_embedder.linear_2", d, d)
    table["cond_type_embed.weight"] = (3, d)
    for i in range(cfg.num_layers):
        b = f"transformer_blocks.{i}."
        linear(b + "norm1.linear", d, 6 * d)
        linear(b + "norm1_context.linear", d, 6 * d)
        for proj in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"):
            linear(b + "attn." + proj, d, d)
        for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            table[f"{b}attn.{n}.weight"] = (hd,)
        for ff in ("ff", "ff_context"):
            linear(f"{b}{ff}.net.0.proj", d, f)
            linear(f"{b}{ff}.net.2", f, d)
    linear("norm_out.linear", d, 2 * d)
    linear("proj_out", d, pt * p * p * cfg.out_channels)
    # our module tree mirrors the checkpoint, so the names map to themselves -- but the table is
    # explicit and complete: nothing outside it loads and nothing in it may be absent
    return {k: (k, s) for k, s in table.items()}


KEY_MAPS = {"hunyuan15_dit_diffusers_v1": hunyuan15_dit_key_map}


def load_dit_weights(module: torch.nn.Module, folder: Path, cfg, key_map: str, dtype: torch.dtype, device,
                     component: str = "transformer") -> None:
    """Load a transformer folder into ``module`` (built on the meta device) strictly by key map."""
    if key_map not in KEY_MAPS:
        raise CardError(f"unknown key map {key_map!r}", field=f"components.{component}.key_map",
                        limit=", ".join(KEY_MAPS))
    table = KEY_MAPS[key_map](cfg)
    unexpected: list[str] = []
    state = {name: t.to(device=device, dtype=dtype)
             for _, name, t in checked_tensors(folder, table, component, unexpected)}
    if unexpected:
        raise CardError(f"checkpoint has {len(unexpected)} tensor(s) key map {key_map} does not know, e.g. "
                        f"{unexpected[0]}", field=f"{component}.{unexpected[0]}")
    missing = sorted(set(table) - set(state))
    if missing:
        raise CardError(f"checkpoint lacks {len(missing)} tensor(s) the card requires, e.g. {missing[0]}",
                        field=f"{component}.{missing[0]}")
    module.load_state_dict(state, strict=True, assign=True)


def card_for_directory(root: Path):
    """The card of a HunyuanVideo-1.5 T2V directory (None: not a HunyuanVideo-1.5 directory).

    Starts from the built-in card whose architecture matches (480p, 720p, tiny); another size gets
    a custom card from its own configs. The directory's scheduler shift and guidance scale become the
    card's defaults. What we do not implement is refused by name (models/hunyuan15/layout.py).
    """
    from fastvideo3.card.registry import bind_checkpoint
    from fastvideo3.models.hunyuan15.cards import builtin_cards, hunyuan15_card
    from fastvideo3.models.hunyuan15.layout import inspect_directory, pipeline_class

    root = Path(root)
    cls = pipeline_class(root)
    if cls is None or not str(cls).startswith("HunyuanVideo15"):
        return None  # another family's directory (or none): the registry asks the others
    layout = inspect_directory(root)
    tcfg = {k: v for k, v in layout.transformer.items() if not k.startswith("_")}
    vcfg = {k: layout.vae.get(k) for k in ("latent_channels", "temporal_compression_ratio",
                                           "spatial_compression_ratio")}
    found = None
    for card in builtin_cards().values():
        dit = card.components["transformer"].config
        if all(same_value(tcfg.get(k, v), v) for k, v in dit.items()) and card.components["vae"].config == vcfg:
            found = card
            break
    base = found or hunyuan15_card(f"hunyuan15-custom-{slug(root.name)}", f"HunyuanVideo-1.5 architecture from "
                                   f"{root.name}", tcfg, vcfg, flow_shift=5.0, guidance=6.0,
                                   limits=builtin_cards()["hunyuanvideo-1.5-480p-t2v"].limits)
    data = base.model_dump(mode="json")
    data["components"]["transformer"]["config"] = tcfg
    den = data["loops"][LoopId.DIFFUSION_DENOISE]
    den["sampler"].update(flow_shift=float(layout.scheduler.get("shift", 1.0)),
                          num_train_timesteps=int(layout.scheduler.get("num_train_timesteps", 1000)))
    data["limits"]["default_guidance"] = float(layout.guider.get("guidance_scale", 7.5))
    from fastvideo3.card.spec import ModelCard
    return bind_checkpoint(ModelCard.model_validate(data), root)


def read_config(folder: Path, name: str = "config.json") -> dict:
    return json.loads((folder / name).read_text())
