"""The chart's gateway (templates/gateway.yaml): rendered with a real helm, its flags parsed by
the gateway's own argument parser, its probes and Service checked, and its value checks failing
with the field named. The chart-wide checks in test_helm_chart.py (Kubernetes schemas, selectors,
resources and probes on every container) cover its objects too."""
from __future__ import annotations

import pytest

from tests.unit.helm_render import (
    NAMESPACE, VALUES_DIR, Rendered, load_values, name, render, render_error, require_helm,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def helm() -> str:
    return require_helm()


def gateway_container(r: Rendered) -> dict:
    (c,) = r.get("Deployment", name("gateway"))["spec"]["template"]["spec"]["containers"]
    return c


def test_gateway_is_deployed_against_the_scheduler_with_the_fleets_state_store(helm):
    r = Rendered(render(helm))
    values = load_values()
    c = gateway_container(r)
    assert c["command"] == ["python", "-m", "fleet.gateway"]
    sched_port = values["scheduler"]["port"]
    assert f"--scheduler={name('scheduler')}.{NAMESPACE}.svc.cluster.local:{sched_port}" in c["args"]
    sched = r.get("Deployment", name("scheduler"))["spec"]["template"]["spec"]["containers"][0]
    assert c["env"] == [e for e in sched["env"] if e["name"] == "FASTVIDEO3_STATE_STORE"]
    assert "--state-store=$(FASTVIDEO3_STATE_STORE)" in c["args"]

    # the flags the chart writes are flags the gateway accepts
    from fleet.gateway.config import parse_args
    env = {e["name"]: e["value"] for e in c["env"]}
    cfg = parse_args([a.replace("$(FASTVIDEO3_STATE_STORE)", env["FASTVIDEO3_STATE_STORE"]) for a in c["args"]])
    assert (cfg.port, cfg.host, cfg.media_dir) == (values["gateway"]["port"], "0.0.0.0", "/var/lib/fastvideo3/media")
    assert cfg.state_store.startswith("redis://") and cfg.api_keys_file is None
    assert cfg.max_body_bytes == values["gateway"]["maxBodyBytes"]

    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": values["gateway"]["port"]}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    svc = r.get("Service", name("gateway"))
    assert svc["spec"]["ports"] == [{"name": "http", "port": values["gateway"]["service"]["port"],
                                     "targetPort": "http", "protocol": "TCP", "appProtocol": "http"}]
    volumes = {v["name"]: v for v in r.get("Deployment", name("gateway"))["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["media"]


def test_api_keys_secret_and_media_claim(helm):
    r = Rendered(render(helm, set_values=["gateway.apiKeys.secretName=gw-keys", "gateway.media.claimName=videos",
                                          "gateway.replicas=2"]))
    c = gateway_container(r)
    assert "--api-keys-file=/etc/fastvideo3-gateway/keys" in c["args"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["api-keys"] == "/etc/fastvideo3-gateway"
    spec = r.get("Deployment", name("gateway"))["spec"]
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert volumes["api-keys"]["secret"]["secretName"] == "gw-keys"
    assert volumes["media"]["persistentVolumeClaim"] == {"claimName": "videos"}
    assert spec["replicas"] == 2


def test_gateway_can_be_turned_off(helm):
    r = Rendered(render(helm, set_values=["gateway.enabled=false"]))
    assert not r.has("Deployment", name("gateway")) and not r.has("Service", name("gateway"))


@pytest.mark.parametrize(("files", "sets", "message"), [
    ((), ["scheduler.enabled=false"], "gateway.enabled requires scheduler.enabled"),
    ((), ["gateway.replicas=2"], "gateway.media.claimName is empty"),
    ((VALUES_DIR / "cpu-minimal.yaml",), ["gateway.replicas=2", "gateway.media.claimName=v"],
     "the state store is in memory"),
    ((), ["image.repository=", "scheduler.image.repository=r/s"] +
     [f"pools.{r}.image.repository=r/{r}" for r in ("encoder", "denoiser", "decoder", "reward")],
     "gateway has no image"),
])
def test_template_checks_name_the_field(helm, files, sets, message):
    err = render_error(helm, files, set_values=sets, skip_schema=True)
    assert message in err


@pytest.mark.parametrize(("sets", "where"), [
    (["gateway.maxJobsPerKey=0"], "/gateway/maxJobsPerKey"),
    (["gateway.maxBodyBytes=10"], "/gateway/maxBodyBytes"),
    (["gateway.service.type=Ingress"], "/gateway/service/type"),
    (["gateway.colour=red"], "colour"),
])
def test_schema_rejects_bad_gateway_values(helm, sets, where):
    err = render_error(helm, set_values=sets)
    assert where in err
