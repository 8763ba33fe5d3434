"""The DeploymentCard's two forms, checked against each other field by field: the wire message
(deployment.proto) and the pydantic model generated from it (fleet/deployment_schema.py), and
the card the scheduler builds as a proto against the model's validation."""
from __future__ import annotations

import types
import typing
from types import SimpleNamespace

import pytest
from google.protobuf.descriptor import FieldDescriptor
from pydantic import BaseModel, create_model

from fastvideo3.card.registry import get_card
from fastvideo3.v1 import common_pb2, deployment_pb2, pool_pb2
from fleet.deployment_schema import MODEL_ONLY, MODELS, WIRE_ONLY, DeploymentCard, RolePoolSpec

pytestmark = pytest.mark.timeout(60)
F = FieldDescriptor

_SCALAR = {F.TYPE_STRING: str, F.TYPE_BOOL: bool, F.TYPE_DOUBLE: float, F.TYPE_FLOAT: float, F.TYPE_INT32: int,
           F.TYPE_INT64: int, F.TYPE_UINT32: int, F.TYPE_UINT64: int, F.TYPE_BYTES: bytes}


def _wire_shape(f) -> tuple:
    sub = f.message_type
    if sub is not None and sub.GetOptions().map_entry:
        return ("map", _wire_shape(sub.fields_by_name["value"]))
    one = ("message", sub.name) if sub is not None else ("scalar", _SCALAR[f.type])
    return ("list", one) if f.is_repeated else one


def _model_shape(ann) -> tuple:
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _model_shape(args[0])
    if origin in (typing.Union, types.UnionType):  # X | None: an optional message
        (inner,) = [a for a in args if a is not type(None)]
        return _model_shape(inner)
    if origin is typing.Literal:
        return ("scalar", str) if all(isinstance(a, str) for a in args) else ("literal", args)
    if origin is list:
        return ("list", _model_shape(args[0]))
    if origin is dict:
        assert args[0] is str
        return ("map", _model_shape(args[1]))
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ("message", ann.__name__)
    return ("scalar", ann)


def form_differences(model: type[BaseModel], message) -> list[str]:
    """Where ``model`` and ``message`` (and the messages under it) differ, field by field."""
    out: list[str] = []
    desc = message.DESCRIPTOR if hasattr(message, "DESCRIPTOR") else message
    name = desc.name
    wire = {f.name: f for f in desc.fields if (name, f.name) not in WIRE_ONLY}
    fields = {k: v for k, v in model.model_fields.items() if (name, k) not in MODEL_ONLY}
    out += [f"{name}.{k}: in the model only" for k in sorted(set(fields) - set(wire))]
    out += [f"{name}.{k}: on the wire only" for k in sorted(set(wire) - set(fields))]
    for k in [f.name for f in desc.fields if f.name in fields]:
        w, m = _wire_shape(wire[k]), _model_shape(fields[k].annotation)
        if w != m:
            out.append(f"{name}.{k}: wire {w} != model {m}")
            continue
        sub = wire[k].message_type
        if sub is not None and sub.GetOptions().map_entry:
            sub = sub.fields_by_name["value"].message_type
        if sub is not None:
            out += form_differences(MODELS[sub.name], sub)
    return out


def test_every_message_and_field_has_the_same_shape_in_both_forms():
    assert form_differences(DeploymentCard, deployment_pb2.DeploymentCard) == []
    # every message of deployment.proto has its model, and the exception tables name real fields
    assert set(deployment_pb2.DESCRIPTOR.message_types_by_name) <= set(MODELS)
    for msg_name, field in WIRE_ONLY:
        assert field in deployment_pb2.DESCRIPTOR.message_types_by_name[msg_name].fields_by_name
    for msg_name, field in MODEL_ONLY:
        assert field in MODELS[msg_name].model_fields
        assert field not in deployment_pb2.DESCRIPTOR.message_types_by_name[msg_name].fields_by_name


