"""Typed parameters of a WorkUnit, one class per unit kind, written by the loops.

Inside a process a unit's ``params`` is one of these objects; on the wire it is the JSON object
:meth:`StepParams.to_dict` returns (services/common/convert.py converts both ways, so the bytes are
what they were). Each class also reads like that dict (``p["step"]``, ``p.get("expert")``,
``"cache" in p``), so an executor may use either form; fields that default to None are left out
of the dict while unset, exactly as the loops always left those keys out.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastvideo3.vocab import UnitKind


class StepParams(Mapping):
    """Base of the typed params: a frozen field set that reads as its wire dict."""

    @classmethod
    @functools.cache
    def optional_fields(cls) -> frozenset[str]:
        """The fields left out of the dict while they are None: those that default to None."""
        return frozenset(f.name for f in dataclasses.fields(cls) if f.default is None)

    def to_dict(self) -> dict[str, Any]:
        out = {}
        optional = self.optional_fields()
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None and f.name in optional:
                continue
            out[f.name] = v
        return out

    def copy(self) -> "StepParams":
        return dataclasses.replace(self)

    def __getitem__(self, key: str) -> Any:
        if key in self.__dataclass_fields__:
            v = getattr(self, key)
            if v is not None or key not in self.optional_fields():
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


@dataclass(eq=False)
class DiffusionStepParams(StepParams):
    """One denoise step (loop/denoise.py): the timestep and schedule, guidance and CFG policy, the
    sampler, the seed and latent shape the pool's resident latent starts from."""

    step: int
    timestep: float
    sigmas: list[float]
    guidance: float | None
    cfg_policy: str
    sampler: str
    solver_order: int
    seed: int
    latent_shape: list[int]
    final: bool
    adapters: list[dict] | None = None
    #: interceptor settings and state (fastvideo3.extend), with the step count they plan over
    cache: dict | None = None
    plugin_state: dict | None = None
    num_steps: int | None = None
    #: two-expert cards: the DiT that runs this step, whether the next step runs the other one,
    #: and what the handed-over state holds
    expert: str | None = None
    handoff: bool | None = None
    handoff_meta: dict | None = None
    #: batch-invariant mode: every forward holding this unit runs at this many units' rows
    batch_bucket: int | None = None


@dataclass(eq=False)
class EncoderChunkParams(StepParams):
    """Prompts to encode, by name (``prompt``, ``negative``), and the adapter versions in force;
    on an image-to-video card also the request's image (base64 of its bytes) and its digest,
    whose CLIP hidden states the pool returns as ``image_embeds``."""

    prompts: dict[str, str] = field(default_factory=dict)
    adapter_versions: list | None = None
    image: str | None = None
    image_digest: str | None = None


@dataclass(eq=False)
class VaeEncodeParams(StepParams):
    """The decoder pool's ``vae_encode``: an image-to-video request's image (base64 of its bytes)
    resized to ``height`` x ``width`` and encoded as the first of ``num_frames`` frames; the pool
    returns the conditioning latent as ``image_latents``."""

    image: str
    image_digest: str
    height: int
    width: int
    num_frames: int


@dataclass(eq=False)
class VaeTileParams(StepParams):
    """A decode; with ``encode`` set the pool also returns the encoded file (at ``fps``)."""

    encode: str | None = None
    fps: float | None = None
    frames_dtype: str | None = None


@dataclass(eq=False)
class RewardBatchParams(StepParams):
    """The scorers to run on the decoded frames."""

    scorers: list[str] = field(default_factory=list)


PARAMS_BY_KIND: dict[str, type[StepParams]] = {
    UnitKind.DIFFUSION_STEP: DiffusionStepParams, UnitKind.ENCODER_CHUNK: EncoderChunkParams,
    UnitKind.VAE_TILE: VaeTileParams, UnitKind.REWARD_BATCH: RewardBatchParams, UnitKind.VAE_ENCODE: VaeEncodeParams,
}


def params_to_dict(params: Mapping[str, Any]) -> dict[str, Any]:
    """The wire form of a unit's params (typed or already a dict)."""
    return params.to_dict() if isinstance(params, StepParams) else dict(params)


def params_from_dict(kind: str, d: dict[str, Any]) -> Mapping[str, Any]:
    """The typed params of ``kind`` from their wire form; a dict the kind's class does not describe
    (another kind, or keys it lacks) stays a dict."""
    cls = PARAMS_BY_KIND.get(kind)
    if cls is None:
        return d
    try:
        typed = cls(**d)
    except TypeError:
        return d
    return typed if typed.to_dict() == d else d


__all__ = ["DiffusionStepParams", "EncoderChunkParams", "PARAMS_BY_KIND", "RewardBatchParams", "StepParams",
           "VaeEncodeParams", "VaeTileParams", "params_from_dict", "params_to_dict"]
