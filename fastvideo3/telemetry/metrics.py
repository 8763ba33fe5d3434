"""Prometheus metrics of every service: one :class:`ServiceMetrics` per process, one endpoint.

Built on ``prometheus_client`` (the standard exposition code, also what Dynamo uses): each
ServiceMetrics owns a ``CollectorRegistry`` of its own (never the library's global one), so
several services, or tests, live in one process without name clashes. Every metric family is
named ``fastvideo3_*``; ``docs/metrics.md`` lists each name, type, label set and meaning.

Two kinds of feed:

* **push**, on the hot path: ``observe_step``, ``observe_batch``, ``observe_prediction``,
  ``observe_admitted`` / ``observe_refused`` / ``observe_finished``, ``observe_transfer`` and
  the ``set_*`` gauges. Each is a dict lookup and a lock, about a microsecond.
* **pull**, read at scrape time: ``watch_cost_model`` (``CalibratedCostModel.error_stats``),
  ``watch_admission`` (``AdmissionController.counters``) and ``watch_values`` (any callable
  returning a flat ``name -> number`` dict, e.g. an executor's counters). A failing source is
  skipped for that scrape; it never breaks the endpoint.

    metrics = ServiceMetrics("denoiser")
    server = start_metrics_server(9400, metrics.registry, addr="0.0.0.0")
    metrics.observe_step("denoiser", "diffusion_step", 0.61)
"""
from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from fastvideo3.errors import FailedPrecondition, Unavailable

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.exposition import start_http_server
    from prometheus_client.registry import Collector
except ImportError:  # pragma: no cover - exercised only where the extra is missing
    CollectorRegistry = None  # type: ignore[assignment,misc]
    Collector = object  # type: ignore[assignment,misc]

log = logging.getLogger("fastvideo3.metrics")

PREFIX = "fastvideo3_"
#: step latency buckets, seconds: a tiny CPU step (ms) up to a 14B step at full size (tens of s)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: units per batch
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: |predicted - measured| / measured
ERROR_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
TRANSFER_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)

_M = TypeVar("_M")


