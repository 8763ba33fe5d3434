"""The memory-bound kernels of the FP8 1.3B forward, one by one, at its 81x480x832 shapes (CUDA):
each launch variant's time, its effective bandwidth, and whether it writes what the default does.

    python bench/fp8_kernels_probe.py [--out FILE] [--tokens 32760]

Per DiT block the FP8 fast path (fastvideo3/models/wan/fast_fp8.py) runs, besides its GEMMs and
the FP8 self-attention, three per-token quantizations (two of 1,536 columns, the FFN's bias +
GELU of 8,960), three add_norm passes with e4m3 out, the QKV norm + RoPE + e4m3 pass (with V's
per-head amax before it), cross-attention Q's norm, and cross-attention (512 text keys). The
cases here time those kernels alone, so a launch change is judged before the whole forward is:

* ``rows_*``: the row quantizer with the row padded to one power of two (``pad``) or held in two
  power-of-two tiles (``tiles``: 8,960 = 8,192 + 1,024), at several warp counts, and the two-read
  path (``two_read``, rows over ``ROW_REGISTER_WIDTH`` = 4,096);
* ``add_norm_*``: the residual + LayerNorm + modulation + e4m3 pass at 1, 2, 4 rows a program,
  and looped (``loop*``: a program walks that many rows, its sample's modulation read once);
* ``qkv_fp8_bound_*`` (with V's per-head amax), ``head_amax_v``, ``q2_norm``: the self-attention
  prologue at 1, 2, 4, 8 rows a program (``split``: Q, K, V written each contiguous; ``flat``: the
  row read flat, each rotation partner read again; ``v_given``: V's scales given, as the fast
  path's ``v_bounded`` gives them, so no amax pass), and cross-attention Q's norm;
* ``cross_*``: cross-attention through SDPA (the default), FlashAttention-3 in bf16, and in FP8.

Times are CUDA-event milliseconds of 20 back-to-back calls divided by 20 (the median of 5 such
runs), so the host's launch cost is hidden as it is inside the forward's CUDA graph.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_call_ms(fn, calls: int = 20, runs: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))
    return bool(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                            b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b))


def summarize(cases: dict) -> dict:
    """Per kernel (the case name before its variant), the fastest variant and its time (ms)."""
    best: dict = {}
    for name, row in cases.items():
        if "ms" not in row or name == "x_copy":
            continue
        kernel = name.split("_rows")[0].split("_loop")[0].split("_pad")[0].split("_tiles")[0].split("_two_read")[0]
        kernel = "cross" if name.startswith("cross_") else kernel.removesuffix("_flat")  # flat: a QKV variant
        if kernel not in best or row["ms"] < best[kernel]["ms"]:
            best[kernel] = {"variant": name, "ms": row["ms"]}
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32760)
    ap.add_argument("--out", default="fp8_kernels_probe.json")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    from fastvideo3.kernels import fp8 as fp8k
    from fastvideo3.kernels.attention import _fa3, attention
    from fastvideo3.kernels.fused import RopeGrid, add_norm, qk_norm_rope
    from fastvideo3.models.wan.dit import rope_tables

    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    m, d, heads, hd, ffn, text = a.tokens, 1536, 12, 128, 8960, 512
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": m, "cases": {}}
    cases = res["cases"]

    def case(name: str, fn, nbytes: float, ref=None):
        try:
            out = fn()
            ms = per_call_ms(fn)
            row = {"ms": round(ms, 4), "gbps": round(nbytes / ms / 1e6, 1)}
            if ref is not None:
                row["same_as_default"] = _same(out, ref)
            cases[name] = row
            print(f"{name:34s} {ms * 1e3:8.1f} us {row['gbps']:8.1f} GB/s"
                  + (f"  same={row['same_as_default']}" if ref is not None else ""), flush=True)
            return out
        except Exception as e:  # noqa: BLE001 - recorded; the other cases stand
            cases[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
            print(f"{name:34s} ERROR {cases[name]['error']}", flush=True)
            return None

    # --- row quantizers
    y1 = torch.randn(1, m, ffn, device=dev, dtype=bf)
    b1 = torch.randn(ffn, device=dev, dtype=bf) * 0.1
    o = torch.randn(1, m, d, device=dev, dtype=bf)
    width = fp8k.ROW_REGISTER_WIDTH
    try:
        fp8k.ROW_REGISTER_WIDTH = 16384
        for k, x, bias in ((ffn, y1, b1), (d, o, None)):
            nbytes = m * k * 3
            gelu = bias is not None
            tag = f"rows_{'gelu_' if gelu else ''}{k}"
            ref = case(f"{tag}_pad", lambda: fp8k._launch_rows(x, bias, gelu=gelu, tiles=False), nbytes)
            for warps in (None, 4, 8, 16):
                case(f"{tag}_tiles_w{warps or 'auto'}",
                     lambda: fp8k._launch_rows(x, bias, gelu=gelu, tiles=True, warps=warps), nbytes, ref)
            fp8k.ROW_REGISTER_WIDTH = 4096
            case(f"{tag}_two_read", lambda: fp8k._launch_rows(x, bias, gelu=gelu), nbytes, ref)
            fp8k.ROW_REGISTER_WIDTH = 16384
    finally:
        fp8k.ROW_REGISTER_WIDTH = width
    del y1

    # --- add_norm, e4m3 out (the modulated pass after the FFN: residual + gate, next block's scale/shift)
    x0 = torch.randn(1, m, d, device=dev, dtype=bf)
    y = torch.randn(1, m, d, device=dev, dtype=bf)
    gate = torch.randn(1, d, device=dev) * 0.1
    sc, sh = torch.randn(1, d, device=dev) * 0.1, torch.randn(1, d, device=dev) * 0.1
    nbytes = m * d * (2 + 2 + 2 + 1)
    x = x0.clone()

    def run_norm(rows, warps=None, loop=0):
        x.copy_(x0)  # the same input each call (the pass updates x in place); the copy is timed apart
        return add_norm(x, y, gate, sc, sh, modulate=True, eps=1e-6, impl="triton", fp8=True, rows=rows,
                        warps_override=warps, loop=loop)

    copy_ms = per_call_ms(lambda: x.copy_(x0))
    cases["x_copy"] = {"ms": round(copy_ms, 4), "note": "subtracted from every add_norm case"}
    ref = None
    launches = [(1, None, 0), (2, None, 0), (4, None, 0), (8, None, 0), (2, 4, 0), (4, 8, 0), (4, 4, 0), (8, 8, 0)]
    launches += [(1, w, loop) for loop in (8, 32, 128) for w in (None, 4)]  # looped: modulation read once
    for rows, warps, loop in launches:
        name = f"add_norm_rows{rows}_w{warps or 'auto'}" if not loop else f"add_norm_loop{loop}_w{warps or 'auto'}"
        out = case(name, lambda: run_norm(rows, warps, loop), nbytes, ref)
        if name in cases and "ms" in cases[name]:
            cases[name]["ms"] = round(cases[name]["ms"] - copy_ms, 4)
            cases[name]["gbps"] = round(nbytes / cases[name]["ms"] / 1e6, 1)
        if ref is None:
            ref = out

    # --- self-attention prologue, cross-attention Q norm
    cos, sin = rope_tables(hd, 1024)
    grid = (21, 30, 52) if m == 32760 else (1, 1, m)
    rope = RopeGrid(cos.to(dev), sin.to(dev), grid, hd - 2 * (2 * (hd // 6)), 2 * (hd // 6))
    qkv = torch.randn(1, m, 3 * d, device=dev, dtype=bf)
    norm = (torch.rand(2, d, device=dev) * 0.5 + 0.75).contiguous()
    bounds = torch.stack([fp8k.qk_scale_bound(norm[0], heads), fp8k.qk_scale_bound(norm[1], heads)])
    case("head_amax_v", lambda: fp8k.head_amax(qkv[..., 2 * d:], heads, impl="triton"), m * d * 2)
    ref = None
    for rows, warps in ((1, None), (2, None), (4, None), (8, None), (2, 4), (4, 8), (8, 8)):
        out = case(f"qkv_fp8_bound_rows{rows}_w{warps or 'auto'}",
                   lambda: fp8k.qkv_fp8(qkv, norm, bounds, heads=heads, eps=1e-6, rope=rope, impl="triton",
                                        rows=rows, warps=warps), m * 3 * d * 3, ref)
        ref = out if ref is None else ref
    case("qkv_fp8_bound_split", lambda: fp8k.qkv_fp8(qkv, norm, bounds, heads=heads, eps=1e-6, rope=rope,
                                                      impl="triton", split=True), m * 3 * d * 3)
    for rows, warps in ((1, None), (2, 4), (2, 8), (4, 8)):  # the row read flat (QKV_KERNEL "flat")
        case(f"qkv_fp8_bound_flat_rows{rows}_w{warps or 'auto'}",
             lambda: fp8k.qkv_fp8(qkv, norm, bounds, heads=heads, eps=1e-6, rope=rope, impl="triton",
                                  rows=rows, warps=warps, kernel="flat"), m * 3 * d * 3, ref)
    v_bound = fp8k.head_amax(qkv[..., 2 * d:], heads, impl="triton") * 40.0 / 448  # V's scales given
    case("qkv_fp8_bound_v_given", lambda: fp8k.qkv_fp8(qkv, norm, bounds, heads=heads, eps=1e-6, rope=rope,
                                                        impl="triton", v_scales=v_bound), m * 3 * d * 3)
    q2 = torch.randn(1, m, d, device=dev, dtype=bf)
    case("q2_norm", lambda: qk_norm_rope(q2, norm[:1].contiguous(), parts=1, eps=1e-6, heads=heads, impl="triton"),
         m * d * 4)

    # --- cross-attention
    q = q2.view(1, m, heads, hd)
    k = torch.randn(1, text, heads, hd, device=dev, dtype=bf)
    v = torch.randn(1, text, heads, hd, device=dev, dtype=bf)
    flops = 4.0 * heads * m * text * hd
    ref = case("cross_sdpa", lambda: attention(q, k, v, "sdpa"), flops / 1e3)
    fn = _fa3()
    if fn is not None:
        case("cross_fa3_bf16", lambda: attention(q, k, v, "fa3"), flops / 1e3)

        def q8(t):
            s = t.abs().amax(dim=(1, 3)).float().clamp_min(1e-12) / 448.0
            return (t.float() / s[:, None, :, None]).clamp(-448, 448).to(fp8k.E4M3), s

        (qq, sq), (kq, sk), (vq, sv) = q8(q), q8(k), q8(v)
        out8 = case("cross_fa3_fp8", lambda: fn(qq, kq, vq, q_descale=sq, k_descale=sk, v_descale=sv), flops / 1e3)
        if out8 is not None and ref is not None:
            out8 = out8[0] if isinstance(out8, tuple) else out8
            cases["cross_fa3_fp8"]["rel_err_vs_sdpa"] = float((out8.float() - ref.float()).norm() / ref.float().norm())
    res["summary"] = summarize(cases)
    res["note"] = "gbps: bytes read + written per call over its time; cross_*: the 'gbps' column is TFLOP/s"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print("wrote", a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
