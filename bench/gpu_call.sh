#!/usr/bin/env bash
# One H200 call that runs several GPU parts back to back, each under its own time limit, and
# brings back their JSON (top of $OUT) and every part's log ($OUT/logs.tgz). A run may bring back
# at most 8 files: parts are chosen per call.
#
#   bash bench/gpu_call.sh ipc transport lora fp8        # carry .wheels (+ .wheels_nixl / .wheels_fa3)
#
# Parts:
#   ipc        bench/ipc_probe.py: where a cuda_ipc fetch spends its time, per device-checksum setting
#   transport  bench/gpu_transport.sh: the data plane (NIXL probe + bench/transport.py --device cuda)
#   lora       bench/lora.py: mixed-adapter batches against no LoRA, eager and as CUDA graphs
#   lora_norm  bench/lora_norm_probe.py: the fused LoRA norm pass per tile config and feature
#   fp8        bench/denoiser_fp8.py: FP8 against bf16 (needs the fa3_fwd wheel for FP8 attention)
#   models     bench/denoiser.py --models $MODELS: newer families against diffusers (bench/denoiser_models.py),
#              rows named in $SKIP_ROWS (family:shape,...) left out; JSON as $MODELS_JSON
#   decode_small bench/vae_decode_profile.py --shape $DECODE_SHAPE (17x256x256) at batch sizes $DECODE_BATCHES
#              (1,2,4,8,16): wall against kernel time per call (decode_small_h200.json)
#   gputests   pytest on the GPU of the test files in $GPU_TESTS (default: the Triton kernel and FP8
#              files, whose CUDA tests CI never runs); every failure's text in gpu_tests.txt, a
#              JUnit XML in gpu_tests.xml
# Wheels come from the folders in $WHEELS (default: .wheels .wheels_fa3 .wheels_extra), those present.
# Time limits come from <PART>_TIMEOUT_S (seconds).
set -uo pipefail
OUT=${OUT:-out/gpu_call}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
shopt -s nullglob
wheels=()
for d in ${WHEELS:-.wheels .wheels_fa3 .wheels_extra}; do wheels+=("$d"/*.whl); done
shopt -u nullglob
if ((${#wheels[@]})); then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${wheels[@]}" || echo "wheels: install failed"
fi
export PYTHONPATH="$PWD:/tmp/site"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
work=$(mktemp -d)
for part in "$@"; do
  start=$SECONDS
  mkdir -p "$work/$part"
  case "$part" in
    ipc)       timeout "${IPC_TIMEOUT_S:-150}" python3 bench/ipc_probe.py --sizes-mib 64,256 --repeats 25 \
                 --out "$work/$part/ipc_probe.json" ;;
    transport) OUT=$work/$part BUDGET_S=${TRANSPORT_TIMEOUT_S:-200} PROBE_CONFIGS=${PROBE_CONFIGS:-project_default} \
                 timeout $(( ${TRANSPORT_TIMEOUT_S:-200} + 30 )) bash bench/gpu_transport.sh ;;
    lora)      timeout "${LORA_TIMEOUT_S:-480}" python3 bench/lora.py --out "$work/$part/lora_h200.json" --eager-shapes "${LORA_EAGER_SHAPES:-81x480x832}" \
                 --graphs both --variants --layers --profile --time-limit $(( ${LORA_TIMEOUT_S:-480} - 120 )) ;;
    lora_norm) timeout "${LORA_NORM_TIMEOUT_S:-200}" python3 bench/lora_norm_probe.py --out "$work/$part/lora_norm_probe.json" ;;
    fp8)       timeout "${FP8_TIMEOUT_S:-300}" python3 bench/denoiser_fp8.py --out "$work/$part/denoiser_fp8_h200.json" ;;
    models)    timeout "${MODELS_TIMEOUT_S:-480}" python3 bench/denoiser.py --models "${MODELS:?}" --quick \
                 --stage-timeout "${STAGE_TIMEOUT_S:-150}" --skip-rows "${SKIP_ROWS:-}" \
                 --out "$work/$part/${MODELS_JSON:-denoiser_models_h200.json}" ;;
    decode_small) timeout "${DECODE_SMALL_TIMEOUT_S:-150}" python3 bench/vae_decode_profile.py \
                 --shape "${DECODE_SHAPE:-17x256x256}" --batches "${DECODE_BATCHES:-1,2,4,8,16}" \
                 --out "$work/$part/decode_small_h200.json" ;;
    gputests)  timeout "${GPUTESTS_TIMEOUT_S:-300}" python3 -m pytest -q -p no:cacheprovider -rfE \
                 -o addopts="" --junitxml "$work/$part/gpu_tests.xml" ${GPU_TESTS:-tests/unit/test_vae_fused_triton.py \
                 tests/unit/test_vae_fused.py tests/unit/test_kernels.py tests/unit/test_lora_kernel.py \
                 tests/unit/test_lora_fused.py tests/unit/test_fp8.py tests/unit/test_snapshot_copy_stream.py} | tee "$work/$part/gpu_tests.txt" ;;
    *) echo "unknown part $part" >&2; continue ;;
  esac > "$work/$part.log" 2>&1
  echo "== $part rc=$? in $((SECONDS - start))s"; tail -n 25 "$work/$part.log"
done
for f in "$work"/*/*.json; do
  case "$(basename "$f")" in nixl_probe.json|ipc_probe.json|transport_h200.json|lora_h200.json|lora_norm_probe.json|denoiser_fp8_h200.json|denoiser_models*.json|decode_small_h200.json)
    cp "$f" "$OUT"/ ;; esac
done
for f in "$work"/gputests/gpu_tests.*; do
  case "$(basename "$f")" in gpu_tests.txt|gpu_tests.xml)
    cp "$f" "$OUT"/ ;; esac
done
tar -czf "$OUT/logs.tgz" -C "$work" .
ls -la "$OUT"
