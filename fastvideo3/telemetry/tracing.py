"""Distributed tracing: one trace per request, across the scheduler and every pool process.

Off by default. ``init_tracing(name)`` with no exporter gives a disabled :class:`Tracing` whose
helpers return one shared no-op span: no OpenTelemetry call, no allocation, nothing injected
into a WorkUnit (a unit test holds the cost under a few microseconds per span). OpenTelemetry
is imported only when tracing is turned on, so the core runs without it installed.

Span tree of one request; every span below is in the request's own trace::

    fastvideo3.request                        scheduler: submitted -> terminal        (end_to_end)
      fastvideo3.phase  queue_wait            QUEUED -> RUNNING
      fastvideo3.phase  admission             admission asked -> admitted / refused
      fastvideo3.loop   text_encode | diffusion_denoise | vae_decode
        fastvideo3.unit                       one WorkUnit: planned -> result applied
          fastvideo3.phase unit_queue_wait    planned -> its batch was sent
          fastvideo3.phase dispatch           its batch was sent -> results back
          fastvideo3.pool.execute             pool process: the unit's batch ran   (via WorkUnit.trace)
            fastvideo3.transfer               pool process: pulling this unit's inputs

Batches. A batch holds units of several requests, so no span of a batch can sit in one
request's trace without lying about the others. Each batch therefore gets a trace of its own:
``fastvideo3.batch`` (scheduler, made current around the Execute call) -> the gRPC client and
server spans when gRPC is instrumented -> ``fastvideo3.pool.batch`` (pool, parented from the
gRPC metadata). Both batch spans link to every member's unit span, and every
``fastvideo3.pool.execute`` is a child of its own unit span (parented from ``WorkUnit.trace``)
with a link to the pool batch span. So a request's trace holds that request's spans and
nothing else, and the batch it shared is one link away.

Propagation is W3C trace context (``traceparent``/``tracestate``): into ``WorkUnit.trace``
(the ``trace_context`` map on the wire) per unit, and into gRPC metadata per call
(:func:`inject_metadata` / :func:`extract_context`).

Exporters: OTLP (``otlp_endpoint``), a JSON-lines file (``trace_file``, what
``fastvideo3 slo report`` reads) and any SpanExporter (``exporter``, e.g. the SDK's
InMemorySpanExporter in tests); they combine.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, Iterable, Sequence

from fastvideo3.errors import FailedPrecondition
from fastvideo3.telemetry import names as N

try:  # OpenTelemetry is an optional dependency (the `services` extra)
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import Link, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - exercised only where the extra is missing
    otel_context = otel_trace = None  # type: ignore[assignment]
    _PROPAGATOR = None

#: what may be given as a parent: a span, a W3C carrier dict, gRPC metadata pairs, an
#: OpenTelemetry Context, or None for "the current context"
Parent = Any


# ---------------------------------------------------------------------------------------------
# Spans


class TraceSpan:
    """A started span. ``end()``/``finish()`` it explicitly (spans that outlive a call, such as
    request and loop spans), or use it as a context manager, which also makes it the current
    span of the thread until the block exits. Ending twice is harmless."""

    __slots__ = ("span", "_token")
    recording = True

    def __init__(self, span: Any) -> None:
        self.span = span  # the OpenTelemetry span, for anything not wrapped here
        self._token: Any = None

    @property
    def trace_id(self) -> str:
        return f"{self.span.get_span_context().trace_id:032x}"

    @property
    def span_id(self) -> str:
        return f"{self.span.get_span_context().span_id:016x}"

    def carrier(self) -> dict[str, str]:
        """The W3C carrier (``traceparent``, ``tracestate``) naming this span as the parent."""
        out: dict[str, str] = {}
        _PROPAGATOR.inject(out, context=otel_trace.set_span_in_context(self.span))
        return out

    def set(self, key: str, value: Any) -> "TraceSpan":
        if value is not None:
            self.span.set_attribute(key, value)
        return self

    def finish(self, *, measured_s: float | None = None, error: Any = None, status: str | None = None,
               end_ns: int | None = None) -> None:
        """End with the measured GPU-seconds, a terminal status and/or an error (ErrorInfo, a
        FastVideoError, any exception or a message), which marks the span failed."""
        if not self.span.is_recording():
            return
        if measured_s is not None:
            self.span.set_attribute(N.A_MEASURED_S, float(measured_s))
        if status is not None:
            self.span.set_attribute(N.A_STATUS, status)
        if error is not None:
            code, message = _error_parts(error)
            self.span.set_attribute(N.A_ERROR_CODE, code)
            self.span.set_status(Status(StatusCode.ERROR, message))
        self.span.end(end_time=end_ns)

    def end(self, end_ns: int | None = None) -> None:
        if self.span.is_recording():
            self.span.end(end_time=end_ns)

    def __enter__(self) -> "TraceSpan":
        self._token = otel_context.attach(otel_trace.set_span_in_context(self.span))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._token is not None:
            otel_context.detach(self._token)
            self._token = None
        if exc is not None and self.span.is_recording():
            self.span.record_exception(exc)
            self.finish(error=exc)
        else:
            self.end()
        return False


class NoopSpan(TraceSpan):
    """What every helper returns while tracing is off: stateless, shared, free."""

    __slots__ = ()
    recording = False
    trace_id = ""
    span_id = ""

    def __init__(self) -> None:
        self.span = None
        self._token = None

    def carrier(self) -> dict[str, str]:
        return {}

    def set(self, key: str, value: Any) -> "TraceSpan":
        return self

    def finish(self, **_: Any) -> None:
        return None

    def end(self, end_ns: int | None = None) -> None:
        return None

    def __enter__(self) -> "TraceSpan":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        return False


NOOP_SPAN = NoopSpan()


def _error_parts(error: Any) -> tuple[str, str]:
    code = getattr(error, "code", None)
    message = getattr(error, "message", None)
    if isinstance(code, str) and isinstance(message, str):  # ErrorInfo, FastVideoError
        return code, message
    if isinstance(error, BaseException):
        return "INTERNAL", f"{type(error).__name__}: {error}"
    return "INTERNAL", str(error)


def _attrs(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# ---------------------------------------------------------------------------------------------
# Propagation


def carrier_of(obj: Any) -> dict[str, str]:
    """A lower-cased str->str carrier from a dict, gRPC metadata (pairs, ``_Metadatum`` or
    ``grpc.aio.Metadata``) or None."""
    if obj is None:
        return {}
    items = obj.items() if isinstance(obj, Mapping) else ((m[0], m[1]) for m in obj)
    return {str(k).lower(): v for k, v in items if isinstance(v, str)}


def extract_context(carrier: Any) -> Any:
    """The OpenTelemetry Context a carrier names (an empty one, i.e. "root", when it names
    none), or None while OpenTelemetry is missing."""
    if _PROPAGATOR is None:
        return None
    return _PROPAGATOR.extract(carrier_of(carrier))


def _parent_context(parent: Parent) -> Any:
    if parent is None:
        return None  # the current context
    if isinstance(parent, TraceSpan):
        return otel_trace.set_span_in_context(parent.span) if parent.recording else None
    if isinstance(parent, otel_context.Context):
        return parent
    return extract_context(parent)


def _link(carrier: Any) -> Any:
    ctx = otel_trace.get_current_span(extract_context(carrier)).get_span_context()
    return Link(ctx) if ctx.is_valid else None


# ---------------------------------------------------------------------------------------------
# The tracer


class Tracing:
    """The span helpers of one process (see the module docstring for the tree they build)."""

    def __init__(self, service_name: str, provider: Any = None) -> None:
        self.service_name = service_name
        self.provider = provider
        self.enabled = provider is not None
        self._tracer = provider.get_tracer("fastvideo3") if provider is not None else None

    @classmethod
    def disabled(cls, service_name: str = "fastvideo3") -> "Tracing":
        return cls(service_name, None)

    def _start(self, name: str, parent: Parent, attributes: Mapping[str, Any], *,
               start_ns: int | None = None, links: Iterable[Any] = ()) -> TraceSpan:
        span = self._tracer.start_span(name, context=_parent_context(parent), attributes=_attrs(attributes),
                                       links=[lk for lk in links if lk is not None], start_time=start_ns)
        return TraceSpan(span)

    # -- scheduler side --------------------------------------------------------------------

    def request_span(self, request_id: str, card: str, slo_class: str, *, parent: Parent = None,
                     start_ns: int | None = None) -> TraceSpan:
        """The root of a request's trace. ``parent`` continues a caller's trace (the Generate
        RPC's metadata, a client's carrier); None uses the current context (the gRPC server span
        when gRPC is instrumented), else starts a new trace. End it with ``finish(status=...,
        error=...)`` when the request turns terminal."""
        if self._tracer is None:
            return NOOP_SPAN
        return self._start(N.SPAN_REQUEST, parent, {N.A_REQUEST_ID: request_id, N.A_CARD: card,
                                                    N.A_SLO_CLASS: slo_class}, start_ns=start_ns)

    def loop_span(self, parent: Parent, loop_id: str, *, request_id: str | None = None,
                  start_ns: int | None = None) -> TraceSpan:
        """One loop of the request's program, child of the request span."""
        if self._tracer is None:
            return NOOP_SPAN
        return self._start(N.SPAN_LOOP, parent, {N.A_LOOP_ID: loop_id, N.A_REQUEST_ID: request_id},
                           start_ns=start_ns)

    def unit_span(self, unit: Any, batch_size: int | None = None, predicted_s: float | None = None, *,
                  parent: Parent = None, slo_class: str | None = None, start_ns: int | None = None,
                  inject: bool = True) -> TraceSpan:
        """One WorkUnit, child of its loop span. With ``inject`` (the default) the unit's
        ``trace`` dict is set to this span's W3C carrier, so the pool's span becomes its child.
        ``predicted_s`` defaults to ``unit.resources.gpu_seconds``; end it with
        ``finish(measured_s=..., error=...)`` when its result is applied."""
        if self._tracer is None:
            return NOOP_SPAN
        if predicted_s is None:
            predicted_s = getattr(getattr(unit, "resources", None), "gpu_seconds", None)
        span = self._start(N.SPAN_UNIT, parent, {**_unit_attrs(unit), N.A_BATCH_SIZE: batch_size,
                                                 N.A_PREDICTED_S: predicted_s, N.A_SLO_CLASS: slo_class},
                           start_ns=start_ns)
        if inject:
            unit.trace = span.carrier()
        return span

    def phase_span(self, parent: Parent, phase: str, *, start_ns: int | None = None,
                   end_ns: int | None = None, **attributes: Any) -> TraceSpan:
        """A named interval (``queue_wait``, ``admission``, ``unit_queue_wait``, ``dispatch``,
        or any other name; the SLO report groups by it). With ``end_ns`` it is recorded after
        the fact and returned already ended; else end it, or use it as a context manager."""
        if self._tracer is None:
            return NOOP_SPAN
        attrs = {N.A_PHASE: phase, **{f"fastvideo3.{k}": v for k, v in attributes.items()}}
        span = self._start(N.SPAN_PHASE, parent, attrs, start_ns=start_ns)
        if end_ns is not None:
            span.end(end_ns)
        return span

    def batch_span(self, units: Sequence[Any], *, role: str | None = None) -> TraceSpan:
        """The scheduler's span of one dispatched batch: a new trace, linked to every member's
        unit span. Enter it around the Execute call, so the call's gRPC metadata (and any gRPC
        instrumentation spans) belong to the batch trace, not to one member's request."""
        if self._tracer is None:
            return NOOP_SPAN
        return self._start(N.SPAN_BATCH, otel_context.Context(), _batch_attrs(units, role),
                           links=[_link(u.trace) for u in units])

    # -- pool side -------------------------------------------------------------------------

    def pool_execute_span(self, unit: Any, *, batch_size: int | None = None, batch: TraceSpan | None = None,
                          role: str | None = None, start_ns: int | None = None) -> TraceSpan:
        """The pool's span of one unit: a child of the scheduler's unit span, extracted from
        ``unit.trace``, linked to the pool batch span when one is given."""
        if self._tracer is None:
            return NOOP_SPAN
        links = [Link(batch.span.get_span_context())] if batch is not None and batch.recording else []
        attrs = {**_unit_attrs(unit), N.A_ROLE: role or getattr(unit, "role", None), N.A_BATCH_SIZE: batch_size,
                 N.A_PREDICTED_S: getattr(getattr(unit, "resources", None), "gpu_seconds", None)}
        return self._start(N.SPAN_POOL_EXECUTE, extract_context(unit.trace), attrs, start_ns=start_ns, links=links)

    def pool_batch(self, units: Sequence[Any], *, role: str, parent: Parent = None,
                   replica: str | None = None) -> "PoolBatch":
        """Wrap one Execute call in a pool: ``with tracing.pool_batch(units, role=..., parent=
        context.invocation_metadata()) as pb: results = executor.execute(units); pb.finish(results)``.
        ``parent`` (the call's metadata) makes the pool batch span a child of the scheduler's
        batch span; None uses the current context.
        Inside the block the batch span is current and each ``unit.trace`` names that unit's
        ``pool.execute`` span (so a transfer parented on ``unit.trace`` nests under it); the
        units' carriers are restored on exit."""
        if self._tracer is None:
            return _NOOP_POOL_BATCH
        return PoolBatch(self, units, role, parent, replica)

    def transfer_span(self, backend: str, nbytes: int, *, parent: Parent = None, request_id: str | None = None,
                      src: str | None = None, dst: str | None = None, buffer_id: str | None = None) -> TraceSpan:
        """A tensor pull or push. Parent it on ``unit.trace`` (or a span) when it serves one
        unit; the default is the current context (the pool batch span inside ``pool_batch``)."""
        if self._tracer is None:
            return NOOP_SPAN
        return self._start(N.SPAN_TRANSFER, parent, {N.A_BACKEND: backend, N.A_BYTES: int(nbytes),
                                                     N.A_REQUEST_ID: request_id, N.A_SRC: src, N.A_DST: dst,
                                                     "fastvideo3.buffer_id": buffer_id})

    # -- lifecycle -------------------------------------------------------------------------

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.provider.force_flush(timeout_millis) if self.provider is not None else True

    def shutdown(self) -> None:
        """Flush and close every exporter (call it on the service's drain path: a SIGTERM'd
        process does not run atexit hooks)."""
        if self.provider is not None:
            self.provider.shutdown()


