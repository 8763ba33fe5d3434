"""The workloads of bench/serving.py: closed bursts, the mixed workload and the open-loop run
through the real fleet, diffusers' WanPipeline one request at a time, and the bf16 matmul peak.

A burst submits its requests at once (one gRPC Generate stream per request, npy output) and
measures each request's latency from its submission to its result; the open-loop run submits each
request at its Poisson arrival time instead. Pool counters (busy seconds, DiT rows) are read from
the scheduler's Describe before and after, so a part's numbers are its own.
"""
from __future__ import annotations

import random
import threading
import time

NEGATIVE = "blurry, low quality, static"


def prompts(n: int, tag: str) -> list[str]:
    """Distinct prompts per part, so the encoder pool's prompt cache never serves one part from
    another's run (the shared negative prompt is cached after the warm-up in all of them)."""
    things = ["a red circle", "a blue square", "a green triangle", "a yellow star"]
    moves = ["moving left", "moving right", "moving up", "moving down"]
    return [f"{things[i % 4]} {moves[(i // 4) % 4]} on a white background, {tag} take {i}" for i in range(n)]


#: the file every request asks for (``--output-format``): an mp4, what a user gets by default, or
#: the float32 frames as npy (13 MB a 17x256^2 clip: the reply's transfer is then measured too)
OUTPUT = {"format": "mp4"}


def request_kw(frames: int, width: int, height: int, steps: int, guidance: float) -> dict:
    return dict(negative_prompt=NEGATIVE, num_frames=frames, height=height, width=width,
                num_inference_steps=steps, guidance_scale=guidance)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


def latency_stats(lat: list[float]) -> dict:
    if not lat:
        return {"completed": 0, "latency_p50_s": None, "latency_p95_s": None, "latency_max_s": None,
                "latency_mean_s": None}
    return {"completed": len(lat), "latency_p50_s": round(pct(lat, 50), 3), "latency_p95_s": round(pct(lat, 95), 3),
            "latency_max_s": round(max(lat), 3) if lat else None,
            "latency_mean_s": round(sum(lat) / len(lat), 3) if lat else None}


# ------------------------------------------------------------------------------ counters
def _pool_counters(desc: dict) -> dict[str, dict]:
    """Per role: the pool's own counters, and (prefixed ``scheduler.``) the scheduler's counters of
    its calls to that pool."""
    out = {}
    for pool in desc["description"].get("pools", {}).values():
        c = dict(pool.get("counters", {}))
        c.update({f"scheduler.{k}": v for k, v in (pool.get("remote_counters") or {}).items()})
        out[pool.get("role")] = c
    return out


def snapshot(target: str) -> tuple[dict, dict]:
    from fastvideo3.client import FleetClient
    with FleetClient(target) as c:
        desc = c.describe()
    return desc["counters"], _pool_counters(desc)


