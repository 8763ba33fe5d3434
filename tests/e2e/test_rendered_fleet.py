"""What the chart would run is a working fleet: each values file is rendered with the real helm,
the container command/args/env of every Deployment are started as local processes (GPU card
mapped to the tiny card, cluster names to loopback ports: tests/rendered_fleet.py), and a
request sent through the rendered scheduler must succeed — and, where the values enable Dynamo
with file discovery (gpu-production: frontend and worker in one pod), one through the rendered
Dynamo frontend's /v1/videos as well.

Not started here: the bundled Redis, which the test's own redis-server plays (its Service and
the external-Redis Secret map to it), and Dynamo with etcd discovery (dynamo-etcd), for which
no etcd runs here (tests/unit/test_helm_chart.py checks that wiring).
"""
from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request

import pytest
import yaml

from fastvideo3.client import FleetClient
from fastvideo3.errors import FastVideoError
from tests.fleet_fixture import dump_logs, pool_describe, wait_until
from tests.redis_server import RedisServer
from tests.rendered_fleet import LocalPlan, RenderedFleet, weights_archive
from tests.unit.helm_render import VALUES_DIR, find_helm, name, render

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GPU_CARD = "wan2.1-t2v-1.3b"
DOWNLOAD_URL = "https://models.example.com/wan.tar.gz"
CASES = {
    "cpu-minimal": "cpu-minimal.yaml",
    "dynamo-etcd": "dynamo-etcd.yaml",
    "gpu-production": "gpu-production.yaml",
    # the same fleet with its weights copied by the download init container instead of a claim
    "gpu-production-download": "gpu-production.yaml",
    # the minimal fleet with two scheduler replicas electing a leader through the bundled Redis
    "cpu-minimal-ha": "cpu-minimal.yaml",
}
REQUEST = dict(num_frames=5, height=64, width=64, num_inference_steps=2, output_format="npy", seed=3)


@pytest.fixture(scope="module")
def helm() -> str:
    path = find_helm()
    if path is None:
        pytest.fail("no helm binary: run deploy/scripts/install-helm.sh (make test installs it)")
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_fleet_serves_a_request(helm: str, case: str, tmp_path, monkeypatch) -> None:
    # a Redis of its own: every rendered scheduler uses the same state namespace, and a case
    # must not resume another's requests
    with RedisServer(kind="process") as redis:
        _run_case(helm, case, tmp_path, redis.url, monkeypatch)


def _run_case(helm: str, case: str, tmp_path, redis_url: str, monkeypatch) -> None:
    values = VALUES_DIR / CASES[case]
    if case.endswith("-download"):
        data = yaml.safe_load(values.read_text())
        data["modelSources"][GPU_CARD] = {"download": {"url": DOWNLOAD_URL}}
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump(data))
    if case.endswith("-ha"):
        data = yaml.safe_load(values.read_text())
        data["scheduler"].update(replicas=2, leaderLeaseSeconds=2)
        data["redis"] = {**(data.get("redis") or {}), "enabled": True}
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump(data))
    objects = render(helm, [values])
    by_component = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in objects
                    if d["kind"] == "Deployment"}
    deployments = set(by_component)
    replaced = deployments & {"redis"}
    if "frontend" in by_component and _discovery(by_component["frontend"]) == "etcd":
        replaced |= deployments & {"frontend", "dynamo-worker"}
    plan = LocalPlan(
        objects, tmp_path,
        secrets={("fastvideo3-redis", "url"): redis_url},  # gpu-production's external Redis Secret
        services={name("redis"): redis_url},               # the bundled Redis
        card_map={GPU_CARD: "wan-tiny"}, replaced=replaced,
        download_urls={DOWNLOAD_URL:
                       weights_archive(tmp_path / "wan.tar.gz").resolve().as_uri()},
    )
    started = {p.name.split("-")[0] if p.name.endswith("-worker") else re.sub(r"-\d+$", "", p.name)
               for p in plan.procs}
    assert started == deployments - replaced and "scheduler" in started and "denoiser" in started
    dynamo = case.startswith("gpu-production")
    assert ("frontend" in started) == dynamo
    if case.startswith("gpu-production"):
        # the rendered pools load from the mounted checkpoint root (mapped to a local directory)
        den = next(p for p in plan.procs if p.name == "denoiser")
        root = next(a for a in den.argv if a.startswith("--checkpoint-root="))
        assert "--card=wan-tiny" in den.argv and root.split("=", 1)[1].startswith(str(tmp_path))
        assert bool(den.init) == case.endswith("download")
    # one thread per process here (restored after the test: later fleets compare against
    # references computed with the default thread count)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    fleet = RenderedFleet(plan, log_dir=tmp_path / "logs")
    try:
        fleet.start(timeout_s=400)
        gateway = next((p for p in plan.procs if p.name == "gateway"), None)
        if gateway is not None:  # ready, as its readiness probe would wait for, before the fleet is used
            url = f"http://127.0.0.1:{gateway.ports['http']}/healthz"
            wait_until(lambda: _http_ok(url), timeout_s=120, what="the rendered gateway's /healthz")
        for proc in fleet.pools.values():
            d = pool_describe(proc[0].target)
            assert list(d.card_ids) == ["wan-tiny"]
        with FleetClient(fleet.target) as client:
            video = client.generate("a red circle moving left", **REQUEST)
        assert video.frames.shape[0] == REQUEST["num_frames"]
        if dynamo:
            _through_dynamo(fleet, plan)
        replicas = by_component["scheduler"]["spec"]["replicas"]
        assert len(fleet.schedulers) == replicas
        if replicas > 1:
            _scheduler_takeover(fleet)
        codes = fleet.stop()  # every process stops cleanly on SIGTERM, as in a pod
        assert codes and all(code == 0 for code in codes.values()), codes
    except BaseException:
        dump_logs(fleet)
        for other in fleet.others:
            print(fleet.log_of(other))
        raise
    finally:
        fleet.stop()


