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

# An ffmpeg for mp4 results on a machine whose image lacks imageio-ffmpeg. Its wheel (29 MB,
# zip-compressed) does not fit a call's carry beside the other wheels; its package as an xz tarball
# (21 MB) does. Here, once:   source bench/gpu_env.sh && pack_ffmpeg .wheels_extra
# There (gpu_serving.sh does it):   install_ffmpeg .wheels_extra
pack_ffmpeg() {  # pack_ffmpeg <dir>
  local dir=$1 tmp
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 -d "$tmp" imageio-ffmpeg
  python3 - "$tmp" "$dir" <<'PY'
import sys, tarfile, zipfile, pathlib
tmp, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
whl = next(tmp.glob("imageio_ffmpeg-*.whl"))
zipfile.ZipFile(whl).extractall(tmp / "site")
for exe in (tmp / "site" / "imageio_ffmpeg" / "binaries").glob("ffmpeg-*"):
    exe.chmod(0o755)  # zipfile drops the mode bits
out.mkdir(parents=True, exist_ok=True)
with tarfile.open(out / "imageio_ffmpeg.tar.xz", "w:xz", preset=9) as tar:
    tar.add(tmp / "site" / "imageio_ffmpeg", arcname="imageio_ffmpeg")
print(out / "imageio_ffmpeg.tar.xz", (out / "imageio_ffmpeg.tar.xz").stat().st_size)
PY
  rm -rf "$tmp"
}

install_ffmpeg() {  # install_ffmpeg <dir>: its imageio_ffmpeg.tar.xz unpacked onto PYTHONPATH
  local tarball=$1/imageio_ffmpeg.tar.xz
  python3 -c "import imageio_ffmpeg" 2>/dev/null && { echo "imageio-ffmpeg: the image's"; return; }
  if [[ -e $tarball ]] && mkdir -p /tmp/site_ffmpeg \
    && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$tarball" /tmp/site_ffmpeg; then
    chmod +x /tmp/site_ffmpeg/imageio_ffmpeg/binaries/ffmpeg-* 2>/dev/null
    export PYTHONPATH="$PYTHONPATH:/tmp/site_ffmpeg"; echo "imageio-ffmpeg: from $tarball"
  else
    echo "imageio-ffmpeg: MISSING (mp4 results fail; run with --output-format npy)"
  fi
}
