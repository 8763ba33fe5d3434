"""Parallel denoiser forwards: every plan that fits the GPUs present against degree 1, or the
plan code's own overhead at degree 1 on one GPU.

    python bench/parallel.py --out bench/results/parallel_<gpus>xh200.json          # all GPUs present
    python bench/parallel.py --overhead --out bench/results/parallel_overhead_h200.json   # one GPU

Scaling mode: for each degree k in 1, 2, 4, 8 up to the GPUs present, k processes (one per GPU,
NCCL) build the same random bf16 Wan2.1 DiT (same seed on every rank) and time one CFG-batched
forward (2 rows) of each job -- 1.3B and 14B at 81x480x832, 14B at 81x720x1280 -- under each
plan of degree k (:data:`PLANS`): the inputs are sharded as a parallel replica holds them
(token layout, :mod:`fastvideo3.parallel.dit`), the output is gathered on rank 0 and compared
with the degree-1 output of the same job. Rows: ms per forward (median over ``--iters`` after a
warm-up), speedup = degree-1 ms / ms, efficiency = speedup / GPUs, relative error. Each degree
runs under its share of ``--time-limit``; the JSON is rewritten after every degree, so what
finished is kept.

Overhead mode: one process, 1.3B at 81x480x832, the plain reference forward
(``WanDiT.forward`` on the latent) against the plan code at degree 1 (``ShardedDiT`` on the
token layout, no communication), interleaved, medians compared; the goal is < 1%. The fused
one-device fast path (``FastWanDiT``, which a parallel replica does not use) is timed after, for
context.

``--preset tiny --device cpu`` runs either mode on a CPU with gloo (a smoke test of the script).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    import fastvideo3  # noqa: F401
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

PLANS = {1: ["single"], 2: ["ulysses2", "ring2", "cfg2"],
         4: ["ulysses4", "ring4", "ulysses2xring2", "cfg2xulysses2"],
         8: ["ulysses8", "ulysses4xring2", "cfg2xulysses4", "cfg2xulysses2xring2"]}
JOBS = {"full": [("1.3b", 81, 480, 832), ("14b", 81, 480, 832), ("14b", 81, 720, 1280)],
        "tiny": [("tiny", 9, 64, 64), ("tiny", 5, 96, 64)]}
TEXT_LEN = 512
ROWS = 2  # one CFG-batched step: cond + uncond


def _config(model: str) -> dict:
    if model == "tiny":
        from fastvideo3.models.wan.cards import TINY_DIT
        return dict(TINY_DIT)
    from fastvideo3.testing.synthetic_wan import WAN_1_3B_TRANSFORMER, WAN_14B_TRANSFORMER
    return dict({"1.3b": WAN_1_3B_TRANSFORMER, "14b": WAN_14B_TRANSFORMER}[model])


@torch.no_grad()
def build_dit(model: str, device: str, dtype: torch.dtype, seed: int = 0):
    """Our WanDiT with random weights drawn on ``device`` (the same on every rank for one seed)."""
    from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig, rope_tables
    cfg = WanDiTConfig.from_dict(_config(model))
    with torch.device("meta"):
        dit = WanDiT(cfg)
    dit.to_empty(device=device)
    torch.manual_seed(seed)
    for module in dit.modules():
        own = dict(module.named_parameters(recurse=False))
        if not own:
            continue
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
        elif "scale_shift_table" in own:  # randn / sqrt(dim), as the reference initializes it
            own["scale_shift_table"].normal_().div_(cfg.inner_dim ** 0.5)
        else:  # the affine cross-attention norm
            own["weight"].fill_(1.0)
            own["bias"].zero_()
    cos, sin = rope_tables(cfg.attention_head_dim, cfg.rope_max_seq_len)
    dit.rope_cos, dit.rope_sin = cos.to(device), sin.to(device)
    dit.to(dtype)
    dit.rope_cos, dit.rope_sin = cos.to(device), sin.to(device)  # RoPE tables stay fp32
    return dit.eval().requires_grad_(False)


def make_inputs(cfg, frames: int, height: int, width: int, device: str, dtype, text_len: int):
    g = torch.Generator(device="cpu").manual_seed(1)
    lat = torch.randn(ROWS, cfg.in_channels, 1 + (frames - 1) // 4, height // 8, width // 8, generator=g)
    t = torch.tensor([700.0, 700.0])
    text = torch.randn(ROWS, text_len, cfg.text_dim, generator=g)
    return lat.to(device, dtype), t.to(device), text.to(device, dtype)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time(fn, device: str, warmup: int, iters: int, barrier=None) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        if barrier:
            barrier()
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


# ----------------------------------------------------------------------------- scaling mode
def _rank(rank: int, world: int, port: int, args: dict, out_dir: str) -> None:
    import torch.distributed as dist

    from fastvideo3.parallel.dit import ShardedDiT, gather_latent, grid_of, shard_latent
    from fastvideo3.parallel.mesh import build_mesh
    from fastvideo3.parallel.plan import ParallelPlan
    device = f"cuda:{rank}" if args["device"] == "cuda" else "cpu"
    if device.startswith("cuda"):
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dtype = torch.bfloat16 if args["device"] == "cuda" else torch.float32
    deadline = args["deadline"]
    built: dict = {}
    for model, frames, height, width in JOBS[args["jobs"]]:
        if model not in built:
            built.clear()
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            built[model] = build_dit(model, device, dtype)
        dit = built[model]
        x, t, text = make_inputs(dit.cfg, frames, height, width, device, dtype, args["text_len"])
        patch = tuple(dit.cfg.patch_size)
        ref_path = Path(out_dir) / f"ref_{model}_{frames}x{height}x{width}.pt"
        for spec in PLANS[world]:
            go = torch.tensor([1.0 if time.time() < deadline else 0.0], device=device)
            dist.all_reduce(go, op=dist.ReduceOp.MIN)  # every rank skips together
            if float(go) == 0.0:
                break
            row = {"model": model, "frames": frames, "height": height, "width": width, "plan": spec, "gpus": world}
            try:
                mesh = build_mesh(ParallelPlan.parse(spec), rank, world, device)
                sharded = ShardedDiT(dit, mesh)
                local, grid = shard_latent(x, mesh, patch), grid_of(x.shape[1:], patch)
                if world == 1:
                    run = lambda: dit(x, t, text)  # noqa: E731 - degree 1: the plain path
                else:
                    run = lambda: sharded(local, t, text, grid)  # noqa: E731
                times = _time(run, device, args["warmup"], args["iters"], barrier=dist.barrier)
                out = dit(x, t, text) if world == 1 else gather_latent(run(), mesh, x.shape[1:], patch)
                row.update({"ms": statistics.median(times), "times_ms": [round(v, 2) for v in times]})
                if rank == 0:
                    if world == 1:
                        torch.save(out.cpu(), ref_path)
                        row["error_vs_degree1"] = 0.0
                    elif ref_path.exists():
                        row["error_vs_degree1"] = _rel(out.cpu(), torch.load(ref_path))
                if device.startswith("cuda"):
                    row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                    torch.cuda.reset_peak_memory_stats()
            except Exception as e:  # noqa: BLE001 - recorded, the next plan still runs
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            if rank == 0:
                with open(Path(out_dir) / "rows.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps({k: v for k, v in row.items() if k != "times_ms"}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_degree(world: int, args: dict, out_dir: str, limit_s: float) -> str:
    import torch.multiprocessing as mp
    args = {**args, "deadline": time.time() + limit_s}
    ctx = mp.start_processes(_rank, args=(world, _free_port(), args, out_dir), nprocs=world, join=False,
                             start_method="spawn")
    end = time.monotonic() + limit_s + 60
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > end:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                return "timed out"
    except Exception as e:  # noqa: BLE001 - a rank died: keep the rows written so far
        return f"failed: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__}"
    return "ok"


def summarize(rows: list[dict]) -> list[dict]:
    base = {(r["model"], r["frames"], r["height"], r["width"]): r["ms"] for r in rows if r["gpus"] == 1 and "ms" in r}
    out = []
    for r in rows:
        if "ms" not in r:
            continue
        b = base.get((r["model"], r["frames"], r["height"], r["width"]))
        speedup = b / r["ms"] if b else None
        out.append({"model": r["model"], "frames": r["frames"], "height": r["height"], "width": r["width"],
                    "plan": r["plan"], "gpus": r["gpus"], "ms": round(r["ms"], 2),
                    "speedup": round(speedup, 3) if speedup else None,
                    "efficiency": round(speedup / r["gpus"], 3) if speedup else None,
                    "error_vs_degree1": r.get("error_vs_degree1")})
    return out


def scaling(a) -> dict:
    gpus = torch.cuda.device_count() if a.device == "cuda" else a.cpu_ranks
    degrees = [k for k in sorted(PLANS) if k <= gpus]
    args = {"device": a.device, "jobs": "tiny" if a.preset == "tiny" else "full", "warmup": a.warmup,
            "iters": a.iters, "text_len": 64 if a.preset == "tiny" else TEXT_LEN}
    result = {"benchmark": "parallel denoiser forward (bf16, CFG-batched: 2 rows)", "gpus_present": gpus,
              "device": torch.cuda.get_device_name(0) if a.device == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "plans": {k: PLANS[k] for k in degrees}, "status": {}, "summary": [],
              "rows": []}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fv3-parallel-") as tmp:
        for i, k in enumerate(degrees):
            left = a.time_limit - (time.monotonic() - start)
            if left < 30:
                result["status"][str(k)] = "skipped: out of time"
                continue
            share = left / (len(degrees) - i)
            result["status"][str(k)] = run_degree(k, args, tmp, share)
            rows_file = Path(tmp) / "rows.jsonl"
            result["rows"] = [json.loads(x) for x in rows_file.read_text().splitlines()] if rows_file.exists() else []
            result["summary"] = summarize(result["rows"])
            _write(a.out, result)
    return result


# ---------------------------------------------------------------------------- overhead mode
@torch.no_grad()
def overhead(a) -> dict:
    from fastvideo3.parallel.dit import ShardedDiT, from_tokens, grid_of, to_tokens
    from fastvideo3.parallel.mesh import single_mesh
    device = "cuda:0" if a.device == "cuda" else "cpu"
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    model, frames, height, width = ("tiny", 9, 64, 64) if a.preset == "tiny" else ("1.3b", 81, 480, 832)
    dit = build_dit(model, device, dtype)
    x, t, text = make_inputs(dit.cfg, frames, height, width, device, dtype, 64 if a.preset == "tiny" else TEXT_LEN)
    patch = tuple(dit.cfg.patch_size)
    sharded = ShardedDiT(dit, single_mesh())
    tokens, grid = to_tokens(x, patch).contiguous(), grid_of(x.shape[1:], patch)
    plain = lambda: dit(x, t, text)  # noqa: E731
    plan = lambda: sharded(tokens, t, text, grid)  # noqa: E731
    err = _rel(from_tokens(plan(), x.shape[1:], patch), plain())
    for fn in (plain, plan):  # warm-up
        _time(fn, device, a.warmup, 0)
    tp, tq = [], []
    for _ in range(a.iters):  # interleaved: drift hits both paths alike
        tp += _time(plain, device, 0, 1)
        tq += _time(plan, device, 0, 1)
    mp, mq = statistics.median(tp), statistics.median(tq)
    pct = 100.0 * (mq - mp) / mp
    fast = {}
    if device.startswith("cuda"):  # context: the fused one-device path a replica of degree 1 serves with
        try:
            from fastvideo3.models.wan.fast import FastWanDiT
            fwd = FastWanDiT(dit)
            fast = {"fast_path_ms": round(statistics.median(_time(lambda: fwd(x, t, text), device, 1, 5)), 2)}
        except Exception as e:  # noqa: BLE001 - optional figure
            fast = {"fast_path_error": f"{type(e).__name__}: {e}"[:300]}
    summary = [{"model": model, "frames": frames, "height": height, "width": width, "plan": p, "gpus": 1,
                "ms": round(ms, 2), "speedup": round(mp / ms, 4), "efficiency": round(mp / ms, 4)}
               for p, ms in (("none (plain WanDiT.forward)", mp), ("single (plan code, degree 1)", mq))]
    return {"benchmark": "plan code at degree 1 vs the plain path (bf16, CFG-batched: 2 rows)",
            "device": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu", "torch": torch.__version__,
            "overhead_pct": round(pct, 3), "goal_pct": 1.0, "meets_goal": pct < 1.0, "error_vs_plain": err, **fast,
            "plain_times_ms": [round(v, 2) for v in tp], "plan_times_ms": [round(v, 2) for v in tq],
            "summary": summary}


def _write(path: str | None, result: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="JSON path (default bench/results/parallel_<gpus>xh200.json)")
    p.add_argument("--overhead", action="store_true", help="degree-1 overhead of the plan code on one device")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--preset", default="full", choices=["full", "tiny"])
    p.add_argument("--cpu-ranks", type=int, default=2, help="ranks for --device cpu (gloo)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--time-limit", type=float, default=420.0, help="seconds for the whole scaling run")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --preset tiny for a smoke run", file=sys.stderr)
        return 2
    if a.iters < 1 or a.warmup < 0:
        print("--iters must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    if a.overhead:
        result = overhead(a)
        _write(a.out, result)
        print(json.dumps({k: v for k, v in result.items() if not k.endswith("times_ms")}, indent=1))
        return 0
    gpus = torch.cuda.device_count() if a.device == "cuda" else a.cpu_ranks
    a.out = a.out or f"bench/results/parallel_{gpus}xh200.json"
    result = scaling(a)
    print(json.dumps(result["summary"], indent=1))
    return 0 if result["summary"] else 1


if __name__ == "__main__":
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    sys.exit(main())
