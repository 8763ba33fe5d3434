"""Serving throughput on one device: N concurrent requests with step batching across requests,
then the same N with request-at-a-time dispatch, over the same loaded pools.

    python bench/serving.py --card DIR_OR_CARD --device cuda --out bench/results/serving_h200.json
           [--requests 16 --frames 17 --size 256x256 --steps 8 --guidance 5]
           [--mode fleet|inproc|auto] [--time-limit SECONDS]
    python bench/serving.py --card wan-tiny --device cpu --requests 4      # smoke check (9f 64x64)

``--mode fleet`` (what ``auto`` tries first) starts the real multi-process fleet of
``fastvideo3 serve`` (``fleet.launcher.LocalFleet``): one encoder, one denoiser and one decoder
pool process, all on the one device, and a scheduler process beside them; a second scheduler
over the same pools runs with ``--no-batching --max-running 1`` (request-at-a-time). Clients
are threads in this process, one gRPC Generate stream per request (npy output, so the decoder
pool's encoding cost is a file write, not H.264). ``--mode inproc`` runs the same
CoreScheduler and executors in this process (the embedded Engine), once with batching and once
with ``batching=False`` and ``max_running=1``; ``auto`` falls back to it when the fleet cannot
start, and the JSON says which variant ran.

Each mode gets one warm-up request first (kernel compilation, allocator, codec paths) that is
not timed. All N requests are submitted at once; a request's latency is from that moment to its
result. Throughput is N over the wall time of the burst. The JSON is rewritten after each part.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a source checkout without installing the package
    sys.path.insert(0, str(REPO))

GOAL_SPEEDUP = 4.0
NEGATIVE = "blurry, low quality, static"


def portable(args: list[str]) -> str:
    """A command line with absolute paths cut to their last part (no machine's layout in results)."""
    return " ".join(f"DIR/{Path(x).name}" if x.startswith("/") else x for x in args)


def record_unit_failures(store: list) -> None:
    """Keep the traceback of every WorkUnit an in-process executor fails: the StepResult carries
    only the message, which is not enough to find a fault seen on one machine only."""
    import traceback
    from fastvideo3.runtime import executors
    fail = executors._fail

    def traced(unit, exc):
        if len(store) < 5:
            store.append({"kind": unit.kind, "step": unit.step, "error": f"{type(exc).__name__}: {exc}"[:500],
                          "traceback": traceback.format_exc()[-4000:]})
        return fail(unit, exc)

    executors._fail = traced


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


def summary(latencies: list[float], wall: float, n: int, errors: list[str]) -> dict:
    done = len(latencies)
    return {"requests": n, "completed": done, "wall_s": round(wall, 3),
            "requests_per_s": round(done / wall, 4) if wall > 0 else None,
            "latency_p50_s": round(pct(latencies, 50), 3), "latency_p95_s": round(pct(latencies, 95), 3),
            "latency_max_s": round(max(latencies), 3) if latencies else None, "errors": errors[:5]}


def prompts(n: int, tag: str) -> list[str]:
    """Distinct prompts per mode, so the encoder pool's prompt cache never serves one mode from the
    other's run (the shared negative prompt is cached after the warm-up in both)."""
    things = ["a red circle", "a blue square", "a green triangle", "a yellow star"]
    moves = ["moving left", "moving right", "moving up", "moving down"]
    return [f"{things[i % 4]} {moves[(i // 4) % 4]} on a white background, {tag} take {i}" for i in range(n)]


def request_kw(a) -> dict:
    return dict(negative_prompt=NEGATIVE, num_frames=a.frames, height=a.height, width=a.width,
                num_inference_steps=a.steps, guidance_scale=a.guidance)


# ------------------------------------------------------------------------------ in-process
def run_inproc(a, deadline: float, save) -> dict:
    """The embedded Engine: one set of executors, toggled between the two dispatch modes."""
    from fastvideo3.card.registry import resolve_card
    from fastvideo3.runtime.engine import Engine

    t0 = time.perf_counter()
    engine = Engine(resolve_card(a.card), a.device, batching=True, max_batch=max(16, a.requests))
    out: dict = {"variant": "inproc (embedded Engine: CoreScheduler + executors in one process)",
                 "load_s": round(time.perf_counter() - t0, 2),
                 "pools": {k: {"device": v["device"], "precision": v["precision"], **({"dit_path": v["dit_path"]}
                                                                                    if "dit_path" in v else {})}
                           for k, v in engine.describe()["pools"].items()}}
    kw = request_kw(a)
    failures: list = []
    record_unit_failures(failures)
    try:
        t0 = time.perf_counter()
        engine.generate("warm-up", seed=999, **kw)
        out["warmup_s"] = round(time.perf_counter() - t0, 2)
        for name, batching, max_running in (("step_batching", True, engine.scheduler.max_running),
                                            ("request_at_a_time", False, 1)):
            engine.denoiser.batching = batching
            engine.scheduler.max_running = max_running
            out[name] = _inproc_burst(engine, a, kw, deadline, name)
            out[name]["scheduler"] = {"batching": batching, "max_running": max_running}
            save(out)
    except Exception as e:  # noqa: BLE001 - recorded with the failing units' tracebacks
        out["error"] = f"{type(e).__name__}: {e}"[:3000]
    finally:
        if failures:
            out["unit_failures"] = failures
        engine.close()
    return out


def _inproc_burst(engine, a, kw: dict, deadline: float, tag: str) -> dict:
    before = dict(engine.scheduler.counters)
    fwd_before = dict(engine.denoiser.counters)
    pools = {"encoder": engine.encoder, "denoiser": engine.denoiser, "decoder": engine.decoder}
    busy_before = {r: ex.counters["busy_seconds"] for r, ex in pools.items()}
    finished: dict[str, float] = {}

    def on_event(ev) -> None:
        if ev.kind == "finished":
            finished[ev.request_id] = time.perf_counter()

    t0 = time.perf_counter()
    runs = [engine.submit(p, seed=i, **kw) for i, p in enumerate(prompts(a.requests, tag))]
    engine.run(until=lambda: time.time() > deadline, on_event=on_event)
    wall = time.perf_counter() - t0
    lat, errors = [], []
    for run in runs:
        if run.status == "SUCCEEDED":
            engine.result(run)  # fetch the frames, free the request everywhere
            lat.append(finished[run.request_id] - t0)
        else:
            errors.append(f"{run.request_id}: {run.status} {run.error.message if run.error else 'time limit'}")
            engine.cancel(run.request_id)
    engine.run()
    res = summary(lat, wall, a.requests, errors)
    c = engine.scheduler.counters
    d = engine.denoiser.counters
    batches = c.get("diffusion_step.batches", 0) - before.get("diffusion_step.batches", 0)
    units = c.get("diffusion_step.units", 0) - before.get("diffusion_step.units", 0)
    res["denoise"] = {"batches": int(batches), "units": int(units), "mean_units_per_batch": round(units / max(1, batches), 2),
                      "dit_forwards": int(d["forwards"] - fwd_before["forwards"]),
                      "dit_rows": int(d["rows"] - fwd_before["rows"]), "max_batch_rows": int(d["max_batch_rows"])}
    res["pool_busy_s"] = {r: round(ex.counters["busy_seconds"] - busy_before[r], 3) for r, ex in pools.items()}
    return res


# ------------------------------------------------------------------------------ fleet
def run_fleet(a, deadline: float, save, log_dir: Path) -> dict:
    """The real fleet: pools and schedulers as separate processes on loopback."""
    from fastvideo3.client import FleetClient
    from fleet.launcher import LocalFleet

    common = ["--device-profile", a.device_profile, "--interactive-budget-s", "1e6", "--batch-budget-s", "1e6"]
    fleet = LocalFleet(a.card, roles=("encoder", "denoiser", "decoder"), device=a.device,
                       scheduler_args=common, log_dir=log_dir)
    out: dict = {"variant": "fleet (fleet.launcher.LocalFleet: one process per pool + scheduler processes, gRPC, "
                            "transport auto)"}
    try:
        t0 = time.perf_counter()
        # a fleet that cannot start must leave time for the in-process fallback
        fleet.start(timeout_s=max(10.0, min(120.0, 0.6 * (deadline - time.time()))))
        out["start_s"] = round(time.perf_counter() - t0, 2)
        modes = {"step_batching": (fleet.target, common)}
        alone = ["--no-batching", "--max-running", "1"]
        modes["request_at_a_time"] = (fleet.add_scheduler(common + alone, name="scheduler-request-at-a-time"),
                                      common + alone)
        out["processes"] = {fp.name: "python " + portable(fp.argv[1:]) for fp in fleet.processes()}
        t0 = time.perf_counter()
        with FleetClient(fleet.target, timeout_s=max(5.0, deadline - time.time())) as c:
            c.generate("warm-up", seed=999, output_format="npy", **request_kw(a))
            out["pools"] = _pool_info(c.describe())
        out["warmup_s"] = round(time.perf_counter() - t0, 2)
        save(out)
        for name, (target, flags) in modes.items():
            out[name] = _fleet_burst(target, a, deadline, name)
            out[name]["scheduler_flags"] = flags
            save(out)
    except Exception as e:  # noqa: BLE001 - recorded with the logs' tails; the caller may fall back
        out["error"] = f"{type(e).__name__}: {e}"[:3000]
        out["log_tails"] = {fp.name: fp.log_tail(15) for fp in fleet.processes()}
    finally:
        out["stop_codes"] = fleet.stop()
    return out


def _pool_info(desc: dict) -> dict:
    """Device, precision and DiT path of each pool, from the scheduler's Describe."""
    info = {}
    for name, pool in desc["description"].get("pools", {}).items():
        ex = pool.get("info", {}).get("executor", {})
        info[name] = {"role": pool.get("role"), "device": pool.get("device"), "precision": ex.get("precision"),
                      **({"dit_path": ex["dit_path"]} if "dit_path" in ex else {})}
    return info


def _pool_counters(desc: dict) -> dict[str, dict]:
    return {pool.get("role"): pool.get("counters", {}) for pool in desc["description"].get("pools", {}).values()}


def _fleet_burst(target: str, a, deadline: float, tag: str) -> dict:
    from fastvideo3.client import FleetClient
    with FleetClient(target) as c:
        desc = c.describe()
        before, pools_before = desc["counters"], _pool_counters(desc)
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    kw = request_kw(a)
    t0 = time.perf_counter()

    def one(i: int, prompt: str) -> None:
        try:
            with FleetClient(target, timeout_s=max(1.0, deadline - time.time())) as c:
                c.generate(prompt, seed=i, output_format="npy", **kw)
            with lock:
                lat.append(time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - counted, not fatal
            with lock:
                errors.append(f"{type(e).__name__}: {e}"[:300])

    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts(a.requests, tag))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    res = summary(lat, wall, a.requests, errors)
    with FleetClient(target) as c:
        desc = c.describe()
        after, pools_after = desc["counters"], _pool_counters(desc)
    batches = after.get("diffusion_step.batches", 0) - before.get("diffusion_step.batches", 0)
    units = after.get("diffusion_step.units", 0) - before.get("diffusion_step.units", 0)

    def delta(role: str, key: str) -> float:
        return pools_after.get(role, {}).get(key, 0.0) - pools_before.get(role, {}).get(key, 0.0)

    res["denoise"] = {"batches": int(batches), "units": int(units), "mean_units_per_batch": round(units / max(1, batches), 2),
                      "max_units_per_batch": int(after.get("diffusion_step.max_batch_units", 0)),
                      "dit_forwards": int(delta("denoiser", "forwards")), "dit_rows": int(delta("denoiser", "rows"))}
    res["pool_busy_s"] = {role: round(delta(role, "busy_seconds"), 3) for role in pools_after}
    return res


# ------------------------------------------------------------------------------ main
def machine(device: str) -> dict:
    import torch
    info = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "torch": torch.__version__}
    if device.startswith("cuda") and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
        try:
            from fastvideo3.kernels import attention_available
            info["fa3_available"] = attention_available("fa3", "cuda")
        except Exception:  # noqa: BLE001
            pass
    for mod in ("diffusers", "transformers", "grpc", "google.protobuf", "pydantic"):
        try:
            info[mod] = __import__(mod, fromlist=["__version__"]).__version__
        except Exception:  # noqa: BLE001 - a missing package is simply not listed
            pass
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--card", default="wan-tiny", help="card name, card file or diffusers-format directory")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--frames", type=int, default=None, help="default 17 (9 on a CPU)")
    ap.add_argument("--size", default=None, help="WIDTHxHEIGHT, default 256x256 (64x64 on a CPU)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--guidance", type=float, default=5.0)
    ap.add_argument("--mode", choices=("fleet", "inproc", "auto"), default="auto")
    ap.add_argument("--device-profile", default=None, help="scheduler cost-model prior (default: h200 on cuda)")
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds for the whole script")
    ap.add_argument("--log-dir", default=None, help="fleet process logs (default: a temporary directory)")
    ap.add_argument("--out", default=None, help="JSON file (default: print only)")
    a = ap.parse_args(argv)
    deadline = time.time() + a.time_limit
    import torch
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.device_profile = a.device_profile or ("h200" if a.device.startswith("cuda") else "cpu")
    cpu = not a.device.startswith("cuda")  # a CPU run is a smoke check: a smaller default clip
    a.frames = a.frames or (9 if cpu else 17)
    a.width, a.height = (int(x) for x in (a.size or ("64x64" if cpu else "256x256")).lower().split("x"))
    result: dict = {
        "command": "python bench/serving.py " + portable(argv if argv is not None else sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(a.device),
        "workload": {"card": Path(a.card).name if Path(a.card).exists() else a.card, "requests": a.requests,
                     "frames": a.frames, "size": f"{a.width}x{a.height}", "steps": a.steps,
                     "guidance": a.guidance, "cfg": a.guidance > 1.0, "output_format": "npy"},
    }

    def save(part: dict | None = None) -> None:
        if part is not None:
            result["run"] = part
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1, default=str) + "\n")

    import tempfile
    log_dir = Path(a.log_dir or tempfile.mkdtemp(prefix="fv3-serving-"))
    run: dict = {}
    if a.mode in ("fleet", "auto"):
        run = run_fleet(a, deadline, save, log_dir)
        if "error" in run and a.mode == "auto" and time.time() < deadline - 30:
            result["fleet_attempt"] = run
            save()
            run = {}
    if not run:
        run = run_inproc(a, deadline, save)
    save(run)
    b, s = run.get("step_batching", {}), run.get("request_at_a_time", {})
    if b.get("requests_per_s") and s.get("requests_per_s") and b["completed"] == s["completed"] == a.requests:
        result["speedup"] = round(b["requests_per_s"] / s["requests_per_s"], 2)
        result["goal_speedup"] = GOAL_SPEEDUP
        result["goal_met"] = result["speedup"] >= GOAL_SPEEDUP
    result["wall_s"] = round(time.time() - (deadline - a.time_limit), 1)
    save()
    print(f"\n{run.get('variant', '?')}: {a.requests} requests, {a.frames}f {a.width}x{a.height}, {a.steps} steps, "
          f"guidance {a.guidance}, {a.device}")
    print(f"{'mode':<20}{'done':>6}{'wall s':>9}{'req/s':>9}{'p50 s':>8}{'p95 s':>8}{'batches':>9}{'units/b':>9}")
    for name in ("step_batching", "request_at_a_time"):
        r = run.get(name)
        if r:
            d = r.get("denoise", {})
            print(f"{name:<20}{r['completed']:>6}{r['wall_s']:>9.2f}{r['requests_per_s'] or 0:>9.3f}"
                  f"{r['latency_p50_s']:>8.2f}{r['latency_p95_s']:>8.2f}{d.get('batches', 0):>9}"
                  f"{d.get('mean_units_per_batch', 0):>9.2f}")
    if "error" in run:
        print("ERROR:", run["error"][:1000])
    for f in run.get("unit_failures", [])[:1]:
        print(f"first failing unit ({f['kind']}, step {f['step']}):\n{f['traceback']}")
    print("speedup:", result.get("speedup"), "goal", GOAL_SPEEDUP)
    return 0 if "speedup" in result else 1


if __name__ == "__main__":
    raise SystemExit(main())
