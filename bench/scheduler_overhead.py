"""Scheduler overhead and step-batching throughput, on loopback.

(a) Per-WorkUnit scheduling overhead: the core scheduler in this process drives no-op pools
    (``--fake``: results without math) in separate processes over gRPC, exactly as the
    scheduler service does. Each tick's wall time divided by the units it ran is one sample
    (planning + conversion + the Execute RPC + folding results back); p50/p99 in µs for one
    request at a time (one unit per tick) and for many concurrent requests (one batch per
    tick). The same loop over in-process no-op executors gives the pure-Python share.
(b) Throughput of N concurrent tiny-model (wan-tiny) requests through a real fleet, with step
    batching vs. without it vs. request-at-a-time (``--no-batching --max-running 1``): three
    schedulers over the same pools, run one after the other.

    python bench/scheduler_overhead.py [--requests 8 --steps 50 --frames 9 --size 64x64]
                                       [--overhead-requests 32 --overhead-steps 50] [--out FILE]

Prints a table and writes JSON (with the command line) to bench/results/scheduler_overhead_cpu.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


# ----------------------------------------------------------------------------------- (a)
def _drive(executors: dict, n_requests: int, steps: int) -> dict:
    from fastvideo3.card import get_card
    from fastvideo3.request.schema import GenerateRequest, resolve
    from fastvideo3.runtime.scheduling.scheduler import CoreScheduler
    card = get_card("wan-tiny")
    sched = CoreScheduler(executors, max_batch=max(16, n_requests), parallel_dispatch=True)
    t_start = time.perf_counter()
    for i in range(n_requests):
        req = resolve(GenerateRequest(prompt=f"p{i}", num_inference_steps=steps, num_frames=9, height=64, width=64,
                                      request_id=f"bench-{time.time_ns()}-{i}"), card)
        sched.submit(req, card, ctx={"encode": "npy"})
    per_unit, units, busy = [], 0, 0.0
    while sched.active():
        before = sched.counters["units"]
        t0 = time.perf_counter()
        sched.tick()
        dt = time.perf_counter() - t0
        n = sched.counters["units"] - before
        if n:
            per_unit.append(dt / n * 1e6)
            units += n
            busy += dt
    wall = time.perf_counter() - t_start
    for run in list(sched.runs.values()):
        sched.release(run.request_id)
    sched.close()
    return {"requests": n_requests, "steps": steps, "units": units, "wall_s": round(wall, 4),
            "us_per_unit_p50": round(pct(per_unit, 50), 1), "us_per_unit_p99": round(pct(per_unit, 99), 1),
            "us_per_unit_mean": round(statistics.fmean(per_unit), 1), "units_per_s": round(units / busy, 1)}


def overhead(n_concurrent: int, steps: int, log_dir: Path) -> dict:
    from fastvideo3.card import get_card
    from fleet.launcher import LocalFleet
    from services.common.fake import FakeExecutor
    from services.scheduler.remote import RemoteExecutor

    class _NullTransport:
        def stats(self):
            return {}

    card = get_card("wan-tiny")
    local = {r: [FakeExecutor(r, card, _NullTransport())] for r in ("encoder", "denoiser", "decoder")}
    out = {"inproc_serial": _drive(local, 1, steps), "inproc_concurrent": _drive(local, n_concurrent, steps)}
    fleet = LocalFleet("wan-tiny", roles=(), fake=True, log_dir=log_dir)
    try:
        pools = {r: fleet.spawn_pool(r) for r in ("encoder", "denoiser", "decoder")}
        remote = {r: [RemoteExecutor(r, p.target, rpc_timeout_s=30)] for r, p in pools.items()}
        for reps in remote.values():  # a replica serves once a health check has seen it SERVING
            if not all(rep.check_health(timeout=10) for rep in reps):
                raise RuntimeError(f"a no-op pool is not serving: {[rep.target for rep in reps]}")
        _drive(remote, 2, 5)  # warm the channels
        out["grpc_serial"] = _drive(remote, 1, steps)
        out["grpc_concurrent"] = _drive(remote, n_concurrent, steps)
        for reps in remote.values():
            for rep in reps:
                rep.close()
    finally:
        fleet.stop()
    return out


# ----------------------------------------------------------------------------------- (b)
def _burst(target: str, n: int, kw: dict) -> dict:
    from fastvideo3.client import FleetClient
    lat: list[float] = []
    errors: list[str] = []

    def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            with FleetClient(target, timeout_s=900) as c:
                c.generate(f"a red circle {i}", seed=i, output_format="npy", **kw)
            lat.append(time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 3), "requests_per_s": round(n / wall, 4), "latency_p50_s": round(pct(lat, 50), 3),
            "latency_max_s": round(max(lat) if lat else float("nan"), 3), "errors": errors}


def throughput(n: int, steps: int, frames: int, width: int, height: int, log_dir: Path) -> dict:
    from fastvideo3.client import FleetClient
    from fleet.launcher import LocalFleet
    from tests.fleet_fixture import pool_describe
    kw = dict(num_inference_steps=steps, num_frames=frames, width=width, height=height)
    modes = {"step_batching": [], "no_batching": ["--no-batching"],
             "request_at_a_time": ["--no-batching", "--max-running", "1"]}
    fleet = LocalFleet("wan-tiny", roles=("encoder", "denoiser", "decoder"), log_dir=log_dir)
    out = {}
    try:
        fleet.start(timeout_s=300)
        targets = {"step_batching": fleet.target}
        for name, args in modes.items():
            if name not in targets:
                targets[name] = fleet.add_scheduler(args, name=f"scheduler-{name}")
        _burst(fleet.target, 1, dict(kw, num_inference_steps=1))  # warm every pool once
        def busy() -> dict[str, float]:
            return {role: sum(pool_describe(p.target).counters.get("busy_seconds", 0.0) for p in procs)
                    for role, procs in fleet.pools.items()}

        for name, target in targets.items():
            before = busy()
            res = _burst(target, n, kw)
            after = busy()
            res["pool_busy_s"] = {role: round(after[role] - before[role], 3) for role in after}
            with FleetClient(target) as c:
                cnt = c.describe()["counters"]
            res["denoise_batches"] = int(cnt.get("diffusion_step.batches", 0))
            res["denoise_units"] = int(cnt.get("diffusion_step.units", 0))
            res["denoise_mean_batch"] = round(res["denoise_units"] / max(1, res["denoise_batches"]), 2)
            res["denoise_max_batch"] = int(cnt.get("diffusion_step.max_batch_units", 0))
            out[name] = res
    finally:
        fleet.stop()
    base = out["request_at_a_time"]["requests_per_s"]
    for res in out.values():
        res["speedup_vs_request_at_a_time"] = round(res["requests_per_s"] / base, 2) if base else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--frames", type=int, default=9)
    p.add_argument("--size", default="64x64")
    p.add_argument("--overhead-requests", type=int, default=32)
    p.add_argument("--overhead-steps", type=int, default=50)
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "scheduler_overhead_cpu.json"))
    a = p.parse_args(argv)
    width, height = (int(x) for x in a.size.lower().split("x"))
    import tempfile
    logs = Path(tempfile.mkdtemp(prefix="fv3-bench-"))
    result: dict = {
        "command": " ".join(["python bench/scheduler_overhead.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "unix_time": int(time.time()),
    }
    try:
        import torch
        result["machine"]["torch"] = torch.__version__
    except ImportError:
        pass
    if not a.skip_overhead:
        result["overhead"] = overhead(a.overhead_requests, a.overhead_steps, logs / "overhead")
        print("\n(a) scheduling overhead per WorkUnit (no-op pools)")
        print(f"{'mode':<20}{'requests':>9}{'units':>8}{'p50 µs':>10}{'p99 µs':>10}{'units/s':>10}")
        for name, r in result["overhead"].items():
            print(f"{name:<20}{r['requests']:>9}{r['units']:>8}{r['us_per_unit_p50']:>10.0f}"
                  f"{r['us_per_unit_p99']:>10.0f}{r['units_per_s']:>10.0f}")
    if not a.skip_throughput:
        result["throughput"] = throughput(a.requests, a.steps, a.frames, width, height, logs / "throughput")
        result["throughput_request"] = {"requests": a.requests, "steps": a.steps, "frames": a.frames,
                                        "size": f"{width}x{height}", "card": "wan-tiny"}
        print(f"\n(b) {a.requests} concurrent wan-tiny requests ({a.frames} frames {width}x{height}, {a.steps} steps)")
        print(f"{'mode':<20}{'wall s':>8}{'req/s':>8}{'p50 s':>8}{'batches':>9}{'mean b':>8}{'speedup':>9}"
              f"{'denoise busy s':>16}{'decode busy s':>15}")
        for name, r in result["throughput"].items():
            print(f"{name:<20}{r['wall_s']:>8.2f}{r['requests_per_s']:>8.3f}{r['latency_p50_s']:>8.2f}"
                  f"{r['denoise_batches']:>9}{r['denoise_mean_batch']:>8.2f}{r['speedup_vs_request_at_a_time']:>9.2f}"
                  f"{r['pool_busy_s']['denoiser']:>16.2f}{r['pool_busy_s']['decoder']:>15.2f}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
