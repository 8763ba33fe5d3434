"""End-to-end text-to-video: fastvideo3's embedded Engine against diffusers' WanPipeline, on the
same random weights, prompt and seed, text encoder and VAE included.

    python bench/e2e_generation.py --build-dir DIR [--preset 1.3b]       # write the random checkpoint
    python bench/e2e_generation.py --model DIR --out FILE [--frames 81 --fallback-frames 33]
           [--height 480 --width 832 --steps 50 --guidance 5 --seed 0] [--device cuda] [--time-limit S]
    python bench/e2e_generation.py --model DIR --decode-only --out FILE     # the VAE decode alone
    python bench/e2e_generation.py --build-dir /tmp/w --preset tiny && \\
    python bench/e2e_generation.py --model /tmp/w --device cpu --frames 9 --height 32 --width 48 --steps 4

The checkpoint is :func:`fastvideo3.testing.synthetic_wan.build_wan_dir`: with ``--preset 1.3b`` a
transformer at the real Wan2.1-T2V-1.3B config (bf16), the VAE at Wan's real config (fp32), and a
*small* random text encoder (UMT5 with UMT5-XXL's 4096-wide output but 2 layers, a trained toy
tokenizer) instead of the 11 GB UMT5-XXL; prompt embeddings are random either way, and the
encoder's cost is a small share of a generation. Both sides load the same directory: diffusers'
pipeline in the run's dtype with its VAE in fp32 (Wan's usual setup), our Engine at the same
precision, its decoder at the card's decode precision (``precision.vae_cuda``: bf16 for the Wan2.1
cards on a GPU, fp32 on a CPU).

Per side: wall time of the whole call (prompt -> frames in host memory), text-encode and VAE
decode time, the DiT forwards timed with CUDA events (diffusers runs two forwards per CFG step,
we run one forward over both branches), and every step's latents, kept on the device. Errors:
the relative Frobenius error of our latents against diffusers' after selected steps and at the
end, and the frames' absolute difference. In bf16 the end error is far above the one-forward
bound (2e-2): 50 steps compound each forward's rounding differences.

A warm-up (one DiT forward and one VAE decode at the run's shape per side, and a tiny
whole-pipeline call) comes first, untimed. If the warm-up forwards predict that ``--frames`` cannot finish within
``--time-limit``, the run uses ``--fallback-frames`` and says so. The JSON is rewritten after each
part.

``summary.vae_decode_s`` is our decode (the Engine's decode loop, at the card's decode precision);
beside it diffusers' decode time in the same run and the decode's own frame error: our decoder on
diffusers' final latents against diffusers' frames of them (the whole run's frame error also
carries the DiT's bf16 differences). ``--decode-only`` times the VAE decode alone, ours against
diffusers' in fp32 and bf16 (bench/e2e_decode.py), in one short call.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a source checkout without installing the package
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from options import add_defaults  # noqa: E402 - the sibling module in bench/
from serving import portable, record_unit_failures  # noqa: E402 - the sibling script in bench/

PROMPT = "A cat walks along the beach at sunset while gentle waves roll onto the sand."
NEGATIVE = "Low quality, blurry, static, worst quality, overexposed, distorted."
ERROR_STEPS = (1, 5, 10, 20, 30, 40, 50)  # 1-based steps whose latents are compared


# ------------------------------------------------------------------------------ timing
class ForwardTimer:
    """Times calls of a function or module: CUDA events on a GPU (no sync per call), wall clock
    on a CPU. ``ms()`` synchronizes once and returns every call's time, in call order."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.marks: list = []

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, begin) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.marks.append((begin, end))
        else:
            self.marks.append((begin, time.perf_counter()))

    def wrap(self, fn):
        def timed(*args, **kw):
            begin = self.start()
            out = fn(*args, **kw)
            self.stop(begin)
            return out
        return timed

    def hook(self, module: torch.nn.Module) -> None:
        pending: list = []
        module.register_forward_pre_hook(lambda m, args: pending.append(self.start()))
        module.register_forward_hook(lambda m, args, out: self.stop(pending.pop()))

    def ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [b.elapsed_time(e) for b, e in self.marks]
        return [(e - b) * 1e3 for b, e in self.marks]

    def reset(self) -> None:
        self.marks.clear()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_call(device: str, store: dict, key: str, fn):
    """Wrap ``fn`` so each call adds its synchronized wall time to ``store[key]``."""
    def wrapped(*args, **kw):
        sync(device)
        t0 = time.perf_counter()
        out = fn(*args, **kw)
        sync(device)
        store[key] = store.get(key, 0.0) + time.perf_counter() - t0
        return out
    return wrapped


