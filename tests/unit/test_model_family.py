"""A model family is a registry entry: a throwaway family registered from this test module is
served by card/, loop/, runtime/ and services/ with no edit there.

The toy family differs from Wan in every fact the tree asks a family for: 8x temporal and 4x
spatial compression, 3 latent channels, its own FLOP formula and its own checkpoint layout (a
``toy.json`` directory). Each caller (the card registry, the denoise loop, the pricer, the fake
pool) must give the toy answer, which it can only get from the registered object.
"""
from __future__ import annotations

import json
from collections import namedtuple
from types import SimpleNamespace
from pathlib import Path

import pytest

from fastvideo3.card.family import families, family_of, register_family, unregister_family
from fastvideo3.card.registry import builtin_cards, get_card, resolve_card
from fastvideo3.card.spec import ModelCard
from fastvideo3.loop.context import RequestContext
from fastvideo3.loop.denoise import DenoiseLoop
from fastvideo3.models.wan.cards import wan_tiny_seeded
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.economy.cost import DiffusionStepFeatures, unit_work
from fastvideo3.runtime.economy.pricing import Pricer
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.vocab import LoopId, Role, UnitKind
from services.common.fake import FakeExecutor, fake_ref


#: the toy family's step shape (latent frames, height, width, CFG branches)
ToyShape = namedtuple("ToyShape", "frames height width cfg_branches")


class ToyFamily:
    name = "toy"

    def __init__(self):
        self.priced: list[ToyShape] = []

    def _card(self, model_id: str, root: str | None = None) -> ModelCard:
        data = wan_tiny_seeded().model_dump(mode="json")  # the card schema is the same for every family
        data.update(model_id=model_id, family="toy", description="a throwaway family")
        data["checkpoint"]["root"] = root
        return ModelCard.model_validate(data)

    def builtin_cards(self):
        return {"toy-1": self._card("toy-1")}

    def card_for_directory(self, root: Path):
        return self._card(json.loads((root / "toy.json").read_text())["id"], str(root)) \
            if (root / "toy.json").exists() else None

    def latent_shape(self, card, frames, height, width):
        return (3, (frames - 1) // 8 + 1, height // 4, width // 4)

    def frames_of_latent(self, card, latent_frames):
        return (latent_frames - 1) * 8 + 1

    def latent_stride(self, card):
        return (8, 4, 4)

    def dit_config(self, card):
        return SimpleNamespace(family="toy", width=7)  # `family` names whose formulas price it

    def step_shape(self, frames, height, width, *, stride, batch=1, cfg_branches=1):
        return ToyShape(1 + (frames - 1) // stride[0], height // stride[1], width // stride[2], cfg_branches)

    def step_work(self, config, shape, *, weight_bytes_per_param, act_bytes, sampler_history):
        self.priced.append(shape)
        n = shape.frames * shape.height * shape.width * shape.cfg_branches * config.width
        return SimpleNamespace(flops=1e9 * n, bytes=1e6 * n, weight_bytes=0.0), 123.0, SimpleNamespace(per_request=456.0)

    def weights_dir(self):
        return None


@pytest.fixture
def toy():
    fam = register_family(ToyFamily())
    yield fam
    unregister_family("toy")


def test_a_registered_family_is_served_everywhere(toy, tmp_path):
    # card registry: built-in cards and checkpoint directories
    assert "toy-1" in builtin_cards() and "wan-tiny" in builtin_cards()
    card = get_card("toy-1")
    assert card.family == "toy" and family_of(card) is toy
    (tmp_path / "toy.json").write_text(json.dumps({"id": "toy-from-dir"}))
    assert resolve_card(str(tmp_path)).model_id == "toy-from-dir"

    # the denoise loop asks the family for the latent shape
    req = resolve(GenerateRequest("x", num_frames=17, height=64, width=64, num_inference_steps=2, seed=0), card)
    state = DenoiseLoop().init(req, card, RequestContext())
    assert state.latent_shape == [3, 3, 16, 16]

    # the pricer asks it for the step's shape and its FLOP formula
    pricer = Pricer()
    feats = pricer.features(UnitKind.DIFFUSION_STEP, card, req)
    assert isinstance(feats, DiffusionStepFeatures) and feats.shape == ToyShape(3, 16, 16, 2)
    work = unit_work(UnitKind.DIFFUSION_STEP, feats)
    assert toy.priced and work.peak_bytes == 123.0 and work.resident_bytes == 456.0
    assert pricer.predict(UnitKind.DIFFUSION_STEP, "k", card, req).gpu_seconds > 0

    # the fake decoder pool makes the family's frame count and size from the latent
    fake = FakeExecutor(Role.DECODER, card, transport=None)
    unit = WorkUnit("u1", "r1", LoopId.VAE_DECODE, UnitKind.VAE_TILE, Role.DECODER, card.model_id, "sig",
                    inputs={"latents": fake_ref(Role.DENOISER, "r1", "latents", [1, 3, 3, 16, 16])})
    (res,) = fake.execute([unit])
    assert list(res.outputs["frames"].shape) == [17, 64, 64, 3]


def test_unregistered_family_is_refused_by_name():
    assert "toy" not in families()
    data = get_card("wan-tiny-seeded").model_dump(mode="json")
    data["family"] = "toy"
    with pytest.raises(ValueError, match="unknown model family 'toy'"):
        ModelCard.model_validate(data)
