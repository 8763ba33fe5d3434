#!/usr/bin/env bash
# Parallel denoiser benchmarks (bench/parallel.py) as one command.
#
#   bash bench/gpu_parallel.sh overhead    # one H200: plan code at degree 1 vs the plain path (< 4 min)
#   bash bench/gpu_parallel.sh scaling     # every GPU present: each plan that fits vs degree 1 (~8 min)
#
# Needs only torch (no extra wheels). Results and logs go to $OUT (default out/parallel):
# parallel_overhead_h200.json or parallel_<gpus>xh200.json, and a .log of the run.
set -uo pipefail
OUT=${OUT:-out/parallel}
MODE=${1:-overhead}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
case "$MODE" in
  overhead)
    timeout 220 python3 bench/parallel.py --overhead --warmup 2 --iters 10 \
      --out "$OUT/parallel_overhead_h200.json" 2>&1 | tee "$OUT/parallel_overhead.log"
    ;;
  scaling)
    gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
    timeout 500 python3 bench/parallel.py --time-limit "${TIME_LIMIT_S:-420}" --warmup 1 --iters 3 \
      --out "$OUT/parallel_${gpus}xh200.json" 2>&1 | tee "$OUT/parallel_scaling.log"
    ;;
  *) echo "usage: bash bench/gpu_parallel.sh overhead|scaling" >&2; exit 2 ;;
esac
