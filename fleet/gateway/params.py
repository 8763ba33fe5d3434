"""The body of ``POST /v1/videos`` -> what to ask the fleet for.

The official SDK sends multipart form data (every value a string; ``extra_body`` nested objects
flattened to ``fastvideo3[steps]``), other clients send JSON; both arrive here as one mapping.
OpenAI's fields: ``model`` (a card name), ``prompt``, ``seconds`` (a string such as ``"2"``, or a
number), ``size`` (``"WxH"``), ``input_reference`` (image-to-video cards: the first frame, an uploaded
file, base64 or a data URL, or an http(s) URL the scheduler fetches when it allows URLs; refused
by a text-to-video card). Our own parameters travel in the ``fastvideo3`` extension object:

    {"steps": 4, "guidance": 2.0, "seed": 7, "negative_prompt": "...", "sampler": "euler",
     "frames": 17, "flow_shift": 3.0, "cfg_policy": "none"}

``frames`` overrides ``seconds``; otherwise frames = the 4k+1 count closest below
``seconds * fps + 1`` at the card's fps. This module checks forms and types (the error names
the parameter); the scheduler checks every value against the card and answers with its limit.
"""
from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from fleet.gateway.errors import ApiError

EXTENSION = "fastvideo3"
TOP_LEVEL = ("model", "prompt", "seconds", "size", "input_reference", EXTENSION)
#: extension key -> (fleet parameter, type)
EXTENSION_FIELDS: dict[str, tuple[str, type]] = {
    "steps": ("num_inference_steps", int), "guidance": ("guidance_scale", float), "seed": ("seed", int),
    "negative_prompt": ("negative_prompt", str), "sampler": ("sampler", str), "frames": ("num_frames", int),
    "flow_shift": ("flow_shift", float), "cfg_policy": ("cfg_policy", str),
    "guidance_2": ("guidance_scale_2", float),  # two-expert cards: the low-noise expert's guidance
}
MAX_SECONDS = 3600.0
SEED_MAX = 2**63 - 1
_SIZE = re.compile(r"^\s*(\d{1,5})\s*[xX]\s*(\d{1,5})\s*$")
_I32 = 2**31 - 1


@dataclass(frozen=True)
class ModelInfo:
    """What the gateway needs of a served card: its limits and defaults (from Describe)."""

    id: str
    fps: int = 16
    default_frames: int = 33
    default_width: int = 128
    default_height: int = 128
    max_frames: int = 0
    frames_multiple: int = 4
    frames_offset: int = 1
    min_steps: int = 1
    max_steps: int = 0
    created: int = 0
    #: the card generates from an image (its capabilities list image_to_video)
    image_to_video: bool = False


@dataclass(frozen=True)
class VideoSpec:
    """One validated create request."""

    model: str
    prompt: str
    seconds: str
    size: str
    params: dict[str, Any] = field(default_factory=dict)  # FleetClient.request keyword arguments
    frames_given: bool = False

    def public(self) -> dict[str, Any]:
        """The record's request part (what GET shows and what a re-attach resends)."""
        return {"model": self.model, "prompt": self.prompt, "seconds": self.seconds, "size": self.size,
                "params": dict(self.params), "frames_given": self.frames_given}

    @classmethod
    def from_public(cls, d: dict[str, Any]) -> "VideoSpec":
        return cls(d["model"], d["prompt"], d["seconds"], d["size"], dict(d.get("params") or {}),
                   bool(d.get("frames_given")))


def nest_form(items: list[tuple[str, Any]]) -> dict[str, Any]:
    """Multipart fields -> a mapping; ``a[b]=v`` becomes ``{"a": {"b": v}}`` (the SDK's form of
    a nested ``extra_body`` object)."""
    out: dict[str, Any] = {}
    for key, value in items:
        head, sep, rest = key.partition("[")
        if sep and rest.endswith("]") and "[" not in rest:
            sub = out.setdefault(head, {})
            if not isinstance(sub, dict):
                raise ApiError(400, f"{head!r} is given both as a value and as an object", param=head)
            sub[rest[:-1]] = value
        else:
            if key in out:
                raise ApiError(400, f"{key!r} is given more than once", param=key)
            out[key] = value
    return out


def _coerce(param: str, value: Any, kind: type) -> Any:
    """A value of ``kind`` from JSON or form text; wrong types name ``param``."""
    if kind is str:
        if not isinstance(value, str):
            raise ApiError(400, f"must be a string, got {type(value).__name__}", param=param)
        return value
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        raise ApiError(400, f"must be {'an integer' if kind is int else 'a number'}, got {value!r}"[:200],
                       param=param)
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text) if kind is int else float(text)
        except ValueError:
            raise ApiError(400, f"must be {'an integer' if kind is int else 'a number'}, got {value[:40]!r}",
                           param=param) from None
    if kind is int:
        if isinstance(value, float):
            if not value.is_integer():
                raise ApiError(400, f"must be an integer, got {value!r}", param=param)
            value = int(value)
        limit = SEED_MAX if param.endswith(".seed") else _I32
        if not -_I32 <= value <= limit:
            raise ApiError(400, f"{value} is out of range", param=param)
        if param.endswith(".seed") and value < 0:
            raise ApiError(400, f"must be >= 0, got {value}", param=param)
        return int(value)
    value = float(value)
    if not math.isfinite(value):
        raise ApiError(400, f"must be a finite number, got {value!r}", param=param)
    return value


