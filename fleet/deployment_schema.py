"""The DeploymentCard's pydantic form, generated from its wire form.

``protos/fastvideo3/v1/deployment.proto`` is the one definition of the card's fields: every
message there becomes a pydantic model here through :func:`model_of` (the same field names, in
the same order, with the matching Python types and proto3 defaults), so a field added to the
proto is a field of the model and of its JSON schema. What the wire cannot say is declared
here and nowhere else:

* validation: int32 sizes are non-negative, int64 byte counts and times too; names that may
  not be empty; the role, level and unit vocabularies; the card's consistency rules;
* defaults that are not the proto's zero (one replica, the health protocol, ...);
* two fields whose wire form differs (``MODEL_ONLY`` / ``WIRE_ONLY``): what SERVING means per
  health service (``HealthSchema.serving``) travels in the card's ``labels`` under the reserved
  prefix ``health.serving/``; the cost model (``CostModelSpec.model``, its ``to_dict()``)
  travels as UTF-8 JSON bytes in ``cost_model_json``.

:func:`to_wire` and :func:`from_wire` convert by walking the descriptor; only the two fields
above are converted by hand (in ``DeploymentCard.to_proto`` / ``from_proto``).
tests/unit/test_deployment_forms.py checks the two forms against each other field by field.
"""
from __future__ import annotations

import json
import time
from enum import Enum
from typing import Annotated, Any, Literal

from google.protobuf.descriptor import FieldDescriptor
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from fastvideo3 import __version__
from fastvideo3.errors import InvalidRequest
from fastvideo3.rpc import plain
from fastvideo3.runtime.economy.cost import COST_MODEL_VERSION, CalibratedCostModel
from fastvideo3.v1 import common_pb2, deployment_pb2 as pb
from fastvideo3.vocab import Role

SCHEMA_VERSION = "1"
HEALTH_LABEL_PREFIX = "health.serving/"

_I32 = 2**31 - 1
U32 = Annotated[int, Field(ge=0, le=_I32)]  # a non-negative int32 on the wire
U64 = Annotated[int, Field(ge=0)]
Level = Literal["supported", "partial", "unsupported"]
PoolRole = Literal[Role.ENCODER, Role.DENOISER, Role.DECODER, Role.REWARD]

#: (message, field) present in the pydantic form only, and in the wire form only
MODEL_ONLY = {("HealthSchema", "serving"), ("CostModelSpec", "model")}
WIRE_ONLY = {("CostModelSpec", "cost_model_json")}

_D = FieldDescriptor
_SCALARS: dict[int, tuple[Any, Any]] = {
    _D.TYPE_STRING: (str, ""), _D.TYPE_BOOL: (bool, False), _D.TYPE_DOUBLE: (float, 0.0),
    _D.TYPE_FLOAT: (float, 0.0), _D.TYPE_INT32: (U32, 0), _D.TYPE_INT64: (U64, 0), _D.TYPE_BYTES: (bytes, b""),
}
_MAP_VALUES = {_D.TYPE_STRING: str, _D.TYPE_INT32: int, _D.TYPE_INT64: int, _D.TYPE_DOUBLE: float, _D.TYPE_BOOL: bool}
#: message name -> its pydantic model (filled by model_of, read for nested fields and by the walkers)
MODELS: dict[str, type[BaseModel]] = {}


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def model_of(message, *, base: type[BaseModel] = _Part, overrides: dict[str, tuple[Any, Any]] | None = None,
             doc: str = "") -> type[BaseModel]:
    """The pydantic model of a proto message: one field per proto field (minus ``WIRE_ONLY``),
    typed from the descriptor; ``overrides`` (name -> (type, default or FieldInfo)) adds the
    validation the wire cannot express. Nested messages must be generated first."""
    desc = message.DESCRIPTOR
    overrides = dict(overrides or {})
    fields: dict[str, tuple[Any, Any]] = {}
    for f in desc.fields:
        if (desc.name, f.name) in WIRE_ONLY:
            continue
        fields[f.name] = overrides.pop(f.name) if f.name in overrides else _field(f)
    if overrides:
        raise TypeError(f"{desc.name}: overrides name no proto field: {sorted(overrides)}")
    model = create_model(desc.name, __base__=base, __doc__=doc or None, __module__=__name__, **fields)
    MODELS[desc.name] = model
    return model


