"""What the LoRA kernel tests share: whether the Triton kernels can run here (a GPU, or the
Triton interpreter under ``TRITON_INTERPRET=1``), the device they run on, and the operands of the
expand fused into the residual + LayerNorm."""
from __future__ import annotations

import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def triton_mark(reason: str):
    """Skip unless a GPU or the Triton interpreter can run the kernels."""
    return pytest.mark.skipif(not (INTERPRET or torch.cuda.is_available()), reason=reason)


def kernel_device() -> str:
    """Where the Triton kernels run: the GPU, or the CPU under the interpreter."""
    return "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"


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
