"""Several fleets behind one real Dynamo frontend, routed by the cost router.

Three local fleets of different speeds (no-op pools with a configured step time: fast, medium,
slow). The two faster ones serve a card limited to 17 frames; only the slow one serves up to 65.
Two cost routers (``python -m fleet.dynamo.router``) sit behind one Dynamo frontend (file
discovery, TCP request plane): one with ``--policy round-robin`` served as ``wan-tiny-rr``, one
with ``--policy cost`` as ``wan-tiny-cost``, so both policies are measured in this run, on the
same fleets, through the same frontend.

The fast and medium fleets also each run their own Dynamo worker (``python -m fleet.dynamo``)
under one model name, ``wan-tiny-pool``: there Dynamo's own router (``--router-mode
least-loaded``) picks the worker, and a worker whose scheduler stops serving leaves discovery
(``--leave-after 1``).

Checks: a mixed burst has a p95 latency at least 30% lower with cost routing than with
round-robin; a request only the slow fleet can serve always lands there (under either policy);
the workers publish their fleet's live load on Dynamo's /metrics; after one fleet stops, no
request goes to it once 5 s have passed (cost router, round-robin router and Dynamo's router).

Timing is compared between the two policies in one run (never against wall-clock constants);
fleet speeds differ by 5x and 20x so the comparison holds on a loaded machine.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("dynamo.frontend", reason="needs the dynamo extra (ai-dynamo)")

from fastvideo3.client import FleetClient  # noqa: E402
from fleet.launcher import LocalFleet  # noqa: E402
from tests.e2e.test_dynamo_e2e import REPO_ROOT, Proc, _free_port  # noqa: E402
from tests.fleet_fixture import dump_logs, wait_until  # noqa: E402

STEP_S = {"fast": 0.02, "medium": 0.1, "slow": 0.4}  # simulated denoise step time per batch
ROLES = ("encoder", "denoiser", "decoder")
POOL = "wan-tiny-pool"  # served by the fast and medium fleets' own workers, routed by Dynamo
PLANE = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
# a mixed burst: small and larger clips, few and more steps
BURST = [{"size": size, "nvext": {"num_frames": frames, "num_inference_steps": steps, "seed": i}}
         for i, (size, frames, steps) in enumerate(
             [("32x32", 9, 2), ("64x64", 17, 6), ("32x32", 17, 4), ("64x32", 9, 6), ("32x64", 5, 3),
              ("64x64", 9, 5)] * 3)]


def _limited_card(path: Path) -> str:
    from fastvideo3.card.registry import get_card
    d = get_card("wan-tiny").model_dump(mode="json")
    d["limits"]["max_frames"] = d["limits"]["default_frames"] = 17
    d.pop("graph_buckets", None)  # the base card's buckets are at 33 frames: this card declares none
    path.write_text(json.dumps(d))
    return str(path)


class Routed:
    def __init__(self, fleets: dict[str, LocalFleet], frontend: Proc, routers: dict[str, Proc], http_port: int,
                 workers: dict[str, tuple[Proc, int]]):
        self.fleets, self.frontend, self.routers, self.workers = fleets, frontend, routers, workers
        self.base = f"http://127.0.0.1:{http_port}"

    def post(self, model: str, body: dict, timeout_s: float = 180.0) -> tuple[int, dict, float]:
        import urllib.error
        import urllib.request
        data = json.dumps({"model": model, "prompt": "a routed request", "response_format": "b64_json",
                           **body}).encode()
        req = urllib.request.Request(f"{self.base}/v1/videos", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return r.status, json.loads(r.read()), time.monotonic() - t0
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}"), time.monotonic() - t0

    def burst(self, model: str, bodies: list[dict]) -> list[tuple[int, dict, float]]:
        out: list = [None] * len(bodies)

        def one(i: int) -> None:
            out[i] = self.post(model, bodies[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        assert all(r is not None for r in out), "a request of the burst never returned"
        return out

    def admitted(self) -> dict[str, int]:
        """Requests each live fleet's scheduler has admitted (its own counter: ground truth)."""
        out = {}
        for name, f in self.fleets.items():
            if f.schedulers[0].proc is not None and f.schedulers[0].proc.poll() is None:
                with FleetClient(f.target) as c:
                    out[name] = int(c.describe()["counters"]["admitted"])
        return out

    def placed(self, before: dict[str, int]) -> dict[str, int]:
        """Requests admitted per fleet since ``before`` (fleets that are gone are left out)."""
        now = self.admitted()
        return {n: now[n] - before.get(n, 0) for n in now}

    def models(self) -> list[str]:
        import urllib.request
        try:
            with urllib.request.urlopen(f"{self.base}/v1/models", timeout=5) as r:
                return [m["id"] for m in json.loads(r.read())["data"]]
        except (OSError, ValueError):
            return []

    def logs(self) -> str:
        procs = (self.frontend, *self.routers.values(), *(w for w, _ in self.workers.values()))
        return "\n".join(p.tail(60) for p in procs)


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routing")
    limited = _limited_card(tmp / "wan-tiny-17f.json")
    cards = {"fast": limited, "medium": limited, "slow": "wan-tiny"}
    fleets = {name: LocalFleet(cards[name], fake=True, roles=ROLES, log_dir=tmp / f"fleet-{name}",
                         scheduler_args=["--engine-id", f"fleet-{name}"],
                         pool_args={"denoiser": ["--fake-step-seconds", str(STEP_S[name])]})
              for name in STEP_S}
    procs: list[Proc] = []
    try:
        errors: list[BaseException] = []

        def start(f: LocalFleet) -> None:
            try:
                f.start(timeout_s=300)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)

        threads = [threading.Thread(target=start, args=(f,)) for f in fleets.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(360)
        if errors:
            raise errors[0]
        # calibrate each fleet's cost model with a few requests (what a fleet in service has)
        for f in fleets.values():
            with FleetClient(f.target, timeout_s=120) as c:
                for steps in (2, 3, 2):
                    c.generate("warm-up", output_format="npy", num_inference_steps=steps, num_frames=9,
                               height=32, width=32)
        http_port = _free_port()
        env = dict(os.environ)
        env.update({
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
            "DYN_FILE_KV": str(tmp / "kv"), "DYN_TCP_RPC_HOST": "127.0.0.1",
            "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1", "DYN_EVENT_PLANE_HOST": "127.0.0.1",
            "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": "0",
        })
        frontend = Proc("frontend", [sys.executable, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                                     "--http-port", str(http_port), "--router-mode", "least-loaded", *PLANE],
                        env, tmp / "frontend.log")
        procs.append(frontend)
        fleet_flags = [a for name, f in fleets.items() for a in ("--fleet", f"{name}={f.target}")]
        routers = {}
        for policy, served in (("round-robin", "wan-tiny-rr"), ("cost", "wan-tiny-cost")):
            routers[policy] = Proc(f"router-{policy}", [
                sys.executable, "-m", "fleet.dynamo.router", *fleet_flags, "--policy", policy,
                "--served-model-name", served, "--no-aliases", "--component", f"router-{policy}",
                "--refresh-interval", "0.5",
                "--fleet-output-format", "npy", *PLANE], dict(env, DYN_SYSTEM_PORT=str(_free_port(below=32768))),
                tmp / f"router-{policy}.log")
            procs.append(routers[policy])
        workers = {}
        for name in ("fast", "medium"):  # one WorkerSet: same namespace, component and model name
            port = _free_port(below=32768)
            workers[name] = (Proc(f"worker-{name}", [
                sys.executable, "-m", "fleet.dynamo", "--scheduler", fleets[name].target, "--served-model-name", POOL,
                "--component", "fleet-pool", "--fleet-output-format", "npy", "--load-refresh", "0.5", "--leave-after", "1",
                *PLANE],
                dict(env, DYN_SYSTEM_PORT=str(port)), tmp / f"worker-{name}.log"), port)
            procs.append(workers[name][0])
        r = Routed(fleets, frontend, routers, http_port, workers)

        def ready():
            for p in procs:
                if not p.alive():
                    raise AssertionError(f"{p.name} exited with {p.p.returncode}\n{r.logs()}")
            mdc = tmp / "kv" / "v1" / "mdc"  # one model entry per registered worker instance
            pool_workers = [e for e in mdc.iterdir() if "fleet%2Dpool" in e.name] if mdc.is_dir() else []
            return {"wan-tiny-rr", "wan-tiny-cost", POOL} <= set(r.models()) and len(pool_workers) == 2
        # the routers read each fleet's card (its cost model calibrated by the warm-up) as they start
        wait_until(ready, 180, "the routers and both pool workers in the frontend's /v1/models", interval_s=0.25)
        yield r
    except BaseException:
        for p in procs:
            print(p.tail(60))
        for f in fleets.values():
            dump_logs(f)
        raise
    finally:
        codes = {p.name: p.stop() for p in reversed(procs)}
        for f in fleets.values():
            f.stop()
        left = [p.name for p in procs if not p.group_gone()]
        assert not left, f"processes left behind in the session of {left}"
        print(f"routing stack stopped: {codes}")


def _p95(latencies: list[float]) -> float:
    xs = sorted(latencies)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


@pytest.mark.timeout(900)
def test_cost_routing_beats_round_robin_on_a_mixed_burst(routed):
    results, placed = {}, {}
    for model in ("wan-tiny-rr", "wan-tiny-cost"):  # one after the other: they share the fleets
        before = routed.admitted()
        out = routed.burst(model, BURST)
        bad = [(s, b) for s, b, _ in out if s != 200]
        assert not bad, bad[:3]
        results[model] = [t for _, _, t in out]
        placed[model] = routed.placed(before)
        assert sum(placed[model].values()) == len(BURST), placed
    rr, cost = _p95(results["wan-tiny-rr"]), _p95(results["wan-tiny-cost"])
    print(f"p95 round-robin {rr:.2f}s, cost {cost:.2f}s (ratio {cost / rr:.2f}); placements {placed}")
    assert placed["wan-tiny-rr"]["slow"] >= 5  # round-robin spreads evenly: the baseline is real
    assert cost <= 0.7 * rr, (rr, cost, placed)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model", ["wan-tiny-rr", "wan-tiny-cost"])
def test_a_request_only_one_fleet_can_serve_lands_there(routed, model):
    before = routed.admitted()
    bodies = [{"size": "32x32", "nvext": {"num_frames": 33, "num_inference_steps": 1, "seed": i}} for i in range(4)]
    out = routed.burst(model, bodies)
    assert all(s == 200 for s, _, _ in out), [b for s, b, _ in out if s != 200][:2]
    assert routed.placed(before) == {"fast": 0, "medium": 0, "slow": 4}
    # beyond every fleet's card: refused with the reason, sent nowhere
    status, body, _ = routed.post(model, {"size": "32x32", "nvext": {"num_frames": 129, "num_inference_steps": 1}})
    assert 400 <= status < 500 and "num_frames=129" in body.get("message", ""), (status, body)
    assert routed.placed(before) == {"fast": 0, "medium": 0, "slow": 4}


@pytest.mark.timeout(600)
def test_dynamo_routes_over_fleet_workers_that_publish_live_load(routed):
    import urllib.request
    before = routed.admitted()
    bodies = [{"size": "32x32", "nvext": {"num_frames": 9, "num_inference_steps": 3, "seed": i}} for i in range(8)]
    out = routed.burst(POOL, bodies)
    assert all(s == 200 for s, _, _ in out), [b for s, b, _ in out if s != 200][:2]
    placed = routed.placed(before)
    assert placed["slow"] == 0 and placed["fast"] >= 1 and placed["medium"] >= 1, placed
    assert sum(placed.values()) == len(bodies)
    for name, (_, port) in routed.workers.items():  # the fleet's load on Dynamo's system /metrics
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert f'fastvideo3_fleet_serving{{fleet="fleet-{name}"}} 1' in text, text[-2000:]
        assert "fastvideo3_fleet_owed_gpu_seconds" in text and "fastvideo3_fleet_memory_free_bytes" in text


@pytest.mark.timeout(600)
def test_a_stopped_fleet_gets_no_request_after_5_seconds(routed):
    """Last: stops the medium fleet. Round-robin would otherwise send it every third request, and
    Dynamo's least-loaded router every other one of the pool model's."""
    medium = routed.fleets["medium"]
    t_stop = time.monotonic()
    medium.terminate(medium.schedulers[0])  # SIGTERM: NOT_SERVING while it drains, then gone
    time.sleep(max(0.0, t_stop + 5.0 - time.monotonic()))  # the acceptance window itself
    bodies = [{"size": "32x32", "nvext": {"num_frames": 9, "num_inference_steps": 2, "seed": i}} for i in range(9)]
    for model in ("wan-tiny-rr", "wan-tiny-cost", POOL):
        before = routed.admitted()
        assert set(before) == {"fast", "slow"}
        out = routed.burst(model, bodies)
        # every request answered 200 and was admitted by a live fleet: none went to the stopped one
        assert all(s == 200 for s, _, _ in out), [b for s, b, _ in out if s != 200][:2]
        placed = routed.placed(before)
        assert sum(placed.values()) == len(bodies), placed
        if model == "wan-tiny-rr":
            assert placed["fast"] >= 3 and placed["slow"] >= 3, placed  # still spread over the live two
        if model == POOL:  # Dynamo's router: the stopped fleet's worker left discovery
            assert placed == {"fast": len(bodies), "slow": 0}, placed
