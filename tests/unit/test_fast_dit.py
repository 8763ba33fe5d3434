"""FastWanDiT computes WanDiT's function; the denoiser's fast-path hook keeps CPU behaviour.

On a CPU the fast path runs its PyTorch kernels; the CUDA tests (skipped elsewhere) check the
Triton kernels, every attention backend and CUDA-graph replay against eager.
"""
from __future__ import annotations

import pytest
import torch

from fastvideo3.models.wan.components import keep_reference_fp32
from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig
from fastvideo3.models.wan.fast import FastWanDiT
from tests.helpers_dit import tiny_card_dit_bf16

pytestmark = pytest.mark.timeout(120)
CUDA = torch.cuda.is_available()


def _model(seed: int = 0, layers: int = 2, cross_attn_norm: bool = True) -> WanDiT:
    torch.manual_seed(seed)
    cfg = WanDiTConfig(num_attention_heads=2, attention_head_dim=16, text_dim=32, freq_dim=32, ffn_dim=64,
                       num_layers=layers, rope_max_seq_len=32, cross_attn_norm=cross_attn_norm)
    model = WanDiT(cfg).eval()
    with torch.no_grad():  # weights at a scale where every path moves the output
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif p.ndim > 1 and "scale_shift_table" not in name:
                p.normal_(0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def _inputs(batch: int = 2, grid: tuple[int, int, int] = (3, 8, 10), text_len: int = 7, device="cpu",
            dtype=torch.float32, seed: int = 1):
    g = torch.Generator(device=device).manual_seed(seed)
    f, h, w = grid
    x = torch.randn(batch, 16, f, h, w, generator=g, device=device).to(dtype)
    t = torch.rand(batch, generator=g, device=device) * 1000
    text = torch.randn(batch, text_len, 32, generator=g, device=device).to(dtype)
    return x, t, text


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("cross_attn_norm", [True, False])
def test_fast_forward_matches_reference_fp32(cross_attn_norm):
    model = _model(cross_attn_norm=cross_attn_norm)
    x, t, text = _inputs()
    with torch.no_grad():
        want = model(x, t, text)
    got = FastWanDiT(model, kernels="torch")(x, t, text)
    assert got.shape == want.shape
    assert _rel(got, want) < 1e-5


def test_shared_weights_leave_the_reference_model_intact():
    model = _model()
    x, t, text = _inputs(batch=1, grid=(2, 4, 6))
    with torch.no_grad():
        before = model(x, t, text)
    fast = FastWanDiT(model, kernels="torch", share_weights=True)
    attn = model.blocks[1].attn1
    assert attn.to_k.weight.data_ptr() == fast.blocks[1].qkv_w[16 * 2:].data_ptr()  # a view, not a copy
    assert model.blocks[0].attn2.to_v.weight.data_ptr() == fast.kv_w[32:64].data_ptr()
    with torch.no_grad():
        assert torch.equal(model(x, t, text), before)


def test_taps_and_limits_match_the_reference():
    model = _model()
    x, t, text = _inputs(batch=1, grid=(2, 4, 4))
    ref, ours = {}, {}
    with torch.no_grad():
        model(x, t, text, tap=lambda n, v: ref.__setitem__(n, v.clone()))
    FastWanDiT(model, kernels="torch")(x, t, text, tap=lambda n, v: ours.__setitem__(n, v))
    assert list(ours) == list(ref)
    for name in ref:
        assert _rel(ours[name], ref[name]) < 1e-5, name
    with pytest.raises(ValueError, match="rope_max_seq_len"):
        FastWanDiT(model, kernels="torch")(torch.randn(1, 16, 1, 2, 80), t[:1], text)


def test_fast_matches_module_on_the_tiny_card_config_bf16():
    # Regression: on a CPU with AMX, oneDNN's bf16 convolution got this config's (1, 4, 4) patch
    # embedding wrong, so the module path was 1.34 (relative) from the fast path's GEMM.
    import copy
    model = tiny_card_dit_bf16()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1, 16, 3, 16, 16, generator=g).bfloat16()
    t = torch.tensor([600.0])
    text = torch.randn(1, 12, 64, generator=g).bfloat16()
    fp32 = copy.deepcopy(model).float()
    ref, ours = {}, {}
    with torch.no_grad():
        want32 = fp32(x.float(), t, text.float())
        want = model(x, t, text, tap=lambda n, v: ref.__setitem__(n, v.clone()))
    got = FastWanDiT(model, share_weights=False)(x, t, text, tap=lambda n, v: ours.__setitem__(n, v.clone()))
    assert list(ours) == list(ref)
    assert _rel(ours["patch_embed"], ref["patch_embed"]) < 1e-6  # the same GEMM
    for name in ref:
        assert _rel(ours[name], ref[name]) < 2e-2, name
    # both are bf16 runs of the fp32 function (neither agrees with the other by being wrong alike)
    assert _rel(want, want32) < 2e-2 and _rel(got, want32) < 2e-2


