"""The ``--precision fp8`` mode of bench/denoiser.py: our DiT's fast path with its block GEMMs (and
self-attention, where FlashAttention-3's FP8 forward imports) in e4m3, against the same model and
inputs in bf16, on one CUDA GPU.

    python bench/denoiser.py --precision fp8 --out OUT.json --stage micro|1.3b|14b|tiny|table \
        [--attention-scales bound|amax|smooth_k] [--fp8-accumulation fp32|fast] [--row-register-width N]

Each stage is one process (the shell script gives each its own time limit) and merges its part
into OUT.json, so what finished is always kept:

* ``micro``: first FP8 self-attention alone against bf16 on one layer of each model (prologue and
  FA3 timed apart, relative error) for every Q/K scale scheme, on a random and an offset-K input;
  then ``torch._scaled_mm`` row-wise e4m3 against a bf16 matmul at Wan's GEMM shapes (with fast
  accumulation, and the row quantizer's one-read and two-read paths), and FP8 against bf16
  attention (FA3) at 32,760 tokens; torchao is probed (not on the GPU image);
* ``1.3b`` / ``14b``: random weights drawn on the GPU (bf16, the fp32 modules of the reference kept
  fp32), 81x480x832: the bf16 fast path is timed (eager and replayed from a CUDA graph), then the
  same model is quantized in place and the FP8 fast path timed likewise; ``ms_*`` in the summary
  is the better of the two per precision; ``rel_err_vs_bf16`` is the relative Frobenius error of
  the DiT output. The FP8 options are the flags' (the card's ``fp8`` block); also the other
  accumulation, for 1.3B the other Q/K scale schemes and FP8 GEMMs with bf16 attention, and a
  kernel profile of the FP8 forward;
* ``tiny``: the trained tiny card through the serving loop at fp32 (its own precision), bf16 and
  ``wan-tiny-fp8``: the eval prompt set x 2 seeds, 50 steps: PSNR of the fp8 frames against the bf16
  (and fp32) frames of the same seeds, and prompt adherence (bench/quality.py's scorer);
* ``table``: writes ``summary`` and prints the table.
"""
from __future__ import annotations

import gc
import importlib
import json
import math
import time
from pathlib import Path

import torch

