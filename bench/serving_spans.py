"""Where a serving burst's wall time goes, from the fleet's own OpenTelemetry spans.

Every process of the fleet writes its spans to a JSON-lines file (``--trace-file``; one file per
process). :func:`breakdown` takes the spans of one time window (one burst of bench/serving.py) and
returns, per request on average and in total:

* ``queue_wait``, ``admission``: the request's phases before it runs (scheduler);
* ``unit_queue_wait`` (planned -> its batch sent) and ``dispatch`` (sent -> results back), and
  per WorkUnit kind ``result_return`` (the pool finished the unit -> the scheduler had the
  result);
* ``execute`` (the pool's span of each unit) and ``transfer`` (tensor pulls and pushes) per role;
* per pool role, its batches (``fastvideo3.pool.batch``): busy time (the union of the batches),
  utilisation (busy / window), first and last batch, and the gaps between consecutive batches
  (count, total, p50, p90) — for the denoiser, the time it waited on everything else;
* ``denoiser_gap_parts``: each gap between denoiser batches split into the result's return,
  the scheduler's own time (folding the results into the loops and planning the next batch: the
  unit spans end when results are back, so folding is measured as this remainder) and the send;
* ``decode_overlapping_denoise_s``: decoder busy time that overlaps denoiser busy time (a decode
  running beside the denoise steps, not between them).

Pure Python over span dicts (fastvideo3.telemetry.exporters.span_to_dict), no OpenTelemetry import.
"""
from __future__ import annotations

import json
from pathlib import Path

from fastvideo3.telemetry import names as N

SCHEDULER_PHASES = ("queue_wait", "admission", "unit_queue_wait", "dispatch")


