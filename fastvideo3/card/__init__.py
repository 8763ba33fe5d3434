"""Model plane: cards, specs and the built-in registry."""
from fastvideo3.card.registry import bind_checkpoint, builtin_cards, get_card, load_card_file, resolve_card
from fastvideo3.card.spec import (
    CheckpointManifest, ComponentSpec, Limits, LoopSpec, ModelCard, ParitySpec, RecipeSpec, SamplerSpec,
)

__all__ = [
    "CheckpointManifest", "ComponentSpec", "Limits", "LoopSpec", "ModelCard", "ParitySpec", "RecipeSpec",
    "SamplerSpec", "bind_checkpoint", "builtin_cards", "get_card", "load_card_file", "resolve_card",
]
