"""Serving throughput and latency on one device, through the real fleet: step batching across
requests against request-at-a-time dispatch over the same pools, against diffusers' WanPipeline
one request at a time on the same weights, a mixed workload and an open-loop run; with the wall
time broken down from the fleet's own OpenTelemetry spans and a top-level ``summary``.

    python bench/serving.py --card DIR --device cuda --out FILE [--steps 8,50 --requests 16
           --frames 17 --size 256x256 --guidance 5] [--parts batching,request,diffusers,mixed,open_loop]
           [--mixed-small 8 --mixed-large 4 --large-frames 33 --large-size 832x480 --mixed-steps 20]
           [--open-loop-s 180 --open-loop-load 0.8 | --open-loop-rate R | --capacity-from FILE]
    python bench/serving.py --merge PART.json [PART.json ...] --out FILE   # one JSON (and summary) of parts
    python bench/serving.py --card DIR --device cpu --steps 2 --requests 2 ...   # smoke check (tests/)

Parts (``--parts``; each GPU call may run some and write its own JSON, ``--merge`` joins them):

* ``batching`` / ``request``: per step count, ``--requests`` requests submitted at once to a
  scheduler that batches steps across requests, and to a second scheduler over the same pools
  with ``--no-batching --max-running 1`` (request-at-a-time). Throughput is requests over the
  burst's wall; a request's latency is from the burst's start to its result.
* ``diffusers``: ``WanPipeline`` (bf16, its VAE in fp32) on the same directory and workload, one
  request at a time in this process, before the fleet starts (``--card`` must be a
  diffusers-format directory; ``--diffusers-requests`` bounds how many run).
* ``mixed``: ``--mixed-small`` small requests (the burst's shape) and ``--mixed-large`` large ones,
  each kind alone and then together: the large ones' latency against running alone, and the
  small ones' (not queued behind the large).
* ``open_loop``: Poisson arrivals at ``--open-loop-load`` (0.8) of the batched capacity measured
  in the same run (or ``--capacity-from`` an earlier part's JSON, or ``--open-loop-rate``) for
  ``--open-loop-s`` seconds, each request's step count drawn from ``--steps``; denoiser
  utilisation over the steady state and p50/p95 latency.

Every fleet process writes its spans to its own JSON-lines file (``--trace-file``) unless
``--no-trace``; after the fleet stops, each part's window of spans is broken down
(bench/serving_spans.py): queue, admission, dispatch, execute, transfer, result folding, and each
pool's busy time and gaps. ``summary``: ``steps``, ``requests``, ``denoiser_utilization`` (busy /
wall of the step-batching burst), ``speedup_vs_request_at_a_time``, ``speedup_vs_diffusers``,
``rows_per_s_fraction_of_flop_bound`` (DiT rows per denoiser-busy second against the closed-form
FLOPs of a row, fastvideo3.models.wan.flops, at the bf16 matmul rate measured in the same run),
one per step count in ``summaries``, and ``open_loop`` / ``mixed``. ``--mode inproc`` runs only
batching and request-at-a-time in the embedded Engine (no spans). Each part gets an untimed
warm-up first. The JSON is rewritten after each part.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a source checkout without installing the package
    sys.path.insert(0, str(REPO))
HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # the sibling modules
    sys.path.insert(0, HERE)

from serving_fleet import OUTPUT, latency_stats, pct, prompts, request_kw  # noqa: E402,F401 - re-exported

PARTS = ("batching", "request", "diffusers", "mixed", "open_loop")
GOALS = {"denoiser_utilization_50": 0.90, "denoiser_utilization_8": 0.80, "speedup_vs_diffusers_50": 8.0,
         "speedup_vs_request_at_a_time_50": 2.0, "rows_per_s_fraction_of_flop_bound": 0.60,
         "open_loop_denoiser_utilization": 0.90}


def portable(args: list[str]) -> str:
    """A command line with absolute paths cut to their last part (no machine's layout in results)."""
    return " ".join(f"DIR/{Path(x).name}" if x.startswith("/") else x for x in args)


def record_unit_failures(store: list) -> None:
    """Keep the traceback of every WorkUnit an in-process executor fails: the StepResult carries
    only the message, which is not enough to find a fault seen on one machine only."""
    import traceback
    from fastvideo3.runtime.pool import dit_executor, executors
    fail = executors._fail

    def traced(unit, exc):
        if len(store) < 5:
            store.append({"kind": unit.kind, "step": unit.step, "error": f"{type(exc).__name__}: {exc}"[:500],
                          "traceback": traceback.format_exc()[-4000:]})
        return fail(unit, exc)

    executors._fail = dit_executor._fail = traced  # the denoiser's executor holds its own name for it


def summary(latencies: list[float], wall: float, n: int, errors: list[str]) -> dict:
    done = len(latencies)
    return {"requests": n, "completed": done, "wall_s": round(wall, 3),
            "requests_per_s": round(done / wall, 4) if wall > 0 else None,
            "latency_p50_s": round(pct(latencies, 50), 3), "latency_p95_s": round(pct(latencies, 95), 3),
            "latency_max_s": round(max(latencies), 3) if latencies else None, "errors": errors[:5]}


# ------------------------------------------------------------------------------ in-process
def run_inproc(a, deadline: float, save) -> dict:
    """The embedded Engine: one set of executors, toggled between the two dispatch modes."""
    from fastvideo3.card.registry import resolve_card
    from fastvideo3.engine import Engine

    t0 = time.perf_counter()
    engine = Engine(resolve_card(a.card), a.device, batching=True, max_batch=max(16, a.requests))
    out: dict = {"variant": "inproc (embedded Engine: CoreScheduler + executors in one process)",
                 "load_s": round(time.perf_counter() - t0, 2),
                 "pools": {k: {"device": v["device"], "precision": v["precision"], **({"dit_path": v["dit_path"]}
                                                                                    if "dit_path" in v else {})}
                           for k, v in engine.describe()["pools"].items()}}
    kw = request_kw(a.frames, a.width, a.height, a.steps_list[0], a.guidance)
    failures: list = []
    record_unit_failures(failures)
    try:
        t0 = time.perf_counter()
        engine.generate("warm-up", seed=999, **kw)
        out["warmup_s"] = round(time.perf_counter() - t0, 2)
        for name, batching, max_running in (("step_batching", True, engine.scheduler.max_running),
                                            ("request_at_a_time", False, 1)):
            engine.denoiser.batching = batching
            engine.scheduler.max_running = max_running
            out[name] = _inproc_burst(engine, a, kw, deadline, name)
            out[name]["scheduler"] = {"batching": batching, "max_running": max_running}
            save(out)
    except Exception as e:  # noqa: BLE001 - recorded with the failing units' tracebacks
        out["error"] = f"{type(e).__name__}: {e}"[:3000]
    finally:
        if failures:
            out["unit_failures"] = failures
        engine.close()
    return out


def _inproc_burst(engine, a, kw: dict, deadline: float, tag: str) -> dict:
    before = dict(engine.scheduler.counters)
    fwd_before = dict(engine.denoiser.counters)
    pools = {"encoder": engine.encoder, "denoiser": engine.denoiser, "decoder": engine.decoder}
    busy_before = {r: ex.counters["busy_seconds"] for r, ex in pools.items()}
    finished: dict[str, float] = {}

    def on_event(ev) -> None:
        if ev.kind == "finished":
            finished[ev.request_id] = time.perf_counter()

    t0 = time.perf_counter()
    runs = [engine.submit(p, seed=i, **kw) for i, p in enumerate(prompts(a.requests, tag))]
    engine.run(until=lambda: time.time() > deadline, on_event=on_event)
    wall = time.perf_counter() - t0
    lat, errors = [], []
    for run in runs:
        if run.status == "SUCCEEDED":
            engine.result(run)  # fetch the frames, free the request everywhere
            lat.append(finished[run.request_id] - t0)
        else:
            errors.append(f"{run.request_id}: {run.status} {run.error.message if run.error else 'time limit'}")
            engine.cancel(run.request_id)
    engine.run()
    res = summary(lat, wall, a.requests, errors)
    c = engine.scheduler.counters
    d = engine.denoiser.counters
    batches = c.get("diffusion_step.batches", 0) - before.get("diffusion_step.batches", 0)
    units = c.get("diffusion_step.units", 0) - before.get("diffusion_step.units", 0)
    res["denoise"] = {"batches": int(batches), "units": int(units), "mean_units_per_batch": round(units / max(1, batches), 2),
                      "dit_forwards": int(d["forwards"] - fwd_before["forwards"]),
                      "dit_rows": int(d["rows"] - fwd_before["rows"]), "max_batch_rows": int(d["max_batch_rows"])}
    res["pool_busy_s"] = {r: round(ex.counters["busy_seconds"] - busy_before[r], 3) for r, ex in pools.items()}
    return res



def machine(device: str) -> dict:
    import torch
    info = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "torch": torch.__version__}
    if device.startswith("cuda") and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
        try:
            from fastvideo3.kernels import attention_available
            info["fa3_available"] = attention_available("fa3", "cuda")
        except Exception:  # noqa: BLE001
            pass
    for mod in ("diffusers", "transformers", "grpc", "google.protobuf", "pydantic"):
        try:
            info[mod] = __import__(mod, fromlist=["__version__"]).__version__
        except Exception:  # noqa: BLE001 - a missing package is simply not listed
            pass
    return info



