"""Compile the C sources under tests/native with the system C compiler (no toolchain download)."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"
HERE = Path(__file__).resolve().parent
CC_TIMEOUT_S = 120


def compiler() -> str:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang", "nvcc"):
        if cc and shutil.which(cc):
            return shutil.which(cc)
    raise RuntimeError("no C compiler (cc, gcc, clang or nvcc) on PATH")


def build(source: Path | str, out: Path, *, shared: bool = True, extra: tuple[str, ...] = ()) -> Path:
    """Compile ``source`` against include/ into ``out`` (a shared library or an executable)."""
    cc = compiler()
    if Path(cc).name == "nvcc":  # drives the host compiler; C flags go through -Xcompiler
        flags = ["-x", "c", "-O1", "-D_GNU_SOURCE", f"-I{INCLUDE}"]
        flags += ["-shared", "-Xcompiler", "-fPIC"] if shared else []
    else:
        flags = ["-std=c11", "-O1", "-Wall", "-Werror", "-D_GNU_SOURCE", f"-I{INCLUDE}"]
        flags += ["-shared", "-fPIC"] if shared else []
    cmd = [cc, *flags, *extra, str(source), "-o", str(out), "-ldl", "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CC_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return out


def load(name: str, out_dir: Path) -> ctypes.CDLL:
    """Build tests/native/<name>.c as a shared library and load it (GIL released during calls)."""
    lib = ctypes.CDLL(str(build(HERE / f"{name}.c", Path(out_dir) / f"lib{name}.so")))
    vp, u64, sz, cp = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_char_p
    sigs = {
        "fv3c_load_cuda": [cp, cp, sz],
        "fv3c_adopt": [vp, ctypes.POINTER(u64), ctypes.POINTER(u64), cp, sz],
        "fv3c_release": [vp, cp, sz], "fv3c_release_on_thread": [vp, cp, sz],
        "fv3c_write_swap": [vp, cp, cp, vp, u64, cp, sz], "fv3c_read_swap": [vp, cp, cp, vp, u64, cp, sz],
        "fv3c_prepare": [vp, cp, cp, sz],
        "fv3c_step": [vp, cp, sz], "fv3c_get_output": [vp, cp, vp, u64, cp, sz],
        "fv3c_snapshot": [vp, vp, u64, cp, sz], "fv3c_restore": [vp, vp, u64, cp, sz],
        "fv3c_bucket_count": [vp, cp, sz], "fv3c_launch_graph": [vp, cp, cp, cp, sz],
        "fv3c_fire_stages": [vp, cp, cp, sz],
        "fv3c_round_trip": [vp, cp, cp, vp, u64, cp, vp, vp, vp, u64, ctypes.POINTER(u64), cp, sz],
        "fv3old_step": [vp, cp, cp, vp, u64, cp, vp, u64, cp, sz],
    }
    for fn, args in sigs.items():
        if hasattr(lib, fn):
            getattr(lib, fn).argtypes = args
            getattr(lib, fn).restype = ctypes.c_int
    if hasattr(lib, "fv3c_state_bytes"):
        lib.fv3c_state_bytes.argtypes, lib.fv3c_state_bytes.restype = [vp], u64
    if hasattr(lib, "fv3c_fnv1a64"):
        lib.fv3c_fnv1a64.argtypes, lib.fv3c_fnv1a64.restype = [cp], u64
    return lib


class Err:
    """A C error buffer: pass ``*err.args`` as the trailing (char *err, size_t cap)."""

    def __init__(self, cap: int = 1024) -> None:
        self.buf = ctypes.create_string_buffer(cap)
        self.args = (self.buf, cap)

    def __str__(self) -> str:
        return self.buf.value.decode(errors="replace")
