"""Peak memory of loading a real-size Wan2.1 DiT checkpoint (random weights written by diffusers'
own layout). The loader must read the checkpoint once and never copy it through Python lists:
goal peak RSS <= 1.5x the weights' size.

    python bench/load_rss.py --preset 1.3b [--dir DIR] [--out bench/results/load_rss_1.3b.json]

The directory is built with fastvideo3.testing.synthetic_wan when --dir does not exist yet. The
load runs in a fresh child process so its peak RSS is its own.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _hwm_bytes() -> int:
    """Peak RSS of this process image (VmHWM is per address space, so a parent's peak does not
    leak into it the way ru_maxrss can across fork+exec)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(root: str, preset: str) -> None:
    import torch
    from fastvideo3.card import bind_checkpoint, get_card
    from fastvideo3.models.wan.components import load_dit
    base = _hwm_bytes()
    card = bind_checkpoint(get_card({"1.3b": "wan2.1-t2v-1.3b", "14b": "wan2.1-t2v-14b"}[preset]), root)
    t0 = time.perf_counter()
    model, digest = load_dit(card, "cpu", torch.bfloat16)
    dt = time.perf_counter() - t0
    peak = _hwm_bytes()
    # the weights are memory-mapped and fault in lazily; touch every byte once so the figure
    # also covers a model that has run (what serving sees)
    with torch.no_grad():
        for p in model.parameters():
            p.float().sum()
    touched = _hwm_bytes()
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"baseline_rss_bytes": base, "peak_rss_bytes": peak,
                      "peak_rss_after_touch_bytes": touched, "load_seconds": dt, "parameters": n, "digest": digest}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="1.3b", choices=("1.3b", "14b"))
    ap.add_argument("--dir", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.preset)
        return
    root = Path(a.dir or tempfile.mkdtemp(prefix="wan-rss-")) / f"wan-{a.preset}"
    if not (root / "model_index.json").exists():
        from fastvideo3.testing.synthetic_wan import build_wan_dir
        t0 = time.perf_counter()
        build_wan_dir(root, preset=a.preset, seed=0, transformer_only=True)
        print(f"wrote {root} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    weights = sum(p.stat().st_size for p in (root / "transformer").glob("*.safetensors"))
    r = subprocess.run([sys.executable, __file__, "--preset", a.preset, "--child", str(root)],
                       capture_output=True, text=True, check=True)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res.update({
        "preset": a.preset, "weights_bytes": weights,
        "peak_over_weights": res["peak_rss_bytes"] / weights,
        "load_growth_over_weights": (res["peak_rss_bytes"] - res["baseline_rss_bytes"]) / weights,
        "peak_after_touch_over_weights": res["peak_rss_after_touch_bytes"] / weights,
        "goal": "peak_rss <= 1.5 x weights",
        "command": "python " + " ".join(sys.argv),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
    })
    print(json.dumps(res, indent=2))
    out = Path(a.out or f"bench/results/load_rss_{a.preset}_cpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
