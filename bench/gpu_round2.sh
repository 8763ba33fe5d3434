#!/usr/bin/env bash
# One H200 call for the round-2 GPU figures that share a machine: the C consumer's graph replay
# (bench/gpu_export_native.sh), the parallel plan code at degree 1 (bench/gpu_parallel.sh overhead),
# LoRA in mixed-adapter batches (bench/lora.py), block caching (bench/cache.py) and the data plane (bench/gpu_transport.sh). Each part runs under its own time limit; the JSON of
# every part that finished lands at the top of $OUT and all logs in $OUT/logs.tgz (a run may bring
# back at most 8 files).
#
#   bash bench/gpu_round2.sh [export] [parallel] [lora] [cache] [transport]    # default: all five; carry .wheels and .wheels_nixl
set -uo pipefail
OUT=${OUT:-out/gpu_round2}
mkdir -p "$OUT"
work=$(mktemp -d)
parts=("$@"); ((${#parts[@]})) || parts=(export parallel lora cache transport)
for part in "${parts[@]}"; do
  start=$SECONDS
  case "$part" in
    export)    OUT=$work/export timeout 170 bash bench/gpu_export_native.sh ;;
    parallel)  OUT=$work/parallel timeout 170 bash bench/gpu_parallel.sh overhead ;;
    lora)      mkdir -p "$work/lora" && PYTHONPATH="$PWD" timeout ${LORA_TIMEOUT_S:-175} python3 bench/lora.py \
                 --out "$work/lora/lora_h200.json" --time-limit $(( ${LORA_TIMEOUT_S:-175} - 50 )) ;;
    cache)     mkdir -p "$work/cache" && PYTHONPATH="$PWD" timeout ${CACHE_TIMEOUT_S:-170} python3 bench/cache.py \
                 --device cuda --steps 8 --out "$work/cache/cache_h200.json" ;;
    transport) OUT=$work/transport BUDGET_S=${TRANSPORT_BUDGET_S:-200} timeout 240 bash bench/gpu_transport.sh ;;
    *) echo "unknown part $part" >&2; continue ;;
  esac > "$work/$part.log" 2>&1
  echo "== $part rc=$? in $((SECONDS - start))s"; tail -n 12 "$work/$part.log"
done
find "$work" -name "*.json" -exec cp {} "$OUT"/ \;
tar -czf "$OUT/logs.tgz" -C "$work" .
ls -la "$OUT"
