"""Parallel plans of one denoiser replica: CFG-parallel x ring x Ulysses over ``cfg*ring*ulysses`` ranks.

A plan is written as its factors joined by ``x``: ``single``, ``ulysses2``, ``ring2``,
``ulysses2xring2`` (the hybrid), ``cfg2``, ``cfg2xulysses2``. Its kind is one of the card's
plan names (:data:`PLAN_KINDS`): ``single``, ``sp_ulysses``, ``sp_ring``, ``hybrid``,
``cfg_parallel`` or a ``+``-joined composition (``cfg_parallel+sp_ulysses``).

Rank layout (Ulysses innermost, so a Ulysses group is the closest GPUs)::

    rank = c * (ring * ulysses) + r * ulysses + u

* the **cfg** group (fixed ``r, u``) splits a forward's batch rows (cond on one rank, uncond on
  the other) and all-gathers the predictions;
* the **sequence** of tokens is split over ``ring * ulysses`` ranks (fixed ``c``): rank
  ``(r, u)`` holds the contiguous shard ``r * ulysses + u``. A Ulysses group (fixed ``c, r``)
  swaps sequence for heads around attention (all-to-all); a ring group (fixed ``c, u``) passes
  K/V shards around the ring with an online softmax.

A sequence that does not divide by the sequence degree is padded at its end (padded keys are
masked out of attention, padded outputs dropped); heads that do not divide by the Ulysses
degree are padded with zero heads. With ``pad=False`` either case is refused instead, naming
the field and the divisor.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from fastvideo3.errors import InvalidRequest

PLAN_KINDS = ("single", "sp_ulysses", "sp_ring", "hybrid", "cfg_parallel")
_FACTOR = re.compile(r"^(cfg|ulysses|ring)([1-9][0-9]*)$")
MAX_DEGREE = 64


@dataclass(frozen=True)
class ParallelPlan:
    cfg: int = 1
    ring: int = 1
    ulysses: int = 1
    pad: bool = True

    def __post_init__(self) -> None:
        for name in ("cfg", "ring", "ulysses"):
            v = getattr(self, name)
            if not isinstance(v, int) or not 1 <= v <= MAX_DEGREE:
                raise InvalidRequest(f"plan degree {name}={v!r}", field=f"plan.{name}", limit=f"1..{MAX_DEGREE}")
        if self.cfg > 2:
            raise InvalidRequest(f"cfg degree {self.cfg}: CFG has at most two branches", field="plan.cfg",
                                 limit="1 or 2")

    # -- names --------------------------------------------------------------------------
    @classmethod
    def parse(cls, spec: str, pad: bool = True) -> "ParallelPlan":
        """``single`` or factors joined by ``x`` (``cfg2xulysses2``); each factor at most once."""
        text = (spec or "single").strip().lower()
        if text in ("single", "1"):
            return cls(pad=pad)
        degrees: dict[str, int] = {}
        for part in text.split("x"):
            m = _FACTOR.match(part)
            if not m:
                raise InvalidRequest(f"plan {spec!r}: bad factor {part!r}", field="plan",
                                     limit="single or cfgN / ringN / ulyssesN joined by 'x'")
            if m.group(1) in degrees:
                raise InvalidRequest(f"plan {spec!r} names {m.group(1)} twice", field="plan")
            degrees[m.group(1)] = int(m.group(2))
        return cls(pad=pad, **degrees)

    @property
    def spec(self) -> str:
        parts = [f"{n}{getattr(self, n)}" for n in ("cfg", "ulysses", "ring") if getattr(self, n) > 1]
        return "x".join(parts) or "single"

    @property
    def kind(self) -> str:
        sp = {(False, False): "", (True, False): "sp_ulysses", (False, True): "sp_ring",
              (True, True): "hybrid"}[(self.ulysses > 1, self.ring > 1)]
        kinds = (["cfg_parallel"] if self.cfg > 1 else []) + ([sp] if sp else [])
        return "+".join(kinds) or "single"

    @property
    def world(self) -> int:
        return self.cfg * self.ring * self.ulysses

    @property
    def sp(self) -> int:
        """Sequence-parallel degree (ring x Ulysses)."""
        return self.ring * self.ulysses

    def to_dict(self) -> dict:
        return {"spec": self.spec, "kind": self.kind, "cfg": self.cfg, "ring": self.ring, "ulysses": self.ulysses,
                "world": self.world, "pad": self.pad}

    # -- coordinates --------------------------------------------------------------------
    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(c, r, u)`` of a global rank."""
        inner = self.ring * self.ulysses
        return rank // inner, (rank % inner) // self.ulysses, rank % self.ulysses

    def rank_of(self, c: int, r: int, u: int) -> int:
        return c * self.ring * self.ulysses + r * self.ulysses + u

    def groups(self) -> dict[str, list[list[int]]]:
        """Every group of each axis, as global rank lists (the order new_group must be called in)."""
        C, R, U = self.cfg, self.ring, self.ulysses
        return {
            "ulysses": [[self.rank_of(c, r, u) for u in range(U)] for c in range(C) for r in range(R)],
            "ring": [[self.rank_of(c, r, u) for r in range(R)] for c in range(C) for u in range(U)],
            "sp": [[self.rank_of(c, r, u) for r in range(R) for u in range(U)] for c in range(C)],
            "cfg": [[self.rank_of(c, r, u) for c in range(C)] for r in range(R) for u in range(U)],
        }

    # -- shapes -------------------------------------------------------------------------
    def padded_heads(self, heads: int) -> int:
        """Heads after padding to the Ulysses degree (refused with ``pad=False``)."""
        return self._padded(heads, self.ulysses, "attention heads", "Ulysses degree", "num_attention_heads")

    def padded_tokens(self, tokens: int) -> int:
        """Sequence length after padding to the sequence degree (refused with ``pad=False``)."""
        if tokens < 1:
            raise InvalidRequest("empty token sequence", field="tokens", limit="at least 1")
        return self._padded(tokens, self.sp, "tokens", "sequence-parallel degree", "tokens")

    def _padded(self, n: int, degree: int, what: str, axis: str, field: str) -> int:
        """``n`` rounded up to a multiple of ``degree``; with ``pad=False`` one that does not
        divide is refused, naming ``field``."""
        if n % degree:
            if not self.pad:
                raise InvalidRequest(f"{n} {what} do not divide by the {axis} {degree}",
                                     field=field, limit=f"a multiple of {degree}")
            return -(-n // degree) * degree
        return n

    def link_ratio(self, device) -> float:
        """What one byte between this plan's ranks costs, in device-memory bytes, on ``device``
        (a cost model's DeviceProfile): the pricer asks the plan, so it needs no parallel import."""
        from fastvideo3.parallel.cost import link_ratio
        return link_ratio(device)

    def price(self, work, weight_bytes: float, config, shape, act_bytes: int, ratio: float):
        """``work`` (one step on one device) as this plan runs it (fastvideo3.parallel.cost)."""
        from fastvideo3.parallel.cost import parallel_work
        return parallel_work(work, weight_bytes, config, shape, self, act_bytes, ratio)

    def check_world(self, world: int) -> None:
        if world != self.world:
            raise InvalidRequest(f"plan {self.spec} needs {self.world} ranks, {world} started", field="nproc",
                                 limit=str(self.world))


SINGLE = ParallelPlan()
