"""The chart's optional autoscaling objects (templates/autoscaling.yaml): HPA on the external
metric fastvideo3_scaling_replicas_needed, or KEDA ScaledObjects on the same series; values
schema-checked and combinations validated like the rest of the chart."""
from __future__ import annotations

import json

import pytest
import yaml

try:
    from helm_render import CHART_DIR, NAMESPACE, RELEASE, Rendered, deep_merge, load_values, name, render, \
        render_error, require_helm
except ImportError:  # tests/unit imported as a package
    from tests.unit.helm_render import (  # type: ignore[no-redef]
        CHART_DIR, NAMESPACE, RELEASE, Rendered, deep_merge, load_values, name, render, render_error, require_helm,
    )

timeout = pytest.mark.timeout(60)
ENGINE = f"{RELEASE}-fastvideo3.{NAMESPACE}"
BASE = ["image.repository=reg/fastvideo3", "autoscaling.enabled=true"]


@pytest.fixture(scope="module")
def helm() -> str:
    return require_helm()


def _write(tmp_path, values: dict):
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@timeout
def test_off_by_default(helm: str) -> None:
    r = Rendered(render(helm, set_values=["image.repository=reg/fastvideo3"]))
    assert not r.of_kind("HorizontalPodAutoscaler") and not r.of_kind("ScaledObject")
    fleet = r.config()["fleet.yaml"]
    assert fleet["engine_id"] == ENGINE  # the `fleet` label the scaling series carry
    assert fleet["scheduler"]["scaling_target_utilization"] == 0.7
    assert fleet["scheduler"]["scaling_window_s"] == 60


@timeout
def test_hpa_scales_each_enabled_pool_on_its_role_series(helm: str) -> None:
    r = Rendered(render(helm, set_values=[*BASE, "autoscaling.pools.decoder.enabled=true",
                                          "autoscaling.pools.reward.enabled=true", "pools.reward.enabled=false"]))
    hpas = {h["metadata"]["name"]: h for h in r.of_kind("HorizontalPodAutoscaler")}
    assert set(hpas) == {name("denoiser"), name("decoder")}  # reward: the pool is off
    for role in ("denoiser", "decoder"):
        h = hpas[name(role)]
        assert h["apiVersion"] == "autoscaling/v2"
        target = h["spec"]["scaleTargetRef"]
        assert r.has("Deployment", target["name"]) and target["kind"] == "Deployment"
        (metric,) = h["spec"]["metrics"]
        assert metric["type"] == "External"
        assert metric["external"]["metric"]["name"] == "fastvideo3_scaling_replicas_needed"
        assert metric["external"]["metric"]["selector"]["matchLabels"] == {"fleet": ENGINE, "role": role}
        # AverageValue 1: desired replicas = ceil(replicas_needed)
        assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert hpas[name("denoiser")]["spec"]["minReplicas"] == 1 and hpas[name("denoiser")]["spec"]["maxReplicas"] == 8
    kv = pytest.importorskip("kubernetes_validate")
    for h in hpas.values():
        kv.validate(h, "1.31", strict=True)


@timeout
def test_keda_scaled_objects_query_the_same_series(helm: str, tmp_path) -> None:
    values = _write(tmp_path, {"autoscaling": {"kind": "keda", "targetUtilization": 0.6, "windowSeconds": 120,
                                               "keda": {"serverAddress": "http://prom:9090", "pollingInterval": 10,
                                                        "cooldownPeriod": 120}}})
    r = Rendered(render(helm, [values], set_values=BASE))
    (so,) = r.of_kind("ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert r.has("Deployment", so["spec"]["scaleTargetRef"]["name"])
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "1"
    assert trigger["metadata"]["query"] == f'max(fastvideo3_scaling_replicas_needed{{fleet="{ENGINE}",role="denoiser"}})'
    assert trigger["metadata"]["serverAddress"] == "http://prom:9090"
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"], so["spec"]["pollingInterval"]) == (1, 8, 10)
    sched = r.config()["fleet.yaml"]["scheduler"]
    assert sched["scaling_target_utilization"] == 0.6 and sched["scaling_window_s"] == 120
    assert not r.of_kind("HorizontalPodAutoscaler")


@timeout
@pytest.mark.parametrize(("override", "path"), [
    ({"autoscaling": {"kind": "vpa"}}, ["autoscaling", "kind"]),
    ({"autoscaling": {"targetUtilization": 1.5}}, ["autoscaling", "targetUtilization"]),
    ({"autoscaling": {"targetUtilization": 0}}, ["autoscaling", "targetUtilization"]),
    ({"autoscaling": {"windowSeconds": 0.5}}, ["autoscaling", "windowSeconds"]),
    ({"autoscaling": {"pools": {"denoiser": {"maxReplicas": 0}}}}, ["autoscaling", "pools", "denoiser", "maxReplicas"]),
    ({"autoscaling": {"pools": {"upscaler": {"enabled": True, "minReplicas": 1, "maxReplicas": 2}}}},
     ["autoscaling", "pools"]),
    ({"autoscaling": {"keda": {"serverAddress": "prom:9090"}}}, ["autoscaling", "keda", "serverAddress"]),
])
def test_schema_rejects_bad_autoscaling_values(override: dict, path: list[str]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(deep_merge(load_values(), override)))
    assert [list(e.absolute_path) for e in errors] == [path], [e.message for e in errors]


@timeout
@pytest.mark.parametrize(("sets", "message"), [
    (["autoscaling.pools.denoiser.maxReplicas=0"], "autoscaling.pools.denoiser.maxReplicas (0) must be >= minReplicas (1)"),
    (["autoscaling.pools.denoiser.minReplicas=0"], "autoscaling.pools.denoiser.minReplicas must be >= 1"),
    (["autoscaling.kind=vpa"], "autoscaling.kind must be hpa or keda"),
    (["scheduler.enabled=false", "gateway.enabled=false"], "autoscaling.enabled requires scheduler.enabled"),
    (["autoscaling.pools.upscaler.enabled=true"], "autoscaling.pools.upscaler: unknown role"),
])
def test_template_fail_names_the_field(helm: str, sets: list[str], message: str) -> None:
    err = render_error(helm, set_values=[*BASE, *sets], skip_schema=True)
    assert message in err


@timeout
def test_template_checks_target_utilization_without_the_schema(helm: str, tmp_path) -> None:
    values = _write(tmp_path, {"autoscaling": {"targetUtilization": 1.5}})
    err = render_error(helm, [values], set_values=BASE, skip_schema=True)
    assert "autoscaling.targetUtilization must be in (0, 1] (got 1.5)" in err
