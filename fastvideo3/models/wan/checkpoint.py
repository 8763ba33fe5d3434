"""Checkpoint loading for the Wan family: explicit key maps, strict checks, one read.

A card's DiT component names the key map it loads with (``wan_dit_diffusers_v1``). The map is an
explicit table from checkpoint key to our parameter name and expected shape, generated from the
card's architecture config; loading refuses any missing, unexpected or mis-shaped key, naming it.
Weights are read tensor by tensor from memory-mapped safetensors straight into parameters
built on the meta device, so a checkpoint is read once and never copied through Python lists.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from fastvideo3.errors import CardError
from fastvideo3.models.checkpoint import checked_tensors, slug
from fastvideo3.models.wan.fp8 import wan_dit_fp8_key_map
from fastvideo3.vocab import LoopId, Sampler


def wan_dit_key_map(cfg) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Checkpoint key -> (our parameter name, shape) for a diffusers-format Wan2.1 transformer."""
    d, f, t = cfg.inner_dim, cfg.ffn_dim, cfg.text_dim
    pt, ph, pw = cfg.patch_size
    table: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (d, cfg.in_channels, pt, ph, pw),
        "patch_embedding.bias": (d,),
        "condition_embedder.time_embedder.linear_1.weight": (d, cfg.freq_dim),
        "condition_embedder.time_embedder.linear_1.bias": (d,),
        "condition_embedder.time_embedder.linear_2.weight": (d, d),
        "condition_embedder.time_embedder.linear_2.bias": (d,),
        "condition_embedder.time_proj.weight": (6 * d, d),
        "condition_embedder.time_proj.bias": (6 * d,),
        "condition_embedder.text_embedder.linear_1.weight": (d, t),
        "condition_embedder.text_embedder.linear_1.bias": (d,),
        "condition_embedder.text_embedder.linear_2.weight": (d, d),
        "condition_embedder.text_embedder.linear_2.bias": (d,),
        "proj_out.weight": (cfg.out_channels * pt * ph * pw, d),
        "proj_out.bias": (cfg.out_channels * pt * ph * pw,),
        "scale_shift_table": (1, 2, d),
    }
    img = cfg.image_dim
    if img is not None:  # the I2V layout: the image embedder and each block's image K/V
        e = "condition_embedder.image_embedder."
        table.update({f"{e}norm1.weight": (img,), f"{e}norm1.bias": (img,), f"{e}ff.net.0.proj.weight": (img, img),
                      f"{e}ff.net.0.proj.bias": (img,), f"{e}ff.net.2.weight": (d, img), f"{e}ff.net.2.bias": (d,),
                      f"{e}norm2.weight": (d,), f"{e}norm2.bias": (d,)})
    for i in range(cfg.num_layers):
        b = f"blocks.{i}."
        for a in ("attn1", "attn2"):
            for p in ("to_q", "to_k", "to_v", "to_out.0"):
                table[f"{b}{a}.{p}.weight"] = (d, d)
                table[f"{b}{a}.{p}.bias"] = (d,)
            table[f"{b}{a}.norm_q.weight"] = (d,)
            table[f"{b}{a}.norm_k.weight"] = (d,)
        if cfg.cross_attn_norm:
            table[f"{b}norm2.weight"] = (d,)
            table[f"{b}norm2.bias"] = (d,)
        table[f"{b}ffn.net.0.proj.weight"] = (f, d)
        table[f"{b}ffn.net.0.proj.bias"] = (f,)
        table[f"{b}ffn.net.2.weight"] = (d, f)
        table[f"{b}ffn.net.2.bias"] = (d,)
        table[f"{b}scale_shift_table"] = (1, 6, d)
        if cfg.added_kv_proj_dim is not None:
            for p in ("add_k_proj", "add_v_proj"):
                table[f"{b}attn2.{p}.weight"] = (d, cfg.added_kv_proj_dim)
                table[f"{b}attn2.{p}.bias"] = (d,)
            table[f"{b}attn2.norm_added_k.weight"] = (d,)
    # Our module tree mirrors the checkpoint layout, so the name map is the identity — but it is
    # an explicit, complete table: nothing outside it is loaded and nothing in it may be absent.
    return {k: (k, s) for k, s in table.items()}