def _unit_attrs(unit: Any) -> dict[str, Any]:
    return {N.A_REQUEST_ID: unit.request_id, N.A_UNIT_ID: unit.unit_id, N.A_LOOP_ID: unit.loop_id,
            N.A_KIND: unit.kind, N.A_ROLE: unit.role, N.A_CARD: unit.card_id, N.A_SHAPE_SIG: unit.shape_sig,
            N.A_STEP: unit.step}


def _batch_attrs(units: Sequence[Any], role: str | None) -> dict[str, Any]:
    first = units[0] if units else None
    return {N.A_BATCH_SIZE: len(units), N.A_BATCH_REQUESTS: len({u.request_id for u in units}),
            N.A_ROLE: role or getattr(first, "role", None), N.A_KIND: getattr(first, "kind", None),
            N.A_SHAPE_SIG: getattr(first, "shape_sig", None), N.A_CARD: getattr(first, "card_id", None),
            N.A_PREDICTED_S: float(sum(u.resources.gpu_seconds for u in units))}


def unit_shares(batch_seconds: float, predicted: Sequence[float]) -> list[float]:
    """One batch's measured seconds shared among its units in proportion to their predictions
    (equal shares when nothing was predicted): the per-unit measured GPU-seconds."""
    total = sum(p for p in predicted if p > 0)
    if total <= 0:
        return [batch_seconds / max(1, len(predicted))] * len(predicted)
    return [batch_seconds * max(0.0, p) / total for p in predicted]


