"""Copy a checkpoint into a directory: the Helm chart's init container for ``download`` model
sources (an emptyDir or ephemeral volume that the pool then mounts read-only).

    python -m fastvideo3.card.fetch --url https://host/wan2.1-t2v-1.3b.tar.gz --dest /models/wan --clean

``--url``: ``http(s)://`` or ``file://`` naming an archive (``.tar``, ``.tar.gz``, ``.tgz``, ``.zip``:
unpacked into DEST) or a single file (kept under its name); ``file://`` may also name a directory
(its contents are copied). Object stores (``s3://``, ``gs://``) are copied by their own CLIs
(the chart runs ``aws s3 sync`` / ``gcloud storage rsync`` in an image the operator names).
The pool checks presence and digests at start; this only copies, within ``--timeout`` seconds.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import time
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

ARCHIVES = (".tar", ".tar.gz", ".tgz", ".zip")
_CHUNK = 1 << 20


class FetchError(RuntimeError):
    pass


def _clear(dest: Path) -> None:
    for p in dest.iterdir():
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def _unpack(archive: Path, dest: Path) -> None:
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if name.startswith("/") or ".." in Path(name).parts:
                    raise FetchError(f"archive member {name!r} would land outside {dest}")
            zf.extractall(dest)
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")  # refuses absolute paths, '..', device files


def _download(url: str, target: Path, deadline: float) -> None:
    remaining = max(1.0, deadline - time.monotonic())
    with urllib.request.urlopen(url, timeout=min(60.0, remaining)) as r, open(target, "wb") as out:
        for block in iter(lambda: r.read(_CHUNK), b""):
            out.write(block)
            if time.monotonic() > deadline:
                raise FetchError(f"download of {url} did not finish within the timeout")


def fetch(url: str, dest: Path, *, clean: bool = False, timeout_s: float = 3600.0) -> list[str]:
    """Copy ``url`` into ``dest``; returns the top-level names now in ``dest``."""
    deadline = time.monotonic() + timeout_s
    parsed = urllib.parse.urlparse(url)
    dest.mkdir(parents=True, exist_ok=True)
    if clean:  # a restarted init container starts over instead of mixing two partial copies
        _clear(dest)
    name = Path(urllib.parse.unquote(parsed.path)).name
    if parsed.scheme == "file":
        src = Path(urllib.parse.unquote(parsed.path))
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        elif src.is_file():
            (_unpack(src, dest) if name.endswith(ARCHIVES) else shutil.copy2(src, dest / name))
        else:
            raise FetchError(f"{src} does not exist")
    elif parsed.scheme in ("http", "https"):
        if not name:
            raise FetchError(f"{url} names no file: give an archive ({', '.join(ARCHIVES)}) or a file")
        part = dest / f".{name}.part"
        try:
            _download(url, part, deadline)
            if name.endswith(ARCHIVES):
                _unpack(part, dest)
            else:
                part.rename(dest / name)
        finally:
            part.unlink(missing_ok=True)
    else:
        raise FetchError(f"unsupported URL scheme {parsed.scheme!r} (http, https, file; "
                         "s3:// and gs:// are copied by the chart with their own CLIs)")
    return sorted(p.name for p in dest.iterdir())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastvideo3.card.fetch", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--dest", required=True)
    p.add_argument("--clean", action="store_true", help="empty DEST first")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole copy")
    a = p.parse_args(argv)
    if a.timeout <= 0:
        p.error(f"--timeout must be > 0 (got {a.timeout})")
    try:
        names = fetch(a.url, Path(a.dest), clean=a.clean, timeout_s=a.timeout)
    except (FetchError, OSError, tarfile.TarError, zipfile.BadZipFile) as e:
        print(f"error: cannot fetch {a.url} into {a.dest}: {e}", file=sys.stderr)
        return 1
    print(f"fetched {a.url} into {a.dest}: {', '.join(names) or '(empty)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
