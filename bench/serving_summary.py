"""The ``summary`` of a bench/serving.py result, and the merge of several parts' results into one.

Per step count (``summaries``): ``denoiser_utilization`` (the denoiser pool's busy time over the
step-batching burst's wall: from its spans when traced, else from its busy-seconds counter),
``speedup_vs_request_at_a_time`` and ``speedup_vs_diffusers`` (throughput ratios on the same
workload), and ``rows_per_s_fraction_of_flop_bound``: DiT rows (sample x CFG branch) per second
of denoiser busy time, against the rows per second a device at the measured bf16 matmul rate
could run by the closed-form FLOPs of one row (fastvideo3.models.wan.flops). The top level repeats
the largest step count's summary and adds ``summaries``, ``open_loop`` and ``mixed``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path


def flops_per_row(card_ref: str, frames: int, height: int, width: int) -> dict:
    """Closed-form FLOPs of one DiT row (one sample, one CFG branch) at a request shape."""
    from fastvideo3.card.registry import resolve_card
    from fastvideo3.models.wan import flops
    from fastvideo3.models.wan.family import dit_config
    cfg = dit_config(resolve_card(card_ref))
    cost = flops.dit_forward_cost(cfg, flops.StepShape.from_video(frames, height, width))
    return {"shape": f"{frames}x{height}x{width}", "tokens": cost.tokens, "flops": cost.flops,
            "dit": {k: v for k, v in cfg.to_dict().items() if k in ("num_layers", "num_heads", "head_dim", "ffn_dim")}}


def _num(x) -> float | None:
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _ratio(a, b) -> float | None:
    a, b = _num(a), _num(b)
    return round(a / b, 3) if a is not None and b else None


def compact_breakdown(br: dict) -> dict:
    """The spans' breakdown of a burst in a few numbers: per request (mean seconds) the phases
    and each kind's units, the scheduler's dispatch and return totals, each pool's busy time, and
    the denoiser's gaps split into return / scheduler / send (p50 seconds)."""
    pools = br.get("pools", {})
    return {"window_s": br.get("window_s"), "end_to_end_mean_s": br.get("end_to_end", {}).get("mean_s"),
            "per_request_mean_s": br.get("per_request_mean_s"),
            "dispatch_total_s": br.get("scheduler_phases", {}).get("dispatch", {}).get("total_s"),
            "unit_queue_wait_total_s": br.get("scheduler_phases", {}).get("unit_queue_wait", {}).get("total_s"),
            "execute_total_s": {k: v.get("total_s") for k, v in br.get("execute_by_role", {}).items()},
            "transfer_total_s": {k: v.get("total_s") for k, v in br.get("transfer_by_process", {}).items()},
            "result_return_total_s": {k: v.get("total_s") for k, v in br.get("result_return_by_kind", {}).items()},
            "pool_busy_s": {k: v.get("busy_s") for k, v in pools.items()},
            "denoiser_gap_p50_s": {k: v.get("p50_s") for k, v in br.get("denoiser_gap_parts", {}).items()},
            "denoiser_gap_total_s": {k: v.get("total_s") for k, v in br.get("denoiser_gap_parts", {}).items()},
            "decode_overlapping_denoise_s": br.get("decode_overlapping_denoise_s")}


