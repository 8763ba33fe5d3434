# Sourced (from the repository root) by the bench/gpu_*.sh scripts that install wheels the machine's
# image lacks: the environment they all run under and the helpers that install those wheels.
#
#   source bench/gpu_env.sh
#   install_site "wheels: not installed" .wheels/*.whl       # into /tmp/site, then on PYTHONPATH
#   install_fa3 "" .wheels/fa3_fwd-*.whl                      # FlashAttention-3 forward, when it imports
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

install() {  # install <target> <wheels...>
  local target=$1; shift
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "$@"
}

# install_site <what to say when nothing was installed, or ""> <wheels...>
install_site() {
  local note=$1; shift
  if (($#)) && install /tmp/site "$@"; then
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
  elif [[ -n $note ]]; then
    echo "$note"
  fi
}

# install_fa3 <note added to "fa3_fwd: not used", or ""> <wheels...>: fa3_fwd goes on PYTHONPATH
# only when its wheel installs and imports (with torch) within 60 s.
install_fa3() {
  local note=$1; shift
  if (($#)) && [[ -e $1 ]] && install /tmp/site_fa3 "$@" \
    && PYTHONPATH="$PYTHONPATH:/tmp/site_fa3" timeout 60 python3 -c "import torch, fa3_fwd_interface" >/dev/null 2>&1; then
    export PYTHONPATH="$PYTHONPATH:/tmp/site_fa3"; echo "fa3_fwd: available"
  else
    echo "fa3_fwd: not used${note:+ $note}"
  fi
}
