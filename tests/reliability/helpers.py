"""Helpers shared by the reliability suite: running requests and collecting what happened,
resource-balance checks (pool buffers, transport registrations, state-store keys), and direct
pool calls. Everything waits on conditions with deadlines; nothing sleeps to synchronize."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from fastvideo3.client import FleetClient, FleetEvent, error_from_rpc
from fastvideo3.errors import FastVideoError
from fastvideo3.v1 import pool_pb2
from tests.fleet_fixture import pool_describe, pool_stub, wait_until

SMALL = dict(num_frames=9, height=32, width=32)
BUDGETS = ["--interactive-budget-s", "1e9", "--batch-budget-s", "1e9"]


@dataclass
class Outcome:
    """Everything a client saw of one request."""

    request_id: str
    events: list[FleetEvent] = field(default_factory=list)
    error: FastVideoError | None = None  # an RPC-level failure (the stream itself broke)
    t_end: float = 0.0

    @property
    def state(self) -> str | None:
        fin = [e for e in self.events if e.kind == "finished"]
        return fin[-1].data["state"] if fin else None

    @property
    def error_event(self) -> dict | None:
        errs = [e for e in self.events if e.kind == "error"]
        return errs[-1].data if errs else None

    def denoise_steps(self) -> list[int]:
        return [e.data["step"] for e in self.events if e.kind == "progress" and e.data["phase"] == "denoise"]

    def artifact(self) -> bytes:
        return b"".join(e.data["data"] for e in self.events if e.kind == "artifact")

    def frames(self) -> np.ndarray:
        import io
        return np.load(io.BytesIO(self.artifact()), allow_pickle=False)


def stream(target: str, prompt: str, *, on_event=None, timeout_s: float = 120.0, client_kw=None, **kw) -> Outcome:
    """Run one request to its end on ``target``; ``on_event(outcome, event)`` sees each event."""
    out = Outcome(kw.get("request_id") or "")
    kw.setdefault("output_format", "npy")
    try:
        with FleetClient(target, timeout_s=timeout_s, **(client_kw or {})) as c:
            for ev in c.stream(prompt, **kw):
                out.request_id = out.request_id or ev.request_id
                out.events.append(ev)
                if on_event is not None:
                    on_event(out, ev)
    except FastVideoError as e:
        out.error = e
    out.t_end = time.monotonic()
    return out


def once_at_step(step: int, action, phase: str = "denoise"):
    """An ``on_event`` hook that runs ``action()`` the first time each request reports ``step``
    (a request moved to another replica may report a step again)."""
    done: set[str] = set()

    def hook(out: Outcome, ev: FleetEvent) -> None:
        if (ev.kind == "progress" and ev.data["phase"] == phase and ev.data["step"] == step
                and out.request_id not in done):
            done.add(out.request_id)
            action()
    return hook


def stream_killing_scheduler(fleet, prompt: str, *, at_step: int = 10, **kw) -> Outcome:
    """:func:`stream` on ``fleet``'s main scheduler, SIGKILLing that scheduler when the request
    reports denoise step ``at_step`` (the stream dies with it)."""
    sched = fleet.process("scheduler")
    return stream(fleet.target, prompt, on_event=once_at_step(at_step, lambda: fleet.kill(sched)), **kw)


def run_all(jobs: list[tuple[str, str, dict]], **common) -> list[Outcome]:
    """Run ``(target, prompt, kwargs)`` jobs concurrently; outcomes in job order."""
    results: list[Outcome | None] = [None] * len(jobs)

    def one(i: int) -> None:
        target, prompt, kw = jobs[i]
        results[i] = stream(target, prompt, **{**common, **kw})

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(r is not None for r in results), "a request thread did not finish"
    return results  # type: ignore[return-value]


# -- resource balance -------------------------------------------------------------------------

def pool_accounts(target: str) -> dict[str, int]:
    """Resident buffers (+ regions), held cache entries, and transport registrations created /
    released by a pool."""
    d = pool_describe(target)
    info = json.loads(d.diagnostics_json or "{}")
    t = (info.get("executor") or {}).get("transport") or {}
    return {"resident": int(d.resident_buffers), "created": int(t.get("buffers_created", 0)),
            "released": int(t.get("buffers_released", 0)), "regions": int(d.executor.resident_regions),
            "cache_handles": int(d.cache_stats.get("feature_cache.referenced_entries", 0))}


def assert_pools_balanced(targets: list[str], timeout_s: float = 20.0) -> None:
    """Every pool holds nothing (buffers, regions, cache handles) and has released every buffer it
    registered."""
    last: dict = {}

    def check():
        nonlocal last
        last = {t: pool_accounts(t) for t in targets}
        return all(not a["resident"] and not a["regions"] and not a["cache_handles"] and a["created"] == a["released"]
                   for a in last.values())

    try:
        wait_until(check, timeout_s, "pools to release everything")
    except AssertionError:
        raise AssertionError(f"pools not balanced: {last}") from None


def store_leftovers(url: str, namespace: str) -> list[str]:
    """Keys of ``namespace`` that would never go away: in-flight ids, and keys without expiry."""
    import redis
    client = redis.Redis.from_url(url)
    try:
        inflight_key = f"{namespace}:inflight"
        bad = [f"inflight:{m.decode()}" for m in client.smembers(inflight_key)]
        for key in client.scan_iter(match=f"{namespace}:*"):
            if key.decode() != inflight_key and client.pttl(key) == -1:
                bad.append(key.decode())
        return bad
    finally:
        client.close()


def store_keys(url: str, namespace: str, request_id: str) -> list[str]:
    import redis
    client = redis.Redis.from_url(url)
    try:
        return sorted(k.decode() for k in client.scan_iter(match=f"{namespace}:req:{request_id}:*"))
    finally:
        client.close()


# -- the scheduler's view ---------------------------------------------------------------------

def sched_counters(target: str) -> dict[str, float]:
    with FleetClient(target) as c:
        return c.describe()["counters"]


def sched_pools(target: str) -> dict[str, bool]:
    """replica address -> healthy, as the scheduler sees it."""
    with FleetClient(target) as c:
        return {p["address"]: bool(p.get("healthy", False)) for p in c.describe().get("pools", [])}


def pool_units(targets: list[str]) -> int:
    return int(sum(pool_describe(t).counters.get("units", 0) for t in targets))


def pool_error(fn, *args, **kw) -> FastVideoError | None:
    """Call a pool stub method; the typed error it failed with, or None."""
    try:
        fn(*args, **kw)
    except grpc.RpcError as err:
        return error_from_rpc(err)
    return None


def release_everywhere(targets: list[str], request_id: str) -> None:
    for t in targets:
        pool_stub(t).Release(pool_pb2.ReleaseRequest(request_id=request_id), timeout=10)
