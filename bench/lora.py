"""Cost of mixing LoRA adapters in one DiT forward, on one CUDA GPU.

    python bench/lora.py --out bench/results/lora_h200.json            # H200: 1.3B, two shapes
    python bench/lora.py --smoke --out out/lora_smoke.json              # CPU: tiny model, seconds
    TRITON_INTERPRET=1 python bench/lora.py --smoke --kernel triton --out out/lora_smoke.json

Wan2.1-1.3B with random bf16 weights drawn on the GPU (no checkpoint on disk), run through the
fast path the denoiser pool uses (:class:`FastWanDiT`, eager on both sides). A denoise step is
what the pool runs for a batch under the card's default CFG policy (``batched``): one forward of
every request's cond and uncond rows, a request's two rows next to each other with its adapter.
8 rows are 4 requests with 4 different rank-32 adapters (rows A, A, B, B, C, C, D, D) on every
adapted layer, against the same 8 rows with no adapter. The per-row delta runs as the pool's
:class:`AdapterStore` wires it (its layer groups; the Triton kernels of
:mod:`fastvideo3.kernels.lora_grouped` and :mod:`fastvideo3.kernels.lora_norm`); the same batch
is also timed through the previous path (``store.grouped = False``: one one-pass launch of
:mod:`fastvideo3.kernels.lora` per layer), an extra field outside the summary. Forwards with
the store switched to the plain PyTorch path check both kernels' outputs (relative error).
Timings are medians of CUDA-event timed forwards after a warm-up, the three variants
interleaved forward by forward. The JSON is rewritten after every shape, so a run cut short
keeps what finished; ``--time-limit`` skips shapes that would start past it.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

try:
    import fastvideo3  # noqa: F401
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig
from fastvideo3.models.wan.fast import FastWanDiT
from fastvideo3.models.wan.lora import layer_shapes, lora_groups, parse_lora
from fastvideo3.testing.synthetic_wan import WAN_1_3B_TRANSFORMER
from fastvideo3.runtime.adapters import AdapterStore

TEXT_LEN = 512
TINY = dict(WAN_1_3B_TRANSFORMER, num_attention_heads=2, attention_head_dim=16, ffn_dim=64, text_dim=32,
            freq_dim=16, num_layers=2, rope_max_seq_len=64)


def build_model(config: dict, device: str, dtype: torch.dtype) -> WanDiT:
    cfg = WanDiTConfig.from_dict(config)
    torch.manual_seed(0)
    with torch.device(device):
        model = WanDiT(cfg)
    for name, p in model.named_parameters():  # what the loader keeps fp32 stays fp32
        keep = name.endswith("scale_shift_table") or ".time_embedder." in name or ".norm2." in name
        p.data = p.data.float() if keep else p.data.to(dtype)
    return model.eval().requires_grad_(False)


def random_adapter(cfg, rank: int, seed: int, aid: str):
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, (k_in, k_out) in layer_shapes(cfg).items():
        sd[f"transformer.{name}.lora_A.weight"] = torch.randn(rank, k_in, generator=g) * k_in ** -0.5
        sd[f"transformer.{name}.lora_B.weight"] = torch.randn(k_out, rank, generator=g) * 0.01
    return parse_lora(sd, cfg, aid)


def inputs(config: dict, frames: int, height: int, width: int, rows: int, device: str, dtype: torch.dtype):
    g = torch.Generator(device=device).manual_seed(1)
    lat_f = 1 + (frames - 1) // 4
    x = torch.randn(rows, config["in_channels"], lat_f, height // 8, width // 8, generator=g, device=device)
    t = torch.rand(rows, generator=g, device=device) * 1000
    text = torch.randn(rows, TEXT_LEN, config["text_dim"], generator=g, device=device)
    return x.to(dtype), t, text.to(dtype)


def _once(fn, cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def timed(fns: dict, warm: int, iters: int, cuda: bool) -> dict[str, list[float]]:
    """Each variant ``warm`` times, then ``iters`` rounds of one timed forward per variant."""
    for fn in fns.values():
        for _ in range(warm):
            fn()
    out = {k: [] for k in fns}
    for _ in range(iters):
        for k, fn in fns.items():
            out[k].append(_once(fn, cuda))
    return out


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU (checks the script, not speed)")
    ap.add_argument("--shapes", default=None, help="FxHxW list (default 17x256x256,81x480x832; smoke 5x32x32)")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--kernel", default="auto", choices=("auto", "triton", "torch"),
                    help="the per-row delta's implementation (auto: Triton on CUDA; triton on a CPU needs "
                         "TRITON_INTERPRET=1)")
    ap.add_argument("--time-limit", type=float, default=170.0, help="start no shape after this many seconds")
    ap.add_argument("--variants", action="store_true",
                    help="also time the grouped path with its GEMM widening and/or fused norm switched off")
    ap.add_argument("--no-widen", action="store_true", help="the measured LoRA path without GEMM widening")
    ap.add_argument("--no-fused-norm", action="store_true", help="the measured LoRA path without the fused norm")
    ap.add_argument("--profile", action="store_true",
                    help="also record the GPU kernels of one forward with and without adapters, per shape")
    args = ap.parse_args()
    t_start = time.monotonic()
    cuda = not args.smoke
    if cuda and not torch.cuda.is_available():
        sys.exit("bench/lora.py needs a CUDA device (or --smoke)")
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    config = TINY if args.smoke else WAN_1_3B_TRANSFORMER
    shapes = args.shapes or ("5x32x32" if args.smoke else "17x256x256,81x480x832")
    shapes = [tuple(int(v) for v in s.split("x")) for s in shapes.split(",")]
    if not 1 <= args.adapters <= args.rows:
        sys.exit("--adapters must be in [1, --rows]")

    model = build_model(config, device, dtype)
    fast = FastWanDiT(model)
    cfg = model.cfg
    store = AdapterStore(layer_shapes(cfg), device, dtype, slots=max(8, args.adapters), max_rank=max(16, args.rank),
                         impl=None if args.kernel == "auto" else args.kernel, groups=lora_groups(cfg))
    fast.lora = store  # as the denoiser pool wires it
    store.widen, store.fuse_norm = not args.no_widen, not args.no_fused_norm
    ids = [f"adapter-{i}" for i in range(args.adapters)]
    refs = []
    for i, aid in enumerate(ids):
        info = store.load(random_adapter(cfg, args.rank, i, aid))
        refs.append((aid, info["version"], 1.0))
    if args.rows % 2:
        sys.exit("--rows must be even: each request has a cond and an uncond row (batched CFG)")
    # request q = row // 2 (its cond and uncond rows, as the pool orders them) uses adapter q % adapters
    rows = [[refs[(r // 2) % args.adapters]] for r in range(args.rows)]
    if len({r[0][0] for r in rows}) != args.adapters:
        sys.exit("--adapters must be at most --rows / 2 (one adapter per request)")
    store.acquire("bench", refs)

    result = {
        "what": "one DiT forward of a batch whose rows use different LoRA adapters vs the same batch without",
        "command": " ".join(["python", "bench/lora.py", *sys.argv[1:]]),
        "model": "tiny (smoke)" if args.smoke else "Wan2.1-1.3B (random bf16 weights)",
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__, "kernel": store.impl, "dit_path": "fast (eager)",
        "step": "one DiT forward of every request's cond and uncond rows (CFG policy 'batched', the card default)",
        "adapted_layers_per_block": len(layer_shapes(cfg)) // cfg.num_layers,
        "rows": args.rows, "requests": args.rows // 2, "row_adapters": [r[0][0] for r in rows],
        "rank": args.rank, "adapters_in_batch": args.adapters,
        "lora_path": "grouped: QKV and all cross K/V as one shrink + one expand; the expand inside add_norm for "
                     "the layers feeding it; widened GEMMs where they pay "
                     "(fastvideo3.kernels.lora_grouped, lora_norm); old_path: one one-pass launch per layer",
        "shapes": {},
    }
    summary = {"rank": args.rank, "adapters_in_batch": args.adapters, "ms_per_step": {},
               "ms_per_step_no_lora": {}, "overhead_fraction": {}}

    def write():
        result["summary"] = summary
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

    print(f"{'shape':>12} | {'no LoRA':>9} | {'LoRA (ms, overhead)':>17} | {'old path':>16} | rel err new/old",
          flush=True)
    for frames, height, width in shapes:
        key = f"{frames}x{height}x{width}"
        if time.monotonic() - t_start > args.time_limit:
            result["shapes"][key] = {"skipped": "time limit"}
            write()
            continue
        try:
            row = run_shape(args, config, fast, store, rows, frames, height, width, device, dtype, cuda)
        except Exception as e:  # noqa: BLE001 - keep the other shape's numbers
            result["shapes"][key] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{key}: failed: {type(e).__name__}: {e}", flush=True)
            write()
            continue
        result["shapes"][key] = row
        summary["ms_per_step"][key] = row["ms_per_step"]
        summary["ms_per_step_no_lora"][key] = row["ms_per_step_no_lora"]
        summary["overhead_fraction"][key] = row["overhead_fraction"]
        print(f"{key:>12} | {row['ms_per_step_no_lora']:9.2f} | {row['ms_per_step']:9.2f} "
              f"{100 * row['overhead_fraction']:+6.1f}% | {row['ms_per_step_old_path']:9.2f} "
              f"{100 * row['overhead_fraction_old_path']:+6.1f}% | {row['kernel_vs_torch_rel_error']:.1e} "
              f"{row['old_path_vs_torch_rel_error']:.1e}", flush=True)
        write()
        if cuda:
            torch.cuda.empty_cache()
    result["seconds"] = round(time.monotonic() - t_start, 1)
    write()


def run_shape(args, config, fast, store, rows, frames, height, width, device, dtype, cuda) -> dict:
    """One shape: timings without and with the adapters, and the kernel's check."""
    x, t, text = inputs(config, frames, height, width, args.rows, device, dtype)
    big = frames * height * width > 17 * 256 * 256
    warm, iters = (1, 3) if big else (2, 10)
    if args.smoke:
        warm, iters = 1, 2

    def plain():
        return fast(x, t, text)

    def mixed(grouped: bool = True, widen: bool = True, fuse_norm: bool = True):
        store.grouped, store.widen, store.fuse_norm = grouped, widen, fuse_norm
        try:
            with store.batch(rows):
                return fast(x, t, text)
        finally:
            store.grouped, store.widen, store.fuse_norm = True, defaults[0], defaults[1]

    defaults = (store.widen, store.fuse_norm)
    fns = {"base": plain, "lora": lambda: mixed(widen=defaults[0], fuse_norm=defaults[1]),
           "old": lambda: mixed(False)}
    if args.variants:  # the grouped path with each of its fusions off, timed in the same loop
        fns.update({"no_widen": lambda: mixed(widen=False, fuse_norm=defaults[1]),
                    "no_fused_norm": lambda: mixed(widen=defaults[0], fuse_norm=False),
                    "two_pass_only": lambda: mixed(widen=False, fuse_norm=False)})
    runs = timed(fns, warm, iters, cuda)
    base, lora, old = runs["base"], runs["lora"], runs["old"]
    # both kernels' outputs against the plain PyTorch path on the same batch
    want_base = plain().float()
    got, got_old = mixed().float(), mixed(False).float()
    impl, store.impl = store.impl, "torch"
    want = mixed().float()
    store.impl = impl
    rel = float((got - want).norm() / want.norm())
    rel_old = float((got_old - want).norm() / want.norm())
    effect = float((want - want_base).norm() / want_base.norm())
    ms, ms0, ms_old = median(lora), median(base), median(old)
    row = {"ms_per_step": round(ms, 3), "ms_per_step_no_lora": round(ms0, 3),
           "overhead_fraction": round(ms / ms0 - 1.0, 4), "timings_ms": [round(v, 3) for v in lora],
           "timings_no_lora_ms": [round(v, 3) for v in base],
           "ms_per_step_old_path": round(ms_old, 3), "overhead_fraction_old_path": round(ms_old / ms0 - 1.0, 4),
           "timings_old_path_ms": [round(v, 3) for v in old],
           "kernel_vs_torch_rel_error": rel, "old_path_vs_torch_rel_error": rel_old, "lora_effect_rel": effect,
           "tokens_per_row": int(x.shape[2] * x.shape[3] * x.shape[4] // 4)}
    if cuda:
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    for name in ("no_widen", "no_fused_norm", "two_pass_only"):
        if name in runs:
            row.setdefault("variants_ms", {})[name] = round(median(runs[name]), 3)
            row.setdefault("variants_overhead_fraction", {})[name] = round(median(runs[name]) / ms0 - 1.0, 4)
    if cuda and args.profile:
        row["profile"] = {"no_lora": kernel_table(plain), "lora": kernel_table(mixed)}
    return row


def kernel_table(fn, top: int = 25) -> dict:
    """GPU kernels of one call of ``fn``: total device ms and the costliest kernels (ms, count)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        dev = getattr(ev, "self_device_time_total", None)  # self: an op's kernels count once
        if dev is None:
            dev = getattr(ev, "self_cuda_time_total", 0)
        if dev:
            rows.append((dev / 1e3, ev.count, ev.key[:120]))
    rows.sort(reverse=True)
    return {"device_ms": round(sum(r[0] for r in rows), 3),
            "kernels": [{"ms": round(ms, 3), "count": n, "name": name} for ms, n, name in rows[:top]]}


if __name__ == "__main__":
    main()
