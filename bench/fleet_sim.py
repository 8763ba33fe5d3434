"""Discrete-event simulation of many fleets behind one front door, priced by the cost model.

    python bench/fleet_sim.py --out bench/results/fleet_sim.json          # ~minutes on a CPU

What is simulated (every number below is a flag):

* **100 fleets** on mixed GPU kinds (H200, H100, A100, L40S at relative speeds 1, 0.75, 0.35,
  0.25) and sizes; each serves one card (Wan 2.1 1.3B or 14B), some only up to 81 frames or
  480p. Each fleet has denoiser replicas (continuous batching of up to ``--max-batch`` requests;
  k requests in a batch progress together at ``k ** batch_gain`` times one request's speed) and
  decoder replicas (first come, first served: the decode tail). Text encoding is priced but not
  queued (it is ~0.1% of a request).
* **Service times** come from the calibrated cost model: ``CalibratedCostModel`` priors for the
  Wan cards, calibrated (``observe``) to the H200 measurements committed in bench/results
  (DiT forward 440 ms for 1.3B and 2547 ms for 14B at 81x480x832; VAE decode 1.25 s at
  33x480x832), per role via ``request_role_seconds``; actual times add lognormal noise
  (``--noise``) so routing works on predictions, not on the truth.
* **Traffic**: Poisson arrivals at ``--rate`` requests per minute (default 10,000) of a mix of
  cards, sizes, frame counts, step counts (4-step distilled, 20, 50) and SLO classes.
  A request's SLO deadline is ``slack x`` its no-queue latency on an H200 plus a floor
  (interactive 3x + 10 s, standard 5x + 60 s, batch 15x + 600 s).
* **Routing policies** (over fleets whose card can serve the request): random, round-robin,
  least-loaded (fewest requests in flight), cost (soonest predicted finish: predicted GPU-seconds
  owed per role over replicas, plus the request's own predicted time on that fleet's GPUs —
  the rule of fleet/routing.py).
* **Scaling** on: every ``--scale-interval`` seconds each fleet sets, per role, replicas =
  ceil(arrivals x predicted GPU-seconds per request / target utilization) over the last
  minute (fastvideo3.telemetry.scaling's formula), bounded to [0.5x, 2x] its base size; new
  replicas arrive after ``--provision-delay`` seconds; idle ones leave at once.

Base capacity is set so that the offered load is ``--load`` (default 0.8) of the fleets'
speed-weighted capacity, for each card (``utilization`` in the report checks it: busy over
provisioned replica-seconds in the measured window). Requests arriving in the measured window
(after a warm-up longer than the slowest request, so queues are in steady state) are reported
per configuration: p50/p95 latency (a request unfinished at the end counts with its age),
goodput within SLO (fraction finished by their deadline, overall and per class), GPU-seconds
per request (its share of every batch it ran in, plus its decode, on whatever GPU it ran) and
provisioned GPU-seconds per request. ``summary`` holds the issue's keys: the p95 ratio and the
GPU-seconds are from the runs without scaling, the goodput from cost routing with scaling.
"""
from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import platform
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GPU_KINDS = {"h200": 1.0, "h100": 0.75, "a100": 0.35, "l40s": 0.25}
CARDS = ("wan2.1-t2v-1.3b", "wan2.1-t2v-14b")
POLICIES = ("random", "round-robin", "least-loaded", "cost")
SLO = {"interactive": (3.0, 10.0), "standard": (5.0, 60.0), "batch": (15.0, 600.0)}
# (card share), sizes, frames, steps, SLO class shares: a plausible public text-to-video mix
MIX = {
    "card": ([0.8, 0.2], CARDS),
    "size": ([0.25, 0.6, 0.15], [(320, 576), (480, 832), (720, 1280)]),
    "frames": ([0.3, 0.6, 0.1], [33, 81, 121]),
    "steps": ([0.3, 0.3, 0.4], [4, 20, 50]),
    "slo": ([0.3, 0.5, 0.2], list(SLO)),
}
ANCHORS = {  # H200 measurements committed in bench/results (see the module docstring)
    "wan2.1-t2v-1.3b": {"dit_forward_s": 0.440, "shape": (81, 480, 832)},
    "wan2.1-t2v-14b": {"dit_forward_s": 2.547, "shape": (81, 480, 832)},
    "vae_decode_s": 1.25, "vae_shape": (33, 480, 832),
}


