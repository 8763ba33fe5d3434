from fastvideo3.v1 import adapter_pb2 as _adapter_pb2
from fastvideo3.v1 import common_pb2 as _common_pb2
from fastvideo3.v1 import work_pb2 as _work_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExecuteRequest(_message.Message):
    __slots__ = ("units", "batch_id")
    UNITS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    units: _containers.RepeatedCompositeFieldContainer[_work_pb2.WorkUnit]
    batch_id: str
    def __init__(self, units: _Optional[_Iterable[_Union[_work_pb2.WorkUnit, _Mapping]]] = ..., batch_id: _Optional[str] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("results", "batch_id", "replica_id", "batch_seconds")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_work_pb2.StepResult]
    batch_id: str
    replica_id: str
    batch_seconds: float
    def __init__(self, results: _Optional[_Iterable[_Union[_work_pb2.StepResult, _Mapping]]] = ..., batch_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., batch_seconds: _Optional[float] = ...) -> None: ...

class DescribePoolRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolDescription(_message.Message):
    __slots__ = ("role", "card_ids", "replica_id", "runtime_fingerprint", "kinds", "max_batch_units", "resident_buffers", "resident_bytes", "cache_stats", "transport_backends", "transfer_endpoints", "counters", "device", "description_json")
    class CacheStatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CARD_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_UNITS_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BUFFERS_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_STATS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_JSON_FIELD_NUMBER: _ClassVar[int]
    role: str
    card_ids: _containers.RepeatedScalarFieldContainer[str]
    replica_id: str
    runtime_fingerprint: str
    kinds: _containers.RepeatedScalarFieldContainer[str]
    max_batch_units: int
    resident_buffers: int
    resident_bytes: int
    cache_stats: _containers.ScalarMap[str, float]
    transport_backends: _containers.RepeatedScalarFieldContainer[str]
    transfer_endpoints: _containers.RepeatedCompositeFieldContainer[_common_pb2.TransferEndpoint]
    counters: _containers.ScalarMap[str, float]
    device: str
    description_json: bytes
    def __init__(self, role: _Optional[str] = ..., card_ids: _Optional[_Iterable[str]] = ..., replica_id: _Optional[str] = ..., runtime_fingerprint: _Optional[str] = ..., kinds: _Optional[_Iterable[str]] = ..., max_batch_units: _Optional[int] = ..., resident_buffers: _Optional[int] = ..., resident_bytes: _Optional[int] = ..., cache_stats: _Optional[_Mapping[str, float]] = ..., transport_backends: _Optional[_Iterable[str]] = ..., transfer_endpoints: _Optional[_Iterable[_Union[_common_pb2.TransferEndpoint, _Mapping]]] = ..., counters: _Optional[_Mapping[str, float]] = ..., device: _Optional[str] = ..., description_json: _Optional[bytes] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released_buffers", "released_bytes")
    RELEASED_BUFFERS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_BYTES_FIELD_NUMBER: _ClassVar[int]
    released_buffers: int
    released_bytes: int
    def __init__(self, released_buffers: _Optional[int] = ..., released_bytes: _Optional[int] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("request_id", "blob", "runtime_fingerprint", "regions", "checksum")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    blob: bytes
    runtime_fingerprint: str
    regions: _containers.RepeatedScalarFieldContainer[str]
    checksum: str
    def __init__(self, request_id: _Optional[str] = ..., blob: _Optional[bytes] = ..., runtime_fingerprint: _Optional[str] = ..., regions: _Optional[_Iterable[str]] = ..., checksum: _Optional[str] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("request_id", "blob", "runtime_fingerprint", "checksum")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    blob: bytes
    runtime_fingerprint: str
    checksum: str
    def __init__(self, request_id: _Optional[str] = ..., blob: _Optional[bytes] = ..., runtime_fingerprint: _Optional[str] = ..., checksum: _Optional[str] = ...) -> None: ...

class RestoreResponse(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...
