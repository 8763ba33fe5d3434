"""Cost of mixing LoRA adapters in one DiT forward, on one CUDA GPU.

    python bench/lora.py --out bench/results/lora_h100.json --graphs both --eager-shapes 81x480x832 --variants --layers --profile
    bash bench/gpu_call.sh lora                                         # the same, on the H200 call
    python bench/lora.py --smoke --out out/lora_smoke.json              # CPU: tiny model, seconds
    TRITON_INTERPRET=1 python bench/lora.py --smoke --kernel triton --out out/lora_smoke.json

Wan2.1-1.3B with random bf16 weights drawn on the GPU (no checkpoint on disk), run through the
fast path the denoiser pool uses (:class:`FastWanDiT`). A denoise step is what the pool runs for
a batch under the card's default CFG policy (``batched``): one forward of every request's cond
and uncond rows, a request's two rows next to each other with its adapter. 8 rows are 4
requests with 4 different rank-32 adapters (rows A, A, B, B, C, C, D, D) on every adapted
layer, against the same 8 rows with no adapter. The adapters run as the pool's
:class:`AdapterStore` wires them: as merged segments where they apply (each request's adapter
folded into a weight copy once, its rows one GEMM per layer on it), else the per-row low-rank
kernels (variant ``lowrank``). The summary reports the eager figures where merged segments ran
(the serving path runs adapter batches eagerly, and a graph captured in the store's static mode
takes the low-rank path), the graph figures otherwise.

``--graphs``: each forward is also (``both``) or only (``on``) timed as a CUDA-graph replay:
one graph with and one without adapters, captured inside the batch (the row->slot table a
static device buffer, the adapter weights the static slot pool), and replayed once more with
the requests reversed to check that one graph serves another assignment. The summary reports
the graph figures where the capture worked (``summary_mode`` says which, per shape; a capture
failure is recorded as ``graph_error`` and the eager figures are reported). Other paths are
timed in the same loop (``variants_ms``: ``prev``, ``old`` and, with ``--variants``, each fusion
switched off); ``--layers`` times block 0's layers one by one; ``--profile`` records one
forward's GPU kernels. Forwards with the store switched to the plain PyTorch path check every
path's output (relative error). Timings are medians of CUDA-event timed forwards after a
warm-up, the variants interleaved forward by forward. The JSON is rewritten after every shape,
so a run cut short keeps what finished; ``--time-limit`` skips shapes that would start past it.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from contextlib import contextmanager
from pathlib import Path

try:
    import fastvideo3  # noqa: F401
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from timing import cuda_ms, cuda_profile, wall_ms  # the sibling module in bench/

from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig
from fastvideo3.models.wan.fast import FastWanDiT
from fastvideo3.models.wan.lora import layer_shapes, lora_groups, parse_lora
from fastvideo3.testing.synthetic_wan import WAN_1_3B_TRANSFORMER
from fastvideo3.runtime.pool.adapters import AdapterStore

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
        return cuda_ms(fn)
    return wall_ms(fn)


def _mode_fields(mode: str, ms: float, ms0: float, lora_runs: list[float], base_runs: list[float]) -> dict:
    """A row's step times with and without LoRA in one mode (eager or graphs), their overhead and
    the timings behind them."""
    return {f"ms_per_step_{mode}": round(ms, 3), f"ms_per_step_no_lora_{mode}": round(ms0, 3),
            f"overhead_fraction_{mode}": round(ms / ms0 - 1.0, 4),
            f"timings_{mode}_ms": [round(v, 3) for v in lora_runs],
            f"timings_no_lora_{mode}_ms": [round(v, 3) for v in base_runs]}


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
                    help="also time the path with its split-K, GEMM widening and/or fused norm switched off")
    ap.add_argument("--graphs", default="both", choices=("on", "off", "both"),
                    help="time whole forwards replayed as CUDA graphs (on), eagerly (off) or both; the summary "
                         "reports the graph figures where they were taken (the serving path captures its steps)")
    ap.add_argument("--eager-shapes", default="",
                    help="FxHxW list timed eagerly only whatever --graphs says (graphs of a long clip and the "
                         "merged weight sets may not fit an 80 GB card together)")
    ap.add_argument("--layers", action="store_true",
                    help="also time block 0's adapted layers one by one (GEMM, widened GEMM, shrink, expand)")
    ap.add_argument("--no-autotune", action="store_true", help="the shrink's fixed tiles instead of autotuning")
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
    if args.smoke:  # the tiny model's segments are short: take merged segments anyway, to check them
        store.merge_segments, store.min_segment_tokens = True, 0
    from fastvideo3.kernels import lora_shrink
    lora_shrink.set_autotune(not args.no_autotune)
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
        "lora_path": "merged segments where they apply (each adapter folded into a weight copy once, each "
                     "request's rows one GEMM per layer on its set: "
                     "fastvideo3.runtime.pool.adapter_segments); else, and in graphs (variant lowrank), "
                     "grouped: QKV and all cross K/V as one shrink + one expand; the expand inside the residual + "
                     "norm pass for the layers feeding it, that pass also running the next layer's shrink (the next "
                     "QKV's, or the widened input of cross-attention Q and FFN in); widened GEMMs where they pay; "
                     "split-K autotuned shrinks (fastvideo3.kernels.lora_shrink, lora_norm, lora_grouped)",
        "variants": {"lowrank": "the low-rank kernels alone (no merged segments)",
                     "segments_streams": "merged segments, each segment's GEMMs on a stream of its own",
                     "prev": "the low-rank path before the fused next shrink: widen kernels, one shrink per layer, the three-sweep norm pass",
                     "old": "one one-pass launch per layer", "no_split_k": "lora without split-K",
                     "no_widen": "lora with no widened GEMM", "no_fused_norm": "lora with add_norm unfused",
                     "two_pass_only": "no widening, no fused norm"},
        "graphs": args.graphs,
        "graph_note": "graphs: one CUDA graph per forward (with and without adapters), the row->slot plan a static "
                      "device buffer and the adapter weights the static slot pool, so a replay serves any "
                      "assignment whose slots are below the captured block count (checked with the requests "
                      "reversed); timed by replay",
        "shapes": {},
    }
    summary = {"rank": args.rank, "adapters_in_batch": args.adapters, "ms_per_step": {},
               "ms_per_step_no_lora": {}, "overhead_fraction": {}}
    #: which timing each summary figure is, by shape: "graphs" (CUDA-graph replay) or "eager"
    result["summary_mode"] = {}

    def write():
        result["shrink_autotune"] = lora_shrink.status()
        result["summary"] = summary
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

    print(f"{'shape':>12} | mode   | {'no LoRA':>9} | {'LoRA (ms, overhead)':>17} | rel err", flush=True)
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
        result["summary_mode"][key] = row["reported_mode"]
        for mode in ("eager", "graphs"):
            if f"ms_per_step_{mode}" in row:
                print(f"{key:>12} | {mode:6} | {row[f'ms_per_step_no_lora_{mode}']:9.2f} | "
                      f"{row[f'ms_per_step_{mode}']:9.2f} {100 * row[f'overhead_fraction_{mode}']:+6.1f}% | "
                      f"{row['kernel_vs_torch_rel_error']:.1e}", flush=True)
        for name, ms in row.get("variants_ms", {}).items():
            print(f"{'':>12} | {name:14} {ms:9.2f} {100 * row['variants_overhead_fraction'][name]:+6.1f}%", flush=True)
        write()
        if cuda:
            torch.cuda.empty_cache()
    result["seconds"] = round(time.monotonic() - t_start, 1)
    write()


#: the store's switches per timed variant (unnamed switches at their defaults)
LOW = {"merge_segments": False}
VARIANTS = {
    "lora": {},
    "lowrank": LOW,  # the low-rank kernels (the default where merged segments do not apply)
    "prev": {**LOW, "fuse_shrink": False, "split_k": False},  # widen kernels, 3-sweep norm
    "old": {**LOW, "grouped": False},  # one one-pass launch per layer
    "no_split_k": {**LOW, "split_k": False},
    "no_widen": {**LOW, "widen": False},
    "no_fused_norm": {**LOW, "fuse_norm": False},
    "two_pass_only": {**LOW, "widen": False, "fuse_norm": False},
    "segments_streams": {"segment_streams": True},
}
SWITCHES = ("grouped", "widen", "fuse_norm", "fuse_shrink", "split_k", "merge_segments", "segment_streams")


@contextmanager
def configured(store, name: str, rows):
    """The store switched to variant ``name`` (and its batch open, unless ``rows`` is None)."""
    saved = {k: getattr(store, k) for k in SWITCHES}
    for k, v in VARIANTS.get(name, {}).items():
        setattr(store, k, v)
    try:
        if rows is None:
            yield
        else:
            with store.batch(rows):
                yield
    finally:
        for k, v in saved.items():
            setattr(store, k, v)


def capture(fn, pool):
    """A CUDA graph of ``fn()`` (warmed up on a side stream first, as PyTorch asks) and its output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


