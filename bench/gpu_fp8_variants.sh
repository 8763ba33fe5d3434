#!/usr/bin/env bash
# One GPU call that judges the FP8 kernel alternatives not yet the default, before the whole
# benchmark (bench/gpu_run_fp8.sh) is rerun with the winners: their CUDA tests against the
# defaults, the fused FFN-in GEMM's tile configurations and kernels (pointer, TMA, persistent TMA)
# alone, the QKV pass's formulations alone, then the 1.3B forward with the fastest FFN config as
# its main figure and each alternative flipped against it (bench/denoiser.py --precision fp8
# --stage 1.3b: the QKV pass read flat, V's scales bounded, the other FFN kernel, all together).
#
#   bash bench/gpu_fp8_variants.sh     # from the repository root; carry .wheels_min, .wheels_fa3
#
# Writes $OUT/fp8_gemm_probe.json, $OUT/fp8_kernels_probe.json, $OUT/denoiser_fp8_variants.json
# (what finished is always kept). Each step has its own limit; all end within BUDGET (480) seconds.
set -uo pipefail
OUT=${OUT:-out/gpu_fp8_variants}
mkdir -p "$OUT"
source bench/gpu_env.sh
shopt -s nullglob
wheels=()
for w in .wheels/*.whl .wheels_min/*.whl; do [[ $w == *fa3_fwd* || $w == *nixl* ]] || wheels+=("$w"); done
shopt -u nullglob
install_site "" "${wheels[@]}"
fa3=$(ls .wheels/fa3_fwd-*.whl .wheels_fa3/fa3_fwd-*.whl 2>/dev/null | head -n 1)
install_fa3 "(FP8 attention falls back to bf16)" ${fa3:+"$fa3"}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
BUDGET=${BUDGET:-480}
step() {  # step <limit_s> <name> <command...>: cut to the budget left
  local limit=$1 name=$2; shift 2
  local left=$((BUDGET - SECONDS))
  ((left < limit)) && limit=$left
  if ((limit < 10)); then echo "step $name skipped: the ${BUDGET}s budget is spent"; return; fi
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "step $name rc=$? at ${SECONDS}s"; tail -n 12 "$OUT/$name.log"
}
step 150 tests python3 -m pytest -q -p no:cacheprovider --noconftest tests/unit/test_fp8_kernel_variants.py \
  tests/unit/test_fp8_cuda.py
step 80 gemm_probe python3 bench/fp8_gemm_probe.py --models 1.3b --accumulations fast \
  --best-config-file "$OUT/best_ffn_config" --out "$OUT/fp8_gemm_probe.json"
step 50 kernels_probe python3 bench/fp8_kernels_probe.py --out "$OUT/fp8_kernels_probe.json"
best=$(cat "$OUT/best_ffn_config" 2>/dev/null || echo 0)
echo "fastest FFN-in config: $best"
FASTVIDEO3_FP8_FFN_CONFIG=$best step 170 forward python3 bench/denoiser.py --precision fp8 --stage 1.3b \
  --attention-scales bound --fp8-accumulation fast --out "$OUT/denoiser_fp8_variants.json"
python3 - "$OUT/denoiser_fp8_variants.json" "$best" "$OUT/gpu.txt" <<'PY' || true
import json, sys
data = json.load(open(sys.argv[1]))  # the row's command names this script, the config, the card
data["command"] = ("bash bench/gpu_fp8_variants.sh  (its forward step: FASTVIDEO3_FP8_FFN_CONFIG=<fastest of the "
                   "probe> python bench/denoiser.py --precision fp8 --stage 1.3b --attention-scales bound "
                   "--fp8-accumulation fast)")
data["ffn_config_env"], data["gpu"] = int(sys.argv[2]), open(sys.argv[3]).read().strip()
open(sys.argv[1], "w").write(json.dumps(data, indent=1) + "\n")
row = data["model_1.3b"]
for key, val in row.items():
    if key in ("bf16", "fp8") or (key.startswith("fp8_") and isinstance(val, dict) and "flags" in val):
        err = val.get("vs_bf16", {}).get("rel_fro")
        print(f"{key:24s} eager {val.get('ms')} ms, graph {val.get('graph', {}).get('ms')} ms, rel err {err}")
PY