class PoolBatch:
    """The spans of one batch in a pool: ``batch`` (pool.batch) and ``span(i)`` (pool.execute
    of unit i). See :meth:`Tracing.pool_batch`."""

    def __init__(self, tracing: Tracing, units: Sequence[Any], role: str, parent: Parent,
                 replica: str | None) -> None:
        self.units = list(units)
        attrs = {**_batch_attrs(self.units, role), N.A_REPLICA: replica}
        # parent None: the current context, i.e. the scheduler's batch span in embedded mode,
        # the gRPC server span when gRPC is instrumented, else nothing (a new batch trace)
        self.batch = tracing._start(N.SPAN_POOL_BATCH, parent, attrs, links=[_link(u.trace) for u in self.units])
        start = time.time_ns()
        self.spans = [tracing.pool_execute_span(u, batch_size=len(self.units), batch=self.batch, role=role,
                                                start_ns=start) for u in self.units]
        self._saved: list[dict[str, str]] = []

    def span(self, i: int) -> TraceSpan:
        return self.spans[i]

    def finish(self, results: Sequence[Any]) -> None:
        """End each unit's span with its result: measured GPU-seconds (the batch's
        ``measured_seconds`` shared by prediction) and the error of a failed unit."""
        predicted = [u.resources.gpu_seconds for u in self.units]
        batch_s = max((getattr(r, "measured_seconds", 0.0) for r in results), default=0.0)
        shares = unit_shares(batch_s, predicted)
        self.batch.set(N.A_MEASURED_S, batch_s)
        for span, res, share in zip(self.spans, results, shares):
            span.set("fastvideo3.measured_batch_s", batch_s)
            for key, value in (getattr(res, "span_attrs", None) or {}).items():  # what the executor says it ran
                span.set(key, value)
            span.finish(measured_s=share, error=None if getattr(res, "ok", True) else (res.error or "failed"))

    def __enter__(self) -> "PoolBatch":
        self._saved = [u.trace for u in self.units]
        for u, s in zip(self.units, self.spans):
            u.trace = s.carrier()
        self.batch.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        for u, saved in zip(self.units, self._saved):
            u.trace = saved
        for s in self.spans:  # units without a result: failed with the batch, or never finished
            if exc is not None:
                s.finish(error=exc)
            else:
                s.end()
        return self.batch.__exit__(exc_type, exc, tb)


