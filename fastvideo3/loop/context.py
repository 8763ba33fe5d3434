"""The request context: what a request's loops hand to each other, and the options they read.

Every loop's ``init(request, card, ctx)`` sees the run's one :class:`RequestContext`. The
scheduler folds each finished loop into it (:meth:`RequestContext.add_loop_result`): the loop's
output refs by name (``prompt_embeds``, ``negative_embeds``, ``latents``, ``frames``) and its
payload by loop id. The options are set when the request is submitted (output format, fps,
reward scorers, client metadata, detached, the batch-invariant bucket).

Inside a process the refs are :class:`~fastvideo3.transport.ref.TensorRef` objects; the dict form
(:meth:`RequestContext.to_dict` / :meth:`RequestContext.from_dict`) exists only for request
checkpoints and the state store's request records. It is JSON-safe by construction, except for
extension values, which are kept only while they survive a JSON round trip.

An extension that needs its own per-request value stores it under ``extensions[<its name>]``
(a JSON-safe value: it is checkpointed and comes back on resume); it adds no field here.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from fastvideo3.errors import Internal, InvalidRequest
from fastvideo3.transport.ref import TensorRef

#: the option fields, in the order they are written; every other key of the legacy (flat) form
#: of a checkpointed context is a ref
OPTIONS = ("encode", "fps", "rewards", "metadata", "detached", "batch_bucket")
#: keys of the flat form that were never checkpointed (bytes, rebuilt on resume)
_VOLATILE = ("artifacts",)


@dataclass
class RequestContext:
    """A run's context. ``refs``: every finished loop's output refs, by output name;
    ``payloads``: every finished loop's payload, by loop id; the rest are submit-time options."""

    refs: dict[str, TensorRef] = field(default_factory=dict)
    payloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: output format the decoder pool encodes inline (fastvideo3.vocab.OutputFormat), None = frames only
    encode: str | None = None
    fps: int | None = None
    #: reward scorers the reward_score loop runs
    rewards: list[str] = field(default_factory=list)
    #: the client's metadata, copied into the artifact's sidecar
    metadata: dict[str, str] = field(default_factory=dict)
    #: the request keeps running when its client goes away (services/scheduler/fleet_runtime.py)
    detached: bool = False
    #: batch-invariant mode: units per denoise forward, pinned into the denoise state (None = off)
    batch_bucket: int | None = None
    #: per-request values of extensions, by extension name (JSON-safe)
    extensions: dict[str, Any] = field(default_factory=dict)

    # -- refs the loops read ----------------------------------------------------------------
    @property
    def latents(self) -> TensorRef | None:
        return self.refs.get("latents")

    @property
    def frames(self) -> TensorRef | None:
        return self.refs.get("frames")

    def ref(self, name: str) -> TensorRef:
        """The ref ``name``; a loop that starts before its input exists fails naming it."""
        try:
            return self.refs[name]
        except KeyError:
            raise InvalidRequest(f"the request context holds no {name!r} yet", field=f"ctx.refs.{name}",
                                 limit=", ".join(sorted(self.refs)) or "none") from None

    def add_loop_result(self, loop_id: str, result) -> None:
        """Fold a finished loop's LoopResult in: its output refs by name, its payload by loop id."""
        for name, ref in result.outputs.items():
            if not isinstance(ref, TensorRef):
                raise Internal(f"loop {loop_id} output {name!r} is a {type(ref).__name__}, not a TensorRef",
                               field=f"outputs.{name}")
            self.refs[name] = ref
        self.payloads[loop_id] = result.payload

    def merge_options(self, other: "RequestContext") -> None:
        """Take ``other``'s submit-time options (a request sent again under its id); keep the refs
        and payloads. ``batch_bucket`` is kept when ``other`` sets none."""
        self.encode, self.fps, self.rewards = other.encode, other.fps, list(other.rewards)
        self.metadata, self.detached = dict(other.metadata), other.detached
        if other.batch_bucket is not None:
            self.batch_bucket = other.batch_bucket
        self.extensions.update(other.extensions)

    # -- the checkpoint form ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe form written into request checkpoints and store records."""
        out: dict[str, Any] = {"refs": {n: r.to_dict() for n, r in self.refs.items()},
                               "payloads": {k: v for k, v in ((k, _json_safe(v, _DROP)) for k, v in self.payloads.items())
                                            if v is not _DROP}}
        for name in OPTIONS:
            out[name] = getattr(self, name)
        out["rewards"], out["metadata"] = list(self.rewards), dict(self.metadata)
        out["extensions"] = {k: v for k, v in ((k, _json_safe(v, _DROP)) for k, v in self.extensions.items())
                             if v is not _DROP}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "RequestContext":
        """Read :meth:`to_dict`'s form, or the flat form earlier checkpoints hold (option keys,
        ``payloads`` and every loop output ref at the top level). Raises ``InvalidRequest``
        naming the key that does not fit."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise InvalidRequest(f"a request context must be a mapping, got {type(data).__name__}", field="ctx")
        known = {f.name for f in fields(cls)}
        flat = "refs" not in data
        refs_in = {k: v for k, v in data.items() if k not in known and k not in _VOLATILE} if flat \
            else data.get("refs") or {}
        if not flat:
            extra = sorted(set(data) - known)
            if extra:
                raise InvalidRequest(f"unknown request context key {extra[0]!r}", field=f"ctx.{extra[0]}",
                                     limit=", ".join(sorted(known)))
        if not isinstance(refs_in, Mapping):
            raise InvalidRequest("ctx.refs must be a mapping of name -> TensorRef", field="ctx.refs")
        refs = {}
        for name, value in refs_in.items():
            try:
                refs[name] = value if isinstance(value, TensorRef) else TensorRef.from_dict(value)
            except InvalidRequest as e:
                raise InvalidRequest(f"ctx ref {name!r}: {e.message}", field=f"ctx.refs.{name}.{e.field or 'ref'}",
                                     limit=e.limit) from None
        ctx = cls(refs=refs, payloads={str(k): dict(v) for k, v in _mapping(data, "payloads").items()},
                  extensions=dict(_mapping(data, "extensions")))
        for name in OPTIONS:
            if data.get(name) is not None:
                setattr(ctx, name, data[name])
        ctx.rewards, ctx.metadata = list(ctx.rewards), dict(ctx.metadata)
        ctx.detached = bool(ctx.detached)
        ctx.validate()
        return ctx

    @classmethod
    def of(cls, value: "RequestContext | Mapping[str, Any] | None") -> "RequestContext":
        """A run's own context: a copy of ``value``, or one read from a mapping of its keys (see
        :meth:`from_dict`)."""
        return value.copy() if isinstance(value, RequestContext) else cls.from_dict(value)

    def copy(self) -> "RequestContext":
        """A copy whose maps and lists are its own (refs are immutable and shared)."""
        return dataclasses.replace(self, refs=dict(self.refs), payloads={k: dict(v) for k, v in self.payloads.items()},
                                   rewards=list(self.rewards), metadata=dict(self.metadata),
                                   extensions=dict(self.extensions))

    def validate(self) -> "RequestContext":
        """Check the option types; raise ``InvalidRequest`` naming the first bad one."""
        checks = (("encode", self.encode is None or isinstance(self.encode, str), "a format name or null"),
                  ("fps", self.fps is None or (isinstance(self.fps, int) and not isinstance(self.fps, bool)
                                               and self.fps > 0), "a positive int or null"),
                  ("rewards", all(isinstance(s, str) for s in self.rewards), "a list of scorer names"),
                  ("metadata", all(isinstance(k, str) and isinstance(v, str) for k, v in self.metadata.items()),
                   "a str -> str map"),
                  ("batch_bucket", self.batch_bucket is None or (isinstance(self.batch_bucket, int)
                                                                 and not isinstance(self.batch_bucket, bool)
                                                                 and self.batch_bucket >= 1), ">= 1 or null"))
        for name, ok, limit in checks:
            if not ok:
                raise InvalidRequest(f"bad request context value {getattr(self, name)!r}", field=f"ctx.{name}",
                                     limit=limit)
        return self


_DROP = object()


def _json_safe(value: Any, default: Any) -> Any:
    """``value`` as it comes back from JSON, or ``default`` when it does not serialize."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return default


def _mapping(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"ctx.{key} must be a mapping, got {type(value).__name__}", field=f"ctx.{key}")
    return value