def step_summary(result: dict, steps: int) -> dict:
    run = result.get("run", {})
    b = run.get("bursts", {}).get(str(steps), {})
    sb, rq = b.get("step_batching", {}), b.get("request_at_a_time", {})
    df = result.get("diffusers", {}).get(str(steps), {})
    den = sb.get("breakdown", {}).get("pools", {}).get("denoiser")
    busy = den["busy_s"] if den else sb.get("pool_busy_s", {}).get("denoiser")
    out: dict = {"steps": steps, "requests": sb.get("requests") or rq.get("requests") or df.get("requests"),
                 "utilization_source": "spans" if den else "counters"}
    out["denoiser_utilization"] = den["utilization"] if den else _ratio(busy, sb.get("wall_s"))
    out["denoiser_utilization_counters"] = _ratio(sb.get("pool_busy_s", {}).get("denoiser"), sb.get("wall_s"))
    if den:
        out["denoiser_gaps"] = {k: den["gaps"].get(k) for k in ("count", "total_s", "p50_s", "p90_s")}
        out["wall_breakdown"] = compact_breakdown(sb["breakdown"])
    out["requests_per_s"] = {"step_batching": sb.get("requests_per_s"), "request_at_a_time": rq.get("requests_per_s"),
                             "diffusers": df.get("requests_per_s")}
    complete = sb.get("completed") == sb.get("requests")
    out["speedup_vs_request_at_a_time"] = (_ratio(sb.get("requests_per_s"), rq.get("requests_per_s"))
                                           if complete and rq.get("completed") == rq.get("requests") else None)
    out["speedup_vs_diffusers"] = _ratio(sb.get("requests_per_s"), df.get("requests_per_s")) if complete else None
    rows = sb.get("denoise", {}).get("dit_rows")
    row_flops = result.get("flops", {}).get("per_row", {}).get("flops")
    peak = result.get("matmul_peak", {}).get("flops_per_s")
    if rows and _num(busy) and row_flops and peak:
        rate = rows / busy
        bound = peak / row_flops
        out.update(rows_per_s=round(rate, 3), flop_bound_rows_per_s=round(bound, 3),
                   rows_per_s_fraction_of_flop_bound=round(rate / bound, 4),
                   rows_per_s_wall_fraction_of_flop_bound=round(rows / sb["wall_s"] / bound, 4))
    else:
        out["rows_per_s_fraction_of_flop_bound"] = None
    bounds = dit_bounds(result, out)
    # the DiT forwards' device time per row (CUDA events in the denoiser) of each column: the
    # same rows cost the same on both paths, so step batching's gain is all outside the DiT
    device = {col: round(1000 * c["denoise"]["dit_forward_device_s"] / c["denoise"]["dit_rows"], 3)
              for col, c in (("step_batching", sb), ("request_at_a_time", rq))
              if _num(c.get("denoise", {}).get("dit_forward_device_s")) and c.get("denoise", {}).get("dit_rows")}
    if device:
        bounds = {**(bounds or {}), "forward_device_ms_per_row": device}
    if bounds:
        out["dit_bounds"] = bounds
    return out


