"""What the default caching policy saves on the trained tiny card, and what it costs in quality.

    python bench/cache_quality.py                  # CPU; writes bench/results/cache_quality_cpu.json
    python bench/cache_quality.py --device cuda --out bench/results/cache_quality_cuda.json

For every prompt of the quality set (:func:`fastvideo3.training.data.eval_prompts`, as
bench/quality.py) and seed, the card generates the clip uncached and with the policy, at the
card's defaults (50 steps, guidance, 33x128x128). Reported: the fraction of DiT block
evaluations the policy skipped (counted by the denoiser per row) and the PSNR of its decoded
frames against the uncached frames (pixel range [0, 1]). Prompts run in groups, the uncached
and cached requests of a group batched together; the JSON is rewritten after every group, so an
interrupted run keeps what finished (``complete`` says whether every prompt ran).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from fastvideo3.card import get_card  # noqa: E402
from fastvideo3.engine import Engine  # noqa: E402
from fastvideo3.training.data import eval_prompts  # noqa: E402

DEFAULT_POLICY = {"policy": "dbcache"}  # the card's tuned parameters fill the rest


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10.0 * math.log10(1.0 / mse)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--card", default="wan-tiny")
    ap.add_argument("--device", default=None)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--group", type=int, default=4, help="prompts per batch")
    ap.add_argument("--limit", type=int, default=0, help="first N prompts only (0 = all)")
    ap.add_argument("--policy", default=json.dumps(DEFAULT_POLICY), help="cache settings as JSON")
    ap.add_argument("--out", default="bench/results/cache_quality_cpu.json")
    args = ap.parse_args(argv)
    card = get_card(args.card)
    policy = json.loads(args.policy)
    seeds = [int(s) for s in args.seeds.split(",")]
    prompts = eval_prompts()[: args.limit or None]
    jobs = [(p, s) for p in prompts for s in seeds]
    rows, t0 = [], time.perf_counter()
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with Engine(card, device=args.device) as engine:
        settings = engine.resolve("x", cache=policy).cache
        for i in range(0, len(jobs), max(1, args.group)):
            group = jobs[i:i + args.group]
            runs = [(engine.submit(p, seed=s), engine.submit(p, seed=s, cache=policy)) for p, s in group]
            engine.run()
            for (p, s), (ref_run, cached_run) in zip(group, runs):
                ref, cached = engine.result(ref_run), engine.result(cached_run)
                c = cached.metadata["cache"]
                rows.append({"prompt": p, "seed": s, "psnr_db": round(psnr(cached.frames, ref.frames), 2),
                             "block_savings": round(c["block_savings"], 4), "blocks_computed": c["blocks_computed"],
                             "blocks_total": c["blocks_total"],
                             "reused_steps": sum(len(v) for v in c["reused_steps"].values())})
            computed = sum(r["blocks_computed"] for r in rows)
            total = sum(r["blocks_total"] for r in rows)
            summary = {"policy": settings, "clips": len(rows), "complete": len(rows) == len(jobs),
                       "block_savings": round(1 - computed / total, 4),
                       "psnr_db_min": min(r["psnr_db"] for r in rows),
                       "psnr_db_mean": round(sum(r["psnr_db"] for r in rows) / len(rows), 2)}
            out = {"summary": summary, "card": args.card, "steps": engine.resolve("x").num_inference_steps,
                   "command": "python bench/cache_quality.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                   "seconds": round(time.perf_counter() - t0, 1), "device": engine.denoiser.device, "clips": rows}
            out_path.write_text(json.dumps(out, indent=2) + "\n")
            print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