# ------------------------------------------------------------------------------ fleet
def tracing_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("opentelemetry.sdk") is not None


def run_fleet(a, deadline: float, save, log_dir: Path, trace_dir: Path | None, out: dict) -> dict:
    """The real fleet: pools and schedulers as separate processes on loopback; every part of
    ``a.parts`` that needs it, recorded into ``out`` (rewritten after each part)."""
    from fastvideo3.client import FleetClient
    from fleet.launcher import LocalFleet
    from serving_fleet import burst, mixed, open_loop

    def trace(name: str) -> list[str]:
        return ["--trace-file", str(trace_dir / f"{name}.jsonl")] if trace_dir is not None else []

    roles = ("encoder", "denoiser", "decoder")
    common = ["--device-profile", a.device_profile, "--interactive-budget-s", "1e6", "--batch-budget-s", "1e6",
              "--max-batch", str(a.max_batch)]
    if a.double_buffer_min_units is not None:
        common += ["--double-buffer-min-units", str(a.double_buffer_min_units)]
    if a.cohort_rows is not None:
        common += ["--cohort-rows", str(a.cohort_rows)]
    card, out["card_graph_buckets"] = serving_card(a, log_dir)
    fleet = LocalFleet(card, roles=roles, device=a.device, scheduler_args=common + trace("scheduler"),
                       pool_args={r: trace(r) for r in roles}, log_dir=log_dir)
    out["variant"] = ("fleet (fleet.launcher.LocalFleet: one process per pool + scheduler processes, gRPC, "
                      "transport auto)")
    out["tracing"] = trace_dir is not None
    try:
        t0 = time.perf_counter()
        fleet.start(timeout_s=max(10.0, min(240.0, 0.6 * (deadline - time.time()))))
        out["start_s"] = round(time.perf_counter() - t0, 2)
        request_target = None
        if "request" in a.parts:
            alone = ["--no-batching", "--max-running", "1"]
            request_target = fleet.add_scheduler(common + alone + trace("scheduler-request-at-a-time"),
                                                 name="scheduler-request-at-a-time")
            out["request_at_a_time_flags"] = common + alone
        out["processes"] = {fp.name: "python " + portable(fp.argv[1:]) for fp in fleet.processes()}
        t0 = time.perf_counter()
        warm = [(a.frames, a.width, a.height)]
        if "mixed" in a.parts:
            warm.append((a.large_frames, a.large_width, a.large_height))
        with FleetClient(fleet.target, timeout_s=max(5.0, deadline - time.time())) as c:
            for i, (f, w, h) in enumerate(warm):  # one untimed request per shape, every step count's path
                c.generate("warm-up", seed=999 + i, output_format=OUTPUT["format"],
                           **request_kw(f, w, h, min(a.steps_list), a.guidance))
            out["pools"] = _pool_info(c.describe())
        out["warmup_s"] = round(time.perf_counter() - t0, 2)
        save()
        bursts = out.setdefault("bursts", {})
        for steps in a.steps_list:
            kw = request_kw(a.frames, a.width, a.height, steps, a.guidance)
            here = bursts.setdefault(str(steps), {})
            if "batching" in a.parts:
                here["step_batching"] = burst(fleet.target, a.requests, kw, f"batching-{steps}", deadline)
                save()
            if request_target is not None:
                here["request_at_a_time"] = burst(request_target, a.requests, kw, f"request-{steps}", deadline)
                save()
        if "mixed" in a.parts:
            out["mixed"] = mixed(fleet.target, a, deadline)
            save()
        if "open_loop" in a.parts:
            rate, basis = open_loop_rate(a, bursts)
            out["open_loop"] = {"rate_basis": basis}
            if rate:
                out["open_loop"].update(open_loop(fleet.target, a, rate, a.steps_list, deadline))
            save()
    except Exception as e:  # noqa: BLE001 - recorded with the logs' tails
        out["error"] = f"{type(e).__name__}: {e}"[:3000]
        out["log_tails"] = {fp.name: fp.log_tail(15) for fp in fleet.processes()}
    finally:
        out["stop_codes"] = fleet.stop()  # SIGTERM: every process has written its spans
    if trace_dir is not None:
        add_breakdowns(out, sorted(trace_dir.glob("*.jsonl")))
    return out


