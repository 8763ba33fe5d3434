#!/usr/bin/env bash
# The tiny recipe on one GPU in two chunks of about 8 minutes (each ends by 9 minutes: hard timeouts).
#
#   bash bench/gpu_train_tiny.sh 1              # chunk 1 -> $OUT/c1 (DiT + text encoder; the shipped VAE is kept)
#   bash bench/gpu_train_tiny.sh 2 runs/c1      # chunk 2 -> $OUT/c2 (continue DiT until the probe holds,
#                                               #   guidance probe, 4-step student, final probes, quality.py)
#   SMOKE=1 DEVICE=cpu OUT=/tmp/x bash bench/gpu_train_tiny.sh 1   # the same commands at smoke sizes on a CPU
#
# Chunk 2's split can move without code changes: DIT2 (DiT seconds, default 170; the DiT is cut
# anyway so rollouts + distillation fit CS2=400 s), ROLL2 (rollouts, 50), DISTILL2 (student, 110).
# Wheels missing from the machine (pydantic and its deps) are installed from .wheels/ when present.
# What comes back: $OUT/c1 = log.txt train_log.json train_loss.png train_state.pt
# wan-tiny/{transformer,text_encoder,vae}.safetensors (7 files, each <= 10 MB; weights are written as each stage ends);
# $OUT/c2 = the same without train_state.pt, plus wan-tiny-4step/transformer.safetensors and
# quality_cuda.json (8 files).
set -u
CHUNK=${1:?chunk 1 or 2}
PREV=${2:-runs/c1}
OUT=${OUT:?set OUT}
DEVICE=${DEVICE:-cuda}
if compgen -G ".wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheels/*.whl >/dev/null 2>&1
  export PYTHONPATH="$PWD:/tmp/site:${PYTHONPATH:-}"
else
  export PYTHONPATH="$PWD:${PYTHONPATH:-}"
fi
PY=${PY:-python3}
EXTRA=()
[ -n "${SMOKE:-}" ] && EXTRA=(--smoke)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null | head -1
if [ "$CHUNK" = 1 ]; then
  timeout -k 5 ${T1:-525} $PY bench/train_tiny.py --device "$DEVICE" --stages dit --out "$OUT/c1" \
    --weights-dir "$OUT/c1" --chunk-seconds ${CS1:-470} --dit-seconds 460 \
    --patch 1,2,2 --groups --text-aux 0.1 --dit-batch 256 --dit-lr 1e-3 --dit-warmup 200 --dit-reuse 2 \
    --ema-decay 0.999 --dir-probe-every 60 "${EXTRA[@]}" 2>&1 | grep -v "dit step [0-9]*[1-9]50 " | tail -n 70
else
  timeout -k 5 ${T2:-440} $PY bench/train_tiny.py --device "$DEVICE" --resume "$PREV" --stages dit,probe,distill \
    --out "$OUT/c2" --weights-dir "$OUT/c2" --chunk-seconds ${CS2:-400} --dit-seconds ${DIT2:-170} \
    --dit-batch 256 --dit-lr 5e-4 --dit-warmup 100 --dit-reuse 2 --ema-decay 0.999 \
    --dir-probe-every 40 --stop-direction 0.85 --probe-guidance 2,3,5 --teacher-steps 25 \
    --rollout-seconds ${ROLL2:-50} --rollout-wave 256 --max-pairs 8192 --distill-seconds ${DISTILL2:-110} --distill-batch 128 \
    --reserve-seconds 45 --final-probe --no-state "${EXTRA[@]}" 2>&1 | grep -v "step [0-9]*[1-9]50 " | tail -n 70
  QSEEDS=0,1
  [ -n "${SMOKE:-}" ] && QSEEDS=0
  timeout -k 5 ${TQ:-85} $PY bench/quality.py --device "$DEVICE" --run "$OUT/c2" --seeds $QSEEDS \
    ${QCARDS:+--cards $QCARDS} --out "$OUT/c2/quality_cuda.json" 2>&1 | tail -n 6
fi
find "$OUT" -type f -printf '%s %p\n'
