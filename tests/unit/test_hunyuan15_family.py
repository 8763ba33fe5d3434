"""The HunyuanVideo-1.5 family's pure facts: its cards, key map, latent shape, schedule and FLOP
formula, each checked against diffusers' own modules (built on the meta device: no weights)."""
import numpy as np
import pytest
import torch

from fastvideo3.card.family import family_of
from fastvideo3.card.registry import get_card
from fastvideo3.loop.samplers import make_schedule
from fastvideo3.models.hunyuan15.cards import HV15_DIT, TINY_DIT
from fastvideo3.models.hunyuan15.checkpoint import hunyuan15_dit_key_map
from fastvideo3.models.hunyuan15.dit import HunyuanDiT, HunyuanDiTConfig, pack_text
from fastvideo3.models.hunyuan15.flops import DitConfig, dit_forward_cost
from fastvideo3.models.wan.flops import StepShape
from fastvideo3.runtime.economy.pricing import Pricer
from fastvideo3.vocab import Sampler

pytestmark = pytest.mark.timeout(120)


def _diffusers_meta(cfg: dict):
    from diffusers import HunyuanVideo15Transformer3DModel
    with torch.device("meta"):
        return HunyuanVideo15Transformer3DModel(**cfg)


@pytest.mark.parametrize("cfg", [HV15_DIT, TINY_DIT], ids=["8.3b", "tiny"])
def test_key_map_is_diffusers_state_dict_and_ours(cfg):
    want = {k: tuple(v.shape) for k, v in _diffusers_meta(cfg).state_dict().items()}
    table = hunyuan15_dit_key_map(HunyuanDiTConfig.from_dict(cfg))
    assert {k: s for k, (_, s) in table.items()} == want
    with torch.device("meta"):
        ours = HunyuanDiT(HunyuanDiTConfig.from_dict(cfg))
    assert {n: tuple(p.shape) for n, p in ours.state_dict().items()} == {n: s for n, s in table.values()}


def test_param_count_is_diffusers():
    n = sum(p.numel() for p in _diffusers_meta(HV15_DIT).parameters())
    assert DitConfig().param_count() == n and 8.2e9 < n < 8.4e9


def test_cards_latent_shape_and_frames():
    card = get_card("hunyuanvideo-1.5-480p-t2v")
    fam = family_of(card)
    assert fam.name == "hunyuan15" and card.family == "hunyuan15"
    assert fam.latent_shape(card, 121, 480, 848) == (32, 31, 30, 53)
    assert fam.frames_of_latent(card, 31) == 121 and fam.latent_stride(card) == (4, 16, 16)
    p720 = get_card("hunyuanvideo-1.5-720p-t2v")
    assert fam.latent_shape(p720, 121, 720, 1280) == (32, 31, 45, 80)
    assert p720.components["transformer"].config["target_size"] == 960
    tiny = get_card("hunyuanvideo-1.5-tiny")
    assert fam.latent_shape(tiny, 9, 32, 48) == (4, 5, 8, 12)
    assert card.recipe.assumes_sampler == Sampler.EULER and card.extensions.allowed == []


@pytest.mark.parametrize("steps, shift", [(50, 5.0), (4, 7.0), (1, 9.0)])
def test_linear_schedule_is_the_pipelines(steps, shift):
    from diffusers import FlowMatchEulerDiscreteScheduler
    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(sigmas=np.linspace(1.0, 0.0, steps + 1)[:-1], device="cpu")
    ours = make_schedule(Sampler.EULER, steps, shift, 1000, sigma_spacing="linear")
    assert ours.timesteps == sched.timesteps.tolist() and ours.sigmas == sched.sigmas.tolist()
    with pytest.raises(ValueError, match="linear"):
        make_schedule(Sampler.UNIPC, steps, shift, sigma_spacing="linear")


def test_flop_formula_counts_what_the_dit_computes():
    """On the tiny DiT with every text token valid, the formula equals the matmul and convolution
    FLOPs torch's counter sees in one forward (elementwise work is left out of both)."""
    from torch.utils.flop_counter import FlopCounterMode
    cfg = HunyuanDiTConfig.from_dict({**TINY_DIT, "text_len": 12, "text_len_2": 6})
    model = HunyuanDiT(cfg).eval()

    def attend(q, k, v):  # attention as explicit matmuls: the counter sees no CPU SDPA kernel
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        return (torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ v).transpose(1, 2)

    for block in model.transformer_blocks:
        block.attn.attend = attend
    b, shape = 2, (4, 3, 4, 6)
    text = pack_text(torch.randn(b, 12, 16), torch.ones(b, 12), torch.randn(b, 6, 32), torch.ones(b, 6), cfg.text_dim)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randn(b, *shape), torch.tensor([500.0, 500.0]), text)
    fcfg = DitConfig(num_layers=2, num_heads=2, head_dim=8, mlp_ratio=2.0, num_refiner_layers=1, text_dim=16,
                     text_dim_2=32, image_dim=12, in_channels=9, out_channels=4, text_len=12, text_len_2=6)
    cost = dit_forward_cost(fcfg, StepShape(3, 4, 6, batch=1, cfg_branches=2))
    assert cost.tokens == 72 and cost.flops == counter.get_total_flops()


def test_pricer_reads_the_family_formula():
    from fastvideo3.request.schema import GenerateRequest, resolve
    card = get_card("hunyuanvideo-1.5-480p-t2v")
    cost = dit_forward_cost(family_of(card).dit_config(card), StepShape(31, 30, 53, cfg_branches=2))
    assert cost.tokens == 49_290 and 2.7e15 < cost.flops < 2.9e15  # ~1.4 PFLOP per branch
    assert cost.components["attn_core"].flops > 0.75 * cost.flops
    req = resolve(GenerateRequest("x", num_frames=121, height=480, width=848, num_inference_steps=50, seed=0), card)
    assert req.cfg_policy != "none" and req.guidance_scale == 6.0 and req.sampler == Sampler.EULER
    feats = Pricer().features("diffusion_step", card, req)
    assert feats.config.family == "hunyuan15" and feats.shape == StepShape(31, 30, 53, 1, 2)


def test_flop_shape_reads_the_transformer_config():
    """The pricer's shape comes from the checkpoint's config (diffusers' names), its defaults the
    8.3B model's; a config without the block sizes is refused."""
    assert DitConfig.from_transformer_config(HV15_DIT) == DitConfig()
    tiny = DitConfig.from_transformer_config({**HV15_DIT, "num_layers": 2, "patch_size": 2, "mlp_ratio": 2})
    assert (tiny.num_layers, tiny.patch_size, tiny.mlp_ratio) == (2, (1, 2, 2), 2.0)
    with pytest.raises(KeyError, match="attention_head_dim"):
        DitConfig.from_transformer_config({k: v for k, v in HV15_DIT.items() if k != "attention_head_dim"})