def serving_card(a, log_dir: Path) -> tuple[str, dict | None]:
    """The card the fleet serves and the graph buckets it declares for this run (None: the card's
    own): ``a.card`` itself, or (``--graph-rows``) a card file of the same
    card whose graph buckets are the workload's request shape at those rows -- what a deployment serving
    these shapes declares, so the denoiser captures them as CUDA graphs and the decoder tunes their
    decodes at warm-up. Shapes the card's limits refuse are left out (they run eagerly)."""
    from fastvideo3.card.registry import resolve_card
    from fastvideo3.card.spec import GraphBucketSpec, GraphShape, graph_buckets_within
    if not a.graph_rows:
        return a.card, None
    base = resolve_card(a.card)
    # the small shape only: buckets are rows x shapes, and 32 rows of the mixed part's large clip
    # would be a capture of ~450k tokens (graphs pay below ~8k tokens; large batches run eagerly)
    spec = graph_buckets_within(GraphBucketSpec(rows=a.graph_rows, shapes=[
        GraphShape(frames=a.frames, height=a.height, width=a.width)]), base.limits)
    data = base.model_dump(mode="json")
    data["graph_buckets"] = spec.model_dump(mode="json")
    path = log_dir / "serving_card.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return str(path), data["graph_buckets"]


def open_loop_rate(a, bursts: dict) -> tuple[float | None, dict]:
    """``a.open_loop_load`` of the batched capacity for the mixed step counts (a request's
    average service time over the step counts), from this run's bursts or ``--capacity-from``.
    The basis also records what a request of each step count kept the denoiser busy in those
    bursts (``denoiser_busy_s_per_request_by_steps``, where every step count has one): with the
    arrivals' mix, the utilization the open loop offers (bench/serving_summary.py)."""
    prior: dict = {}
    if a.capacity_from:
        prior = json.loads(Path(a.capacity_from).read_text()).get("run", {}).get("bursts", {})

    def batching(s) -> dict:
        return bursts.get(str(s), {}).get("step_batching") or prior.get(str(s), {}).get("step_batching") or {}

    busy = {}
    for s in a.steps_list:
        sb = batching(s)
        b, n = sb.get("pool_busy_s", {}).get("denoiser"), sb.get("completed")
        if isinstance(b, (int, float)) and n:
            busy[str(s)] = round(b / n, 5)
    extra = {"denoiser_busy_s_per_request_by_steps": busy} if len(busy) == len(a.steps_list) else {}
    if a.open_loop_rate:
        return a.open_loop_rate, {"given_rate_per_s": a.open_loop_rate, **extra}
    caps = {s: bursts.get(str(s), {}).get("step_batching", {}).get("requests_per_s") for s in a.steps_list}
    source = "this run"
    if not all(caps.values()) and prior:
        caps = {s: caps.get(s) or batching(s).get("requests_per_s") for s in a.steps_list}
        source = f"this run and {Path(a.capacity_from).name}"
    if not all(caps.values()):
        return None, {"error": "no batched capacity for every step count: run the batching part first, "
                               "or pass --capacity-from / --open-loop-rate", "capacities": caps}
    mixed_cap = 1.0 / (sum(1.0 / caps[s] for s in a.steps_list) / len(a.steps_list))
    return a.open_loop_load * mixed_cap, {"capacity_per_s_by_steps": caps, "mixed_capacity_per_s": round(mixed_cap, 4),
                                          "load": a.open_loop_load, "source": source, **extra}


