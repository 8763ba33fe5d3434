"""The CUDA forward of our HunyuanVideo-1.5 DiT: the same module and weights, every attention
(the joint video/text attention of each block and the token refiner's) through the fused kernels
of :mod:`fastvideo3.kernels.attention` -- FlashAttention-3 where its wheel imports on Hopper, else
PyTorch's SDPA choice (flash / cuDNN at bf16).

Padding is never attended: each row runs over its own valid text length, so no mask is built and
the kernels run unmasked, where the reference materializes a ``[B, 1, S, S]`` boolean mask over
video and text tokens and SDPA then cannot use a flash kernel. Numerics are the reference module's
(:class:`~fastvideo3.models.hunyuan15.dit.HunyuanDiT`); only the attention kernel differs.
"""
from __future__ import annotations

import functools

import torch

from fastvideo3.kernels import attention, attention_available
from fastvideo3.models.hunyuan15.dit import HunyuanDiT

PREFERRED_ATTENTION = ("fa3", "sdpa")


def pick_backend(device, dtype: torch.dtype) -> str:
    """The first preferred backend that runs on ``device`` at ``dtype`` (fa3: bf16/fp16 only)."""
    for name in PREFERRED_ATTENTION:
        if name == "fa3" and dtype not in (torch.bfloat16, torch.float16):
            continue
        if attention_available(name, device):
            return name
    return "sdpa"


class FastHunyuanDiT(torch.nn.Module):
    """Wraps a loaded :class:`HunyuanDiT`; ``forward(latents, timestep, text)`` as the model's."""

    #: each row's valid text length is read on the host, so the forward runs eagerly, never in a
    #: captured CUDA graph (the pool refuses to prepare graph buckets for it)
    capturable = False

    def __init__(self, model: HunyuanDiT, backend: str | None = None):
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        weight = model.proj_out.weight
        self.backend = backend or pick_backend(weight.device, weight.dtype)
        attend = functools.partial(attention, backend=self.backend)
        for block in model.transformer_blocks:
            block.attn.attend = attend
        self.lora = None  # the executor's adapter store; this DiT adapts no layers

    @property
    def num_blocks(self) -> int:
        return self.model.num_blocks

    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, tap=None) -> torch.Tensor:
        return self.model(latents, timestep, text, tap)
