"""The SLO report: latency percentiles per phase and per SLO class, from exported spans.

Input is the JSON-lines span file that ``--trace-file`` writes (one or several files: every
process may write its own, or all may append to one). Each span is put in a *phase*:

=====================  ==========================================================
phase                  spans
=====================  ==========================================================
end_to_end             ``fastvideo3.request`` (submitted -> terminal)
queue_wait, admission  ``fastvideo3.phase`` spans, by their ``fastvideo3.phase``
unit_queue_wait, ...   attribute (any name the scheduler records)
encode, denoise_step,  ``fastvideo3.unit`` by kind (encoder_chunk, diffusion_step,
decode, reward         vae_tile, reward_batch): the step as the scheduler saw it
pool_<phase>           ``fastvideo3.pool.execute`` by kind: the same, pool side
transfer               ``fastvideo3.transfer``
<loop>_loop            ``fastvideo3.loop``: one whole loop of one request
=====================  ==========================================================

Other spans (batch spans, gRPC spans) are read and not reported. A span's SLO class is its
trace's request span's ``fastvideo3.slo_class`` (so pool spans, written by another process,
are classed too), else its own attribute, else ``unknown``.

Percentiles are nearest-rank: the p-th percentile of n sorted samples is the
``ceil(p/100 * n)``-th smallest. It is always an observed latency (no interpolation), and
for 1..100 ms it gives p50 = 50, p95 = 95, p99 = 99.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from fastvideo3.errors import InvalidRequest
from fastvideo3.telemetry import names as N

PERCENTILES = (50, 95, 99)
ALL_CLASSES = "all"
_REQUIRED = {"name": str, "trace_id": str, "span_id": str, "start_ns": int, "end_ns": int}


@dataclass(frozen=True)
class SpanRecord:
    """One exported span, as the report needs it."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    status: str = "UNSET"
    service: str = ""

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "SpanRecord":
        """Validate one decoded line; ``where`` ("FILE:LINE") prefixes every error."""
        if not isinstance(d, dict):
            raise InvalidRequest(f"{where}: a span must be a JSON object, got {type(d).__name__}", field="spans")
        for key, typ in _REQUIRED.items():
            if key not in d:
                raise InvalidRequest(f"{where}: span has no {key!r}", field="spans",
                                     limit=", ".join(_REQUIRED))
            if not isinstance(d[key], typ) or isinstance(d[key], bool):
                raise InvalidRequest(f"{where}: {key!r} must be {typ.__name__}, got {d[key]!r}", field="spans")
        if d["end_ns"] < d["start_ns"]:
            raise InvalidRequest(f"{where}: span ends before it starts ({d['end_ns']} < {d['start_ns']})",
                                 field="spans")
        attributes = d.get("attributes") or {}
        if not isinstance(attributes, dict):
            raise InvalidRequest(f"{where}: 'attributes' must be an object", field="spans")
        parent = d.get("parent_id")
        return cls(d["name"], d["trace_id"], d["span_id"], parent if isinstance(parent, str) else None,
                   d["start_ns"], d["end_ns"], attributes, str(d.get("status", "UNSET")), str(d.get("service", "")))