def run_shape(args, config, fast, store, rows, frames, height, width, device, dtype, cuda) -> dict:
    """One shape: eager (and CUDA-graph) timings without and with the adapters, and the checks."""
    if f"{frames}x{height}x{width}" in args.eager_shapes.split(","):
        args = argparse.Namespace(**{**vars(args), "graphs": "off"})
    x, t, text = inputs(config, frames, height, width, args.rows, device, dtype)
    big = frames * height * width > 17 * 256 * 256
    warm, iters = (1, 2 if args.graphs == "both" else 3) if big else (2, 10)
    if args.smoke:
        warm, iters = 1, 2

    def plain():
        return fast(x, t, text)

    def mixed(name: str = "lora", which=None):
        with configured(store, name, which or rows):
            return fast(x, t, text)

    names = ["lora", "lowrank", "prev"] + ([] if big else ["old"])
    if args.variants:
        names += ["no_split_k", "no_widen", "no_fused_norm", "two_pass_only", "segments_streams"]
    row = {"tokens_per_row": int(x.shape[2] * x.shape[3] * x.shape[4] // 4)}
    fns = {}
    if args.graphs in ("off", "both"):
        fns["base"] = plain
        fns.update({n: (lambda n=n: mixed(n)) for n in names})
    graphs = {}
    if args.graphs in ("on", "both"):
        for n in ("base", "lora"):  # tune and compile outside the capture
            plain() if n == "base" else mixed(n)
        try:
            if not cuda:
                raise RuntimeError("CUDA graphs need a CUDA device")
            store.static = True
            pool = torch.cuda.graph_pool_handle()
            graphs["base"] = capture(plain, pool)
            with configured(store, "lora", rows):  # the plan is copied in outside the capture
                graphs["lora"] = capture(lambda: fast(x, t, text), pool)
            row["graph_blocks"] = store.blocks
            store.static = False  # captured; eager forwards may take merged segments again
            fns["base_graph"] = graphs["base"][0].replay
            fns["lora_graph"] = graphs["lora"][0].replay
        except Exception as e:  # noqa: BLE001 - the eager figures still stand
            row["graph_error"] = f"{type(e).__name__}: {e}"[:400]
            graphs.clear()
            print(f"  CUDA graphs failed, eager only: {row['graph_error']}", flush=True)
            if not fns:  # --graphs on: fall back to eager
                fns["base"] = plain
                fns.update({n: (lambda n=n: mixed(n)) for n in names})
    runs = timed(fns, warm, iters, cuda)
    med = {k: median(v) for k, v in runs.items()}
    eager = "base" in med
    if eager:
        ms, ms0 = med["lora"], med["base"]
        row.update(_mode_fields("eager", ms, ms0, runs["lora"], runs["base"]))
        row["variants_ms"] = {n: round(med[n], 3) for n in names}
        row["variants_overhead_fraction"] = {n: round(med[n] / ms0 - 1.0, 4) for n in names}
        # the fields earlier results carried
        row["ms_per_step_old_path"] = row["variants_ms"].get("old")
        row["overhead_fraction_old_path"] = row["variants_overhead_fraction"].get("old")
    if graphs:
        gms, gms0 = med["lora_graph"], med["base_graph"]
        row.update(_mode_fields("graphs", gms, gms0, runs["lora_graph"], runs["base_graph"]))
    # the default path: merged segments where they apply (eager only: a captured graph must serve any
    # assignment, so the store's static mode takes the low-rank path), else the low-rank kernels
    with configured(store, "lora", rows):
        plan = store.segments(fast, row["tokens_per_row"])
    row["default_path"] = "merged_segments" if plan is not None else "lowrank"
    row["merged_sets"] = store.merged_sets.describe()
    if plan is None:
        row["merged_segments_fallback"] = store.merged_sets.last_fallback
    # the serving path runs adapter batches eagerly (its captured graphs hold no adapters)
    mode = "graphs" if graphs and plan is None else "eager" if eager else "graphs"
    row["reported_mode"] = mode
    row["ms_per_step"] = row[f"ms_per_step_{mode}"]
    row["ms_per_step_no_lora"] = row[f"ms_per_step_no_lora_{mode}"]
    row["overhead_fraction"] = row[f"overhead_fraction_{mode}"]

    # every path's output against the plain PyTorch path on the same batch
    want_base = plain().float()
    with configured(store, "lowrank", rows):
        impl, store.impl = store.impl, "torch"
        try:
            want = fast(x, t, text).float()
        finally:
            store.impl = impl

    def rel(got):
        return float((got.float() - want).norm() / want.norm())

    row["kernel_vs_torch_rel_error"] = rel(mixed("lora"))
    row["lowrank_path_vs_torch_rel_error"] = rel(mixed("lowrank"))
    row["prev_path_vs_torch_rel_error"] = rel(mixed("prev"))
    if not big:
        row["old_path_vs_torch_rel_error"] = rel(mixed("old"))
    row["lora_effect_rel"] = float((want - want_base).norm() / want_base.norm())
    if graphs:
        graphs["lora"][0].replay()
        row["graph_vs_torch_rel_error"] = rel(graphs["lora"][1])
        # another assignment (requests reversed) through the same captured graph, against eager
        other = rows[::-1]
        with store.batch(other):
            graphs["lora"][0].replay()
            got = graphs["lora"][1].float().clone()
        ref = mixed("lowrank", other).float()  # the path the graph holds
        row["graph_other_assignment_vs_eager_rel_error"] = float((got - ref).norm() / ref.norm())
    if cuda:
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if cuda and args.profile and not big:
        row["profile"] = {"no_lora": kernel_table(plain), "lora": kernel_table(mixed),
                          "lowrank": kernel_table(lambda: mixed("lowrank"))}
    if cuda and args.layers and not big:
        try:
            row["layers"] = layer_costs(fast, store, rows, x.shape[0], row["tokens_per_row"], device, dtype)
        except Exception as e:  # noqa: BLE001
            row["layers"] = {"error": f"{type(e).__name__}: {e}"[:400]}
    graphs.clear()
    store.static = False
    return row


def op_ms(fn, reps: int = 20) -> float:
    """Device ms of one ``fn()``: ``reps`` calls in one CUDA graph (no launch gaps), median of 5."""
    try:
        graph, _ = capture(lambda: [fn() for _ in range(reps)], None)
        run = graph.replay
    except Exception:  # noqa: BLE001 - eager loop
        def run():
            for _ in range(reps):
                fn()
    return median([_once(run, True) for _ in range(5)]) / reps


def layer_costs(fast, store, rows, bsz: int, n: int, device, dtype) -> dict:
    """Block 0's adapted layers at this shape, one by one: the base GEMM, the GEMM widened by
    ``blocks * R`` inputs (its input made elsewhere), the shrink (split-K where chosen) and the
    expand, in device ms. Where ``widened - gemm`` < ``expand`` (+ the norm pass's cost of the
    widened input) widening pays."""
    import torch.nn.functional as F

    from fastvideo3.kernels.lora_grouped import lora_expand_, widen_pays
    from fastvideo3.kernels.lora_shrink import choose_split, lora_shrink_split
    blk, out = fast.blocks[0], {}
    layers = {"attn1.to_q": (blk.qkv_w[:blk.out_w.shape[0]], None), "attn1.to_out.0": (blk.out_w, None),
              "attn2.to_q": (blk.q2_w, None), "attn2.to_out.0": (blk.out2_w, None),
              "ffn.net.0.proj": (blk.ff1_w, fast._gelu_linear), "ffn.net.2": (blk.ff2_w, None)}
    with store.batch(rows):
        slots, scales = store._plan
        blocks = store.blocks
        for short, (w, gemm) in layers.items():
            name = f"blocks.0.{short}"
            k, o = store.shapes[name]
            x = torch.randn(bsz, n, k, device=device, dtype=dtype)
            bias = torch.zeros(o, device=device, dtype=dtype)
            lin = gemm or F.linear
            xw = torch.randn(bsz, n, k + blocks * store.max_rank, device=device, dtype=dtype)
            ww = torch.randn(o, k + blocks * store.max_rank, device=device, dtype=dtype)
            y = torch.randn(bsz, n, o, device=device, dtype=dtype)
            split = choose_split(n, bsz, 1, k)
            xa = lora_shrink_split(x, store.down[name], slots[0], scales[0])
            out[short] = {
                "k": k, "n": o, "gemm_ms": round(op_ms(lambda: lin(x, w, bias)), 4),
                "widened_gemm_ms": round(op_ms(lambda: lin(xw, ww, bias)), 4),
                "shrink_ms": round(op_ms(lambda: lora_shrink_split(x, store.down[name], slots[0], scales[0])), 4),
                "shrink_split_ms": round(op_ms(lambda: lora_shrink_split(x, store.down[name], slots[0], scales[0],
                                                                           split=split)), 4), "split": split,
                "expand_ms": round(op_ms(lambda: lora_expand_(xa, y, store.up[name], slots[0])), 4),
                "widen_pays_model": widen_pays(k, o, blocks * store.max_rank, x.element_size())}
    return out


def kernel_table(fn, top: int = 25) -> dict:
    """GPU kernels of one call of ``fn``: total device ms and the costliest kernels (ms, count)."""
    prof = cuda_profile(fn)
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