class _NoopPoolBatch(PoolBatch):
    """What :meth:`Tracing.pool_batch` returns while tracing is off: a batch of no units whose
    spans are all ``NOOP_SPAN`` (entering and leaving it does nothing); shared, free."""

    def __init__(self) -> None:
        self.units, self.batch, self.spans, self._saved = [], NOOP_SPAN, [], []

    def span(self, i: int) -> TraceSpan:
        return NOOP_SPAN

    def finish(self, results: Sequence[Any]) -> None:
        return None


_NOOP_POOL_BATCH = _NoopPoolBatch()


# ---------------------------------------------------------------------------------------------
# Setup and the process default


_process = Tracing.disabled()
_global_lock = threading.Lock()
_global_provider_set = False


def init_tracing(service_name: str, *, otlp_endpoint: str | None = None, exporter: Any = None,
                 trace_file: str | None = None, set_global: bool = True) -> Tracing:
    """Build this process's tracing. Off (a no-op) unless an exporter is named:

    * ``otlp_endpoint``: OTLP over gRPC (``host:4317`` / ``http://host:4317``), or OTLP over
      HTTP when the endpoint ends in ``/v1/traces``; batched export.
    * ``trace_file``: JSON lines, one span per line (``fastvideo3 slo report`` reads it);
      written through on every span end.
    * ``exporter``: any SpanExporter (e.g. ``InMemorySpanExporter()`` in tests); synchronous.

    With ``set_global`` the result becomes :func:`get_tracing`'s answer and, the first time
    tracing is on, OpenTelemetry's global tracer provider (so gRPC instrumentation uses it).
    Tests that build several tracers in one process pass ``set_global=False``.
    """
    global _process, _global_provider_set
    if otlp_endpoint is None and exporter is None and trace_file is None:
        tracing = Tracing.disabled(service_name)
    else:
        if _PROPAGATOR is None:
            raise FailedPrecondition("tracing needs OpenTelemetry", field="tracing",
                                     limit="pip install 'fastvideo3[services]'")
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        if trace_file is not None:
            from fastvideo3.telemetry.exporters import JsonLinesSpanExporter

            provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(trace_file)))
        if otlp_endpoint is not None:
            provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(otlp_endpoint)))
        tracing = Tracing(service_name, provider)
    if set_global:
        with _global_lock:
            _process = tracing
            if tracing.enabled and not _global_provider_set:
                otel_trace.set_tracer_provider(tracing.provider)
                _global_provider_set = True
    return tracing


