"""Denoiser forward of the newer model families against diffusers, and the cost of the MoE switch.

    python bench/denoiser.py --models wan2.2-ti2v-5b,wan2.2-a14b --out bench/results/denoiser_models_h200.json
    python bench/denoiser.py --models wan2.2-ti2v-5b,wan2.2-a14b --tiny --device cpu --out OUT.json   # a check
    python bench/denoiser.py --models wan2.1-i2v-14b --out bench/results/denoiser_models_i2v_h200.json   # Wan2.1 I2V
    python bench/denoiser.py --models hunyuanvideo-1.5 --out bench/results/denoiser_hunyuan15_h200.json   # HunyuanVideo-1.5

For each family's real-size config (random weights drawn on the device, shared by both sides, as
bench/denoiser.py does for Wan2.1): TI2V-5B at the 720p shape its card lists (1280x704, 121
frames); Wan2.1 I2V 14B (the 480P and 720P cards share its DiT: 36 input channels, image
cross-attention over 257 CLIP tokens, 512 text tokens as diffusers' processor assumes) at 480p and
720p, 81 frames; for A14B each expert at 480p and the high-noise expert at 720p (the
experts share one architecture; ``--all-experts`` benches each at both), 81 frames, diffusers'
forward and ours (the fast path, eager; at up to 480p also replayed from a CUDA
graph), the error of ours against diffusers, and ``ours_faster``. Then the switch: both experts
resident, graphs captured once per expert in the warm phase, requests stepped through the
boundary as the denoise loop names the experts. Counted during the requests: graph captures
(``recompiles``) and weights that moved or were re-read (``weight_reloads``: parameters whose
storage changed, and growth of allocated memory), with the switch step's time next to the
steady step time. HunyuanVideo-1.5 (``hunyuanvideo-1.5``: 480p and 720p at 121 frames) is benched
by bench/denoiser_hunyuan15.py, its rows in the same table. Every stage has a deadline (``--stage-timeout``); the JSON is rewritten after
every row, so a stopped run keeps what finished.

``summary`` holds exactly: ``ours_faster_480p`` and ``ours_faster_720p`` (family -> bool, every
expert benched), ``moe_switch_recompiles`` and ``moe_switch_weight_reloads`` (counts over all requests).
"""
from __future__ import annotations

import gc
import json
import sys
import time

import torch
from timing import cuda_ms, upper_median, wall_ms  # the sibling module in bench/

from fastvideo3.card.registry import get_card
from fastvideo3.export import GraphRunner
from fastvideo3.loop.samplers import make_schedule
from fastvideo3.models.wan.fast import FastWanDiT
from fastvideo3.testing.synthetic_wan import TINY_TRANSFORMER
from fastvideo3.models.wan.flops import StepShape, dit_forward_cost
from fastvideo3.runtime.economy.pricing import dit_config, vae_spatial_scale

GiB = 2**30
TEXT_LEN = 512
#: family -> the card it benches; the configs are the card's (one per expert)
FAMILIES = {"wan2.2-ti2v-5b": "wan2.2-ti2v-5b", "wan2.2-a14b": "wan2.2-t2v-a14b", "wan2.1-i2v-14b": "wan2.1-i2v-14b-480p",
            "hunyuanvideo-1.5": "hunyuanvideo-1.5-480p-t2v"}
#: families benched by their own module (bench/denoiser_<module>.py: ``bench_family``)
OWN_BENCH = {"hunyuanvideo-1.5": "denoiser_hunyuan15"}
#: the shapes each card lists (TI2V-5B is published at 720p only: 1280x704, 121 frames at 24 fps)
SHAPES = {"wan2.2-a14b": {"480p": (81, 480, 832), "720p": (81, 720, 1280)},
          "wan2.2-ti2v-5b": {"720p": (121, 704, 1280)},
          "wan2.1-i2v-14b": {"480p": (81, 480, 832), "720p": (81, 720, 1280)}}
TINY_SHAPES = {"wan2.2-a14b": {"480p": (5, 32, 48), "720p": (5, 48, 80)}, "wan2.2-ti2v-5b": {"720p": (5, 64, 96)},
               "wan2.1-i2v-14b": {"480p": (5, 32, 48), "720p": (5, 48, 80)}}
