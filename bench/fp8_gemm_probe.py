"""The FFN's hidden layer in FP8 (CUDA), at Wan's shapes: the fused GEMM of
fastvideo3/kernels/fp8_gemm.py (bias + tanh-GELU + e4m3 in its epilogue, per-token scales bounded
before the GEMM) at each of its tile configurations, against what it replaces: cuBLAS's row-wise
``torch._scaled_mm`` (bf16 out, no bias) then the bias + GELU + per-token quantizer.

    python bench/fp8_gemm_probe.py [--out FILE] [--tokens 32760]

For each model (1.3B: K 1,536 -> N 8,960; 14B: 5,120 -> 13,824) and accumulation (fast, fp32):
each way's time, and the relative error of the hidden layer and of the FFN's output (the second
GEMM on it) against an fp32 computation from the same e4m3 inputs. Inputs: LayerNorm'd rows with
a per-token gain, e4m3 per token; weights N(0, 1/K), e4m3 per channel; bias N(0, 0.05).
Times are CUDA-event milliseconds of 10 back-to-back calls divided by 10 (the median of 3 runs).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_kernels_probe import per_call_ms as _per_call_ms  # noqa: E402


def per_call_ms(fn) -> float:
    return _per_call_ms(fn, calls=10, runs=3)


SHAPES = {"1.3b": (1536, 8960), "14b": (5120, 13824)}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def case(model: str, tokens: int, accumulations=("fast", "fp32")) -> dict:
    from fastvideo3.kernels.fp8 import bias_gelu_quant, fp8_linear, quantize_rows, quantize_weight
    from fastvideo3.kernels.fp8_gemm import CONFIGS, ffn_in_gelu_fp8, weight_stats
    torch.manual_seed(0)
    k, n = SHAPES[model]
    dev = "cuda"
    x = torch.nn.functional.layer_norm(torch.randn(tokens, k, device=dev), (k,))
    x = (x * (1 + 0.5 * torch.rand(tokens, 1, device=dev))).bfloat16()
    w = torch.randn(n, k, device=dev) / math.sqrt(k)
    bias = (0.05 * torch.randn(n, device=dev)).bfloat16()
    w2 = torch.randn(k, n, device=dev) / math.sqrt(n)
    xq, xs = quantize_rows(x, impl="triton")
    wq, ws = quantize_weight(w)
    w2q, w2s = quantize_weight(w2)
    stats = weight_stats(wq, ws, bias)
    h_ref = torch.nn.functional.gelu((xq.float() * xs) @ (wq.float() * ws[:, None]).t() + bias.float(),
                                     approximate="tanh")
    y_ref = h_ref @ (w2q.float() * w2s[:, None]).t()
    flops = 2.0 * tokens * k * n
    row: dict = {"model": model, "tokens": tokens, "k": k, "n": n,
                 "bound_over_amax_median": None, "accumulation": {}}
    for accum in accumulations:
        fast = accum == "fast"
        res: dict = {}

        def unfused():
            y1 = fp8_linear(xq, xs, wq, ws, None, fast_accum=fast)
            return bias_gelu_quant(y1, bias, impl="triton")

        def add(name, fn):
            try:
                ms = per_call_ms(fn)
                q, s = fn()
                h = q.float() * s
                y = fp8_linear(q, s, w2q, w2s, None, fast_accum=fast)
                res[name] = {"ms": round(ms, 4), "gemm_tflops": round(flops / ms / 1e9, 1),
                             "hidden_rel_err": rel(h, h_ref), "ffn_out_rel_err": rel(y, y_ref)}
                if name == "fused" and row["bound_over_amax_median"] is None:
                    row["bound_over_amax_median"] = float((s[:, 0] / (h_ref.abs().amax(1) / 448)).median())
            except Exception as e:  # noqa: BLE001 - a config that fails to compile must not hide the rest
                res[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
            print(model, accum, name, res[name], flush=True)

        add("unfused", unfused)
        res["gemm_alone_ms"] = round(per_call_ms(lambda: fp8_linear(xq, xs, wq, ws, None, fast_accum=fast)), 4)
        yb = torch.randn(tokens, n, device=dev, dtype=torch.bfloat16)
        res["gelu_quant_alone_ms"] = round(per_call_ms(lambda: bias_gelu_quant(yb, bias, impl="triton")), 4)
        yb = None  # freed (the timing lambda above closes over it)
        for i, cfg in enumerate(CONFIGS):
            add("fused" if i == 0 else f"fused_cfg{i}",
                lambda cfg=cfg: ffn_in_gelu_fp8(xq, xs, wq, ws, bias, *stats, fast_accum=fast, impl="triton",
                                                config=cfg))
        res["configs"] = [list(c) for c in CONFIGS]
        row["accumulation"][accum] = res
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32760)
    ap.add_argument("--models", nargs="+", default=list(SHAPES))
    ap.add_argument("--accumulations", nargs="+", default=["fast", "fp32"], choices=["fast", "fp32"])
    ap.add_argument("--out", default="fp8_gemm_probe.json")
    ap.add_argument("--best-config-file", help="write the fastest fused config's index here (for the next run)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": "python bench/fp8_gemm_probe.py " + " ".join(argv or sys.argv[1:]), "cases": []}
    for m in a.models:
        result["cases"].append(case(m, a.tokens, a.accumulations))
        Path(a.out).write_text(json.dumps(result, indent=1))
    summary = []
    for row in result["cases"]:
        for accum, res in row["accumulation"].items():
            timed = {k: v for k, v in res.items() if isinstance(v, dict) and "ms" in v}
            best = min((k for k in timed if k.startswith("fused")), key=lambda k: timed[k]["ms"], default=None)
            summary.append({"model": row["model"], "accumulation": accum,
                            "unfused_ms": timed.get("unfused", {}).get("ms"),
                            "fused_ms": timed[best]["ms"] if best else None, "fused_config": best,
                            "fused_ffn_out_rel_err": timed[best]["ffn_out_rel_err"] if best else None,
                            "unfused_ffn_out_rel_err": timed.get("unfused", {}).get("ffn_out_rel_err")})
    result["summary"] = summary
    if a.best_config_file and summary and summary[0]["fused_config"]:
        name = summary[0]["fused_config"]
        Path(a.best_config_file).write_text("0" if name == "fused" else name.removeprefix("fused_cfg"))
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
