"""FP8 self-attention's quantization on the CPU: the Q/K/V scales of each scheme (``bound``,
``amax``, ``smooth_k``) against a reference e4m3 (tests/helpers_fp8.py), saturation, the round trip, and
SageAttention's K smoothing (softmax is invariant to it; it shrinks the score error when K shares
an offset). The FlashAttention-3 call itself is GPU-only (test_fp8_cuda.py)."""
from __future__ import annotations

import math

import pytest
import torch

from fastvideo3.kernels import qk_norm_rope
from fastvideo3.kernels.fp8 import ATTENTION_SCALES, E4M3, qk_scale_bound, qkv_fp8
from fastvideo3.kernels.fused import RopeGrid
from fastvideo3.models.wan.dit import rope_tables
from tests.helpers_fp8 import ref_e4m3

pytestmark = pytest.mark.timeout(120)

HEADS, HD, GRID = 4, 32, (2, 4, 6)
D, N = HEADS * HD, 2 * 4 * 6


# ------------------------------------------------------------------------------------ inputs
def _rope() -> RopeGrid:
    cos, sin = rope_tables(HD, 16)
    return RopeGrid(cos, sin, GRID, HD - 2 * (2 * (HD // 6)), 2 * (HD // 6))


def _inputs(k_offset: float = 0.0, seed: int = 0):
    """qkv [2, N, 3D] bf16; K gets a shared per-channel offset (a trained K's typical bias)."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(2, N, 3 * D, generator=g)
    qkv[..., D:2 * D] += k_offset * torch.randn(1, 1, D, generator=g)
    norm = torch.rand(2, D, generator=g) + 0.5
    return qkv.bfloat16(), norm


def _reference(qkv, norm, scheme):
    """The quantized Q/K/V codes and descales [3, B, H] of ``scheme``, written out here."""
    b = qkv.shape[0]
    qk = qk_norm_rope(qkv, norm, parts=2, eps=1e-6, heads=HEADS, rope=_rope(), impl="torch").double()
    q, k, v = qk[..., :D], qk[..., D:], qkv[..., 2 * D:].double()
    per_head = lambda t: t.abs().view(b, N, HEADS, HD).amax(dim=(1, 3))  # noqa: E731
    if scheme == "bound":
        sq = (math.sqrt(D) * norm[0].double().view(HEADS, HD).amax(1) / 448).expand(b, HEADS)
        sk = (math.sqrt(D) * norm[1].double().view(HEADS, HD).amax(1) / 448).expand(b, HEADS)
    else:
        sq = per_head(q) / 448
        if scheme == "smooth_k":
            mean = k.mean(dim=1, keepdim=True)
            sk = (per_head(k) + mean.abs().view(b, HEADS, HD).amax(2)) / 448
            k = k - mean
        else:
            sk = per_head(k) / 448
    scales = torch.stack([sq, sk, per_head(v) / 448])  # [3, B, H]
    parts = [ref_e4m3(t.view(b, N, HEADS, HD) / s[:, None, :, None]) for t, s in zip((q, k, v), scales)]
    return parts, scales


def _split(q8):
    b = q8.shape[0]
    return [q8[..., i * D:(i + 1) * D].float().view(b, N, HEADS, HD) for i in range(3)]


# ------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("scheme", ATTENTION_SCALES)
def test_scales_and_codes_match_reference(scheme):
    qkv, norm = _inputs(k_offset=3.0)
    bounds = torch.stack([qk_scale_bound(norm[0], HEADS), qk_scale_bound(norm[1], HEADS)])
    q8, scales = qkv_fp8(qkv, norm, bounds, heads=HEADS, eps=1e-6, rope=_rope(), scales=scheme)
    assert q8.dtype == E4M3 and q8.shape == qkv.shape and scales.shape == (3, 2, HEADS)
    want_codes, want_scales = _reference(qkv, norm, scheme)
    torch.testing.assert_close(scales.double(), want_scales, rtol=1e-5, atol=0)
    for got, want in zip(_split(q8), want_codes):
        # x * (1/s) against x / s may round a tie the other way: at most one step, rarely
        assert ((got.double() - want).abs() <= want.abs() / 8 + 2.0**-9).all()
        assert (got.double() == want).float().mean() > 0.99


@pytest.mark.parametrize("scheme", ATTENTION_SCALES)
def test_no_saturation_and_measured_scales_use_the_range(scheme):
    qkv, norm = _inputs(k_offset=3.0, seed=1)
    bounds = torch.stack([qk_scale_bound(norm[0], HEADS), qk_scale_bound(norm[1], HEADS)])
    q8, _ = qkv_fp8(qkv, norm, bounds, heads=HEADS, eps=1e-6, rope=_rope(), scales=scheme)
    code_max = [t.abs().amax(dim=(1, 3)) for t in _split(q8)]  # [B, H] per part
    for m in code_max:
        assert (m <= 448).all() and torch.isfinite(m).all()
    assert torch.equal(code_max[2], torch.full_like(code_max[2], 448.0))  # V: measured amax
    if scheme == "amax":  # each head's largest element lands on 448 (bf16 statistics: within a step)
        assert (code_max[0] >= 416).all() and (code_max[1] >= 416).all()
    if scheme == "bound":  # a bound: far from saturating on ordinary rows
        assert (code_max[0] < 448).all()


@pytest.mark.parametrize("scheme", ATTENTION_SCALES)
def test_round_trip_within_an_e4m3_step(scheme):
    qkv, norm = _inputs(seed=2)
    bounds = torch.stack([qk_scale_bound(norm[0], HEADS), qk_scale_bound(norm[1], HEADS)])
    q8, scales = qkv_fp8(qkv, norm, bounds, heads=HEADS, eps=1e-6, rope=_rope(), scales=scheme)
    qk = qk_norm_rope(qkv, norm, parts=2, eps=1e-6, heads=HEADS, rope=_rope(), impl="torch").float()
    src = [qk[..., :D], qk[..., D:], qkv[..., 2 * D:].float()]
    if scheme == "smooth_k":
        src[1] = src[1] - src[1].mean(dim=1, keepdim=True)
    for t, c, s in zip(src, _split(q8), scales):
        s4 = s[:, None, :, None]
        back = c * s4
        x = t.view_as(back)
        # half an e4m3 step: 2^-4 of the value for normals, 2^-10 * scale in the subnormals
        assert ((back - x).abs() <= x.abs() / 16 * (1 + 1e-5) + 2.0**-10 * s4 * (1 + 1e-5)).all()


def _attn(q, k, v):
    """Softmax attention in float64, [B, L, H, hd] layout, scale 1/sqrt(hd)."""
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(q.shape[-1])
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(dim=-1), v.double())


def test_k_smoothing_leaves_attention_unchanged():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, N, HEADS, HD, generator=g, dtype=torch.float64) for _ in range(3))
    shift = 5.0 * torch.randn(2, 1, HEADS, HD, generator=g, dtype=torch.float64)  # any per-(b, h) vector
    torch.testing.assert_close(_attn(q, k + shift, v), _attn(q, k, v), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(_attn(q, k - k.mean(dim=1, keepdim=True), v), _attn(q, k, v), rtol=1e-10, atol=1e-12)


def test_k_smoothing_shrinks_the_error_when_k_shares_an_offset():
    qkv, norm = _inputs(k_offset=8.0, seed=5)
    bounds = torch.stack([qk_scale_bound(norm[0], HEADS), qk_scale_bound(norm[1], HEADS)])
    qk = qk_norm_rope(qkv, norm, parts=2, eps=1e-6, heads=HEADS, rope=_rope(), impl="torch").float()
    b = qkv.shape[0]
    want = _attn(qk[..., :D].view(b, N, HEADS, HD), qk[..., D:].view(b, N, HEADS, HD),
                 qkv[..., 2 * D:].float().view(b, N, HEADS, HD))
    err = {}
    for scheme in ATTENTION_SCALES:
        q8, scales = qkv_fp8(qkv, norm, bounds, heads=HEADS, eps=1e-6, rope=_rope(), scales=scheme)
        q, k, _ = (c * s[:, None, :, None] for c, s in zip(_split(q8), scales))
        # exact V: the error left is the scores' (what the Q/K scales decide)
        err[scheme] = float((_attn(q, k, qkv[..., 2 * D:].float().view_as(q)) - want).norm() / want.norm())
    assert err["smooth_k"] < 0.75 * err["amax"], err
    assert max(err.values()) < 0.1, err


@pytest.mark.parametrize("scheme", ATTENTION_SCALES)
def test_split_output_holds_q_k_v_each_contiguous(scheme):
    qkv, norm = _inputs(k_offset=2.0)
    bounds = torch.stack([qk_scale_bound(norm[0], HEADS), qk_scale_bound(norm[1], HEADS)])
    fused, s1 = qkv_fp8(qkv, norm, bounds, heads=HEADS, eps=1e-6, rope=_rope(), scales=scheme)
    split, s2 = qkv_fp8(qkv, norm, bounds, heads=HEADS, eps=1e-6, rope=_rope(), scales=scheme, split=True)
    assert split.shape == (3, 2, N, D) and split.is_contiguous() and split.dtype == E4M3
    torch.testing.assert_close(s1, s2)
    for i, part in enumerate(_split(fused)):
        assert torch.equal(split[i].float().view(2, N, HEADS, HD), part)


def test_unknown_scheme_is_refused():
    qkv, norm = _inputs()
    with pytest.raises(ValueError, match="attention scales"):
        qkv_fp8(qkv, norm, torch.ones(2, HEADS), heads=HEADS, eps=1e-6, rope=_rope(), scales="tensor")


def test_scheme_reaches_the_fast_path_and_the_digest():
    from fastvideo3.card.spec import Fp8Spec
    from fastvideo3.models.wan.fp8 import quantize_dit_, scheme_name
    assert Fp8Spec().attention_scales == "bound"
    assert scheme_name("token", "fp8", "fp32") == (
        "fp8_e4m3(weights=per-channel,activations=per-token/bounded-ffn-hidden,"
        "layers=blocks.linear,attention=fp8,accumulation=fp32)")
    assert "attention=fp8/smooth_k," in scheme_name("token", "fp8", "fp32", "smooth_k")
    assert "attention=bf16," in scheme_name("token", "bf16", "fp32", "smooth_k")  # no FP8 attention: no scales
    from fastvideo3.models.wan.cards import TINY_DIT
    from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig
    from fastvideo3.models.wan.fast import FastWanDiT
    model = WanDiT(WanDiTConfig.from_dict(TINY_DIT)).bfloat16().eval().requires_grad_(False)
    fast = FastWanDiT(quantize_dit_(model, attention_scales="smooth_k"))
    assert fast.attention_scales == "smooth_k"
    with pytest.raises(ValueError, match="attention_scales"):
        quantize_dit_(WanDiT(WanDiTConfig.from_dict(TINY_DIT)), attention_scales="tensor")


def test_card_scheme_reaches_the_loaded_dit_and_its_digest(monkeypatch):
    """A card's ``fp8.attention_scales`` is what the loaded DiT's fast path uses and what its
    weights digest (so the pool identity and provenance) names; the device check is forced here
    (the math runs through the PyTorch twins on a CPU)."""
    from fastvideo3.card import get_card
    from fastvideo3.card.spec import ModelCard
    from fastvideo3.models.wan import components
    from fastvideo3.models.wan.fast import FastWanDiT
    monkeypatch.setattr(components, "require_fp8_device", lambda card, device: None)
    data = get_card("wan-tiny-fp8").model_dump(mode="json")
    data["components"]["transformer"]["fp8"] = {**(data["components"]["transformer"].get("fp8") or {}),
                                                "attention_scales": "smooth_k"}
    card = ModelCard.model_validate(data)
    model, digest = components.load_dit(card, "cpu")
    assert model.fp8_attention_scales == "smooth_k" and FastWanDiT(model).attention_scales == "smooth_k"
    assert "attention=fp8/smooth_k," in digest
    _, default_digest = components.load_dit(get_card("wan-tiny-fp8"), "cpu")
    assert "attention=fp8," in default_digest and default_digest != digest


def test_bounded_v_scales_hold_and_reach_the_codes():
    """V's scales bounded from the QKV GEMM's inputs (the fast path's ``v_bounded``): no V value
    exceeds 448 times its head's scale, even for a row built to meet Cauchy-Schwarz, and
    ``qkv_fp8`` casts V with them instead of measuring it."""
    from types import SimpleNamespace
    from fastvideo3.kernels.fp8 import fp8_linear, quantize_rows, quantize_weight
    from fastvideo3.models.wan.fast_fp8 import _v_bound
    g = torch.Generator().manual_seed(5)
    k = 64
    wq, ws = quantize_weight(torch.randn(D, k, generator=g) / math.sqrt(k))
    lin = SimpleNamespace(weight=wq, weight_scale=ws, bias=(0.3 * torch.randn(D, generator=g)).bfloat16())
    bound = _v_bound(lin, HEADS)
    assert bound.shape == (2, HEADS)
    x = torch.randn(2, N, k, generator=g) * (0.1 + 3 * torch.rand(2, N, 1, generator=g))
    x[1, 7] = torch.sign(wq[3].float()) * 5  # every |xq| at 448, along W_v's row 3
    xq, xs = quantize_rows(x.bfloat16())
    v = fp8_linear(xq, xs, wq, ws, lin.bias)  # [2, N, D] bf16
    scales = (xs.view(2, N).amax(dim=1)[:, None] * bound[0] + bound[1]) / 448  # [B, H]
    ratio = v.float().abs().view(2, N, HEADS, HD).amax(dim=(1, 3)) / (448 * scales)
    assert (ratio <= 1).all() and ratio.max() > 0.2, ratio  # held, and not absurdly loose
    qkv = torch.cat([torch.randn(2, N, 2 * D, generator=g).bfloat16(), v], dim=-1)
    norm = torch.rand(2, D, generator=g) + 0.5
    qk_b = torch.stack([qk_scale_bound(norm[0], HEADS), qk_scale_bound(norm[1], HEADS)])
    q8, s = qkv_fp8(qkv, norm, qk_b, heads=HEADS, eps=1e-6, rope=_rope(), v_scales=scales)
    torch.testing.assert_close(s[2], scales)
    want = ref_e4m3(v.double().view(2, N, HEADS, HD) / scales.double()[:, None, :, None])
    assert torch.equal(_split(q8)[2], want)
    with pytest.raises(ValueError, match=r"v_scales must be \[2, 4\]"):
        qkv_fp8(qkv, norm, qk_b, heads=HEADS, eps=1e-6, rope=_rope(), v_scales=scales[:1])