#: the image tokens an I2V DiT attends to (CLIP ViT-H/14 at 224 px)
IMAGE_TOKENS = 257


class _Clock:
    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, fn) -> float:
        return cuda_ms(fn) if self.cuda else wall_ms(fn)

    def median(self, fn, warm: int, iters: int) -> tuple[float, list[float]]:
        for _ in range(warm):
            fn()
        self.sync()
        times = [self.ms(fn) for _ in range(iters)]
        return upper_median(times), [round(t, 3) for t in times]


def _inputs(config: dict, shape: tuple[int, int, int], device: str, dtype, seed: int, text_len: int, scale: int = 8):
    """latents, timestep, text and (an I2V DiT) the image's hidden states, else None."""
    frames, h, w = shape
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(1, config["in_channels"], 1 + (frames - 1) // 4, h // scale, w // scale, generator=g, device=device)
    t = torch.rand(1, generator=g, device=device) * 1000
    text = torch.randn(1, text_len, config["text_dim"], generator=g, device=device)
    image = None
    if config.get("image_dim"):
        image = torch.randn(1, IMAGE_TOKENS, config["image_dim"], generator=g, device=device).to(dtype)
    return x.to(dtype), t, text.to(dtype), image


def _flops(card, shape) -> float:
    s = vae_spatial_scale(card)
    return dit_forward_cost(dit_config(card), StepShape.from_video(*shape, stride=(4, s, s))).flops


class _Deadline(Exception):
    pass


def run(args) -> int:
    import denoiser as base  # bench/denoiser.py: model building and error measures are shared

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    clock = _Clock(device)
    text_len = 16 if args.tiny else TEXT_LEN
    warm, iters = (1, 3) if (args.quick or args.tiny) else (2, 5)
    families = [m.strip() for m in args.models.split(",") if m.strip()]
    result: dict = {"command": "python " + " ".join(sys.argv), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "device": device, "tiny": bool(args.tiny), "rows": [], "switch": {}}
    if device.startswith("cuda"):
        result["environment"] = base.environment()
    summary = {"ours_faster_480p": {}, "ours_faster_720p": {}, "moe_switch_recompiles": None,
               "moe_switch_weight_reloads": None}
    skip = {r.strip() for r in getattr(args, "skip_rows", "").split(",") if r.strip()}
    families.sort(key=list(FAMILIES).index)  # the smaller family first: its rows land even if time runs out
    result["summary"] = summary

    def save():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    for fam in families:
        if fam not in FAMILIES:
            raise SystemExit(f"--models: unknown family {fam!r} (known: {', '.join(FAMILIES)})")
        if fam in OWN_BENCH:  # HunyuanVideo-1.5: its DiT's own inputs (packed two-encoder text)
            import importlib
            faster = importlib.import_module(OWN_BENCH[fam]).bench_family(args, clock, device, dtype, warm, iters,
                                                                         save, result)
            for label, ok in faster.items():
                summary[f"ours_faster_{label}"][fam] = ok
            gc.collect()
            if clock.cuda:
                torch.cuda.empty_cache()
            continue
        card = get_card(FAMILIES[fam])
        shapes = (TINY_SHAPES if args.tiny else SHAPES)[fam]
        scale = vae_spatial_scale(card)
        experts = card.dit_components()
        configs = {e: dict(card.components[e].config) for e in experts}
        if args.tiny:
            chans = configs[experts[0]]["in_channels"]
            out = configs[experts[0]]["out_channels"]
            i2v = {"image_dim": 32, "added_kv_proj_dim": 32} if configs[experts[0]].get("image_dim") else {}
            configs = {e: {**TINY_TRANSFORMER, "rope_max_seq_len": 64, "in_channels": chans, "out_channels": out,
                           **i2v} for e in experts}
            card = card.model_copy(update={"components": {**card.components, **{
                e: card.components[e].model_copy(update={"config": configs[e]}) for e in experts}}})
        models, t_build = {}, time.perf_counter()
        for i, e in enumerate(experts):  # different seeds: two distinct experts of one architecture
            ref, ours = base.build_models(configs[e], seed=i, device=device)
            if dtype == torch.float32:
                ref.float()
                ours.float()
            fast = FastWanDiT(ours, attention=args.attention if args.attention != "bench" else "auto")
            models[e] = (ref, ours, fast)
        result["build"] = {"family": fam, "experts": experts, "build_s": round(time.perf_counter() - t_build, 2),
                           "weights_gib": round(torch.cuda.memory_allocated() / GiB, 2) if clock.cuda else None}
        save()
        labels = list(shapes)
        for li, label in enumerate(labels):
            shape = shapes[label]
            if f"{fam}:{label}" in skip:
                result.setdefault("skipped_rows", []).append(f"{fam}:{label}")
                continue
            faster = []
            # the experts share one architecture, so one speaks for both at 720p (--all-experts: each)
            for e in (experts if (label == "480p" or args.all_experts) else experts[:1]):
                row = {"family": fam, "expert": e, "shape": label, "frames": shape[0], "height": shape[1],
                       "width": shape[2], "tflop_per_forward": round(_flops(card, shape) / 1e12, 4)}
                t0 = time.perf_counter()
                try:
                    row.update(_bench_row(models[e], configs[e], shape, clock, device, dtype, text_len, warm, iters,
                                          scale=scale, graphs=(shape[1] * shape[2] <= 480 * 832 and not args.no_graphs),
                                          deadline=t0 + args.stage_timeout, work=_flops(card, shape)))
                except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
                    row["error"] = f"{type(exc).__name__}: {exc}"[:1500]
                row["wall_s"] = round(time.perf_counter() - t0, 1)
                faster.append(bool(row.get("ours_faster")))
                result["rows"].append(row)
                save()
                print(json.dumps({k: row.get(k) for k in ("expert", "shape", "diffusers_ms", "ours_ms",
                                                         "ours_graph_ms", "rel_fro", "error")}), flush=True)
            summary[f"ours_faster_{label}"][fam] = all(faster)
            save()
            if li == 0 and len(experts) > 1:  # the switch next: the 720p rows are the long ones
                _switch_stage(result, summary, card, models, configs, shapes, clock, device, dtype, text_len,
                              scale, args, save)
        del models
        gc.collect()
        if clock.cuda:
            torch.cuda.empty_cache()
    save()
    return 0


@torch.no_grad()
def _bench_row(model, config, shape, clock, device, dtype, text_len, warm, iters, *, scale, graphs, deadline, work):
    import denoiser as base
    ref, _, fast = model
    if config.get("image_dim"):  # diffusers' I2V attention splits image tokens off at 512 text tokens
        text_len = TEXT_LEN
    x, t, text, image = _inputs(config, shape, device, dtype, seed=shape[1] + shape[0], text_len=text_len, scale=scale)
    extra = {"encoder_hidden_states_image": image} if image is not None else {}

    def run_ref():
        return ref(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False, **extra)[0]

    def run_ours():
        return fast(x, t, text, image=image)

    out = {}
    want, got = run_ref(), run_ours()
    clock.sync()
    out.update({k: v for k, v in base.compare(got, want).items()})
    del want
    if time.perf_counter() > deadline:
        raise _Deadline("stage deadline passed before timing")
    out["diffusers_ms"], out["diffusers_all_ms"] = clock.median(run_ref, warm, iters)
    out["ours_ms"], out["ours_all_ms"] = clock.median(run_ours, warm, iters)
    best = out["ours_ms"]
    if graphs and time.perf_counter() < deadline:
        runner = GraphRunner("row", warmup_iters=1)
        static = {"latents": x.clone(), "timestep": t.clone(), "text": text.clone()}
        if image is not None:
            static["image"] = image.clone()
        runner.prepare("row", fast, static)
        out["ours_graph_ms"], _ = clock.median(lambda: runner.replay("row"), warm, iters)
        out["graph_captured"] = runner.is_captured("row")
        best = min(best, out["ours_graph_ms"])
        runner.release()
    out["tflops_ours"] = round(work / best / 1e9, 1)
    out["speedup_vs_diffusers"] = round(out["diffusers_ms"] / best, 3)
    out["ours_faster"] = best < out["diffusers_ms"]
    return out


@torch.no_grad()

def _switch_stage(result, summary, card, models, configs, shapes, clock, device, dtype, text_len, scale, args, save):
    fam = result["build"]["family"]
    t0 = time.perf_counter()
    try:
        sw = _bench_switch(card, models, configs, shapes["480p"], clock, device, dtype, text_len, scale,
                           deadline=t0 + args.stage_timeout, requests=2 if args.tiny else 3)
    except Exception as exc:  # noqa: BLE001
        sw = {"error": f"{type(exc).__name__}: {exc}"[:1500]}
    result["switch"][fam] = sw
    if "recompiles" in sw:
        for key, name in (("moe_switch_recompiles", "recompiles"), ("moe_switch_weight_reloads", "weight_reloads")):
            summary[key] = (summary[key] or 0) + sw[name]
    save()
    print(json.dumps({"switch": {k: v for k, v in sw.items() if k != "steps"}}), flush=True)

def _bench_switch(card, models, configs, shape, clock, device, dtype, text_len, scale, *, deadline, requests):
    """Both experts resident; one graph per expert captured in the warm phase; ``requests``
    requests stepped as the loop names the experts (a short schedule crossing the boundary)."""
    experts = card.dit_components()
    spec = card.denoise
    steps = 8
    sched = make_schedule("unipc", steps, spec.sampler.flow_shift, spec.sampler.num_train_timesteps)
    boundary = spec.experts.boundary_ratio * spec.sampler.num_train_timesteps
    plan = [experts[0] if t >= boundary else experts[1] for t in sched.timesteps]
    captures = {"n": 0}
    runners = {}
    x, t, text, _ = _inputs(configs[experts[0]], shape, device, dtype, seed=1, text_len=text_len, scale=scale)
    for e in experts:  # warm phase
        runners[e] = GraphRunner(f"expert-{e}", warmup_iters=1)
        runners[e].prepare("bucket", models[e][2], {"latents": x.clone(), "timestep": t.clone(), "text": text.clone()})
    prepare = GraphRunner.prepare

    def counted(self, *a, **k):
        captures["n"] += 1
        return prepare(self, *a, **k)

    GraphRunner.prepare = counted
    ptrs = {e: {n: p.data_ptr() for n, p in models[e][1].named_parameters()} for e in experts}
    mem0 = torch.cuda.memory_allocated() if clock.cuda else 0
    step_ms: list[dict] = []
    try:
        for r in range(requests):
            lat = torch.randn_like(x, dtype=torch.float32)
            for k, (e, ts) in enumerate(zip(plan, sched.timesteps)):
                if time.perf_counter() > deadline:
                    raise _Deadline(f"deadline at request {r} step {k}")
                runner = runners[e]
                static = runner.static_inputs("bucket")

                def step():
                    static["latents"].copy_(lat)
                    static["timestep"].fill_(float(ts))
                    runner.replay("bucket")

                ms = clock.ms(step)
                out = runner.static_outputs("bucket")
                lat = lat + (sched.sigmas[k + 1] - sched.sigmas[k]) * out.float()
                step_ms.append({"request": r, "step": k, "expert": e, "ms": round(ms, 3),
                                "switch": k > 0 and plan[k - 1] != e})
    finally:
        GraphRunner.prepare = prepare
    moved = sum(p.data_ptr() != ptrs[e][n] for e in experts for n, p in models[e][1].named_parameters())
    grown = (torch.cuda.memory_allocated() - mem0) if clock.cuda else 0
    for rn in runners.values():
        rn.release()
    steady = [s["ms"] for s in step_ms if not s["switch"] and s["step"] > 0]
    switch = [s["ms"] for s in step_ms if s["switch"]]
    med = sorted(steady)[len(steady) // 2] if steady else None
    return {"experts": experts, "plan": plan, "timesteps": sched.timesteps, "boundary_timestep": boundary,
            "requests": requests, "recompiles": captures["n"],
            "weight_reloads": int(moved) + int(grown > 64 * 2**20),
            "parameters_moved": int(moved), "allocated_growth_mib": round(grown / 2**20, 2),
            "steady_step_ms": med, "switch_step_ms": switch,
            "switch_over_steady": [round(s / med, 3) for s in switch] if med else None, "steps": step_ms}