def read_spans(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[SpanRecord]:
    """Every span of every file. Blank lines are skipped; a line that is not a valid span, a
    missing file or input without any span is an InvalidRequest naming the file and line."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    spans: list[SpanRecord] = []
    for path in paths:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidRequest(f"{p}: no such file", field="spans") from None
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidRequest(f"{p}: cannot read: {e}", field="spans") from None
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidRequest(f"{where}: not valid JSON ({e.msg} at column {e.colno})",
                                     field="spans") from None
            spans.append(SpanRecord.from_dict(data, where))
    if not spans:
        raise InvalidRequest(f"no spans in {', '.join(str(p) for p in paths)}", field="spans",
                             limit="a JSON-lines span file written with --trace-file")
    return spans


def phase_of(span: SpanRecord) -> str | None:
    """The phase a span reports under, or None for spans the report leaves out."""
    a = span.attributes
    if span.name == N.SPAN_REQUEST:
        return "end_to_end"
    if span.name == N.SPAN_PHASE:
        phase = a.get(N.A_PHASE)
        return str(phase) if phase else None
    if span.name == N.SPAN_UNIT:
        kind = str(a.get(N.A_KIND, "unit"))
        return N.KIND_PHASE.get(kind, kind)
    if span.name == N.SPAN_POOL_EXECUTE:
        kind = str(a.get(N.A_KIND, "unit"))
        return "pool_" + N.KIND_PHASE.get(kind, kind)
    if span.name == N.SPAN_TRANSFER:
        return "transfer"
    if span.name == N.SPAN_LOOP:
        loop = str(a.get(N.A_LOOP_ID, "loop"))
        return N.LOOP_PHASE.get(loop, f"{loop}_loop")
    return None


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values (see the module docstring)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass(frozen=True)
class PhaseStats:
    count: int
    errors: int
    mean_s: float
    max_s: float
    percentiles_s: dict[int, float]

    @classmethod
    def of(cls, seconds: list[float], errors: int) -> "PhaseStats":
        values = sorted(seconds)
        return cls(len(values), errors, sum(values) / len(values), values[-1],
                   {p: percentile(values, p) for p in PERCENTILES})

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "errors": self.errors, "mean_s": self.mean_s, "max_s": self.max_s,
                **{f"p{p}_s": v for p, v in self.percentiles_s.items()}}


@dataclass(frozen=True)
class SloReport:
    """``classes[slo_class][phase]``; the class ``all`` pools every class."""

    classes: dict[str, dict[str, PhaseStats]]
    spans: int
    traces: int
    requests: int

    def to_dict(self) -> dict[str, Any]:
        return {"spans": self.spans, "traces": self.traces, "requests": self.requests,
                "percentile_method": "nearest-rank", "unit": "seconds",
                "classes": {c: {ph: s.to_dict() for ph, s in phases.items()} for c, phases in self.classes.items()}}

    def table(self) -> str:
        """A fixed-width text table, milliseconds."""
        head = ("class", "phase", "count", "errors", "p50 ms", "p95 ms", "p99 ms", "max ms")
        rows = [head]
        for cls, phases in self.classes.items():
            for phase, s in phases.items():
                rows.append((cls, phase, str(s.count), str(s.errors),
                             *(f"{s.percentiles_s[p] * 1e3:.3f}" for p in PERCENTILES), f"{s.max_s * 1e3:.3f}"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                 for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        summary = f"{self.requests} requests, {self.traces} traces, {self.spans} spans (nearest-rank percentiles)"
        return "\n".join([summary, *lines])


def _phase_key(phase: str) -> tuple[int, str]:
    order = N.PHASE_ORDER
    return (order.index(phase), "") if phase in order else (len(order), phase)


def build_report(spans: list[SpanRecord]) -> SloReport:
    """Group spans by (SLO class, phase) and take their percentiles."""
    class_of_trace: dict[str, str] = {}
    requests = 0
    for s in spans:
        if s.name == N.SPAN_REQUEST:
            requests += 1
            cls = s.attributes.get(N.A_SLO_CLASS)
            if cls:
                class_of_trace[s.trace_id] = str(cls)
    samples: dict[tuple[str, str], list[float]] = {}
    errors: dict[tuple[str, str], int] = {}
    for s in spans:
        phase = phase_of(s)
        if phase is None:
            continue
        cls = class_of_trace.get(s.trace_id) or str(s.attributes.get(N.A_SLO_CLASS) or "unknown")
        failed = s.status == "ERROR"
        for key in ((ALL_CLASSES, phase), (cls, phase)):
            samples.setdefault(key, []).append(s.seconds)
            errors[key] = errors.get(key, 0) + failed
    if not samples:
        raise InvalidRequest(f"none of the {len(spans)} spans is a fastvideo3 phase span", field="spans",
                             limit=f"spans named {N.SPAN_REQUEST}, {N.SPAN_UNIT}, {N.SPAN_PHASE}, ...")
    class_names = sorted({c for c, _ in samples if c != ALL_CLASSES})
    classes: dict[str, dict[str, PhaseStats]] = {}
    for cls in [ALL_CLASSES, *class_names]:
        phases = sorted({ph for c, ph in samples if c == cls}, key=_phase_key)
        classes[cls] = {ph: PhaseStats.of(samples[(cls, ph)], errors[(cls, ph)]) for ph in phases}
    return SloReport(classes, len(spans), len({s.trace_id for s in spans}), requests)


def report_from_files(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> SloReport:
    return build_report(read_spans(paths))