def deltas(before: tuple[dict, dict], after: tuple[dict, dict]) -> dict:
    (c0, p0), (c1, p1) = before, after

    def pool(role: str, key: str) -> float:
        return p1.get(role, {}).get(key, 0.0) - p0.get(role, {}).get(key, 0.0)

    batches = c1.get("diffusion_step.batches", 0) - c0.get("diffusion_step.batches", 0)
    units = c1.get("diffusion_step.units", 0) - c0.get("diffusion_step.units", 0)
    return {"denoise": {"batches": int(batches), "units": int(units),
                        "mean_units_per_batch": round(units / max(1, batches), 2),
                        "dit_forwards": int(pool("denoiser", "forwards")), "dit_rows": int(pool("denoiser", "rows")),
                        # how the forwards ran: graph replays (several for a cover of the rows), eagerly,
                        # and the rows of padding the replays computed and discarded
                        "dit_graph_forwards": int(pool("denoiser", "graph_forwards")),
                        "dit_eager_forwards": int(pool("denoiser", "eager_forwards")),
                        "dit_cover_replays": int(pool("denoiser", "cover_forwards")),
                        "dit_padding_rows": int(pool("denoiser", "padding_rows")),
                        # device time of the DiT forwards (CUDA events), against the denoiser's busy time
                        "dit_forward_device_s": round(pool("denoiser", "forward_device_seconds"), 3),
                        # cohorts: rounds whose denoise group the cap cut, and the cap (units; 0: none)
                        "cohort_capped_rounds": int(c1.get("cohort_capped_batches", 0) - c0.get("cohort_capped_batches", 0)),
                        "cohort_cap_units": int(c1.get("cohort_cap_units", 0))},
            "decode": {"batches": int(c1.get("vae_tile.batches", 0) - c0.get("vae_tile.batches", 0)),
                       "units": int(c1.get("vae_tile.units", 0) - c0.get("vae_tile.units", 0)),
                       "vae_calls": int(pool("decoder", "decode_calls")),
                       # where a decode batch's time goes: the VAE calls, publishing and encoding each
                       # request's frames, the Execute reply, and the scheduler's Execute call and result reads
                       "seconds": {k: round(pool("decoder", c), 3) for k, c in (
                           ("vae", "decode_seconds"), ("publish", "publish_seconds"), ("encode", "encode_seconds"),
                           ("reply_build", "rpc.reply_build_seconds"), ("scheduler_rpc", "scheduler.rpc_seconds"),
                           ("scheduler_results", "scheduler.results_seconds"))}},
            "pool_busy_s": {role: round(pool(role, "busy_seconds"), 3) for role in p1}}


# ------------------------------------------------------------------------------ fleet parts
def submit(target: str, jobs: list[tuple[float, str, int, dict]], deadline: float) -> dict:
    """Run ``jobs`` = ``[(delay_s, prompt, seed, kw)]``, each submitted ``delay_s`` after the
    start (0 for a burst). Returns per job ``(submitted_s, finished_s | None, error | None)``
    relative to the start, the wall time and the window in epoch nanoseconds."""
    from fastvideo3.client import FleetClient
    out: list = [None] * len(jobs)
    t0, t0_ns = time.perf_counter(), time.time_ns()

    def one(i: int, delay: float, prompt: str, seed: int, kw: dict) -> None:
        wait = delay - (time.perf_counter() - t0)
        if wait > 0:
            time.sleep(wait)
        sub = time.perf_counter() - t0
        try:
            with FleetClient(target, timeout_s=max(1.0, deadline - time.time())) as c:
                c.generate(prompt, seed=seed, output_format=OUTPUT["format"], **kw)
            out[i] = (sub, time.perf_counter() - t0, None)
        except Exception as e:  # noqa: BLE001 - counted, not fatal
            out[i] = (sub, None, f"{type(e).__name__}: {e}"[:300])

    threads = [threading.Thread(target=one, args=(i, *job), daemon=True) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.time()))
    wall = time.perf_counter() - t0
    return {"results": [r if r is not None else (None, None, "time limit") for r in out], "wall_s": wall,
            "t0_ns": t0_ns, "t1_ns": time.time_ns()}


def burst(target: str, n: int, kw: dict, tag: str, deadline: float) -> dict:
    """``n`` requests at once: throughput over the burst's wall, latency per request."""
    before = snapshot(target)
    run = submit(target, [(0.0, p, i, kw) for i, p in enumerate(prompts(n, tag))], deadline)
    after = snapshot(target)
    lat = [f - s for s, f, e in run["results"] if f is not None]
    errors = [e for _, _, e in run["results"] if e]
    wall = run["wall_s"]
    return {"requests": n, "wall_s": round(wall, 3), "requests_per_s": round(len(lat) / wall, 4) if wall > 0 else None,
            **latency_stats(lat), "errors": errors[:5], **deltas(before, after),
            "window_ns": [run["t0_ns"], run["t1_ns"]]}


