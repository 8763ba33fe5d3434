#!/usr/bin/env bash
# One GPU call for the FP8 denoiser benchmark: the CUDA tests of the FP8 kernels, then
# `bench/denoiser.py --precision fp8`, stage by stage, each with its own time limit, all merged
# into $OUT/denoiser_fp8_h200.json (what finished is always kept); the table is printed last.
#
#   bash bench/gpu_run_fp8.sh        # from the repository root; carry .wheels (git-ignored)
#   SCALES=smooth_k ACCUM=fast ROWW=4096 bash bench/gpu_run_fp8.sh
#     # FP8 attention's Q/K scales, GEMM accumulation, widest row the row quantizer reads once
#   STAGES="1.3b" TESTS=0 NAME=denoiser_fp8_1.3b_h200 bash bench/gpu_run_fp8.sh
#     # only some stages (of micro 1.3b tiny 14b), without the CUDA tests, into $OUT/$NAME.json
#
# Each stage has its own limit and all of them end within BUDGET seconds (360) of the start, the
# table within 15 more: one call takes under six minutes (a stage cut short keeps its main figures).
#
# Wheels the image lacks come from .wheels/ (and .wheels_fa3/, .wheels_diffusers/ if present):
# pydantic and its helpers (cards), and fa3_fwd (FlashAttention-3 forward, whose FP8 path the FP8
# self-attention uses) when it imports. Without fa3_fwd, attention stays bf16 (and is slower).
set -uo pipefail
OUT=${OUT:-out/gpu_fp8}
mkdir -p "$OUT"
JSON="$OUT/${NAME:-denoiser_fp8_h200}.json"
rm -f "$JSON"
source bench/gpu_env.sh
shopt -s nullglob
wheels=()
for w in .wheels/*.whl .wheels/fleet/*.whl .wheels_min/*.whl .wheels_diffusers/*.whl; do [[ $w == *fa3_fwd* || $w == *nixl* ]] || wheels+=("$w"); done
shopt -u nullglob
install_site "" "${wheels[@]}"
fa3=$(ls .wheels/fa3_fwd-*.whl .wheels_fa3/fa3_fwd-*.whl 2>/dev/null | head -n 1)
install_fa3 "(FP8 attention falls back to bf16)" ${fa3:+"$fa3"}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

if [[ ${TESTS:-1} != 0 ]]; then
  timeout "${TEST_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider --noconftest tests/unit/test_fp8_cuda.py \
    >"$OUT/tests.log" 2>&1
  echo "tests rc=$?"; tail -n 15 "$OUT/tests.log"
fi

B="python3 bench/denoiser.py --precision fp8 --out $JSON --attention-scales ${SCALES:-bound} --fp8-accumulation ${ACCUM:-fp32}"
B="$B --row-register-width ${ROWW:-16384}"
BUDGET=${BUDGET:-360}  # seconds from the script's start by which the last stage ends (the table follows)
STAGES=" ${STAGES:-micro 1.3b tiny 14b} "
stage() {  # stage <limit_s> <name> [flags]
  local limit=$1 name=$2; shift 2
  [[ $name == env || $STAGES == *" $name "* ]] || return 0
  local left=$((BUDGET - SECONDS))
  ((left < limit)) && limit=$left
  if ((limit < 10)); then echo "stage $name skipped: the ${BUDGET}s budget is spent"; return; fi
  timeout -k 5 "$limit" $B --stage "$name" "$@" >>"$OUT/bench.log" 2>&1
  echo "stage $name rc=$? at ${SECONDS}s"
}
stage 15 env
stage 45 micro
grep -A12 "^FP8 attention, one layer" "$OUT/bench.log"  # the micro-check's table, as soon as it is in
stage 110 1.3b
stage 60 tiny
stage 100 14b --quick  # last: the budget left (a cut keeps its bf16/FP8 figures once they are in)
timeout 15 $B --stage table 2>&1 | tee -a "$OUT/bench.log"
