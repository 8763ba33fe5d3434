#!/usr/bin/env bash
# One GPU call for the serving and end-to-end benchmarks: bench/serving.py (16 concurrent
# requests through the real fleet, step batching vs request-at-a-time) and
# bench/e2e_generation.py (a whole 50-step generation, ours vs diffusers' WanPipeline).
#
#   BUDGET_S=260 bash bench/gpu_run2.sh        # from the repository root
#
# BUDGET_S bounds the whole script: each part gets a time limit carved out of what is left and
# writes its JSON as it goes, so what finished is always kept. Wheels missing from the machine's
# image come from .wheels/ (git-ignored; carry it): diffusers (the baseline), .wheels/fleet/ (what
# the gRPC fleet needs: grpcio, grpcio-health-checking, grpcio-reflection, protobuf, pydantic and
# its helpers) and, when it imports, fa3_fwd (FlashAttention-3 forward). The random Wan2.1-1.3B
# checkpoint is written to local disk under WORK (default: a new temporary directory).
# Results and logs go to $OUT (default out/gpu2): at most 8 files.
set -uo pipefail
OUT=${OUT:-out/gpu2}
BUDGET_S=${BUDGET_S:-260}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$OUT"
source bench/gpu_env.sh
left() { echo $((BUDGET_S - SECONDS)); }
min() { if (($1 < $2)); then echo "$1"; else echo "$2"; fi; }
max() { if (($1 > $2)); then echo "$1"; else echo "$2"; fi; }
shopt -s nullglob
wheels=(.wheels/diffusers-*.whl .wheels/fleet/*.whl)
shopt -u nullglob
install_site "wheels: not installed (diffusers or the fleet's packages will be missing)" "${wheels[@]}"
install_fa3 "" .wheels/fa3_fwd-*.whl
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import grpc, google.protobuf, pydantic, diffusers; print('grpc', grpc.__version__, 'protobuf',
  google.protobuf.__version__, 'pydantic', pydantic.__version__, 'diffusers', diffusers.__version__)" | tee -a "$OUT/gpu.txt"

MODEL="$WORK/wan-1.3b"
timeout "$(min 150 "$(left)")" python3 bench/e2e_generation.py --build-dir "$MODEL" --preset 1.3b 2>&1 \
  | grep -v "Writing model shards" | tee "$OUT/build.log"
echo "build done at ${SECONDS}s"

# serving: at most 130 s, and leave the end-to-end run at least 90 s
limit=$(max 40 "$(min 130 $(($(left) - 90)))")
timeout $((limit + 20)) python3 bench/serving.py --card "$MODEL" --device cuda --mode auto --time-limit "$limit" \
  --log-dir "$WORK/fleet-logs" --out "$OUT/serving_h200.json" >"$OUT/serving.log" 2>&1
echo "serving rc=$? at ${SECONDS}s"; tail -n 30 "$OUT/serving.log"
tail -n 60 "$WORK"/fleet-logs/*.log >"$OUT/fleet_logs.txt" 2>/dev/null

# end to end: 81 frames when the warm-up forwards predict it fits in what is left, else 33
limit=$(max 30 $(($(left) - 10)))
timeout $((limit + 8)) python3 bench/e2e_generation.py --model "$MODEL" --device cuda --frames 81 \
  --fallback-frames 33 --time-limit "$limit" --out "$OUT/e2e_generation_h200.json" 2>&1 \
  | grep -v "Loading" >"$OUT/e2e.log"
echo "e2e rc=${PIPESTATUS[0]} at ${SECONDS}s"; tail -n 40 "$OUT/e2e.log"