@pytest.mark.parametrize("patch,shape", [((1, 4, 4), (1, 16, 3, 16, 16)), ((1, 2, 2), (2, 16, 3, 8, 10)),
                                         ((1, 4, 4), (48, 16, 1, 4, 4)), ((1, 2, 2), (48, 16, 1, 2, 2))])
def test_patch_embedding_is_the_convolution_at_bf16(patch, shape):
    # the last two: one patch per input, as the sequence-parallel path embeds its tokens; the
    # first and the third went wrong in oneDNN's bf16 convolution on an AMX CPU
    from fastvideo3.models.wan.dit import PatchEmbedding
    torch.manual_seed(0)
    conv = PatchEmbedding(16, 288, kernel_size=patch, stride=patch).bfloat16().requires_grad_(False)
    x = torch.randn(*shape).bfloat16()
    want = torch.nn.functional.conv3d(x.double(), conv.weight.double(), conv.bias.double(), stride=patch)
    got = conv(x)
    assert got.shape == want.shape and got.is_contiguous()
    assert _rel(got, want) < 1e-2
    assert _rel(conv.float()(x.float()), want) < 1e-5  # fp32 runs the convolution itself


def test_denoiser_executor_keeps_the_reference_path_on_cpu():
    pytest.importorskip("pydantic")  # the card layer (absent on some GPU images)
    from fastvideo3.models.wan.cards import wan_tiny
    from fastvideo3.runtime.pool.executors import DenoiserExecutor
    from fastvideo3.transport import make_transport

    card = wan_tiny()
    ref = DenoiserExecutor(card, make_transport("inproc", owner="t1"), "cpu")
    assert not ref.fast and ref._forward is ref.dit and ref.describe()["dit_path"] == "reference"
    fast = DenoiserExecutor(card, make_transport("inproc", owner="t2"), "cpu", fast=True)
    assert fast.describe()["dit_path"] == "fast"
    cfg = ref.dit.cfg
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, cfg.in_channels, 3, 8, 8, generator=g)
    t = torch.tensor([900.0, 10.0])
    text = torch.randn(2, card.max_text_tokens, cfg.text_dim, generator=g)
    want = ref._dit(x, t, text)
    fast.prepare_graphs([(2, tuple(x.shape[1:]))])  # eager-recorded bucket on a CPU
    got = fast._dit(x, t, text)
    assert _rel(got, want) < 1e-5
    got2 = fast._dit(x, t, text)
    assert got2.data_ptr() != got.data_ptr()  # replay outputs are copied out of the runner's buffer


# ---------------------------------------------------------------------------------------------- CUDA
cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@cuda
def test_attention_backends_match_math():
    from fastvideo3.kernels import ATTENTION_BACKENDS, attention, attention_available
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 300, 4, 128, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    want = attention(q.float(), k.float(), v.float(), "math")
    for backend in ATTENTION_BACKENDS:
        if attention_available(backend, "cuda"):
            assert _rel(attention(q, k, v, backend), want) < 1e-2, backend


@cuda
@pytest.mark.parametrize("attention", ["sdpa", "auto"])
def test_fast_bf16_on_cuda_matches_reference(attention):
    model = _model(layers=3).cuda()
    x, t, text = _inputs(device="cuda")
    with torch.no_grad():
        want32 = model(x, t, text)
    model.to(torch.bfloat16)
    keep_reference_fp32(model)
    xb, tb = x.bfloat16(), text.bfloat16()
    with torch.no_grad():
        want = model(xb, t, tb)
    fast = FastWanDiT(model, attention=attention)
    assert fast.kernels == "triton"
    got = fast(xb, t, tb)
    # ours is no farther from fp32 than the reference's own bf16 run (with a margin), and close to it
    assert _rel(got, want32) < 1.5 * _rel(want, want32) + 2e-3
    assert _rel(got, want) < 2e-2


@cuda
def test_cuda_graph_replay_equals_eager():
    from fastvideo3.export import GraphRunner
    model = _model().cuda().to(torch.bfloat16)
    fast = FastWanDiT(model)
    runner = GraphRunner("dit")
    x, t, text = _inputs(device="cuda", dtype=torch.bfloat16)
    static = {"latents": x.clone(), "timestep": t.clone(), "text": text.clone()}
    runner.prepare("b2", fast, static)
    assert runner.is_captured("b2")
    for seed in (5, 6):
        x, t, text = _inputs(device="cuda", dtype=torch.bfloat16, seed=seed)
        for name, value in (("latents", x), ("timestep", t), ("text", text)):
            static[name].copy_(value)  # the captured graph reads these tensors
        out = runner.replay("b2")
        assert _rel(out, fast(x, t, text)) < 1e-3  # same kernels; cuBLAS may pick other algorithms in capture


@cuda
def test_gelu_epilogue_is_the_tanh_gelu_on_cuda():
    from fastvideo3.models.wan.fast import _gelu_epilogue_is_tanh
    assert _gelu_epilogue_is_tanh("cuda")
