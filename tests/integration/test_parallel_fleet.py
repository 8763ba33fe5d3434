"""A multi-rank denoiser replica in the real fleet (scheduler + pools as processes, gloo ranks).

The denoiser is one replica of N ranks started by its own launcher (``--nproc N --plan P``).
Its frames equal the embedded single-process engine's within 1e-4 for two plans (Ulysses 2 on
2 ranks; CFG 2 x Ulysses 2 on 4) -- the fleet batches the three requests' steps, which reorders
sums only (the plans alone match within 1e-5: tests/unit/test_parallel_plans.py) --, step batching still batches requests on it, Describe names
the plan, and a rank killed mid-request ends that request (no hang), after which every other
rank of the replica exits.
"""
from __future__ import annotations

import json
import os
import signal
import threading

import numpy as np
import pytest

from fastvideo3.client import FleetClient
from fastvideo3.errors import FastVideoError
from tests.fleet_fixture import fleet_fixture, generate_concurrently, pool_describe, wait_until

fleet = fleet_fixture(scope="module", replicas={"denoiser": 1}, roles=("encoder", "denoiser", "decoder"),
                      pool_args={"denoiser": ["--nproc", "2", "--plan", "ulysses2", "--dist-timeout", "30"]})

REQ = dict(num_frames=9, height=64, width=64, num_inference_steps=3)
PROMPTS = ["a red circle moving left", "a blue square moving up", "a green triangle"]


@pytest.fixture(scope="module")
def embedded():
    import fastvideo3
    out = {}
    with fastvideo3.Engine("wan-tiny") as engine:
        for i, p in enumerate(PROMPTS):
            out[p] = np.clip(engine.generate(p, seed=10 + i, **REQ).frames, 0.0, 1.0).astype(np.float32)
    return out


def _parallel(target: str) -> dict:
    from fastvideo3.rpc import plain
    return plain(pool_describe(target).parallel)


def _check_plan(fleet, embedded, spec: str, world: int) -> None:
    den = fleet.pools["denoiser"][0]
    par = _parallel(den.target)
    assert (par["spec"], par["world"], par["backend"]) == (spec, world, "gloo")
    assert len(par["rank_pids"]) == world
    videos = generate_concurrently(fleet.target, [dict(prompt=p, seed=10 + i, **REQ) for i, p in enumerate(PROMPTS)],
                                   timeout_s=240)
    for p, v in zip(PROMPTS, videos):
        err = float(np.abs(v.frames - embedded[p]).max())
        assert err <= 1e-4, (spec, p, err)  # batched with the other requests, as tests/unit/test_batch_invariant.py
    counters = pool_describe(den.target).counters
    assert counters["max_batch_rows"] > 2, counters  # a forward held more than one request
    with FleetClient(fleet.target) as c:
        pools = json.dumps(c.describe(), default=str)
    assert spec in pools  # the scheduler knows the replica's plan


@pytest.mark.timeout(400)
def test_ulysses2_replica_matches_single_process(fleet, embedded):
    _check_plan(fleet, embedded, "ulysses2", 2)


@pytest.mark.timeout(600)
def test_cfg2_x_ulysses2_replica_then_a_rank_killed_mid_request(fleet, embedded):
    den = fleet.pools["denoiser"][0]
    fleet.kill(den, signal.SIGTERM)
    i = den.argv.index("--nproc")
    den.argv[i + 1], den.argv[i + 3] = "4", "cfg2xulysses2"
    fleet.restart(den, timeout_s=300)
    wait_until(lambda: _routable(fleet.target), 120, "the scheduler to route to the restarted replica", 0.5)
    _check_plan(fleet, embedded, "cfg2xulysses2", 4)

    pids = _parallel(den.target)["rank_pids"]
    outcome: dict = {}

    def long_request() -> None:
        try:
            with FleetClient(fleet.target, timeout_s=200) as c:
                outcome["video"] = c.generate("a long request", seed=3, output_format="npy",
                                              **{**REQ, "num_inference_steps": 200})
        except FastVideoError as e:
            outcome["error"] = e

    t = threading.Thread(target=long_request)
    t.start()
    wait_until(lambda: pool_describe(den.target).counters.get("units", 0) >= 2, 120, "the request to step")
    os.kill(pids[2], signal.SIGKILL)  # rank 2: a CFG peer of rank 0's sequence shard
    t.join(timeout=120)
    assert not t.is_alive(), "the request hung after a rank died"
    # the only denoiser is gone: the request cannot resume anywhere, so it fails, naming the loss
    assert "video" not in outcome and outcome["error"].code == "UNAVAILABLE", outcome
    print("request after the rank died:", outcome["error"].one_line())
    assert den.proc.wait(timeout=60) != 0  # rank 0 stopped serving and exited as broken
    for pid in pids[1:]:
        wait_until(lambda pid=pid: not _alive(pid), 60, f"rank pid {pid} to exit")


def _routable(target: str) -> bool:
    """A one-step request succeeds (the scheduler's health monitor has seen the replica again)."""
    try:
        with FleetClient(target, timeout_s=60) as c:
            c.generate("probe", seed=1, output_format="npy", num_frames=1, height=64, width=64, num_inference_steps=1)
        return True
    except FastVideoError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
