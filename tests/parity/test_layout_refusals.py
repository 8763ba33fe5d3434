"""Loading refuses, naming it, every layout, component and config field it does not implement.

Each family is fed the next family's tiny directory, written by diffusers' own classes: Wan2.1
T2V gets the Wan2.2 two-expert layout (and TI2V-5B's), the two-expert family gets TI2V-5B's,
TI2V-5B gets Wan2.1 I2V's (and Wan2.1 T2V's), the Wan2.1 I2V card gets Wan2.1 T2V's (and a T2V
card the I2V one's), and the Wan loader refuses HunyuanVideo-1.5 directories outright (they are
their own family's: tests/parity/test_hunyuan15_layout.py). Both ways in are covered: a directory given as ``--model
DIR`` (the card is built from it) and a card bound to a directory (``checkpoint.root``).
"""
import json
import shutil

import pytest
import torch

from fastvideo3.card import resolve_card
from fastvideo3.card.registry import bind_checkpoint
from fastvideo3.errors import CardError
from fastvideo3.testing import synthetic_layouts as layouts
from fastvideo3.models.wan.components import VideoDecoder, load_dit

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("layouts")
    return {
        "moe": layouts.build_wan22_moe_dir(base / "wan22-moe", seed=5),
        "ti2v": layouts.build_wan22_ti2v_dir(base / "wan22-ti2v", seed=6),
        "i2v": layouts.build_wan21_i2v_dir(base / "wan21-i2v", seed=7),
        "hunyuan15": layouts.build_hunyuan15_dir(base / "hunyuan15", seed=8),
    }


def _refused(fn, field: str, *words: str) -> CardError:
    with pytest.raises(CardError) as e:
        fn()
    assert e.value.field == field, (e.value.field, e.value.message)
    for w in words:
        assert w in e.value.message
    return e.value


def _copy(src, tmp_path, name="d"):
    d = tmp_path / name
    shutil.copytree(src, d)
    return d


def _edit_index(d, **updates):
    p = d / "model_index.json"
    index = json.loads(p.read_text())
    index.update(updates)
    p.write_text(json.dumps(index))


def test_wan21_t2v_card_refuses_a_bound_two_expert_directory(tiny_wan_dir, dirs):
    t2v = resolve_card(str(tiny_wan_dir))
    assert "transformer_2" not in t2v.components
    _refused(lambda: load_dit(bind_checkpoint(t2v, dirs["moe"]), "cpu", torch.float32),
             "model_index.transformer_2", "transformer_2")


def test_two_expert_layout_needs_both_fields(dirs, tmp_path):
    d = _copy(dirs["moe"], tmp_path)
    _edit_index(d, boundary_ratio=None)
    _refused(lambda: resolve_card(str(d)), "model_index.boundary_ratio", "transformer_2")
    _edit_index(d, boundary_ratio=1.5)
    _refused(lambda: resolve_card(str(d)), "model_index.boundary_ratio", "(0, 1)")
    _edit_index(d, boundary_ratio=0.9, transformer_2=[None, None])
    _refused(lambda: resolve_card(str(d)), "model_index.boundary_ratio", "transformer_2")


def test_experts_must_share_an_architecture(dirs, tmp_path):
    d = _copy(dirs["moe"], tmp_path)
    cfg = json.loads((d / "transformer_2" / "config.json").read_text())
    cfg["ffn_dim"] *= 2
    (d / "transformer_2" / "config.json").write_text(json.dumps(cfg))
    _refused(lambda: resolve_card(str(d)), "components.transformer_2.config.ffn_dim", "ffn_dim")


def test_refuses_a_ti2v_vae_without_expand_timesteps_and_the_reverse(tiny_wan_dir, dirs, tmp_path):
    d = _copy(dirs["ti2v"], tmp_path)
    _edit_index(d, expand_timesteps=False)  # without the flag, the 48-channel 16x VAE is refused
    _refused(lambda: resolve_card(str(d)), "components.vae.config.z_dim", "48")
    d2 = _copy(tiny_wan_dir, tmp_path, "d2")
    _edit_index(d2, expand_timesteps=True)  # the flag with the Wan2.1 VAE is no published layout
    _refused(lambda: resolve_card(str(d2)), "model_index.expand_timesteps", "z_dim=16")


