"""Where the Triton kernel tests run: compiled on a CUDA device, or on the CPU under
``TRITON_INTERPRET=1``; a module importing this is skipped without triton, and ``MARKS`` (its
``pytestmark``) skips it where neither applies."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available() and not INTERPRET
MARKS = [
    pytest.mark.skipif(not (INTERPRET or CUDA), reason="Triton needs a CUDA device or TRITON_INTERPRET=1"),
    pytest.mark.timeout(120),
]
DEV = "cuda" if CUDA else "cpu"
