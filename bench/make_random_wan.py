"""Write a random-weight Wan2.1 T2V checkpoint directory (diffusers layout), offline.

    python bench/make_random_wan.py --preset 1.3b --out /path/to/wan-1.3b-random
    python bench/make_random_wan.py --preset 14b --out DIR --transformer-only

The real-size presets have Wan2.1's exact transformer shapes with random bf16 weights, written
shard by shard (peak memory about one shard), so loaders and kernels can be benchmarked without
downloading the real checkpoint. Prints a JSON summary of what was written.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

try:
    import fastvideo3  # noqa: F401
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from fastvideo3.testing.synthetic_wan import DEFAULT_MAX_SHARD_SIZE, PRESETS, build_wan_dir

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--out", required=True, type=Path, help="directory to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype", choices=sorted(_DTYPES), default=None,
        help="transformer / text-encoder weight dtype (default: float32 for tiny, else bfloat16)",
    )
    parser.add_argument("--scheduler", choices=["unipc", "euler"], default="unipc")
    parser.add_argument("--flow-shift", type=float, default=3.0)
    parser.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE)
    parser.add_argument("--transformer-only", action="store_true",
                        help="write only the transformer and scheduler")
    parser.add_argument("--no-text-encoder", action="store_true")
    parser.add_argument("--no-vae", action="store_true")
    args = parser.parse_args(argv)

    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out} exists and is not empty")
    start = time.perf_counter()
    root = build_wan_dir(
        args.out,
        preset=args.preset,
        seed=args.seed,
        dtype=_DTYPES[args.dtype] if args.dtype else None,
        scheduler=args.scheduler,
        flow_shift=args.flow_shift,
        max_shard_size=args.max_shard_size,
        transformer_only=args.transformer_only,
        text_encoder=not args.no_text_encoder,
        vae=not args.no_vae,
    )
    files = {
        f.relative_to(root).as_posix(): f.stat().st_size for f in sorted(root.rglob("*")) if f.is_file()
    }
    summary = {
        "path": str(root),
        "preset": args.preset,
        "seed": args.seed,
        "seconds": round(time.perf_counter() - start, 2),
        "total_bytes": sum(files.values()),
        "files": files,
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
