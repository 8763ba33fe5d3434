"""The Wan VAE's decode with fewer, larger calls: the same causal computation as diffusers'
``AutoencoderKLWan._decode``, time-chunked.

diffusers decodes one latent frame per decoder call, carrying each causal convolution's last two
input frames in a feature cache. Every causal convolution in the decoder pads its input with the
cached frames (zeros before the first), and every other layer works per frame (RMS norm over
channels, spatial attention within one frame, the time upsampler's interleave), so a call over
``k`` latent frames computes what ``k`` one-frame calls compute — as long as the first latent
frame is its own call: the time upsamplers skip frame 0 ("Rep") and the Wan2.2 shortcut trims it
(``first_chunk``). :func:`chunked_decode` therefore decodes latent frame 0 alone, then the rest
``time_chunk`` frames per call (one Python pass through the decoder per chunk instead of per
frame), and ends exactly as diffusers does (unpatchify, clamp to ``[-1, 1]``). ``time_chunk=1``
is diffusers' schedule.

On CUDA, :func:`cuda_flags` turns on cuDNN autotuning for the decode's convolution shapes
(scoped to the call, so nothing else in the process changes) and :func:`to_channels_last`
stores the decoder's 3-D convolution weights channels-last, the layout cuDNN's fastest
bf16 kernels read. :func:`fuse_decoder` swaps the decoder's norm + SiLU pairs and causal
convolutions for fused forwards (:mod:`fastvideo3.models.wan.vae_fused`: one Triton pass per
norm, written into the next convolution's padded input, and no ``cat`` + ``F.pad`` copies);
:func:`unfuse_decoder` restores diffusers' modules.
"""
from __future__ import annotations

import contextlib

import torch

#: latent frames per decoder call after the first (whole clip for the usual 81-frame requests)
DEFAULT_TIME_CHUNK = 8


def is_wan_vae(model) -> bool:
    """True for diffusers' ``AutoencoderKLWan`` (the module :func:`chunked_decode` drives)."""
    try:
        from diffusers import AutoencoderKLWan
    except ImportError:  # pragma: no cover - diffusers is a dependency of every Wan VAE
        return False
    return isinstance(model, AutoencoderKLWan)


def chunks(num_frames: int, time_chunk: int) -> list[tuple[int, int]]:
    """``[(start, stop)]`` over latent frames: frame 0 alone, then ``time_chunk`` at a time."""
    if time_chunk < 1:
        raise ValueError(f"time_chunk must be >= 1, got {time_chunk}")
    return [(0, min(1, num_frames))] + [(i, min(i + time_chunk, num_frames)) for i in range(1, num_frames, time_chunk)]


@torch.no_grad()
def chunked_decode(model, z: torch.Tensor, time_chunk: int = DEFAULT_TIME_CHUNK) -> torch.Tensor:
    """``AutoencoderKLWan`` latents ``[B, z, T, h, w]`` (de-normalised) -> video ``[B, 3, F, H, W]``
    in ``[-1, 1]``, as ``model.decode(z, return_dict=False)[0]`` computes it (tiling off)."""
    model.clear_cache()
    try:
        x = model.post_quant_conv(z)
        outs = []
        for k, (a, b) in enumerate(chunks(x.shape[2], time_chunk)):
            model._conv_idx = [0]
            outs.append(model.decoder(x[:, :, a:b], feat_cache=model._feat_map, feat_idx=model._conv_idx,
                                      first_chunk=k == 0))
        out = torch.cat(outs, 2) if len(outs) > 1 else outs[0]
        patch = getattr(model.config, "patch_size", None)
        if patch is not None:
            from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify
            out = unpatchify(out, patch_size=patch)
        return torch.clamp(out, min=-1.0, max=1.0)
    finally:
        model.clear_cache()  # the cache holds activations of the whole clip's last frames


def to_channels_last(model) -> None:
    """Store the decoder's 5-D convolution weights channels-last (``torch.channels_last_3d``)."""
    for m in model.modules():
        if isinstance(m, torch.nn.Conv3d):
            m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last_3d)


def fuse_decoder(model, impl: str | None = None) -> int:
    """Fuse the Wan VAE decoder's norm + SiLU pairs and causal convolutions in place (the same
    computation; see :mod:`fastvideo3.models.wan.vae_fused`). ``impl`` picks the norm kernel:
    ``"triton"``, ``"torch"``, or None for Triton on CUDA tensors when it is installed. Returns
    how many modules were swapped (0 for a model that is not an ``AutoencoderKLWan``)."""
    if not is_wan_vae(model):
        return 0
    from fastvideo3.models.wan import vae_fused
    return vae_fused.fuse(model, impl)


def unfuse_decoder(model) -> int:
    """Undo :func:`fuse_decoder`: diffusers' own modules again; returns how many were restored."""
    if not is_wan_vae(model):
        return 0
    from fastvideo3.models.wan import vae_fused
    return vae_fused.unfuse(model)


def is_fused(model) -> bool:
    """Whether :func:`fuse_decoder` has fused this model's decoder."""
    if not is_wan_vae(model):
        return False
    from fastvideo3.models.wan import vae_fused
    return vae_fused.is_fused(model)


@contextlib.contextmanager
def cuda_flags(device: str):
    """cuDNN autotuning for the duration of a decode on CUDA (every other cuDNN setting as it
    is); nothing on another device."""
    if not str(device).startswith("cuda"):
        yield
        return
    prev = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = prev
