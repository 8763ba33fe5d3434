"""LoRA parity: our engine with an adapter against diffusers' ``load_lora_weights`` on the same
tiny random checkpoint, the Wan-trainer layout against the diffusers one, merged against
per-row, and a batch mixing adapters against each request alone."""
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from fastvideo3.card import resolve_card
from fastvideo3.models.wan.dit import WanDiTConfig
from fastvideo3.models.wan.lora import ADAPTED_LAYERS, layer_shapes
from fastvideo3.parity import rel_error
from fastvideo3.engine import Engine

pytestmark = pytest.mark.timeout(600)
OPTS = dict(num_frames=5, height=32, width=48, num_inference_steps=3)
PROMPT = "a red circle moving left on a white background"


def random_lora(cfg, rank: int, seed: int, std: float = 0.08) -> dict[str, torch.Tensor]:
    """A random LoRA on every adapted layer, in the diffusers/PEFT layout."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, (k_in, k_out) in layer_shapes(cfg).items():
        sd[f"transformer.{name}.lora_A.weight"] = torch.randn(rank, k_in, generator=g) * std
        sd[f"transformer.{name}.lora_B.weight"] = torch.randn(k_out, rank, generator=g) * std
    return sd


def to_wan_layout(sd: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """The same adapter in the Wan trainer's names, with ``alpha`` (up rescaled by rank/alpha so
    the function is unchanged)."""
    out = {}
    for key, t in sd.items():
        layer = key[len("transformer."):].rsplit(".lora_", 1)[0]
        block, rest = layer.split(".", 2)[1], layer.split(".", 2)[2]
        base = f"diffusion_model.blocks.{block}.{ADAPTED_LAYERS[rest]}"
        if ".lora_A." in key:
            out[f"{base}.lora_down.weight"] = t.clone()
            out[f"{base}.alpha"] = torch.tensor(alpha)
        else:
            out[f"{base}.lora_up.weight"] = t * (t.shape[1] / alpha)
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from fastvideo3.testing.synthetic_wan import build_wan_dir
    root = tmp_path_factory.mktemp("lora")
    path = build_wan_dir(root / "wan", preset="tiny", seed=5)
    card = resolve_card(str(path))
    import json
    cfg = WanDiTConfig.from_dict(json.loads((path / "transformer" / "config.json").read_text()))
    a, b = random_lora(cfg, 8, 1), random_lora(cfg, 4, 2)
    save_file(a, str(root / "a.safetensors"))
    save_file(to_wan_layout(a, alpha=4.0), str(root / "a_wan.safetensors"))
    save_file(b, str(root / "b.safetensors"))
    return path, card, root


def _diffusers(path, lora_file, scale, seed):
    from diffusers import WanPipeline
    pipe = WanPipeline.from_pretrained(str(path))
    pipe.load_lora_weights(str(lora_file), adapter_name="a")
    pipe.set_adapters(["a"], [scale])
    kw = dict(prompt=PROMPT, negative_prompt="blurry", guidance_scale=5.0, **OPTS)
    return pipe(**kw, generator=torch.Generator().manual_seed(seed), output_type="np").frames[0]


def test_lora_matches_diffusers_load_lora_weights(setup):
    path, card, root = setup
    want = _diffusers(path, root / "a.safetensors", 0.7, seed=3)
    with Engine(card) as engine:
        engine.load_adapter("a", str(root / "a.safetensors"))
        base = engine.generate(PROMPT, negative_prompt="blurry", seed=3, guidance_scale=5.0, **OPTS)
        got = engine.generate(PROMPT, negative_prompt="blurry", seed=3, guidance_scale=5.0,
                              adapters=[{"id": "a", "scale": 0.7}], **OPTS)
        engine.unload_adapter("a")
        engine.load_adapter("a", str(root / "a_wan.safetensors"))  # the same function, Wan names
        got_wan = engine.generate(PROMPT, negative_prompt="blurry", seed=3, guidance_scale=5.0,
                                  adapters=[{"id": "a", "scale": 0.7}], **OPTS)
    tol = card.parity.c1_frames_abs
    assert got.frames.shape == want.shape
    assert float(np.abs(got.frames - want).max()) <= tol
    assert float(np.abs(got_wan.frames - want).max()) <= tol
    # the adapter matters at this size: without it the frames are far outside the tolerance
    assert float(np.abs(base.frames - want).max()) > 10 * tol
    assert got.metadata["adapters"][0]["version"] != got_wan.metadata["adapters"][0]["version"]


def test_wan_trainer_layout_matches_diffusers_conversion(setup):
    path, card, root = setup
    want = _diffusers(path, root / "a_wan.safetensors", 0.7, seed=4)
    with Engine(card) as engine:
        engine.load_adapter("a", str(root / "a_wan.safetensors"))
        got = engine.generate(PROMPT, negative_prompt="blurry", seed=4, guidance_scale=5.0,
                              adapters=[{"id": "a", "scale": 0.7}], **OPTS)
    assert float(np.abs(got.frames - want).max()) <= card.parity.c1_frames_abs


def test_merged_equals_per_row(setup):
    path, card, root = setup
    kw = dict(negative_prompt="blurry", seed=5, guidance_scale=5.0, adapters=[{"id": "a", "scale": 0.7}], **OPTS)
    with Engine(card, keep_latents=True) as engine:
        engine.load_adapter("a", str(root / "a.safetensors"))
        per_row = engine.generate(PROMPT, **kw)
    with Engine(card, keep_latents=True) as engine:
        info = engine.denoiser.merge_adapter("a", 0.7, str(root / "a.safetensors"))
        assert engine.denoiser.describe()["adapters"]["mode"] == "merged"
        assert info["version"] in engine.denoiser.weights_digest  # the identity names what ran
        merged = engine.generate(PROMPT, **kw)
    assert rel_error(merged.latents, per_row.latents) <= card.parity.c1_latents_rel
    assert float(np.abs(merged.frames - per_row.frames).max()) <= card.parity.c1_frames_abs
    assert merged.metadata["runtime"]["fingerprint"] != per_row.metadata["runtime"]["fingerprint"]


def test_mixed_adapter_batch_equals_each_alone(setup):
    path, card, root = setup
    plan = [("a red circle", 1, [{"id": "a", "scale": 0.7}]), ("a blue square", 2, [{"id": "b", "scale": 1.0}]),
            ("a green line", 3, None), ("a red circle", 4, [{"id": "a", "scale": 0.5}])]
    with Engine(card, keep_latents=True) as engine:
        engine.load_adapter("a", str(root / "a.safetensors"))
        engine.load_adapter("b", str(root / "b.safetensors"))
        alone = [engine.generate(p, seed=s, adapters=ad, **OPTS).latents for p, s, ad in plan]
        runs = [engine.submit(p, seed=s, adapters=ad, **OPTS) for p, s, ad in plan]
        engine.run()
        rows = engine.denoiser.counters["max_batch_rows"]
        together = [engine.result(r).latents for r in runs]
    assert rows == 2 * len(plan)  # one forward served all four requests (cond + uncond each)
    for a, b in zip(together, alone):
        assert rel_error(a, b) <= card.parity.c1_latents_rel
    assert rel_error(together[0], together[3]) > card.parity.c1_latents_rel  # scales differ
