"""The user-facing request and its validation against a card.

:class:`GenerateRequest` carries diffusers' parameter names. :func:`resolve` fills card defaults
and checks every field against the card's limits and recipe before anything is allocated; each
refusal names the field and the allowed range.
"""
from __future__ import annotations

import math
import uuid
from dataclasses import asdict, dataclass

from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import InvalidRequest

MAX_SEED = 2**63 - 1
ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


@dataclass
class GenerateRequest:
    prompt: str
    negative_prompt: str | None = None
    num_frames: int | None = None
    height: int | None = None
    width: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    flow_shift: float | None = None
    sampler: str | None = None
    cfg_policy: str | None = None
    request_id: str | None = None
    slo_class: str = "interactive"
    deadline_s: float | None = None
    #: an interceptor by name with its parameters ({"policy": "dbcache", "threshold": 0.1});
    #: None = the card's default, {"policy": "none"} = none (see fastvideo3.extend.settings)
    cache: dict | None = None


@dataclass(frozen=True)
class ResolvedRequest:
    """A request with every default filled and every field checked. JSON-safe."""

    request_id: str
    model_id: str
    prompt: str
    negative_prompt: str
    num_frames: int
    height: int
    width: int
    num_inference_steps: int
    guidance_scale: float
    seed: int
    flow_shift: float
    sampler: str
    cfg_policy: str
    precision: str
    slo_class: str
    deadline_s: float
    cache: dict | None = None  # full interceptor settings, or None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ResolvedRequest":
        return cls(**d)


def _int(name: str, v, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise InvalidRequest(f"must be an integer, got {v!r}", field=name, limit=f"[{lo}, {hi}]")
    v = int(v)
    if not lo <= v <= hi:
        raise InvalidRequest(f"{v} is out of range", field=name, limit=f"[{lo}, {hi}]")
    return v


def _float(name: str, v, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise InvalidRequest(f"must be a finite number, got {v!r}", field=name, limit=f"[{lo}, {hi}]")
    if not lo <= float(v) <= hi:
        raise InvalidRequest(f"{v} is out of range", field=name, limit=f"[{lo}, {hi}]")
    return float(v)


def resolve(req: GenerateRequest, card: ModelCard, *, precision: str = "fp32") -> ResolvedRequest:
    lim = card.limits
    den = card.denoise
    if not isinstance(req.prompt, str) or not req.prompt.strip():
        raise InvalidRequest("must be a non-empty string", field="prompt", limit=f"1..{lim.max_prompt_chars} characters")
    if len(req.prompt) > lim.max_prompt_chars:
        raise InvalidRequest(f"has {len(req.prompt)} characters", field="prompt", limit=f"1..{lim.max_prompt_chars} characters")
    neg = req.negative_prompt or ""
    if not isinstance(neg, str) or len(neg) > lim.max_prompt_chars:
        raise InvalidRequest("must be a string", field="negative_prompt", limit=f"0..{lim.max_prompt_chars} characters")
    frames = _int("num_frames", lim.default_frames if req.num_frames is None else req.num_frames, lim.min_frames, lim.max_frames)
    if (frames - 1) % 4:
        raise InvalidRequest(f"{frames} is not of the form 4k+1", field="num_frames",
                             limit=f"4k+1 in [{lim.min_frames}, {lim.max_frames}]")
    sizes = {}
    for name, default, hi in (("height", lim.default_height, lim.max_height), ("width", lim.default_width, lim.max_width)):
        v = _int(name, default if getattr(req, name) is None else getattr(req, name), lim.min_size, hi)
        if v % lim.size_multiple:
            raise InvalidRequest(f"{v} is not a multiple of {lim.size_multiple}", field=name,
                                 limit=f"multiple of {lim.size_multiple} in [{lim.min_size}, {hi}]")
        sizes[name] = v
    default_steps = card.recipe.assumes_steps or den.default_steps or 50
    steps = _int("num_inference_steps", default_steps if req.num_inference_steps is None else req.num_inference_steps,
                 den.min_steps, den.max_steps)
    guidance = _float("guidance_scale", lim.default_guidance if req.guidance_scale is None else req.guidance_scale,
                      0.0, lim.max_guidance)
    seed = _int("seed", 0 if req.seed is None else req.seed, 0, MAX_SEED)
    sampler_spec = den.sampler
    sampler = req.sampler or (sampler_spec.name if sampler_spec else "unipc")
    if sampler not in ("unipc", "euler"):
        raise InvalidRequest(f"unknown sampler {sampler!r}", field="sampler", limit="unipc, euler")
    shift = _float("flow_shift", (sampler_spec.flow_shift if sampler_spec else 3.0) if req.flow_shift is None else req.flow_shift,
                   0.01, 100.0)
    cfg = req.cfg_policy or den.default_cfg_policy
    if cfg not in den.cfg_policies:
        raise InvalidRequest(f"unknown CFG policy {cfg!r}", field="cfg_policy", limit=", ".join(den.cfg_policies))
    if guidance <= 1.0:
        cfg = "none"  # the reference applies CFG only when guidance > 1
    if req.slo_class not in ("interactive", "batch"):
        raise InvalidRequest(f"unknown SLO class {req.slo_class!r}", field="slo_class", limit="interactive, batch")
    deadline = _float("deadline_s", 3600.0 if req.deadline_s is None else req.deadline_s, 0.1, 86400.0)
    rid = req.request_id or uuid.uuid4().hex
    if not isinstance(rid, str) or not 1 <= len(rid) <= 128 or not set(rid) <= ID_CHARS:
        raise InvalidRequest("must be 1-128 characters of [A-Za-z0-9-_.:]", field="request_id", limit="1..128 chars")
    card.check_recipe(loop="diffusion_denoise", steps=steps, sampler=sampler, precision=precision)
    from fastvideo3.extend.settings import resolve_cache
    cache = resolve_cache(req.cache, card, steps)
    return ResolvedRequest(
        request_id=rid, model_id=card.model_id, prompt=req.prompt, negative_prompt=neg, num_frames=frames,
        height=sizes["height"], width=sizes["width"], num_inference_steps=steps, guidance_scale=guidance,
        seed=seed, flow_shift=shift, sampler=sampler, cfg_policy=cfg, precision=precision,
        slo_class=req.slo_class, deadline_s=deadline, cache=cache,
    )
