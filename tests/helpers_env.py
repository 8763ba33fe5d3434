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


def run_under_interpreter(test_file: str, timeout: float = 580) -> None:
    """Run ``test_file`` (a path from the repository root) with pytest in a child process under
    Triton's interpreter; fail with its output unless every test in it ran and passed."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
                          cwd=ROOT, env=triton_interpreter_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, proc.stdout[-2000:]