def test_a_field_added_to_one_form_only_is_found():
    extra = create_model("RolePoolSpec", __base__=RolePoolSpec, weight=(int, 0))
    assert form_differences(extra, deployment_pb2.RolePoolSpec) == ["RolePoolSpec.weight: in the model only"]
    kept = {k: (v.annotation, v) for k, v in RolePoolSpec.model_fields.items() if k != "parallel_plan"}
    fewer = create_model("RolePoolSpec", **kept)
    assert form_differences(fewer, deployment_pb2.RolePoolSpec) == ["RolePoolSpec.parallel_plan: on the wire only"]
    wrong = create_model("RolePoolSpec", __base__=RolePoolSpec, replicas=(str, ""))
    assert form_differences(wrong, deployment_pb2.RolePoolSpec) == [
        "RolePoolSpec.replicas: wire ('scalar', <class 'int'>) != model ('scalar', <class 'str'>)"]
    nested = {k: (v.annotation, v) for k, v in MODELS["TransferEndpoint"].model_fields.items() if k != "address"}
    saved = MODELS["TransferEndpoint"]
    try:  # a nested message is compared too
        MODELS["TransferEndpoint"] = create_model("TransferEndpoint", **nested)
        assert form_differences(MODELS["RoleEndpoints"], deployment_pb2.RoleEndpoints) == [
            "TransferEndpoint.address: on the wire only"]
    finally:
        MODELS["TransferEndpoint"] = saved


def _same_values(model: BaseModel, msg, path: str = "") -> None:
    """Every field the two forms share holds the same value (recursively)."""
    name = msg.DESCRIPTOR.name
    for f in msg.DESCRIPTOR.fields:
        if (name, f.name) in WIRE_ONLY:
            continue
        where = f"{path}{name}.{f.name}"
        mv, wv, sub = getattr(model, f.name), getattr(msg, f.name), f.message_type
        if sub is not None and sub.GetOptions().map_entry:
            nested = sub.fields_by_name["value"].message_type is not None
            if f.name == "labels" and name == "DeploymentCard":  # health.serving rides here too
                wv = {k: v for k, v in wv.items() if not k.startswith("health.serving/")}
            assert set(mv) == set(wv), where
            for k in mv:
                if nested:
                    _same_values(mv[k], wv[k], where + ".")
                else:
                    assert mv[k] == wv[k], (where, k)
        elif f.is_repeated:
            assert len(mv) == len(wv), where
            for a, b in zip(mv, wv):
                if sub is not None:
                    _same_values(a, b, where + ".")
                else:
                    assert a == b, where
        elif sub is not None:
            assert (mv is not None) == msg.HasField(f.name), where
            if mv is not None:
                _same_values(mv, wv, where + ".")
        else:
            assert mv == wv, where


def test_the_wire_form_of_a_full_card_holds_every_model_value():
    from tests.unit.test_deployment_card import full_card
    card = full_card()
    msg = card.to_proto()
    _same_values(card, msg)
    serving = {k.removeprefix("health.serving/"): v for k, v in msg.labels.items() if k.startswith("health.serving/")}
    assert serving == card.health.serving and serving
    assert DeploymentCard.from_proto(msg) == card


def _replica(role: str, *, precision: str = "fp32", plan: str = "") -> SimpleNamespace:
    desc = pool_pb2.PoolDescription(
        role=role, replica_id=f"{role}-0", max_batch_units=8, device="cpu", precision=precision,
        transport_backends=["shm", "grpc"], runtime_fingerprint="fnv1a64:00000000000000aa",
        transfer_endpoints=[common_pb2.TransferEndpoint(backend="grpc", address="", replica_id=f"{role}-0")])
    if plan:
        desc.parallel.CopyFrom(pool_pb2.ParallelInfo(spec=plan, world=2, ulysses=2, pad=True))
    return SimpleNamespace(last_description=desc, target=f"127.0.0.1:{len(role)}")


def test_the_card_the_scheduler_builds_is_a_valid_model_card():
    from services.scheduler.config import SchedulerConfig
    from services.scheduler.deployment import build_card
    card = get_card("wan-tiny")
    replicas = {r: [_replica(r, plan="ulysses2" if r == "denoiser" else "")]
                for r in ("encoder", "denoiser", "decoder", "reward")}
    edges = {"encoder->denoiser": "shm", "denoiser->decoder": "shm", "decoder->reward": "shm"}
    msg = build_card(SchedulerConfig(), card, replicas, edges, ["", "fastvideo3.v1.Scheduler"])
    parsed = DeploymentCard.from_proto(msg)  # raises InvalidRequest naming the field it refuses
    assert parsed.models[0].precision == "fp32" and parsed.default_model == card.model_id
    assert {p.role: p.parallel_plan for p in parsed.role_pools}["denoiser"] == "ulysses2"
    _same_values(parsed, msg)
    from fleet.deployment_card import summarize_card  # one summary, whichever builder asks
    assert parsed.models == [summarize_card(card, precision="fp32", fingerprint="fnv1a64:00000000000000aa")]