def load_spans(paths) -> list[dict]:
    out = []
    for p in paths:
        p = Path(p)
        if not p.is_file():
            continue
        for line in p.read_text().splitlines():
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by a killed process
                    continue
    return out


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else None


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of ``[start, end)`` intervals, sorted."""
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def overlap(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> int:
    """Total length of the intersection of two merged interval lists."""
    i = j = total = 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0, b - a)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def clip(intervals: list[tuple[int, int]], t0: int, t1: int) -> list[tuple[int, int]]:
    return [(max(a, t0), min(b, t1)) for a, b in intervals if b > t0 and a < t1]


def _s(ns: float) -> float:
    return round(ns / 1e9, 4)


def _stats(values_ns: list[int]) -> dict:
    if not values_ns:
        return {"count": 0, "total_s": 0.0}
    return {"count": len(values_ns), "total_s": _s(sum(values_ns)), "mean_s": _s(sum(values_ns) / len(values_ns)),
            "p50_s": _s(pct(values_ns, 50)), "p90_s": _s(pct(values_ns, 90)), "max_s": _s(max(values_ns))}


def _role(span: dict) -> str:
    return str(span.get("attributes", {}).get(N.A_ROLE) or span.get("service") or "?")


def pool_activity(spans: list[dict], t0: int, t1: int) -> dict[str, dict]:
    """Per role: batches, busy time (union), utilisation over ``[t0, t1]`` and the gaps between batches."""
    by_role: dict[str, list[tuple[int, int]]] = {}
    for s in spans:
        if s["name"] == N.SPAN_POOL_BATCH and s["end_ns"] > t0 and s["start_ns"] < t1:
            by_role.setdefault(_role(s), []).append((s["start_ns"], s["end_ns"]))
    out = {}
    for role, iv in sorted(by_role.items()):
        busy = merge(clip(iv, t0, t1))
        gaps = [b[0] - a[1] for a, b in zip(busy, busy[1:])]
        out[role] = {"batches": len(iv), "busy_s": _s(sum(b - a for a, b in busy)),
                     "utilization": round(sum(b - a for a, b in busy) / max(1, t1 - t0), 4),
                     "first_batch_s": _s(busy[0][0] - t0) if busy else None,
                     "last_batch_end_s": _s(busy[-1][1] - t0) if busy else None,
                     "gaps": _stats(gaps), "_busy": busy}
    return out


def denoiser_gap_parts(spans: list[dict], t0: int, t1: int) -> dict:
    """Each gap between consecutive denoiser batches, split where the spans allow: ``return``
    (the batch's last unit execute span ended -> the scheduler had its results back: the dispatch
    phase's end), ``scheduler`` (results back -> the next batch's dispatch began: folding the
    results into the requests' loops, planning, admission) and ``send`` (dispatch began -> the
    pool started the next batch: the request's trip and the pool's input pulls)."""
    execute_by_batch: dict[str, list[dict]] = {}
    for s in spans:
        if s["name"] == N.SPAN_POOL_EXECUTE and _role(s) == "denoiser":
            for link in s.get("links", []):
                execute_by_batch.setdefault(link["span_id"], []).append(s)
    dispatch_by_unit = {s["parent_id"]: s for s in spans if s["name"] == N.SPAN_PHASE
                        and s["attributes"].get(N.A_PHASE) == "dispatch" and s.get("parent_id")}
    batches = sorted((s for s in spans if s["name"] == N.SPAN_POOL_BATCH and _role(s) == "denoiser"
                      and t0 <= s["start_ns"] <= t1), key=lambda s: s["start_ns"])
    parts: dict[str, list[int]] = {"return": [], "scheduler": [], "send": []}
    for prev, nxt in zip(batches, batches[1:]):
        d_prev = [dispatch_by_unit.get(e["parent_id"]) for e in execute_by_batch.get(prev["span_id"], [])]
        d_next = [dispatch_by_unit.get(e["parent_id"]) for e in execute_by_batch.get(nxt["span_id"], [])]
        d_prev, d_next = [d for d in d_prev if d], [d for d in d_next if d]
        if not d_prev or not d_next or nxt["start_ns"] < prev["end_ns"]:
            continue  # overlapping batches (several replicas) or spans missing: no gap to split
        back = max(d["end_ns"] for d in d_prev)
        sent = min(d["start_ns"] for d in d_next)
        parts["return"].append(max(0, back - prev["end_ns"]))
        parts["scheduler"].append(max(0, sent - back))
        parts["send"].append(max(0, nxt["start_ns"] - sent))
    return {k: _stats(v) for k, v in parts.items()}


def breakdown(spans: list[dict], t0: int, t1: int) -> dict:
    """The wall-time breakdown of the window ``[t0, t1]`` (nanoseconds since the epoch)."""
    inside = [s for s in spans if t0 <= s.get("start_ns", 0) <= t1]
    requests = [s for s in inside if s["name"] == N.SPAN_REQUEST]
    n_req = max(1, len(requests))
    phases: dict[str, list[int]] = {}
    dispatch_end: dict[str, int] = {}
    for s in inside:
        if s["name"] == N.SPAN_PHASE:
            ph = s["attributes"].get(N.A_PHASE, "?")
            phases.setdefault(ph, []).append(s["end_ns"] - s["start_ns"])
            if ph == "dispatch" and s.get("parent_id"):
                dispatch_end[s["parent_id"]] = s["end_ns"]
    units: dict[str, list[int]] = {}
    kind_of: dict[str, str] = {}
    for s in inside:
        if s["name"] == N.SPAN_UNIT:
            kind = kind_of[s["span_id"]] = s["attributes"].get(N.A_KIND, "?")
            units.setdefault(kind, []).append(s["end_ns"] - s["start_ns"])
    returned: dict[str, list[int]] = {}  # the pool finished the unit -> the scheduler had its result
    for s in inside:
        if s["name"] == N.SPAN_POOL_EXECUTE and s.get("parent_id") in dispatch_end:
            kind = kind_of.get(s["parent_id"], s["attributes"].get(N.A_KIND, "?"))
            returned.setdefault(kind, []).append(max(0, dispatch_end[s["parent_id"]] - s["end_ns"]))
    execute: dict[str, list[int]] = {}
    transfer: dict[str, list[int]] = {}
    transfer_bytes: dict[str, int] = {}
    for s in inside:
        if s["name"] == N.SPAN_POOL_EXECUTE:
            execute.setdefault(_role(s), []).append(s["end_ns"] - s["start_ns"])
        elif s["name"] == N.SPAN_TRANSFER:
            role = str(s.get("service") or "?")
            transfer.setdefault(role, []).append(s["end_ns"] - s["start_ns"])
            transfer_bytes[role] = transfer_bytes.get(role, 0) + int(s["attributes"].get(N.A_BYTES) or 0)
    pools = pool_activity(spans, t0, t1)
    den, dec = pools.get("denoiser", {}).get("_busy", []), pools.get("decoder", {}).get("_busy", [])
    for p in pools.values():
        p.pop("_busy", None)
    e2e = [s["end_ns"] - s["start_ns"] for s in requests]
    per_request = {ph: _s(sum(phases.get(ph, [])) / n_req) for ph in ("queue_wait", "admission")}
    per_request.update({f"{k}_units": _s(sum(v) / n_req) for k, v in units.items()})
    return {
        "window_s": _s(t1 - t0), "spans": len(inside), "requests": len(requests),
        "end_to_end": _stats(e2e),
        "per_request_mean_s": per_request,
        "scheduler_phases": {ph: _stats(phases.get(ph, [])) for ph in SCHEDULER_PHASES},
        "units_by_kind": {k: _stats(v) for k, v in sorted(units.items())},
        "result_return_by_kind": {k: _stats(v) for k, v in sorted(returned.items())},
        "execute_by_role": {k: _stats(v) for k, v in sorted(execute.items())},
        "transfer_by_process": {k: {**_stats(v), "bytes": transfer_bytes.get(k, 0)} for k, v in sorted(transfer.items())},
        "pools": pools,
        "denoiser_gap_parts": denoiser_gap_parts(spans, t0, t1),
        "decode_overlapping_denoise_s": _s(overlap(den, dec)),
    }