GiB = 2**30
FRAMES, HEIGHT, WIDTH, TEXT_LEN = 81, 480, 832, 512
GOALS_MS = {"1.3b": 300.0, "14b": 1800.0}
REL_ERR_GOAL = 5e-2
#: the rows a program of the looped add_norm walks in the forward's variant (the kernel probe
#: times 8, 32 and 128 alone)
ADD_NORM_LOOP_TRY = 32


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _merge(path: Path, key: str, value) -> None:
    data = _load(path)
    data[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def _err(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"[:1500]}


# ------------------------------------------------------------------------------------- micro
#: one self-attention layer of each model at 81x480x832: (heads, latent grid of 32,760 tokens)
LAYERS = {"1.3b": (12, (21, 30, 52)), "14b": (40, (21, 30, 52))}


def micro_attention_schemes(models=("1.3b", "14b")) -> dict:
    """FP8 self-attention alone against bf16 on one layer's shape, per Q/K scale scheme: the
    prologue (norm + RoPE (+ e4m3 cast)) and FA3 timed apart, and the relative error of the
    attention output against bf16 FA3 on the same normed, rotated Q/K. Two inputs: ``random``
    (a random projection) and ``k_offset`` (K sharing a per-channel offset of 4x its spread, as a
    trained K's bias does; where K smoothing should matter)."""
    from denoiser import time_ms
    from fastvideo3.kernels import qk_norm_rope
    from fastvideo3.kernels.attention import _fa3
    from fastvideo3.kernels.fp8 import ATTENTION_SCALES, attention_fp8, qk_scale_bound, qkv_fp8
    from fastvideo3.kernels.fused import RopeGrid
    from fastvideo3.models.wan.dit import rope_tables
    fn = _fa3()
    out: dict = {}
    for name in models:
        heads, grid = LAYERS[name]
        hd, n = 128, grid[0] * grid[1] * grid[2]
        d = heads * hd
        cos, sin = rope_tables(hd, 1024)
        rope = RopeGrid(cos.cuda(), sin.cuda(), grid, hd - 2 * (2 * (hd // 6)), 2 * (hd // 6))
        g = torch.Generator(device="cuda").manual_seed(heads)
        norm = (torch.rand(2, d, generator=g, device="cuda") * 0.5 + 0.75).contiguous()
        bounds = torch.stack([qk_scale_bound(norm[0], heads), qk_scale_bound(norm[1], heads)])
        flops = 4.0 * heads * n * n * hd
        for kind in ("random", "k_offset"):
            qkv = torch.randn(1, n, 3 * d, generator=g, device="cuda", dtype=torch.bfloat16)
            if kind == "k_offset":
                qkv[..., d:2 * d] += 4 * torch.randn(1, 1, d, generator=g, device="cuda", dtype=torch.bfloat16)
            qk = qk_norm_rope(qkv, norm, parts=2, eps=1e-6, heads=heads, rope=rope, impl="triton")
            q, k, v = (t.view(1, n, heads, hd) for t in (qk[..., :d], qk[..., d:], qkv[..., 2 * d:]))
            ref = fn(q, k, v)
            ref = (ref[0] if isinstance(ref, tuple) else ref).float()
            prep16, _ = time_ms(lambda: qk_norm_rope(qkv, norm, parts=2, eps=1e-6, heads=heads, rope=rope,
                                                     impl="triton"), 2, 10)
            att16, _ = time_ms(lambda: fn(q, k, v), 1, 5)
            row = {"bf16": {"prologue_ms": round(prep16, 3), "attention_ms": round(att16, 3),
                            "total_ms": round(prep16 + att16, 3), "tflops": round(flops / att16 / 1e9, 1)}}
            for scheme in ATTENTION_SCALES:
                try:
                    prep = lambda: qkv_fp8(qkv, norm, bounds, heads=heads, eps=1e-6, rope=rope,  # noqa: E731
                                           impl="triton", scales=scheme)
                    q8, sc = prep()
                    got = attention_fp8(q8, sc, heads).float()
                    p8, _ = time_ms(prep, 2, 10)
                    a8, _ = time_ms(lambda: attention_fp8(q8, sc, heads), 1, 5)
                    row[scheme] = {"prologue_ms": round(p8, 3), "attention_ms": round(a8, 3),
                                   "total_ms": round(p8 + a8, 3), "tflops": round(flops / a8 / 1e9, 1),
                                   "speedup_vs_bf16": round((prep16 + att16) / (p8 + a8), 3),
                                   "rel_err_vs_bf16": float((got - ref).norm() / ref.norm())}
                    if scheme == "bound":  # does FA3 read the strided Q/K/V views of one buffer slower?
                        sep = [q8[..., i * d:(i + 1) * d].view(1, n, heads, hd).contiguous() for i in range(3)]
                        c8, _ = time_ms(lambda: fn(*sep, q_descale=sc[0], k_descale=sc[1], v_descale=sc[2]), 1, 5)
                        row[scheme]["attention_contiguous_qkv_ms"] = round(c8, 3)
                        del sep
                    q8 = got = None  # freed (not del: the timing lambdas above close over q8)
                except Exception as e:  # noqa: BLE001 - recorded; the other schemes stand
                    row[scheme] = _err(e)
            out[f"{name}_h{heads}_{kind}"] = row
            qkv = qk = ref = None  # freed before the next input
    return out


def print_attention_schemes(res: dict) -> None:
    print("\nFP8 attention, one layer (prologue + FA3; rel err vs bf16 FA3)")
    for key, row in res.items():
        if not isinstance(row, dict) or "bf16" not in row:
            continue
        cells = [f"bf16 {row['bf16']['total_ms']:.2f} ms"]
        for scheme, r in row.items():
            if scheme != "bf16":
                cells.append(f"{scheme} {r['total_ms']:.2f} ms ({r['attention_ms']:.2f} fa3) "
                             f"err {r['rel_err_vs_bf16']:.2e}" if "total_ms" in r
                             else f"{scheme} ERROR {r.get('error', '')[:80]}")
        print(f"{key:22s} | " + " | ".join(cells), flush=True)


def stage_micro(save=None) -> dict:
    from denoiser import time_ms
    from fastvideo3.kernels.attention import _fa3, attention_available
    from fastvideo3.kernels.fp8 import E4M3, bias_gelu_quant, fp8_linear, quantize_rows, quantize_weight
    out: dict = {"gemm": [], "attention": {}}
    if attention_available("fa3", "cuda"):
        try:
            out["attention_schemes"] = micro_attention_schemes()
            print_attention_schemes(out["attention_schemes"])
        except Exception as e:  # noqa: BLE001 - recorded; the GEMM figures stand
            out["attention_schemes"] = _err(e)
        if save is not None:  # kept should the GEMM part run out of time
            save({**out, "partial": "the GEMM micro-benchmarks did not finish"})
    try:
        import torchao  # noqa: F401
        out["torchao"] = f"importable {torchao.__version__} (not measured)"
    except ImportError:
        out["torchao"] = ("not importable on this image; torch._scaled_mm row-wise is what torchao's float8 "
                          "row-wise linear calls for its GEMM, so it is measured directly")
    m = 32760
    g = torch.Generator(device="cuda").manual_seed(0)
    for k, n in ((1536, 4608), (1536, 1536), (1536, 8960), (8960, 1536), (5120, 15360), (5120, 13824), (13824, 5120)):
        x = torch.randn(m, k, generator=g, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, generator=g, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
        xq, xs = quantize_rows(x, impl="triton")
        wq, ws = quantize_weight(w)
        flops = 2.0 * m * k * n
        ms16, _ = time_ms(lambda: x @ w.t(), 2, 8)
        ms8, _ = time_ms(lambda: fp8_linear(xq, xs, wq, ws), 2, 8)
        try:
            ms8f, _ = time_ms(lambda: fp8_linear(xq, xs, wq, ws, fast_accum=True), 2, 8)
            fast = fp8_linear(xq, xs, wq, ws, fast_accum=True).float()
        except RuntimeError:  # recorded as absent: the GEMM figures stand
            ms8f, fast = float("nan"), None
        msq, _ = time_ms(lambda: quantize_rows(x, impl="triton"), 2, 8)
        bias = torch.zeros(k, device="cuda", dtype=torch.bfloat16)
        msg, _ = time_ms(lambda: bias_gelu_quant(x, bias, impl="triton"), 2, 8)
        from fastvideo3.kernels import fp8 as fp8k
        one_read = fp8k.ROW_REGISTER_WIDTH
        try:  # the earlier two-read row quantizer for rows over 4,096 columns (--row-register-width 4096)
            fp8k.ROW_REGISTER_WIDTH = 4096
            msq2, _ = time_ms(lambda: quantize_rows(x, impl="triton"), 2, 8)
            msg2, _ = time_ms(lambda: bias_gelu_quant(x, bias, impl="triton"), 2, 8)
        finally:
            fp8k.ROW_REGISTER_WIDTH = one_read
        ref = (x @ w.t()).float()
        rel = float((fp8_linear(xq, xs, wq, ws).float() - ref).norm() / ref.norm())
        fast_rel = float((fast - ref).norm() / ref.norm()) if fast is not None else None
        out["gemm"].append({"m": m, "k": k, "n": n, "bf16_ms": round(ms16, 3), "fp8_ms": round(ms8, 3),
                            "fp8_fast_accum_ms": None if fast is None else round(ms8f, 3), "rel_err_fast_accum": fast_rel,
                            "bf16_tflops": round(flops / ms16 / 1e9, 1), "fp8_tflops": round(flops / ms8 / 1e9, 1),
                            "quantize_rows_ms": round(msq, 3), "bias_gelu_quant_ms": round(msg, 3),
                            "row_register_width": one_read, "quantize_rows_ms_width4096": round(msq2, 3),
                            "bias_gelu_quant_ms_width4096": round(msg2, 3),
                            "quantize_gbps": round(x.numel() * 3 / msq / 1e6, 1), "rel_err": rel})
        x = w = xq = wq = None  # freed before the next shape
    if attention_available("fa3", "cuda"):
        fn = _fa3()
        for heads in (12, 40):
            q, k, v = (torch.randn(1, m, heads, 128, generator=g, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            q = q * 2.0  # sharper softmax than unit scores, closer to a trained model's
            flops = 4.0 * heads * m * m * 128

            def quant_head(t):
                s = t.abs().amax(dim=(1, 3)).float().clamp_min(1e-12) / 448.0  # [B, H]
                return (t.float() / s[:, None, :, None]).to(E4M3), s

            (q8, sq), (k8, sk), (v8, sv) = quant_head(q), quant_head(k), quant_head(v)
            ref = fn(q, k, v)
            ref = ref[0] if isinstance(ref, tuple) else ref
            got = fn(q8, k8, v8, q_descale=sq, k_descale=sk, v_descale=sv)
            got = got[0] if isinstance(got, tuple) else got
            ms16, _ = time_ms(lambda: fn(q, k, v), 1, 5)
            ms8, _ = time_ms(lambda: fn(q8, k8, v8, q_descale=sq, k_descale=sk, v_descale=sv), 1, 5)
            out["attention"][f"self_h{heads}_q{m}"] = {
                "bf16_ms": round(ms16, 3), "fp8_ms": round(ms8, 3), "bf16_tflops": round(flops / ms16 / 1e9, 1),
                "fp8_tflops": round(flops / ms8 / 1e9, 1),
                "rel_err_fp8_vs_bf16": float((got.float() - ref.float()).norm() / ref.float().norm())}
            del q, k, v, q8, k8, v8
    else:
        out["attention"] = {"error": "fa3_fwd not importable: FP8 attention not measured"}
    return out


# ------------------------------------------------------------------------------------ models
@torch.no_grad()
def random_dit(config: dict, seed: int = 0):
    """Our WanDiT with random weights drawn on the GPU the way diffusers initializes the module
    classes (Linear / Conv / norms: their reset_parameters; modulation tables: randn / sqrt(dim)),
    bf16 with the reference's fp32 modules kept fp32."""
    from fastvideo3.models.wan.components import _keep_fp32
    from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig, rope_tables
    cfg = WanDiTConfig.from_dict(config)
    with torch.device("meta"):
        model = WanDiT(cfg)
    model.to_empty(device="cuda")
    torch.manual_seed(seed)
    for name, mod in model.named_modules():
        own = list(mod.parameters(recurse=False))
        if not own:
            continue
        if hasattr(mod, "reset_parameters"):
            mod.reset_parameters()
        elif hasattr(mod, "bias") and hasattr(mod, "weight"):  # the affine cross-attention norm
            mod.weight.fill_(1.0)
            mod.bias.zero_()
        for pname, p in mod.named_parameters(recurse=False):
            if pname == "scale_shift_table":
                p.normal_().div_(cfg.inner_dim ** 0.5)
    cos, sin = rope_tables(cfg.attention_head_dim, cfg.rope_max_seq_len)
    model.rope_cos, model.rope_sin = cos.cuda(), sin.cuda()
    model.to(torch.bfloat16).eval().requires_grad_(False)
    _keep_fp32(model)
    return model


def _qkv_kernel() -> str:
    from fastvideo3.kernels.fp8 import QKV_KERNEL
    return QKV_KERNEL


def _ffn_config() -> tuple:
    from fastvideo3.kernels.fp8_gemm import _default_config
    return _default_config()


def _timed(fn, warm: int, iters: int) -> dict:
    from denoiser import timed_with_peak
    res = timed_with_peak(fn, warm, iters, 1.0)
    res.pop("tflops", None)
    return res


def _graph(label: str, fast, x, t, text, eager_out, warm: int, iters: int) -> dict:
    """The forward captured in a CUDA graph (as the serving pools run prepared buckets), replayed."""
    from denoiser import bench_graph
    try:
        res, check = bench_graph(label, fast, x, t, text, eager_out, warm, iters, 1.0)
    except Exception as e:  # noqa: BLE001 - recorded; the eager figure stands
        return _err(e)
    res.pop("tflops", None)
    return {**res, "vs_eager": check}


def _best(variant: dict) -> float:
    """Best of eager and graph replay, as bench/results/denoiser_h200.json reports its bf16 figure."""
    return min(v for v in (variant.get("ms"), variant.get("graph", {}).get("ms")) if v is not None)


def _summarize(name: str, row: dict) -> None:
    ms8, ms16 = _best(row["fp8"]), _best(row["bf16"])
    row["summary"] = {"model": name, "frames": FRAMES, "ms_fp8": ms8, "ms_bf16": ms16,
                      "speedup": round(ms16 / ms8, 3), "rel_err_vs_bf16": row["fp8"]["vs_bf16"]["rel_fro"]}
    row["summary_note"] = "ms: best of eager and CUDA-graph replay of our fast path, per precision"
    row["goal_ms"], row["goal_met"] = GOALS_MS[name], ms8 <= GOALS_MS[name]
    row["rel_err_goal_met"] = row["fp8"]["vs_bf16"]["rel_fro"] <= REL_ERR_GOAL


def stage_model(name: str, quick: bool, scales: str = "bound", accumulation: str = "fp32", save=None) -> dict:
    """One model's row; ``save(row)`` is called once the main bf16/FP8 figures are in (a stage
    cut short by its time limit keeps them), and the variants follow."""
    from denoiser import CONFIGS, compare, make_inputs, profile_top
    from fastvideo3.models.wan.fast import FastWanDiT
    from fastvideo3.models.wan.fp8 import quantize_dit_
    config = CONFIGS[name]
    warm, iters = (1, 3) if quick else ((1, 7) if name == "1.3b" else (1, 5))
    row: dict = {"model": name, "frames": FRAMES, "height": HEIGHT, "width": WIDTH, "batch": 1,
                 "fp8_config": {"attention_scales": scales, "accumulation": accumulation}}
    t0 = time.perf_counter()
    model = random_dit(config)
    row["build_s"] = round(time.perf_counter() - t0, 2)
    x, t, text = make_inputs(config, FRAMES, 1, seed=FRAMES * 100 + 1)
    fast = FastWanDiT(model)
    row["bf16"] = {"attention": fast.attention, "cross_attention": fast.cross_attention, "kernels": fast.kernels}
    ref = fast(x, t, text).float()
    torch.cuda.synchronize()
    row["bf16"].update(_timed(lambda: fast(x, t, text), warm, iters))
    row["bf16"]["graph"] = _graph(f"{name}-bf16", fast, x, t, text, ref, warm, iters)
    fast = None  # the bf16 fast path freed before the FP8 one is built
    gc.collect()
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    quantize_dit_(model, accumulation=accumulation, attention_scales=scales)
    row["quantize_s"] = round(time.perf_counter() - t0, 2)
    gc.collect()
    torch.cuda.empty_cache()
    fast8 = FastWanDiT(model)
    t0 = time.perf_counter()
    got = fast8(x, t, text)
    torch.cuda.synchronize()
    row["fp8"] = {"fp8_attention": fast8.fp8_attention, "fast_accum": fast8.fast_accum,
                  "attention_scales": fast8.attention_scales,
                  "first_call_s": round(time.perf_counter() - t0, 2), "kernels": fast8.kernels,
                  "ffn_fused": fast8.ffn_fused, "attn_out_bounded": fast8.attn_out_bounded,
                  "qkv_split": fast8.qkv_split, "qkv_launch": list(fast8.qkv_launch),
                  "qkv_kernel": fast8.qkv_kernel or _qkv_kernel(), "v_bounded": fast8.v_bounded,
                  "ffn_config": list(_ffn_config())}
    row["fp8"].update(_timed(lambda: fast8(x, t, text), warm, iters))
    row["fp8"]["vs_bf16"] = compare(got, ref)
    row["fp8"]["graph"] = _graph(f"{name}-fp8", fast8, x, t, text, got, warm, iters)
    del got
    _summarize(name, row)
    if save is not None:
        save(row)
    other = "fp32" if accumulation == "fast" else "fast"
    try:  # the other card option fp8.accumulation (fast: GEMM partial sums kept in the FP8 accumulator)
        fast8.fast_accum = other == "fast"
        o = fast8(x, t, text)
        row[f"fp8_{other}_accumulation"] = {"vs_bf16": compare(o, ref),
                                            **_timed(lambda: fast8(x, t, text), warm, iters)}
        del o
    except Exception as e:  # noqa: BLE001 - a variant's failure must not lose the row
        row[f"fp8_{other}_accumulation"] = _err(e)
    finally:
        fast8.fast_accum = accumulation == "fast"

    def owner(f: str):  # "module.NAME": a module's setting; else an attribute of the fast path
        if "." not in f:
            return fast8, f
        mod, attr = f.rsplit(".", 1)
        return importlib.import_module(mod), attr

    def variant(key: str, attrs: dict) -> None:  # the main figure with ``attrs`` set, timed as a graph too
        was = {f: getattr(*owner(f)) for f in attrs}
        try:
            for f, v in attrs.items():
                setattr(*owner(f), v)
            o = fast8(x, t, text)
            row[key] = {"flags": dict(attrs), "vs_bf16": compare(o, ref),
                        **_timed(lambda: fast8(x, t, text), warm, iters)}
            row[key]["graph"] = _graph(f"{name}-{key}", fast8, x, t, text, o, warm, iters)
            del o
        except Exception as e:  # noqa: BLE001 - a variant's failure must not lose the row
            row[key] = _err(e)
        finally:
            for f, v in was.items():
                setattr(*owner(f), v)

    # the kernel alternatives not yet the default, in turn and together (the Q/K/V split and the QKV
    # launch were timed in bench/results/denoiser_fp8_qkv_h200.json): add_norm looped (a program
    # walking ADD_NORM_LOOP_TRY rows, its modulation read once); the QKV pass read flat; V's
    # scales bounded instead of measured; the fused FFN-in through TMA (or back to the pointer
    # kernel when this run's config is a TMA one)
    from fastvideo3.kernels.fp8_gemm import CONFIGS as FFN_CONFIGS
    news: dict = {}
    from fastvideo3.kernels import fused
    if not fused.ADD_NORM_LOOP:
        news["add_norm_loop"] = {"fastvideo3.kernels.fused.ADD_NORM_LOOP": ADD_NORM_LOOP_TRY}
    if fast8.fp8_attention:
        news["qkv_flat"] = {"qkv_kernel": "flat"}
        news["v_bounded"] = {"v_bounded": True}
    if fast8.ffn_fused:
        tma = _ffn_config()[6] != "pointer"
        other_cfg = FFN_CONFIGS[0] if tma else next(c for c in FFN_CONFIGS if c[6] == "tma")
        news["ffn_pointer" if tma else "ffn_tma"] = {"ffn_config": other_cfg}
    for label, attrs in news.items():
        variant(f"fp8_{label}", attrs)
    if len(news) > 1:
        variant("fp8_new_all", {f: v for attrs in news.values() for f, v in attrs.items()})
    # the fused FFN-in GEMM (FASTVIDEO3_FP8_BOUNDED) flipped from how this run's main figure ran
    if not fast8.per_tensor:
        variant(f"fp8_{'no_' if fast8.ffn_fused else ''}ffn_fused", {"ffn_fused": not fast8.ffn_fused})
    if fast8.fp8_attention and name == "1.3b":  # the other Q/K schemes (14B: in the micro-check only)
        from fastvideo3.kernels.fp8 import ATTENTION_SCALES
        for alt in (s_ for s_ in ATTENTION_SCALES if s_ != scales):
            try:
                fast8.attention_scales = alt
                o = fast8(x, t, text)
                row[f"fp8_scales_{alt}"] = {"vs_bf16": compare(o, ref), **_timed(lambda: fast8(x, t, text), 1, 3)}
                del o
            except Exception as e:  # noqa: BLE001
                row[f"fp8_scales_{alt}"] = _err(e)
            finally:
                fast8.attention_scales = scales
    if name == "1.3b":
        try:
            alt = FastWanDiT(model, fp8_attention=False, share_weights=False)
            o = alt(x, t, text)
            row["fp8_gemm_bf16_attention"] = {"attention": alt.attention, **compare(o, ref),
                                              **_timed(lambda: alt(x, t, text), warm, iters)}
            del alt, o
        except Exception as e:  # noqa: BLE001
            row["fp8_gemm_bf16_attention"] = _err(e)
    try:  # where the FP8 forward's time goes (both models: the 14B's breakdown differs)
        row["profile_fp8"] = profile_top(lambda: fast8(x, t, text), top=20)
    except Exception as e:  # noqa: BLE001
        row["profile_fp8"] = _err(e)
    return row


# -------------------------------------------------------------------------------------- tiny
def _tiny_cards(scales: str = "bound", accumulation: str = "fp32"):
    from fastvideo3.card import get_card
    from fastvideo3.card.spec import ModelCard
    base = get_card("wan-tiny")
    data = base.model_dump(mode="json")
    data["model_id"] = "wan-tiny-bf16-baseline"  # the same weights served in bf16 (bench only)
    data["recipe"]["assumes_precision"] = "bf16"
    data["precision"] = {"supported": ["bf16"], "default_cpu": "bf16", "default_cuda": "bf16"}
    fp8 = get_card("wan-tiny-fp8")
    if (scales, accumulation) != ("bound", "fp32"):  # the shipped card with the benched FP8 options
        d8 = fp8.model_dump(mode="json")
        d8["components"]["transformer"]["fp8"] = {**(d8["components"]["transformer"].get("fp8") or {}),
                                                  "attention_scales": scales, "accumulation": accumulation}
        fp8 = ModelCard.model_validate(d8)
    return {"fp32": base, "bf16": ModelCard.model_validate(data), "fp8_e4m3": fp8}


def stage_tiny(seeds: list[int], scales: str = "bound", accumulation: str = "fp32") -> dict:
    from fastvideo3.models.reward.adherence import AdherenceScorer
    from fastvideo3.engine import Engine
    from fastvideo3.training.data import eval_prompts
    from fastvideo3.training.rollout import Rollout
    prompts = eval_prompts()
    ps = [p for p in prompts for _ in seeds]
    ss = [s for _ in prompts for s in seeds]
    scorer = AdherenceScorer()
    runs, frames = {}, {}
    for prec, card in _tiny_cards(scales, accumulation).items():
        t0 = time.perf_counter()
        with Engine(card, device="cuda", precision=prec) as engine:
            recs = Rollout(engine, capture="norms").run(ps, ss, decode=True, scorer=scorer.score,
                                                        num_inference_steps=50)
            pool = engine.denoiser
            info = {"card": card.model_id, "precision": prec, "weights": pool.weights_digest,
                    "identity_fingerprint": pool.identity.fingerprint_hex,
                    "forward": type(pool._forward).__name__}
        n = len(recs)
        info.update({"clips": n, "seconds": round(time.perf_counter() - t0, 1),
                     "adherence_pct": round(100.0 * sum(r.scores["adherent"] for r in recs) / n, 1),
                     "color_pct": round(100.0 * sum(r.scores["color_ok"] for r in recs) / n, 1),
                     "direction_pct": round(100.0 * sum(r.scores["direction_ok"] for r in recs) / n, 1)})
        runs[prec] = info
        frames[prec] = [r.frames.float() for r in recs]
    out: dict = {"steps": 50, "seeds": seeds, "prompts": len(prompts), "runs": runs,
                 "fp8_config": {"attention_scales": scales, "accumulation": accumulation}}
    for against in ("bf16", "fp32"):
        psnr = []
        for a, b in zip(frames["fp8_e4m3"], frames[against]):
            mse = float(((a - b) ** 2).mean())
            psnr.append(99.0 if mse == 0 else 10 * math.log10(1.0 / mse))
        out[f"psnr_fp8_vs_{against}_db"] = {"mean": round(sum(psnr) / len(psnr), 2), "min": round(min(psnr), 2)}
    psnr16 = []
    for a, b in zip(frames["bf16"], frames["fp32"]):
        mse = float(((a - b) ** 2).mean())
        psnr16.append(99.0 if mse == 0 else 10 * math.log10(1.0 / mse))
    out["psnr_bf16_vs_fp32_db"] = {"mean": round(sum(psnr16) / len(psnr16), 2), "min": round(min(psnr16), 2)}
    delta = runs["fp8_e4m3"]["adherence_pct"] - runs["bf16"]["adherence_pct"]
    out["adherence_delta_fp8_vs_bf16_points"] = round(delta, 1)
    out["goals"] = {"psnr_ge_30db": out["psnr_fp8_vs_bf16_db"]["mean"] >= 30.0,
                    "adherence_within_2_points": abs(out["adherence_delta_fp8_vs_bf16_points"]) <= 2.0}
    return out


# ------------------------------------------------------------------------------------- table
COMMAND = ("bash bench/gpu_run_fp8.sh  (runs: python bench/denoiser.py --precision fp8 --out denoiser_fp8_h200.json "
           "--stage env|micro|1.3b|14b|tiny|table [--attention-scales bound|amax|smooth_k] "
           "[--fp8-accumulation fp32|fast])")


def kernel_groups(profile: dict) -> dict:
    """The FP8 forward's device time by kind of kernel (from the profile's top kernels), in ms."""
    groups = {"self_attention_fa3": 0.0, "cross_attention": 0.0, "gemm": 0.0, "norm_quant_rope_kernels": 0.0,
              "other": 0.0}
    for k in profile.get("top", []):
        name, ms = k["kernel"], k["ms"]
        if "FlashAttn" in name or "flash::" in name:
            key = "self_attention_fa3"
        elif "sdpa" in name or "fmha" in name:
            key = "cross_attention"
        elif "nvjet" in name or "gemm" in name.lower() or "cutlass" in name:
            key = "gemm"
        elif name.endswith("_kernel") and ("rows" in name or "norm" in name or "qkv" in name or "amax" in name):
            key = "norm_quant_rope_kernels"
        else:
            key = "other"
        groups[key] += ms
    out = {k: round(v, 2) for k, v in groups.items()} | {"device_ms": profile.get("device_ms")}
    # what the forward would take if everything but self-attention and the GEMMs were free
    out["floor_attention_plus_gemm_ms"] = round(groups["self_attention_fa3"] + groups["gemm"], 2)
    return out


def _write_summary(path: Path) -> dict:
    """The top-level ``summary`` list from the model rows there (rewritten after every stage)."""
    data = _load(path)
    data["summary"] = [data[k]["summary"] for k in ("model_1.3b", "model_14b") if "summary" in data.get(k, {})]
    data["command"] = COMMAND
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def stage_table(path: Path) -> dict:
    data = _write_summary(path)
    for k in ("model_1.3b", "model_14b"):
        prof = data.get(k, {}).get("profile_fp8", {})
        if "top" in prof:
            data[k]["profile_fp8_by_kind_ms"] = kernel_groups(prof)
    path.write_text(json.dumps(data, indent=1) + "\n")
    if isinstance(data.get("micro", {}).get("attention_schemes"), dict):
        print_attention_schemes(data["micro"]["attention_schemes"])
    seen = set()
    for gm in data.get("micro", {}).get("gemm", []):
        if "bias_gelu_quant_ms_width4096" in gm and gm["k"] not in seen:
            seen.add(gm["k"])
            print(f"row quant k={gm['k']:5d}: one read {gm['quantize_rows_ms']:.3f} / gelu "
                  f"{gm['bias_gelu_quant_ms']:.3f} ms"
                  f" | two reads {gm['quantize_rows_ms_width4096']:.3f} / gelu {gm['bias_gelu_quant_ms_width4096']:.3f}"
                  f" ms | GEMM bf16 {gm['bf16_ms']:.3f} fp8 {gm['fp8_ms']:.3f} fast-acc {gm['fp8_fast_accum_ms']} ms")
    print("\nmodel frames | ms_bf16 | ms_fp8 | speedup | rel_err_vs_bf16 | goal ms")
    for k in ("model_1.3b", "model_14b"):
        r = data.get(k, {})
        if "summary" not in r:
            print(k.removeprefix("model_"), "ERROR", str(r.get("error", "not run"))[:200])
            continue
        s = r["summary"]
        print(f"{s['model']:5s} {s['frames']:3d} | {s['ms_bf16']:8.1f} | {s['ms_fp8']:8.1f} | {s['speedup']:5.2f}x | "
              f"{s['rel_err_vs_bf16']:.2e} | {r['goal_ms']:.0f} {'met' if r['goal_met'] else 'missed'} "
              f"({r.get('fp8_config', {})}; eager {r['fp8'].get('ms')}, graph {r['fp8'].get('graph', {}).get('ms')})")
        if "profile_fp8_by_kind_ms" in r:
            print(f"      FP8 forward by kernel kind (ms): {r['profile_fp8_by_kind_ms']}")
        for key in sorted(k for k in r if k.startswith(("fp8_scales_", "fp8_fast_acc", "fp8_fp32_acc", "fp8_gemm_"))):
            v = r[key]
            err = v.get("vs_bf16", v).get("rel_fro") if isinstance(v, dict) else None
            print(f"      variant {key}: {v.get('ms')} ms eager, rel err {err}" if "error" not in v
                  else f"      variant {key}: ERROR {v['error'][:120]}")
    t = data.get("tiny", {})
    if "runs" in t:
        print(f"tiny card: PSNR fp8 vs bf16 {t['psnr_fp8_vs_bf16_db']['mean']:.2f} dB (min "
              f"{t['psnr_fp8_vs_bf16_db']['min']:.2f}); adherence fp32 {t['runs']['fp32']['adherence_pct']}% "
              f"bf16 {t['runs']['bf16']['adherence_pct']}% fp8 {t['runs']['fp8_e4m3']['adherence_pct']}% "
              f"({t.get('fp8_config', {})}; goals {t.get('goals')}; fp8 ran {t['runs']['fp8_e4m3']['forward']})")
    else:
        print("tiny card:", str(t.get("error", "not run"))[:200])
    return data


def run(args) -> int:
    path = Path(args.out)
    stage = args.stage
    if stage == "table":
        stage_table(path)
        return 0
    if stage == "env":
        from denoiser import environment
        _merge(path, "environment", environment())
        _merge(path, "command", COMMAND)
        return 0
    key = {"1.3b": "model_1.3b", "14b": "model_14b"}.get(stage, stage)
    from fastvideo3.kernels import fp8 as fp8k
    fp8k.ROW_REGISTER_WIDTH = getattr(args, "row_register_width", fp8k.ROW_REGISTER_WIDTH)
    scales = getattr(args, "attention_scales", "bound")
    accumulation = getattr(args, "fp8_accumulation", "fp32")
    t0 = time.perf_counter()
    try:
        if stage == "micro":
            res = stage_micro(lambda part: _merge(path, key, part))
        elif stage in ("1.3b", "14b"):
            def save(row):
                _merge(path, key, {**row, "partial": "the stage's variants did not finish"})
                _write_summary(path)
            res = stage_model(stage, args.quick, scales, accumulation, save)
        elif stage == "tiny":
            res = stage_tiny([int(s) for s in args.seeds.split(",")], scales, accumulation)
        else:
            raise SystemExit(f"unknown --stage {stage!r}")
    except Exception as e:  # noqa: BLE001 - recorded in the JSON; the other stages stand
        res = _err(e)
    res["stage_s"] = round(time.perf_counter() - t0, 1)
    if "error" in res and "summary" in _load(path).get(key, {}):  # keep the figures a failed variant followed
        res = {**_load(path)[key], "variant_error": res["error"], "stage_s": res["stage_s"]}
    _merge(path, key, res)
    _write_summary(path)
    print(json.dumps({k: v for k, v in res.items() if k not in ("profile_fp8",)}, default=str)[:3000], flush=True)
    return 0 if "error" not in res else 1
