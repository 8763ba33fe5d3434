"""What batch-invariant mode costs: the embedded engine with and without it, one request alone and
N concurrent requests, wall time of the whole run (median of ``--repeats``, after a warm-up run).

Alone, every denoise forward of the mode is padded to ``--max-batch`` requests' rows (the bucket),
so the padding is the overhead; with a full batch there is no padding and the cost is the same.

    python bench/batch_invariant.py [--card wan-tiny] [--max-batch 4] [--frames 9 --size 32x32]
                                    [--steps 8] [--repeats 3] [--out FILE]

Prints a table and writes JSON (with the command line) to bench/results/batch_invariant_cpu.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run_case(engine, n: int, kw: dict) -> float:
    t0 = time.perf_counter()
    runs = [engine.submit(f"request {i}", seed=i, **kw) for i in range(n)]
    engine.run()
    for r in runs:
        engine.result(r)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--card", default="wan-tiny")
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--frames", type=int, default=9)
    p.add_argument("--size", default="32x32")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(REPO / "bench/results/batch_invariant_cpu.json"))
    a = p.parse_args(argv)
    import torch

    import fastvideo3
    w, h = (int(v) for v in a.size.split("x"))
    kw = dict(num_frames=a.frames, height=h, width=w, num_inference_steps=a.steps)
    rows = []
    for n in (1, a.max_batch):
        for invariant in (False, True):
            with fastvideo3.Engine(a.card, device="cpu", max_batch=a.max_batch, batch_invariant=invariant) as engine:
                run_case(engine, n, kw)  # warm-up
                times = [run_case(engine, n, kw) for _ in range(a.repeats)]
                c = engine.denoiser.counters
                rows.append({"requests": n, "batch_invariant": invariant, "wall_s": round(statistics.median(times), 4),
                             "padding_fraction": round(c["padding_rows"] / max(1, c["rows"] + c["padding_rows"]), 3)})
    for n in (1, a.max_batch):
        off, on = (next(r for r in rows if r["requests"] == n and r["batch_invariant"] is m) for m in (False, True))
        on["overhead_vs_off"] = round(on["wall_s"] / off["wall_s"], 3)
    print(f"{'requests':>8} {'invariant':>9} {'wall_s':>8} {'padding':>8} {'x off':>6}")
    for r in rows:
        print(f"{r['requests']:>8} {str(r['batch_invariant']):>9} {r['wall_s']:>8.3f} {r['padding_fraction']:>8.3f} "
              f"{r.get('overhead_vs_off', ''):>6}")
    out = {"command": "python bench/" + Path(__file__).name + " " + " ".join(argv or sys.argv[1:]),
           "card": a.card, "max_batch": a.max_batch, "shape": kw, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "machine": platform.machine(), "rows": rows,
           "summary": {f"overhead_{n}_requests": next(r["overhead_vs_off"] for r in rows
                                                      if r["requests"] == n and r["batch_invariant"])
                       for n in (1, a.max_batch)}}
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
