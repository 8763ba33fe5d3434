"""Fused forwards for the Wan VAE decoder's modules: fewer full passes over its activations.

diffusers' ``WanCausalConv3d`` builds its input with ``torch.cat([cache, x])`` and then
``F.pad`` (time and space): two copies of the activation per convolution, and a clone for a
1x1x1 convolution (``F.pad`` by zeros). Each ``WanRMS_norm`` + SiLU is six more passes. Here:

* a causal convolution allocates its time-padded input once (zeros, then the cached frames,
  then ``x``) and leaves the spatial zero padding to the convolution's own ``padding``;
  without time padding it convolves ``x`` as it is;
* a residual block and the decoder's head write the fused norm + SiLU
  (:func:`fastvideo3.kernels.vae_norm.rms_norm_silu`) straight into the next convolution's
  padded input, so that activation is written once and never copied;
* the attention block's norm is the fused norm without SiLU;
* the upsamplers' nearest-exact interpolation runs in the activation dtype (diffusers' fp32
  round trip copies values exactly, so it changes nothing but two passes), and the time
  upsampler interleaves its two output halves with one copy into the activation's own memory
  format (diffusers' ``torch.stack`` of 6-D tensors leaves channels-last: its 2-D convolution
  then ran channels-first and the next block read a [B, T, C, H, W]-ordered activation).

The feature cache holds what diffusers' holds (each causal convolution's last ``CACHE_T``
input frames, the previous chunk's last frame prepended after a one-frame chunk), so a fused
decode is diffusers' computation, decoded with :func:`fastvideo3.models.wan.vae_decode.chunked_decode`
or ``AutoencoderKLWan.decode``; fp32 results agree to rounding (the norm's sum order, the
convolution's algorithm). :func:`fuse` swaps the class of each module in place (the fused
classes subclass diffusers', so weights, ``isinstance`` and ``state_dict`` are unchanged) and
:func:`unfuse` swaps it back.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_wan import (CACHE_T, AutoencoderKLWan, WanCausalConv3d,
                                                              WanDecoder3d, WanResample, WanResidualBlock,
                                                              WanRMS_norm, WanUpsample)
from torch import nn

from fastvideo3.kernels.vae_norm import rms_norm_silu

_CL = torch.channels_last_3d


def _strictly_cl(t: torch.Tensor) -> bool:
    return t.dim() == 5 and t.is_contiguous(memory_format=_CL) and not t.is_contiguous()


def supported(conv: WanCausalConv3d) -> bool:
    """Whether the fused forward computes this convolution: zero padding, the same before and
    after in each spatial dim (diffusers' construction), nothing after in time."""
    p = conv._padding
    return conv.padding_mode == "zeros" and p[0] == p[1] and p[2] == p[3] and p[5] == 0


def time_padded(conv: WanCausalConv3d, x: torch.Tensor,
                cache: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(buf, body)``: ``conv``'s input [B, C, pad_t + T, H, W] for an activation shaped like
    ``x``, its first ``pad_t`` frames zeros then ``cache``'s frames (as diffusers pads
    ``cat([cache, x])``), and ``body`` the last T frames, still to be written. Channels-last when ``x`` or the weight is (the layout cuDNN picks for the
    convolution). Without time padding ``cache`` is ignored (as in diffusers) and ``buf`` is
    ``body``."""
    b, c, t, h, w = x.shape
    pt = conv._padding[4]
    fmt = _CL if _strictly_cl(x) or _strictly_cl(conv.weight) else torch.contiguous_format
    buf = torch.empty((b, c, pt + t, h, w), dtype=x.dtype, device=x.device, memory_format=fmt)
    if pt:
        n = 0 if cache is None else cache.shape[2]
        if n > pt:
            raise ValueError(f"a cache of {n} frames for a causal conv padding {pt}")
        if pt > n:
            buf[:, :, :pt - n].zero_()
        if n:
            buf[:, :, pt - n:pt].copy_(cache)
    return buf, buf[:, :, pt:]


def convolve(conv: WanCausalConv3d, buf: torch.Tensor) -> torch.Tensor:
    """``conv`` over its time-padded input, spatial zero padding by the convolution itself."""
    return F.conv3d(buf, conv.weight, conv.bias, conv.stride, (0, conv._padding[2], conv._padding[0]),
                    conv.dilation, conv.groups)


def next_cache(buf: torch.Tensor, t: int, cache: torch.Tensor | None) -> torch.Tensor:
    """What diffusers stores after a convolution over ``buf`` (``t`` new frames at its end):
    ``x[:, :, -CACHE_T:]``, with the previous cache's last frame in front after a one-frame
    chunk (it sits just before the new frames in ``buf``)."""
    keep = CACHE_T if cache is not None else min(t, CACHE_T)
    return buf[:, :, buf.shape[2] - keep:].clone()


class _Fused:
    """Marks a fused class; ``_fused_impl`` is the norm kernel's ``impl`` (None: by device)."""
    _fused_impl: str | None = None


class FusedCausalConv3d(_Fused, WanCausalConv3d):
    """``WanCausalConv3d`` with one allocation for its padded input (none without time padding)."""

    def forward(self, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
        pt = self._padding[4]
        if cache_x is not None and cache_x.shape[2] > pt > 0:
            return super().forward(x, cache_x)
        if pt == 0:
            return convolve(self, x)
        buf, body = time_padded(self, x, cache_x if cache_x is None else cache_x.to(x.device))
        body.copy_(x)
        return convolve(self, buf)


class FusedRMSNorm(_Fused, WanRMS_norm):
    """``WanRMS_norm`` (channels first) in one pass."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_silu(x, self.gamma, self.bias, silu=False, scale=self.scale, impl=self._fused_impl)


class FusedUpsample(_Fused, WanUpsample):
    """``WanUpsample`` (nearest or nearest-exact) without the fp32 round trip: the same values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.Upsample.forward(self, x)


def interleave(y: torch.Tensor) -> torch.Tensor:
    """The time upsampler's ``[B, 2C, T, H, W] -> [B, C, 2T, H, W]`` (frame ``2i + k`` is channel
    half ``k`` of frame ``i``), in one copy, in ``y``'s memory format."""
    b, c2, t, h, w = y.shape
    c = c2 // 2
    fmt = _CL if _strictly_cl(y) else torch.contiguous_format
    out = torch.empty((b, c, 2 * t, h, w), dtype=y.dtype, device=y.device, memory_format=fmt)
    out.unflatten(2, (t, 2)).copy_(y.view(b, 2, c, t, h, w).permute(0, 2, 3, 1, 4, 5))
    return out


class FusedResample(_Fused, WanResample):
    """``WanResample`` whose time upsampler interleaves with :func:`interleave` (the other modes
    as diffusers runs them)."""

    def forward(self, x: torch.Tensor, feat_cache=None, feat_idx=[0]) -> torch.Tensor:  # noqa: B006
        if self.mode != "upsample3d" or feat_cache is None:
            return super().forward(x, feat_cache, feat_idx)
        b, c, t, h, w = x.shape
        idx = feat_idx[0]
        cache = feat_cache[idx]
        if cache is None:  # the first chunk: no time upsampling ("Rep" marks the next chunk's)
            feat_cache[idx] = "Rep"
        else:
            rep = isinstance(cache, str)
            cache_x = x[:, :, -CACHE_T:].clone()
            if cache_x.shape[2] < 2:
                head = torch.zeros_like(cache_x) if rep else cache[:, :, -1:].to(cache_x.device)
                cache_x = torch.cat([head, cache_x], dim=2)
            x = interleave(self.time_conv(x) if rep else self.time_conv(x, cache))
            feat_cache[idx] = cache_x
        feat_idx[0] += 1
        t = x.shape[2]
        x = self.resample(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        return x.view(b, t, x.size(1), x.size(2), x.size(3)).permute(0, 2, 1, 3, 4)


def norm_silu_conv(norm: WanRMS_norm, conv: WanCausalConv3d, x: torch.Tensor, feat_cache, feat_idx,
                   impl: str | None) -> torch.Tensor:
    """``conv(silu(norm(x)))`` with the feature cache as diffusers keeps it: the norm writes into
    the convolution's padded input."""
    cache = None
    if feat_cache is not None:
        idx = feat_idx[0]
        cache = feat_cache[idx]
    buf, body = time_padded(conv, x, cache)
    rms_norm_silu(x, norm.gamma, norm.bias, silu=True, scale=norm.scale, out=body, impl=impl)
    if feat_cache is not None:
        feat_cache[idx] = next_cache(buf, x.shape[2], cache)
        feat_idx[0] += 1
    return convolve(conv, buf)


def cached_conv(conv: WanCausalConv3d, x: torch.Tensor, feat_cache, feat_idx) -> torch.Tensor:
    """``conv(x)`` with the feature cache as diffusers keeps it (the decoder's ``conv_in``)."""
    cache = None
    if feat_cache is not None:
        idx = feat_idx[0]
        cache = feat_cache[idx]
    buf, body = time_padded(conv, x, cache)
    body.copy_(x)
    if feat_cache is not None:
        feat_cache[idx] = next_cache(buf, x.shape[2], cache)
        feat_idx[0] += 1
    return convolve(conv, buf)


class FusedResidualBlock(_Fused, WanResidualBlock):
    """``WanResidualBlock``: each norm + SiLU written into its convolution's padded input, the
    shortcut added in place."""

    def forward(self, x: torch.Tensor, feat_cache=None, feat_idx=[0]) -> torch.Tensor:  # noqa: B006
        if self.training and self.dropout.p > 0:
            return super().forward(x, feat_cache, feat_idx)
        h = self.conv_shortcut(x)
        x = norm_silu_conv(self.norm1, self.conv1, x, feat_cache, feat_idx, self._fused_impl)
        x = norm_silu_conv(self.norm2, self.conv2, x, feat_cache, feat_idx, self._fused_impl)
        return x.add_(h)


class FusedDecoder3d(_Fused, WanDecoder3d):
    """``WanDecoder3d``: ``conv_in`` with one copy, the head's norm + SiLU written into
    ``conv_out``'s padded input."""

    def forward(self, x: torch.Tensor, feat_cache=None, feat_idx=[0], first_chunk=False) -> torch.Tensor:  # noqa: B006
        x = cached_conv(self.conv_in, x, feat_cache, feat_idx)
        x = self.mid_block(x, feat_cache=feat_cache, feat_idx=feat_idx)
        for up_block in self.up_blocks:
            x = up_block(x, feat_cache=feat_cache, feat_idx=feat_idx, first_chunk=first_chunk)
        return norm_silu_conv(self.norm_out, self.conv_out, x, feat_cache, feat_idx, self._fused_impl)


_FUSED: dict[type, type] = {WanCausalConv3d: FusedCausalConv3d, WanRMS_norm: FusedRMSNorm,
                            WanResidualBlock: FusedResidualBlock, WanDecoder3d: FusedDecoder3d,
                            WanUpsample: FusedUpsample, WanResample: FusedResample}


def _fusable(m: nn.Module) -> bool:
    """Exactly one of diffusers' classes, in the configuration the fused forward computes."""
    if "forward" in m.__dict__:  # a hook (accelerate's offload) owns this module's forward
        return False
    t = type(m)
    if t is WanCausalConv3d:
        return supported(m)
    if t is WanRMS_norm:
        return m.channel_first
    if t is WanUpsample:
        return m.mode in ("nearest", "nearest-exact")
    if t is WanResample:
        return m.mode != "upsample3d" or supported(m.time_conv)
    if t is WanResidualBlock:
        return (isinstance(m.nonlinearity, nn.SiLU) and m.norm1.channel_first and m.norm2.channel_first
                and supported(m.conv1) and supported(m.conv2) and m.conv1._padding[4] >= CACHE_T
                and m.conv2._padding[4] >= CACHE_T)
    if t is WanDecoder3d:
        return (isinstance(m.nonlinearity, nn.SiLU) and m.norm_out.channel_first and supported(m.conv_in)
                and supported(m.conv_out) and m.conv_in._padding[4] >= CACHE_T and m.conv_out._padding[4] >= CACHE_T)
    return False


def _decode_modules(model: AutoencoderKLWan) -> list[nn.Module]:
    return [model.post_quant_conv, *model.decoder.modules()]


def fuse(model: AutoencoderKLWan, impl: str | None = None) -> int:
    """Swap the decoder's modules (and ``post_quant_conv``) for the fused classes, in place;
    ``impl`` picks the norm kernel (None: Triton on CUDA when installed, else PyTorch). Returns
    how many modules were swapped; a second call only updates ``impl``."""
    n = 0
    for m in _decode_modules(model):
        if isinstance(m, _Fused):
            m._fused_impl = impl
        elif _fusable(m):
            m.__class__ = _FUSED[type(m)]
            m._fused_impl = impl
            n += 1
    return n


def unfuse(model: AutoencoderKLWan) -> int:
    """Give every fused module back its diffusers class; returns how many."""
    n = 0
    for m in _decode_modules(model):
        if isinstance(m, _Fused):
            m.__dict__.pop("_fused_impl", None)
            m.__class__ = next(k for k, v in _FUSED.items() if v is type(m))
            n += 1
    return n


def is_fused(model: AutoencoderKLWan) -> bool:
    """Whether :func:`fuse` has swapped this model's decoder."""
    return isinstance(model.decoder, _Fused) or any(isinstance(m, _Fused) for m in model.decoder.modules())
