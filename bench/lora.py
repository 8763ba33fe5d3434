"""Cost of mixing LoRA adapters in one DiT forward, on one CUDA GPU.

    python bench/lora.py --out bench/results/lora_h200.json            # H200: 1.3B, two shapes
    python bench/lora.py --smoke --out out/lora_smoke.json              # CPU: tiny model, seconds
    TRITON_INTERPRET=1 python bench/lora.py --smoke --kernel triton --out out/lora_smoke.json

Wan2.1-1.3B with random bf16 weights drawn on the GPU (no checkpoint on disk), run through the
fast path the denoiser pool uses (:class:`FastWanDiT`, eager). Per shape (17x256x256 and
81x480x832, 8 rows) it times one forward of the 8 rows with no adapter, then the same batch with
4 different rank-32 adapters on every adapted layer (rows A, B, C, D, A, B, C, D), the per-row
delta running through the segmented low-rank Triton kernel
(:mod:`fastvideo3.kernels.lora`) from the pool's :class:`AdapterStore`. A third forward with the
store switched to the plain PyTorch path checks the kernel's output (relative error).
Timings are medians of CUDA-event timed forwards after a warm-up. The JSON is rewritten after
every shape, so a run cut short keeps what finished; ``--time-limit`` skips shapes that would
start past it.
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
from fastvideo3.models.wan.lora import layer_shapes, parse_lora
from fastvideo3.models.wan.synthetic import WAN_1_3B_TRANSFORMER
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


def timed(fn, warm: int, iters: int, cuda: bool) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(iters):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
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
                         impl=None if args.kernel == "auto" else args.kernel)
    fast.lora = store  # as the denoiser pool wires it
    ids = [f"adapter-{i}" for i in range(args.adapters)]
    refs = []
    for i, aid in enumerate(ids):
        info = store.load(random_adapter(cfg, args.rank, i, aid))
        refs.append((aid, info["version"], 1.0))
    rows = [[refs[r % args.adapters]] for r in range(args.rows)]
    store.acquire("bench", [r[0] for r in rows[:args.adapters]])

    result = {
        "what": "one DiT forward of a batch whose rows use different LoRA adapters vs the same batch without",
        "command": " ".join(["python", "bench/lora.py", *sys.argv[1:]]),
        "model": "tiny (smoke)" if args.smoke else "Wan2.1-1.3B (random bf16 weights)",
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__, "kernel": store.impl, "dit_path": "fast (eager)",
        "adapted_layers_per_block": len(layer_shapes(cfg)) // cfg.num_layers,
        "rows": args.rows, "rank": args.rank, "adapters_in_batch": args.adapters, "shapes": {},
    }
    summary = {"rank": args.rank, "adapters_in_batch": args.adapters, "ms_per_step": {},
               "ms_per_step_no_lora": {}, "overhead_fraction": {}}

    def write():
        result["summary"] = summary
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

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
        print(f"{key}: {row['ms_per_step_no_lora']:.2f} ms -> {row['ms_per_step']:.2f} ms with {args.adapters} "
              f"adapters ({100 * row['overhead_fraction']:+.1f}%), kernel rel err "
              f"{row['kernel_vs_torch_rel_error']:.2e}", flush=True)
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

    def mixed():
        with store.batch(rows):
            return fast(x, t, text)

    base = timed(plain, warm, iters, cuda)
    lora = timed(mixed, warm, iters, cuda)
    # the kernel's output against the plain PyTorch path on the same batch
    want_base = plain().float()
    got = mixed().float()
    impl, store.impl = store.impl, "torch"
    want = mixed().float()
    store.impl = impl
    rel = float((got - want).norm() / want.norm())
    effect = float((want - want_base).norm() / want_base.norm())
    ms, ms0 = median(lora), median(base)
    row = {"ms_per_step": round(ms, 3), "ms_per_step_no_lora": round(ms0, 3),
           "overhead_fraction": round(ms / ms0 - 1.0, 4), "timings_ms": [round(v, 3) for v in lora],
           "timings_no_lora_ms": [round(v, 3) for v in base],
           "kernel_vs_torch_rel_error": rel, "lora_effect_rel": effect,
           "tokens_per_row": int(x.shape[2] * x.shape[3] * x.shape[4] // 4)}
    if cuda:
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


if __name__ == "__main__":
    main()
