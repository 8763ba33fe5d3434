"""Span exporters of our own: one JSON object per line, the format the SLO report reads.

Each line is one finished span::

    {"name": "fastvideo3.unit", "trace_id": "<32 hex>", "span_id": "<16 hex>",
     "parent_id": "<16 hex>" | null, "start_ns": int, "end_ns": int, "service": "scheduler",
     "status": "UNSET" | "OK" | "ERROR", "attributes": {...},
     "links": [{"trace_id": "...", "span_id": "..."}]}

Every process may append to the same file: a batch of lines goes out in one ``write`` on a
descriptor opened with ``O_APPEND``, so lines from different processes never interleave.
Imports OpenTelemetry: load this module only when tracing is on.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    """The JSON-lines form of one finished span."""
    ctx = span.get_span_context()
    parent = span.parent
    resource = span.resource.attributes if span.resource is not None else {}
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "start_ns": int(span.start_time or 0),
        "end_ns": int(span.end_time or 0),
        "service": str(resource.get("service.name", "")),
        "status": span.status.status_code.name,
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in (span.attributes or {}).items()},
        "links": [{"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
                  for link in span.links],
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends finished spans to ``path`` as JSON lines (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = "".join(json.dumps(span_to_dict(s), separators=(",", ":")) + "\n" for s in spans).encode()
        with self._lock:
            if self._fd is None:
                return SpanExportResult.FAILURE
            view = memoryview(data)
            while view:  # a short write only happens on a full disk or a signal; finish the batch
                view = view[os.write(self._fd, view):]
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # every export is written through at once
