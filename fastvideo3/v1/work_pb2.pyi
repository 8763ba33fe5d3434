from fastvideo3.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkUnit(_message.Message):
    __slots__ = ("unit_id", "request_id", "loop_id", "kind", "card_id", "shape_sig", "resources", "input_refs", "params_json", "deadline_unix_ms", "trace_context", "step_index", "attempt", "role", "total_steps", "output_transport")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    UNIT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LOOP_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CARD_ID_FIELD_NUMBER: _ClassVar[int]
    SHAPE_SIG_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    INPUT_REFS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    unit_id: str
    request_id: str
    loop_id: str
    kind: str
    card_id: str
    shape_sig: _common_pb2.ShapeSignature
    resources: _common_pb2.Resources
    input_refs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TensorRef]
    params_json: bytes
    deadline_unix_ms: int
    trace_context: _containers.ScalarMap[str, str]
    step_index: int
    attempt: int
    role: str
    total_steps: int
    output_transport: str
    def __init__(self, unit_id: _Optional[str] = ..., request_id: _Optional[str] = ..., loop_id: _Optional[str] = ..., kind: _Optional[str] = ..., card_id: _Optional[str] = ..., shape_sig: _Optional[_Union[_common_pb2.ShapeSignature, _Mapping]] = ..., resources: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., input_refs: _Optional[_Iterable[_Union[_common_pb2.TensorRef, _Mapping]]] = ..., params_json: _Optional[bytes] = ..., deadline_unix_ms: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., step_index: _Optional[int] = ..., attempt: _Optional[int] = ..., role: _Optional[str] = ..., total_steps: _Optional[int] = ..., output_transport: _Optional[str] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("unit_id", "request_id", "ok", "error", "output_refs", "metrics", "flags", "measured_seconds", "payload_json", "inline_data", "replica_id", "artifact_id", "artifact_bytes")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    UNIT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_REFS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    INLINE_DATA_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_FIELD_NUMBER: _ClassVar[int]
    unit_id: str
    request_id: str
    ok: bool
    error: _common_pb2.Error
    output_refs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TensorRef]
    metrics: _containers.ScalarMap[str, float]
    flags: _containers.RepeatedScalarFieldContainer[str]
    measured_seconds: float
    payload_json: bytes
    inline_data: bytes
    replica_id: str
    artifact_id: str
    artifact_bytes: int
    def __init__(self, unit_id: _Optional[str] = ..., request_id: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., output_refs: _Optional[_Iterable[_Union[_common_pb2.TensorRef, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., flags: _Optional[_Iterable[str]] = ..., measured_seconds: _Optional[float] = ..., payload_json: _Optional[bytes] = ..., inline_data: _Optional[bytes] = ..., replica_id: _Optional[str] = ..., artifact_id: _Optional[str] = ..., artifact_bytes: _Optional[int] = ...) -> None: ...