def _field(f) -> tuple[Any, Any]:
    sub = f.message_type
    if sub is not None and sub.GetOptions().map_entry:
        value = sub.fields_by_name["value"]
        vt = MODELS[value.message_type.name] if value.message_type else _MAP_VALUES[value.type]
        return dict[str, vt], Field(default_factory=dict)
    if sub is not None:
        t = MODELS[sub.name]
        return (list[t], Field(default_factory=list)) if f.is_repeated else (t, Field(default_factory=t))
    t, default = _SCALARS[f.type]
    return (list[t], Field(default_factory=list)) if f.is_repeated else (t, default)


# -- the wire walk ---------------------------------------------------------------------------

def _plain(v: Any) -> Any:
    return v.value if isinstance(v, Enum) else v


def to_wire(model: BaseModel, msg) -> Any:
    """Fill ``msg`` from ``model`` field by field (``MODEL_ONLY`` fields are the caller's)."""
    for f in msg.DESCRIPTOR.fields:
        if (msg.DESCRIPTOR.name, f.name) in WIRE_ONLY:
            continue
        v, target, sub = getattr(model, f.name), getattr(msg, f.name), f.message_type
        if sub is not None and sub.GetOptions().map_entry:
            if sub.fields_by_name["value"].message_type:
                for k, x in v.items():
                    to_wire(x, target[k])
            else:
                target.update({k: _plain(x) for k, x in v.items()})
        elif f.is_repeated:
            if sub is not None:
                for x in v:
                    to_wire(x, target.add())
            else:
                target.extend(_plain(x) for x in v)
        elif sub is not None:
            if v is not None:
                target.SetInParent()
                to_wire(v, target)
        else:
            setattr(msg, f.name, _plain(v))
    return msg


def from_wire(msg) -> dict[str, Any]:
    """Plain data of ``msg`` for its model, field by field (an absent message field is left out,
    so the model's default applies)."""
    return plain(msg, frozenset(WIRE_ONLY))


# -- the models, leaves first ------------------------------------------------------------------

RequestLimits = model_of(pb.RequestLimits, doc="Allowed ranges of request fields; 0 / empty = no limit declared.")
RequestDefaults = model_of(pb.RequestDefaults, doc="Values used for request fields left absent.")
ModelCardSummary = model_of(pb.ModelCardSummary, doc="One served model card, as a client needs to see it.",
                            overrides={"card_id": (str, Field(min_length=1)), "family": (str, ...)})
CapabilityCell = model_of(pb.CapabilityCell, overrides={"card_id": (str, ...), "capability": (str, ...),
                                                         "level": (Level, "supported")})
DeviceNeeds = model_of(pb.DeviceNeeds)
RolePoolSpec = model_of(pb.RolePoolSpec, overrides={"role": (PoolRole, ...), "replicas": (U32, 1)})
ProgramSpec = model_of(pb.ProgramSpec, overrides={"name": (str, Field(min_length=1)), "loops": (list[str], ...)})
ParallelPlan = model_of(pb.ParallelPlan, overrides={"name": (str, Field(min_length=1))})


class _CostModel(_Part):
    """The scheduler's cost model, unchanged: ``model`` is ``CalibratedCostModel.to_dict()``."""

    model: dict[str, Any]

    @classmethod
    def of(cls, model: CalibratedCostModel, *, calibrated_unix_ms: int | None = None):
        return cls(model=model.to_dict(), calibrated_unix_ms=int(time.time() * 1000)
                   if calibrated_unix_ms is None else calibrated_unix_ms)

    def load(self) -> CalibratedCostModel:
        """Rebuild the cost model (its learned calibration included)."""
        return CalibratedCostModel.from_dict(self.model)


CostModelSpec = model_of(pb.CostModelSpec, base=_CostModel, doc=_CostModel.__doc__,
                         overrides={"version": (str, str(COST_MODEL_VERSION)),
                                    "unit": (Literal["gpu_seconds"], "gpu_seconds")})


class _Health(_Part):
    #: service name -> what SERVING means for it
    serving: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_services(self):
        unknown = sorted(set(self.serving) - set(self.services))
        if unknown:
            raise ValueError(f"health.serving names services not in health.services: {unknown}")
        return self


HealthSchema = model_of(pb.HealthSchema, base=_Health, overrides={
    "protocol": (str, "grpc.health.v1"), "check_interval_s": (float, Field(10.0, ge=0)),
    "unhealthy_after_s": (float, Field(30.0, ge=0))})