def _burst_buckets(result: dict) -> dict[int, float]:
    """rows -> replay ms of the denoiser's captured buckets at the bursts' request shape (Wan's
    latent: frames (F-1)/4+1, height and width / 8), from the pools' warm-up replays."""
    wl = result.get("workload", {})
    try:
        w, h = (int(x) for x in str(wl.get("size", "")).split("x"))
        want = [str((int(wl["frames"]) - 1) // 4 + 1), str(h // 8), str(w // 8)]
    except (KeyError, ValueError):
        return {}
    out: dict[int, float] = {}
    for pool in result.get("run", {}).get("pools", {}).values():
        for b in pool.get("graph_buckets") or ():
            sig = str(b.get("signature", "")).split(".")[0].split("x")
            if sig[1:] == want and _num(b.get("replay_ms")) and b.get("batch"):
                out[int(b["batch"])] = float(b["replay_ms"])
    return out


def dit_bounds(result: dict, s: dict) -> dict | None:
    """What the DiT alone allows at this shape, from its buckets' replay times in the same run:
    its best ms per row and at a lone request's rows (its CFG branches), so the ratio of the two
    bounds step batching's gain over request-at-a-time on the same DiT path, and the best against
    the FLOP bound bounds ``rows_per_s_fraction_of_flop_bound``. ``service_ms_per_row``: the
    burst's denoiser busy time per row; the difference is the step's cost outside the DiT."""
    buckets = _burst_buckets(result)
    if not buckets:
        return None
    per_row = {r: ms / r for r, ms in sorted(buckets.items())}
    best = min(per_row.values())
    lone_rows = 2 if result.get("workload", {}).get("cfg", True) else 1
    out = {"replay_ms_per_row": {str(r): round(v, 3) for r, v in per_row.items()},
           "best_ms_per_row": round(best, 3)}
    if lone_rows in per_row:
        out["request_at_a_time_ms_per_row"] = round(per_row[lone_rows], 3)
        out["speedup_vs_request_at_a_time_bound"] = round(per_row[lone_rows] / best, 3)
    if _num(s.get("flop_bound_rows_per_s")):
        out["rows_per_s_fraction_of_flop_bound_bound"] = round(1000.0 / best / s["flop_bound_rows_per_s"], 4)
    if _num(s.get("rows_per_s")):
        out["service_ms_per_row"] = round(1000.0 / s["rows_per_s"], 3)
    return out


def open_loop_summary(result: dict) -> dict | None:
    ol = result.get("run", {}).get("open_loop")
    if not ol or "steady" not in ol:
        return ol and {"error": ol.get("rate_basis", {}).get("error") or ol.get("error")}
    den = ol.get("breakdown", {}).get("pools", {}).get("denoiser")
    return {"rate_per_s": ol["rate_per_s"],
            "offered_denoiser_utilization": offered_utilization(ol), "load": ol.get("rate_basis", {}).get("load"),
            "duration_s": ol["duration_s"], "arrivals": ol["arrivals"], "completed": ol["completed"],
            "steps_choices": ol["steps_choices"], "steady_window_s": ol["steady_window_s"],
            "denoiser_utilization": den["utilization"] if den else ol.get("denoiser_utilization_counters"),
            "denoiser_utilization_counters": ol.get("denoiser_utilization_counters"),
            "latency_p50_s": ol["steady"]["latency_p50_s"], "latency_p95_s": ol["steady"]["latency_p95_s"],
            "by_steps": ol.get("by_steps")}


def offered_utilization(ol: dict) -> float | None:
    """The denoiser utilization the open loop's arrivals offer: its rate times a request's busy
    seconds in the capacity bursts of the same run, averaged over the step counts the completed
    requests drew. A work-conserving denoiser whose steps cost what they cost in the bursts is busy
    about this fraction of the time, whatever it does between arrivals; reaching more needs the
    steps to cost more, not less."""
    per_req = ol.get("rate_basis", {}).get("denoiser_busy_s_per_request_by_steps") or {}
    counts = {s: (ol.get("by_steps") or {}).get(s, {}).get("completed") or 0 for s in per_req}
    total = sum(counts.values())
    if not per_req or not total or not _num(ol.get("rate_per_s")):
        return None
    return round(ol["rate_per_s"] * sum(counts[s] * per_req[s] for s in per_req) / total, 4)


def mixed_summary(result: dict) -> dict | None:
    m = result.get("run", {}).get("mixed")
    if not m or "together" not in m:
        return None
    return {"steps": m["steps"], "large": m["large"], "small": m["small"],
            "large_latency_alone_s": m["large_alone"].get("latency_mean_s"),
            "large_latency_mixed_s": m["together"]["large"].get("latency_mean_s"),
            "large_latency_ratio_vs_alone": m.get("large_latency_ratio_vs_alone"),
            "small_latency_alone_s": m["small_alone"].get("latency_mean_s"),
            "small_latency_mixed_s": m["together"]["small"].get("latency_mean_s"),
            "small_latency_ratio_vs_alone": m.get("small_latency_ratio_vs_alone")}


def build_summary(result: dict, goals: dict) -> dict:
    steps = sorted({int(s) for s in result.get("run", {}).get("bursts", {})} | {int(s) for s in result.get("diffusers", {})})
    summaries = [step_summary(result, s) for s in steps]
    # a part that ran no burst (the mixed workload alone) names its step count with nothing measured
    summaries = [x for x in summaries if x.get("requests") is not None] or summaries[-1:]
    top: dict = dict(summaries[-1]) if summaries else {}
    top["summaries"] = summaries
    top["open_loop"] = open_loop_summary(result)
    top["mixed"] = mixed_summary(result)
    reached = {}
    for s in summaries:
        for key in ("denoiser_utilization", "speedup_vs_diffusers", "speedup_vs_request_at_a_time"):
            goal = goals.get(f"{key}_{s['steps']}")
            if goal is not None and s.get(key) is not None:
                reached[f"{key}_{s['steps']}"] = {"value": s[key], "goal": goal, "met": s[key] >= goal}
    if top.get("rows_per_s_fraction_of_flop_bound") is not None:
        g = goals["rows_per_s_fraction_of_flop_bound"]
        reached["rows_per_s_fraction_of_flop_bound"] = {"value": top["rows_per_s_fraction_of_flop_bound"], "goal": g,
                                                        "met": top["rows_per_s_fraction_of_flop_bound"] >= g}
    ol = top["open_loop"] or {}
    if ol.get("denoiser_utilization") is not None:
        g = goals["open_loop_denoiser_utilization"]
        reached["open_loop_denoiser_utilization"] = {"value": ol["denoiser_utilization"], "goal": g,
                                                     "met": ol["denoiser_utilization"] >= g}
    top["goals"] = reached
    return top


def merge(paths: list[str]) -> dict:
    """One result from several parts' results (each from its own call): bursts and diffusers'
    columns joined by step count (a later file's burst of the same step count and mode replaces an
    earlier one's), the first mixed / open-loop run, the latest pools' description, the highest
    measured matmul peak; each part's GPU in ``merged_from`` (and ``machine.gpu`` per file when they differ)."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]
    out: dict = {k: first[k] for k in ("started", "machine", "workload", "flops") if k in first}
    out["merged_from"] = [{"file": Path(p).name, "command": d.get("command"), "parts": d.get("parts"),
                           "wall_s": d.get("wall_s"), "output_format": d.get("workload", {}).get("output_format"),
                           "gpu": d.get("machine", {}).get("gpu"),
                           **({"merged_from": d["merged_from"]} if "merged_from" in d else {})}
                          for p, d in zip(paths, parts)]
    gpus = {m["file"]: m["gpu"] for m in out["merged_from"]}
    if "machine" in out and len(set(gpus.values())) > 1:  # parts measured on different cards: each says which
        out["machine"] = {**out["machine"], "gpu": gpus,
                          "gpu_memory_gib": {Path(p).name: d.get("machine", {}).get("gpu_memory_gib")
                                             for p, d in zip(paths, parts)}}
    formats = {m["file"]: m["output_format"] for m in out["merged_from"]}
    if "workload" in out and len(set(formats.values())) > 1:  # parts measured with different result files
        out["workload"] = {**out["workload"], "output_format": formats}
    out["parts"] = sorted({x for d in parts for x in d.get("parts", [])})
    peaks = [d["matmul_peak"] for d in parts if d.get("matmul_peak", {}).get("flops_per_s")]
    if peaks:
        out["matmul_peak"] = max(peaks, key=lambda p: p["flops_per_s"])
    out["diffusers"] = {k: v for d in parts for k, v in d.get("diffusers", {}).items()}
    run: dict = {"bursts": {}}
    for d in parts:
        r = d.get("run", {})
        for s, b in r.get("bursts", {}).items():
            run["bursts"].setdefault(s, {}).update(b)
        for k in ("mixed", "open_loop", "variant"):
            if k in r and k not in run:
                run[k] = r[k]
        if "pools" in r:  # the latest part's (the bursts' too: later files win)
            run["pools"] = r["pools"]
        if "error" in r:
            run.setdefault("errors", []).append(r["error"][:500])
    out["run"] = run
    return out