def mixed(target: str, a, deadline: float) -> dict:
    """``--mixed-small`` small requests and ``--mixed-large`` large ones: each kind alone, then
    together; the large ones' latency against running alone, the small ones' against theirs."""
    small = request_kw(a.frames, a.width, a.height, a.mixed_steps, a.guidance)
    large = request_kw(a.large_frames, a.large_width, a.large_height, a.mixed_steps, a.guidance)
    out: dict = {"small": {"requests": a.mixed_small, "frames": a.frames, "size": f"{a.width}x{a.height}"},
                 "large": {"requests": a.mixed_large, "frames": a.large_frames,
                           "size": f"{a.large_width}x{a.large_height}"}, "steps": a.mixed_steps}
    out["small_alone"] = burst(target, a.mixed_small, small, "mixed-small", deadline)
    out["large_alone"] = burst(target, a.mixed_large, large, "mixed-large", deadline)
    jobs = [(0.0, p, i, large) for i, p in enumerate(prompts(a.mixed_large, "mix-large"))]
    jobs += [(0.0, p, 100 + i, small) for i, p in enumerate(prompts(a.mixed_small, "mix-small"))]
    before = snapshot(target)
    run = submit(target, jobs, deadline)
    res = run["results"]
    lat_l = [f - s for s, f, e in res[: a.mixed_large] if f is not None]
    lat_s = [f - s for s, f, e in res[a.mixed_large:] if f is not None]
    out["together"] = {"wall_s": round(run["wall_s"], 3), "large": latency_stats(lat_l), "small": latency_stats(lat_s),
                       "errors": [e for _, _, e in res if e][:5], **deltas(before, snapshot(target)),
                       "window_ns": [run["t0_ns"], run["t1_ns"]]}
    la, sa = out["large_alone"].get("latency_mean_s"), out["small_alone"].get("latency_mean_s")
    lt, st = out["together"]["large"].get("latency_mean_s"), out["together"]["small"].get("latency_mean_s")
    out["large_latency_ratio_vs_alone"] = round(lt / la, 3) if la and lt else None
    out["small_latency_ratio_vs_alone"] = round(st / sa, 3) if sa and st else None
    return out


def poisson_schedule(rate: float, duration_s: float, seed: int) -> list[float]:
    """Arrival times of a Poisson process of ``rate`` per second over ``[0, duration_s)``."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        out.append(t)


def open_loop(target: str, a, rate: float, steps_list: list[int], deadline: float) -> dict:
    """Poisson arrivals at ``rate`` for ``a.open_loop_s`` seconds, each request's step count drawn
    from ``steps_list``. The steady state is from ``a.open_loop_warm_s`` to the last arrival; the
    denoiser's busy seconds over it come from counter snapshots at its two ends."""
    arrivals = poisson_schedule(rate, a.open_loop_s, a.seed)
    rng = random.Random(a.seed + 1)
    steps = [rng.choice(steps_list) for _ in arrivals]
    jobs = [(t, p, 1000 + i, request_kw(a.frames, a.width, a.height, s, a.guidance))
            for i, (t, p, s) in enumerate(zip(arrivals, prompts(len(arrivals), "open-loop"), steps))]
    steady = (min(a.open_loop_warm_s, a.open_loop_s / 4), arrivals[-1] if arrivals else a.open_loop_s)
    marks: dict = {}

    def mark() -> None:  # counter snapshots at the steady state's two ends
        start = time.perf_counter()
        for name, at in (("start", steady[0]), ("end", steady[1])):
            time.sleep(max(0.0, at - (time.perf_counter() - start)))
            marks[name] = (time.perf_counter() - start, snapshot(target))

    th = threading.Thread(target=mark, daemon=True)
    th.start()
    run = submit(target, jobs, deadline)
    th.join(timeout=5)
    res = run["results"]
    lat = [f - s for s, f, e in res if f is not None and steady[0] <= s <= steady[1]]
    out = {"rate_per_s": round(rate, 4), "duration_s": a.open_loop_s, "arrivals": len(arrivals),
           "steps_choices": steps_list, "steady_window_s": [round(x, 2) for x in steady],
           "completed": sum(f is not None for _, f, _ in res), "errors": [e for _, _, e in res if e][:5],
           "wall_s": round(run["wall_s"], 3), "steady": latency_stats(lat),
           "by_steps": {str(s): latency_stats([f - t for (t, f, e), k in zip(res, steps) if f is not None and k == s])
                        for s in sorted(set(steps_list))},
           "window_ns": [run["t0_ns"] + int(steady[0] * 1e9), run["t0_ns"] + int(steady[1] * 1e9)]}
    if "start" in marks and "end" in marks:
        (ta, sa), (tb, sb) = marks["start"], marks["end"]
        d = deltas(sa, sb)
        out["steady_counters"] = d
        out["denoiser_utilization_counters"] = round(d["pool_busy_s"].get("denoiser", 0.0) / max(1e-9, tb - ta), 4)
    return out


