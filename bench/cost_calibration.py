"""Calibrate the cost model on the tiny model: run N requests (two shapes, one after another)
through the embedded engine with pricing on, record every unit's measured time (CPU seconds of
the process, one torch thread: robust to other load on the machine), replay them through a fresh
cost model in arrival order and report the prediction error before and after calibration.

    python bench/cost_calibration.py [--requests 20] [--record tests/data/tiny_step_timings.json]

Writes bench/results/cost_calibration_cpu.json; --record also writes the raw timings that
tests/unit/test_scheduler_admission.py replays.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--record", default=None)
    ap.add_argument("--out", default="bench/results/cost_calibration_cpu.json")
    a = ap.parse_args()
    import torch
    # One thread, and the process's CPU time per call: on a shared 2-core machine wall time
    # mostly measures the neighbours; CPU seconds are this device's "GPU-seconds".
    torch.set_num_threads(1)
    from fastvideo3.runtime.economy.cost import CalibratedCostModel
    from fastvideo3.engine import Engine
    from fastvideo3.runtime.economy.pricing import Pricer

    engine = Engine("wan-tiny")
    pricer = Pricer(CalibratedCostModel())
    engine.scheduler.pricer = pricer
    units: list[dict] = []
    shapes = [dict(num_frames=65, height=256, width=256), dict(num_frames=33, height=256, width=192)]
    for role in ("encoder", "denoiser", "decoder"):
        ex = getattr(engine, role)
        orig = ex.execute

        def wrapped(batch, orig=orig):
            t0 = time.process_time()
            res = orig(batch)
            dt = time.process_time() - t0
            for u in batch:
                run = engine.scheduler.runs[u.request_id]
                r = run.request
                units.append({"kind": u.kind, "shape_sig": u.shape_sig, "seconds": dt / len(batch),
                              "prompts": len(u.params.get("prompts", {})) or 1,
                              "predicted": u.resources.gpu_seconds,
                              "request": {"prompt": r.prompt, "num_frames": r.num_frames, "height": r.height,
                                          "width": r.width, "num_inference_steps": r.num_inference_steps}})
            return res

        ex.execute = wrapped
    t0 = time.perf_counter()
    for i in range(a.requests):
        engine.generate(f"a shape number {i}", seed=i, num_inference_steps=6, **shapes[i % 2])
    wall = time.perf_counter() - t0
    steps = [u for u in units if u["kind"] == "diffusion_step"]
    half = steps[len(steps) // 2:]
    from fastvideo3.card import get_card
    from fastvideo3.request.schema import GenerateRequest, resolve
    card = get_card("wan-tiny")
    replay = Pricer(CalibratedCostModel())
    errs, prior_errs = [], []
    for i, u in enumerate(units):
        req = resolve(GenerateRequest(**u["request"]), card)
        pred = replay.predict(u["kind"], u["shape_sig"], card, req, prompts=u["prompts"])
        if i >= len(units) // 2 and u["kind"] == "diffusion_step":
            errs.append(abs(pred.gpu_seconds - u["seconds"]) / u["seconds"])
            prior_errs.append(abs(pred.prior_seconds - u["seconds"]) / u["seconds"])
        replay.cost_model.observe(u["kind"], u["shape_sig"], u["seconds"], pred)

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if xs else None

    first = [abs(u["predicted"] - u["seconds"]) / u["seconds"] for u in steps[:6]]
    late = [abs(u["predicted"] - u["seconds"]) / u["seconds"] for u in half]
    res = {
        "requests": a.requests, "units": len(units), "wall_seconds": round(wall, 2),
        "step_median_abs_rel_error_first_6_steps_live": med(first),
        "step_median_abs_rel_error_second_half_live_wall": med(late),
        "replay_step_median_abs_rel_error_second_half_calibrated": med(errs),
        "replay_step_median_abs_rel_error_second_half_prior": med(prior_errs),
        "cost_model_error_stats": pricer.cost_model.error_stats(),
        "calibration_factor_denoiser": pricer.cost_model.factor("denoiser", "diffusion_step"),
        "command": "python " + " ".join(sys.argv),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
    }
    print(json.dumps(res, indent=2))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    if a.record:
        Path(a.record).write_text(json.dumps({"requests": a.requests, "units": units}, indent=1) + "\n")
    engine.close()


if __name__ == "__main__":
    main()