KEY_MAPS = {"wan_dit_diffusers_v1": wan_dit_key_map, "wan_dit_diffusers_fp8_v1": wan_dit_fp8_key_map}
#: key maps of pre-quantized checkpoints (e4m3 block weights next to ``*.weight_scale``)
FP8_KEY_MAPS = ("wan_dit_diffusers_fp8_v1",)


def load_dit_weights(module: torch.nn.Module, folder: Path, cfg, key_map: str, dtype: torch.dtype, device,
                     component: str = "transformer") -> None:
    """Load a transformer folder into ``module`` (built on the meta device) strictly by key map."""
    table = KEY_MAPS[key_map](cfg)
    seen: set[str] = set()
    state: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for key, name, t in checked_tensors(folder, table, component, unexpected):
        want = dtype
        if key.endswith(".weight_scale"):
            want = torch.float32
        elif f"{key}_scale" in table and t.dtype != torch.float8_e4m3fn:
            raise CardError(f"tensor {key} is {str(t.dtype).removeprefix('torch.')}; key map {key_map} "
                            "expects e4m3 (float8_e4m3fn) next to its weight_scale", field=f"{component}.{key}")
        elif t.dtype == torch.float8_e4m3fn:
            if key_map not in FP8_KEY_MAPS:
                raise CardError(f"tensor {key} is e4m3 but key map {key_map} loads bf16 weights",
                                field=f"{component}.{key}")
            want = t.dtype
        state[name] = t.to(device=device, dtype=want) if (t.dtype != want or str(device) != "cpu") else t
        seen.add(key)
    if unexpected:
        raise CardError(f"checkpoint has {len(unexpected)} tensor(s) the key map does not know, e.g. {unexpected[0]}",
                        field=component)
    missing = sorted(set(table) - seen)
    if missing:
        raise CardError(f"checkpoint lacks {len(missing)} tensor(s) the card requires, e.g. {missing[0]}",
                        field=component)
    module.load_state_dict(state, strict=True, assign=True)