class ServiceMetrics:
    """The metric families of one service process (``role``: scheduler, encoder, ...)."""

    def __init__(self, role: str, *, service: str | None = None, registry: Any = None) -> None:
        if CollectorRegistry is None:
            raise FailedPrecondition("metrics need prometheus_client", field="metrics",
                                     limit="pip install 'fastvideo3[services]'")
        # No `<name>_created` series: in the text format each is one more gauge per counter and
        # histogram that no dashboard reads. (A process-wide prometheus_client setting.)
        disable_created_metrics()
        self.role = role
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        m = self._family
        self.info = m(Gauge, "service_info", "Always 1; labels name the service.", ["service", "role"])
        self.info.labels(service or role, role).set(1)
        self.queue_depth = m(Gauge, "queue_depth", "Requests waiting to be admitted or to start.", ["slo_class"])
        self.inflight = m(Gauge, "inflight_requests", "Requests admitted and not yet terminal.", ["slo_class"])
        self.admitted = m(Counter, "requests_admitted_total", "Requests admitted.", ["slo_class"])
        self.refused = m(Counter, "requests_refused_total", "Requests refused, by reason.", ["slo_class", "reason"])
        self.finished = m(Counter, "requests_finished_total", "Requests that reached a terminal status.",
                          ["status", "code"])
        self.step_latency = m(Histogram, "step_latency_seconds", "Wall seconds of one batch of units.",
                              ["role", "kind"], buckets=STEP_BUCKETS)
        self.batch_size = m(Histogram, "batch_size", "WorkUnits per dispatched batch.", ["role", "kind"],
                            buckets=BATCH_BUCKETS)
        self.gpu_seconds = m(Counter, "gpu_seconds_total", "GPU-seconds of finished units, predicted and measured.",
                             ["role", "kind", "source"])
        self.prediction_error = m(Histogram, "prediction_error_ratio",
                                  "|predicted - measured| / measured GPU-seconds per unit.", ["role", "kind"],
                                  buckets=ERROR_BUCKETS)
        self.resident_buffers = m(Gauge, "resident_buffers", "Tensors held resident by the pool.", ["role"])
        self.resident_bytes = m(Gauge, "resident_bytes", "Bytes of the tensors held resident by the pool.", ["role"])
        self.transfer_bytes = m(Counter, "transfer_bytes_total", "Bytes moved between pools.", ["backend", "direction"])
        self.transfer_latency = m(Histogram, "transfer_seconds", "Wall seconds of one transfer.",
                                  ["backend", "direction"], buckets=TRANSFER_BUCKETS)
        self._pull = _PullCollector()
        self.registry.register(self._pull)

    def _family(self, kind: Callable[..., _M], name: str, doc: str, labels: list[str], **kw: Any) -> _M:
        """A ``kind`` (Gauge, Counter, Histogram) named ``fastvideo3_<name>`` in this registry."""
        return kind(PREFIX + name, doc, labels, registry=self.registry, **kw)

    # -- push: requests --------------------------------------------------------------------

    def set_queue_depth(self, n: int, slo_class: str = "all") -> None:
        self.queue_depth.labels(slo_class).set(n)

    def set_inflight(self, n: int, slo_class: str = "all") -> None:
        self.inflight.labels(slo_class).set(n)

    def observe_admitted(self, slo_class: str = "all") -> None:
        self.admitted.labels(slo_class).inc()

    def observe_refused(self, reason: str, slo_class: str = "all") -> None:
        """``reason``: the refusing error's ``field`` (queue, wait, compute, memory, ...)."""
        self.refused.labels(slo_class, reason or "unknown").inc()

    def observe_finished(self, status: str, code: str = "") -> None:
        """``status``: SUCCEEDED, FAILED or CANCELLED; ``code``: the error code ("" on success)."""
        self.finished.labels(status, code or "").inc()

    # -- push: work ------------------------------------------------------------------------

    def observe_step(self, role: str, kind: str, seconds: float) -> None:
        if math.isfinite(seconds) and seconds >= 0:
            self.step_latency.labels(role, kind).observe(seconds)

    def observe_batch(self, size: int, role: str = "", kind: str = "") -> None:
        self.batch_size.labels(role or self.role, kind).observe(size)

    def observe_prediction(self, role: str, kind: str, predicted_s: float, measured_s: float) -> None:
        """One finished unit: its predicted and measured GPU-seconds (the one currency)."""
        if not (math.isfinite(predicted_s) and math.isfinite(measured_s)) or measured_s <= 0 or predicted_s < 0:
            return
        self.gpu_seconds.labels(role, kind, "predicted").inc(predicted_s)
        self.gpu_seconds.labels(role, kind, "measured").inc(measured_s)
        self.prediction_error.labels(role, kind).observe(abs(predicted_s - measured_s) / measured_s)

    def set_resident(self, buffers: int, nbytes: int | None = None, role: str | None = None) -> None:
        self.resident_buffers.labels(role or self.role).set(buffers)
        if nbytes is not None:
            self.resident_bytes.labels(role or self.role).set(nbytes)

    def observe_transfer(self, backend: str, nbytes: int, seconds: float, direction: str = "pull") -> None:
        self.transfer_bytes.labels(backend, direction).inc(max(0, nbytes))
        if math.isfinite(seconds) and seconds >= 0:
            self.transfer_latency.labels(backend, direction).observe(seconds)

    # -- pull ------------------------------------------------------------------------------

    def watch_cost_model(self, model: Any, name: str = "") -> None:
        """Export ``model.error_stats()`` at every scrape (one model per ``name``, e.g. the card)."""
        self._pull.set_source(("cost", name), lambda: _cost_families(name, model.error_stats()))

    def watch_admission(self, controller: Any, pool: str = "") -> None:
        """Export ``controller.counters()`` (reservations, budgets, waiters) at every scrape."""
        self._pull.set_source(("admission", pool), lambda: _admission_families(pool, controller.counters()))

    def watch_scaling(self, signals: Any, fleet: str = "", ledger: Any = None) -> None:
        """Export ``signals.families(fleet)`` (a ScalingSignals: replicas needed per role) and,
        given a WorkLedger, the live load (GPU-seconds owed per role) at every scrape."""
        self._pull.set_source(("scaling", fleet), lambda: signals.families(fleet))
        if ledger is not None:
            self._pull.set_source(("load", fleet), lambda: ledger.families(fleet))

    def watch_values(self, collect: Callable[[], dict[str, float]], prefix: str) -> None:
        """Export a flat ``name -> number`` dict as gauges ``fastvideo3_<prefix>_<name>``."""
        self._pull.set_source(("values", prefix), lambda: _value_families(prefix, collect()))

    def unwatch(self, kind: str, name: str) -> None:
        self._pull.drop_source((kind, name))


# ---------------------------------------------------------------------------------------------
# Pull sources


