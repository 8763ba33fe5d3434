"""Loading refuses, naming it, every HunyuanVideo-1.5 component, config field or layout it does
not implement -- and each family's loader refuses the other family's directory."""
import json
import shutil

import pytest
import torch

from fastvideo3.card import resolve_card
from fastvideo3.card.registry import bind_checkpoint, get_card
from fastvideo3.errors import CardError

pytestmark = pytest.mark.timeout(300)


def test_hunyuan_loader_refuses_a_wan_directory(tiny_wan_dir):
    from fastvideo3.models.hunyuan15.components import load_dit
    from fastvideo3.models.hunyuan15.layout import inspect_directory
    with pytest.raises(CardError, match="WanPipeline") as e:
        inspect_directory(tiny_wan_dir)
    assert e.value.field == "model_index._class_name"
    with pytest.raises(CardError, match="WanPipeline") as e:  # a HunyuanVideo-1.5 card bound to it
        load_dit(bind_checkpoint(get_card("hunyuanvideo-1.5-tiny"), tiny_wan_dir))
    assert e.value.field == "model_index._class_name"
    assert resolve_card(str(tiny_wan_dir)).family == "wan"  # the registry still reads it as Wan's


def test_wan_loader_refuses_a_hunyuan_directory(tiny_hunyuan15_dir):
    from fastvideo3.models.wan.checkpoint import card_for_directory
    from fastvideo3.models.wan.components import load_dit
    with pytest.raises(CardError, match="HunyuanVideo15Pipeline") as e:
        card_for_directory(tiny_hunyuan15_dir)
    assert e.value.field == "model_index._class_name"
    with pytest.raises(CardError, match="HunyuanVideo15Pipeline") as e:  # a Wan card bound to it
        load_dit(bind_checkpoint(get_card("wan2.1-t2v-1.3b"), tiny_hunyuan15_dir), component="transformer")
    assert e.value.field == "model_index._class_name"


def _edit(path, key, value):
    data = json.loads(path.read_text())
    data[key] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("file, key, value, field", [
    ("model_index.json", "transformer_2", ["diffusers", "HunyuanVideo15Transformer3DModel"],
     "model_index.transformer_2"),
    ("model_index.json", "image_encoder", ["transformers", "SiglipVisionModel"], "model_index.image_encoder"),
    ("model_index.json", "transformer", ["diffusers", "WanTransformer3DModel"], "model_index.transformer"),
    ("model_index.json", "_class_name", "HunyuanVideo15ImageToVideoPipeline", "model_index._class_name"),
    ("transformer/config.json", "use_meanflow", True, "components.transformer.config.use_meanflow"),
    ("transformer/config.json", "task_type", "i2v", "components.transformer.config.task_type"),
    ("transformer/config.json", "in_channels", 4, "components.transformer.config.in_channels"),
    ("transformer/config.json", "sliding_attention", True, "components.transformer.config.sliding_attention"),
    ("vae/config.json", "latent_channels", 8, "components.vae.config.latent_channels"),
    ("scheduler/scheduler_config.json", "use_dynamic_shifting", True,
     "components.scheduler.config.use_dynamic_shifting"),
    ("scheduler/scheduler_config.json", "_class_name", "UniPCMultistepScheduler",
     "components.scheduler.config._class_name"),
    ("guider/guider_config.json", "guidance_rescale", 0.7, "components.guider.config.guidance_rescale"),
    ("guider/guider_config.json", "stop", 0.5, "components.guider.config.stop"),
])
def test_directory_refusals_name_what_differs(tiny_hunyuan15_dir, tmp_path, file, key, value, field):
    root = shutil.copytree(tiny_hunyuan15_dir, tmp_path / "hy")
    _edit(root / file, key, value)
    with pytest.raises(CardError) as e:
        resolve_card(str(root))
    assert e.value.field == field, str(e.value)


def test_card_and_checkpoint_disagreements_are_refused_by_name(tiny_hunyuan15_dir, tmp_path):
    from safetensors.torch import load_file, save_file
    from fastvideo3.models.hunyuan15.components import VideoDecoder, load_dit
    card = get_card("hunyuanvideo-1.5-tiny")
    # a VAE whose compression differs from the card's latent layout
    root = shutil.copytree(tiny_hunyuan15_dir, tmp_path / "vae")
    _edit(root / "vae/config.json", "spatial_compression_ratio", 8)
    with pytest.raises(CardError) as e:
        VideoDecoder(bind_checkpoint(card, root))
    assert e.value.field == "components.vae.config.spatial_compression_ratio"
    # an architecture field the card declares otherwise
    other = card.model_copy(deep=True)
    other.components["transformer"].config["num_layers"] = 3
    with pytest.raises(CardError) as e:
        load_dit(bind_checkpoint(other, tiny_hunyuan15_dir))
    assert e.value.field == "components.transformer.config.num_layers"
    # a tensor the key map does not know, and a mis-shaped one: each named
    for name, edit in (("extra", lambda s: s.update({"blocks.0.extra.weight": torch.zeros(2)})),
                       ("shape", lambda s: s.update({"proj_out.bias": torch.zeros(5)}))):
        root = shutil.copytree(tiny_hunyuan15_dir, tmp_path / name)
        weights = root / "transformer" / "diffusion_pytorch_model.safetensors"
        state = load_file(str(weights))
        edit(state)
        save_file(state, str(weights))
        with pytest.raises(CardError) as e:
            load_dit(resolve_card(str(root)))
        want = {"extra": "transformer.blocks.0.extra.weight", "shape": "transformer.proj_out.bias"}[name]
        assert e.value.field == want


def test_pool_start_check_finds_every_file_a_role_loads(tiny_hunyuan15_dir):
    from fastvideo3.card.verify import ROLE_KINDS, verify_checkpoint
    card = resolve_card(str(tiny_hunyuan15_dir))
    for role, kinds in ROLE_KINDS.items():
        verify_checkpoint(card, kinds)  # raises, naming the file, if one a role loads is missing
