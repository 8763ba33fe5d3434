"""What the built-in family objects (fastvideo3.card.family.ModelFamily) share. Torch-free: the
family's weights-side modules are imported on first use, from its ``package``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from fastvideo3.models.flops import DitForwardCost, ResidentMemory, StepShape

if TYPE_CHECKING:
    from fastvideo3.card.spec import ModelCard


@dataclass(frozen=True)
class PackagedFamily:
    """A family whose folder, ``package``, holds ``cards.builtin_cards`` and
    ``checkpoint.card_for_directory``, and whose formula module, ``formulas``, holds
    ``dit_forward_cost``, ``dit_peak_activation_bytes`` and ``dit_resident_memory``: every such
    family reads its cards and prices a step the same way. Its latent layout and DiT config come
    from the family's own functions of a card."""

    name: str
    #: the family's package: its cards are ``<package>.cards``, its weights code ``<package>.components``
    package: str
    formulas: ModuleType
    latent_shape: Callable[[ModelCard, int, int, int], tuple[int, int, int, int]]
    latent_stride: Callable[[ModelCard], tuple[int, int, int]]
    dit_config: Callable[[ModelCard], Any]
    #: where the family's shipped weight files live (None: it ships none)
    weights: Path | None = None

    def _module(self, name: str) -> ModuleType:
        return importlib.import_module(f"{self.package}.{name}")

    def builtin_cards(self) -> dict[str, ModelCard]:
        return self._module("cards").builtin_cards()

    def card_for_directory(self, root: Path) -> ModelCard | None:
        return self._module("checkpoint").card_for_directory(root)

    def frames_of_latent(self, card: ModelCard, latent_frames: int) -> int:
        """Frames of a video whose latent has ``latent_frames``: the VAE is causal in time, with the
        temporal stride of the family's ``latent_stride``."""
        return (latent_frames - 1) * self.latent_stride(card)[0] + 1

    def step_shape(self, frames: int, height: int, width: int, *, stride: tuple[int, int, int],
                   batch: int = 1, cfg_branches: int = 1) -> StepShape:
        return StepShape.from_video(frames, height, width, batch=batch, cfg_branches=cfg_branches, stride=stride)

    def step_work(self, config: Any, shape: StepShape, *, weight_bytes_per_param: int, act_bytes: int,
                  sampler_history: int) -> tuple[DitForwardCost, int, ResidentMemory]:
        f = self.formulas
        fwd = f.dit_forward_cost(config, shape, weight_bytes_per_param=weight_bytes_per_param, act_bytes=act_bytes)
        peak = f.dit_peak_activation_bytes(config, shape, act_bytes=act_bytes)
        res = f.dit_resident_memory(config, shape, sampler_history=sampler_history,
                                    weight_bytes_per_param=weight_bytes_per_param)
        return fwd, peak, res

    def weights_dir(self) -> Path | None:
        return self.weights
