"""Interceptor settings: the registry of named policies, their parameters, and validation.

A request names a policy (``{"policy": "dbcache", "threshold": 0.1, ...}``) or inherits the
card's default; :func:`resolve_cache` checks the name against the registry and the card's
contract (what the card allows), fills every parameter from the card's defaults, then the
policy's, and checks each against its range. The result is a flat JSON dict with every
parameter present: it is what the LoopState, the CacheKey and the provenance record.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fastvideo3.errors import FailedPrecondition, InvalidRequest

NONE = "none"


@dataclass(frozen=True)
class Param:
    """One parameter: kind ("int", "float", "bool"), default, and range (open low when ``lo_open``)."""

    kind: str
    default: Any
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False

    def limit(self) -> str:
        if self.kind == "bool":
            return "true or false"
        return f"{'(' if self.lo_open else '['}{self.lo}, {self.hi}]"


_RUN_LIMITS = {
    "warmup_steps": Param("int", 4, 0, 1000),
    "max_cached_steps": Param("int", -1, -1, 1000),
    "max_continuous_cached_steps": Param("int", -1, -1, 1000),
}

#: policy -> its parameters. dbcache: the first ``front_blocks`` and last ``back_blocks`` blocks
#: always run, the middle reuses its residual while the front residual changes by less than
#: ``threshold`` (relative L1) since the last step that computed it; ``taylorseer`` extrapolates
#: the reused residual from the computed ones. fbcache is dbcache with one front block and no
#: back block. teacache reuses the whole block stack while the accumulated relative L1 change of
#: the first block's modulated input stays under ``threshold`` (optionally through the rescale
#: polynomial), always computing the first ``warmup_steps`` and the last ``final_steps``.
POLICIES: dict[str, dict[str, Param]] = {
    "dbcache": {
        "front_blocks": Param("int", 1, 1, 1000),
        "back_blocks": Param("int", 0, 0, 1000),
        "threshold": Param("float", 0.08, 0.0, 1.0, lo_open=True),
        **_RUN_LIMITS,
        "taylorseer": Param("bool", False),
        "taylorseer_order": Param("int", 1, 1, 3),
    },
    "fbcache": {
        "threshold": Param("float", 0.08, 0.0, 1.0, lo_open=True),
        **_RUN_LIMITS,
    },
    "teacache": {
        "threshold": Param("float", 0.1, 0.0, 2.0, lo_open=True),
        "warmup_steps": Param("int", 2, 0, 1000),
        "final_steps": Param("int", 1, 0, 1000),
        "rescale": Param("bool", False),
    },
}


def policy_names() -> list[str]:
    return sorted(POLICIES)


def _check(policy: str, name: str, p: Param, v: Any, num_steps: int) -> Any:
    fld = f"cache.{name}"
    if p.kind == "bool":
        if not isinstance(v, bool):
            raise InvalidRequest(f"must be true or false, got {v!r}", field=fld, limit=p.limit())
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise InvalidRequest(f"must be a number, got {v!r}", field=fld, limit=p.limit())
    if p.kind == "int":
        if isinstance(v, float) and not v.is_integer():
            raise InvalidRequest(f"must be an integer, got {v!r}", field=fld, limit=p.limit())
        v = int(v)
    else:
        v = float(v)
    hi = p.hi
    if name in ("warmup_steps", "final_steps", "max_cached_steps", "max_continuous_cached_steps"):
        hi = num_steps  # a count of steps never exceeds the request's steps
    low_bad = v <= p.lo if p.lo_open else v < p.lo
    if low_bad or v > hi:
        lim = f"{'(' if p.lo_open else '['}{p.lo}, {hi}]"
        raise InvalidRequest(f"{v} is out of range for {policy}", field=fld, limit=lim)
    return v


def resolve_cache(requested: dict | None, card, num_steps: int) -> dict | None:
    """The full settings of the interceptor a request runs with, or None for none.

    Refusals: an unknown policy or parameter, or a value out of range -> InvalidRequest naming
    ``cache.<field>`` and its range; a policy the card does not allow -> FailedPrecondition.
    """
    contract = card.extensions
    if requested is None:
        requested = dict(contract.default) if contract.default else None
    if requested is None:
        return None
    if not isinstance(requested, dict):
        raise InvalidRequest("must be an object with a 'policy' name", field="cache", limit="{policy: ...}")
    policy = requested.get("policy", NONE)
    if policy == NONE:
        return None
    if policy not in POLICIES:
        raise InvalidRequest(f"unknown cache policy {policy!r}", field="cache.policy",
                             limit=", ".join([NONE, *policy_names()]))
    if policy not in contract.allowed:
        raise FailedPrecondition(
            f"card {card.model_id} does not allow cache policy {policy!r} (recipe {card.recipe.method})",
            field="cache.policy", limit=", ".join(contract.allowed) or NONE)
    params = POLICIES[policy]
    unknown = sorted(set(requested) - set(params) - {"policy"})
    if unknown:
        raise InvalidRequest(f"unknown parameter {unknown[0]!r} for {policy}", field=f"cache.{unknown[0]}",
                             limit=", ".join(sorted(params)))
    card_defaults = contract.params.get(policy, {})
    out: dict[str, Any] = {"policy": policy}
    for name, p in params.items():
        value = requested.get(name, card_defaults.get(name, p.default))
        out[name] = _check(policy, name, p, value, num_steps)
    blocks = dit_blocks(card)
    if blocks is not None and policy == "dbcache":
        if out["front_blocks"] + out["back_blocks"] >= blocks:
            raise InvalidRequest(
                f"front_blocks {out['front_blocks']} + back_blocks {out['back_blocks']} leave no middle block",
                field="cache.back_blocks", limit=f"front_blocks + back_blocks <= {blocks - 1}")
    return out


def dit_blocks(card) -> int | None:
    try:
        n = card.component_of_kind("dit").config.get("num_layers")
    except KeyError:
        return None
    return int(n) if n else None


def settings_key(settings: dict | None) -> str:
    """Canonical text of every output-changing setting (for the CacheKey and provenance)."""
    if not settings:
        return NONE
    return ",".join(f"{k}={settings[k]}" for k in sorted(settings))
