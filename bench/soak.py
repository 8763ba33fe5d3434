"""Soak: a fleet of no-op pools under steady load for a set time while its parts are killed in
turn (RELIABILITY 15, 17, 19): a denoiser, the decoder, the leading scheduler (of 2+ replicas
that elect a leader through Redis) and the Redis server itself, each SIGKILLed and started again.

The fleet: encoder, two denoisers and decoder with ``--fake`` (no model math; each unit sleeps
``--step-seconds``), ``--schedulers`` scheduler replicas over one redis-server (append-only file,
fsync always: a restarted Redis keeps the requests), step batching off (so each unit costs one
step time and the denoise capacity is ``replicas / (steps * step_seconds)`` requests per second),
checkpoints every step. Requests arrive open-loop (Poisson) at ``--load`` times that capacity,
each to one scheduler replica (round robin). A client whose stream breaks, or whose request
fails with a retryable error, sends the same request (same id, same parameters) again to the
next replica — a re-attach, a replayed result, or a retry from the checkpoint — up to
``--attempts`` times. Every ``--kill-every`` seconds the next part of ``--chaos`` is SIGKILLed
and started again; a scheduler that exits on its own (a deposed leader) is started again too.

Reported: requests that succeeded (first try, after a retry), failed (by code; whether the error
said ``retryable``), lost (no answer at all); latency percentiles; per kill the relaunch time;
RSS and thread count of every process incarnation (summaries, slopes after warm-up in KiB/min,
and the samples themselves).

    python bench/soak.py --duration 1800 --kill-every 60 --load 0.5 --warmup 120 --sample-every 10 \
        --out bench/results/soak_cpu.json
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


def git_commit() -> str | None:
    import subprocess
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


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


def slope_per_min(series: list[dict], key: str, warmup_s: float) -> float | None:
    """Least-squares slope of ``key`` over time (units per minute), from the samples taken
    ``warmup_s`` or more after the process's first sample (a restarted process warms up again) —
    for a scheduler replica, after its first sample as the leader (a standby does no work: it
    warms up when it takes the lease)."""
    if not series:
        return None
    led = [x["t"] for x in series if x.get("leader")]
    start = (led[0] if led else series[0]["t"]) + warmup_s
    pts = [(x["t"], x[key]) for x in series if key in x and x["t"] >= start]
    if len(pts) < 3:
        return None
    n = len(pts)
    mt, mv = sum(t for t, _ in pts) / n, sum(v for _, v in pts) / n
    den = sum((t - mt) ** 2 for t, _ in pts)
    return round(60 * sum((t - mt) * (v - mv) for t, v in pts) / den, 2) if den else None


class PersistentRedis:
    """A redis-server with an append-only file (fsync always): a SIGKILL loses nothing written."""

    def __init__(self, port: int):
        import shutil
        import tempfile
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise SystemExit("soak: needs redis-server on PATH")
        self.port, self.dir, self.proc = port, tempfile.mkdtemp(prefix="soak-redis-"), None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import subprocess
        from fastvideo3.state.redis_store import wait_for_ping
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "yes", "--appendfsync", "always", "--dir", self.dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_ping(self.url, 15.0)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Soak:
    NS = "soak"

    def __init__(self, args):
        self.args = args
        self.results: list[dict] = []
        self.kills: list[dict] = []
        self.samples: dict[str, list[dict]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.restarted_on_exit: list[dict] = []

    def capacity(self) -> float:
        a = self.args
        return a.denoisers / (a.steps * a.step_seconds)

    def one(self, i: int) -> None:
        from fastvideo3.client import FleetClient
        from fastvideo3.errors import FastVideoError
        a = self.args
        rid = f"soak-{i}"
        t0 = time.monotonic()
        rec = {"id": rid, "t": round(t0 - self.t_start, 3), "attempts": 0, "errors": []}
        targets = [p.target for p in self.fleet.schedulers]
        while True:
            target = targets[(i + rec["attempts"]) % len(targets)]
            rec["attempts"] += 1
            try:
                left = max(1.0, a.request_timeout - (time.monotonic() - t0))
                with FleetClient(target, timeout_s=left) as c:
                    c.generate("soak", request_id=rid, num_inference_steps=a.steps, output_format="npy",
                               num_frames=9, height=32, width=32, seed=i)
                rec["ok"] = True
                break
            except FastVideoError as e:
                said = e.details.get("retryable")
                retryable = said in (True, "true", "True") or (said is None and e.code == "UNAVAILABLE")
                rec["errors"].append({"code": e.code, "retryable": retryable, "said": said is not None,
                                      "message": e.message[:160]})
                if not retryable or rec["attempts"] >= a.attempts or time.monotonic() - t0 > a.request_timeout:
                    rec.update(ok=False, code=e.code, retryable=retryable)
                    break
                time.sleep(min(2.0, 0.5 * rec["attempts"]))  # back off, then the next replica
        rec["latency_s"] = round(time.monotonic() - t0, 4)
        rec["end"] = round(time.monotonic() - self.t_start, 3)
        with self.lock:
            self.results.append(rec)

    def sampler(self) -> None:
        while not self.stop.wait(self.args.sample_every):
            self.sample()

    def sample(self) -> None:
        now = round(time.monotonic() - self.t_start, 2)
        try:
            leader = self.leader(default_first=False)
        except Exception:  # noqa: BLE001 - Redis down (being restarted): no leader known
            leader = None
        for p in self.fleet.processes():
            if p.proc is None or p.proc.poll() is not None:
                continue
            st = proc_stats(p.proc.pid)
            if st and p in self.fleet.schedulers:
                st["leader"] = p is leader
            if st:
                self.samples.setdefault(f"{p.name}#{p.proc.pid}", []).append({"t": now, **st})
        if self.redis.proc is not None and self.redis.proc.poll() is None:
            st = proc_stats(self.redis.proc.pid)
            if st:
                self.samples.setdefault(f"redis#{self.redis.proc.pid}", []).append({"t": now, **st})

    def leader(self, default_first: bool = True):
        """The scheduler process holding the leader lease (the one a crash hurts most)."""
        import redis as redis_py
        client = redis_py.Redis.from_url(self.redis.url, socket_timeout=2)
        try:
            holder = (client.get(f"{self.NS}:lease:scheduler") or b"").decode()
        finally:
            client.close()
        address = holder.rsplit("@", 1)[-1]
        fallback = self.fleet.schedulers[0] if default_first else None
        return next((p for p in self.fleet.schedulers if p.target == address), fallback)

    def killer(self) -> None:
        chaos = [c for c in self.args.chaos.split(",") if c]
        n = 0
        while not self.stop.wait(self.args.kill_every):
            what = chaos[n % len(chaos)]
            t_kill = time.monotonic()
            if what == "redis":
                name = "redis"
                self.redis.kill()
                t_dead = time.monotonic()
                self.redis.start()
            else:
                if what == "scheduler":
                    fp = self.leader()
                else:
                    procs = self.fleet.pools[what]
                    fp = procs[(n // len(chaos)) % len(procs)]
                name = fp.name
                self.fleet.kill(fp)
                t_dead = time.monotonic()
                self.fleet.restart(fp, timeout_s=120)
            n += 1
            self.kills.append({"what": what, "process": name, "at_s": round(t_kill - self.t_start, 2),
                               "relaunch_s": round(time.monotonic() - t_dead, 3)})

    def watchdog(self) -> None:
        """Start again a scheduler that exited on its own (as an orchestrator would)."""
        while not self.stop.wait(1.0):
            for fp in self.fleet.schedulers:
                if fp.proc is not None and fp.proc.poll() is not None and not fp.signalled:
                    code = fp.proc.returncode
                    if code == -9:  # the killer's own SIGKILL: it restarts that one itself
                        continue
                    self.restarted_on_exit.append({"process": fp.name, "code": code,
                                                   "at_s": round(time.monotonic() - self.t_start, 2)})
                    try:
                        self.fleet.restart(fp, timeout_s=120)
                    except Exception:  # noqa: BLE001 - reported by the next round
                        pass

    def describe(self, target: str) -> dict:
        from fastvideo3.client import FleetClient
        with FleetClient(target) as c:
            return c.describe()

    def run(self) -> dict:
        from fleet.launcher import LocalFleet, free_port
        a = self.args
        self.redis = PersistentRedis(free_port())
        self.redis.start()
        budgets = ["--interactive-budget-s", "1e9", "--batch-budget-s", "1e9"]
        self.fleet = LocalFleet("wan-tiny-seeded", fake=True, roles=("encoder", "denoiser", "decoder"),
                                replicas={"denoiser": a.denoisers}, schedulers=a.schedulers,
                                leader_lease_s=a.leader_lease,
                                pool_args={"denoiser": ["--fake-step-seconds", str(a.step_seconds)]},
                                scheduler_args=["--no-batching", "--health-interval", "0.5", "--health-timeout", "0.5",
                                                "--checkpoint-every", "1", "--state-store", self.redis.url,
                                                "--state-namespace", self.NS, "--state-ttl", str(a.state_ttl),
                                                "--retain-finished", str(a.retain_finished), *budgets])
        try:
            self.fleet.start(timeout_s=240)
            return self._load()
        finally:
            self.fleet.stop()
            self.redis.kill()

    def _load(self) -> dict:
        a = self.args
        rate = a.load * self.capacity()
        rng = random.Random(0)
        self.t_start = time.monotonic()
        threads = [threading.Thread(target=self.sampler, daemon=True),
                   threading.Thread(target=self.watchdog, daemon=True)]
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
            self.t_load_end = time.monotonic()  # arrivals stop; the pool then waits for every answer
        self.t_end = time.monotonic()
        for t in threads:
            t.join(timeout=180)
        self.sample()
        counters = {}
        for fp in self.fleet.schedulers:
            try:
                for k, v in self.describe(fp.target)["counters"].items():
                    counters[k] = counters.get(k, 0) + v
            except Exception:  # noqa: BLE001 - a replica that is down reports nothing
                pass
        return self.report(rate, n, counters)

    def report(self, rate: float, sent: int, counters: dict) -> dict:
        a = self.args
        res = self.results
        ok = [r for r in res if r["ok"]]
        failed = [r for r in res if not r["ok"]]
        codes: dict[str, int] = {}
        for r in failed:
            codes[r["code"]] = codes.get(r["code"], 0) + 1
        lat = [r["latency_s"] for r in ok]
        warm = a.warmup
        kinds: dict[str, int] = {}
        for k in self.kills:
            kinds[k["what"]] = kinds.get(k["what"], 0) + 1
        procs = {name: {"rss_kib": summarize(s, "rss_kib"), "threads": summarize(s, "threads"),
                        "rss_slope_kib_per_min": slope_per_min(s, "rss_kib", warm),
                        "threads_slope_per_min": slope_per_min(s, "threads", warm)}
                 for name, s in self.samples.items()}
        by_proc = {name: v["rss_slope_kib_per_min"] for name, v in procs.items()
                   if v["rss_slope_kib_per_min"] is not None}
        slopes = list(by_proc.values())
        worst = max(by_proc, key=by_proc.get) if by_proc else None
        return {
            "command": "python bench/soak.py " + " ".join(sys.argv[1:]),
            "commit": git_commit(),
            "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "config": {"duration_s": a.duration, "load": a.load, "capacity_req_per_s": round(self.capacity(), 3),
                       "arrival_rate_req_per_s": round(rate, 3), "steps": a.steps, "step_seconds": a.step_seconds,
                       "denoisers": a.denoisers, "schedulers": a.schedulers, "leader_lease_s": a.leader_lease,
                       "kill_every_s": a.kill_every, "chaos": a.chaos, "attempts": a.attempts,
                       "fake_pools": True, "batching": False, "checkpoint_every": 1, "warmup_s": warm,
                       "retain_finished": a.retain_finished, "state_ttl_s": a.state_ttl},
            "summary": {
                "requests": sent, "succeeded": len(ok), "succeeded_after_retry": sum(r["attempts"] > 1 for r in ok),
                "failed": len(failed), "failed_not_retryable": sum(not r.get("retryable") for r in failed),
                "lost": sent - len(res), "success_rate": round(len(ok) / sent, 5) if sent else None,
                "kills": len(self.kills), "kills_by_part": kinds,
                "duration_s": round(self.t_load_end - self.t_start, 1),
                "wall_s": round(self.t_end - self.t_start, 1),
                "max_rss_slope_kib_per_min": max(slopes) if slopes else None,
                "max_rss_slope_process": worst,
                "rss_slope_kib_per_min_by_process": by_proc,
            },
            "requests": {"failed_by_code": codes, "throughput_req_per_s": round(len(ok) / a.duration, 3),
                         "attempts_max": max((r["attempts"] for r in res), default=0),
                         "latency_s": {"p50": pct(lat, 50), "p95": pct(lat, 95), "p99": pct(lat, 99),
                                       "max": max(lat) if lat else None}},
            "kills": self.kills,
            "restarted_on_exit": self.restarted_on_exit,
            "processes": procs,
            # every sample: [seconds since the load started, RSS KiB, threads(, 1 while the leader)]
            "series": {name: [[x["t"], x.get("rss_kib"), x.get("threads"), *([int(x["leader"])] if "leader" in x else [])]
                              for x in ser] for name, ser in self.samples.items()},
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
    p.add_argument("--schedulers", type=int, default=2, help="scheduler replicas (they elect a leader)")
    p.add_argument("--leader-lease", type=float, default=2.0)
    p.add_argument("--kill-every", type=float, default=60.0, help="seconds between kills (0 = never)")
    p.add_argument("--chaos", default="denoiser,scheduler,decoder,redis", help="what is killed, in turn")
    p.add_argument("--attempts", type=int, default=10, help="sends of one request (same id) before giving up")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before memory slopes are measured")
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--retain-finished", type=int, default=100,
                   help="ended requests each scheduler keeps in memory (a bounded record; older ones are read "
                        "back from Redis)")
    p.add_argument("--state-ttl", type=float, default=300.0, help="seconds ended requests stay in Redis")
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
