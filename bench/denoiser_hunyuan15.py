"""HunyuanVideo-1.5's DiT forward against diffusers' (a family row of bench/denoiser_models.py).

    python bench/denoiser.py --models hunyuanvideo-1.5 --quick --out bench/results/denoiser_models_hunyuan15_h200.json
    MODELS=hunyuanvideo-1.5 MODELS_JSON=denoiser_models_hunyuan15_h200.json MODELS_TIMEOUT_S=540 \
        bash bench/gpu_call.sh models          # one H200 call, carrying .wheels .wheels_fa3 .wheels_extra

The real-size DiT (the 480p card's config: 54 dual-stream blocks, 2048 wide, 8.3B parameters) with
random weights drawn once on the device in bf16 and shared by both sides (our module loads
diffusers' tensors by name, ``assign=True``: one copy). Per shape its cards list -- 480p
(121 x 480 x 848) and 720p (121 x 720 x 1280), one CFG branch, a prompt of 256 valid Qwen tokens
and 16 ByT5 tokens -- it times diffusers' ``HunyuanVideo15Transformer3DModel`` forward and ours
(:class:`~fastvideo3.models.hunyuan15.fast.FastHunyuanDiT`: the fused attention kernels, eager),
reports our error against diffusers' and ``ours_faster`` (null, with ``diffusers_error``, where
diffusers' forward runs out of memory). ``--tiny --device cpu`` runs the same
code on the test-size config (a check, not a measurement).
"""
from __future__ import annotations

import time

import torch

from fastvideo3.card.registry import get_card
from fastvideo3.models.hunyuan15.cards import TINY_DIT
from fastvideo3.models.hunyuan15.dit import HunyuanDiT, HunyuanDiTConfig, pack_text
from fastvideo3.models.hunyuan15.fast import FastHunyuanDiT
from fastvideo3.models.hunyuan15.flops import dit_forward_cost
from fastvideo3.runtime.economy.pricing import dit_config
from fastvideo3.models.wan.flops import StepShape

FAMILY, CARD = "hunyuanvideo-1.5", "hunyuanvideo-1.5-480p-t2v"
SHAPES = {"480p": (121, 480, 848), "720p": (121, 720, 1280)}
TINY_SHAPES = {"480p": (5, 32, 48), "720p": (5, 48, 80)}
#: valid tokens of the benched prompt (of the packed 1000 Qwen and 256 ByT5 rows)
VALID, VALID_2 = 256, 16


def build_models(config: dict, device: str, dtype: torch.dtype, seed: int = 0):
    """diffusers' module with random weights (on the device, in ``dtype``) and ours sharing them."""
    from diffusers import HunyuanVideo15Transformer3DModel
    with torch.device("meta"):
        ref = HunyuanVideo15Transformer3DModel(**config)
    ref.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.ndim == 1:  # norm weights
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    ref.to(dtype).eval().requires_grad_(False)
    cfg = HunyuanDiTConfig.from_dict(config)
    with torch.device("meta"):
        ours = HunyuanDiT(cfg)
    ours.load_state_dict(ref.state_dict(), strict=True, assign=True)
    return ref, ours.eval().requires_grad_(False)


