"""What the LoRA kernel tests share: whether the Triton kernels can run here (a GPU, or the
Triton interpreter under ``TRITON_INTERPRET=1``), the device they run on, the child process that
runs them under the interpreter, and the operands of the expand fused into the residual + LayerNorm."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers_env import triton_interpreter_env

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
ROOT = Path(__file__).resolve().parents[1]


def triton_mark(reason: str):
    """Skip unless a GPU or the Triton interpreter can run the kernels."""
    return pytest.mark.skipif(not (INTERPRET or torch.cuda.is_available()), reason=reason)


def kernel_device() -> str:
    """Where the Triton kernels run: the GPU, or the CPU under the interpreter."""
    return "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"


def run_under_interpreter(select: str, files: list[str], passed: int) -> None:
    """Run the ``-k select`` tests of ``files`` in a child process under ``TRITON_INTERPRET=1``
    (Triton decides when a kernel is first defined) and check that ``passed`` of them pass, none
    skipped."""
    env = triton_interpreter_env()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", select, *files],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{passed} passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]


def norm_operands(g: torch.Generator, dtype, n: int, d: int, rank: int, slots: int, rows: int, device: str):
    """up, x, y, gate, a, b, w, bias of the fused expand + residual + LayerNorm, drawn from ``g``
    in that order."""
    up = (torch.randn(slots, d, rank, generator=g) * 0.2).to(device, dtype)
    x = torch.randn(rows, n, d, generator=g).to(device, dtype)
    y = torch.randn(rows, n, d, generator=g).to(device, dtype)
    gate = torch.randn(rows, d, generator=g).to(device, torch.float32)
    a, b = (torch.randn(rows, d, generator=g) * 0.1).to(device), torch.randn(rows, d, generator=g).to(device)
    w, bias = torch.randn(d, generator=g).to(device, dtype), torch.randn(d, generator=g).to(device, dtype)
    return up, x, y, gate, a, b, w, bias
