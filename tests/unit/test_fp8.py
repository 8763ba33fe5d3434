"""The fp8_e4m3 precision on the CPU: the quantization math against a reference e4m3 quantizer
written here, the FP8 DiT against bf16, pre-quantized checkpoints, the card contract and the
refusals. (The Triton kernels and torch._scaled_mm are checked on a GPU: test_fp8_cuda.py.)"""
from __future__ import annotations

import json
import math

import pytest
import torch

from fastvideo3.card import get_card, load_card_file
from fastvideo3.errors import CardError, FailedPrecondition, RecipeMismatch
from fastvideo3.kernels import add_norm
from fastvideo3.kernels import fp8 as fp8k
from fastvideo3.kernels.fp8 import (
    E4M3, bias_gelu_quant, dequantize, fp8_linear, qk_scale_bound, quantize_rows, quantize_weight,
)
from tests.helpers_dit import tiny_card_dit_bf16
from tests.helpers_fp8 import E4M3_GRID, ref_e4m3

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------------ a reference e4m3, from the bits
GRID = E4M3_GRID


def ref_quantize(v: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e4m3 value, ties to the even code, saturating at 448 (float32)."""
    return ref_e4m3(v).float()


def test_reference_grid_is_e4m3():
    assert GRID.max() == 448.0 and GRID[1] == 2.0**-9 and len(GRID) == 127
    # torch's own cast agrees with the reference on every representable value and the midpoints
    mids = (GRID[1:] + GRID[:-1]) / 2
    probe = torch.cat([GRID, mids, -GRID]).float()
    assert torch.equal(probe.to(E4M3).float(), ref_quantize(probe))


def test_per_channel_weight_scales_and_saturation():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 96, generator=g) * torch.logspace(-3, 2, 48).unsqueeze(1)  # rows 5 decades apart
    q, s = quantize_weight(w)
    assert q.dtype == E4M3 and s.shape == (48,) and s.dtype == torch.float32
    amax = w.abs().amax(dim=1)
    torch.testing.assert_close(s, amax / 448.0)
    # each row's largest element lands exactly on +-448
    top = q.float().abs().amax(dim=1)
    assert torch.equal(top, torch.full_like(top, 448.0))
    assert torch.equal(q.float(), ref_quantize(w / s[:, None]))


def test_per_token_and_per_tensor_activation_scales():
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 40, 64, generator=g) * torch.rand(3, 40, 1, generator=g) * 50).bfloat16()
    q, s = quantize_rows(x)
    assert s.shape == (3, 40, 1)
    torch.testing.assert_close(s, x.float().abs().amax(dim=-1, keepdim=True) / 448.0)
    assert torch.equal(q.float(), ref_quantize(x.float() / s))
    qt, st = quantize_rows(x, per_tensor=True)
    assert st.shape == (3, 40, 1) and torch.all(st == x.float().abs().max() / 448.0)
    assert torch.equal(qt.float(), ref_quantize(x.float() / st))


def test_saturation_and_zero_rows():
    x = torch.tensor([[448.0, -448.0, 1e6, 3.0], [0.0, 0.0, 0.0, 0.0]])
    q, s = quantize_rows(x)
    assert torch.isfinite(q.float()).all() and torch.isfinite(s).all()
    assert q[0, 2].float() == 448.0  # the row's amax maps to the largest finite e4m3
    assert torch.equal(q[1].float(), torch.zeros(4)) and s[1, 0] > 0
    # values past the scale saturate instead of overflowing to NaN
    assert fp8k.quantize_rows(torch.tensor([[1.0, 2.0]]), per_tensor=False)[0].float().max() == 448.0


def test_round_trip_error_bounds():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(256, 512, generator=g)
    q, s = quantize_rows(x)
    back = dequantize(q, s)
    normal = x.abs() >= s * 2.0**-6  # in e4m3's normal range: 3 mantissa bits, half a step is 2^-4
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max() <= 2.0**-4 + 1e-6
    below = ~normal
    assert ((back - x).abs()[below] <= (s * 2.0**-10).expand_as(x)[below] + 1e-12).all()
    fro = float((back - x).norm() / x.norm())
    assert 0.01 < fro < 0.04  # ~2.5% for Gaussian rows: the scheme's noise floor


def test_fp8_linear_is_the_scaled_product():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 10, 64, generator=g)
    w = torch.randn(32, 64, generator=g) / 8
    b = torch.randn(32, generator=g)
    xq, xs = quantize_rows(x)
    wq, ws = quantize_weight(w)
    got = fp8_linear(xq, xs, wq, ws, b, out_dtype=torch.float32)
    want = torch.einsum("btk,nk->btn", xq.float() * xs, wq.float() * ws[:, None]) + b
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    exact = x @ w.t() + b
    assert float((got - exact).norm() / exact.norm()) < 0.05


def test_fused_norm_and_gelu_quantizers_match_reference():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 9, 32, generator=g).bfloat16()
    scale, shift = torch.randn(2, 32, generator=g), torch.randn(2, 32, generator=g)
    q, s = add_norm(x.clone(), None, None, scale, shift, modulate=True, eps=1e-6, fp8=True)
    h = torch.nn.functional.layer_norm(x.float(), (32,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
    hs = h.abs().amax(dim=-1, keepdim=True) / 448.0
    torch.testing.assert_close(s, hs)
    assert (q.float() != ref_quantize(h / hs)).float().mean() < 0.01  # rounding ties only
    y, bias = torch.randn(5, 48, generator=g).bfloat16(), torch.randn(48, generator=g).bfloat16()
    q, s = bias_gelu_quant(y, bias)
    u = y.float() + bias.float()
    gelu = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
    torch.testing.assert_close(dequantize(q, s), gelu, rtol=2.0**-4, atol=float(s.max()) * 2.0**-9)


def test_fused_ffn_in_scales_bound_the_row_and_match_reference():
    from fastvideo3.kernels.fp8_gemm import ffn_in_gelu_fp8, weight_stats
    g = torch.Generator().manual_seed(6)
    m, k, n = 40, 64, 96
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 1, m)[:, None]
    x[0] = 0  # an empty row takes GELU's floor, not 0/0
    x[1] = 0
    x[1, 3] = 50.0  # all of a row's energy in one column
    w = torch.randn(n, k, generator=g) / 8
    w[7] = w[7].abs() * 4  # one weight row aligned with positive inputs: a row whose bound is tight
    x[2] = w[7].sign() * 3
    bias = (torch.randn(n, generator=g) * 0.1).bfloat16()
    xq, xs = quantize_rows(x)
    wq, ws = quantize_weight(w)
    w_norm, b_amax = weight_stats(wq, ws, bias)
    assert w_norm >= float((wq.float() * ws[:, None]).norm(dim=1).max())
    q, s = ffn_in_gelu_fp8(xq, xs, wq, ws, bias, w_norm, b_amax)
    assert q.dtype == E4M3 and q.shape == (m, n) and s.shape == (m, 1)
    # the scales are the bound written out here, and it holds for the exact hidden layer
    want = (448.0 * math.sqrt(k) * xs.view(m) * w_norm + b_amax).clamp_min(0.17) / 448.0
    torch.testing.assert_close(s.view(m), want)
    u = (xq.float() * xs) @ (wq.float() * ws[:, None]).t() + bias.float()
    h = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
    assert (h.abs().amax(dim=1) <= s.view(m) * 448.0).all()
    assert torch.isfinite(q.float()).all() and float(q.float().abs().max()) <= 448.0
    assert float(q.float().abs().max()) > 16  # the tight row uses the range: not a scale far off
    # codes: the reference e4m3 of h / s; values over a subnormal step within e4m3's relative step
    torch.testing.assert_close(q.float(), ref_quantize(h / s), rtol=2.0**-3, atol=2.0**-9)
    big = h.abs() > s * 2.0**-6  # e4m3 normals
    assert ((dequantize(q, s) - h).abs()[big] <= 2.0**-4 * h.abs()[big] * (1 + 1e-5)).all()


def test_bounded_cast_uses_the_given_per_sample_scale():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 5, 24, generator=g).bfloat16()
    scale = torch.tensor([x[0].float().abs().max() / 448 * 4, x[1].float().abs().max() / 448 / 2])
    q, s = fp8k.quantize_bounded(x, scale)
    assert q.dtype == E4M3 and s.shape == (2, 5, 1)
    torch.testing.assert_close(s, scale.view(2, 1, 1).expand(2, 5, 1))
    assert torch.equal(q[0].float(), ref_quantize(x[0].float() * (1 / scale[0])))  # rows keep one scale
    assert float(q[1].float().abs().max()) == 448.0  # a bound that does not hold clamps, never inf


def test_qk_scale_bound_never_saturates():
    g = torch.Generator().manual_seed(5)
    heads, d = 4, 64
    w = torch.rand(d, generator=g) * 3
    x = torch.randn(100, d, generator=g)
    x[0] = 0
    x[0, 5] = 1e3  # all of a row's energy in one column: the worst case of the bound
    normed = torch.nn.functional.rms_norm(x, (d,), eps=0.0) * w
    s = qk_scale_bound(w, heads)
    per_head = normed.abs().view(100, heads, d // heads).amax(dim=(0, 2))
    assert (per_head <= s * 448.0 * (1 + 1e-6)).all()


def test_row_tiles_hold_a_row_in_two_powers_of_two():
    assert fp8k.row_tiles(8960) == (8192, 1024)  # Wan 1.3B's FFN: 9,216 lanes, not 16,384
    assert fp8k.row_tiles(1536) == (1024, 512)
    assert fp8k.row_tiles(5120) == (4096, 1024)
    assert fp8k.row_tiles(4096) == (4096, 0)
    assert fp8k.row_tiles(13824) == (8192, 8192)
    assert fp8k.row_tiles(1) == (1, 0)
    for k in range(1, 3000, 7):
        head, tail = fp8k.row_tiles(k)
        assert head <= k <= head + tail or (tail == 0 and head == k)
        assert head & (head - 1) == 0 and tail & (tail - 1) == 0 and tail <= head


# --------------------------------------------------------------------------- the FP8 DiT on a CPU
def _inputs():
    g = torch.Generator().manual_seed(9)
    return (torch.randn(1, 16, 3, 16, 16, generator=g).bfloat16(), torch.tensor([600.0]),
            torch.randn(1, 12, 64, generator=g).bfloat16())


def test_fp8_dit_close_to_bf16_and_fast_path_agrees():
    from fastvideo3.card.spec import ParitySpec
    from fastvideo3.models.wan.fast import FastWanDiT
    from fastvideo3.models.wan.fast_fp8 import Fp8FastWanDiT
    from fastvideo3.models.wan.fp8 import FP8_LINEARS, Fp8Linear, quantize_dit_
    x, t, text = _inputs()
    model = tiny_card_dit_bf16()
    ref = FastWanDiT(model, share_weights=False)(x, t, text).float()
    quantize_dit_(model)
    for name in FP8_LINEARS:
        mod = model.blocks[1].get_submodule(name)
        assert isinstance(mod, Fp8Linear) and mod.weight.dtype == E4M3 and mod.weight_scale.shape == (mod.out_features,)
    assert isinstance(model.proj_out, torch.nn.Linear) and model.proj_out.weight.dtype == torch.bfloat16
    module_out = model(x, t, text).float()
    fast = FastWanDiT(model)
    assert isinstance(fast, Fp8FastWanDiT) and not fast.fp8_attention  # no FA3 on a CPU
    fast_out = fast(x, t, text).float()
    tol = ParitySpec().fp8_rel
    for out in (module_out, fast_out):
        rel = float((out - ref).norm() / ref.norm())
        assert 1e-4 < rel < tol  # quantized (not a silent bf16 run), within the declared tolerance
    assert float((fast_out - module_out).norm() / module_out.norm()) < tol / 2
    # the FFN's hidden layer from the fused GEMM (bounded scales) or through bf16 and its own pass;
    # the attention outputs cast with the bound max |V| or with their per-token amax
    assert fast.ffn_fused and not fast.attn_out_bounded  # the defaults
    for flag in ("ffn_fused", "attn_out_bounded"):
        setattr(fast, flag, not getattr(fast, flag))
        other = fast(x, t, text).float()
        setattr(fast, flag, not getattr(fast, flag))
        assert 0 < float((other - fast_out).norm() / fast_out.norm()) < tol / 2, flag
    # the shared-weight fast model leaves the module path intact
    torch.testing.assert_close(model(x, t, text).float(), module_out)


def test_bounded_scales_are_switchable_and_named_in_the_scheme(monkeypatch):
    from fastvideo3.models.wan.fast import FastWanDiT
    from fastvideo3.models.wan.fp8 import BOUNDED_ATTENTION_OUT_ENV, BOUNDED_ENV, quantize_dit_, scheme_name
    monkeypatch.delenv(BOUNDED_ENV, raising=False)
    monkeypatch.delenv(BOUNDED_ATTENTION_OUT_ENV, raising=False)
    # the defaults: the fused FFN-in on, the bounded attention-output cast off
    assert "activations=per-token/bounded-ffn-hidden," in scheme_name("token", "fp8", "fp32")
    assert "activations=per-tensor," in scheme_name("tensor", "fp8", "fp32")
    model = quantize_dit_(tiny_card_dit_bf16())
    fast = FastWanDiT(model)
    assert fast.ffn_fused and not fast.attn_out_bounded
    monkeypatch.setenv(BOUNDED_ATTENTION_OUT_ENV, "1")
    assert "activations=per-token/bounded-ffn-hidden+attention-out," in scheme_name("token", "fp8", "fp32")
    assert FastWanDiT(model).attn_out_bounded
    monkeypatch.setenv(BOUNDED_ENV, "0")
    assert "activations=per-token/bounded-attention-out," in scheme_name("token", "fp8", "fp32")
    monkeypatch.delenv(BOUNDED_ATTENTION_OUT_ENV)
    assert "activations=per-token," in scheme_name("token", "fp8", "fp32")
    fast = FastWanDiT(model)
    assert not fast.ffn_fused and not fast.attn_out_bounded
    monkeypatch.delenv(BOUNDED_ENV)  # per-tensor scales: never bounded
    assert not FastWanDiT(quantize_dit_(tiny_card_dit_bf16(), "tensor")).ffn_fused


def test_card_fp8_options_reach_the_fast_path():
    from fastvideo3.models.wan.fast import FastWanDiT
    from fastvideo3.models.wan.fp8 import quantize_dit_
    fast = FastWanDiT(quantize_dit_(tiny_card_dit_bf16(), "token", "bf16", "fast"))
    assert fast.fast_accum and not fast.fp8_attention and not fast.per_tensor
    fast = FastWanDiT(quantize_dit_(tiny_card_dit_bf16(), "tensor"))
    assert not fast.fast_accum and fast.per_tensor


def test_per_tensor_activation_scaling_runs_and_differs():
    from fastvideo3.models.wan.fast import FastWanDiT
    from fastvideo3.models.wan.fp8 import quantize_dit_
    x, t, text = _inputs()
    ref = FastWanDiT(tiny_card_dit_bf16(), share_weights=False)(x, t, text).float()
    tok = FastWanDiT(quantize_dit_(tiny_card_dit_bf16(), "token"))(x, t, text).float()
    ten = FastWanDiT(quantize_dit_(tiny_card_dit_bf16(), "tensor"))(x, t, text).float()
    assert not torch.equal(tok, ten)
    assert float((ten - ref).norm() / ref.norm()) < 0.1


def _write_checkpoint(folder, model, cfg_dict):
    from safetensors.torch import save_file
    from fastvideo3.models.wan.fp8 import fp8_state_dict
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg_dict))
    save_file(fp8_state_dict(model), str(folder / "diffusion_pytorch_model.safetensors"))


def test_prequantized_checkpoint_loads_by_key_map(tmp_path):
    from fastvideo3.models.wan.cards import TINY_DIT
    from fastvideo3.models.wan.checkpoint import load_dit_weights
    from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig
    from fastvideo3.models.wan.fp8 import fp8_skeleton_, quantize_dit_, wan_dit_fp8_key_map
    cfg = WanDiTConfig.from_dict(TINY_DIT)
    src = quantize_dit_(tiny_card_dit_bf16())
    _write_checkpoint(tmp_path / "transformer", src, TINY_DIT)
    table = wan_dit_fp8_key_map(cfg)
    assert "blocks.0.attn1.to_q.weight_scale" in table and "proj_out.weight_scale" not in table
    with torch.device("meta"):
        dst = WanDiT(cfg)
    fp8_skeleton_(dst)
    load_dit_weights(dst, tmp_path / "transformer", cfg, "wan_dit_diffusers_fp8_v1", torch.bfloat16, "cpu")
    a, b = src.state_dict(), dst.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8) if a[k].dtype == E4M3 else a[k],
                                                        b[k].view(torch.uint8) if b[k].dtype == E4M3 else b[k]), k
    # the bf16 key map refuses e4m3 tensors, naming one
    with torch.device("meta"):
        plain = WanDiT(cfg)
    with pytest.raises(CardError) as e:
        load_dit_weights(plain, tmp_path / "transformer", cfg, "wan_dit_diffusers_v1", torch.bfloat16, "cpu")
    assert "weight_scale" in str(e.value) or "e4m3" in str(e.value)


def test_prequantized_checkpoint_needs_e4m3_weights_and_every_scale(tmp_path):
    from safetensors.torch import load_file, save_file
    from fastvideo3.models.wan.cards import TINY_DIT
    from fastvideo3.models.wan.checkpoint import load_dit_weights
    from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig
    from fastvideo3.models.wan.fp8 import fp8_skeleton_, quantize_dit_
    cfg = WanDiTConfig.from_dict(TINY_DIT)
    _write_checkpoint(tmp_path / "transformer", quantize_dit_(tiny_card_dit_bf16()), TINY_DIT)
    path = tmp_path / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(path))
    for broken, needle in (
        ({k: v for k, v in state.items() if k != "blocks.2.ffn.net.2.weight_scale"}, "blocks.2.ffn.net.2.weight_scale"),
        ({**state, "blocks.0.attn1.to_k.weight": state["blocks.0.attn1.to_k.weight"].to(torch.bfloat16)},
         "blocks.0.attn1.to_k.weight"),
    ):
        save_file(broken, str(path))
        with torch.device("meta"):
            dst = fp8_skeleton_(WanDiT(cfg))
        with pytest.raises(CardError) as e:
            load_dit_weights(dst, tmp_path / "transformer", cfg, "wan_dit_diffusers_fp8_v1", torch.bfloat16, "cpu")
        assert needle in str(e.value) + str(e.value.field)


# ------------------------------------------------------------------------- cards and refusals
def test_fp8_cards_declare_the_precision_everywhere():
    for name, base in (("wan-tiny-fp8", "wan-tiny"), ("wan2.1-t2v-1.3b-fp8", "wan2.1-t2v-1.3b"),
                       ("wan2.1-t2v-14b-fp8", "wan2.1-t2v-14b")):
        card, parent = get_card(name), get_card(base)
        assert card.components["transformer"].precision == "fp8_e4m3"
        assert card.recipe.assumes_precision == "fp8_e4m3" and base in card.recipe.parents
        assert card.precision.supported == ["fp8_e4m3"]
        assert card.components["transformer"].config == parent.components["transformer"].config
        assert card.components["vae"].precision == parent.components["vae"].precision


@pytest.mark.parametrize("patch, needle", [
    ({"precision": {"supported": ["bf16", "fp8_e4m3"]}}, "support only"),
    ({"recipe": {"assumes_precision": "bf16"}}, "assumes_precision"),
    ({"components": {"vae": {"precision": "fp8_e4m3"}}}, "only defined for a dit"),
])
def test_inconsistent_fp8_card_files_are_refused(tmp_path, patch, needle):
    p = tmp_path / "card.json"
    p.write_text(json.dumps({"extends": "wan-tiny-fp8", **patch}))
    with pytest.raises(CardError) as e:
        load_card_file(p)
    assert needle in str(e.value)


def test_bf16_card_cannot_claim_fp8_without_an_fp8_dit(tmp_path):
    p = tmp_path / "card.json"
    p.write_text(json.dumps({"extends": "wan-tiny", "precision": {"supported": ["fp32", "fp8_e4m3"]}}))
    with pytest.raises(CardError) as e:
        load_card_file(p)
    assert "fp8_e4m3" in str(e.value)


def test_cpu_refuses_an_fp8_card_naming_precision_and_device():
    from fastvideo3.models.wan.components import load_dit
    from fastvideo3.runtime.pool.executors import DenoiserExecutor
    with pytest.raises(FailedPrecondition) as e:
        load_dit(get_card("wan2.1-t2v-1.3b-fp8"), "cpu")  # refused before any checkpoint is looked for
    assert e.value.code == "FAILED_PRECONDITION" and e.value.field == "precision"
    assert "fp8_e4m3" in str(e.value) and "cpu" in str(e.value)
    with pytest.raises(FailedPrecondition):
        DenoiserExecutor(get_card("wan-tiny-fp8"), transport=None, device="cpu")


def test_gpu_without_fp8_is_refused(monkeypatch):
    from fastvideo3.models.wan.components import require_fp8_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(FailedPrecondition) as e:
        require_fp8_device(get_card("wan2.1-t2v-14b-fp8"), "cuda:0")
    msg = str(e.value)
    assert "fp8_e4m3" in msg and "A100" in msg and "8.0" in msg
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (8, 9))
    require_fp8_device(get_card("wan2.1-t2v-14b-fp8"), "cuda:0")  # Ada and newer pass


def test_requests_for_another_precision_are_refused_as_before():
    from fastvideo3.request.schema import GenerateRequest, resolve
    with pytest.raises(RecipeMismatch) as e:
        resolve(GenerateRequest(prompt="a red circle"), get_card("wan-tiny-fp8"), precision="bf16")
    assert e.value.field == "precision" and e.value.limit == "fp8_e4m3"
    with pytest.raises(RecipeMismatch):
        resolve(GenerateRequest(prompt="a red circle"), get_card("wan-tiny"), precision="fp8_e4m3")
    resolve(GenerateRequest(prompt="a red circle"), get_card("wan-tiny-fp8"), precision="fp8_e4m3")


def test_identity_and_digest_record_the_scheme(monkeypatch):
    """Where the device check passes (here forced: the math runs through the PyTorch twins), the
    served weights' digest names the FP8 scheme and the pool identity carries fp8_e4m3."""
    from fastvideo3.models.wan import components
    from fastvideo3.models.wan.fp8 import Fp8Linear
    from fastvideo3.runtime.pool.executors import DenoiserExecutor
    monkeypatch.setattr(components, "require_fp8_device", lambda card, device: None)
    pool = DenoiserExecutor(get_card("wan-tiny-fp8"), transport=None, device="cpu")
    assert pool.precision == "fp8_e4m3" and pool.dtype == torch.bfloat16
    assert isinstance(pool.dit.blocks[0].attn2.to_k, Fp8Linear)
    assert pool.weights_digest.startswith("shipped:")
    assert ("+fp8_e4m3(weights=per-channel,activations=per-token/bounded-ffn-hidden,"
            "layers=blocks.linear,attention=fp8,accumulation=fp32)") in pool.weights_digest
    canon = pool.identity.canonical()
    assert "precision=fp8_e4m3" in canon and "fp8_e4m3(weights" in canon
    bf16 = DenoiserExecutor(get_card("wan-tiny"), transport=None, device="cpu", precision="fp32")
    assert bf16.identity.fingerprint != pool.identity.fingerprint


def test_engine_serves_fp8_and_provenance_records_it(monkeypatch):
    """End to end through the serving loops (the FP8 math on the PyTorch twins, the device check
    forced to pass): the provenance sidecar names the precision, the recipe and the scheme."""
    from fastvideo3.models.wan import components
    from fastvideo3.engine import Engine
    monkeypatch.setattr(components, "require_fp8_device", lambda card, device: None)
    with Engine(get_card("wan-tiny-fp8"), device="cpu") as engine:
        assert engine.precision == "fp8_e4m3"
        video = engine.generate("a red circle moving left", num_frames=5, height=64, width=64,
                                num_inference_steps=2, seed=3)
    meta = video.metadata
    assert meta["request"]["precision"] == "fp8_e4m3"
    assert meta["recipe"]["assumes_precision"] == "fp8_e4m3"
    assert "fp8_e4m3(weights=per-channel" in meta["weights"]["transformer"]
    assert torch.isfinite(torch.as_tensor(video.frames)).all()


def test_load_dit_reads_a_prequantized_directory(tmp_path, monkeypatch):
    """A card whose key map is wan_dit_diffusers_fp8_v1 loads e4m3 weights and their scales as they
    are (no second quantization); the bf16 key map on the same card quantizes at load instead."""
    from fastvideo3.card.registry import bind_checkpoint
    from fastvideo3.models.wan.cards import TINY_DIT
    from fastvideo3.card.spec import ModelCard
    from fastvideo3.models.wan import components
    from fastvideo3.models.wan.fp8 import Fp8Linear, quantize_dit_
    monkeypatch.setattr(components, "require_fp8_device", lambda card, device: None)
    src = quantize_dit_(tiny_card_dit_bf16())
    _write_checkpoint(tmp_path / "transformer", src, TINY_DIT)
    data = get_card("wan2.1-t2v-1.3b-fp8").model_dump(mode="json")
    data["components"]["transformer"].update(config=TINY_DIT, key_map="wan_dit_diffusers_fp8_v1")
    card = bind_checkpoint(ModelCard.model_validate(data), tmp_path)
    model, digest = components.load_dit(card, "cpu")
    lin = model.blocks[3].attn1.to_out[0]
    assert isinstance(lin, Fp8Linear) and lin.weight.dtype == E4M3
    assert torch.equal(lin.weight.view(torch.uint8), src.blocks[3].attn1.to_out[0].weight.view(torch.uint8))
    assert torch.equal(lin.weight_scale, src.blocks[3].attn1.to_out[0].weight_scale)
    assert digest.startswith("sha256:") and "fp8_e4m3(weights=per-channel" in digest
    x, t, text = _inputs()
    components._keep_fp32(src)  # what every load does: the reference's fp32 modules stay fp32
    src.rope_cos, src.rope_sin = model.rope_cos, model.rope_sin  # rebuilt in fp32 at load
    torch.testing.assert_close(model(x, t, text), src(x, t, text))
    # the same card without the FP8 key map refuses the e4m3 directory, naming a tensor
    data["components"]["transformer"]["key_map"] = "wan_dit_diffusers_v1"
    with pytest.raises(CardError):
        components.load_dit(bind_checkpoint(ModelCard.model_validate(data), tmp_path), "cpu")