def frames_for_seconds(seconds: float, fps: int, multiple: int = 4, offset: int = 1) -> int:
    """Wan-style clip length: the ``multiple*k + offset`` frame count closest below ``seconds*fps+1``."""
    multiple = max(1, multiple)
    return multiple * int(math.floor(seconds * fps / multiple + 1e-9)) + offset


def parse_create(body: dict[str, Any], models: dict[str, ModelInfo], default_model: str) -> VideoSpec:
    """Validate a create body against the served models; raises ApiError naming the parameter."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object or multipart form", param=None)
    for key in body:
        if key not in TOP_LEVEL:
            raise ApiError(400, f"unknown parameter {key!r} (our own parameters go in the {EXTENSION!r} object: "
                                f"{', '.join(EXTENSION_FIELDS)})", param=str(key)[:64])
    if "prompt" not in body:
        raise ApiError(400, "is required", param="prompt")
    prompt = _coerce("prompt", body["prompt"], str)
    model = _coerce("model", body.get("model") or default_model, str)
    info = models.get(model)
    if info is None:
        raise ApiError(404, f"the model {model!r} does not exist (served: {', '.join(sorted(models))})",
                       param="model", type_="invalid_request_error", code="model_not_found")
    image = body.get("input_reference")
    if image not in (None, "", b"") and not info.image_to_video:
        raise ApiError(400, f"the card {model!r} has no image-to-video program", param="input_reference")
    if image not in (None, "", b"") and not isinstance(image, (bytes, str)):
        raise ApiError(400, "must be an uploaded file, base64 text or a URL", param="input_reference")

    size = body.get("size")
    if size in (None, ""):
        width, height = info.default_width, info.default_height
    else:
        m = _SIZE.match(_coerce("size", size, str))
        if not m:
            raise ApiError(400, f"{str(size)[:40]!r} is not WIDTHxHEIGHT (allowed: e.g. "
                                f"{info.default_width}x{info.default_height})", param="size")
        width, height = int(m.group(1)), int(m.group(2))

    ext = body.get(EXTENSION) or {}
    if not isinstance(ext, dict):
        raise ApiError(400, f"must be an object with keys {', '.join(EXTENSION_FIELDS)}", param=EXTENSION)
    params: dict[str, Any] = {"width": width, "height": height}
    for key, value in ext.items():
        if key not in EXTENSION_FIELDS:
            raise ApiError(400, f"unknown parameter (allowed: {', '.join(EXTENSION_FIELDS)})",
                           param=f"{EXTENSION}.{str(key)[:64]}")
        name, kind = EXTENSION_FIELDS[key]
        if value is None or value == "":
            continue
        params[name] = _coerce(f"{EXTENSION}.{key}", value, kind)

    frames_given = "num_frames" in params
    seconds_raw = body.get("seconds")
    if frames_given:
        seconds = f"{(params['num_frames'] - 1) / info.fps:g}" if seconds_raw in (None, "") else str(seconds_raw)
    elif seconds_raw in (None, ""):
        params["num_frames"] = info.default_frames
        seconds = f"{(info.default_frames - 1) / info.fps:g}"
    else:
        secs = _coerce("seconds", seconds_raw, float)
        max_s = (info.max_frames - info.frames_offset) / info.fps if info.max_frames else MAX_SECONDS
        if not 0 < secs <= max_s:
            raise ApiError(400, f"{secs:g} is out of range (allowed: (0, {max_s:g}] at {info.fps} fps)",
                           param="seconds")
        params["num_frames"] = max(info.frames_offset,
                                   frames_for_seconds(secs, info.fps, info.frames_multiple, info.frames_offset))
        seconds = str(seconds_raw).strip() if isinstance(seconds_raw, str) else f"{secs:g}"
    if image not in (None, "", b""):  # the record is JSON: an upload is kept as base64 text
        import base64
        params["image"] = base64.b64encode(image).decode("ascii") if isinstance(image, bytes) else image.strip()
    if "seed" not in params:  # drawn here, so a re-attach after a restart resends the same request
        params["seed"] = secrets.randbelow(2**31)
    return VideoSpec(model=model, prompt=prompt, seconds=seconds, size=f"{width}x{height}", params=params,
                     frames_given=frames_given)
