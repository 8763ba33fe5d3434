"""Conversions between the core's plain dataclasses and the ``fastvideo3.v1`` wire messages.

This is the only place that knows both forms. Rules kept here:

* TensorRef objects travel as ``v1.TensorRef``; the backend descriptor (``str -> str | int``) goes
  as UTF-8 JSON in ``transport.descriptor`` so ints stay ints; ``name`` carries the dict key. A ref
  read from the wire is built as sent and not validated here: the transport validates it when a
  pool fetches it, so a bad ref fails its own unit (naming the field), not the whole batch.
* WorkUnit ``params`` travel as UTF-8 JSON (numbers round-trip exactly); ``step = None`` is
  ``step_index = -1``; ``total = None`` is ``total_steps = 0``; deadlines travel in whole
  milliseconds.
* Errors travel as ``v1.Error`` whose enum names equal the core's codes; ``details`` values are
  stringified.
"""
from __future__ import annotations

import json
from typing import Any

from fastvideo3.errors import LOSS_KEYS, ErrorInfo
from fastvideo3.loop.params import params_from_dict, params_to_dict
from fastvideo3.loop.protocol import Resources, StepResult
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.transport.ref import TensorRef
from fastvideo3.v1 import common_pb2, work_pb2


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def _loads(blob: bytes, default: Any) -> Any:
    return json.loads(blob.decode("utf-8")) if blob else default


# --------------------------------------------------------------------------- tensor refs
def ref_to_wire(name: str, ref: TensorRef) -> common_pb2.TensorRef:
    if not isinstance(ref, TensorRef):
        raise TypeError(f"ref {name!r} is a {type(ref).__name__}, not a TensorRef")
    desc = dict(ref.descriptor)
    address = desc.get("address")
    return common_pb2.TensorRef(
        owner_pool=ref.owner, buffer_id=ref.buffer_id, dtype=ref.dtype, shape=[int(x) for x in ref.shape],
        nbytes=int(ref.nbytes), checksum=ref.checksum, name=name,
        transport=common_pb2.TransportDescriptor(
            backend=ref.backend, address=address if isinstance(address, str) else "", descriptor=_dumps(desc)),
    )


def ref_from_wire(msg: common_pb2.TensorRef) -> tuple[str, TensorRef]:
    return msg.name, TensorRef(
        owner=msg.owner_pool, buffer_id=msg.buffer_id, dtype=msg.dtype, shape=tuple(int(x) for x in msg.shape),
        nbytes=msg.nbytes, checksum=msg.checksum, backend=msg.transport.backend,
        descriptor=_loads(msg.transport.descriptor, {}),
    )


def refs_to_wire(refs: dict[str, TensorRef]) -> list[common_pb2.TensorRef]:
    return [ref_to_wire(name, ref) for name, ref in refs.items()]


def refs_from_wire(msgs) -> dict[str, TensorRef]:
    return dict(ref_from_wire(m) for m in msgs)


# --------------------------------------------------------------------------- errors
def error_to_wire(info: ErrorInfo, request_id: str = "") -> common_pb2.Error:
    codes = common_pb2.Error.Code
    d = info.details
    msg = common_pb2.Error(
        code=codes.Value(info.code) if info.code in codes.keys() else codes.Value("INTERNAL"),
        message=info.message, field=info.field or "", limit=info.limit or "", request_id=request_id,
        details={str(k): v if isinstance(v, str) else json.dumps(v) for k, v in d.items() if k not in LOSS_KEYS},
    )
    if info.step is not None:
        msg.step = int(info.step)
    if info.retry_after_s is not None:
        msg.retry_after_s = float(info.retry_after_s)
    if d.get("retryable") is not None:  # the loss report: typed fields (fastvideo3.errors.LOSS_KEYS)
        msg.retryable = _flag(d["retryable"])
    if d.get("resume_from_step") is not None:
        msg.resume_from_step = int(d["resume_from_step"])
    if d.get("lost_role") or d.get("lost_replica"):
        msg.loss.CopyFrom(common_pb2.Loss(role=str(d.get("lost_role") or ""), replica=str(d.get("lost_replica") or ""),
                                          step_reached=int(d.get("step_reached") or 0),
                                          checkpoint=_flag(d.get("checkpoint", False))))
    return msg


