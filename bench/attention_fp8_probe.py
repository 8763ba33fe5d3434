"""FP8 self-attention kernels side by side at the Wan shapes (CUDA): FlashAttention-3's FP8 forward
(what the FP8 fast path runs today), cuDNN's FP8 SDPA forward through cudnn-frontend (every plan
its heuristics offer), and both in bf16, on the same inputs.

    python bench/attention_fp8_probe.py [--out FILE] [--tokens 32760] [--heads 12 40]

Inputs are [1, L, H, 128] like the fast path's: Q and K RMS-normed (unit RMS per token, a gain
per head between 0.5 and 2 so per-tensor scales are tested against per-head ones), V Gaussian.
Each kernel's output is compared on its first 2,048 query rows with an fp32 reference.

* FA3 FP8: per-(sample, head) descales of Q, K, V, bf16 out.
* cuDNN FP8 (Hopper): per-tensor descales of Q, K, V; P quantized with a scale of 448 (P <= 1);
  O written as e4m3 with a per-tensor scale from V's amax (|O| <= max |V|, a convex combination
  of V's rows), which is what the next GEMM reads anyway. Its error counts that output rounding.

Times are CUDA-event milliseconds of 10 back-to-back calls divided by 10 (the median of 3 runs);
TFLOP/s counts 4 * L^2 * 128 * H.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_kernels_probe import per_call_ms  # noqa: E402


E4M3_MAX = 448.0
REF_ROWS = 2048


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o = out[:, :REF_ROWS].float()
    return float((o - ref).norm() / ref.norm())


def reference(q, k, v) -> torch.Tensor:
    """fp32 attention of the first REF_ROWS queries: [1, REF_ROWS, H, D]."""
    d = q.shape[-1]
    qh = q[0, :REF_ROWS].float().transpose(0, 1)  # [H, R, D]
    out = []
    for h in range(q.shape[2]):
        s = (qh[h] @ k[0, :, h].float().T) / math.sqrt(d)
        out.append(torch.softmax(s, dim=-1) @ v[0, :, h].float())
    return torch.stack(out, dim=1)[None]


def cudnn_fp8(q8, k8, v8, info: dict):
    """A cuDNN FP8 SDPA graph over BSHD e4m3 tensors; returns (run(plan, tensors) -> out, plans)."""
    import cudnn
    info["cudnn_backend"] = cudnn.backend_version_string() if hasattr(cudnn, "backend_version_string") \
        else str(cudnn.backend_version())
    info["cudnn_frontend"] = getattr(cudnn, "__version__", None)
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    b, n, h, d = q8.shape
    dims = [b, h, n, d]

    def t(x, name):
        s = x.stride()
        return g.tensor(name=name, dim=dims, stride=[s[0], s[2], s[1], s[3]], data_type=e4m3)

    tq, tk, tv = t(q8, "q"), t(k8, "k"), t(v8, "v")
    scal = [g.tensor(name=nm, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
            for nm in ("dq", "dk", "dv", "ds", "ss", "so")]
    o, _, amax_s, amax_o = g.sdpa_fp8(q=tq, k=tk, v=tv, descale_q=scal[0], descale_k=scal[1], descale_v=scal[2],
                                      descale_s=scal[3], scale_s=scal[4], scale_o=scal[5], is_inference=True,
                                      attn_scale=1.0 / math.sqrt(d), use_causal_mask=False, name="sdpa_fp8")
    out = torch.empty(b, n, h, d, dtype=torch.float8_e4m3fn, device=q8.device)
    so_ = out.stride()
    o.set_output(True).set_dim(dims).set_stride([so_[0], so_[2], so_[1], so_[3]]).set_data_type(e4m3)
    for a in (amax_s, amax_o):
        a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
    g.validate()
    g.build_operation_graph()
    modes = [cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK]
    g.create_execution_plans(modes)
    g.check_support()
    count = g.get_execution_plan_count()
    built = []
    for i in range(count):
        try:
            g.build_plan_at_index(i)
            built.append(i)
        except Exception as e:  # noqa: BLE001 - a plan the backend refuses is recorded and skipped
            info.setdefault("plan_errors", {})[i] = str(e)[:200]
    info["plans"] = count
    info["built_plans"] = built
    ws = torch.empty(max([g.get_workspace_size_plan_at_index(i) for i in built] or [0]) + 1,
                     dtype=torch.uint8, device=q8.device)
    amax = torch.empty(2, 1, 1, 1, 1, dtype=torch.float32, device=q8.device)

    def run(plan: int, scales: torch.Tensor):
        """scales [6, 1, 1, 1, 1]: descale q, k, v, s; scale s, o."""
        pack = {tq: q8, tk: k8, tv: v8, o: out, amax_s: amax[0], amax_o: amax[1]}
        pack.update({scal[i]: scales[i] for i in range(6)})
        g.execute_plan_at_index(pack, ws, plan, handle=handle)
        return out

    return run, built


def make_inputs(heads: int, tokens: int, d: int = 128, dev: str = "cuda"):
    """bf16 q, k, v [1, L, H, d]: Q and K RMS-normed with per-head gains in [0.5, 2], V Gaussian."""
    torch.manual_seed(0)
    gain = torch.linspace(0.5, 2.0, heads, device=dev).view(1, 1, heads, 1)
    q = torch.randn(1, tokens, heads, d, device=dev)
    k = torch.randn(1, tokens, heads, d, device=dev)
    q = (q / q.pow(2).mean(-1, keepdim=True).sqrt() * gain).bfloat16()
    k = (k / k.pow(2).mean(-1, keepdim=True).sqrt() * gain.flip(2)).bfloat16()
    v = torch.randn(1, tokens, heads, d, device=dev).bfloat16()
    return q, k, v


def per_head_fp8(q, k, v):
    """e4m3 q, k, v with per-head scales from the measured amax, and their descales ([1, H] each)."""
    heads = q.shape[2]
    amax_h = torch.stack([x.abs().amax(dim=(0, 1, 3)).float() for x in (q, k, v)])  # [3, H]
    s_head = amax_h / E4M3_MAX
    q8, k8, v8 = ((x.float() / s_head[i].view(1, 1, heads, 1)).to(torch.float8_e4m3fn)
                  for i, x in enumerate((q, k, v)))
    return (q8, k8, v8), [s_head[i].view(1, heads).contiguous() for i in range(3)], amax_h


def cli(description: str, default_out: str, argv: list[str] | None):
    """The probes' shared arguments (--tokens, --heads, --out), or None without CUDA."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32760)
    ap.add_argument("--heads", type=int, nargs="+", default=[12, 40])
    ap.add_argument("--out", default=default_out)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return None
    return a


