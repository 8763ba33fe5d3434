"""Metrics: the /metrics endpoint scraped over HTTP and parsed; names, types and values."""
from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fastvideo3.errors import Unavailable
from fastvideo3.runtime.economy.admission import AdmissionConfig, AdmissionController, Reservation
from fastvideo3.runtime.economy.cost import CalibratedCostModel, DiffusionStepFeatures
from fastvideo3.models.wan.flops import DitConfig, StepShape
from fastvideo3.telemetry.metrics import ServiceMetrics, start_metrics_server


def _scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families: dict, family: str, sample: str, **labels) -> float:
    hits = [s.value for s in families[family].samples if s.name == sample and all(s.labels.get(k) == v
                                                                                   for k, v in labels.items())]
    assert len(hits) == 1, (sample, labels, families[family].samples)
    return hits[0]


@pytest.fixture
def served():
    metrics = ServiceMetrics("scheduler", service="scheduler-0")
    server = start_metrics_server(0, metrics.registry)
    try:
        yield metrics, server
    finally:
        server.close()


@pytest.mark.timeout(60)
def test_endpoint_serves_every_family_with_its_type(served):
    metrics, server = served
    metrics.set_queue_depth(3, "interactive")
    metrics.set_inflight(2)
    metrics.observe_admitted("interactive")
    metrics.observe_admitted("interactive")
    metrics.observe_refused("queue", "batch")
    metrics.observe_finished("SUCCEEDED")
    metrics.observe_finished("FAILED", "DEADLINE_EXCEEDED")
    for s in (0.004, 0.02, 0.3):
        metrics.observe_step("denoiser", "diffusion_step", s)
    metrics.observe_batch(4, "denoiser", "diffusion_step")
    metrics.observe_batch(1, "denoiser", "diffusion_step")
    metrics.observe_prediction("denoiser", "diffusion_step", predicted_s=0.6, measured_s=0.5)
    metrics.set_resident(7, 1 << 20, role="denoiser")
    metrics.observe_transfer("shm", 4096, 0.002)

    f = _scrape(server.url)
    types = {name: fam.type for name, fam in f.items()}
    assert types == {
        "fastvideo3_service_info": "gauge", "fastvideo3_queue_depth": "gauge",
        "fastvideo3_inflight_requests": "gauge", "fastvideo3_requests_admitted": "counter",
        "fastvideo3_requests_refused": "counter", "fastvideo3_requests_finished": "counter",
        "fastvideo3_step_latency_seconds": "histogram", "fastvideo3_batch_size": "histogram",
        "fastvideo3_gpu_seconds": "counter", "fastvideo3_prediction_error_ratio": "histogram",
        "fastvideo3_resident_buffers": "gauge", "fastvideo3_resident_bytes": "gauge",
        "fastvideo3_transfer_bytes": "counter", "fastvideo3_transfer_seconds": "histogram",
    }
    assert _value(f, "fastvideo3_service_info", "fastvideo3_service_info", service="scheduler-0",
                  role="scheduler") == 1
    assert _value(f, "fastvideo3_queue_depth", "fastvideo3_queue_depth", slo_class="interactive") == 3
    assert _value(f, "fastvideo3_inflight_requests", "fastvideo3_inflight_requests", slo_class="all") == 2
    assert _value(f, "fastvideo3_requests_admitted", "fastvideo3_requests_admitted_total",
                  slo_class="interactive") == 2
    assert _value(f, "fastvideo3_requests_refused", "fastvideo3_requests_refused_total",
                  slo_class="batch", reason="queue") == 1
    assert _value(f, "fastvideo3_requests_finished", "fastvideo3_requests_finished_total",
                  status="FAILED", code="DEADLINE_EXCEEDED") == 1
    step = dict(role="denoiser", kind="diffusion_step")
    assert _value(f, "fastvideo3_step_latency_seconds", "fastvideo3_step_latency_seconds_count", **step) == 3
    assert _value(f, "fastvideo3_step_latency_seconds", "fastvideo3_step_latency_seconds_sum",
                  **step) == pytest.approx(0.324)
    assert _value(f, "fastvideo3_step_latency_seconds", "fastvideo3_step_latency_seconds_bucket",
                  le="0.025", **step) == 2
    assert _value(f, "fastvideo3_batch_size", "fastvideo3_batch_size_bucket", le="1.0", **step) == 1
    assert _value(f, "fastvideo3_batch_size", "fastvideo3_batch_size_sum", **step) == 5
    assert _value(f, "fastvideo3_gpu_seconds", "fastvideo3_gpu_seconds_total", source="predicted",
                  **step) == pytest.approx(0.6)
    assert _value(f, "fastvideo3_prediction_error_ratio", "fastvideo3_prediction_error_ratio_sum",
                  **step) == pytest.approx(0.2)
    assert _value(f, "fastvideo3_resident_buffers", "fastvideo3_resident_buffers", role="denoiser") == 7
    assert _value(f, "fastvideo3_resident_bytes", "fastvideo3_resident_bytes", role="denoiser") == 1 << 20
    assert _value(f, "fastvideo3_transfer_bytes", "fastvideo3_transfer_bytes_total", backend="shm",
                  direction="pull") == 4096