def _otlp_exporter(endpoint: str) -> Any:
    if endpoint.rstrip("/").endswith("/v1/traces"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))


def get_tracing() -> Tracing:
    """The process's tracing, as last set by :func:`init_tracing` (disabled until then)."""
    return _process


def inject_metadata(metadata: Sequence[tuple[str, str]] | None = None, *,
                    parent: Parent = None) -> list[tuple[str, str]]:
    """gRPC call metadata plus the W3C headers of ``parent`` (default: the current span, e.g.
    the entered batch span). Unchanged, as a list, when there is no recording span to name
    (tracing off: a context lookup, about a microsecond, next to a ~0.5 ms RPC)."""
    out = list(metadata or ())
    if _PROPAGATOR is not None:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=_parent_context(parent))
        out.extend(carrier.items())
    return out


# Module-level forms of the helpers, on the process's tracing (what services call).
def request_span(request_id: str, card: str, slo_class: str, **kw: Any) -> TraceSpan:
    return _process.request_span(request_id, card, slo_class, **kw)


def loop_span(parent: Parent, loop_id: str, **kw: Any) -> TraceSpan:
    return _process.loop_span(parent, loop_id, **kw)


def unit_span(unit: Any, batch_size: int | None = None, predicted_s: float | None = None, **kw: Any) -> TraceSpan:
    return _process.unit_span(unit, batch_size, predicted_s, **kw)


def phase_span(parent: Parent, phase: str, **kw: Any) -> TraceSpan:
    return _process.phase_span(parent, phase, **kw)


def batch_span(units: Sequence[Any], **kw: Any) -> TraceSpan:
    return _process.batch_span(units, **kw)


def pool_execute_span(unit: Any, **kw: Any) -> TraceSpan:
    return _process.pool_execute_span(unit, **kw)


def pool_batch(units: Sequence[Any], **kw: Any) -> PoolBatch | _NoopPoolBatch:
    return _process.pool_batch(units, **kw)


def transfer_span(backend: str, nbytes: int, **kw: Any) -> TraceSpan:
    return _process.transfer_span(backend, nbytes, **kw)