class _PullCollector(Collector):
    """Calls each registered source at scrape time; a raising source is logged and skipped."""

    def __init__(self) -> None:
        self._sources: dict[tuple[str, str], Callable[[], list[Any]]] = {}
        self._lock = threading.Lock()

    def set_source(self, key: tuple[str, str], fn: Callable[[], list[Any]]) -> None:
        with self._lock:
            self._sources[key] = fn

    def drop_source(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._sources.pop(key, None)

    def collect(self):
        with self._lock:
            sources = list(self._sources.items())
        merged: dict[str, Any] = {}  # one family per name, however many sources feed it
        for key, fn in sources:
            try:
                families = fn()
            except Exception:  # noqa: BLE001 - a broken source must not break the scrape
                log.warning("metrics source %s failed", key, exc_info=True)
                continue
            for fam in families:
                if fam.name in merged:
                    merged[fam.name].samples.extend(fam.samples)
                else:
                    merged[fam.name] = fam
        yield from merged.values()

    def describe(self):
        return []  # families vary with the sources; nothing to pre-declare


def _cost_families(name: str, stats: dict[str, float]) -> list[Any]:
    err = GaugeMetricFamily(PREFIX + "cost_model_error_ratio",
                            "Cost model |predicted - measured| / measured over its recent window.",
                            labels=["model", "quantile"])
    for q, key in (("0.5", "median"), ("0.9", "p90")):
        value = stats.get(key, float("nan"))
        if math.isfinite(value):
            err.add_metric([name, q], value)
    obs = CounterMetricFamily(PREFIX + "cost_model_observations",
                              "Measurements the cost model took in (used) or dropped (invalid).",
                              labels=["model", "outcome"])
    obs.add_metric([name, "used"], stats.get("total", 0.0))
    obs.add_metric([name, "dropped"], stats.get("dropped", 0.0))
    window = GaugeMetricFamily(PREFIX + "cost_model_error_window", "Samples behind the error quantiles.",
                               labels=["model"])
    window.add_metric([name], stats.get("count", 0.0))
    return [err, obs, window]


def _admission_families(pool: str, c: dict[str, Any]) -> list[Any]:
    def gauge(suffix: str, doc: str, per_class: bool) -> Any:
        return GaugeMetricFamily(PREFIX + "admission_" + suffix, doc,
                                 labels=["pool", "slo_class"] if per_class else ["pool"])

    reserved = gauge("reserved_gpu_seconds", "Predicted GPU-seconds reserved in flight.", True)
    budget = gauge("compute_budget_gpu_seconds", "The class's compute budget.", True)
    waiting = gauge("waiting", "Requests waiting in the class's queue.", True)
    in_flight = gauge("in_flight", "Requests holding a reservation.", True)
    savings = gauge("measured_savings_gpu_seconds", "Reserved minus measured, summed at release.", True)
    overrun = gauge("overrun_gpu_seconds", "Measured minus reserved, summed at release.", True)
    for cls, v in sorted(c.get("classes", {}).items()):
        reserved.add_metric([pool, cls], v.get("reserved_gpu_seconds", 0.0))
        budget.add_metric([pool, cls], v.get("compute_budget_s", 0.0))
        waiting.add_metric([pool, cls], v.get("waiting", 0))
        in_flight.add_metric([pool, cls], v.get("in_flight", 0))
        savings.add_metric([pool, cls], v.get("measured_savings_s", 0.0))
        overrun.add_metric([pool, cls], v.get("overrun_s", 0.0))
    mem = gauge("memory_reserved_bytes", "Resident plus peak bytes reserved.", False)
    mem.add_metric([pool], c.get("memory_reserved_bytes", 0))
    mem_budget = gauge("memory_budget_bytes", "The pool's memory budget.", False)
    mem_budget.add_metric([pool], c.get("memory_budget_bytes", 0))
    jumbo = gauge("jumbo_in_flight", "Jumbo requests in flight.", False)
    jumbo.add_metric([pool], c.get("jumbo_in_flight", 0))
    return [reserved, budget, waiting, in_flight, savings, overrun, mem, mem_budget, jumbo]


def _sanitize(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text).strip("_").lower()


def _value_families(prefix: str, values: dict[str, float]) -> list[Any]:
    out = []
    for key in sorted(values):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        g = GaugeMetricFamily(f"{PREFIX}{_sanitize(prefix)}_{_sanitize(key)}", f"{prefix} counter {key!r}.")
        g.add_metric([], float(value))
        out.append(g)
    return out


# ---------------------------------------------------------------------------------------------
# The endpoint


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint (Prometheus text exposition format 0.0.4)."""

    httpd: Any
    thread: threading.Thread
    addr: str

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def start_metrics_server(port: int, registry: Any, *, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve ``registry`` at ``http://addr:port/metrics`` from a daemon thread. ``port=0`` picks
    a free port (read it back from ``.port``). Containers pass ``addr="0.0.0.0"`` so the
    cluster's Prometheus can scrape the pod."""
    if CollectorRegistry is None:
        raise FailedPrecondition("metrics need prometheus_client", field="metrics",
                                 limit="pip install 'fastvideo3[services]'")
    try:
        httpd, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as e:
        raise Unavailable(f"cannot serve metrics on {addr}:{port}: {e}", field="metrics_port") from e
    return MetricsServer(httpd, thread, addr)