def add_breakdowns(out: dict, files: list[Path]) -> None:
    """Each part's window of spans, broken down (bench/serving_spans.py), into its own record."""
    from serving_spans import breakdown, load_spans
    spans = load_spans(files)
    out["span_files"] = {f.name: sum(1 for _ in f.open()) for f in files}
    records = [r for b in out.get("bursts", {}).values() for r in b.values()]
    m = out.get("mixed") or {}
    records += [m[k] for k in ("small_alone", "large_alone", "together") if k in m]
    if out.get("open_loop", {}).get("window_ns"):
        records.append(out["open_loop"])
    for r in records:
        if r.get("window_ns"):
            r["breakdown"] = breakdown(spans, *r["window_ns"])


def _pool_info(desc: dict) -> dict:
    """Device, precision and DiT path of each pool, from the scheduler's Describe."""
    info = {}
    for name, pool in desc["description"].get("pools", {}).items():
        ex = pool.get("executor") or {}
        info[name] = {"role": pool.get("role"), "device": pool.get("device"), "precision": pool.get("precision"),
                      **({"dit_path": ex["kind"]} if pool.get("role") == "denoiser" and ex.get("kind") else {}),
                      # the DiT's own cost per captured bucket (one replay at warm-up): the bound a step
                      # of that many rows can reach, beside which the service's overhead shows
                      **({"graph_buckets": [{k: b.get(k) for k in ("batch", "signature", "replay_ms")}
                                            for b in pool["graph_buckets"]]}
                         if pool.get("role") == "denoiser" and pool.get("graph_buckets") else {}),
                      **({"decode": ex["decoder"]} if "decoder" in ex else {})}
    return info