def case(heads: int, tokens: int, reps: dict) -> dict:
    from fastvideo3.kernels.attention import _fa3
    d, dev = 128, "cuda"
    q, k, v = make_inputs(heads, tokens, d, dev)
    ref = reference(q, k, v)
    flops = 4.0 * tokens * tokens * d * heads
    row: dict = {"heads": heads, "tokens": tokens, "head_dim": d}

    def add(name, fn, out_fn=None):
        try:
            ms = per_call_ms(fn, **reps)
            out = (out_fn or fn)()
            row[name] = {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1), "rel_err": rel_err(out, ref)}
        except Exception as e:  # noqa: BLE001 - one backend failing must not hide the others
            row[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
        print(name, row[name], flush=True)

    fa3 = _fa3()
    def unwrap(x):
        return x[0] if isinstance(x, tuple) else x
    if fa3 is not None:
        add("fa3_bf16", lambda: unwrap(fa3(q, k, v)))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    def sdpa_cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)
    add("sdpa_cudnn_bf16", sdpa_cudnn)

    # per-head scales (FA3) and per-tensor scales (cuDNN) from the measured amax
    (q8h, k8h, v8h), dh, amax_h = per_head_fp8(q, k, v)
    if fa3 is not None:
        add("fa3_fp8_per_head", lambda: unwrap(fa3(q8h, k8h, v8h, q_descale=dh[0], k_descale=dh[1], v_descale=dh[2])))
    s_t = amax_h.amax(dim=1) / E4M3_MAX  # [3]
    q8, k8, v8 = ((x.float() / s_t[i]).to(torch.float8_e4m3fn) for i, x in enumerate((q, k, v)))
    if fa3 is not None:
        st = [s_t[i].view(1, 1).expand(1, heads).contiguous() for i in range(3)]
        add("fa3_fp8_per_tensor", lambda: unwrap(fa3(q8, k8, v8, q_descale=st[0], k_descale=st[1], v_descale=st[2])))
    info: dict = {}
    try:
        t0 = time.perf_counter()
        run, plans = cudnn_fp8(q8, k8, v8, info)
        info["build_s"] = round(time.perf_counter() - t0, 2)
        o_scale = E4M3_MAX / (s_t[2] * E4M3_MAX)  # 1 / max|V|, times 448
        scales = torch.stack([s_t[0], s_t[1], s_t[2], torch.tensor(1.0 / E4M3_MAX, device=dev),
                              torch.tensor(E4M3_MAX, device=dev), o_scale]).view(6, 1, 1, 1, 1).float().contiguous()
        for p in plans:
            add(f"cudnn_fp8_plan{p}", lambda p=p: run(p, scales),
                lambda p=p: run(p, scales).float() / scales[5].view(()))
    except Exception as e:  # noqa: BLE001
        info["error"] = f"{type(e).__name__}: {e}"[:600]
    row["cudnn"] = info
    print("cudnn", info, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    a = cli(__doc__, "attention_fp8_probe.json", argv)
    if a is None:
        return 2
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn_torch": torch.backends.cudnn.version(),
              "command": "python bench/attention_fp8_probe.py " + " ".join(argv or sys.argv[1:]), "cases": []}
    for h in a.heads:
        result["cases"].append(case(h, a.tokens, {"calls": 10, "runs": 3}))
        Path(a.out).write_text(json.dumps(result, indent=1))
    summary = []
    for row in result["cases"]:
        timed = {k: v for k, v in row.items() if isinstance(v, dict) and "ms" in v}
        best_cudnn = min((k for k in timed if k.startswith("cudnn")), key=lambda k: timed[k]["ms"], default=None)
        summary.append({"heads": row["heads"], "fa3_fp8_ms": timed.get("fa3_fp8_per_head", {}).get("ms"),
                        "cudnn_fp8_ms": timed[best_cudnn]["ms"] if best_cudnn else None,
                        "cudnn_fp8_plan": best_cudnn,
                        "cudnn_fp8_rel_err": timed[best_cudnn]["rel_err"] if best_cudnn else None,
                        "fa3_fp8_rel_err": timed.get("fa3_fp8_per_head", {}).get("rel_err")})
    result["summary"] = summary
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
