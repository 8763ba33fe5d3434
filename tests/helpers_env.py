"""The environment of a child Python process a test starts."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def triton_interpreter_env() -> dict[str, str]:
    """This environment with Triton's interpreter on and CUDA hidden; the repository first on
    PYTHONPATH, the caller's entries kept (packages installed beside the interpreter's, e.g. with
    ``pip --target``, are found there)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}
