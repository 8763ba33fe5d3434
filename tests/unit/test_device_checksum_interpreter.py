"""On a CPU, the device checksum's tests run in a child process under Triton's interpreter, so
``TRITON_INTERPRET`` is never set in the test session itself (other tests choose kernels by it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers_env import triton_interpreter_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="on a GPU (or under the interpreter) test_device_checksum.py runs in this process")
@pytest.mark.timeout(600)
def test_device_checksum_under_the_interpreter():
    pytest.importorskip("triton")
    env = triton_interpreter_env()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_device_checksum.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, proc.stdout[-2000:]
