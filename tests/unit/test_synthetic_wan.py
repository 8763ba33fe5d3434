"""Random Wan2.1 directories load and run in diffusers' own pipeline, offline."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fastvideo3.testing import synthetic_wan as synthetic
from fastvideo3.testing.synthetic_wan import (
    TINY_TRANSFORMER,
    TINY_UMT5,
    WAN_1_3B_TRANSFORMER,
    WAN_14B_TRANSFORMER,
    build_wan_dir,
    write_random_transformer,
)

pytestmark = pytest.mark.timeout(120)


def _quiet(pipe):
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_tiny_dir_runs_in_wan_pipeline(tiny_wan_dir):
    from diffusers import UniPCMultistepScheduler, WanPipeline

    index = json.loads((tiny_wan_dir / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline"
    pipe = _quiet(WanPipeline.from_pretrained(tiny_wan_dir))
    assert isinstance(pipe.scheduler, UniPCMultistepScheduler)
    assert pipe.scheduler.config.prediction_type == "flow_prediction"
    assert pipe.scheduler.config.flow_shift == 3.0

    frames = pipe(
        "a cat walks along the beach at sunset",
        negative_prompt="blurry",
        num_frames=5,
        height=32,
        width=32,
        num_inference_steps=2,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).frames
    assert frames.shape == (1, 5, 32, 32, 3)
    assert np.isfinite(frames).all()
    assert frames.min() >= 0.0 and frames.max() <= 1.0


def test_tokenizer_reloads_offline(tiny_wan_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_wan_dir / "tokenizer")
    enc = tok("A red car drives through a rainy city at night, 4K!")
    ids = enc.input_ids
    assert ids[-1] == tok.eos_token_id == 1
    assert tok.pad_token_id == 0 and tok.unk_token_id == 2
    assert tok.unk_token_id not in ids  # every ASCII character is a piece
    assert tok.decode(ids, skip_special_tokens=True) == "A red car drives through a rainy city at night, 4K!"
    padded = tok(["a cat"], padding="max_length", max_length=16, truncation=True)
    assert len(padded.input_ids[0]) == 16 and padded.attention_mask[0].count(1) < 16

    config = json.loads((tiny_wan_dir / "text_encoder" / "config.json").read_text())
    assert config["vocab_size"] == len(tok)
    assert config["d_model"] == TINY_TRANSFORMER["text_dim"] == TINY_UMT5["d_model"]


def test_tokenizer_is_reproducible():
    a = synthetic.build_tokenizer().backend_tokenizer.to_str()
    b = synthetic.build_tokenizer().backend_tokenizer.to_str()
    assert a == b


def test_sharding_changes_files_not_weights(tmp_path):
    from diffusers import WanTransformer3DModel
    from diffusers.utils.constants import SAFE_WEIGHTS_INDEX_NAME

    single = write_random_transformer(TINY_TRANSFORMER, tmp_path / "single", seed=3)
    sharded = write_random_transformer(TINY_TRANSFORMER, tmp_path / "sharded", seed=3, max_shard_size="40KB")
    again = write_random_transformer(TINY_TRANSFORMER, tmp_path / "again", seed=3)
    other = write_random_transformer(TINY_TRANSFORMER, tmp_path / "other", seed=4)

    index = json.loads((sharded / SAFE_WEIGHTS_INDEX_NAME).read_text())
    shard_files = sorted(set(index["weight_map"].values()))
    assert len(shard_files) > 1
    assert all((sharded / name).is_file() for name in shard_files)
    assert not list(sharded.glob(".*partial"))
    name = "diffusion_pytorch_model.safetensors"
    assert (single / name).read_bytes() == (again / name).read_bytes()
    assert (single / name).read_bytes() != (other / name).read_bytes()

    a = WanTransformer3DModel.from_pretrained(single).state_dict()
    b = WanTransformer3DModel.from_pretrained(sharded).state_dict()
    assert a.keys() == b.keys()
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in b.values())
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_transformer_only_dir_loads_without_text_encoder_or_vae(tmp_path):
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    from safetensors import safe_open

    root = build_wan_dir(tmp_path / "t", transformer_only=True, scheduler="euler", flow_shift=5.0,
                         dtype=torch.bfloat16)
    assert sorted(p.name for p in root.iterdir()) == ["model_index.json", "scheduler", "transformer"]
    pipe = _quiet(WanPipeline.from_pretrained(root, vae=None, text_encoder=None, tokenizer=None))
    assert isinstance(pipe.scheduler, FlowMatchEulerDiscreteScheduler)
    assert pipe.scheduler.config.shift == 5.0
    with safe_open(root / "transformer" / "diffusion_pytorch_model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    embeds = torch.randn(1, 8, TINY_TRANSFORMER["text_dim"], generator=torch.Generator().manual_seed(0))
    latents = pipe(
        prompt_embeds=embeds,
        negative_prompt_embeds=torch.zeros_like(embeds),
        num_frames=5, height=32, width=32, num_inference_steps=2, output_type="latent",
    ).frames
    assert latents.shape == (1, 16, 2, 4, 4)
    assert torch.isfinite(latents).all()


def test_mismatched_configs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="text_dim"):
        build_wan_dir(tmp_path / "a", text_encoder_config={**TINY_UMT5, "d_model": 64})
    with pytest.raises(ValueError, match="z_dim"):
        build_wan_dir(tmp_path / "b", transformer_config={**TINY_TRANSFORMER, "in_channels": 4})
    with pytest.raises(ValueError, match="preset"):
        build_wan_dir(tmp_path / "c", preset="7b")


@pytest.mark.parametrize(
    ("config", "billions"), [(WAN_1_3B_TRANSFORMER, 1.419), (WAN_14B_TRANSFORMER, 14.288)]
)
def test_real_size_presets_have_wan_shapes(config, billions):
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        model = WanTransformer3DModel(**config)
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=1e-3)
    assert model.config.num_attention_heads * model.config.attention_head_dim in (1536, 5120)