SloClass = model_of(pb.SloClass, overrides={
    "name": (str, Field(min_length=1)), "priority": (int, Field(0, ge=-_I32, le=_I32)),  # higher admits first
    **{k: (float, Field(0.0, ge=0)) for k in ("target_queue_s", "target_latency_p50_s", "target_latency_p95_s",
                                              "gpu_seconds_budget")}})  # budget per request; 0 = unbounded
TransferEndpoint = model_of(common_pb2.TransferEndpoint, overrides={"backend": (str, Field(min_length=1))})
RoleEndpoints = model_of(pb.RoleEndpoints, overrides={"role": (str, ...)})


class _Card(_Part):
    @model_validator(mode="after")
    def _consistent(self):
        ids = [m.card_id for m in self.models]
        _unique(ids, "models.card_id")
        _unique([p.role for p in self.role_pools], "role_pools.role")
        _unique([s.name for s in self.slo_classes], "slo_classes.name")
        _unique([p.name for p in self.programs], "programs.name")
        known = set(ids)
        if self.default_model and self.default_model not in known:
            raise ValueError(f"default_model {self.default_model!r} is not one of the served models {ids}")
        refs = [("role_pools", c) for p in self.role_pools for c in p.card_ids]
        refs += [("programs", c) for p in self.programs for c in p.card_ids]
        refs += [("capability_matrix", c.card_id) for c in self.capability_matrix]
        for where, card_id in refs:
            if card_id not in known:
                raise ValueError(f"{where} names card {card_id!r}, which is not one of the served models {ids}")
        plans = {p.name for p in self.parallel_plans}
        for pool in self.role_pools:
            if pool.parallel_plan and pool.parallel_plan not in plans:
                raise ValueError(f"role_pools.{pool.role}.parallel_plan {pool.parallel_plan!r} is not declared "
                                 f"in parallel_plans {sorted(plans)}")
        if any(k.startswith(HEALTH_LABEL_PREFIX) for k in self.labels):
            raise ValueError(f"labels may not use the reserved prefix {HEALTH_LABEL_PREFIX!r}")
        return self

    def model(self, card_id: str | None = None):
        """The served card ``card_id`` (the default card when empty)."""
        want = card_id or self.default_model or self.models[0].card_id
        for m in self.models:
            if m.card_id == want:
                return m
        raise InvalidRequest(f"unknown model {want!r}", field="model",
                             limit=", ".join(m.card_id for m in self.models))

    def to_proto(self) -> pb.DeploymentCard:
        """The ``fastvideo3.v1.DeploymentCard`` message."""
        msg = to_wire(self, pb.DeploymentCard())
        if self.cost_model is not None:
            msg.cost_model.cost_model_json = json.dumps(self.cost_model.model, sort_keys=True,
                                                        separators=(",", ":")).encode()
        msg.labels.update({HEALTH_LABEL_PREFIX + name: text for name, text in self.health.serving.items()})
        return msg

    @classmethod
    def from_proto(cls, msg):
        """Parse the wire message; raises InvalidRequest naming the first bad field."""
        d = from_wire(msg)
        labels = d.get("labels", {})
        d["labels"] = {k: v for k, v in labels.items() if not k.startswith(HEALTH_LABEL_PREFIX)}
        d["health"] = {**d.get("health", {}), "serving": {k[len(HEALTH_LABEL_PREFIX):]: v for k, v in labels.items()
                                                          if k.startswith(HEALTH_LABEL_PREFIX)}}
        if msg.HasField("cost_model"):
            try:
                d["cost_model"]["model"] = json.loads(msg.cost_model.cost_model_json.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise InvalidRequest(f"cost_model_json is not JSON: {e}", field="cost_model.cost_model_json") from None
        return parse_card(d, cls)

    def to_json(self, **kw: Any) -> str:
        return self.model_dump_json(**kw)


DeploymentCard = model_of(pb.DeploymentCard, base=_Card, overrides={
    "engine_id": (str, Field(min_length=1)), "version": (str, __version__), "schema_version": (str, SCHEMA_VERSION),
    "models": (list[ModelCardSummary], Field(min_length=1)), "cost_model": (CostModelSpec | None, None)})


def parse_card(data, cls: type[BaseModel] | None = None):
    """Validate plain data as a DeploymentCard; raises InvalidRequest naming the field."""
    try:
        return (cls or DeploymentCard).model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "deployment_card"
        raise InvalidRequest(err["msg"], field=loc) from None


def _unique(names: list[str], where: str) -> None:
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{where} must be unique; repeated: {dup}")