def test_wan21_t2v_card_refuses_a_bound_ti2v_directory(tiny_wan_dir, dirs):
    t2v = resolve_card(str(tiny_wan_dir))
    _refused(lambda: load_dit(bind_checkpoint(t2v, dirs["ti2v"]), "cpu", torch.float32),
             "model_index.expand_timesteps", "expand_timesteps")


def test_ti2v_card_refuses_the_next_layouts(tiny_wan_dir, dirs):
    ti2v = resolve_card(str(dirs["ti2v"]))
    assert ti2v.components["vae"].config["scale_factor_spatial"] == 16
    _refused(lambda: load_dit(bind_checkpoint(ti2v, dirs["i2v"]), "cpu", torch.float32),
             "model_index._class_name", "WanImageToVideoPipeline")
    _refused(lambda: load_dit(bind_checkpoint(ti2v, tiny_wan_dir), "cpu", torch.float32),
             "model_index.expand_timesteps", "48-channel")
    _refused(lambda: VideoDecoder(bind_checkpoint(ti2v, tiny_wan_dir)), "components.vae.config.z_dim", "48")


def test_a_t2v_card_refuses_a_vae_with_other_compression(tiny_wan_dir, dirs, tmp_path):
    d = _copy(tiny_wan_dir, tmp_path)
    shutil.rmtree(d / "vae")
    shutil.copytree(dirs["ti2v"] / "vae", d / "vae")
    card = bind_checkpoint(resolve_card(str(tiny_wan_dir)), d)
    _refused(lambda: VideoDecoder(card), "components.vae.config.z_dim", "z_dim")
    cfg = json.loads((d / "vae" / "config.json").read_text())
    cfg.update(z_dim=16, latents_mean=[0.0] * 16, latents_std=[1.0] * 16)  # right channels, 16x spatial
    (d / "vae" / "config.json").write_text(json.dumps(cfg))
    _refused(lambda: VideoDecoder(card), "components.vae.config.scale_factor_spatial", "16")


def test_i2v_layout_loads_as_i2v_and_refuses_t2v_cards_by_pipeline_component_and_field(tiny_wan_dir, dirs,
                                                                                         tmp_path):
    assert resolve_card(str(dirs["i2v"])).model_id == "wan2.1-i2v-tiny"
    t2v = resolve_card(str(tiny_wan_dir))
    _refused(lambda: load_dit(bind_checkpoint(t2v, dirs["i2v"]), "cpu", torch.float32),
             "model_index._class_name", "WanImageToVideoPipeline", "text-to-video")
    d = _copy(dirs["i2v"], tmp_path)
    _edit_index(d, _class_name="WanPipeline")  # relabelled: the image encoder is still named
    _refused(lambda: resolve_card(str(d)), "model_index.image_encoder", "image_encoder")
    # a T2V card bound to it: the DiT's image cross-attention is refused before a weight is read
    card = bind_checkpoint(resolve_card(str(tiny_wan_dir)), dirs["i2v"])
    _edit_index(d, image_encoder=[None, None], image_processor=[None, None])
    _refused(lambda: load_dit(bind_checkpoint(card, d), "cpu", torch.float32),
             "components.transformer.config.added_kv_proj_dim", "image cross-attention")


def test_i2v_card_refuses_a_t2v_directory(tiny_wan_dir, dirs):
    i2v = resolve_card(str(dirs["i2v"]))
    _refused(lambda: load_dit(bind_checkpoint(i2v, tiny_wan_dir), "cpu", torch.float32),
             "model_index._class_name", "image-to-video", "WanPipeline")
    from fastvideo3.card import get_card
    _refused(lambda: load_dit(bind_checkpoint(get_card("wan2.1-i2v-14b-480p"), dirs["moe"]), "cpu", torch.float32),
             "model_index._class_name", "image-to-video")


