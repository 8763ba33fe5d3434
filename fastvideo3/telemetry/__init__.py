"""Telemetry: traces, metrics and the SLO report (``docs/metrics.md`` documents all three).

* :mod:`.tracing` — ``init_tracing`` and the span helpers; one trace per request across the
  scheduler and every pool (W3C context in ``WorkUnit.trace`` and in gRPC metadata). Off and
  free by default; OpenTelemetry is imported only when it is turned on.
* :mod:`.metrics` — ``ServiceMetrics`` and ``start_metrics_server``: the ``fastvideo3_*``
  Prometheus families of every service (needs ``prometheus_client``).
* :mod:`.hooks` — ``SchedulerTelemetry`` / ``PoolTelemetry``: the few calls the runtime makes.
* :mod:`.slo` — percentiles per phase and SLO class from exported JSON-lines spans
  (``fastvideo3 slo report``).

Nothing is imported here, so ``import fastvideo3.telemetry`` costs nothing and needs neither
optional dependency.
"""