@pytest.mark.timeout(60)
def test_pull_sources_cost_model_admission_and_values(served):
    metrics, server = served
    model = CalibratedCostModel()
    feats = DiffusionStepFeatures(DitConfig(num_layers=2, num_heads=2, head_dim=16, ffn_dim=64, text_dim=32,
                                            text_len=8), StepShape(3, 8, 8))
    pred = model.predict("diffusion_step", "k", feats)
    for factor in (1.0, 2.0, 4.0):
        model.observe("diffusion_step", "k", pred.gpu_seconds * factor, pred)
    model.observe("diffusion_step", "k", float("nan"), pred)  # dropped
    stats = model.error_stats()
    metrics.watch_cost_model(model, "wan-tiny")

    adm = AdmissionController(AdmissionConfig(memory_budget_bytes=1000))
    adm.try_admit("r1", [Reservation(2.0, 100, 50)], "interactive")
    metrics.watch_admission(adm, "denoiser")
    metrics.watch_values(lambda: {"units": 12, "busy.seconds": 1.5, "name": "not a number"}, "executor")

    def broken() -> dict:
        raise RuntimeError("source down")

    metrics.watch_values(broken, "broken")
    f = _scrape(server.url)
    assert f["fastvideo3_cost_model_error_ratio"].type == "gauge"
    assert _value(f, "fastvideo3_cost_model_error_ratio", "fastvideo3_cost_model_error_ratio",
                  model="wan-tiny", quantile="0.5") == pytest.approx(stats["median"])
    assert _value(f, "fastvideo3_cost_model_error_ratio", "fastvideo3_cost_model_error_ratio",
                  model="wan-tiny", quantile="0.9") == pytest.approx(stats["p90"])
    assert _value(f, "fastvideo3_cost_model_observations", "fastvideo3_cost_model_observations_total",
                  model="wan-tiny", outcome="used") == 3
    assert _value(f, "fastvideo3_cost_model_observations", "fastvideo3_cost_model_observations_total",
                  model="wan-tiny", outcome="dropped") == 1
    assert _value(f, "fastvideo3_admission_reserved_gpu_seconds", "fastvideo3_admission_reserved_gpu_seconds",
                  pool="denoiser", slo_class="interactive") == 2.0
    assert _value(f, "fastvideo3_admission_in_flight", "fastvideo3_admission_in_flight",
                  pool="denoiser", slo_class="interactive") == 1
    assert _value(f, "fastvideo3_admission_memory_reserved_bytes", "fastvideo3_admission_memory_reserved_bytes",
                  pool="denoiser") == 150
    assert _value(f, "fastvideo3_executor_units", "fastvideo3_executor_units") == 12
    assert _value(f, "fastvideo3_executor_busy_seconds", "fastvideo3_executor_busy_seconds") == 1.5
    assert "fastvideo3_executor_name" not in f and not any(n.startswith("fastvideo3_broken") for n in f)

    # live: a later scrape sees the new state
    adm.release("r1")
    f = _scrape(server.url)
    assert _value(f, "fastvideo3_admission_in_flight", "fastvideo3_admission_in_flight",
                  pool="denoiser", slo_class="interactive") == 0


@pytest.mark.timeout(60)
def test_services_do_not_clash_and_busy_port_is_unavailable():
    a, b = ServiceMetrics("encoder"), ServiceMetrics("decoder")
    a.observe_step("encoder", "encoder_chunk", 0.1)
    b.observe_step("decoder", "vae_tile", 0.2)
    server = start_metrics_server(0, a.registry)
    try:
        f = _scrape(server.url)
        assert [s.labels["role"] for s in f["fastvideo3_step_latency_seconds"].samples
                if s.name.endswith("_count")] == ["encoder"]
        with pytest.raises(Unavailable) as e:
            start_metrics_server(server.port, b.registry)
        assert e.value.field == "metrics_port"
    finally:
        server.close()
    with socket.socket() as s:  # the listener is gone after close (TIME_WAIT aside)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", server.port))


@pytest.mark.timeout(60)
def test_invalid_observations_are_dropped(served):
    metrics, server = served
    metrics.observe_step("denoiser", "diffusion_step", float("nan"))
    metrics.observe_prediction("denoiser", "diffusion_step", 0.5, 0.0)
    metrics.observe_prediction("denoiser", "diffusion_step", float("inf"), 1.0)
    f = _scrape(server.url)
    assert not [s for s in f["fastvideo3_step_latency_seconds"].samples]
    assert not [s for s in f["fastvideo3_prediction_error_ratio"].samples]
