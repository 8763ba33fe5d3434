"""The chart's tensor-transport values: per-edge backend, what each pool pod gets, validation."""
from __future__ import annotations

import json

import pytest
import yaml

try:
    from helm_render import (
        CHART_DIR, VALUES_DIR, Rendered, deep_merge, load_values, name, render, require_helm, template_fail_test,
    )
except ImportError:  # tests/unit imported as a package
    from tests.unit.helm_render import (  # type: ignore[no-redef]
        CHART_DIR, VALUES_DIR, Rendered, deep_merge, load_values, name, render, require_helm, template_fail_test,
    )

ROLES = ("encoder", "denoiser", "decoder", "reward")
GPU_PROD = (VALUES_DIR / "gpu-production.yaml",)
timeout = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def helm() -> str:
    return require_helm()


def _pod(r: Rendered, role: str) -> tuple[dict, dict]:
    spec = r.get("Deployment", name(role))["spec"]["template"]["spec"]
    return spec, next(c for c in spec["containers"] if c["name"] == role)


def _env(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


@timeout
def test_default_pools_offer_auto_and_report_ucx_and_keep_their_own_shm(helm: str) -> None:
    r = Rendered(render(helm))
    assert r.config()["fleet.yaml"]["transport"] == {"default": "auto", "edges": {}}
    for role in ROLES:
        spec, c = _pod(r, role)
        assert "--transport=auto" in c["args"] and "--ucx-report-dir=/tmp/ucx" in c["args"]
        assert not any(a.startswith(("--host-id", "--nixl-error-handling")) for a in c["args"])
        assert not spec.get("hostIPC") and not spec.get("hostPID")
        assert "dshm" in {v["name"] for v in spec["volumes"]}
        assert "IPC_LOCK" not in c["securityContext"]["capabilities"].get("add", [])


@timeout
def test_gpu_production_moves_tensors_over_nixl_with_rdma(helm: str) -> None:
    r = Rendered(render(helm, GPU_PROD))
    assert r.config()["fleet.yaml"]["transport"]["default"] == "nixl"
    for role in ROLES:
        spec, c = _pod(r, role)
        res = c["resources"]
        assert res["limits"]["rdma/hca_shared_devices_a"] == 1 and res["requests"]["rdma/hca_shared_devices_a"] == 1
        assert c["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"], "drop": ["ALL"]}
        assert res["limits"]["nvidia.com/gpu"] == 1


@timeout
def test_same_node_cuda_ipc_shares_the_nodes_shm_and_pids(helm: str) -> None:
    sets = ["transport.sameNodeIpc=true", "transport.edges.denoiser->decoder=cuda_ipc",
            "transport.nixl.ucxErrorHandling=none", "transport.nixl.ucxEnv.UCX_TLS=rc\\,cuda_copy\\,cuda_ipc"]
    r = Rendered(render(helm, GPU_PROD, sets))
    assert r.config()["fleet.yaml"]["transport"] == {"default": "nixl", "edges": {"denoiser->decoder": "cuda_ipc"}}
    for role in ROLES:
        spec, c = _pod(r, role)
        assert spec["hostIPC"] is True and spec["hostPID"] is True
        assert "dshm" not in {v["name"] for v in spec["volumes"]}
        assert "/dev/shm" not in {m["mountPath"] for m in c["volumeMounts"]}
        assert "--host-id=$(NODE_NAME)" in c["args"] and "--nixl-error-handling=none" in c["args"]
        env = _env(c)
        assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["UCX_TLS"] == "rc,cuda_copy,cuda_ipc"


@timeout
def test_rendered_fleet_yaml_is_what_the_scheduler_reads(helm: str, tmp_path) -> None:
    from services.scheduler.config import parse_args
    r = Rendered(render(helm, GPU_PROD, ["transport.edges.decoder->reward=grpc"]))
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(r.config()["fleet.yaml"]))
    cfg = parse_args(["--config", str(path)])
    assert cfg.edge_backend("encoder", "denoiser") == "nixl" and cfg.edge_backend("decoder", "reward") == "grpc"


FAILS = [
    (["transport.default=cuda_ipc"], "transport.default is cuda_ipc, which needs GPUs at both ends"),
    (["transport.edges.encoder->denoiser=shm"],
     "transport.edges.encoder->denoiser is shm, which works between pods only with transport.sameNodeIpc=true"),
    (["transport.edges.a->b=grpc"], "transport.edges.a->b: unknown edge"),
    (["transport.edges.decoder->reward=pigeon"], "transport.edges.decoder->reward must be one of"),
    (["transport.default=pigeon"], "transport.default must be one of"),
    (["transport.offered=shm\\,grpc", "transport.default=nixl"],
     "transport.default is nixl but transport.offered (shm,grpc) does not offer it"),
    (["transport.offered=shm\\,udp"], "transport.offered must be auto or a comma list"),
    (["transport.nixl.ucxErrorHandling=sometimes"], "transport.nixl.ucxErrorHandling must be empty, none or peer"),
    (["transport.nixl.rdmaCount=0"], "transport.nixl.rdmaCount must be >= 1"),
    (["transport.nixl.ucxEnv.LD_PRELOAD=x"], "transport.nixl.ucxEnv.LD_PRELOAD: only UCX_* variables"),
]

test_template_fail_names_the_transport_field = template_fail_test(FAILS)


@timeout
@pytest.mark.parametrize(("override", "path"), [
    ({"transport": {"default": "pigeon"}}, ["transport", "default"]),
    ({"transport": {"edges": {"a->b": "grpc"}}}, ["transport", "edges"]),
    ({"transport": {"offered": "shm,udp"}}, ["transport", "offered"]),
    ({"transport": {"nixl": {"rdmaCount": 0}}}, ["transport", "nixl", "rdmaCount"]),
    ({"transport": {"nixl": {"ucxEnv": {"PATH": "/x"}}}}, ["transport", "nixl", "ucxEnv"]),
])
def test_schema_rejects_bad_transport_values(override: dict, path: list[str]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(deep_merge(load_values(), override)))
    assert [list(e.absolute_path) for e in errors] == [path]
