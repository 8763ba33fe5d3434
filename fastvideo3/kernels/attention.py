"""Attention on ``[B, L, H, D]`` views, through one named backend.

The DiT keeps Q, K and V in token-major layout (``[B, L, H, D]``, often strided views of one
fused projection), which is what every flash-style kernel reads natively, so no transpose is
materialized. Backends:

* ``sdpa``       -- ``F.scaled_dot_product_attention`` with PyTorch's own choice;
* ``flash``, ``cudnn``, ``efficient``, ``math`` -- SDPA restricted to that one backend;
* ``fa3``        -- FlashAttention-3's forward kernel for Hopper (the optional ``fa3_fwd``
                    wheel); listed only where it imports.

A backend that cannot run an input (fp32 on flash, a CPU tensor on cuDNN) is not silently
swapped: callers pick one that :func:`attention_available` reports, and ``sdpa`` is always there.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

ATTENTION_BACKENDS = ("sdpa", "flash", "cudnn", "efficient", "math", "fa3")


@functools.lru_cache(maxsize=1)
def _fa3():
    try:
        from fa3_fwd_interface import flash_attn_func  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - any import failure (missing wheel, ABI) means "not available"
        return None
    return flash_attn_func


@functools.lru_cache(maxsize=None)
def _sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def attention_available(backend: str, device: torch.device | str = "cuda") -> bool:
    """Whether ``backend`` can run at all on ``device`` (not whether it is fast)."""
    dev = torch.device(device)
    if backend not in ATTENTION_BACKENDS:
        return False
    if backend in ("sdpa", "math"):
        return True
    if dev.type != "cuda" or not torch.cuda.is_available():
        return False
    if backend == "fa3":
        return _fa3() is not None and torch.cuda.get_device_capability(dev) >= (9, 0)
    if backend == "cudnn":
        return torch.backends.cudnn.is_available()
    return True


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "sdpa") -> torch.Tensor:
    """Softmax attention, scale ``1/sqrt(D)``, no mask. q [B, Lq, H, D], k/v [B, Lk, H, D] with a
    unit last-dim stride; returns [B, Lq, H, D] (possibly a view of a head-major buffer)."""
    if backend == "fa3":
        fn = _fa3()
        if fn is None:
            raise RuntimeError("attention backend 'fa3' is not installed (the fa3_fwd wheel)")
        return fn(q, k, v)
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if backend == "sdpa":
        out = F.scaled_dot_product_attention(qh, kh, vh)
    else:
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel([_sdpa_backend(backend)]):
            out = F.scaled_dot_product_attention(qh, kh, vh)
    return out.transpose(1, 2)
