#!/usr/bin/env bash
# One GPU call for the newer model families' denoiser forward against diffusers (random weights,
# real-size configs) and the cost of the Wan2.2 MoE switch: bench/denoiser_models.py.
#
#   BUDGET_S=470 bash bench/gpu_run_models.sh        # from the repository root
#   MODELS=wan2.1-i2v-14b JSON=denoiser_models_i2v_h200.json BUDGET_S=560 bash bench/gpu_run_models.sh   # Wan2.1 I2V
#
# diffusers (the baseline) comes from .wheels/ (git-ignored; carry it), FlashAttention-3 too when
# its wheel imports. Results go to $OUT (default out/gpu_models): the JSON, its log, gpu.txt.
set -uo pipefail
OUT=${OUT:-out/gpu_models}
BUDGET_S=${BUDGET_S:-470}
MODELS=${MODELS:-wan2.2-ti2v-5b,wan2.2-a14b}
JSON=${JSON:-denoiser_models_h200.json}
mkdir -p "$OUT"
source bench/gpu_env.sh
shopt -s nullglob
wheels=(.wheels/diffusers-*.whl)
shopt -u nullglob
install_site "wheels: diffusers not installed from .wheels/" "${wheels[@]}"
install_fa3 "" .wheels/fa3_fwd-*.whl
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
# each row and the switch stage get 150 s; the whole run stops before the budget, JSON kept
timeout $((BUDGET_S - SECONDS - 10)) python3 bench/denoiser.py --models "$MODELS" --quick \
  --stage-timeout "${STAGE_TIMEOUT:-150}" \
  --out "$OUT/$JSON" 2>&1 | tee "$OUT/${JSON%.json}.log"
echo "rc=${PIPESTATUS[0]} at ${SECONDS}s"
