#!/usr/bin/env bash
# One GPU call for bench/cache.py: Wan2.1-1.3B (random weights, bf16) at 81x480x832, a forced
# 40% block-reuse schedule versus the uncached forward. Needs only torch (+ triton) from the
# machine's image; no wheels. Results and the log go to $OUT (default out/gpu_cache): 3 files.
#
#   bash bench/gpu_cache.sh                     # from the repository root
set -uo pipefail
OUT=${OUT:-out/gpu_cache}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
timeout 170 python3 bench/cache.py --device cuda --steps 8 --out "$OUT/cache_h200.json" >"$OUT/cache.log" 2>&1
echo "cache rc=$? at ${SECONDS}s"; tail -n 40 "$OUT/cache.log"
