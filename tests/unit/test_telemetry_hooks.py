"""Scheduler and pool hooks: the call sequence CoreScheduler makes yields the documented span
tree, a report with every phase, and the metrics each side owns."""
from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fastvideo3.errors import ErrorInfo
from fastvideo3.loop.protocol import Resources, StepResult
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.telemetry import names as N
from fastvideo3.telemetry.exporters import span_to_dict
from fastvideo3.telemetry.hooks import PoolTelemetry, SchedulerTelemetry
from fastvideo3.telemetry.metrics import ServiceMetrics
from fastvideo3.telemetry.slo import SpanRecord, build_report
from fastvideo3.telemetry.tracing import Tracing, init_tracing, inject_metadata


def _unit(rid: str, step: int, kind: str = "diffusion_step", role: str = "denoiser", gpu_s: float = 0.5):
    return WorkUnit(unit_id=f"{rid}-{kind}-{step}", request_id=rid, loop_id="x", kind=kind, role=role,
                    card_id="wan-tiny", shape_sig="s", step=step, resources=Resources(gpu_seconds=gpu_s))


def _sample(metrics: ServiceMetrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def _fake_pool(pool: PoolTelemetry, fail: str | None = None):
    """An Execute handler: the units crossed the wire, gRPC metadata came with them."""
    def execute(units: list[WorkUnit], metadata) -> list[StepResult]:
        wire = [WorkUnit(**{**u.__dict__, "trace": dict(u.trace)}) for u in units]

        def run(batch):
            for u in batch:  # a pull of this unit's input, parented on its (re-pointed) carrier
                with pool.transfer("shm", 2048, parent=u.trace, request_id=u.request_id):
                    pass
            return [StepResult(u.unit_id, u.request_id, ok=u.request_id != fail, measured_seconds=0.01,
                               error=ErrorInfo("ABORTED", "nan") if u.request_id == fail else None)
                    for u in batch]
        return pool.run_batch(wire, run, metadata=metadata)
    return execute


@pytest.mark.timeout(60)
def test_scheduler_and_pool_hooks_build_the_span_tree_and_metrics():
    s_out, p_out = InMemorySpanExporter(), InMemorySpanExporter()
    s_metrics, p_metrics = ServiceMetrics("scheduler"), ServiceMetrics("denoiser")
    sched = SchedulerTelemetry(init_tracing("scheduler", exporter=s_out, set_global=False), s_metrics)
    pool = PoolTelemetry("denoiser", tracing=init_tracing("denoiser", exporter=p_out, set_global=False),
                         metrics=p_metrics, replica="denoiser-0")
    execute = _fake_pool(pool, fail="r2")

    t0 = time.time()
    for rid, cls in (("r1", "interactive"), ("r2", "batch")):
        sched.submitted(rid, "wan-tiny", cls, created_s=t0)
        sched.started(rid, queued_since_s=t0, started_s=t0 + 0.001)
        sched.admission(rid, "admitted", start_s=t0 + 0.001, end_s=t0 + 0.002)
        sched.loop_started(rid, "diffusion_denoise")
    sched.refused("queue", "batch")
    sched.set_load(queued=0, running=2)
    for step in range(2):  # two ticks; each batches both requests' steps
        units = [_unit("r1", step), _unit("r2", step, gpu_s=1.5)]
        for u in units:
            sched.unit_planned(u)
        with sched.dispatch(units) as d:
            d.done(execute(units, inject_metadata()))  # the batch span is current here
    for rid, status in (("r1", "SUCCEEDED"), ("r2", "FAILED")):
        sched.loop_finished(rid)
        sched.finished(rid, status, error=ErrorInfo("ABORTED", "nan") if status == "FAILED" else None)

    spans = [SpanRecord.from_dict(span_to_dict(s), "mem") for s in (*s_out.get_finished_spans(),
                                                                    *p_out.get_finished_spans())]
    by_id = {s.span_id: s for s in spans}
    execs = [s for s in spans if s.name == N.SPAN_POOL_EXECUTE]
    assert len(execs) == 4
    for e in execs:  # pool.execute -> unit -> loop -> request, all in the request's trace
        unit = by_id[e.parent_id]
        loop = by_id[unit.parent_id]
        req = by_id[loop.parent_id]
        assert (unit.name, loop.name, req.name) == (N.SPAN_UNIT, N.SPAN_LOOP, N.SPAN_REQUEST)
        assert len({e.trace_id, unit.trace_id, req.trace_id}) == 1
        assert req.attributes[N.A_REQUEST_ID] == e.attributes[N.A_REQUEST_ID]
        assert unit.attributes[N.A_BATCH_SIZE] == 2 and unit.attributes[N.A_SLO_CLASS] in ("interactive", "batch")
    for t in (s for s in spans if s.name == N.SPAN_TRANSFER):
        assert by_id[t.parent_id].name == N.SPAN_POOL_EXECUTE
    # measured seconds shared 1:3 by prediction, on both sides
    r1_unit = next(s for s in spans if s.name == N.SPAN_UNIT and s.attributes[N.A_REQUEST_ID] == "r1")
    assert r1_unit.attributes[N.A_MEASURED_S] == pytest.approx(0.0025)
    assert all(s.status == "ERROR" for s in spans if s.attributes.get(N.A_REQUEST_ID) == "r2"
               and s.name in (N.SPAN_UNIT, N.SPAN_POOL_EXECUTE, N.SPAN_REQUEST))
    # pool batch spans: in the scheduler batch span's trace, parented through gRPC metadata
    for pb in (s for s in spans if s.name == N.SPAN_POOL_BATCH):
        assert by_id[pb.parent_id].name == N.SPAN_BATCH

    report = build_report(spans)
    assert set(report.classes) == {"all", "interactive", "batch"}
    assert list(report.classes["interactive"]) == [
        "queue_wait", "admission", "unit_queue_wait", "dispatch", "denoise_step", "pool_denoise_step",
        "transfer", "denoise_loop", "end_to_end"]
    assert report.classes["interactive"]["denoise_step"].count == 2
    assert report.classes["batch"]["end_to_end"].errors == 1

    assert _sample(s_metrics, "fastvideo3_requests_admitted_total", slo_class="interactive") == 1
    assert _sample(s_metrics, "fastvideo3_requests_refused_total", slo_class="batch", reason="queue") == 1
    assert _sample(s_metrics, "fastvideo3_requests_finished_total", status="FAILED", code="ABORTED") == 1
    assert _sample(s_metrics, "fastvideo3_batch_size_count", role="denoiser", kind="diffusion_step") == 2
    assert _sample(s_metrics, "fastvideo3_inflight_requests", slo_class="all") == 2
    assert _sample(s_metrics, "fastvideo3_step_latency_seconds_count", role="denoiser",
                   kind="diffusion_step") is None  # pools own step latency
    assert _sample(p_metrics, "fastvideo3_step_latency_seconds_count", role="denoiser", kind="diffusion_step") == 2
    assert _sample(p_metrics, "fastvideo3_gpu_seconds_total", role="denoiser", kind="diffusion_step",
                   source="predicted") == pytest.approx(1.0)  # r1's two steps; r2 failed
    assert _sample(p_metrics, "fastvideo3_transfer_bytes_total", backend="shm", direction="pull") == 4 * 2048
    assert sched._live == {} and sched._units == {}  # nothing kept past terminal


@pytest.mark.timeout(60)
def test_dispatch_that_raises_fails_its_units():
    out = InMemorySpanExporter()
    sched = SchedulerTelemetry(init_tracing("scheduler", exporter=out, set_global=False))
    sched.submitted("r1", "wan-tiny", "interactive")
    unit = _unit("r1", 0)
    sched.unit_planned(unit)
    with pytest.raises(ConnectionError):
        with sched.dispatch([unit]):
            raise ConnectionError("pool lost")
    (span,) = [s for s in out.get_finished_spans() if s.name == N.SPAN_UNIT]
    assert not span.status.is_ok and "pool lost" in span.status.description
    (batch,) = [s for s in out.get_finished_spans() if s.name == N.SPAN_BATCH]
    assert not batch.status.is_ok


@pytest.mark.timeout(60)
def test_hooks_with_nothing_on_do_nothing():
    sched = SchedulerTelemetry(Tracing.disabled())
    pool = PoolTelemetry("denoiser", tracing=Tracing.disabled())
    sched.submitted("r1", "wan-tiny", "interactive")
    unit = _unit("r1", 0)
    sched.unit_planned(unit)
    with sched.dispatch([unit]) as d:
        d.done(pool.run_batch([unit], lambda b: [StepResult(u.unit_id, u.request_id) for u in b]))
    sched.finished("r1", "SUCCEEDED")
    assert unit.trace == {} and sched._live == {} and sched._units == {}


@pytest.mark.timeout(60)
def test_embedded_mode_one_tracer_nests_pool_batch_under_scheduler_batch():
    out = InMemorySpanExporter()
    tracing = init_tracing("embedded", exporter=out, set_global=False)
    sched, pool = SchedulerTelemetry(tracing), PoolTelemetry("denoiser", tracing=tracing)
    sched.submitted("r1", "wan-tiny", "interactive")
    unit = _unit("r1", 0)
    sched.unit_planned(unit)
    with sched.dispatch([unit]) as d:  # in-process executor: no metadata, the batch span is current
        d.done(pool.run_batch([unit], lambda b: [StepResult(u.unit_id, u.request_id) for u in b]))
    sched.finished("r1", "SUCCEEDED")
    spans = {s.name: s for s in out.get_finished_spans()}
    assert spans[N.SPAN_POOL_BATCH].parent.span_id == spans[N.SPAN_BATCH].context.span_id
    assert spans[N.SPAN_POOL_EXECUTE].parent.span_id == spans[N.SPAN_UNIT].context.span_id
    assert spans[N.SPAN_POOL_EXECUTE].context.trace_id == spans[N.SPAN_REQUEST].context.trace_id