# ------------------------------------------------------------------------------ diffusers
def diffusers_column(model_dir: str, device: str, n: int, kw: dict, deadline: float) -> dict:
    """diffusers' ``WanPipeline`` on the same weights and workload, one request at a time (its
    VAE in fp32, as Wan's pipeline runs it), each request's frames encoded as the fleet's are
    (``OUTPUT``: the same file by the same encoder); one untimed warm-up call first."""
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    t0 = time.perf_counter()
    vae = AutoencoderKLWan.from_pretrained(model_dir, subfolder="vae", dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(model_dir, vae=vae, dtype=dtype).to(device)
    pipe.set_progress_bar_config(disable=True)
    from fastvideo3.runtime.pool.vae_executor import encode_media
    out: dict = {"load_s": round(time.perf_counter() - t0, 2), "dtype": str(dtype).replace("torch.", ""),
                 "vae_dtype": "float32", "requests": n, "output_format": OUTPUT["format"]}
    call = dict(negative_prompt=kw["negative_prompt"], num_frames=kw["num_frames"], height=kw["height"],
                width=kw["width"], num_inference_steps=kw["num_inference_steps"], guidance_scale=kw["guidance_scale"],
                output_type="np")
    try:
        t0 = time.perf_counter()
        pipe(prompt="warm-up", generator=torch.Generator().manual_seed(999), **call)
        out["warmup_s"] = round(time.perf_counter() - t0, 2)
        lat = []
        t0 = time.perf_counter()
        for i, p in enumerate(prompts(n, "diffusers")):
            if time.time() > deadline:
                break
            s = time.perf_counter()
            frames = pipe(prompt=p, generator=torch.Generator().manual_seed(i), **call).frames[0]
            encode_media(frames, OUTPUT["format"], 16)  # the file our fleet returns, by the same encoder
            lat.append(time.perf_counter() - s)
        wall = time.perf_counter() - t0
        # one at a time: the i-th request's latency (all submitted at once) is the sum of those before it
        queued = [sum(lat[: i + 1]) for i in range(len(lat))]
        out.update({"wall_s": round(wall, 3), "requests_per_s": round(len(lat) / wall, 4) if lat else None,
                    "service_s_mean": round(sum(lat) / len(lat), 3) if lat else None, **latency_stats(queued)})
    finally:
        del pipe
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out


def matmul_peak(device: str) -> dict:
    """The matmul rate this device reaches in the DiT's precision: bf16 8192^3 on CUDA (median of
    10), fp32 1024^3 on a CPU (median of 3; the CPU DiT runs fp32)."""
    import torch
    cuda = device.startswith("cuda")
    n, dtype = (8192, torch.bfloat16) if cuda else (1024, torch.float32)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10 if cuda else 3):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    s = sorted(times)[len(times) // 2]
    return {"shape": f"{n}^3 {str(dtype).replace('torch.', '')}", "s": round(s, 6), "flops_per_s": 2 * n**3 / s,
            "tflops": round(2 * n**3 / s / 1e12, 2)}