# ---------------------------------------------------------------------------------------------
# Cost model: priced per role, calibrated to measurements


class Pricing:
    """Per-role predicted seconds of a request on an H200, from the calibrated cost model."""

    def __init__(self):
        from fastvideo3.card.registry import get_card
        from fastvideo3.runtime.economy.cost import CalibratedCostModel, device_profile
        from fastvideo3.runtime.economy.pricing import Pricer
        self.cards = {c: get_card(c) for c in CARDS}
        self.pricers = {}
        for c in CARDS:
            pricer = Pricer(CalibratedCostModel(device=device_profile("h200")))
            f, h, w = ANCHORS[c]["shape"]
            req = self._req(f, h, w, 1, "none")
            pred = pricer.predict("diffusion_step", "anchor", self.cards[c], req)
            vf, vh, vw = ANCHORS["vae_shape"]
            vpred = pricer.predict("vae_tile", "anchor", self.cards[c], self._req(vf, vh, vw, 1, "none"))
            for _ in range(8):  # calibration, exactly as a fleet's scheduler does it
                pricer.cost_model.observe("diffusion_step", "anchor", ANCHORS[c]["dit_forward_s"], pred)
                pricer.cost_model.observe("vae_tile", "anchor", ANCHORS["vae_decode_s"], vpred)
            self.pricers[c] = pricer
        self._cache: dict = {}

    @staticmethod
    def _req(frames, h, w, steps, cfg="cfg"):
        return SimpleNamespace(num_frames=frames, height=h, width=w, num_inference_steps=steps, cfg_policy=cfg,
                               precision="bf16")

    def role_seconds(self, card: str, frames: int, h: int, w: int, steps: int) -> dict[str, float]:
        key = (card, frames, h, w, steps)
        if key not in self._cache:
            from fastvideo3.telemetry.scaling import request_role_seconds
            self._cache[key] = request_role_seconds(self.pricers[card], self.cards[card],
                                                    self._req(frames, h, w, steps))
        return self._cache[key]


# ---------------------------------------------------------------------------------------------
# The simulated world


@dataclass
class Req:
    rid: int
    t: float
    card: int
    frames: int
    h: int
    w: int
    steps: int
    slo: str
    deadline: float
    enc: float  # predicted H200 seconds per role
    den: float
    dec: float
    noise_den: float = 1.0
    noise_dec: float = 1.0
    fleet: int = -1
    done: float = math.nan
    gpu_s: float = 0.0  # GPU-seconds it used: its share of its denoiser replica's batches + its decode


@dataclass(eq=False)  # identity: replicas live in sets
class Replica:
    active: dict = field(default_factory=dict)  # rid -> remaining work (H200-seconds)
    last: float = 0.0
    version: int = 0
    alive: bool = True


@dataclass
class Fleet:
    idx: int
    card: int
    kind: str
    speed: float
    max_frames: int
    max_h: int
    den: list  # den[k]: the set of denoiser replicas with k requests in their batch
    dec_free: int
    dec_total: int
    base_den: int
    base_dec: int
    wait: deque = field(default_factory=deque)  # requests waiting for a denoiser slot (FIFO)
    dec_wait: deque = field(default_factory=deque)
    owed_den: float = 0.0  # predicted seconds owed (on this fleet's GPUs)
    owed_dec: float = 0.0
    in_flight: int = 0
    pending_den: int = 0  # replicas being provisioned
    pending_dec: int = 0
    alive_den: int = 0  # denoiser replicas in service (kept in step with ``den``)
    arrivals: list = field(default_factory=list)