def test_i2v_layout_refuses_what_it_does_not_implement(dirs, tmp_path):
    d = _copy(dirs["i2v"], tmp_path)
    _edit_index(d, transformer_2=["diffusers", "WanTransformer3DModel"], boundary_ratio=0.9)
    _refused(lambda: resolve_card(str(d)), "model_index.boundary_ratio", "Wan2.2 I2V A14B")
    _edit_index(d, transformer_2=["diffusers", "WanTransformer3DModel"], boundary_ratio=None)
    _refused(lambda: resolve_card(str(d)), "model_index.transformer_2", "transformer_2")
    _edit_index(d, transformer_2=[None, None], image_encoder=["transformers", "SiglipVisionModel"])
    _refused(lambda: resolve_card(str(d)), "model_index.image_encoder", "CLIPVisionModel")
    _edit_index(d, image_encoder=["transformers", "CLIPVisionModel"])
    cfg = json.loads((d / "transformer" / "config.json").read_text())
    (d / "transformer" / "config.json").write_text(json.dumps({**cfg, "pos_embed_seq_len": 514}))
    _refused(lambda: resolve_card(str(d)), "components.transformer.config.pos_embed_seq_len", "FLF2V")
    (d / "transformer" / "config.json").write_text(json.dumps({**cfg, "in_channels": 16}))
    _refused(lambda: resolve_card(str(d)), "components.transformer.config.in_channels", "36")
    (d / "transformer" / "config.json").write_text(json.dumps({**cfg, "image_dim": None}))
    _refused(lambda: resolve_card(str(d)), "components.transformer.config.image_dim", "image cross-attention")


def test_refuses_hunyuan15(dirs):
    from fastvideo3.models.wan.checkpoint import card_for_directory
    _refused(lambda: card_for_directory(dirs["hunyuan15"]), "model_index._class_name", "HunyuanVideo15Pipeline")
    # --model DIR reaches the HunyuanVideo-1.5 family, which refuses this one (no text encoders) by name
    _refused(lambda: resolve_card(str(dirs["hunyuan15"])), "checkpoint.text_encoder", "text_encoder")


def test_refuses_an_unknown_transformer_field(tiny_wan_dir, tmp_path):
    d = _copy(tiny_wan_dir, tmp_path)
    cfg = json.loads((d / "transformer" / "config.json").read_text())
    cfg["rope_theta"] = 5000.0
    (d / "transformer" / "config.json").write_text(json.dumps(cfg))
    _refused(lambda: resolve_card(str(d)), "components.transformer.config.rope_theta", "rope_theta")


def test_two_expert_card_refuses_the_next_layouts(tiny_wan_dir, dirs):
    moe = resolve_card(str(dirs["moe"]))
    assert moe.dit_components() == ["transformer", "transformer_2"]
    # bound to a one-expert directory: the second expert is missing, by name
    _refused(lambda: load_dit(bind_checkpoint(moe, tiny_wan_dir), "cpu", torch.float32, component="transformer_2"),
             "checkpoint.transformer_2", "transformer_2")
    # bound to the TI2V-5B directory: expand_timesteps is refused before a weight is read
    _refused(lambda: load_dit(bind_checkpoint(moe, dirs["ti2v"]), "cpu", torch.float32),
             "model_index.expand_timesteps", "expand_timesteps")


def test_two_expert_card_refuses_another_boundary(dirs, tmp_path):
    moe = resolve_card(str(dirs["moe"]))
    d = _copy(dirs["moe"], tmp_path)
    _edit_index(d, boundary_ratio=0.9)
    _refused(lambda: load_dit(bind_checkpoint(moe, d), "cpu", torch.float32), "model_index.boundary_ratio", "0.9")


def test_a_bare_directory_with_an_unnamed_second_expert_is_refused(tiny_wan_dir, dirs, tmp_path):
    d = tmp_path / "bare"
    shutil.copytree(dirs["moe"] / "transformer", d / "transformer")
    card = bind_checkpoint(resolve_card(str(tiny_wan_dir)), d)  # no model_index.json: the card is explicit
    load_dit(card, "cpu", torch.float32)
    shutil.copytree(dirs["moe"] / "transformer_2", d / "transformer_2")
    _refused(lambda: load_dit(card, "cpu", torch.float32), "checkpoint.transformer_2", "transformer_2")
