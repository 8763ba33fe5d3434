"""What block caching costs beyond the blocks it runs: Wan2.1-1.3B (random weights, bf16) at
81x480x832 on one GPU, a forced reuse schedule versus the uncached forward.

    python bench/cache.py --device cuda            # writes bench/results/cache_h200.json
    python bench/cache.py --smoke                  # CPU, tiny model: checks the command runs

The forced schedule is a block interceptor (the seam every caching policy uses) that keeps the
first and last 30% of the blocks and reuses the middle 40% at every step after the
first, so each timed step runs 60% of the block evaluations. It runs through the same staged
forward as the policies (``fastvideo3.extend.runner``), with the per-request state and residual
in a RowView, on the fast DiT path, eagerly (no CUDA graph) like the uncached baseline here.
A step is one DiT forward of one sample (no CFG); the sampler update is the same in both and
left out. ``overhead_fraction`` = ms_per_step / ((1 - reuse_fraction) * ms_per_step_uncached) - 1.
A second measurement puts a reusing and a computing request in one batch of two.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from fastvideo3.extend.protocols import RowView  # noqa: E402
from fastvideo3.extend.runner import RowGroup, staged_forward  # noqa: E402
from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig  # noqa: E402

WAN_1_3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
                text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, rope_max_seq_len=1024)
SMOKE = dict(WAN_1_3B, num_attention_heads=2, attention_head_dim=24, text_dim=32, freq_dim=32, ffn_dim=64,
             num_layers=10, rope_max_seq_len=64)


class ForcedReuse:
    """Block interceptor with a fixed schedule: reuse the middle at every step but the first."""

    name = "forced"

    def __init__(self, front: int, back: int):
        self.front, self.back = front, back

    def split(self, num_blocks: int) -> tuple[int, int]:
        return self.front, self.back

    def reuse_middle(self, row: RowView, front_residual: torch.Tensor) -> bool:
        return "middle_residual" in row.tensors

    def middle_residual(self, row: RowView) -> torch.Tensor:
        return row.tensors["middle_residual"]

    def after_middle(self, row: RowView, residual: torch.Tensor) -> None:
        row.tensors["middle_residual"] = residual


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time(fn, steps: int, device: str) -> float:
    """Median milliseconds of ``fn()`` over ``steps`` calls."""
    times = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny model and shape (CPU check of the command)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per configuration")
    ap.add_argument("--reuse", type=float, default=0.4, help="fraction of blocks reused per step")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not 0.0 < args.reuse < 1.0:
        ap.error("--reuse must be in (0, 1)")
    if not 1 <= args.steps <= 100:
        ap.error("--steps must be in [1, 100]")
    dev = args.device
    cfg = WanDiTConfig(**(SMOKE if args.smoke else WAN_1_3B))
    frames, height, width = (9, 64, 96) if args.smoke else (81, 480, 832)
    text_len = 16 if args.smoke else 512
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(dev):
        dit = WanDiT(cfg).to(dtype).eval()
    from fastvideo3.models.wan.fast import FastWanDiT
    model = FastWanDiT(dit)  # the serving path (Triton kernels on CUDA, PyTorch ops on a CPU)
    n = cfg.num_layers
    middle = round(args.reuse * n)
    front = (n - middle) // 2
    back = n - middle - front
    reuse_fraction = middle / n
    latents = torch.randn(1, 16, (frames - 1) // 4 + 1, height // 8, width // 8, device=dev, dtype=dtype)
    text = torch.randn(1, text_len, cfg.text_dim, device=dev, dtype=dtype)
    t = torch.tensor([500.0], device=dev)

    with torch.no_grad():
        for _ in range(2):  # warm-up: kernels, autotuning, allocator
            model(latents, t, text)

        uncached = _time(lambda: model(latents, t, text), args.steps, dev)
        icpt, view = ForcedReuse(front, back), RowView(step=0, num_steps=args.steps + 1, state={})
        staged_forward(model, latents, t, text, [RowGroup([0], view, None, icpt)])  # computes; keeps the residual

        def cached_step():
            view.step += 1
            g = RowGroup([0], view, None, icpt)
            staged_forward(model, latents, t, text, [g])
            assert g.reused_middle and g.blocks_run == n - middle

        cached = _time(cached_step, args.steps, dev)
        # a batch of two requests: one reusing its middle, one computing everything
        lat2, text2, t2 = latents.repeat(2, 1, 1, 1, 1), text.repeat(2, 1, 1), t.repeat(2)
        uncached2 = _time(lambda: model(lat2, t2, text2), max(2, args.steps // 2), dev)

        def mixed_step():
            view.step += 1
            groups = [RowGroup([0], view, None, icpt), RowGroup([1])]
            staged_forward(model, lat2, t2, text2, groups)

        mixed = _time(mixed_step, max(2, args.steps // 2), dev)

    summary = {
        "policy": f"forced block reuse: blocks [{front}, {n - back}) of {n} reused every step",
        "reuse_fraction": round(reuse_fraction, 4),
        "ms_per_step": round(cached, 2),
        "ms_per_step_uncached": round(uncached, 2),
        "overhead_fraction": round(cached / ((1 - reuse_fraction) * uncached) - 1, 4),
    }
    out = {
        "summary": summary,
        "command": "python bench/cache.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "shape": {"frames": frames, "height": height, "width": width, "text_tokens": text_len,
                  "latent": list(latents.shape)},
        "model": {"layers": n, "inner_dim": cfg.inner_dim, "weights": "random (seed 0)", "dtype": str(dtype),
                  "path": type(model).__name__},
        "mixed_batch_of_2": {"ms_per_step": round(mixed, 2), "ms_per_step_uncached": round(uncached2, 2),
                             "expected_fraction": round(1 - reuse_fraction / 2, 4),
                             "measured_fraction": round(mixed / uncached2, 4)},
        "steps_timed": args.steps,
        "device": torch.cuda.get_device_name(0) if dev.startswith("cuda") else platform.processor() or "cpu",
        "torch": torch.__version__,
    }
    path = Path(args.out or ("bench/results/cache_smoke_cpu.json" if args.smoke else "bench/results/cache_h200.json"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
