"""The Helm chart (deploy/helm/fastvideo3) and the image build (Dockerfile).

Renders the chart with a real `helm` (deploy/scripts/install-helm.sh) for four value sets and
checks the objects: Kubernetes schemas (kubernetes-validate, strict), selectors against pod
labels, Services against pods and named ports, native gRPC probes on the serving port, GPU
requests, the fleet ConfigMap, state-store and Dynamo wiring, and every `fail` message.
What this cannot check — pods starting, images building, probes passing — needs a cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import pytest
import yaml

try:
    from helm_render import (
        CHART_DIR, NAMESPACE, REPO_ROOT, VALUES_DIR, Rendered,
        deep_merge, lint, load_values, name, render, render_error, require_helm, template_fail_test,
    )
except ImportError:  # tests/unit imported as a package
    from tests.unit.helm_render import (  # type: ignore[no-redef]
        CHART_DIR, NAMESPACE, REPO_ROOT, VALUES_DIR, Rendered,
        deep_merge, lint, load_values, name, render, render_error, require_helm, template_fail_test,
    )

ROLES = ("encoder", "denoiser", "decoder", "reward")
VALUE_SETS = {
    "default": (),
    "gpu-production": (VALUES_DIR / "gpu-production.yaml",),
    "cpu-minimal": (VALUES_DIR / "cpu-minimal.yaml",),
    "dynamo-etcd": (VALUES_DIR / "dynamo-etcd.yaml",),
}
# Every kind the chart may emit, with its apiVersion.
API_VERSIONS = {
    "Deployment": "apps/v1",
    "Service": "v1",
    "ConfigMap": "v1",
    "PersistentVolumeClaim": "v1",
    "Pod": "v1",
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
timeout = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def helm() -> str:
    return require_helm()


_cache: dict[str, Rendered] = {}


def rendered(helm: str, value_set: str) -> Rendered:
    if value_set not in _cache:
        _cache[value_set] = Rendered(render(helm, VALUE_SETS[value_set]))
    return _cache[value_set]


def values_of(value_set: str) -> dict:
    return load_values(*VALUE_SETS[value_set])


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]


def container(deployment: dict, container_name: str) -> dict:
    for c in pod_spec(deployment)["containers"]:
        if c["name"] == container_name:
            return c
    raise KeyError(container_name)


def env_of(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def port_arg(c: dict) -> int:
    (value,) = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--port=")]
    return int(value)


# --- values and schema (no helm needed) ---------------------------------------------------


@timeout
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_values_files_match_schema(value_set: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(values_of(value_set))


@timeout
@pytest.mark.parametrize(
    ("override", "path"),
    [
        ({"pools": {"denoiser": {"replicas": -1}}}, ["pools", "denoiser", "replicas"]),
        ({"pools": {"decodr": {}}}, ["pools"]),
        ({"pools": {"encoder": {"gpu": "one"}}}, ["pools", "encoder", "gpu"]),
        ({"scheduler": {"port": 70000}}, ["scheduler", "port"]),
        ({"redis": {"externalUrl": "http://x"}}, ["redis", "externalUrl"]),
        ({"dynamo": {"discovery": {"backend": "nats"}}}, ["dynamo", "discovery", "backend"]),
        ({"sheduler": {}}, []),
    ],
)
def test_schema_rejects_bad_values(override: dict, path: list[str]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(deep_merge(load_values(), override)))
    assert errors, f"schema accepted {override}"
    assert [list(e.absolute_path) for e in errors] == [path]


# --- rendering ----------------------------------------------------------------------------


@timeout
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_helm_lint_strict(helm: str, value_set: str) -> None:
    out = lint(helm, VALUE_SETS[value_set])
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@timeout
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_objects_are_well_formed(helm: str, value_set: str) -> None:
    r = rendered(helm, value_set)
    assert r.objects
    seen = set()
    for obj in r.objects:
        kind, meta = obj["kind"], obj["metadata"]
        assert obj["apiVersion"] == API_VERSIONS[kind], (kind, obj["apiVersion"])
        assert DNS_LABEL.match(meta["name"]) and len(meta["name"]) <= 63, meta["name"]
        assert meta["namespace"] == NAMESPACE
        assert meta["labels"]["app.kubernetes.io/instance"] == "fv"
        assert meta["labels"]["app.kubernetes.io/part-of"] == "fastvideo3"
        assert (kind, meta["name"]) not in seen, f"duplicate {kind}/{meta['name']}"
        seen.add((kind, meta["name"]))


@timeout
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_objects_match_kubernetes_schemas(helm: str, value_set: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for obj in rendered(helm, value_set).objects:
        try:
            kv.validate(obj, "1.31", strict=True)
        except kv.ValidationError as err:
            where = "/".join(str(p) for p in err.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} at {where}: {err.message}")


@timeout
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_selectors_match_pod_labels(helm: str, value_set: str) -> None:
    for dep in rendered(helm, value_set).of_kind("Deployment"):
        selector = dep["spec"]["selector"]["matchLabels"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert selector and selector.items() <= labels.items(), dep["metadata"]["name"]
        assert set(selector) == {
            "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
        }


@timeout
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_services_select_pods_and_named_ports(helm: str, value_set: str) -> None:
    r = rendered(helm, value_set)
    deployments = r.of_kind("Deployment")
    for svc in r.of_kind("Service"):
        sel = svc["spec"]["selector"]
        targets = [
            d for d in deployments
            if sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, f"Service {svc['metadata']['name']} selects {len(targets)}"
        pod_ports = {
            p["name"]: p["containerPort"]
            for c in pod_spec(targets[0])["containers"]
            for p in c.get("ports", [])
        }
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in pod_ports, (svc["metadata"]["name"], port)


@timeout
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_fleet_containers_have_resources_and_grpc_probes(helm: str, value_set: str) -> None:
    r = rendered(helm, value_set)
    values = values_of(value_set)
    fleet = [("scheduler", values["scheduler"])] + [
        (role, values["pools"][role]) for role in ROLES if values["pools"][role]["enabled"]
    ]
    for component, vals in fleet:
        dep = r.get("Deployment", name(component))
        c = container(dep, component)
        assert c["command"] == ["python", "-m", f"services.{component}"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {"grpc": vals["port"], "metrics": values["metrics"]["port"]}
        assert port_arg(c) == vals["port"]
        assert f"--metrics-port={values['metrics']['port']}" in c["args"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": vals["port"]}, (component, probe)
        assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
        assert pod_spec(dep)["securityContext"]["runAsNonRoot"] is True
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["config"] == "/etc/fastvideo3"
        annotations = dep["spec"]["template"]["metadata"]["annotations"]
        assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/config"])
    # Other containers (Redis, Dynamo) still carry resources and probes.
    for dep in r.of_kind("Deployment"):
        for c in pod_spec(dep)["containers"]:
            assert c["resources"].get("requests") and c["resources"].get("limits"), c["name"]
            assert {"readinessProbe", "livenessProbe"} <= c.keys(), c["name"]


@timeout
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_pools_follow_values(helm: str, value_set: str) -> None:
    r = rendered(helm, value_set)
    values = values_of(value_set)
    for role in ROLES:
        pool = values["pools"][role]
        if not pool["enabled"]:
            assert not r.has("Deployment", name(role)) and not r.has("Service", name(role))
            continue
        dep = r.get("Deployment", name(role))
        assert dep["spec"]["replicas"] == pool["replicas"]
        card = pool.get("card") or values["card"]
        c = container(dep, role)
        assert f"--card={card}" in c["args"]
        tag = values["image"]["tag"] or "0.1.0"
        assert c["image"] == f"{values['image']['repository']}-{role}:{tag}"
        spec = pod_spec(dep)
        assert spec.get("nodeSelector", {}) == pool["nodeSelector"]
        assert spec.get("tolerations", []) == pool["tolerations"]
        shm = {v["name"]: v for v in spec["volumes"]}["dshm"]["emptyDir"]
        assert shm == {"medium": "Memory", "sizeLimit": pool["shmSize"]}
        svc = r.get("Service", name(role))
        assert svc["spec"]["clusterIP"] == "None", "pool Services are headless"
        gpus = pool["gpu"]
        res = c["resources"]
        if gpus:
            assert res["limits"]["nvidia.com/gpu"] == gpus
            assert res["requests"]["nvidia.com/gpu"] == gpus
            assert dep["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
            assert spec.get("runtimeClassName", "") == pool["runtimeClassName"]
        else:
            assert "nvidia.com/gpu" not in res.get("limits", {})
            assert "nvidia.com/gpu" not in res.get("requests", {})


@timeout
def test_gpu_production_requests_gpus(helm: str) -> None:
    r = rendered(helm, "gpu-production")
    gpus = {
        role: container(r.get("Deployment", name(role)), role)["resources"]["limits"]["nvidia.com/gpu"]
        for role in ROLES
    }
    assert gpus == {"encoder": 1, "denoiser": 1, "decoder": 1, "reward": 1}
    assert r.get("Deployment", name("denoiser"))["spec"]["replicas"] == 8
    assert container(r.get("Deployment", name("denoiser")), "denoiser")["image"] == (
        "registry.example.com/fastvideo3-denoiser:0.1.0"
    )


@timeout
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_configmap_describes_the_fleet(helm: str, value_set: str) -> None:
    r = rendered(helm, value_set)
    values = values_of(value_set)
    files = r.config()
    assert set(files) == {"fleet.yaml", "cards.yaml", "deployment-card.yaml"}
    fleet, card = files["fleet.yaml"], files["deployment-card.yaml"]
    enabled = [role for role in ROLES if values["pools"][role]["enabled"]]
    assert sorted(fleet["pools"]) == sorted(enabled)
    assert fleet["scheduler"]["port"] == values["scheduler"]["port"]
    assert files["cards.yaml"] == {"cards": values["cards"]}
    for role in enabled:
        host, port = fleet["pools"][role]["address"].rsplit(":", 1)
        svc_name, svc_ns = host.split(".")[:2]
        assert svc_ns == NAMESPACE and host.endswith(".svc.cluster.local")
        svc = r.get("Service", svc_name)
        assert int(port) in [p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"]
        assert fleet["pools"][role]["gpus_per_replica"] == values["pools"][role]["gpu"]
    assert [p["role"] for p in card["role_pools"]] == enabled
    assert card["health"]["protocol"] == "grpc.health.v1"
    assert values["card"] in card["model_cards"]
    assert card["frontend"]["enabled"] == values["dynamo"]["enabled"]


@timeout
def test_state_store_wiring(helm: str) -> None:
    bundled = container(rendered(helm, "default").get("Deployment", name("scheduler")), "scheduler")
    assert "--state-store=$(FASTVIDEO3_STATE_STORE)" in bundled["args"]
    url = env_of(bundled)["FASTVIDEO3_STATE_STORE"]
    host, port_db = url.removeprefix("redis://").split(":")
    assert host == name("redis") and port_db == "6379/0"
    redis_svc = rendered(helm, "default").get("Service", host)
    assert redis_svc["spec"]["ports"][0]["port"] == 6379

    external = rendered(helm, "gpu-production")
    assert not external.has("Deployment", name("redis"))
    sched = container(external.get("Deployment", name("scheduler")), "scheduler")
    secret = env_of(sched)["FASTVIDEO3_STATE_STORE"]["secretKeyRef"]
    assert secret == {"name": "fastvideo3-redis", "key": "url"}

    memory = rendered(helm, "cpu-minimal")
    sched = container(memory.get("Deployment", name("scheduler")), "scheduler")
    assert not any(a.startswith("--state-store") for a in sched["args"])
    assert "FASTVIDEO3_STATE_STORE" not in env_of(sched)
    assert not memory.has("Service", name("redis"))
    assert memory.config()["fleet.yaml"]["state_store"] == {"kind": "memory"}

    persisted = rendered(helm, "dynamo-etcd")
    claim = persisted.get("PersistentVolumeClaim", name("redis"))
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    redis = container(persisted.get("Deployment", name("redis")), "redis")
    assert "--appendonly" in redis["args"]


@timeout
def test_cpu_minimal_has_no_reward_redis_or_dynamo(helm: str) -> None:
    r = rendered(helm, "cpu-minimal")
    components = {
        d["metadata"]["labels"]["app.kubernetes.io/component"] for d in r.of_kind("Deployment")
    }
    assert components == {"scheduler", "encoder", "denoiser", "decoder", "gateway"}  # the playground stays
    test_pod = r.of_kind("Pod", hooks=True)[0]
    assert not any("reward" in arg for arg in test_pod["spec"]["containers"][0]["command"])


@timeout
def test_dynamo_colocated_worker(helm: str) -> None:
    assert not rendered(helm, "default").has("Deployment", name("frontend"))
    r = rendered(helm, "gpu-production")
    dep = r.get("Deployment", name("frontend"))
    assert dep["spec"]["replicas"] == 2
    assert not r.has("Deployment", name("dynamo-worker"))
    frontend, worker = container(dep, "frontend"), container(dep, "worker")
    assert frontend["command"] == ["python", "-m", "dynamo.frontend"]
    assert {"--http-host=0.0.0.0", "--http-port=8000", "--discovery-backend=file",
            "--request-plane=tcp", "--event-plane=zmq"} <= set(frontend["args"])
    assert worker["command"] == ["python", "-m", "fleet.dynamo"]
    assert worker["args"][0] == f"--scheduler={name('scheduler')}:50051"
    assert r.has("Service", name("scheduler"))
    for c in (frontend, worker):
        env = env_of(c)
        assert env["DYN_DISCOVERY_BACKEND"] == "file"
        assert env["DYN_TCP_RPC_HOST"] == "127.0.0.1"
        assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["dynamo-kv"] == env["DYN_FILE_KV"]
    assert {v["name"]: v for v in pod_spec(dep)["volumes"]}["dynamo-kv"] == {
        "name": "dynamo-kv", "emptyDir": {}
    }
    svc = r.get("Service", name("frontend"))
    assert svc["spec"]["type"] == "LoadBalancer" and svc["spec"]["ports"][0]["port"] == 80


@timeout
def test_dynamo_separate_worker_with_etcd(helm: str) -> None:
    r = rendered(helm, "dynamo-etcd")
    frontend = r.get("Deployment", name("frontend"))
    assert [c["name"] for c in pod_spec(frontend)["containers"]] == ["frontend"]
    worker_dep = r.get("Deployment", name("dynamo-worker"))
    assert worker_dep["spec"]["replicas"] == 2
    worker = container(worker_dep, "worker")
    env = env_of(worker)
    assert env["DYN_DISCOVERY_BACKEND"] == "etcd"
    assert env["ETCD_ENDPOINTS"] == "http://etcd.etcd.svc:2379"
    assert env["DYN_TCP_RPC_HOST"] == "$(POD_IP)"
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert worker["readinessProbe"]["httpGet"] == {"path": "/health", "port": "dyn-system"}


# --- fail messages -----------------------------------------------------------------------

FAILS = [
    (["pools.denoiser.replicas=-1"], "pools.denoiser.replicas must be >= 0 (got -1)"),
    (["scheduler.replicas=-2"], "scheduler.replicas must be >= 0 (got -2)"),
    (["pools.encoder.gpu=-1"], "pools.encoder.gpu must be >= 0"),
    (["image.repository=", "scheduler.image.repository=r/s", "pools.encoder.image.repository=r/e",
      "pools.denoiser.gpu=1"],
     "pools.denoiser.gpu is 1 but the pool has no image"),
    (["image.repository="], "has no image: set"),
    (["pools.decodr.enabled=true"], "pools.decodr: unknown role"),
    (["redis.externalUrl=redis://r:6379/0"],
     "redis.enabled (bundled Redis) and redis.externalUrl/redis.externalUrlSecret are mutually exclusive"),
    (["redis.enabled=false", "redis.externalUrl=redis://r/0", "redis.externalUrlSecret.name=s"],
     "redis.externalUrl and redis.externalUrlSecret.name are mutually exclusive"),
    (["redis.enabled=false", "redis.externalUrl=http://r"],
     "redis.externalUrl must start with redis://"),
    (["dynamo.enabled=true", "scheduler.enabled=false"], "dynamo.enabled requires scheduler.enabled"),
    (["dynamo.enabled=true", "dynamo.worker.colocated=false"], "dynamo.discovery.sharedClaimName"),
    (["dynamo.enabled=true", "dynamo.discovery.backend=etcd"], "dynamo.discovery.etcdEndpoints is required"),
    (["dynamo.enabled=true", "dynamo.frontend.replicas=-1"], "dynamo.frontend.replicas must be >= 0"),
    ([f"pools.{r}.enabled=false" for r in ROLES], "scheduler.enabled is true but no pool is enabled"),
    (["card=", "pools.encoder.card="], "pools.encoder.card is empty"),
    (["pools.denoiser.resources.limits.nvidia\\.com/gpu=2"], "use pools.denoiser.gpu instead"),
    (["pools.denoiser.gpu=2", "pools.denoiser.plan=cfg2xulysses2"],
     "pools.denoiser.plan cfg2xulysses2 has degree 4 but pools.denoiser.gpu is 2"),
    (["pools.denoiser.plan=ulysses2"], "pools.denoiser.plan ulysses2 has degree 2 but pools.denoiser.gpu is 0"),
    (["pools.encoder.plan=ulysses2"], "pools.encoder.plan is set: only the denoiser"),
    (["pools.denoiser.plan=tp2"], "pools.denoiser.plan \"tp2\" is not a plan"),
]

test_template_fail_names_the_field = template_fail_test(FAILS)


@timeout
@pytest.mark.parametrize(
    ("sets", "where"),
    [
        (["pools.denoiser.replicas=-1"], "/pools/denoiser/replicas"),
        (["pools.decodr.enabled=true"], "decodr"),
        (["dynamo.discovery.backend=nats"], "/dynamo/discovery/backend"),
    ],
)
def test_schema_failure_names_the_field(helm: str, sets: list[str], where: str) -> None:
    err = render_error(helm, set_values=sets)
    assert where in err


@timeout
def test_parallel_denoiser_pod_runs_one_process_per_gpu(helm: str) -> None:
    r = Rendered(render(helm, set_values=["pools.denoiser.gpu=4", "pools.denoiser.plan=cfg2xulysses2"]))
    c = container(r.get("Deployment", name("denoiser")), "denoiser")
    assert "--nproc=4" in c["args"] and "--plan=cfg2xulysses2" in c["args"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    err = render_error(helm, set_values=["pools.denoiser.plan=ulysses2xfoo"])
    assert "/pools/denoiser/plan" in err


@timeout
def test_external_redis_and_enabled_dynamo_render(helm: str) -> None:
    r = Rendered(render(helm, set_values=[
        "redis.enabled=false", "redis.externalUrl=rediss://cache:6380/2", "dynamo.enabled=true",
    ]))
    sched = container(r.get("Deployment", name("scheduler")), "scheduler")
    assert env_of(sched)["FASTVIDEO3_STATE_STORE"] == "rediss://cache:6380/2"
    assert r.get("Deployment", name("frontend"))


# --- the `helm test` pod, run against a real gRPC health server ---------------------------


@timeout
def test_helm_test_pod_script_checks_grpc_health(helm: str) -> None:
    grpc = pytest.importorskip("grpc")
    health = pytest.importorskip("grpc_health.v1.health")
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    (pod,) = rendered(helm, "default").of_kind("Pod", hooks=True)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    command = pod["spec"]["containers"][0]["command"]
    assert command[:2] == ["python", "-c"]
    addresses = command[3:]
    assert addresses[0].startswith(f"{name('scheduler')}.{NAMESPACE}.svc")
    assert len(addresses) == 1 + len(ROLES)

    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        local = [sys.executable, "-c", command[2], f"127.0.0.1:{port}", f"127.0.0.1:{port}"]
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        ok = subprocess.run(local, capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.count("SERVING") == 2
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        bad = subprocess.run(local, capture_output=True, text=True, timeout=30)
        assert bad.returncode == 1 and "NOT_SERVING" in bad.stderr
    finally:
        server.stop(None)


# --- the image build ---------------------------------------------------------------------


@timeout
def test_dockerfile_builds_every_role_from_one_file() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    assert "ARG ROLE" in text
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", text, re.M)
    (roles,) = re.findall(r"^\s+([a-z|]+)\) ;; \\$", text, re.M)
    chart_roles = (CHART_DIR / "templates" / "_helpers.tpl").read_text()
    pool_roles = re.search(r'define "fastvideo3.roles" -}}\n(.*)\n', chart_roles).group(1).split()
    assert pool_roles == list(ROLES)
    assert set(roles.split("|")) == {"scheduler", "dynamo", "gateway", *ROLES}
    # The image's user is the one the chart's pods run as.
    uid = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["podSecurityContext"]["runAsUser"]
    assert f"USER {uid}:{uid}" in text
    assert 'm=services.$FASTVIDEO3_ROLE' in text and "m=fleet.dynamo" in text
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests", "deploy"} <= set(ignored)


@timeout
def test_image_entrypoint_maps_roles_to_modules(tmp_path: Path) -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    entry = yaml.safe_load(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    env_path = f"{tmp_path}:{os.environ['PATH']}"
    for role, module in [("denoiser", "services.denoiser"), ("dynamo", "fleet.dynamo")]:
        out = subprocess.run(
            [*entry, "--port", "50053", "--card", "a b"], capture_output=True, text=True,
            env={"PATH": env_path, "FASTVIDEO3_ROLE": role}, timeout=10, check=True,
        ).stdout.splitlines()
        assert out == ["-m", module, "--port", "50053", "--card", "a b"]


@timeout
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_cards_named_in_values_are_built_in_or_defined(value_set: str) -> None:
    registry = pytest.importorskip("fastvideo3.card.registry")
    values = values_of(value_set)
    known = set(registry.builtin_cards()) | set(values["cards"])
    named = {values["card"]} | {p["card"] for p in values["pools"].values() if p.get("card")}
    assert named <= known, f"unknown cards {sorted(named - known)}; known {sorted(known)}"


def test_scheduler_replicas_elect_a_leader_through_the_state_store(helm: str) -> None:
    objs = render(helm, set_values=["scheduler.replicas=2", "scheduler.leaderLeaseSeconds=3"])
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("scheduler"))
    assert dep["spec"]["replicas"] == 2
    c = container(dep, "scheduler")
    assert "--leader-lease=3" in c["args"] and any(a.startswith("--advertise=$(POD_IP):") for a in c["args"])
    assert "POD_IP" in env_of(c) and any(a.startswith("--state-store=") for a in c["args"])
    err = render_error(helm, set_values=["scheduler.replicas=2", "redis.enabled=false"])  # two replicas without a shared store would admit twice
    assert "scheduler.replicas > 1 needs a shared state store" in err