def _scheduler_takeover(fleet: RenderedFleet) -> None:
    """The rendered scheduler replicas (``--leader-lease``, ``--advertise=$(POD_IP):port``) are
    one fleet: each answers (a standby forwards to the leader), exactly one admits, and when the
    leader is SIGKILLed another replica takes the lease and serves."""
    for fp in fleet.schedulers:
        with FleetClient(fp.target) as client:
            assert client.generate(f"through {fp.name}", **REQUEST).frames.shape[0] == REQUEST["num_frames"]

    def admitted(fp) -> float:
        with FleetClient(fp.target) as client:
            return client.describe()["counters"]["admitted"]

    counts = {fp.name: admitted(fp) for fp in fleet.schedulers}
    leaders = [fp for fp in fleet.schedulers if counts[fp.name] > 0]
    assert len(leaders) == 1 and counts[leaders[0].name] >= 1 + len(fleet.schedulers), counts
    fleet.kill(leaders[0])
    t_kill = time.monotonic()
    other = next(fp for fp in fleet.schedulers if fp is not leaders[0])

    def serves() -> bool:
        try:
            with FleetClient(other.target, timeout_s=60) as client:
                return client.generate("after the leader died", **REQUEST).frames.shape[0] == REQUEST["num_frames"]
        except FastVideoError:
            return False  # the dead leader's lease has not expired yet

    wait_until(serves, timeout_s=60, what=f"{other.name} to take the lease over and serve", interval_s=0.5)
    print(f"a rendered scheduler replica served {time.monotonic() - t_kill:.1f}s after the leader's SIGKILL")
    assert admitted(other) >= 1
    fleet.restart(leaders[0])  # back, as a standby: the fleet then stops cleanly as a whole


def _discovery(frontend: dict) -> str:
    (c,) = [c for c in frontend["spec"]["template"]["spec"]["containers"] if c["name"] == "frontend"]
    return next(e["value"] for e in c["env"] if e["name"] == "DYN_DISCOVERY_BACKEND")


def _through_dynamo(fleet: RenderedFleet, plan) -> None:
    """The rendered frontend serves the fleet's card once the rendered worker registered it."""
    (frontend,) = [p for p in plan.procs if p.name == "frontend"]
    base = f"http://127.0.0.1:{frontend.ports['http']}"

    def models() -> list[str]:
        for other, proc in fleet.others.items():
            if proc.poll() is not None:
                raise AssertionError(f"{other} exited with {proc.returncode}\n{fleet.log_of(other)}")
        try:
            with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as r:
                return [m["id"] for m in json.loads(r.read())["data"]]
        except (OSError, ValueError):
            return []

    wait_until(lambda: "wan-tiny" in models(), 240, "wan-tiny in the rendered frontend's /v1/models", 0.5)
    body = {"model": "wan-tiny", "prompt": "a blue square moving up", "size": "64x64",
            "response_format": "b64_json", "nvext": {"num_frames": 5, "num_inference_steps": 2}}
    req = urllib.request.Request(f"{base}/v1/videos", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            status, reply = r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        status, reply = e.code, json.loads(e.read() or b"{}")
    assert status == 200, reply
    assert reply["status"] == "completed" and reply["data"][0]["b64_json"], reply
    print(f"through the rendered Dynamo frontend in {time.monotonic() - t0:.1f}s")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False
