#!/usr/bin/env bash
# One H200 call of the serving comparison (bench/serving.py) or the VAE decode timing
# (bench/e2e_generation.py --decode-only): each call writes the random Wan2.1-1.3B checkpoint to
# local disk, runs one part under its own time limit and brings back its JSON and logs ($OUT,
# default out/gpu_serving). `python bench/serving.py --merge` then joins the serving parts.
#
#   bash bench/gpu_serving.sh decode       # VAE decode alone, ours vs diffusers, fp32/bf16     (~4 min)
#   bash bench/gpu_serving.sh steps8       # 16 x 17x256^2 at 8 steps: batching, request-at-a-time, diffusers (~4 min)
#   bash bench/gpu_serving.sh steps8b      # the same, step batching alone (~2.5 min)
#   bash bench/gpu_serving.sh steps50      # the same at 50 steps                                (~5 min)
#   bash bench/gpu_serving.sh steps50b     # the same, step batching alone (~2.5 min)
#   bash bench/gpu_serving.sh mixed        # 8 small 17x256^2 + 4 large 33x480x832, 20 steps     (~4 min)
#   bash bench/gpu_serving.sh open_loop    # capacity bursts at 8 and 50 steps, then 180 s of Poisson arrivals (~7 min)
#   bash bench/gpu_serving.sh e2e          # a whole 81x480x832 50-step generation vs diffusers (~6 min)
#
# Then, on any machine (later files win for the same step count):
#   python bench/serving.py --merge OUT_OL/serving_open_loop.json OUT_MX/serving_mixed.json \
#          OUT_8/serving_steps8.json OUT_50/serving_steps50.json --out bench/results/serving_h200.json
#
# Each request asks for an mp4 (bench/serving.py --output-format; SERVING_FORMAT=npy for the float
# frames): the image lacks imageio-ffmpeg, so carry .wheels_extra/imageio_ffmpeg.tar.xz
# (`source bench/gpu_env.sh && pack_ffmpeg .wheels_extra` makes it).
# Wheels missing from the machine's image come from the folders in $WHEELS (default: .wheels
# .wheels_fa3 .wheels_extra, those present, and their fleet/ subfolders; git-ignored: carry them),
# as in bench/gpu_call.sh. <PART>_TIMEOUT_S overrides a part's time limit (seconds); DECODE_CHUNKS the
# decode part's time chunks (default 1,4,8,20). SERVING_ARGS adds bench/serving.py flags to every serving
# part (e.g. SERVING_ARGS="--double-buffer-min-units 2"). Runs of this script in one call that share
# WORK (e.g. WORK=/tmp/gpu_serving) build the random checkpoint once.
set -uo pipefail
OUT=${OUT:-out/gpu_serving}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$OUT" "$WORK"
source bench/gpu_env.sh
shopt -s nullglob
wheels=()
for d in ${WHEELS:-.wheels .wheels_fa3 .wheels_extra}; do wheels+=("$d"/*.whl "$d"/fleet/*.whl); done
shopt -u nullglob
if ((${#wheels[@]})); then
  install /tmp/site "${wheels[@]}" || echo "wheels: install failed"
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
install_ffmpeg .wheels_extra >"$WORK/ffmpeg.txt"  # mp4 results (bench/gpu_env.sh: pack_ffmpeg); not in a pipe:
tee -a "$OUT/gpu.txt" <"$WORK/ffmpeg.txt"          # it exports PYTHONPATH
python3 -c "import diffusers, grpc; print('diffusers', diffusers.__version__, 'grpc', grpc.__version__)
try:
    import opentelemetry.sdk; print('opentelemetry sdk: yes')
except ImportError:
    print('opentelemetry sdk: MISSING (no spans)')" | tee -a "$OUT/gpu.txt"

MODEL="$WORK/wan-1.3b"
if [ -f "$MODEL/.built" ]; then  # a WORK shared by several runs of this script in one call builds once
  echo "reusing the checkpoint in $MODEL" | tee "$OUT/build.log"
else
  timeout 200 python3 bench/e2e_generation.py --build-dir "$MODEL" --preset 1.3b 2>&1 | grep -v "Writing model shards" \
    | tail -n 3 | tee "$OUT/build.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && touch "$MODEL/.built"
fi
echo "build done at ${SECONDS}s"
serving() {  # serving <name> <timeout> <args...>
  local name=$1 limit=$2; shift 2
  timeout $((limit + 30)) python3 bench/serving.py --card "$MODEL" --device cuda --mode fleet --time-limit "$limit" \
    --log-dir "$WORK/logs-$name" --out "$OUT/serving_$name.json" \
    --output-format "${SERVING_FORMAT:-mp4}" ${SERVING_ARGS:-} "$@" >"$OUT/serving_$name.log" 2>&1
  echo "serving $name rc=$? at ${SECONDS}s"; tail -n 25 "$OUT/serving_$name.log"
  tail -n 40 "$WORK/logs-$name"/*.log >"$OUT/fleet_logs_$name.txt" 2>/dev/null
}
for part in "$@"; do
  case "$part" in
    decode)    timeout "${DECODE_TIMEOUT_S:-300}" python3 bench/e2e_generation.py --model "$MODEL" --device cuda \
                 --decode-only --frames 81 --height 480 --width 832 --decode-repeats 2 --time-chunks "${DECODE_CHUNKS:-1,4,8,20}" \
                 --decode-batch 2 --out "$OUT/e2e_decode_h200.json" 2>&1 | grep -v Loading | tail -n 30 ;;
    steps8)    serving steps8 "${STEPS8_TIMEOUT_S:-300}" --steps 8 --parts batching,request,diffusers ;;
    steps8b)   serving steps8b "${STEPS8_TIMEOUT_S:-240}" --steps 8 --parts batching ;;
    steps50b)  serving steps50b "${STEPS50_TIMEOUT_S:-240}" --steps 50 --parts batching ;;
    steps50)   serving steps50 "${STEPS50_TIMEOUT_S:-360}" --steps 50 --parts batching,request,diffusers ;;
    mixed)     serving mixed "${MIXED_TIMEOUT_S:-300}" --steps 20 --parts mixed --mixed-steps 20 ;;
    open_loop) serving open_loop "${OPEN_LOOP_TIMEOUT_S:-380}" --steps 8,50 --parts batching,open_loop \
                 --open-loop-s "${OPEN_LOOP_S:-180}" --max-batch 32 ;;
    e2e)       timeout $(( ${E2E_TIMEOUT_S:-360} + 30 )) python3 bench/e2e_generation.py --model "$MODEL" --device cuda \
                 --frames 81 --fallback-frames 33 --time-limit "${E2E_TIMEOUT_S:-360}" \
                 --out "$OUT/e2e_generation_h200.json" 2>&1 | grep -v Loading | tail -n 30 ;;
    *) echo "unknown part $part" >&2 ;;
  esac
done
ls -la "$OUT"
