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
from fastvideo3.errors import InvalidRequest, NotFound
from fastvideo3.vocab import LoopId, Sampler, Task

MAX_SEED = 2**63 - 1
MAX_ADAPTERS = 4
MAX_ADAPTER_SCALE = 8.0
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
    #: the low-noise expert's guidance (two-expert cards only); unset: ``guidance_scale``
    guidance_scale_2: float | None = None
    seed: int | None = None
    flow_shift: float | None = None
    sampler: str | None = None
    cfg_policy: str | None = None
    request_id: str | None = None
    slo_class: str = "interactive"
    deadline_s: float | None = None
    #: LoRA adapters to apply, in order: ``[{"id": "style-a", "scale": 0.7}, ...]``
    adapters: list | None = None
    #: an interceptor by name with its parameters ({"policy": "dbcache", "threshold": 0.1});
    #: None = the card's default, {"policy": "none"} = none (see fastvideo3.extend.settings)
    cache: dict | None = None
    #: image-to-video cards: the first frame, as bytes, base64 text or an http(s) URL (fetched
    #: only where the deployment allows it); see fastvideo3.request.image
    image: bytes | str | None = None


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
    #: ``({"id", "version", "scale"}, ...)``: each adapter pinned to the version loaded at admission
    adapters: tuple = ()
    #: the low-noise expert's guidance on a two-expert card; None on a one-DiT card
    guidance_scale_2: float | None = None
    cache: dict | None = None  # full interceptor settings, or None
    #: image-to-video: the validated image's bytes (base64) and digest; None on text-to-video
    image: str | None = None
    image_digest: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ResolvedRequest":
        d = dict(d)
        d["adapters"] = tuple(dict(a) for a in d.get("adapters", ()))
        return cls(**d)

    @property
    def adapter_versions(self) -> tuple[str, ...]:
        """``id@version*scale`` per adapter, in order (cache keys, provenance, identity)."""
        return tuple(f"{a['id']}@{a['version']}*{a['scale']:g}" for a in self.adapters)


def resolve_adapters(value, loaded: dict[str, str] | None) -> tuple:
    """Check the requested adapters and pin each to its loaded version (``loaded``: id -> version).
    An adapter that is not loaded is NOT_FOUND, naming it, before anything runs."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or len(value) > MAX_ADAPTERS:
        raise InvalidRequest("must be a list of {id, scale}", field="adapters", limit=f"<= {MAX_ADAPTERS} adapters")
    out, seen = [], set()
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) - {"id", "scale"} or "id" not in item:
            raise InvalidRequest("must be {id, scale}", field=f"adapters[{i}]")
        aid = item["id"]
        if not isinstance(aid, str) or not 1 <= len(aid) <= 128 or not set(aid) <= ID_CHARS:
            raise InvalidRequest("must be 1-128 characters of [A-Za-z0-9-_.:]", field=f"adapters[{i}].id",
                                 limit="1..128 chars")
        if aid in seen:
            raise InvalidRequest(f"adapter {aid!r} named twice", field=f"adapters[{i}].id")
        seen.add(aid)
        scale = _float(f"adapters[{i}].scale", item.get("scale", 1.0), -MAX_ADAPTER_SCALE, MAX_ADAPTER_SCALE)
        version = (loaded or {}).get(aid)
        if version is None:
            raise NotFound(f"adapter {aid!r} is not loaded", field=f"adapters[{i}].id", details={"adapter": aid})
        out.append({"id": aid, "version": version, "scale": scale})
    return tuple(out)


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


def takes_image(card: ModelCard) -> bool:
    """Whether the card generates from an image (image-to-video)."""
    return Task.IMAGE_TO_VIDEO in card.capabilities.tasks


def resolve(req: GenerateRequest, card: ModelCard, *, precision: str = "fp32",
            adapters: dict[str, str] | None = None, image_policy=None) -> ResolvedRequest:
    """``adapters``: the adapters loaded now (id -> version) that the request may name;
    ``image_policy``: the bounds on an image-to-video request's image (fastvideo3.request.image)."""
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
    guidance_2 = _guidance_2(req, card, guidance)
    seed = _int("seed", 0 if req.seed is None else req.seed, 0, MAX_SEED)
    sampler_spec = den.sampler
    sampler = req.sampler or (sampler_spec.name if sampler_spec else Sampler.UNIPC)
    if sampler not in (Sampler.UNIPC, Sampler.EULER):
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
    card.check_recipe(loop=LoopId.DIFFUSION_DENOISE, steps=steps, sampler=sampler, precision=precision)
    lora = resolve_adapters(req.adapters, adapters)
    from fastvideo3.extend.settings import resolve_cache
    cache = resolve_cache(req.cache, card, steps)
    image = _image(req, card, sizes["height"], sizes["width"], image_policy)
    return ResolvedRequest(
        request_id=rid, model_id=card.model_id, prompt=req.prompt, negative_prompt=neg, num_frames=frames,
        height=sizes["height"], width=sizes["width"], num_inference_steps=steps, guidance_scale=guidance,
        seed=seed, flow_shift=shift, sampler=sampler, cfg_policy=cfg, precision=precision,
        slo_class=req.slo_class, deadline_s=deadline, adapters=lora, guidance_scale_2=guidance_2, cache=cache,
        image=image.data_b64 if image else None, image_digest=image.digest if image else None,
    )


def _image(req: GenerateRequest, card: ModelCard, height: int, width: int, policy):
    """An image-to-video card needs the image; a text-to-video card refuses one."""
    if not takes_image(card):
        if req.image is not None and req.image != b"" and req.image != "":
            raise InvalidRequest(f"card {card.model_id} is text-to-video; an image applies to image-to-video cards",
                                 field="image", limit="unset")
        return None
    if req.image is None or (isinstance(req.image, (str, bytes)) and len(req.image) == 0):
        raise InvalidRequest(f"card {card.model_id} is image-to-video: the request needs an image", field="image",
                             limit="PNG, JPEG or WebP bytes, base64, or a URL")
    from fastvideo3.request.image import DEFAULT_POLICY, validate_image
    return validate_image(req.image, height, width, policy or DEFAULT_POLICY)


def _guidance_2(req: GenerateRequest, card: ModelCard, guidance: float) -> float | None:
    """diffusers' semantics: the low-noise expert's scale defaults to ``guidance_scale``; a card's
    own default applies only when the request names neither. Refused on a one-DiT card."""
    experts = card.denoise.experts
    if experts is None:
        if req.guidance_scale_2 is not None:
            raise InvalidRequest(f"card {card.model_id} has one denoising expert; guidance_scale_2 applies to "
                                 "two-expert cards only", field="guidance_scale_2", limit="unset")
        return None
    if req.guidance_scale_2 is not None:
        return _float("guidance_scale_2", req.guidance_scale_2, 0.0, card.limits.max_guidance)
    if req.guidance_scale is None and experts.default_guidance_2 is not None:
        return float(experts.default_guidance_2)
    return guidance