# ------------------------------------------------------------------------------ main
def _size(ap, name: str, value: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in value.lower().split("x"))
    except ValueError:
        ap.error(f"--{name} must be WIDTHxHEIGHT, got {value!r}")
    if not (16 <= w <= 4096 and 16 <= h <= 4096):
        ap.error(f"--{name} must be within 16..4096 on each side, got {value!r}")
    return w, h


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--card", default="wan-tiny", help="card name, card file or diffusers-format directory")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--frames", type=int, default=None, help="default 17 (9 on a CPU)")
    ap.add_argument("--size", default=None, help="WIDTHxHEIGHT, default 256x256 (64x64 on a CPU)")
    ap.add_argument("--steps", default="8,50", help="step counts, comma-separated (one summary each)")
    ap.add_argument("--guidance", type=float, default=5.0)
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    ap.add_argument("--mode", choices=("fleet", "inproc", "auto"), default="auto")
    ap.add_argument("--output-format", choices=("mp4", "npy"), default="mp4",
                    help="the file each request asks for (default mp4, what a client gets by default; the "
                         "diffusers column encodes the same file with the same encoder)")
    ap.add_argument("--max-batch", type=int, default=16, help="the batching scheduler's --max-batch")
    ap.add_argument("--cohort-rows", default=None, help="the schedulers' --cohort-rows (auto, off or rows; default: theirs)")
    ap.add_argument("--double-buffer-min-units", type=int, default=None,
                    help="the schedulers' --double-buffer-min-units (default: the scheduler's own)")
    ap.add_argument("--diffusers-requests", type=int, default=None, help="diffusers requests per step count "
                                                                         "(default --requests)")
    ap.add_argument("--mixed-small", type=int, default=8)
    ap.add_argument("--mixed-large", type=int, default=4)
    ap.add_argument("--large-frames", type=int, default=None, help="default 33 (17 on a CPU)")
    ap.add_argument("--large-size", default=None, help="WIDTHxHEIGHT, default 832x480 (128x128 on a CPU)")
    ap.add_argument("--mixed-steps", type=int, default=20)
    ap.add_argument("--open-loop-s", type=float, default=180.0, help="seconds of Poisson arrivals")
    ap.add_argument("--open-loop-load", type=float, default=0.8, help="arrival rate / measured batched capacity")
    ap.add_argument("--open-loop-rate", type=float, default=None, help="arrivals per second (overrides the load)")
    ap.add_argument("--open-loop-warm-s", type=float, default=20.0, help="start of the steady state")
    ap.add_argument("--capacity-from", default=None, help="a batching part's JSON (capacity for the open loop)")
    ap.add_argument("--graph-rows", default=None,
                    help="declare the workload's request shape as the card's graph buckets at these DiT rows "
                         "(comma list; default 1,2,4,8,16,32 on cuda, none on a CPU; 'none': the card's own)")
    ap.add_argument("--no-trace", action="store_true", help="no span files (no breakdown)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device-profile", default=None, help="scheduler cost-model prior (default: h200 on cuda)")
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds for the whole script")
    ap.add_argument("--log-dir", default=None, help="fleet process logs and span files (default: a temporary directory)")
    ap.add_argument("--merge", nargs="+", default=None, help="parts' JSON files to join into --out")
    ap.add_argument("--out", default=None, help="JSON file (default: print only)")
    a = ap.parse_args(argv)
    if a.merge:
        return a
    import torch
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.device_profile = a.device_profile or ("h200" if a.device.startswith("cuda") else "cpu")
    cpu = not a.device.startswith("cuda")  # a CPU run is a smoke check: smaller default clips
    a.frames = a.frames or (9 if cpu else 17)
    a.large_frames = a.large_frames or (17 if cpu else 33)
    a.width, a.height = _size(ap, "size", a.size or ("64x64" if cpu else "256x256"))
    a.large_width, a.large_height = _size(ap, "large-size", a.large_size or ("128x128" if cpu else "832x480"))
    try:
        a.steps_list = sorted({int(x) for x in a.steps.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--steps must be integers separated by commas, got {a.steps!r}")
    rows = a.graph_rows or ("none" if cpu else "1,2,4,8,16,32")
    try:
        a.graph_rows = [] if rows == "none" else sorted({int(x) for x in rows.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--graph-rows must be integers separated by commas (or none), got {rows!r}")
    if len(a.graph_rows) > 16 or not all(1 <= r <= 256 for r in a.graph_rows):
        ap.error(f"--graph-rows must be at most 16 values in 1..256, got {rows!r}")
    a.parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    if not a.parts or not set(a.parts) <= set(PARTS):
        ap.error(f"--parts must be a subset of {','.join(PARTS)}, got {','.join(a.parts)!r}")
    if not a.steps_list or not all(1 <= s <= 1000 for s in a.steps_list):
        ap.error(f"--steps must be in 1..1000, got {a.steps!r}")
    a.diffusers_requests = a.diffusers_requests or a.requests
    for name, lo, hi in (("requests", 1, 256), ("diffusers_requests", 1, 256), ("mixed_small", 0, 64),
                         ("mixed_large", 0, 64), ("mixed_steps", 1, 1000), ("max_batch", 1, 256),
                         ("frames", 1, 257), ("large_frames", 1, 257)):
        if not lo <= getattr(a, name) <= hi:
            ap.error(f"--{name.replace('_', '-')} must be in {lo}..{hi}, got {getattr(a, name)}")
    for name, lo, hi in (("open_loop_s", 1.0, 3600.0), ("open_loop_load", 0.01, 2.0), ("open_loop_warm_s", 0.0, 3600.0),
                         ("time_limit", 1.0, 86400.0)):
        if not lo <= getattr(a, name) <= hi:
            ap.error(f"--{name.replace('_', '-')} must be in {lo}..{hi}, got {getattr(a, name)}")
    if a.open_loop_rate is not None and not 0.001 <= a.open_loop_rate <= 1000:
        ap.error(f"--open-loop-rate must be in 0.001..1000 per second, got {a.open_loop_rate}")
    if a.cohort_rows is not None:
        from fastvideo3.runtime.scheduling.cohorts import parse_cohort_rows
        try:
            a.cohort_rows = parse_cohort_rows(a.cohort_rows)
        except ValueError as e:
            ap.error(f"--cohort-rows: {e}")
    if "mixed" in a.parts and a.mixed_small + a.mixed_large == 0:
        ap.error("--mixed-small and --mixed-large are both 0: drop the mixed part instead")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    from serving_summary import build_summary, flops_per_row, merge

    def write(result: dict) -> None:
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1, default=str) + "\n")

    if a.merge:
        result = merge(a.merge)
        result["summary"] = build_summary(result, GOALS)
        write(result)
        print_summary(result)
        return 0
    deadline = time.time() + a.time_limit
    OUTPUT["format"] = a.output_format
    result: dict = {
        "command": "python bench/serving.py " + portable(argv if argv is not None else sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(a.device), "parts": a.parts,
        "workload": {"card": Path(a.card).name if Path(a.card).exists() else a.card, "requests": a.requests,
                     "frames": a.frames, "size": f"{a.width}x{a.height}", "steps": a.steps_list,
                     "guidance": a.guidance, "cfg": a.guidance > 1.0, "output_format": a.output_format},
    }
    save = lambda: write(result)  # noqa: E731
    from serving_fleet import diffusers_column, matmul_peak
    result["matmul_peak"] = matmul_peak(a.device)
    result["flops"] = {"per_row": flops_per_row(a.card, a.frames, a.height, a.width)}
    save()
    if "diffusers" in a.parts:  # before the fleet: the GPU to itself
        if Path(a.card).is_dir():
            result["diffusers"] = {}
            for steps in a.steps_list:
                kw = request_kw(a.frames, a.width, a.height, steps, a.guidance)
                try:
                    result["diffusers"][str(steps)] = diffusers_column(a.card, a.device, a.diffusers_requests, kw,
                                                                       deadline)
                except Exception as e:  # noqa: BLE001 - recorded; the fleet parts still run
                    result["diffusers"][str(steps)] = {"error": f"{type(e).__name__}: {e}"[:2000]}
                save()
        else:
            result["diffusers_skipped"] = "the diffusers column needs --card to be a diffusers-format directory"
    run: dict = {}
    if set(a.parts) - {"diffusers"}:
        import tempfile
        log_dir = Path(a.log_dir or tempfile.mkdtemp(prefix="fv3-serving-"))
        trace_dir = None
        if not a.no_trace and a.mode != "inproc":
            if tracing_available():
                trace_dir = log_dir / "spans"
                trace_dir.mkdir(parents=True, exist_ok=True)
            else:
                result["tracing_unavailable"] = "OpenTelemetry SDK not importable: no spans, no breakdown"
        if a.mode in ("fleet", "auto"):
            result["run"] = run
            run = run_fleet(a, deadline, save, log_dir, trace_dir, run)
            if "error" in run and a.mode == "auto" and time.time() < deadline - 30:
                result["fleet_attempt"] = run
                run = {}
        if not run:
            run = run_inproc(a, deadline, lambda part: (result.update(run=part), save()))
            run["bursts"] = {str(a.steps_list[0]): {k: run[k] for k in ("step_batching", "request_at_a_time")
                                                    if k in run}}
        result["run"] = run
    result["summary"] = build_summary(result, GOALS)
    result["wall_s"] = round(time.time() - (deadline - a.time_limit), 1)
    save()
    print_summary(result)
    if "error" in run:
        print("ERROR:", run["error"][:1000])
    return 1 if "error" in run else 0


def print_summary(result: dict) -> None:
    s = result.get("summary", {})
    print(f"{'steps':>6}{'batch req/s':>13}{'alone req/s':>13}{'diffusers':>11}{'x alone':>9}{'x diff':>8}"
          f"{'util':>7}{'flop frac':>11}")
    for x in s.get("summaries", []):
        r = x["requests_per_s"]
        cells = [r.get("step_batching"), r.get("request_at_a_time"), r.get("diffusers"),
                 x.get("speedup_vs_request_at_a_time"), x.get("speedup_vs_diffusers"), x.get("denoiser_utilization"),
                 x.get("rows_per_s_fraction_of_flop_bound")]
        print(f"{x['steps']:>6}" + "".join(f"{(c if c is not None else float('nan')):>{w}.3f}"
                                            for c, w in zip(cells, (13, 13, 11, 9, 8, 7, 11))))
    for k in ("open_loop", "mixed", "goals"):
        if s.get(k):
            print(k, json.dumps(s[k], default=str)[:1500])


if __name__ == "__main__":
    raise SystemExit(main())
