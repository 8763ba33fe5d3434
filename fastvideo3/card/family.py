"""The model-family registry: how card/, loop/ and runtime/ learn a family's facts.

A family (``fastvideo3/models/<family>/``) owns its configs, its built-in cards, its latent-shape
rule and its FLOP formulas. It registers one :class:`ModelFamily` object here at import; nothing
below the family's own folder names it. The built-in families register when the ``fastvideo3``
package is imported (``fastvideo3/models/families.py``); another one registers by importing its
module, or by calling :func:`register_family` directly (tests do).

A card names its family (``ModelCard.family``); :func:`family_of` is the lookup every caller uses.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fastvideo3.errors import NotFound

if TYPE_CHECKING:
    from fastvideo3.card.spec import ModelCard


@runtime_checkable
class ModelFamily(Protocol):
    """What a model family tells the rest of the tree.

    Every method is pure (no weights, no torch): the scheduler, the fake pools and the pricer call
    them on any machine.
    """

    #: the value cards of this family carry in ``ModelCard.family``
    name: str

    def builtin_cards(self) -> dict[str, ModelCard]:
        """The family's built-in cards by model id (fresh objects on each call)."""

    def card_for_directory(self, root: Path) -> ModelCard | None:
        """A card for a checkpoint directory in this family's layout, or None if it is not one."""

    def latent_shape(self, card: ModelCard, frames: int, height: int, width: int) -> tuple[int, ...]:
        """The latent's shape (channels first, no batch) for a request of that video size."""

    def frames_of_latent(self, card: ModelCard, latent_frames: int) -> int:
        """How many video frames the decoder makes from ``latent_frames`` latent frames."""

    def latent_stride(self, card: ModelCard) -> tuple[int, int, int]:
        """(temporal, height, width) compression from video to latent."""

    def dit_config(self, card: ModelCard) -> Any:
        """The denoiser's architecture in the form :meth:`step_work` reads."""

    def step_shape(self, frames: int, height: int, width: int, *, stride: tuple[int, int, int],
                   batch: int = 1, cfg_branches: int = 1) -> Any:
        """One diffusion step's shape (what :meth:`step_work` prices) for a request of that size."""

    def step_work(self, config: Any, shape: Any, *, weight_bytes_per_param: int, act_bytes: int,
                  sampler_history: int) -> tuple[Any, float, Any]:
        """One diffusion step's (forward cost, peak activation bytes, resident memory)."""

    def weights_dir(self) -> Path | None:
        """Where the family's shipped weight files live (None: it ships none)."""


_FAMILIES: dict[str, ModelFamily] = {}


def register_family(family: ModelFamily) -> ModelFamily:
    """Add (or replace) a family; returns it, so a module can ``FAMILY = register_family(...)``."""
    _FAMILIES[family.name] = family
    return family


def unregister_family(name: str) -> None:
    _FAMILIES.pop(name, None)


def families() -> dict[str, ModelFamily]:
    """The registered families by name, in registration order."""
    return dict(_FAMILIES)


def get_family(name: str) -> ModelFamily:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise NotFound(f"unknown model family {name!r}", field="family", limit=", ".join(_FAMILIES)) from None


def family_of(card: ModelCard) -> ModelFamily:
    return get_family(card.family)


def family_module(card: ModelCard, name: str = "components") -> ModuleType:
    """A module of the card's family's weights code, ``<package>.<name>``, where ``package`` is the
    family object's optional ``package`` attribute (its folder's import path). The pools build
    their components from ``components``: ``TextEncoder``, ``VideoDecoder``, ``load_dit``,
    ``fast_dit`` and ``lora_layers``. A family without a package serves no weights (fake pools only)."""
    fam = family_of(card)
    package = getattr(fam, "package", None)
    if not package:
        raise NotFound(f"model family {fam.name!r} names no package of weights code", field="family",
                       limit="a family with a package")
    return importlib.import_module(f"{package}.{name}")


__all__ = ["ModelFamily", "families", "family_module", "family_of", "get_family", "register_family",
           "unregister_family"]
