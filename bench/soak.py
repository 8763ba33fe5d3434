"""Soak: a fleet of no-op pools under steady load for a set time while a denoiser replica is
SIGKILLed and relaunched periodically (RELIABILITY 15).

The fleet: encoder, two denoisers and decoder with ``--fake`` (no model math; each unit sleeps
``--step-seconds``), and a scheduler with step batching off (so each unit costs one step time
and the denoise capacity is ``replicas / (steps * step_seconds)`` requests per second) that
checkpoints every step. Requests arrive open-loop (Poisson) at ``--load`` times that capacity.
Every ``--kill-every`` seconds one denoiser (alternating) is SIGKILLed and started again on
the same port; its in-flight requests resume on the other replica from their snapshots.

Reported: success rate (overall, and outside the killed pool's in-flight requests), latency
percentiles, failures by code; per kill the relaunch time and the time until the scheduler
routes to the replica again; RSS and thread count of the scheduler and of the pools that were
never killed, sampled every ``--sample-every`` seconds (first, last, max, growth).

    python bench/soak.py --duration 600 --kill-every 120 --out bench/results/soak_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def pct(values: list[float], q: float) -> float | None:
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))], 4) if s else None


def proc_stats(pid: int) -> dict[str, int]:
    """RSS (KiB) and thread count of a process, from /proc."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_kib"] = int(line.split()[1])
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    except OSError:
        pass
    return out