def stats_ms(values: list[float]) -> dict:
    if not values:
        return {}
    return {"count": len(values), "median": round(statistics.median(values), 3), "first": round(values[0], 3),
            "min": round(min(values), 3), "max": round(max(values), 3), "total_s": round(sum(values) / 1e3, 3)}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm()) if float(b.norm()) > 0 else float((a - b).norm())


# ------------------------------------------------------------------------------ the two sides
def load_diffusers(model: str, device: str, dtype: torch.dtype):
    from diffusers import AutoencoderKLWan, WanPipeline
    vae = AutoencoderKLWan.from_pretrained(model, subfolder="vae", dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(model, vae=vae, dtype=dtype).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def load_ours(model: str, device: str, precision: str):
    from fastvideo3.card.registry import resolve_card
    from fastvideo3.engine import Engine
    return Engine(resolve_card(model), device, precision=precision, keep_latents=True)


def run_diffusers(pipe, a, frames: int, deadline: float, timer: ForwardTimer) -> dict:
    """One whole WanPipeline call; every step's latents kept (on the device) by the step callback."""
    phases: dict[str, float] = {}
    encode, decode = pipe.encode_prompt, pipe.vae.decode
    pipe.encode_prompt = timed_call(a.device, phases, "text_encode_s", encode)
    pipe.vae.decode = timed_call(a.device, phases, "vae_decode_s", decode)
    steps: list[torch.Tensor] = []

    def on_step(p, i, t, kw):
        steps.append(kw["latents"].detach().clone())
        if time.time() > deadline:  # the pipeline skips the remaining steps
            p._interrupt = True
        return {}

    timer.reset()
    try:
        sync(a.device)
        t0 = time.perf_counter()
        out = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=a.height, width=a.width, num_frames=frames,
                   num_inference_steps=a.steps, guidance_scale=a.guidance,
                   generator=torch.Generator().manual_seed(a.seed), output_type="np", callback_on_step_end=on_step)
        frames_np = out.frames[0]
        wall = time.perf_counter() - t0
    finally:
        pipe.encode_prompt, pipe.vae.decode = encode, decode
    fwd = timer.ms()
    per_step = [fwd[2 * i] + fwd[2 * i + 1] for i in range(len(fwd) // 2)] if a.guidance > 1 else fwd
    return {"wall_s": wall, "frames": frames_np, "latents": steps, "steps_done": len(steps),
            "phases": phases, "forward_ms": fwd, "dit_ms_per_step": per_step}


def run_ours(engine, a, frames: int, deadline: float, timer: ForwardTimer) -> dict:
    """One request through the embedded Engine; every step's latents kept by a denoiser observer."""
    from fastvideo3.runtime.scheduling.scheduler import TERMINAL
    steps: list[torch.Tensor] = []
    observer = lambda unit, latent_in, noise, latent_out: steps.append(latent_out.detach().clone())  # noqa: E731
    engine.denoiser.observers.append(observer)
    dit = engine.denoiser._forward_rows  # every step's DiT forward (graph bucket or eager) goes through it
    engine.denoiser._forward_rows = timer.wrap(dit)
    timer.reset()
    try:
        sync(a.device)
        t0 = time.perf_counter()
        run = engine.submit(PROMPT, negative_prompt=NEGATIVE, num_frames=frames, height=a.height, width=a.width,
                            num_inference_steps=a.steps, guidance_scale=a.guidance, seed=a.seed)
        engine.run(until=lambda: run.status in TERMINAL or time.time() > deadline)
        if run.status not in TERMINAL:  # out of time: stop at the next step boundary
            engine.cancel(run.request_id)
            engine.run()
            engine.scheduler.release(run.request_id)
            return {"wall_s": time.perf_counter() - t0, "frames": None, "latents": steps, "steps_done": len(steps),
                    "phases": {}, "forward_ms": timer.ms(), "dit_ms_per_step": timer.ms(), "cancelled": True}
        video = engine.result(run)
        wall = time.perf_counter() - t0
    finally:
        engine.denoiser._forward_rows = dit
        engine.denoiser.observers.remove(observer)
    t = video.metadata["timings_s"]
    fwd = timer.ms()
    return {"wall_s": wall, "frames": video.frames, "latents": steps, "steps_done": len(steps),
            "phases": {"text_encode_s": t.get("text_encode"), "denoise_loop_s": t.get("diffusion_denoise"),
                       "vae_decode_s": t.get("vae_decode")},
            "forward_ms": fwd, "dit_ms_per_step": fwd, "final_latents": video.latents}


@torch.no_grad()
def warm_forwards(pipe, engine, a, frames: int) -> dict:
    """One DiT forward per side at the run's shape (kernel compilation, autotuning, workspaces),
    timed after one untimed call; returns the ms of the second call of each."""
    cfg = pipe.transformer.config
    lat = (cfg.in_channels, (frames - 1) // 4 + 1, a.height // 8, a.width // 8)
    g = torch.Generator(device="cpu").manual_seed(1)
    dtype = pipe.transformer.dtype
    x = torch.randn(2, *lat, generator=g).to(a.device, dtype)
    text = torch.randn(2, engine.card.max_text_tokens, cfg.text_dim, generator=g).to(a.device, dtype)
    t = torch.full((2,), 900.0, device=a.device)
    out = {}
    for name, fn in (("diffusers_forward_ms", lambda: pipe.transformer(hidden_states=x[:1], timestep=t[:1],
                                                                       encoder_hidden_states=text[:1], return_dict=False)),
                     ("ours_forward_2rows_ms", lambda: engine.denoiser._dit(x, t, text))):
        fn()
        timer = ForwardTimer(a.device)
        begin = timer.start()
        fn()
        timer.stop(begin)
        out[name] = round(timer.ms()[0], 3)
    out["decode_warm_s"] = warm_decoders(pipe, engine, a, lat)
    return out


@torch.no_grad()
def warm_decoders(pipe, engine, a, lat: tuple) -> dict:
    """One decode of zeros at the run's latent shape per side, untimed in the run: what a serving
    decoder's warm phase does for its card's shapes (cuDNN tunes each new convolution shape once,
    and keeps the plans per thread, so ours runs on the decoder's own VAE thread, where its decodes
    run). Returns each side's warm-up seconds."""
    out = {}
    z = torch.zeros(1, *lat, device=a.device)
    t0 = time.perf_counter()
    pipe.vae.decode(z.to(pipe.vae.dtype), return_dict=False)
    sync(a.device)
    out["diffusers"] = round(time.perf_counter() - t0, 3)
    dec = engine.decoder
    t0 = time.perf_counter()
    dec.on_vae_thread(dec.vae.decode, z.to(dec.dtype))
    sync(a.device)
    out["ours"] = round(time.perf_counter() - t0, 3)
    return out


def warm_pipelines(pipe, engine, a) -> float:
    """A tiny whole call per side: text encoder, VAE and the loop's code paths, untimed."""
    t0 = time.perf_counter()
    kw = dict(height=min(a.height, 64), width=min(a.width, 64), num_frames=5, num_inference_steps=2,
              guidance_scale=a.guidance)
    pipe(prompt="warm-up", negative_prompt=NEGATIVE, generator=torch.Generator().manual_seed(1), output_type="np", **kw)
    engine.generate("warm-up", negative_prompt=NEGATIVE, seed=1, **kw)
    sync(a.device)
    return round(time.perf_counter() - t0, 2)


# ------------------------------------------------------------------------------ report
def side_report(r: dict) -> dict:
    out = {"wall_s": round(r["wall_s"], 3), "steps_done": r["steps_done"],
           "phases_s": {k: (round(v, 3) if v is not None else None) for k, v in r["phases"].items()},
           "dit_forward_ms": stats_ms(r["forward_ms"]), "dit_ms_per_step": stats_ms(r["dit_ms_per_step"])}
    if r.get("cancelled"):
        out["cancelled_at_time_limit"] = True
    return out


def compare(ours: dict, ref: dict) -> dict:
    n = min(len(ours["latents"]), len(ref["latents"]))
    out: dict = {"steps_compared": n,
                 "latents_rel_fro_after_step": {str(s): rel(ours["latents"][s - 1], ref["latents"][s - 1])
                                                for s in ERROR_STEPS if s <= n}}
    if n:
        out["final_latents_rel_fro"] = rel(ours["latents"][n - 1], ref["latents"][n - 1])
    if ours.get("final_latents") is not None and n:  # the latents the Engine returned = its last step's
        out["engine_latents_equal_last_step"] = bool(torch.equal(ours["final_latents"].cpu(), ours["latents"][n - 1].cpu()))
    if ours.get("frames") is not None and ref.get("frames") is not None:
        d = abs(ours["frames"].astype("float64") - ref["frames"].astype("float64"))
        out["frames_shape"] = list(ours["frames"].shape)
        out["frames_max_abs"] = float(d.max())
        out["frames_mean_abs"] = float(d.mean())
    return out


def model_info(model: str) -> dict:
    root = Path(model)
    t = json.loads((root / "transformer" / "config.json").read_text())
    e = json.loads((root / "text_encoder" / "config.json").read_text())
    v = json.loads((root / "vae" / "config.json").read_text())
    return {"transformer": {k: t[k] for k in ("num_attention_heads", "attention_head_dim", "num_layers", "ffn_dim",
                                              "text_dim") if k in t},
            "text_encoder": {"class": "UMT5EncoderModel (small random stand-in for UMT5-XXL)",
                             **{k: e[k] for k in ("d_model", "num_layers", "d_ff", "num_heads", "vocab_size") if k in e}},
            "vae": {k: v[k] for k in ("base_dim", "z_dim", "dim_mult", "num_res_blocks", "temperal_downsample") if k in v},
            "weights": "random (synthetic.build_wan_dir)"}


def machine(device: str) -> dict:
    info = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "torch": torch.__version__}
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
        from fastvideo3.kernels import attention_available
        info["fa3_available"] = attention_available("fa3", "cuda")
    for mod in ("diffusers", "transformers"):
        info[mod] = __import__(mod).__version__
    return info


# ------------------------------------------------------------------------------ main
def build(path: str, preset: str) -> int:
    from fastvideo3.testing.synthetic_wan import build_wan_dir
    t0 = time.perf_counter()
    root = build_wan_dir(path, preset=preset)
    size = sum(f.stat().st_size for f in Path(root).rglob("*") if f.is_file())
    print(json.dumps({"built": str(root), "preset": preset, "seconds": round(time.perf_counter() - t0, 1),
                      "gib": round(size / 2**30, 2)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=None, help="write a random checkpoint here and exit")
    ap.add_argument("--preset", default="1.3b", help="synthetic preset for --build-dir (1.3b, tiny)")
    ap.add_argument("--model", default=None, help="a diffusers-format Wan2.1 T2V directory")
    ap.add_argument("--device", default=None)
    ap.add_argument("--precision", default=None, help="bf16 on cuda, fp32 on cpu by default")
    add_defaults(ap, frames=81, fallback_frames=33, height=480, width=832, steps=50, guidance=5.0, seed=0)
    ap.add_argument("--time-limit", type=float, default=900.0, help="seconds for the whole script")
    ap.add_argument("--out", default=None)
    ap.add_argument("--decode-only", action="store_true", help="time the VAE decode alone (bench/e2e_decode.py)")
    ap.add_argument("--decode-repeats", type=int, default=2, help="timed calls per decode variant")
    ap.add_argument("--time-chunks", default="1,4,8,20", help="latent frames per decoder call to compare")
    ap.add_argument("--decode-batch", type=int, default=2, help="latents in the batched decode variant")
    a = ap.parse_args(argv)
    if a.build_dir:
        return build(a.build_dir, a.preset)
    if not a.model:
        ap.error("--model (or --build-dir) is required")
    for name, lo, hi in (("decode_repeats", 1, 20), ("decode_batch", 1, 16), ("frames", 1, 257)):
        if not lo <= getattr(a, name) <= hi:
            ap.error(f"--{name.replace('_', '-')} must be in {lo}..{hi}, got {getattr(a, name)}")
    if not all(x.strip().isdigit() and int(x) >= 1 for x in a.time_chunks.split(",")):
        ap.error(f"--time-chunks must be positive integers separated by commas, got {a.time_chunks!r}")
    t_start = time.time()
    deadline = t_start + a.time_limit
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.precision = a.precision or ("bf16" if a.device.startswith("cuda") else "fp32")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[a.precision]
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parts as diffusers' defaults run them
    result: dict = {"command": "python bench/e2e_generation.py " + portable(argv if argv is not None else sys.argv[1:]),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(a.device),
                    "model": model_info(a.model), "precision": a.precision}

    def save() -> None:
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1, default=str) + "\n")

    if a.decode_only:
        from e2e_decode import run_decode_only
        rc = run_decode_only(a, result, save)
        result["wall_s"] = round(time.time() - t_start, 1)
        save()
        return rc
    t0 = time.perf_counter()
    pipe = load_diffusers(a.model, a.device, dtype)
    result["load_s"] = {"diffusers": round(time.perf_counter() - t0, 2)}
    t0 = time.perf_counter()
    engine = load_ours(a.model, a.device, a.precision)
    result["load_s"]["ours"] = round(time.perf_counter() - t0, 2)
    result["ours_pools"] = {k: {f: v.get(f) for f in ("device", "precision", "dit_path") if f in v}
                            for k, v in engine.describe()["pools"].items()}
    result["warmup_s"] = warm_pipelines(pipe, engine, a)
    frames = a.frames
    warm = warm_forwards(pipe, engine, a, frames)
    # the CFG steps: two diffusers forwards and one of ours (both branches) per step, plus 30% and
    # 10 s for text encoding, VAE decoding and the loops; fall back to the smaller clip if it won't fit
    predicted = 1.3 * a.steps * (2 * warm["diffusers_forward_ms"] + warm["ours_forward_2rows_ms"]) / 1e3 + 10
    result["plan"] = {"frames_asked": frames, "warm_forward_ms": warm, "predicted_s": round(predicted, 1),
                      "left_s": round(deadline - time.time(), 1)}
    if predicted > deadline - time.time() - 5 and a.fallback_frames and a.fallback_frames != frames:
        frames = a.fallback_frames
        result["plan"]["fell_back_to"] = frames
        result["plan"]["warm_forward_ms_fallback"] = warm_forwards(pipe, engine, a, frames)
    result["workload"] = {"prompt": PROMPT, "negative_prompt": NEGATIVE, "frames": frames, "height": a.height,
                          "width": a.width, "steps": a.steps, "guidance": a.guidance, "seed": a.seed,
                          "sampler": "unipc (flow_shift 3.0, order 2) on both sides",
                          "cfg": "diffusers: 2 forwards per step; ours: 1 forward over both branches (cfg_policy batched)"}
    save()
    print(json.dumps(result["plan"]), flush=True)

    ref_timer, our_timer = ForwardTimer(a.device), ForwardTimer(a.device)
    ref_timer.hook(pipe.transformer)
    ref = run_diffusers(pipe, a, frames, deadline, ref_timer)
    result["diffusers"] = side_report(ref)
    save()
    print("diffusers", json.dumps(result["diffusers"]), flush=True)
    failures: list = []
    record_unit_failures(failures)
    try:
        ours = run_ours(engine, a, frames, deadline, our_timer)
    except Exception as e:  # noqa: BLE001 - keep diffusers' numbers and the failing units' tracebacks
        result["ours_error"] = {"error": f"{type(e).__name__}: {e}"[:2000], "unit_failures": failures}
        save()
        for f in failures[:1]:
            print(f"first failing unit ({f['kind']}, step {f['step']}):\n{f['traceback']}", flush=True)
        raise
    result["ours"] = side_report(ours)
    result["error_vs_diffusers"] = compare(ours, ref)
    if ours["steps_done"] == ref["steps_done"] == a.steps:
        result["speedup"] = {
            "wall": round(ref["wall_s"] / ours["wall_s"], 3),
            "dit_per_step": round(statistics.median(ref["dit_ms_per_step"]) / statistics.median(ours["dit_ms_per_step"]), 3),
        }
    result["summary"] = decode_summary(engine, ours, ref, a)
    result["wall_s"] = round(time.time() - t_start, 1)
    save()
    print("ours", json.dumps(result["ours"]), flush=True)
    print_table(result)
    engine.close()
    return 0 if "speedup" in result else 1


def decode_summary(engine, ours: dict, ref: dict, a) -> dict:
    """``summary``: our decode time (the Engine's decode loop), diffusers' in the same run, and the
    decode's own frame error (our decoder on diffusers' final latents vs diffusers' frames)."""
    from e2e_decode import GOAL_DECODE_S, decode_parity
    ph_ours, ph_ref = ours["phases"], ref["phases"]
    out = {"vae_decode_s": round(ph_ours["vae_decode_s"], 3) if ph_ours.get("vae_decode_s") is not None else None,
           "diffusers_vae_decode_s": round(ph_ref["vae_decode_s"], 3) if ph_ref.get("vae_decode_s") else None,
           "tolerance_frames_abs": engine.card.parity.vae_bf16_frames_abs,
           "tolerance_frames_mean_abs": engine.card.parity.vae_bf16_frames_mean_abs, "goal_s": GOAL_DECODE_S}
    if ref.get("latents") and ref.get("frames") is not None and len(ref["latents"]) == a.steps:
        out["decode_parity"] = decode_parity(engine, ref["latents"][-1], ref["frames"], a.device)
        p = out["decode_parity"]
        out["within_tolerance"] = (p["frames_max_abs"] <= out["tolerance_frames_abs"]
                                   and p["frames_mean_abs"] <= out["tolerance_frames_mean_abs"])
    if out["vae_decode_s"] is not None:
        out["goal_met"] = out["vae_decode_s"] <= GOAL_DECODE_S
    return out


def print_table(r: dict) -> None:
    w = r["workload"]
    print(f"\n{w['frames']}f {w['width']}x{w['height']}, {w['steps']} steps, guidance {w['guidance']}, {r['precision']}")
    print(f"{'side':<10}{'wall s':>9}{'encode s':>10}{'DiT ms/step':>13}{'VAE s':>8}")
    for side in ("diffusers", "ours"):
        s = r.get(side)
        if s:
            ph = s["phases_s"]
            print(f"{side:<10}{s['wall_s']:>9.2f}{ph.get('text_encode_s') or 0:>10.2f}"
                  f"{s['dit_ms_per_step'].get('median', 0):>13.1f}{ph.get('vae_decode_s') or 0:>8.2f}")
    e = r.get("error_vs_diffusers", {})
    print("speedup:", r.get("speedup"), " final latents rel err:", e.get("final_latents_rel_fro"),
          " frames max abs:", e.get("frames_max_abs"))


if __name__ == "__main__":
    raise SystemExit(main())