def card_for_directory(root: Path):
    """Build a card for a diffusers-format Wan T2V directory (Wan2.1, or Wan2.2's two experts),
    starting from the built-in card whose architecture matches; an unknown size gets a custom card
    from its own config. Layouts we do not implement are refused by name (models/wan/layout.py)."""
    from fastvideo3.card.registry import bind_checkpoint
    from fastvideo3.models.wan.cards import (
        TINY_I2V_DIT, WAN21_I2V_480P, WAN21_I2V_720P, WAN22_5B_DIT, WAN22_A14B_T2V, WAN_1_3B_DIT, WAN_14B_DIT,
        WAN_I2V_14B_DIT, _wan_real, wan21_i2v, wan22_moe, wan22_ti2v,
    )
    from fastvideo3.card.spec import Limits, LoopSpec, SamplerSpec, graph_buckets_within
    from fastvideo3.models.wan.layout import inspect_directory

    root = Path(root)
    layout = inspect_directory(root)  # refuses, by name, every layout and field we do not implement
    moe, ti2v = layout.kind == "wan2.2-t2v-moe", layout.kind == "wan2.2-ti2v"
    i2v = layout.kind == "wan2.1-i2v"
    tcfg = layout.transformer
    arch = {k: tcfg[k] for k in (WAN_I2V_14B_DIT if i2v else WAN_1_3B_DIT) if k in tcfg}
    # the 480P and 720P I2V checkpoints share one architecture: the published directory names it
    i2v_14b = "wan2.1-i2v-14b-720p" if "720p" in root.name.lower() else "wan2.1-i2v-14b-480p"
    refs = ((("wan2.2-t2v-a14b", WAN_14B_DIT),) if moe else (("wan2.2-ti2v-5b", WAN22_5B_DIT),) if ti2v
            else ((i2v_14b, WAN_I2V_14B_DIT), ("wan2.1-i2v-tiny", TINY_I2V_DIT)) if i2v
            else (("wan2.1-t2v-1.3b", WAN_1_3B_DIT), ("wan2.1-t2v-14b", WAN_14B_DIT)))
    found = None
    for mid, ref in refs:
        if all(arch.get(k) == (list(v) if isinstance(v, tuple) else v) for k, v in ref.items() if k != "rope_max_seq_len"):
            found = (mid, ref)
    mid, ref = found or ((f"wan22-custom-{slug(root.name)}" if moe or ti2v else f"wan-i2v-custom-{slug(root.name)}"
                          if i2v else f"wan-custom-{slug(root.name)}"), arch)
    kind = "2.2 two-expert" if moe else "2.2 TI2V" if ti2v else "2.1 I2V" if i2v else "2.1"
    desc = f"{mid} from {root.name}" if found else f"Wan{kind} architecture from {root.name}"
    if moe:
        opts = dict(WAN22_A14B_T2V, boundary_ratio=layout.boundary_ratio)
        base = wan22_moe(mid, ref, desc, **opts)
    elif ti2v:
        base = wan22_ti2v(mid, ref, desc)
    elif i2v:
        from fastvideo3.card.registry import get_card
        known = get_card(mid) if found else None
        opts = WAN21_I2V_720P if mid.endswith("720p") else WAN21_I2V_480P
        if known is not None:  # the built-in card's serving defaults (the tiny one's small sizes)
            lim = known.limits
            opts = dict(flow_shift=3.0, default_height=lim.default_height, default_width=lim.default_width,
                        default_frames=lim.default_frames, default_steps=known.denoise.default_steps)
        clip = json.loads((root / "image_encoder" / "config.json").read_text())
        tokens = (int(clip.get("image_size", 224)) // int(clip.get("patch_size", 14))) ** 2 + 1
        base = wan21_i2v(mid, ref, desc, image_tokens=tokens, **opts)
    else:
        base = _wan_real(mid, ref, desc)
    sched = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
    cls = sched.get("_class_name", "")
    if "UniPC" in cls:
        sampler = SamplerSpec(name=Sampler.UNIPC, flow_shift=float(sched.get("flow_shift", 3.0)),
                              solver_order=int(sched.get("solver_order", 2)),
                              num_train_timesteps=int(sched.get("num_train_timesteps", 1000)))
    elif "FlowMatchEuler" in cls:
        sampler = SamplerSpec(name=Sampler.EULER, flow_shift=float(sched.get("shift", 3.0)),
                              num_train_timesteps=int(sched.get("num_train_timesteps", 1000)))
    else:
        raise CardError(f"scheduler {cls!r} is not supported (UniPCMultistepScheduler or FlowMatchEulerDiscreteScheduler)",
                        field="checkpoint.scheduler")
    d = base.loops[LoopId.DIFFUSION_DENOISE]
    loops = dict(base.loops)
    loops[LoopId.DIFFUSION_DENOISE] = LoopSpec(loop_id=LoopId.DIFFUSION_DENOISE, default_steps=d.default_steps,
                                               sampler=sampler, experts=d.experts)
    # rope tables bound the latent grid: max pixels = rope_max_seq_len * patch * vae scale (8, or 16)
    from fastvideo3.models.wan.family import vae_spatial_scale
    max_px = min(1280, int(arch.get("rope_max_seq_len", 1024)) * int(arch["patch_size"][1]) * vae_spatial_scale(base))
    max_px -= max_px % base.limits.size_multiple
    lim = base.limits.model_copy(update={
        "max_height": max_px, "max_width": max_px,
        "default_height": min(base.limits.default_height, max_px), "default_width": min(base.limits.default_width, max_px),
    })
    limits = Limits.model_validate(lim.model_dump())
    card = base.model_copy(update={"loops": loops, "limits": limits,
                                   "graph_buckets": graph_buckets_within(base.graph_buckets, limits)})
    return bind_checkpoint(card, root)