def summarize(series: list[dict], key: str, warmup: int = 1) -> dict:
    vals = [s[key] for s in series if key in s]
    if not vals:
        return {}
    base = vals[min(warmup, len(vals) - 1)]  # after the first sample: imports and warm-up done
    mid = vals[len(vals) // 2]
    # the second half shows whether growth levels off (thread pools and the bounded record of
    # finished requests fill up early) or keeps going (a leak)
    return {"first": vals[0], "after_warmup": base, "mid": mid, "last": vals[-1], "max": max(vals),
            "growth_after_warmup": vals[-1] - base, "growth_second_half": vals[-1] - mid, "samples": len(vals)}


class Soak:
    def __init__(self, args):
        self.args = args
        self.results: list[dict] = []
        self.kills: list[dict] = []
        self.samples: dict[str, list[dict]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.killing: dict | None = None  # the kill in progress: which replica, when

    def capacity(self) -> float:
        a = self.args
        return a.denoisers / (a.steps * a.step_seconds)

    def one(self, i: int) -> None:
        from fastvideo3.client import FleetClient
        from fastvideo3.errors import FastVideoError
        a = self.args
        rid = f"soak-{i}"
        t0 = time.monotonic()
        rec = {"id": rid, "t": round(t0 - self.t_start, 3)}
        try:
            with FleetClient(self.fleet.target, timeout_s=a.request_timeout) as c:
                c.generate("soak", request_id=rid, num_inference_steps=a.steps, output_format="npy",
                           num_frames=9, height=32, width=32, seed=i)
            rec["ok"] = True
        except FastVideoError as e:
            rec.update(ok=False, code=e.code, message=e.message[:200])
        rec["latency_s"] = round(time.monotonic() - t0, 4)
        rec["end"] = round(time.monotonic() - self.t_start, 3)
        with self.lock:
            self.results.append(rec)

    def sampler(self) -> None:
        while not self.stop.wait(self.args.sample_every):
            self.sample()

    def sample(self) -> None:
        now = round(time.monotonic() - self.t_start, 2)
        for p in self.fleet.processes():
            if p.proc is None or p.proc.poll() is not None:
                continue
            s = proc_stats(p.proc.pid)
            if s:
                self.samples.setdefault(f"{p.name}#{p.proc.pid}", []).append({"t": now, **s})

    def killer(self) -> None:
        n = 0
        while not self.stop.wait(self.args.kill_every):
            fp = self.fleet.pools["denoiser"][n % len(self.fleet.pools["denoiser"])]
            n += 1
            t_kill = time.monotonic()
            with self.lock:
                self.killing = {"replica": fp.name, "t_kill": t_kill}
            self.fleet.kill(fp)
            t_dead = time.monotonic()
            self.fleet.restart(fp, timeout_s=120)
            t_serving = time.monotonic()
            rejoined = None
            while time.monotonic() - t_serving < 30:
                if self.pool_health().get(fp.target):
                    rejoined = time.monotonic()
                    break
                time.sleep(0.05)  # polling a status with a deadline (a benchmark, not a test)
            self.kills.append({"replica": fp.name, "at_s": round(t_kill - self.t_start, 2),
                               "relaunch_to_serving_s": round(t_serving - t_dead, 3),
                               "kill_to_routed_again_s": round(rejoined - t_kill, 3) if rejoined else None})
            with self.lock:
                self.killing = None

    def describe(self) -> dict:
        from fastvideo3.client import FleetClient
        with FleetClient(self.fleet.target) as c:
            return c.describe()

    def pool_health(self) -> dict[str, bool]:
        return {p["address"]: bool(p.get("healthy", False)) for p in self.describe().get("pools", [])}

    def run(self) -> dict:
        from fleet.launcher import LocalFleet
        a = self.args
        self.fleet = LocalFleet("wan-tiny-seeded", fake=True, roles=("encoder", "denoiser", "decoder"),
                                replicas={"denoiser": a.denoisers},
                                pool_args={"denoiser": ["--fake-step-seconds", str(a.step_seconds)]},
                                scheduler_args=["--no-batching", "--health-interval", "0.5", "--health-timeout", "0.5",
                                                "--checkpoint-every", "1", "--interactive-budget-s", "1e9",
                                                "--batch-budget-s", "1e9"])
        self.fleet.start(timeout_s=240)
        rate = a.load * self.capacity()
        rng = random.Random(0)
        self.t_start = time.monotonic()
        threads = [threading.Thread(target=self.sampler, daemon=True)]
        if a.kill_every > 0:
            threads.append(threading.Thread(target=self.killer, daemon=True))
        for t in threads:
            t.start()
        self.sample()
        n = 0
        with ThreadPoolExecutor(max_workers=a.clients) as pool:
            next_at = self.t_start
            while time.monotonic() - self.t_start < a.duration:
                next_at += rng.expovariate(rate)
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # the arrival process itself, not synchronization
                pool.submit(self.one, n)
                n += 1
            self.stop.set()
        for t in threads:
            t.join(timeout=180)
        self.sample()
        counters = self.describe()["counters"]
        self.fleet.stop()
        return self.report(rate, counters)

    def report(self, rate: float, counters: dict) -> dict:
        a = self.args
        res = self.results
        ok = [r for r in res if r["ok"]]
        failed = [r for r in res if not r["ok"]]
        codes: dict[str, int] = {}
        for r in failed:
            codes[r["code"]] = codes.get(r["code"], 0) + 1
        # requests in flight on a killed replica: those whose lifetime spans a kill
        spans = [(k["at_s"], k["at_s"] + 1.0) for k in self.kills]
        hit = [r for r in res if any(r["t"] <= s <= r["end"] for s, _ in spans)]
        outside = [r for r in res if r not in hit]
        lat = [r["latency_s"] for r in ok]
        never_killed = {k: v for k, v in self.samples.items() if not k.startswith("denoiser")}
        return {
            "command": "python bench/soak.py " + " ".join(sys.argv[1:]),
            "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "config": {"duration_s": a.duration, "load": a.load, "capacity_req_per_s": round(self.capacity(), 3),
                       "arrival_rate_req_per_s": round(rate, 3), "steps": a.steps, "step_seconds": a.step_seconds,
                       "denoisers": a.denoisers, "kill_every_s": a.kill_every, "fake_pools": True,
                       "batching": False, "checkpoint_every": 1},
            "requests": {"total": len(res), "succeeded": len(ok), "failed": len(failed), "failed_by_code": codes,
                         "success_rate": round(len(ok) / len(res), 5) if res else None,
                         "in_flight_across_a_kill": len(hit),
                         "succeeded_across_a_kill": sum(r["ok"] for r in hit),
                         "success_rate_outside_kills": (round(sum(r["ok"] for r in outside) / len(outside), 5)
                                                        if outside else None),
                         "throughput_req_per_s": round(len(ok) / a.duration, 3),
                         "latency_s": {"p50": pct(lat, 50), "p95": pct(lat, 95), "p99": pct(lat, 99),
                                       "max": max(lat) if lat else None}},
            "kills": self.kills,
            "recovery": {"relaunch_to_serving_s_max": max((k["relaunch_to_serving_s"] for k in self.kills),
                                                          default=None),
                         "kill_to_routed_again_s_max": max((k["kill_to_routed_again_s"] or 0 for k in self.kills),
                                                           default=None),
                         "requests_moved_to_another_replica": counters.get("state.recovered"),
                         "recoveries_failed": counters.get("state.recovery_failed")},
            "processes": {name: {"rss_kib": summarize(s, "rss_kib"), "threads": summarize(s, "threads")}
                          for name, s in never_killed.items()},
            "scheduler_counters": {k: v for k, v in counters.items()
                                   if k.startswith("state.") or k in ("admitted", "succeeded", "failed", "cancelled",
                                                                      "refused", "tick_errors")},
            "first_failures": failed[:10],
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--load", type=float, default=0.8, help="arrival rate as a fraction of denoise capacity")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--denoisers", type=int, default=2)
    p.add_argument("--kill-every", type=float, default=120.0, help="seconds between denoiser kills (0 = never)")
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=64, help="client threads (bounds requests in flight)")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--out", default=None, help="write the JSON report here")
    args = p.parse_args()
    report = Soak(args).run()
    text = json.dumps(report, indent=2, sort_keys=True)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
