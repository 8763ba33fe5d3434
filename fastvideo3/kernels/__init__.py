"""Fused kernels for the DiT hot path, each with an eager PyTorch twin.

Every fused op has two implementations behind one function: ``impl="triton"`` (a Triton kernel;
on a CPU it runs only under Triton's interpreter, ``TRITON_INTERPRET=1``) and ``impl="torch"``
(plain PyTorch, the CPU path and the reference the kernel is tested against). Both compute in
fp32 and round once to the activation dtype, where the reference model keeps fp32.

* :func:`add_norm` -- ``x += y * gate`` (optional), then ``LayerNorm(x) * a + b`` with either a
  time modulation (``a = 1 + scale``, ``b = shift``, per sample) or an affine (``weight``,
  ``bias``): one pass over the residual stream instead of six.
* :func:`qk_norm_rope` -- RMSNorm across heads of Q and K, then Wan's 3-D RoPE, reading the
  fused QKV projection once and writing Q and K once; the RoPE angles are gathered from the
  small per-axis tables by token position, so no L x head_dim table is ever built.
* :mod:`fastvideo3.kernels.fp8` -- the e4m3 building blocks (per-token quantization, the
  bias+GELU+quantize pass, QK-norm+RoPE+quantize for FP8 attention, ``torch._scaled_mm``);
  :func:`add_norm` can write its output as e4m3 with per-token scales (``fp8=True``).
* :func:`attention` -- scaled-dot-product attention on ``[B, L, H, D]`` views through a chosen
  backend (SDPA's flash / cuDNN / efficient / math, or FlashAttention-3 when installed).
"""
from fastvideo3.kernels.attention import ATTENTION_BACKENDS, attention, attention_available
from fastvideo3.kernels.fused import add_norm, qk_norm_rope, triton_available

__all__ = [
    "ATTENTION_BACKENDS",
    "add_norm",
    "attention",
    "attention_available",
    "qk_norm_rope",
    "triton_available",
]
