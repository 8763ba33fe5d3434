"""The fused Wan VAE decoder (models/wan/vae_fused.py, kernels/vae_norm.py) against diffusers'
modules on a CPU: the norm's PyTorch twin against ``WanRMS_norm`` (+ SiLU), the one-allocation
causal convolution against ``WanCausalConv3d`` (with and without a cache), the upsamplers'
interpolation and time interleave against diffusers' values, a fused tiny ``AutoencoderKLWan``
(Wan2.1 and Wan2.2 layouts) against the same model unfused (frames and feature cache), the
activations' channels-last layout through a fused bf16 decode, and the ``VideoDecoder`` switch. The Triton kernel's checks live in ``test_vae_fused_triton.py``, run
here in a child pytest under ``TRITON_INTERPRET=1`` (skipped only when Triton is missing)."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, WanDecoder3d, WanRMS_norm

from fastvideo3.kernels import triton_available
from fastvideo3.kernels.vae_norm import rms_norm_silu, row_layout
from fastvideo3.models.wan import vae_decode as vd
from fastvideo3.models.wan import vae_fused as vf
from tests.helpers_vae import WAN21, WAN22, tiny_vae
from tests.helpers_env import triton_interpreter_env

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
CL = torch.channels_last_3d


def _ref_norm(norm: WanRMS_norm, x: torch.Tensor, silu: bool) -> torch.Tensor:
    y = norm(x)
    return F.silu(y) if silu else y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("silu", [False, True])
def test_norm_twin_is_wan_rms_norm(dtype, silu):
    g = torch.Generator().manual_seed(1)
    cases = [(False, (2, 24, 3, 5, 7), CL), (False, (2, 24, 3, 5, 7), torch.contiguous_format),
             (True, (6, 24, 5, 7), torch.channels_last), (True, (6, 24, 5, 7), torch.contiguous_format)]
    for images, shape, fmt in cases:
        for bias in (False, True):
            norm = WanRMS_norm(24, images=images, bias=bias).to(dtype).requires_grad_(False)
            norm.gamma.copy_(torch.randn(norm.gamma.shape, generator=g))
            if bias:
                norm.bias.copy_(torch.randn(norm.bias.shape, generator=g))
            x = (torch.randn(shape, generator=g) * 3).to(dtype).contiguous(memory_format=fmt)
            got = rms_norm_silu(x, norm.gamma, norm.bias, silu=silu, impl="torch")
            want = _ref_norm(norm, x, silu)
            assert torch.equal(got, want) and got.dtype == want.dtype
            assert got.stride() == want.stride()  # the memory format kept


def test_norm_writes_into_a_time_slice():
    g = torch.Generator().manual_seed(2)
    norm = WanRMS_norm(16, images=False).requires_grad_(False)
    norm.gamma.copy_(torch.randn(norm.gamma.shape, generator=g))
    x = torch.randn(2, 16, 3, 4, 5, generator=g).contiguous(memory_format=CL)
    for fmt in (CL, torch.contiguous_format):
        buf = torch.full((2, 16, 5, 4, 5), 7.0).contiguous(memory_format=fmt)
        rms_norm_silu(x, norm.gamma, norm.bias, silu=True, out=buf[:, :, 2:], impl="torch")
        assert torch.equal(buf[:, :, 2:], F.silu(norm(x))) and (buf[:, :, :2] == 7).all()
    with pytest.raises(ValueError):
        rms_norm_silu(x, norm.gamma, out=buf[:, :, 1:])


def test_row_layout():
    x = torch.zeros(2, 8, 3, 4, 5)
    assert row_layout(x) == (480, 1, 60)
    assert row_layout(x.contiguous(memory_format=CL)) == (480, 8, 1)
    assert row_layout(x.contiguous(memory_format=CL)[:, :, 1:]) == (480, 8, 1)
    assert row_layout(x[:, :, 1:]) == (480, 1, 60)
    assert row_layout(x[:, :, :, 1:]) is None  # a spatial crop leaves gaps between positions
    assert row_layout(torch.zeros(6, 8, 4, 5).contiguous(memory_format=torch.channels_last)) == (160, 8, 1)


def _fused_conv(conv: WanCausalConv3d) -> WanCausalConv3d:
    f = copy.deepcopy(conv)
    f.__class__ = vf.FusedCausalConv3d
    return f


@pytest.mark.parametrize("fmt", [CL, torch.contiguous_format])
def test_causal_conv_matches_wan_causal_conv3d(fmt):
    torch.manual_seed(3)
    for args in ((6, 8, 3, 1, 1), (6, 12, (3, 1, 1), 1, (1, 0, 0)), (6, 8, 1, 1, 0)):
        cin, cout, k, stride, pad = args
        conv = WanCausalConv3d(cin, cout, k, stride=stride, padding=pad).requires_grad_(False)
        conv.weight.data = conv.weight.data.contiguous(memory_format=fmt)
        fused = _fused_conv(conv)
        assert vf.supported(conv)
        for t in (1, 3):
            x = torch.randn(2, cin, t, 5, 6).contiguous(memory_format=fmt)
            for n in (0, 1, 2):
                cache = torch.randn(2, cin, n, 5, 6) if n else None
                want = conv(x, cache)
                got = fused(x, cache)
                assert got.shape == want.shape
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_time_padded_input_and_cache():
    conv = WanCausalConv3d(4, 4, 3, padding=1)
    x = torch.randn(1, 4, 1, 3, 3)
    cache = torch.randn(1, 4, 1, 3, 3)
    buf, body = vf.time_padded(conv, x, cache)
    assert buf.shape == (1, 4, 3, 3, 3) and (buf[:, :, 0] == 0).all() and torch.equal(buf[:, :, 1:2], cache)
    body.copy_(x)
    # diffusers' rule: x's last CACHE_T frames, the old cache's last frame in front of a one-frame chunk
    assert torch.equal(vf.next_cache(buf, 1, cache), torch.cat([cache, x], 2))
    assert torch.equal(vf.next_cache(buf, 1, None), x)
    with pytest.raises(ValueError):
        vf.time_padded(conv, x, torch.zeros(1, 4, 3, 3, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_upsample_and_interleave_are_diffusers_values(dtype):
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanUpsample
    g = torch.Generator().manual_seed(7)
    up = WanUpsample(scale_factor=(2.0, 2.0), mode="nearest-exact")
    fused = copy.deepcopy(up)
    fused.__class__ = vf.FusedUpsample
    x = torch.randn(3, 8, 5, 7, generator=g).to(dtype)
    for xx in (x, x.contiguous(memory_format=torch.channels_last)):
        got, want = fused(xx), up(xx)
        assert torch.equal(got, want) and got.dtype == dtype
        assert got.is_contiguous(memory_format=torch.channels_last) == xx.is_contiguous(memory_format=torch.channels_last)
    y = torch.randn(2, 12, 3, 4, 5, generator=g).to(dtype)
    for yy in (y, y.contiguous(memory_format=CL)):
        b, c2, t, h, w = yy.shape
        r = yy.reshape(b, 2, c2 // 2, t, h, w)
        want = torch.stack((r[:, 0], r[:, 1]), 3).reshape(b, c2 // 2, t * 2, h, w)  # WanResample's
        got = vf.interleave(yy)
        assert torch.equal(got, want)
        assert got.is_contiguous(memory_format=CL) == yy.is_contiguous(memory_format=CL)


def _norm_inputs(model, z, chunk: int) -> list[tuple[int, torch.Tensor]]:
    """(chunk frames, input) of every WanRMS_norm (fused or not) in a chunked decode."""
    seen: list = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
             for m in model.decoder.modules() if isinstance(m, WanRMS_norm)]
    orig = vf.rms_norm_silu
    vf.rms_norm_silu = lambda x, *a, **k: (seen.append(x), orig(x, *a, **k))[1]
    try:
        vd.chunked_decode(model, z, chunk)
    finally:
        vf.rms_norm_silu = orig
        for h in hooks:
            h.remove()
    return seen


def _convs_keep_channels_last() -> bool:
    """Whether this CPU's 3-D convolutions return channels-last for channels-last weights, as
    cuDNN's do (oneDNN's on CPUs with AVX-512; an AVX2 CPU returns channels-first)."""
    conv = torch.nn.Conv3d(4, 4, 3, padding=1).bfloat16()
    conv.weight.data = conv.weight.data.contiguous(memory_format=torch.channels_last_3d)
    x = torch.randn(1, 4, 2, 3, 3).bfloat16().contiguous(memory_format=torch.channels_last_3d)
    return conv(x).is_contiguous(memory_format=torch.channels_last_3d)


def test_fused_decode_keeps_activations_channels_last(monkeypatch):
    """With convolutions that keep channels-last (cuDNN's; on a CPU whose convolutions do not,
    each convolution's output is made channels-last as cuDNN would return it), every norm of a
    multi-frame chunk of the fused decoder reads a channels-last activation (the kernel's
    contiguous rows), where diffusers' time upsampler hands the next block a [B, T, C, H, W]-ordered one."""
    if not _convs_keep_channels_last():
        conv3d = F.conv3d

        def like_cudnn(x, weight, *args, **kw):
            y = conv3d(x, weight, *args, **kw)
            # PyTorch's rule for cuDNN: channels-last out when the input or the weight is
            cl = any(t.is_contiguous(memory_format=torch.channels_last_3d) for t in (x, weight))
            return y.contiguous(memory_format=torch.channels_last_3d) if cl else y
        monkeypatch.setattr(torch.nn.functional, "conv3d", like_cudnn)
    z = torch.randn(1, WAN21["z_dim"], 3, 4, 6, generator=torch.Generator().manual_seed(8)).bfloat16()

    def multi_frame_cl(model) -> list[bool]:
        vd.to_channels_last(model)
        layouts = [row_layout(x) for x in _norm_inputs(model, z, 2) if x.dim() == 5 and x.shape[2] > 1]
        return [lay is not None and lay[2] == 1 for lay in layouts]

    ref = tiny_vae(WAN21).bfloat16()
    fused = copy.deepcopy(ref)
    vd.fuse_decoder(fused, impl="torch")
    plain, ours = multi_frame_cl(ref), multi_frame_cl(fused)
    assert ours and all(ours), ours
    assert not all(plain)  # the upsampler's stack leaves channels-last


def _caches_close(a: list, b: list) -> None:
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert type(u) is type(v)
        if isinstance(u, torch.Tensor):
            assert u.shape == v.shape
            torch.testing.assert_close(u, v, atol=1e-5, rtol=1e-5)
        else:
            assert u == v


@pytest.mark.parametrize("cfg", [WAN21, WAN22], ids=["wan21", "wan22"])
def test_fused_decode_matches_diffusers(cfg):
    ref = tiny_vae(cfg)
    fused = copy.deepcopy(ref)
    n = vd.fuse_decoder(fused, impl="torch")
    assert n > 0 and vd.is_fused(fused) and not vd.is_fused(ref)
    assert vd.fuse_decoder(fused, impl="torch") == 0  # a second call swaps nothing
    z = torch.randn(1, cfg["z_dim"], 4, 3, 4, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = ref.decode(z, return_dict=False)[0]
        got = fused.decode(z, return_dict=False)[0]
        assert (got - want).abs().max() <= 1e-5
        # the serving path: time-chunked, and with channels-last weights
        want_c = vd.chunked_decode(ref, z, 2)
        assert (vd.chunked_decode(fused, z, 2) - want_c).abs().max() <= 1e-5
        vd.to_channels_last(fused)
        assert (vd.chunked_decode(fused, z, 3) - want).abs().max() <= 1e-5
        # the feature cache holds what diffusers' holds after every call
        for m in (ref, fused):
            m.clear_cache()
            x = m.post_quant_conv(z)
            for k, (a, b) in enumerate(vd.chunks(x.shape[2], 2)):
                m._conv_idx = [0]
                m.decoder(x[:, :, a:b], feat_cache=m._feat_map, feat_idx=m._conv_idx, first_chunk=k == 0)
        _caches_close(fused._feat_map, ref._feat_map)
        assert fused._conv_idx == ref._conv_idx


def test_unfuse_restores_diffusers_modules():
    m = tiny_vae(WAN21)
    classes = {name: type(mod) for name, mod in m.named_modules()}
    keys = list(m.state_dict())
    n = vd.fuse_decoder(m)
    assert isinstance(m.decoder, vf.FusedDecoder3d) and isinstance(m.decoder, WanDecoder3d)
    assert list(m.state_dict()) == keys
    assert not any(isinstance(mod, vf._Fused) for mod in m.encoder.modules())  # the encoder untouched
    assert vd.unfuse_decoder(m) == n and not vd.is_fused(m)
    assert {name: type(mod) for name, mod in m.named_modules()} == classes
    assert vd.fuse_decoder(torch.nn.Linear(2, 2)) == 0 and vd.unfuse_decoder(torch.nn.Linear(2, 2)) == 0


def _wan_vae_card():
    from fastvideo3.card.registry import get_card
    card = get_card("wan-tiny-seeded")
    data = card.model_dump(mode="json")
    data["components"]["vae"]["config"] = dict(WAN21, z_dim=16)  # the card's 16 latent means and stds
    return type(card).model_validate(data)


def test_video_decoder_fuses_on_request():
    from fastvideo3.models.wan.components import VideoDecoder
    card = _wan_vae_card()
    plain = VideoDecoder(card, "cpu", fast=True)
    assert plain.fast and not plain.fused and not vd.is_fused(plain.model)  # CPU default: unfused
    assert not VideoDecoder(card, "cpu", fused=True).fused  # fusion rides on the fast path
    fused = VideoDecoder(card, "cpu", fast=True, fused=True)
    assert fused.fused and vd.is_fused(fused.model)
    lat = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(5))
    assert (fused.decode(lat) - plain.decode(lat)).abs().max() <= 1e-5


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the Triton file runs in-process already")
def test_triton_kernel_under_the_interpreter():
    env = triton_interpreter_env()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_vae_fused_triton.py",
         "-k", "not on_gpu"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=110,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]