class Sim:
    def __init__(self, a, pricing: Pricing, policy: str, scaling: bool, seed: int):
        self.a, self.pricing, self.policy, self.scaling = a, pricing, policy, scaling
        self.rng = np.random.default_rng(seed)
        self.events: list = []
        self.seq = 0
        self.now = 0.0
        self.rr = 0
        self.fleets = self._build_fleets()
        self.reqs: list[Req] = []
        self.busy = 0.0  # replica-seconds with work (denoiser + decoder), inside the measured window
        self.provisioned = 0.0  # replica-seconds in service, inside the measured window
        self._last_acct = 0.0
        self.n_busy = 0  # replicas with work now (denoiser replicas with a batch, busy decoders)
        self.n_prov = sum(f.alive_den + f.dec_total for f in self.fleets)  # replicas in service now

    # -- setup ---------------------------------------------------------------------------------
    def _build_fleets(self) -> list[Fleet]:
        a, rng = self.a, np.random.default_rng(self.a.seed)  # same fleets for every policy
        kinds = list(GPU_KINDS)
        raw = []
        for i in range(a.fleets):
            card = 0 if rng.random() < a.share_13b_fleets else 1
            kind = kinds[rng.integers(len(kinds))] if a.heterogeneous else "h200"
            size = float(rng.lognormal(0.0, 0.6)) if a.heterogeneous else 1.0
            limited = a.heterogeneous and rng.random() < 0.3
            raw.append((card, kind, size, limited))
        # demand per card in H200-seconds per second, from the mix
        demand = self._demand_per_card()
        fleets = []
        for c in range(len(CARDS)):
            mine = [(i, r) for i, r in enumerate(raw) if r[0] == c]
            weight = sum(r[2] for _, r in mine)
            need = demand[c]["den"] / a.load  # speed-weighted replicas for the target load
            dec_need = demand[c]["dec"] / a.load
            for i, (card, kind, size, limited) in mine:
                sp = GPU_KINDS[kind]
                den = max(1, round(need * size / weight / sp))
                dec = max(1, round(dec_need * size / weight / sp))
                buckets = [{Replica() for _ in range(den)}] + [set() for _ in range(a.max_running)]
                fleets.append(Fleet(i, card, kind, sp, 81 if limited else 10**9, 480 if limited else 10**9,
                                    buckets, dec, dec, den, dec, alive_den=den))
        fleets.sort(key=lambda f: f.idx)
        return fleets

    def _demand_per_card(self) -> list[dict[str, float]]:
        rate = self.a.rate / 60.0
        out = [{"den": 0.0, "dec": 0.0} for _ in CARDS]
        cw, cv = MIX["card"]
        for pc, card in zip(cw, cv):
            for ps, (h, w) in zip(*MIX["size"]):
                for pf, f in zip(*MIX["frames"]):
                    for pst, st in zip(*MIX["steps"]):
                        p = pc * ps * pf * pst
                        rs = self.pricing.role_seconds(card, f, h, w, st)
                        out[CARDS.index(card)]["den"] += rate * p * rs["denoiser"] / self.batch_gain(self.a.max_batch)
                        out[CARDS.index(card)]["dec"] += rate * p * rs["decoder"]
        return out

    def batch_gain(self, k: int) -> float:
        """Throughput of k requests batched, relative to one."""
        return k ** self.a.batch_gain if k > 0 else 1.0


    # -- events --------------------------------------------------------------------------------
    def push(self, t: float, kind: str, *data) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, data))

    def run(self) -> dict:
        a = self.a
        t = 0.0
        horizon = a.warmup + a.duration
        rate = a.rate / 60.0
        while t < horizon:  # arrivals, generated up front (Poisson)
            t += float(self.rng.exponential(1.0 / rate))
            self.push(t, "arrive", self._new_request(t))
        if self.scaling:
            self.push(a.scale_interval, "scale")
        end = horizon + a.drain
        while self.events:
            t, _, kind, data = heapq.heappop(self.events)
            if t > end:
                break
            self._account(t)
            self.now = t
            getattr(self, "_on_" + kind)(*data)
        self._account(min(end, self.now))
        return self._report(horizon, end)

    def _new_request(self, t: float) -> Req:
        rng = self.rng

        def draw(name):
            p, vals = MIX[name]
            return vals[rng.choice(len(vals), p=p)]
        card = draw("card")
        h, w = draw("size")
        f, st, slo = draw("frames"), draw("steps"), draw("slo")
        rs = self.pricing.role_seconds(card, f, h, w, st)
        ideal = rs.get("encoder", 0.0) + rs["denoiser"] + rs["decoder"]
        slack, floor = SLO[slo]
        noise = lambda: float(rng.lognormal(0.0, self.a.noise))  # noqa: E731
        r = Req(len(self.reqs), t, CARDS.index(card), f, h, w, st, slo, t + slack * ideal + floor,
                rs.get("encoder", 0.0), rs["denoiser"], rs["decoder"], noise(), noise())
        self.reqs.append(r)
        return r

    def _account(self, t: float) -> None:
        """Integrate busy and provisioned replicas over the measured window only."""
        lo, hi = self.a.warmup, self.a.warmup + self.a.duration
        dt = min(t, hi) - max(self._last_acct, lo)
        if dt > 0:
            self.busy += dt * self.n_busy
            self.provisioned += dt * self.n_prov
        self._last_acct = t

    # -- routing ---------------------------------------------------------------------------------
    def _able(self, r: Req) -> list[Fleet]:
        return [f for f in self.fleets if f.card == r.card and r.frames <= f.max_frames and r.h <= f.max_h]

    def _route(self, r: Req) -> Fleet:
        able = self._able(r)
        if self.policy == "random":
            return able[self.rng.integers(len(able))]
        if self.policy == "round-robin":
            self.rr += 1
            return able[self.rr % len(able)]
        if self.policy == "least-loaded":
            return min(able, key=lambda f: f.in_flight)
        # cost: soonest predicted finish, per role: owed / replicas + own time, on this fleet's GPUs
        best, best_t = None, math.inf
        gain = self.batch_gain(self.a.max_batch)
        for f in able:
            # fleet/routing.py's rule: per role, what the fleet owes spread over the role's
            # replicas (at full batches) plus the request's own time on this fleet's GPUs; the
            # busiest role decides
            t_den = f.owed_den / (max(1, f.alive_den) * gain) + r.den / f.speed
            t_dec = f.owed_dec / max(1, f.dec_total) + r.dec / f.speed
            est = max(t_den, t_dec)
            if est < best_t:
                best, best_t = f, est
        return best

    def _on_arrive(self, r: Req) -> None:
        f = self._route(r)
        r.fleet = f.idx
        f.in_flight += 1
        f.owed_den += r.den / f.speed
        f.owed_dec += r.dec / f.speed
        f.arrivals.append((self.now, r.den / f.speed, r.dec / f.speed))
        f.wait.append(r)
        self._fill(f)

    # -- denoiser: processor sharing with batching gain per replica -----------------------------
    def _rate(self, f: Fleet, k: int) -> float:
        """Speed of each of the k requests stepping on a replica: they share it, and batches of
        up to max_batch rows run k ** batch_gain times faster than one row."""
        return f.speed * self.batch_gain(min(k, self.a.max_batch)) / k

    def _settle(self, f: Fleet, rep: Replica) -> None:
        k = len(rep.active)
        if k:
            wall = self.now - rep.last
            work = wall * self._rate(f, k)
            for rid in rep.active:
                rep.active[rid] -= work
                self.reqs[rid].gpu_s += wall / k  # a batch's GPU time, shared by its rows
        rep.last = self.now

    def _reschedule(self, f: Fleet, rep: Replica) -> None:
        rep.version += 1
        if rep.active:
            rem = min(rep.active.values())
            self.push(self.now + max(0.0, rem) / self._rate(f, len(rep.active)), "den_done", f.idx, rep, rep.version)

    def _fill(self, f: Fleet) -> None:
        while f.wait:
            k = next((k for k in range(self.a.max_running) if f.den[k]), None)
            if k is None:
                return  # every replica runs max_running requests: the rest wait (FIFO)
            rep = next(iter(f.den[k]))  # a replica with the fewest requests in its batch
            self._settle(f, rep)
            r = f.wait.popleft()
            if not rep.active:
                self.n_busy += 1
            f.den[k].discard(rep)
            rep.active[r.rid] = r.enc + r.den * r.noise_den  # H200-seconds of work (encode priced in)
            f.den[k + 1].add(rep)
            self._reschedule(f, rep)

    def _on_den_done(self, fidx: int, rep: Replica, version: int) -> None:
        f = self.fleets[fidx]
        if version != rep.version:
            return
        self._settle(f, rep)
        finished = [rid for rid, rem in rep.active.items() if rem <= 1e-9]
        if finished and rep.alive:
            f.den[len(rep.active)].discard(rep)
            f.den[len(rep.active) - len(finished)].add(rep)
        for rid in finished:
            del rep.active[rid]
            r = self.reqs[rid]
            f.owed_den -= r.den / f.speed
            f.dec_wait.append(r)
        if finished and not rep.active:
            self.n_busy -= 1
        self._reschedule(f, rep)
        self._fill(f)
        self._decode(f)

    # -- decoder: FIFO over replicas (the decode tail) ------------------------------------------
    def _decode(self, f: Fleet) -> None:
        while f.dec_wait and f.dec_free > 0:
            r = f.dec_wait.popleft()
            f.dec_free -= 1
            self.n_busy += 1
            r.gpu_s += r.dec * r.noise_dec / f.speed
            self.push(self.now + r.dec * r.noise_dec / f.speed, "dec_done", f.idx, r.rid)

    def _on_dec_done(self, fidx: int, rid: int) -> None:
        f = self.fleets[fidx]
        r = self.reqs[rid]
        r.done = self.now
        f.owed_dec -= r.dec / f.speed
        f.in_flight -= 1
        f.dec_free += 1
        self.n_busy -= 1
        self._decode(f)

    # -- scaling ---------------------------------------------------------------------------------
    def _on_scale(self) -> None:
        a = self.a
        for f in self.fleets:
            cut = self.now - a.scale_window
            f.arrivals = [x for x in f.arrivals if x[0] >= cut]
            span = min(a.scale_window, self.now)
            den_demand = sum(x[1] for x in f.arrivals) / span / self.batch_gain(a.max_batch)
            dec_demand = sum(x[2] for x in f.arrivals) / span
            # the work already owed is demand too (else a fleet the router avoids shrinks, and is
            # avoided more): clear it within one window
            gain = self.batch_gain(a.max_batch)
            den_demand += f.owed_den / gain / a.scale_window
            dec_demand += f.owed_dec / a.scale_window
            for role, demand, base in (("den", den_demand, f.base_den), ("dec", dec_demand, f.base_dec)):
                want = min(2 * base, max(math.ceil(base / 2), math.ceil(demand / a.target_utilization)))
                have = f.alive_den if role == "den" else f.dec_total
                pending = f.pending_den if role == "den" else f.pending_dec
                if want > have + pending:
                    n = want - have - pending
                    if role == "den":
                        f.pending_den += n
                    else:
                        f.pending_dec += n
                    self.push(self.now + a.provision_delay, "provision", f.idx, role, n)
                elif want < have:  # step down gently: at most a tenth of the role per interval
                    self._shrink(f, role, min(have - want, max(1, have // 10)))
        self.push(self.now + a.scale_interval, "scale")

    def _shrink(self, f: Fleet, role: str, n: int) -> None:
        if role == "den":
            while n and f.den[0]:  # only idle replicas leave
                rep = f.den[0].pop()
                rep.alive, n = False, n - 1
                rep.version += 1  # events for it are stale
                f.alive_den -= 1
                self.n_prov -= 1
        else:
            idle = min(n, f.dec_free)
            f.dec_free -= idle
            f.dec_total -= idle
            self.n_prov -= idle

    def _on_provision(self, fidx: int, role: str, n: int) -> None:
        f = self.fleets[fidx]
        if role == "den":
            f.pending_den -= n
            f.den[0].update(Replica(last=self.now) for _ in range(n))
            f.alive_den += n
            self.n_prov += n
            self._fill(f)
        else:
            f.pending_dec -= n
            f.dec_total += n
            f.dec_free += n
            self.n_prov += n
            self._decode(f)

    # -- report ----------------------------------------------------------------------------------
    def _report(self, horizon: float, end: float) -> dict:
        measured = [r for r in self.reqs if self.a.warmup <= r.t < horizon]
        lat = np.array([(r.done if not math.isnan(r.done) else end) - r.t for r in measured])
        ok = np.array([(not math.isnan(r.done)) and r.done <= r.deadline for r in measured])
        done = [r for r in measured if not math.isnan(r.done)]
        by_class = {c: float(np.mean([o for o, r in zip(ok, measured) if r.slo == c]))
                    for c in SLO if any(r.slo == c for r in measured)}
        return {
            "requests": len(measured), "unfinished": int(sum(1 for r in measured if math.isnan(r.done))),
            "latency_p50_s": round(float(np.percentile(lat, 50)), 3),
            "latency_p95_s": round(float(np.percentile(lat, 95)), 3),
            "goodput_within_slo": round(float(ok.mean()), 4),
            "goodput_by_slo_class": {k: round(v, 4) for k, v in by_class.items()},
            # GPU-seconds a finished request used (its share of every batch it ran in, and its
            # decode), on whatever GPU it ran: slower GPUs spend more GPU-seconds on the same work
            "gpu_seconds_per_request": round(float(np.mean([r.gpu_s for r in done])), 3) if done else None,
            # replicas in service over the measured window / requests that arrived in it
            "provisioned_gpu_seconds_per_request": round(self.provisioned / max(1, len(measured)), 3),
            "utilization": round(self.busy / max(1e-9, self.provisioned), 4),
        }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fleets", type=int, default=100)
    p.add_argument("--rate", type=float, default=10_000.0, help="requests per minute")
    p.add_argument("--load", type=float, default=0.8, help="offered load / speed-weighted capacity")
    p.add_argument("--warmup", type=float, default=1200.0,
                   help="seconds of arrivals before measuring (longer than the slowest request: steady state)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of measured arrivals")
    p.add_argument("--drain", type=float, default=1800.0, help="seconds after the last arrival to finish")
    p.add_argument("--max-batch", type=int, default=4, help="rows per denoiser batch")
    p.add_argument("--max-running", type=int, default=16,
                   help="requests stepping at once per denoiser replica (they share it)")
    p.add_argument("--batch-gain", type=float, default=0.15, help="k batched requests run k**gain x faster")
    p.add_argument("--noise", type=float, default=0.15, help="lognormal sigma of actual vs predicted time")
    p.add_argument("--share-13b-fleets", type=float, default=0.75)
    p.add_argument("--target-utilization", type=float, default=0.7)
    p.add_argument("--scale-interval", type=float, default=15.0)
    p.add_argument("--scale-window", type=float, default=60.0)
    p.add_argument("--provision-delay", type=float, default=60.0)
    p.add_argument("--homogeneous", dest="heterogeneous", action="store_false")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    for name, lo, hi in (("fleets", 1, 10_000), ("rate", 1, 10**7), ("load", 0.01, 2.0),
                         ("target_utilization", 0.05, 1.0), ("max_batch", 1, 64), ("max_running", 1, 256),
                         ("duration", 1, 86_400)):
        v = getattr(a, name)
        if not lo <= v <= hi:
            p.error(f"--{name.replace('_', '-')}: {v} is outside [{lo}, {hi}]")
    policies = [x for x in a.policies.split(",") if x]
    bad = [x for x in policies if x not in POLICIES]
    if bad:
        p.error(f"--policies: unknown {bad[0]!r} (known: {', '.join(POLICIES)})")
    t0 = time.time()
    pricing = Pricing()
    runs = {}
    for scaling in (False, True):
        for policy in policies:
            t1 = time.time()
            res = Sim(a, pricing, policy, scaling, seed=a.seed + 17).run()
            res["wall_s"] = round(time.time() - t1, 1)
            key = f"{policy}{'+scaling' if scaling else ''}"
            runs[key] = res
            print(f"{key:24s} p50 {res['latency_p50_s']:9.1f}s p95 {res['latency_p95_s']:9.1f}s "
                  f"goodput {res['goodput_within_slo']:.3f} GPU-s/req {res['gpu_seconds_per_request']:.1f} "
                  f"util {res['utilization']:.2f} ({res['wall_s']}s)", flush=True)
    summary = {}
    if "cost" in runs and "round-robin" in runs:
        summary["p95_ratio_cost_vs_round_robin"] = round(
            runs["cost"]["latency_p95_s"] / runs["round-robin"]["latency_p95_s"], 4)
    if "cost+scaling" in runs:
        summary["goodput_within_slo"] = runs["cost+scaling"]["goodput_within_slo"]
    summary["gpu_seconds_per_request"] = {k: v["gpu_seconds_per_request"] for k, v in runs.items()
                                          if "+scaling" not in k}
    fleets = Sim(a, pricing, "cost", False, 0).fleets
    out = {
        "summary": summary,
        "command": "python bench/fleet_sim.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()},
        "config": {k: v for k, v in vars(a).items() if k != "out"},
        "mix": {k: {"shares": v[0], "values": v[1]} for k, v in MIX.items()},
        "slo_deadline": {k: {"x_ideal_h200_latency": s, "plus_s": f} for k, (s, f) in SLO.items()},
        "calibration_anchors_h200": ANCHORS,
        "fleets": {"count": len(fleets), "by_kind": {k: sum(f.kind == k for f in fleets) for k in GPU_KINDS},
                   "by_card": {c: sum(f.card == i for f in fleets) for i, c in enumerate(CARDS)},
                   "limited_to_81_frames_480p": sum(f.max_frames == 81 for f in fleets),
                   "denoiser_replicas": sum(f.base_den for f in fleets),
                   "decoder_replicas": sum(f.base_dec for f in fleets)},
        "runs": runs,
        "wall_s": round(time.time() - t0, 1),
    }
    text = json.dumps(out, indent=2)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