def _inputs(config: dict, cfg: HunyuanDiTConfig, shape, device, dtype, tiny: bool):
    frames, h, w = shape
    g = torch.Generator(device=device).manual_seed(frames + h)
    c = config["out_channels"]
    s, st = (4, 2) if tiny else (16, 4)
    lat = torch.randn(1, c, 1 + (frames - 1) // st, h // s, w // s, generator=g, device=device).to(dtype)
    t = torch.tensor([900.0], device=device)
    e1 = torch.randn(1, cfg.text_len, cfg.text_embed_dim, generator=g, device=device).to(dtype)
    e2 = torch.randn(1, cfg.text_len_2, cfg.text_embed_2_dim, generator=g, device=device).to(dtype)
    m1 = torch.zeros(1, cfg.text_len, dtype=torch.long, device=device)
    m2 = torch.zeros(1, cfg.text_len_2, dtype=torch.long, device=device)
    m1[:, : min(VALID, cfg.text_len)], m2[:, : min(VALID_2, cfg.text_len_2)] = 1, 1
    img = torch.zeros(1, 729, cfg.image_embed_dim, device=device, dtype=dtype)
    return lat, t, e1, m1, e2, m2, img


@torch.no_grad()
def bench_family(args, clock, device: str, dtype: torch.dtype, warm: int, iters: int, save, result: dict) -> dict:
    """Rows for every shape; returns ``{label: ours_faster}``."""
    import denoiser as base
    card = get_card(CARD)
    config = dict(TINY_DIT if args.tiny else card.components["transformer"].config)
    t0 = time.perf_counter()
    ref, ours = build_models(config, device, dtype)
    cfg = ours.cfg
    fast = FastHunyuanDiT(ours)
    result["build_hunyuan15"] = {"card": CARD, "build_s": round(time.perf_counter() - t0, 2),
                                 "attention": fast.backend, "params": sum(p.numel() for p in ref.parameters())}
    save()
    faster = {}
    skip = {r.strip() for r in (getattr(args, "skip_rows", "") or "").split(",") if r.strip()}
    for label, shape in (TINY_SHAPES if args.tiny else SHAPES).items():
        if f"{FAMILY}:{label}" in skip:
            result.setdefault("skipped_rows", []).append(f"{FAMILY}:{label}")
            continue
        frames, h, w = shape
        stride = (2, 4, 4) if args.tiny else (4, 16, 16)
        work = dit_forward_cost(dit_config(card) if not args.tiny else _tiny_flops_config(),
                                StepShape.from_video(frames, h, w, stride=stride)).flops
        row = {"family": FAMILY, "expert": "transformer", "shape": label, "frames": frames, "height": h,
               "width": w, "tflop_per_forward": round(work / 1e12, 4), "valid_text_tokens": [VALID, VALID_2]}
        t1 = time.perf_counter()
        try:
            lat, t, e1, m1, e2, m2, img = _inputs(config, cfg, shape, device, dtype, args.tiny)
            x = torch.cat([lat, torch.zeros_like(lat).repeat(1, 2, 1, 1, 1)[:, : cfg.in_channels - lat.shape[1]]], 1)
            text = pack_text(e1, m1, e2, m2, cfg.text_dim)

            def run_ref():
                return ref(x, t.to(dtype), e1, m1, encoder_hidden_states_2=e2, encoder_attention_mask_2=m2,
                           image_embeds=img, return_dict=False)[0]

            def run_ours():
                return fast(lat, t, text)

            got = run_ours()
            row["ours_ms"], row["ours_all_ms"] = clock.median(run_ours, warm, iters)
            row["tflops_ours"] = round(work / row["ours_ms"] / 1e9, 1)
            try:  # diffusers builds a [B, 1, S, S] mask over video + text tokens: it may not fit
                want = run_ref()
            except torch.OutOfMemoryError as exc:
                row["diffusers_error"] = f"OutOfMemoryError: {exc}"[:600]
                row["ours_faster"] = None  # not comparable: the reference did not run
            else:
                clock.sync()
                row.update(base.compare(got, want))
                del want
                row["diffusers_ms"], row["diffusers_all_ms"] = clock.median(run_ref, warm, iters)
                row["speedup_vs_diffusers"] = round(row["diffusers_ms"] / row["ours_ms"], 3)
                row["ours_faster"] = row["ours_ms"] < row["diffusers_ms"]
            del got
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            row["error"] = f"{type(exc).__name__}: {exc}"[:1500]
            if clock.cuda:
                torch.cuda.empty_cache()
        row["wall_s"] = round(time.perf_counter() - t1, 1)
        faster[label] = row.get("ours_faster")  # None: diffusers did not run (out of memory)
        result["rows"].append(row)
        save()
        print({k: row.get(k) for k in ("shape", "diffusers_ms", "ours_ms", "rel_fro", "error")}, flush=True)
    del ref, ours, fast
    return faster


def _tiny_flops_config():
    from fastvideo3.models.hunyuan15.family import dit_config as family_dit_config
    return family_dit_config(get_card("hunyuanvideo-1.5-tiny"))