def _flag(value) -> bool:
    return value in (True, "true", "True", "1", 1)


def error_from_wire(msg: common_pb2.Error) -> ErrorInfo:
    code = common_pb2.Error.Code.Name(msg.code)
    details: dict = dict(msg.details)
    if msg.HasField("retryable"):
        details["retryable"] = msg.retryable
    if msg.HasField("resume_from_step"):
        details["resume_from_step"] = msg.resume_from_step
    if msg.HasField("loss"):
        details.update(lost_role=msg.loss.role, lost_replica=msg.loss.replica, step_reached=msg.loss.step_reached,
                       checkpoint=msg.loss.checkpoint)
    return ErrorInfo(
        code="INTERNAL" if code == "UNSPECIFIED" else code, message=msg.message, field=msg.field or None,
        limit=msg.limit or None, step=msg.step if msg.HasField("step") else None,
        retry_after_s=msg.retry_after_s if msg.HasField("retry_after_s") else None, details=details,
    )


# --------------------------------------------------------------------------- work units
def unit_to_wire(unit: WorkUnit, output_transport: str = "") -> work_pb2.WorkUnit:
    r = unit.resources
    return work_pb2.WorkUnit(
        unit_id=unit.unit_id, request_id=unit.request_id, loop_id=unit.loop_id, kind=unit.kind,
        card_id=unit.card_id, shape_sig=common_pb2.ShapeSignature(key=unit.shape_sig),
        resources=common_pb2.Resources(gpu_seconds=r.gpu_seconds, resident_bytes=r.resident_bytes,
                                       peak_bytes=r.peak_bytes),
        input_refs=refs_to_wire(unit.inputs), params_json=_dumps(params_to_dict(unit.params)),
        deadline_unix_ms=round(unit.deadline_unix * 1000),
        trace_context=dict(unit.trace), step_index=-1 if unit.step is None else int(unit.step),
        role=unit.role, total_steps=int(unit.total or 0), output_transport=output_transport,
    )


def unit_from_wire(msg: work_pb2.WorkUnit) -> WorkUnit:
    r = msg.resources
    return WorkUnit(
        unit_id=msg.unit_id, request_id=msg.request_id, loop_id=msg.loop_id, kind=msg.kind, role=msg.role,
        card_id=msg.card_id, shape_sig=msg.shape_sig.key, params=params_from_dict(msg.kind, _loads(msg.params_json, {})),
        inputs=refs_from_wire(msg.input_refs),
        resources=Resources(gpu_seconds=r.gpu_seconds, resident_bytes=r.resident_bytes, peak_bytes=r.peak_bytes),
        deadline_unix=msg.deadline_unix_ms / 1000.0, step=None if msg.step_index < 0 else int(msg.step_index),
        total=int(msg.total_steps) or None, trace=dict(msg.trace_context),
    )


# --------------------------------------------------------------------------- step results
def result_to_wire(res: StepResult, replica_id: str = "") -> work_pb2.StepResult:
    msg = work_pb2.StepResult(
        unit_id=res.unit_id, request_id=res.request_id, ok=res.ok,
        output_refs=refs_to_wire(res.outputs), metrics={k: float(v) for k, v in res.metrics.items()},
        measured_seconds=res.measured_seconds, payload_json=_dumps(res.payload) if res.payload else b"",
        inline_data=res.inline, replica_id=replica_id,
    )
    if res.error is not None:
        msg.error.CopyFrom(error_to_wire(res.error, res.request_id))
    return msg


def result_from_wire(msg: work_pb2.StepResult) -> StepResult:
    return StepResult(
        unit_id=msg.unit_id, request_id=msg.request_id, ok=msg.ok,
        error=error_from_wire(msg.error) if msg.HasField("error") else None,
        outputs=refs_from_wire(msg.output_refs), metrics=dict(msg.metrics), payload=_loads(msg.payload_json, {}),
        measured_seconds=msg.measured_seconds, inline=bytes(msg.inline_data),
    )
