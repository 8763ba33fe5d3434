"""What the chart would run is a working fleet: each values file is rendered with the real helm,
the container command/args/env of every fleet Deployment are started as local processes (GPU
card mapped to the tiny card, cluster names to loopback ports: tests/rendered_fleet.py), and a
request sent through the rendered scheduler must succeed.

Not started here: the Dynamo frontend/worker Deployments (their wiring is checked by
tests/unit/test_helm_chart.py and run by tests/e2e/test_dynamo_e2e.py) and the bundled Redis,
which the test's own redis-server plays (its Service maps to it).
"""
from __future__ import annotations

import os

import pytest
import yaml

from fastvideo3.client import FleetClient
from tests.fleet_fixture import dump_logs, pool_describe
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
}
REQUEST = dict(num_frames=5, height=64, width=64, num_inference_steps=2, output_format="npy", seed=3)


@pytest.fixture(scope="module")
def helm() -> str:
    path = find_helm()
    if path is None:
        pytest.fail("no helm binary: run deploy/scripts/install-helm.sh (make test installs it)")
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_fleet_serves_a_request(helm: str, case: str, tmp_path, redis_url: str) -> None:
    values = VALUES_DIR / CASES[case]
    if case.endswith("-download"):
        data = yaml.safe_load(values.read_text())
        data["modelSources"][GPU_CARD] = {"download": {"url": DOWNLOAD_URL}}
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump(data))
    objects = render(helm, [values])
    deployments = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in objects
                   if d["kind"] == "Deployment"}
    replaced = deployments & {"redis", "frontend", "dynamo-worker"}
    plan = LocalPlan(
        objects, tmp_path,
        secrets={("fastvideo3-redis", "url"): redis_url},  # gpu-production's external Redis Secret
        services={name("redis"): redis_url},               # the bundled Redis
        card_map={GPU_CARD: "wan-tiny"}, replaced=replaced,
        download_urls={DOWNLOAD_URL:
                       weights_archive(tmp_path / "wan.tar.gz").resolve().as_uri()},
    )
    started = {p.name for p in plan.procs}
    assert started == deployments - replaced and "scheduler" in started and "denoiser" in started
    if case.startswith("gpu-production"):
        # the rendered pools load from the mounted checkpoint root (mapped to a local directory)
        den = next(p for p in plan.procs if p.name == "denoiser")
        root = next(a for a in den.argv if a.startswith("--checkpoint-root="))
        assert "--card=wan-tiny" in den.argv and root.split("=", 1)[1].startswith(str(tmp_path))
        assert bool(den.init) == case.endswith("download")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    fleet = RenderedFleet(plan, log_dir=tmp_path / "logs")
    try:
        fleet.start(timeout_s=400)
        for proc in fleet.pools.values():
            d = pool_describe(proc[0].target)
            assert list(d.card_ids) == ["wan-tiny"]
        with FleetClient(fleet.target) as client:
            video = client.generate("a red circle moving left", **REQUEST)
        assert video.frames.shape[0] == REQUEST["num_frames"]
    except BaseException:
        dump_logs(fleet)
        raise
    finally:
        fleet.stop()
