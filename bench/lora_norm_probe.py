"""Where the fused LoRA norm pass spends its time (CUDA): ``lora_add_norm_next`` per tile config
and per feature, against the plain ``add_norm`` and against the unfused kernels it replaces.

    python bench/lora_norm_probe.py [--rows 8 --tokens 1280 --dim 1536 --rank 32] [--out FILE]

Cases, on the shapes of the LoRA benchmark's short clip (bench/lora.py, 8 rows, 4 adapters):

* ``add_norm``: the residual update and LayerNorm without LoRA (the floor a fused pass builds on);
* ``wide``: the expand of the layer before and the widened input of the next GEMM (after the
  self-attention output: gated; after the cross-attention output: no gate);
* ``group_split``: after the FFN's second layer: a split-K shrink's partial sums in, the next
  block's fused-QKV shrink (96 columns) out;
* ``*_no_next``: the same without the next shrink; ``*_no_adapter``: every row without an adapter
  (the pass's structure alone);
* ``unfused_*``: the separate kernels (expand, add_norm, then the next layer's widen/shrink).

Each fused case is timed at every candidate tile config (``NORM_CONFIGS``) and at the one the
autotuner picks; the JSON's ``summary`` names the best per case.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _bench(fn, reps: int = 50) -> float:
    import triton
    return float(triton.testing.do_bench(fn, warmup=10, rep=reps))  # ms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1280)
    ap.add_argument("--dim", type=int, default=1536)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--out", default="lora_norm_probe.json")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    from fastvideo3.kernels import lora_grouped as lg
    from fastvideo3.kernels import lora_norm as ln
    from fastvideo3.kernels import lora_shrink as ls
    from fastvideo3.kernels.fused import add_norm

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    bsz, n, d, r, slots_n = a.rows, a.tokens, a.dim, a.rank, 4
    x0 = torch.randn(bsz, n, d, device=dev, dtype=dt)
    x = x0.clone()
    y = torch.randn(bsz, n, d, device=dev, dtype=dt)
    gate = torch.randn(bsz, d, device=dev) * 0.1
    sa, sb = torch.randn(bsz, d, device=dev) * 0.1, torch.randn(bsz, d, device=dev) * 0.1
    up = torch.randn(slots_n, d, r, device=dev, dtype=dt) * 0.02
    down_w = torch.randn(slots_n, r, d, device=dev, dtype=dt) * 0.02  # a widened next layer's
    down_g = torch.randn(slots_n, 3 * r, d, device=dev, dtype=dt) * 0.02  # a fused QKV's
    slots = torch.tensor([i // max(1, bsz // slots_n) % slots_n for i in range(bsz)], device=dev, dtype=torch.int32)
    none = torch.full_like(slots, -1)
    scales = torch.full((bsz,), 0.7, device=dev)
    xa = torch.randn(bsz, n, r, device=dev, dtype=dt)
    parts = torch.randn(4, bsz, n, r, device=dev)
    x_in = torch.randn(bsz, n, d, device=dev, dtype=dt)
    bytes_moved = 4 * bsz * n * d * x.element_size()  # read x, y; write x, h
    out: dict = {"what": "lora_add_norm_next per tile config and feature vs add_norm and the unfused kernels",
                 "command": "python bench/lora_norm_probe.py " + " ".join(
                     Path(x).name if x.startswith("/") else x for x in (argv or sys.argv[1:])),
                 "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "shape": {"rows": bsz, "tokens": n, "dim": d, "rank": r, "slots": slots_n},
                 "roofline_ms_at_4tbs": round(bytes_moved / 4e12 * 1e3, 4), "cases": {}}

    def fused(sl, gate_, nd, wide, src):
        return lambda: ln.lora_add_norm_next(scales=scales, up=up, slots=sl, x=x, y=y, gate=gate_, a=sa, b=sb,
                                             modulate=True, eps=1e-6, next_down=nd, wide=wide, impl="triton", **src)

    cases = {
        "wide_gate": fused(slots, gate, down_w, slots_n, {"xa": xa}),
        "wide_no_gate": fused(slots, None, down_w, slots_n, {"xa": xa}),
        "group_split": fused(slots, gate, down_g, 0, {"xa": None, "xa_parts": parts}),
        "group_split_no_next": fused(slots, gate, None, 0, {"xa": None, "xa_parts": parts}),
        "wide_gate_no_next": fused(slots, gate, None, 0, {"xa": xa}),
        "group_split_no_adapter": fused(none, gate, down_g, 0, {"xa": None, "xa_parts": parts}),
    }
    real_launch = ls.launch
    pinned: dict = {}

    def launch(name, kernel, configs, key, grid, args, flags, default, restore=(), cuda=True):
        if name == "add_norm_next" and pinned:
            meta, warps = pinned["cfg"]
            kernel[grid(meta)](*args, **flags, **meta, num_warps=warps)
            return
        real_launch(name, kernel, configs, key, grid, args, flags, default, restore=restore, cuda=cuda)

    ls.launch = launch
    t_start = time.perf_counter()
    out["cases"]["add_norm"] = {"ms": round(_bench(lambda: add_norm(x, y, gate, sa, sb, modulate=True, eps=1e-6,
                                                                      impl="triton")), 4)}
    for name, fn in cases.items():
        res: dict = {"configs": {}}
        pinned.clear()
        fn()  # the autotuner's pick
        x.copy_(x0)
        res["autotuned_ms"] = round(_bench(fn), 4)
        for meta, warps in ln.NORM_CONFIGS:
            pinned["cfg"] = (meta, warps)
            label = f"BM{meta['BM']}_BO{meta['BO']}_BO2{meta['BO2']}_w{warps}"
            try:
                x.copy_(x0)
                res["configs"][label] = round(_bench(fn), 4)
            except Exception as e:  # noqa: BLE001 - a config that does not compile is reported
                res["configs"][label] = f"{type(e).__name__}: {e}"[:200]
        pinned.clear()
        ok = {k: v for k, v in res["configs"].items() if isinstance(v, float)}
        res["best"] = min(ok, key=ok.get) if ok else None
        res["best_ms"] = ok[res["best"]] if ok else None
        out["cases"][name] = res
        print(name, res["autotuned_ms"], res["best"], res["best_ms"], flush=True)
    ls.launch = real_launch
    # the unfused kernels the pass replaces (the "no_fused_norm" path of bench/lora.py)
    out["cases"]["unfused_expand"] = {"ms": round(_bench(lambda: lg.lora_expand_(xa, y, up, slots)), 4)}
    out["cases"]["unfused_widen_next"] = {"ms": round(_bench(lambda: lg.lora_widen(
        x_in, down_w, slots, scales, slots_n, impl="triton")), 4)}
    out["cases"]["unfused_group_shrink_next"] = {"ms": round(_bench(lambda: ls.lora_shrink_split(
        x_in, down_g, slots, scales, groups=3)), 4)}
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    fused_ms = {k: v.get("autotuned_ms", v.get("ms")) for k, v in out["cases"].items()}
    out["summary"] = {"add_norm_ms": fused_ms["add_norm"], "case_ms": fused_ms,
                      "best_config": {k: v.get("best") for k, v in out["cases"].items() if "best" in v}}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
