#!/usr/bin/env bash
# One GPU call for the data plane: the NIXL/UCX configuration sweep (bench/nixl_probe.py), then
# bench/transport.py --device cuda with the best NIXL configuration (VRAM -> VRAM between two
# processes: memcpy ceiling, cuda_ipc, NIXL, shm, gRPC; the device checksum; the cuda_ipc fault
# checks), and on a machine with two or more GPUs the same across GPUs 0 and 1.
#
#   BUDGET_S=240 bash bench/gpu_transport.sh        # from the repository root; results in $OUT
#   PROBE_CONFIGS=project_default,err_none ...      # only these NIXL/UCX configurations
#   SIZES=1,64 ...                                  # transfer sizes in MiB (default 1,64,256)
#
# Wheels missing from the machine's image come from .wheels/ (git-ignored; carry it; made by the
# device-wheels tool) or .wheels_nixl/: grpcio, protobuf, pydantic and helpers, nixl + nixl-cu13.
# A wheel found in both is installed once (the first folder wins). Each part has its own time limit carved out
# of BUDGET_S and writes its JSON as it goes. Files written to $OUT (at most 8): gpu.txt,
# nixl_probe.json, probe.log, transport_h200.json, transport.log, ucx_log.txt and, with two
# GPUs, transport_2gpu.json.
set -uo pipefail
OUT=${OUT:-out/gpu_transport}
BUDGET_S=${BUDGET_S:-240}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left() { echo $((BUDGET_S - SECONDS)); }
min() { if (($1 < $2)); then echo "$1"; else echo "$2"; fi; }

shopt -s nullglob
wheels=(); declare -A seen=()
for pat in grpcio-1 protobuf- pydantic- pydantic_core- annotated_types- typing_extensions- typing_inspection- \
           importlib_metadata- nixl-1 nixl_cu13-; do
  for w in .wheels/${pat}*.whl .wheels/fleet/${pat}*.whl .wheels_nixl/${pat}*.whl; do
    name=$(basename "$w"); name=${name%%-*}
    [[ -n ${seen[$name]:-} ]] && continue
    seen[$name]=1; wheels+=("$w")
  done
done
shopt -u nullglob
if ((${#wheels[@]})) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site "${wheels[@]}"; then
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
else
  echo "wheels: not installed (grpc / nixl variants will be missing)"
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvidia-smi topo -m 2>/dev/null | head -20
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import nixl, grpc; print('nixl ok; grpc', grpc.__version__)" 2>&1 | tail -1
  env | grep -E '^(UCX_|NIXL_)' || true
} 2>&1 | tee "$OUT/gpu.txt"

# 1. NIXL/UCX sweep: about a third of the budget (at most 150 s); the main benchmark needs ~120 s
limit=$(min 150 $(( $(left) / 3 )))
timeout $((limit + 15)) python3 bench/nixl_probe.py --device cuda --time-limit "$limit" --configs "${PROBE_CONFIGS:-}" \
  --out "$OUT/nixl_probe.json" >"$OUT/probe.log" 2>&1
echo "probe rc=$? at ${SECONDS}s"; tail -n 15 "$OUT/probe.log"

# 2. one GPU, two processes
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
limit=$(( $(left) - (ngpu >= 2 ? 90 : 15) ))
probe_arg=(); [[ -s "$OUT/nixl_probe.json" ]] && probe_arg=(--nixl-from-probe "$OUT/nixl_probe.json")
timeout $((limit + 15)) python3 bench/transport.py --device cuda --sizes-mib "${SIZES:-1,64,256}" --repeats "${REPEATS:-9}" \
  "${probe_arg[@]}" --ucx-log-dir /tmp/ucxlog --time-limit $((limit - 40)) \
  --out "$OUT/transport_h200.json" >"$OUT/transport.log" 2>&1
echo "transport rc=$? at ${SECONDS}s"; tail -n 45 "$OUT/transport.log"
cat /tmp/ucxlog/* 2>/dev/null | grep -E '\|.*/|rror|unreachable|proto' | head -c 200000 >"$OUT/ucx_log.txt"

# 3. two GPUs (peer copies), when the machine has them
if ((ngpu >= 2)); then
  limit=$(( $(left) - 10 ))
  timeout $((limit + 10)) python3 bench/transport.py --devices 0,1 --sizes-mib 64,256 --repeats 9 \
    "${probe_arg[@]}" --time-limit $((limit - 30)) --out "$OUT/transport_2gpu.json" >>"$OUT/transport.log" 2>&1
  echo "2gpu rc=$? at ${SECONDS}s"
fi
