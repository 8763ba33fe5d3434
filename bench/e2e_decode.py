"""The VAE decode alone: ours (fastvideo3.models.wan.components.VideoDecoder) against diffusers'
``AutoencoderKLWan.decode``, on the same weights and latents, in fp32 and bf16.

    python bench/e2e_generation.py --model DIR --decode-only --out FILE [--frames 81 --height 480
           --width 832] [--decode-repeats 2] [--time-chunks 1,4,8,20] [--decode-batch 2]

What ``bench/e2e_generation.py --decode-only`` runs (one short GPU call). The latents are seeded
standard normal (what a denoiser hands the VAE) at the request's latent shape; both sides
de-normalise them with the VAE's ``latents_mean`` / ``latents_std`` and map ``[-1, 1]`` to
``[0, 1]``. Each variant is called once untimed (cuDNN autotuning, allocator), then timed
``--decode-repeats`` times, synchronised; the median is reported. Frame errors are against
diffusers' fp32 decode (what ``WanPipeline`` runs). ``summary.vae_decode_s`` is ours at the card's
decode precision with the default settings; ``ours_fused`` / ``ours_unfused`` are the same
with the fused decoder (:func:`fastvideo3.models.wan.vae_decode.fuse_decoder`) forced on / off
(``summary.fused_vae_decode_s``, ``summary.unfused_vae_decode_s``; on CUDA the default is fused).
The batched variant decodes ``--decode-batch`` copies-with-other-seeds in one call and reports
seconds per latent and the largest difference between a latent decoded in the batch and alone.
"""
from __future__ import annotations

import statistics
import time

import torch
from timing import synced_seconds  # the sibling module in bench/

GOAL_DECODE_S = 1.5


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time(fn, device: str, repeats: int) -> tuple[float, float, object]:
    """(first call s, median of ``repeats`` later calls s, last output)."""
    first, times, out = synced_seconds(fn, repeats, lambda: _sync(device))
    return first, statistics.median(times) if times else first, out


def _err(a: torch.Tensor, ref: torch.Tensor) -> dict:
    d = (a.float() - ref.float()).abs()
    return {"max_abs": round(float(d.max()), 6), "mean_abs": round(float(d.mean()), 7)}


def _peak_gib(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 2)


