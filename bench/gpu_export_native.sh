#!/usr/bin/env bash
# One GPU call for the C ABI of the runtime export: the C consumer in tests/native/ (compiled
# here with cc/gcc, else nvcc) replays the denoiser's captured CUDA graph through the exported
# exec handle and snapshots/restores its state regions (bench/export_native.py).
#
#   bash bench/gpu_export_native.sh        # from the repository root; results in $OUT
#
# The card layer needs pydantic: when the image lacks it, it comes from .wheels/ (git-ignored;
# carry it), as in bench/gpu_run2.sh.
set -uo pipefail
OUT=${OUT:-out/gpu_export}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import pydantic" 2>/dev/null; then
  shopt -s nullglob
  wheels=(.wheels/pydantic-*.whl .wheels/pydantic_core-*.whl .wheels/annotated_types-*.whl
          .wheels/typing_extensions-*.whl .wheels/typing_inspection-*.whl .wheels/fleet/pydantic*.whl
          .wheels/fleet/annotated_types-*.whl .wheels/fleet/typing_*.whl)
  shopt -u nullglob
  if ((${#wheels[@]})) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site_export "${wheels[@]}"; then
    export PYTHONPATH="$PYTHONPATH:/tmp/site_export"
  else
    echo "pydantic: not installed (the card layer will be missing)"
  fi
fi
{ command -v cc || command -v gcc || command -v nvcc; } | sed 's/^/compiler: /' | tee "$OUT/export_native.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/export_native.log"
timeout 300 python3 bench/export_native.py --out "$OUT/export_native_h200.json" 2>&1 | tee -a "$OUT/export_native.log"
echo "export_native rc=${PIPESTATUS[0]}"
