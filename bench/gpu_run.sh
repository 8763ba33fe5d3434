#!/usr/bin/env bash
# The one script for the GPU machine: the CUDA tests of the fast DiT, then the denoiser benchmark.
#
#   bash bench/gpu_run.sh [benchmark args...]      # from the repository root
#
# Wheels missing from the machine's image are installed from .wheels/ when that folder exists:
# diffusers (the baseline), and optionally fa3_fwd (FlashAttention-3 forward), which is used only
# if it imports cleanly in a separate process. Logs and the benchmark JSON go to $OUT (default
# out/gpu). Each stage has its own time limit, so what finished is always written.
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
install() {  # install <target> <wheels...>
  local target=$1; shift
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$target" "$@"
}
if compgen -G ".wheels/diffusers-*.whl" >/dev/null; then
  install /tmp/site .wheels/diffusers-*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
if compgen -G ".wheels/fa3_fwd-*.whl" >/dev/null && install /tmp/site_fa3 .wheels/fa3_fwd-*.whl \
  && PYTHONPATH="$PYTHONPATH:/tmp/site_fa3" timeout 60 python3 -c "import torch, fa3_fwd_interface" >"$OUT/fa3_probe.log" 2>&1; then
  export PYTHONPATH="$PYTHONPATH:/tmp/site_fa3"; echo "fa3_fwd: available"
else
  echo "fa3_fwd: not used"; tail -n 5 "$OUT/fa3_probe.log" 2>/dev/null
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

# CUDA tests (no repo conftest: it starts a redis server the GPU image lacks)
timeout "${TEST_TIMEOUT:-120}" python3 -m pytest -q -p no:cacheprovider --noconftest -n 4 \
  tests/unit/test_kernels_triton.py tests/unit/test_fast_dit.py tests/unit/test_export_cuda.py \
  >"$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -n 25 "$OUT/tests.log"

timeout "${BENCH_TIMEOUT:-440}" python3 bench/denoiser.py --out "$OUT/denoiser_h200.json" "$@" 2>&1 | tee "$OUT/bench.log"
echo "bench rc=${PIPESTATUS[0]}"