def run_decode_only(a, result: dict, save) -> int:
    """Fill ``result`` with the decode variants and ``summary``; returns the exit code."""
    from diffusers import AutoencoderKLWan

    from fastvideo3.card.registry import resolve_card
    from fastvideo3.models.wan.components import precision_dtype

    card = resolve_card(a.model)
    lat_f = (a.frames - 1) // 4 + 1
    shape = (1, 16, lat_f, a.height // 8, a.width // 8)
    g = torch.Generator().manual_seed(a.seed)
    z = torch.randn(*shape, generator=g)
    card_precision = card.precision.vae_for(a.device)
    result["decode_workload"] = {"frames": a.frames, "height": a.height, "width": a.width, "latent_shape": list(shape),
                                 "repeats": a.decode_repeats, "card_precision": card_precision,
                                 "tolerance_frames_abs": card.parity.vae_bf16_frames_abs,
                                 "tolerance_frames_mean_abs": card.parity.vae_bf16_frames_mean_abs}
    variants: dict[str, dict] = {}
    result["decode"] = variants

    # diffusers: the reference (fp32, as WanPipeline runs its VAE) and the same module in bf16
    ref_frames = None
    for prec in ("fp32", "bf16"):
        dtype = precision_dtype(prec)
        vae = AutoencoderKLWan.from_pretrained(a.model, subfolder="vae", dtype=dtype).to(a.device).eval()
        c = vae.config
        mean = torch.tensor(c.latents_mean).view(1, -1, 1, 1, 1).to(a.device, dtype)
        std = torch.tensor(c.latents_std).view(1, -1, 1, 1, 1).to(a.device, dtype)
        zz = z.to(a.device, dtype) * std + mean

        @torch.no_grad()
        def call(vae=vae, zz=zz):
            video = vae.decode(zz, return_dict=False)[0]
            return (video / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1).float().cpu()

        if a.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        first, med, frames = _time(call, a.device, a.decode_repeats)
        v = {"side": "diffusers", "precision": prec, "first_s": round(first, 3), "s": round(med, 3),
             "peak_gib": _peak_gib(a.device)}
        if ref_frames is None:
            ref_frames = frames
        else:
            v["frames_vs_diffusers_fp32"] = _err(frames, ref_frames)
        variants[f"diffusers_{prec}"] = v
        del vae
        save()
        print("decode", f"diffusers_{prec}", v, flush=True)

    chunks = [int(x) for x in a.time_chunks.split(",") if x.strip()]
    plan = [("ours_default", card_precision, None, None, None)]  # the card's precision and our defaults
    # the defaults with the fused decoder forced on and off (on CUDA the default is fused)
    plan += [("ours_fused", card_precision, None, None, True), ("ours_unfused", card_precision, None, None, False)]
    for prec in ("fp32", "bf16"):
        for tc in chunks:
            plan.append((f"ours_{prec}_chunk{tc}", prec, tc, True, None))
        plan.append((f"ours_{prec}_chunk{chunks[-1]}_no_channels_last", prec, chunks[-1], False, None))
    for name, prec, tc, cl, fused in plan:
        try:  # one variant's failure (memory, a kernel) is recorded; the others still run
            variants[name] = _ours(card, a, z, shape, g, ref_frames, prec, tc, cl, batch=name == "ours_default",
                                   fused=fused)
        except Exception as e:  # noqa: BLE001
            variants[name] = {"side": "ours", "precision": prec, "time_chunk": tc, "error": f"{type(e).__name__}: {e}"[:500]}
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
        save()
        print("decode", name, variants[name], flush=True)

    result["summary"] = decode_only_summary(result)
    save()
    if "error" in result["summary"]:
        return 1
    print("summary", result["summary"], flush=True)
    return 0


def decode_only_summary(result: dict) -> dict:
    """``summary`` from a decode-only result's variants (those measured: a run cut short by its
    time limit still has ours at the card's defaults and diffusers' fp32 decode, measured first)."""
    variants, w = result["decode"], result["decode_workload"]
    ours, ref = variants["ours_default"], variants["diffusers_fp32"]
    if "error" in ours:
        return {"error": ours["error"], "diffusers_vae_decode_s": ref["s"]}
    tol, tol_mean = w["tolerance_frames_abs"], w["tolerance_frames_mean_abs"]
    err = ours["frames_vs_diffusers_fp32"]
    best = min((v for v in variants.values() if v["side"] == "ours" and "s" in v), key=lambda v: v["s"])
    summary = {
        "vae_decode_s": ours["s"], "precision": ours["precision"], "diffusers_vae_decode_s": ref["s"],
        "diffusers_bf16_vae_decode_s": variants.get("diffusers_bf16", {}).get("s"),
        "speedup_vs_diffusers": round(ref["s"] / ours["s"], 3) if ours["s"] else None,
        "frames_max_abs_vs_diffusers": err["max_abs"], "frames_mean_abs_vs_diffusers": err["mean_abs"],
        "tolerance_frames_abs": tol, "tolerance_frames_mean_abs": tol_mean,
        "within_tolerance": err["max_abs"] <= tol and err["mean_abs"] <= tol_mean,
        "fastest_variant": {k: best.get(k) for k in ("precision", "time_chunk", "channels_last", "fused", "s")},
        "variants_measured": sorted(variants),
        "goal_s": GOAL_DECODE_S, "goal_met": ours["s"] <= GOAL_DECODE_S,
    }
    for name in ("ours_fused", "ours_unfused"):
        if "s" in variants.get(name, {}):
            summary[f"{name.removeprefix('ours_')}_vae_decode_s"] = variants[name]["s"]
    if "batch" in ours:
        summary["batched_s_per_latent"] = ours["batch"]["s_per_latent"]
    return summary


def _ours(card, a, z, shape, g, ref_frames, prec: str, tc, cl, batch: bool, fused: bool | None = None) -> dict:
    from fastvideo3.models.wan.components import VideoDecoder, precision_dtype
    # a variant that names its chunking or fusion takes the fast path on any device (the default: CUDA only)
    dec = VideoDecoder(card, a.device, precision_dtype(prec), fast=True if tc or fused is not None else None,
                       time_chunk=tc, channels_last=cl, fused=fused)
    if a.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    first, med, frames = _time(lambda: dec.decode(z), a.device, a.decode_repeats)
    v = {"side": "ours", "precision": prec, "fast": dec.fast, "time_chunk": dec.time_chunk,
         "channels_last": dec.channels_last, "fused": dec.fused, "first_s": round(first, 3), "s": round(med, 3),
         "peak_gib": _peak_gib(a.device), "frames_vs_diffusers_fp32": _err(frames, ref_frames)}
    if batch and a.decode_batch > 1:
        zb = torch.cat([z] + [torch.randn(*shape, generator=g) for _ in range(a.decode_batch - 1)])
        fb, mb, framesb = _time(lambda: dec.decode(zb), a.device, max(1, a.decode_repeats - 1))
        v["batch"] = {"latents": a.decode_batch, "first_s": round(fb, 3), "s": round(mb, 3),
                      "s_per_latent": round(mb / a.decode_batch, 3), "peak_gib": _peak_gib(a.device),
                      "batched_vs_alone": _err(framesb[:1], frames)}
    return v


def decode_parity(engine, latents: torch.Tensor, ref_frames, device: str) -> dict:
    """Our decoder (the Engine's, at the card's precision) on diffusers' final latents, against
    diffusers' own frames of them: the decode's error alone, apart from the DiT's. Returns the
    decode's synchronised seconds and the frames' differences."""
    import numpy as np
    dec = engine.decoder.vae
    _sync(device)
    t0 = time.perf_counter()
    # on the decoder's VAE thread, where its decodes run and cuDNN's tuned plans live
    frames = engine.decoder.on_vae_thread(dec.decode, latents)[0].numpy()
    _sync(device)
    s = time.perf_counter() - t0
    d = np.abs(frames.astype("float64") - ref_frames.astype("float64"))
    return {"decode_s": round(s, 3), "precision": engine.decoder.precision, "frames_max_abs": float(d.max()),
            "frames_mean_abs": float(d.mean())}
