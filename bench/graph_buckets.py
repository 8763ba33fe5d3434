"""The denoiser's CUDA-graph buckets on one GPU: what the warm phase costs and what a step gains.

    python bench/graph_buckets.py --out OUT.json [--card wan2.1-t2v-1.3b] [--checkpoint-root DIR]
                                  [--shapes 17x256x256,81x480x832 --rows 1,2,4,8] [--iters 10] [--quick]

Starts the denoiser's executor on CUDA exactly as the service does (``DenoiserExecutor`` +
``warm_graphs("card")``: the card's ``graph_buckets`` captured through the runtime export) and
records, per captured bucket, the capture seconds and device memory from Describe's
``graph_buckets``, then the median ms (CUDA events) of

* ``forward``: one DiT forward of the bucket's rows through the executor's step path
  (``_forward_rows``: SWAP copies in, graph replay, the real rows copied out) against the eager
  fast path on the same inputs, with the relative error between the two;
* ``step``: one whole denoise step (``execute`` of as many requests as the bucket has rows, no CFG:
  fetch-free after the first step, DiT forward, sampler update) with graphs and eagerly;
* ``padded``: the forward of one row fewer than the bucket against eager at those rows (what a
  batch that does not fill its bucket costs): the bucket padded up, or the cover of smaller
  buckets the executor picks instead (``path`` names the replays, ``padding_rows`` the padding).

Without ``--checkpoint-root`` the card's DiT is drawn from a seed (random weights, real shapes), so
no checkpoint is needed. ``--shapes``/``--rows`` replace the card's buckets (e.g. the serving
workload's 17x256x256). The JSON (top-level ``summary``) is rewritten after every bucket.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

try:
    import fastvideo3  # noqa: F401
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from timing import cuda_times, upper_median  # the sibling module in bench/

from fastvideo3.card.registry import bind_checkpoint, resolve_card
from fastvideo3.card.spec import GraphBucketSpec, GraphShape, ModelCard
from fastvideo3.loop.params import DiffusionStepParams
from fastvideo3.models.wan.runtime_export import card_buckets
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.telemetry import names as N
from fastvideo3.transport import make_transport
from fastvideo3.vocab import Role, Sampler, UnitKind

NO_CFG = "none"  # one row per request: a step of N requests is one N-row forward


def time_ms(fn, warmup: int, iters: int) -> float:
    return upper_median(cuda_times(fn, warmup, iters))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def bench_card(args) -> ModelCard:
    card = resolve_card(args.card)
    if args.checkpoint_root:
        card = bind_checkpoint(card, args.checkpoint_root)
    data = card.model_dump(mode="json")
    if not args.checkpoint_root:  # random weights of the card's real shapes, drawn from a seed
        for name in card.dit_components():
            data["components"][name].update(source="seeded", subfolder=None)
    if args.shapes or args.rows:
        spec = card.graph_buckets
        shapes = [GraphShape(frames=int(f), height=int(h), width=int(w))
                  for f, h, w in (s.split("x") for s in args.shapes.split(","))] if args.shapes else spec.shapes
        rows = [int(r) for r in args.rows.split(",")] if args.rows else spec.rows
        data["graph_buckets"] = GraphBucketSpec(rows=rows, shapes=shapes).model_dump(mode="json")
    return ModelCard.model_validate(data)


class Eager:
    """Inside the block the executor finds no prepared bucket: every forward runs eagerly."""

    def __init__(self, ex) -> None:
        self.ex, self.held = ex, {}

    def __enter__(self):
        self.held, self.ex._prepared = self.ex._prepared, {}

    def __exit__(self, *exc):
        self.ex._prepared = self.held


def step_units(ex, card, bucket, step: int, sigmas: list[float], embeds: dict) -> list[WorkUnit]:
    units = []
    for i in range(bucket.rows):
        rid = f"bench-{bucket.key}-{i}"
        if rid not in embeds:
            text = torch.randn(1, bucket.text_len, ex.dit.cfg.text_dim, device=ex.device, dtype=ex.dtype)
            embeds[rid] = ex.transport.publish(rid, "prompt_embeds", text)
        params = DiffusionStepParams(step=step, timestep=float(1000 * sigmas[step]), sigmas=sigmas, guidance=1.0,
                                     cfg_policy=NO_CFG, sampler=Sampler.EULER, solver_order=1, seed=i,
                                     latent_shape=list(bucket.latent_shape), final=False)
        units.append(WorkUnit(unit_id=f"{rid}-{step}", request_id=rid, loop_id="diffusion_denoise",
                              kind=UnitKind.DIFFUSION_STEP, role=Role.DENOISER, card_id=card.model_id,
                              shape_sig=bucket.key, params=params, inputs={"prompt_embeds": embeds[rid]}, step=step))
    return units


def time_steps(ex, card, bucket, warmup: int, iters: int) -> tuple[float, str]:
    """Median ms of one execute of ``bucket.rows`` requests' step, and the path the last one took."""
    n = warmup + iters
    sigmas = [1.0 - k / (n + 1) for k in range(n + 2)]
    embeds: dict = {}
    ex.execute(step_units(ex, card, bucket, 0, sigmas, embeds))  # step 0 creates the latents, fetches text
    times, last = [], None
    for k in range(1, n + 1):
        units = step_units(ex, card, bucket, k, sigmas, embeds)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        results = ex.execute(units)
        torch.cuda.synchronize()
        if k > warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        bad = [r.error for r in results if not r.ok]
        if bad:
            raise RuntimeError(f"step {k} failed: {bad[0]}")
        last = results[0].span_attrs.get(N.A_GRAPH_BUCKET)
    for rid in embeds:
        ex.release(rid)
    return sorted(times)[len(times) // 2], str(last)


def bench_bucket(ex, card, bucket, entry: dict, warmup: int, iters: int) -> dict:
    g = torch.Generator(device=ex.device).manual_seed(bucket.rows)
    x = torch.randn(bucket.rows, *bucket.latent_shape, generator=g, device=ex.device).to(ex.dtype)
    t = torch.linspace(900.0, 100.0, bucket.rows, device=ex.device)
    text = torch.randn(bucket.rows, bucket.text_len, ex.dit.cfg.text_dim, generator=g, device=ex.device).to(ex.dtype)
    row = {**entry, "key": bucket.key, "rows": bucket.rows}
    graph_out, path = ex._forward_rows(x, t, text)
    eager_out = ex._forward(x, t, text)
    row["forward"] = {"path": path.bucket, "rel_error_vs_eager": rel(graph_out, eager_out),
                      "graph_ms": round(time_ms(lambda: ex._forward_rows(x, t, text), warmup, iters), 3),
                      "eager_ms": round(time_ms(lambda: ex._forward(x, t, text), warmup, iters), 3)}
    row["forward"]["speedup"] = round(row["forward"]["eager_ms"] / row["forward"]["graph_ms"], 3)
    if bucket.rows > 1:
        n = bucket.rows - 1
        xs, ts, texts = x[:n].contiguous(), t[:n].contiguous(), text[:n].contiguous()
        padded_out, ppath = ex._forward_rows(xs, ts, texts)
        row["padded"] = {"rows": n, "path": ppath.bucket, "padding_rows": ppath.padding_rows,
                         "rel_error_vs_eager": rel(padded_out, ex._forward(xs, ts, texts)),
                         "graph_ms": round(time_ms(lambda: ex._forward_rows(xs, ts, texts), warmup, iters), 3),
                         "eager_ms": round(time_ms(lambda: ex._forward(xs, ts, texts), warmup, iters), 3)}
    graph_step, step_path = time_steps(ex, card, bucket, warmup, iters)
    with Eager(ex):
        eager_step, eager_path = time_steps(ex, card, bucket, warmup, iters)
    row["step"] = {"graph_ms": round(graph_step, 3), "eager_ms": round(eager_step, 3),
                   "speedup": round(eager_step / graph_step, 3), "graph_path": step_path, "eager_path": eager_path}
    return row


def environment() -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def summarize(result: dict) -> dict:
    rows = result["buckets"]
    fwd = [r["forward"]["speedup"] for r in rows]
    step = [r["step"]["speedup"] for r in rows]
    return {"card": result["card"], "precision": result["precision"], "buckets_declared": result["declared"],
            "buckets_captured": len(result["graph_buckets"]),
            "capture_s_total": round(sum(g["capture_s"] for g in result["graph_buckets"]), 3),
            "capture_memory_bytes_total": int(sum(g["memory_bytes"] for g in result["graph_buckets"])),
            "warm_phase_s": result["warm_phase_s"], "buckets_timed": len(rows),
            "forward_speedup_min": min(fwd, default=None), "forward_speedup_max": max(fwd, default=None),
            "step_speedup_min": min(step, default=None), "step_speedup_max": max(step, default=None),
            "max_rel_error_vs_eager": max((r["forward"]["rel_error_vs_eager"] for r in rows), default=None),
            "all_forwards_replayed_graphs": all(r["forward"]["path"] == r["key"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--card", default="wan2.1-t2v-1.3b")
    ap.add_argument("--checkpoint-root", default=None, help="the card's weights (default: seeded random weights)")
    ap.add_argument("--precision", default=None, help="default: the card's CUDA default")
    ap.add_argument("--shapes", default=None, help="FRAMESxHEIGHTxWIDTH,... replacing the card's bucket shapes")
    ap.add_argument("--rows", default=None, help="ROWS,... replacing the card's bucket rows")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="1 warm-up, 3 timed calls")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: this bench needs a CUDA GPU", file=sys.stderr)
        return 2
    warmup, iters = (1, 3) if a.quick else (a.warmup, a.iters)
    from fastvideo3.runtime.pool.dit_executor import DenoiserExecutor
    card = bench_card(a)
    declared = card_buckets(card)
    result: dict = {"command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "environment": environment(),
                    "card": card.model_id, "declared": [b.key for b in declared], "buckets": []}
    t0 = time.perf_counter()
    ex = DenoiserExecutor(card, make_transport("inproc", owner="bench"), "cuda", a.precision)
    result["load_s"] = round(time.perf_counter() - t0, 3)
    result["precision"] = ex.precision
    t0 = time.perf_counter()
    result["graph_buckets"] = ex.warm_graphs("card")  # the service's warm phase
    result["warm_phase_s"] = round(time.perf_counter() - t0, 3)
    result["graph_capture"] = ex.graph_capture
    result["memory_allocated_after_warm_bytes"] = torch.cuda.memory_allocated()
    result["memory_reserved_after_warm_bytes"] = torch.cuda.memory_reserved()
    captured = {f"r{g['batch']}.{g['signature']}": g for g in result["graph_buckets"]}
    for bucket in sorted((b for b in declared if b.key in captured), key=lambda b: (b.signature, b.rows)):
        result["buckets"].append(bench_bucket(ex, card, bucket, captured[bucket.key], warmup, iters))
        result["summary"] = summarize(result)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1))
        print(json.dumps({k: result["buckets"][-1][k] for k in ("key", "capture_s", "memory_bytes", "forward", "step")}),
              flush=True)
    result["summary"] = summarize(result)
    result["describe_counters"] = ex.describe()["counters"]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
