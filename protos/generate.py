"""Generate the Python modules of the wire contracts, or check that the committed ones are current.

    python protos/generate.py            # (re)write fastvideo3/v1/*_pb2*.py[i]
    python protos/generate.py --check    # exit 1, listing files, when they are stale

Every ``.proto`` under ``protos/`` is compiled in one ``grpc_tools.protoc`` run (with the
well-known types bundled in grpcio-tools) into a temporary directory; ``--proto_path`` is
``protos/``, so ``protos/fastvideo3/v1/x.proto`` becomes ``fastvideo3/v1/x_pb2.py`` (plus
``x_pb2.pyi`` and ``x_pb2_grpc.py``) at the repository root. Write mode copies those files over
the committed ones and deletes generated files whose ``.proto`` is gone; check mode only compares.

Output is deterministic for a given grpcio-tools version: files are compiled in sorted order,
from relative paths, and no timestamp or machine path reaches the output. A different
grpcio-tools version may emit different bytes (its version is written into the files), so the
check names the local version when it fails.
"""
from __future__ import annotations

import argparse
import filecmp
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files(proto_root: Path) -> list[str]:
    """Every .proto under ``proto_root``, as sorted POSIX paths relative to it."""
    return sorted(p.relative_to(proto_root).as_posix() for p in proto_root.rglob("*.proto"))


def _well_known_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).resolve().parent / "_proto")


def generate(proto_root: Path, out_dir: Path) -> list[str]:
    """Compile every .proto under ``proto_root`` into ``out_dir``; return the generated paths.

    Raises ``RuntimeError`` with protoc's message when compilation fails.
    """
    protos = proto_files(proto_root)
    if not protos:
        raise RuntimeError(f"no .proto files under {proto_root}")
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc",
        "--proto_path=.",
        f"--proto_path={_well_known_include()}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    # Relative proto paths from a fixed cwd: the descriptors embed only these paths.
    proc = subprocess.run(cmd, cwd=proto_root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"protoc failed ({proc.returncode}):\n{proc.stderr.strip()}")
    return _generated_in(out_dir, _package_dirs(protos))


def _package_dirs(protos: list[str]) -> list[str]:
    return sorted({str(Path(p).parent.as_posix()) for p in protos})


def _generated_in(root: Path, package_dirs: list[str]) -> list[str]:
    """Generated-looking files under ``root`` in the given package directories (not recursive)."""
    found: list[str] = []
    for pkg in package_dirs:
        d = root / pkg
        if d.is_dir():
            found += [
                f"{pkg}/{f.name}" for f in d.iterdir()
                if f.is_file() and f.name.endswith(GENERATED_SUFFIXES)
            ]
    return sorted(found)


def diff(generated_root: Path, repo_root: Path, package_dirs: list[str]) -> list[str]:
    """Differences between a fresh generation and the committed files, one line each."""
    fresh = set(_generated_in(generated_root, package_dirs))
    committed = set(_generated_in(repo_root, package_dirs))
    problems = [f"missing: {p}" for p in sorted(fresh - committed)]
    problems += [f"extra: {p}" for p in sorted(committed - fresh)]
    problems += [
        f"stale: {p}" for p in sorted(fresh & committed)
        if not filecmp.cmp(generated_root / p, repo_root / p, shallow=False)
    ]
    return problems


def check(proto_root: Path = PROTO_ROOT, repo_root: Path = REPO_ROOT) -> list[str]:
    """Regenerate into a temporary directory and compare; an empty list means up to date."""
    with tempfile.TemporaryDirectory(prefix="fv3-protos-") as tmp:
        generate(proto_root, Path(tmp))
        return diff(Path(tmp), repo_root, _package_dirs(proto_files(proto_root)))


def write(proto_root: Path = PROTO_ROOT, repo_root: Path = REPO_ROOT) -> list[str]:
    """Regenerate in place; return the lines describing what changed."""
    package_dirs = _package_dirs(proto_files(proto_root))
    with tempfile.TemporaryDirectory(prefix="fv3-protos-") as tmp:
        fresh = generate(proto_root, Path(tmp))
        changes = diff(Path(tmp), repo_root, package_dirs)
        for rel in fresh:
            dest = repo_root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(tmp) / rel, dest)
    for line in changes:
        if line.startswith("extra: "):
            (repo_root / line.removeprefix("extra: ")).unlink()
    for pkg in package_dirs:
        if not (repo_root / pkg / "__init__.py").exists():
            print(f"note: {pkg}/__init__.py is missing; add it so the package imports", file=sys.stderr)
    return changes


def _tools_version() -> str:
    try:
        return importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - tools always installed
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare a fresh generation with the committed files; do not write")
    args = parser.parse_args(argv)
    try:
        problems = check() if args.check else write()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.check:
        if problems:
            print("generated protobuf code is out of date; run `python protos/generate.py`:",
                  file=sys.stderr)
            for line in problems:
                print(f"  {line}", file=sys.stderr)
            print(f"(local grpcio-tools {_tools_version()})", file=sys.stderr)
            return 1
        print("generated protobuf code is up to date")
        return 0
    for line in problems:
        print(line.replace("missing: ", "created: ").replace("stale: ", "updated: ")
              .replace("extra: ", "deleted: "))
    if not problems:
        print("generated protobuf code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
