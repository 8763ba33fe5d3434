"""The card registry: built-in cards of every registered model family, and card file loading.

The cards themselves belong to their families (``fastvideo3/models/<family>/``), which register
with :mod:`fastvideo3.card.family`; this module knows them only through it. :func:`resolve_card`
takes a built-in card name, a card file or a checkpoint directory (each family is asked whether the
directory is in its layout). :func:`fp8_variant` derives an FP8 card from any card with a DiT.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from fastvideo3.card.family import families
from fastvideo3.card.spec import FP8, Fp8Spec, ModelCard, PrecisionContract
from fastvideo3.errors import CardError, NotFound


def fp8_variant(card: ModelCard, model_id: str, fp8: Fp8Spec | None = None) -> ModelCard:
    """``card`` with its DiT's block Linears in e4m3 (:data:`~fastvideo3.card.spec.FP8`), quantized
    at load from the same checkpoint (or loaded pre-quantized with key map
    ``wan_dit_diffusers_fp8_v1``); the recipe then assumes FP8 and nothing else is served."""
    data = card.model_dump(mode="json")
    dit = next(k for k, c in card.components.items() if c.kind == "dit")
    data["components"][dit].update(precision=FP8, fp8=(fp8 or Fp8Spec()).model_dump(mode="json"))
    data.update(model_id=model_id, description=f"{card.description} Block linear layers in FP8 (e4m3), "
                "quantized at load; needs a GPU with FP8 tensor cores.")
    data["recipe"].update(assumes_precision=FP8, parents=[*card.recipe.parents, card.model_id])
    data["precision"] = PrecisionContract(supported=[FP8], default_cpu=FP8, default_cuda=FP8, vae_cpu=card.precision.vae_cpu,
                                         vae_cuda=card.precision.vae_cuda).model_dump(mode="json")
    return ModelCard.model_validate(data)


def builtin_cards() -> dict[str, ModelCard]:
    """Every registered family's built-in cards by model id."""
    cards: dict[str, ModelCard] = {}
    for fam in families().values():
        cards.update(fam.builtin_cards())
    return cards


def get_card(name: str) -> ModelCard:
    cards = builtin_cards()
    if name not in cards:
        raise NotFound(f"unknown card {name!r}", field="model", limit=", ".join(sorted(cards)))
    return cards[name]


def bind_checkpoint(card: ModelCard, root: str | Path) -> ModelCard:
    """Return a copy of ``card`` whose diffusers_dir components load from ``root``."""
    return card.model_copy(update={"checkpoint": card.checkpoint.model_copy(update={"root": str(Path(root).resolve())})})


def load_card_file(path: str | Path) -> ModelCard:
    """Parse and strictly validate a card file (YAML or JSON). Raises CardError naming the field."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise CardError(f"cannot read card file: {e.strerror}", field="card") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise CardError(f"card file is not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {e}", field="card") from None
    if not isinstance(data, dict):
        raise CardError("card file must hold a mapping", field="card")
    base = data.pop("extends", None)
    if base is not None:  # a card file may start from a built-in card and override fields
        merged = get_card(base).model_dump(mode="json")
        ck = data.get("checkpoint")
        if isinstance(ck, dict) and "root" in ck and "digests" not in ck:
            merged["checkpoint"]["digests"] = {}  # the base's digests describe its own files, not this root's
        _deep_update(merged, data)
        if "limits" in data and "graph_buckets" not in data:
            merged["graph_buckets"] = _inherited_buckets(merged)
        data = merged
    try:
        return ModelCard.model_validate(data)
    except ValidationError as e:
        raise card_validation_error(e) from None


def _inherited_buckets(merged: dict) -> dict:
    """The base card's graph buckets under the file's own limits: those whose shapes the limits
    still accept -- a file that narrows the limits need not restate buckets it never declared."""
    from fastvideo3.card.spec import GraphBucketSpec, Limits, graph_buckets_within
    try:
        spec = GraphBucketSpec.model_validate(merged.get("graph_buckets") or {})
        lim = Limits.model_validate(merged.get("limits") or {})
    except ValidationError:
        return {}  # the limits themselves are refused when the card is validated, naming the field
    return graph_buckets_within(spec, lim).model_dump(mode="json")


def card_validation_error(e: ValidationError) -> CardError:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "card"
    return CardError(err["msg"], field=loc, details={"errors": str(len(e.errors()))})


def _deep_update(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_update(dst[k], v)
        else:
            dst[k] = v


def resolve_card(model: str) -> ModelCard:
    """A built-in card name, a card file (.yaml/.yml/.json) or a diffusers-format directory."""
    p = Path(model)
    if p.is_dir():
        return card_for_directory(p)
    if p.suffix in (".yaml", ".yml", ".json") and p.exists():
        card = load_card_file(p)
        if card.checkpoint.root and not Path(card.checkpoint.root).is_absolute():
            card = bind_checkpoint(card, p.parent / card.checkpoint.root)
        return card
    return get_card(model)


def card_for_directory(root: str | Path) -> ModelCard:
    """The card of the first family (latest registered first) that reads ``root`` as its layout;
    the first-registered family is the fallback and reports what is wrong with the directory."""
    fams = list(families().values())
    for fam in reversed(fams[1:]):
        card = fam.card_for_directory(Path(root))
        if card is not None:
            return card
    card = fams[0].card_for_directory(Path(root)) if fams else None
    if card is None:
        raise CardError(f"{root} is not a checkpoint directory of any registered family", field="model",
                        limit=", ".join(f.name for f in fams))
    return card
