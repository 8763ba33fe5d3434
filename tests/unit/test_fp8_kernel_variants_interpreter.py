"""On a CPU, test_fp8_kernel_variants.py runs in a child process under Triton's interpreter, so
``TRITON_INTERPRET`` is never set in the test session itself (other tests choose kernels by it)."""
from __future__ import annotations

import os

import pytest
import torch
from tests.helpers_env import run_under_interpreter


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="on a GPU (or under the interpreter) test_fp8_kernel_variants.py runs in this process")
@pytest.mark.timeout(600)
def test_fp8_kernel_variants_under_the_interpreter():
    pytest.importorskip("triton")
    run_under_interpreter("tests/unit/test_fp8_kernel_variants.py")
