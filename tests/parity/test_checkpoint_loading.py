"""Loading diffusers-format directories: the CLI on a directory written by diffusers, and
refusals that name what differs between a directory and its card."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from fastvideo3.card import load_card_file, resolve_card
from fastvideo3.errors import CardError
from fastvideo3.models.wan.components import load_dit

pytestmark = pytest.mark.timeout(300)


def test_cli_generates_from_a_diffusers_directory(tiny_wan_dir, tmp_path):
    out = tmp_path / "v.mp4"
    r = subprocess.run([sys.executable, "-m", "fastvideo3.cli", "generate", "a dog running", "-o", str(out),
                        "--model", str(tiny_wan_dir), "--frames", "9", "--size", "48x32", "--steps", "3", "--quiet"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    from fastvideo3.media import probe_video
    info = probe_video(out)
    assert (info["codec"], info["frames"], info["width"], info["height"]) == ("h264", 9, 48, 32)
    side = json.loads((tmp_path / "v.mp4.json").read_text())
    assert side["weights"]["transformer"].startswith("sha256:")


def test_card_file_can_name_a_directory(tiny_wan_dir, tmp_path):
    from fastvideo3.engine import Engine
    card = tmp_path / "card.yaml"
    base = resolve_card(str(tiny_wan_dir)).model_dump(mode="json")
    base["model_id"] = "my-wan"
    base["checkpoint"]["root"] = str(tiny_wan_dir)
    import yaml
    card.write_text(yaml.safe_dump(base))
    with Engine(str(card)) as e:
        v = e.generate("x", num_frames=5, height=32, width=32, num_inference_steps=2)
    assert v.frames.shape == (5, 32, 32, 3) and v.metadata["card"] == "my-wan"
    assert load_card_file(card).checkpoint.root == str(tiny_wan_dir)


@pytest.fixture
def broken_dir(tiny_wan_dir, tmp_path):
    d = tmp_path / "wan"
    shutil.copytree(tiny_wan_dir, d)
    return d


def test_refuses_config_that_disagrees_with_card(broken_dir):
    card = resolve_card(str(broken_dir))
    cfg_path = broken_dir / "transformer" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["num_layers"] += 1
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CardError) as e:
        load_dit(card, "cpu", torch.float32)
    assert "num_layers" in e.value.field


def _weights(d):
    files = sorted((d / "transformer").glob("*.safetensors"))
    assert len(files) == 1
    return files[0]


def test_refuses_wrong_shape_missing_and_unexpected_tensors(broken_dir):
    card = resolve_card(str(broken_dir))
    path = _weights(broken_dir)
    sd = load_file(str(path))
    original = dict(sd)
    sd["blocks.0.ffn.net.2.weight"] = torch.zeros(3, 3)
    save_file(sd, str(path))
    with pytest.raises(CardError) as e:
        load_dit(card, "cpu", torch.float32)
    assert "blocks.0.ffn.net.2.weight" in e.value.field and "shape" in e.value.message

    sd = dict(original)
    del sd["blocks.1.attn2.to_k.bias"]
    save_file(sd, str(path))
    with pytest.raises(CardError) as e:
        load_dit(card, "cpu", torch.float32)
    assert "blocks.1.attn2.to_k.bias" in e.value.message

    sd = dict(original)
    sd["blocks.0.mystery"] = torch.zeros(2)
    save_file(sd, str(path))
    with pytest.raises(CardError) as e:
        load_dit(card, "cpu", torch.float32)
    assert "blocks.0.mystery" in e.value.message


def test_refuses_directory_without_a_component(broken_dir):
    shutil.rmtree(broken_dir / "vae")
    with pytest.raises(CardError) as e:
        resolve_card(str(broken_dir))
    assert e.value.field == "checkpoint.vae"


def test_builtin_card_without_directory_names_checkpoint_root():
    from fastvideo3.card import get_card
    with pytest.raises(CardError) as e:
        load_dit(get_card("wan2.1-t2v-1.3b"), "cpu", torch.bfloat16)
    assert e.value.field == "checkpoint.root"
