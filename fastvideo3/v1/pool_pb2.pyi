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
    __slots__ = ("units", "batch_id", "finished_request_ids")
    UNITS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    units: _containers.RepeatedCompositeFieldContainer[_work_pb2.WorkUnit]
    batch_id: str
    finished_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, units: _Optional[_Iterable[_Union[_work_pb2.WorkUnit, _Mapping]]] = ..., batch_id: _Optional[str] = ..., finished_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

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
    __slots__ = ("role", "card_ids", "replica_id", "runtime_fingerprint", "kinds", "max_batch_units", "resident_buffers", "resident_bytes", "cache_stats", "transport_backends", "transfer_endpoints", "counters", "device", "state", "load_error", "precision", "weights_digest", "host_id", "process_id", "executor", "parallel", "scorers", "adapters", "graph_buckets", "diagnostics_json")
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
    class ScorersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
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
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOAD_ERROR_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    SCORERS_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSTICS_JSON_FIELD_NUMBER: _ClassVar[int]
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
    state: str
    load_error: _common_pb2.Error
    precision: str
    weights_digest: str
    host_id: str
    process_id: str
    executor: ExecutorSummary
    parallel: ParallelInfo
    scorers: _containers.ScalarMap[str, str]
    adapters: AdapterState
    graph_buckets: _containers.RepeatedCompositeFieldContainer[GraphBucket]
    diagnostics_json: str
    def __init__(self, role: _Optional[str] = ..., card_ids: _Optional[_Iterable[str]] = ..., replica_id: _Optional[str] = ..., runtime_fingerprint: _Optional[str] = ..., kinds: _Optional[_Iterable[str]] = ..., max_batch_units: _Optional[int] = ..., resident_buffers: _Optional[int] = ..., resident_bytes: _Optional[int] = ..., cache_stats: _Optional[_Mapping[str, float]] = ..., transport_backends: _Optional[_Iterable[str]] = ..., transfer_endpoints: _Optional[_Iterable[_Union[_common_pb2.TransferEndpoint, _Mapping]]] = ..., counters: _Optional[_Mapping[str, float]] = ..., device: _Optional[str] = ..., state: _Optional[str] = ..., load_error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., precision: _Optional[str] = ..., weights_digest: _Optional[str] = ..., host_id: _Optional[str] = ..., process_id: _Optional[str] = ..., executor: _Optional[_Union[ExecutorSummary, _Mapping]] = ..., parallel: _Optional[_Union[ParallelInfo, _Mapping]] = ..., scorers: _Optional[_Mapping[str, str]] = ..., adapters: _Optional[_Union[AdapterState, _Mapping]] = ..., graph_buckets: _Optional[_Iterable[_Union[GraphBucket, _Mapping]]] = ..., diagnostics_json: _Optional[str] = ...) -> None: ...

class ExecutorSummary(_message.Message):
    __slots__ = ("kind", "fake", "resident_regions", "experts", "decoder")
    KIND_FIELD_NUMBER: _ClassVar[int]
    FAKE_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_REGIONS_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_FIELD_NUMBER: _ClassVar[int]
    DECODER_FIELD_NUMBER: _ClassVar[int]
    kind: str
    fake: bool
    resident_regions: int
    experts: _containers.RepeatedScalarFieldContainer[str]
    decoder: DecoderSettings
    def __init__(self, kind: _Optional[str] = ..., fake: _Optional[bool] = ..., resident_regions: _Optional[int] = ..., experts: _Optional[_Iterable[str]] = ..., decoder: _Optional[_Union[DecoderSettings, _Mapping]] = ...) -> None: ...

class DecoderSettings(_message.Message):
    __slots__ = ("max_decode_batch", "fast", "time_chunk", "channels_last", "fused")
    MAX_DECODE_BATCH_FIELD_NUMBER: _ClassVar[int]
    FAST_FIELD_NUMBER: _ClassVar[int]
    TIME_CHUNK_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_LAST_FIELD_NUMBER: _ClassVar[int]
    FUSED_FIELD_NUMBER: _ClassVar[int]
    max_decode_batch: int
    fast: bool
    time_chunk: int
    channels_last: bool
    fused: bool
    def __init__(self, max_decode_batch: _Optional[int] = ..., fast: _Optional[bool] = ..., time_chunk: _Optional[int] = ..., channels_last: _Optional[bool] = ..., fused: _Optional[bool] = ...) -> None: ...

class ParallelInfo(_message.Message):
    __slots__ = ("spec", "kind", "cfg", "ring", "ulysses", "world", "pad", "rank", "backend", "rank_pids", "broken")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CFG_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    ULYSSES_FIELD_NUMBER: _ClassVar[int]
    WORLD_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    RANK_PIDS_FIELD_NUMBER: _ClassVar[int]
    BROKEN_FIELD_NUMBER: _ClassVar[int]
    spec: str
    kind: str
    cfg: int
    ring: int
    ulysses: int
    world: int
    pad: bool
    rank: int
    backend: str
    rank_pids: _containers.RepeatedScalarFieldContainer[int]
    broken: str
    def __init__(self, spec: _Optional[str] = ..., kind: _Optional[str] = ..., cfg: _Optional[int] = ..., ring: _Optional[int] = ..., ulysses: _Optional[int] = ..., world: _Optional[int] = ..., pad: _Optional[bool] = ..., rank: _Optional[int] = ..., backend: _Optional[str] = ..., rank_pids: _Optional[_Iterable[int]] = ..., broken: _Optional[str] = ...) -> None: ...

class AdapterState(_message.Message):
    __slots__ = ("mode", "merged", "slots", "max_rank", "kernel", "device_bytes", "host_bytes", "host_max_bytes", "widened_weight_bytes", "widen_cache_bytes", "entries", "counters")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MODE_FIELD_NUMBER: _ClassVar[int]
    MERGED_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_RANK_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    WIDENED_WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    WIDEN_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    mode: str
    merged: MergedAdapter
    slots: int
    max_rank: int
    kernel: str
    device_bytes: int
    host_bytes: int
    host_max_bytes: int
    widened_weight_bytes: int
    widen_cache_bytes: int
    entries: _containers.RepeatedCompositeFieldContainer[AdapterEntry]
    counters: _containers.ScalarMap[str, float]
    def __init__(self, mode: _Optional[str] = ..., merged: _Optional[_Union[MergedAdapter, _Mapping]] = ..., slots: _Optional[int] = ..., max_rank: _Optional[int] = ..., kernel: _Optional[str] = ..., device_bytes: _Optional[int] = ..., host_bytes: _Optional[int] = ..., host_max_bytes: _Optional[int] = ..., widened_weight_bytes: _Optional[int] = ..., widen_cache_bytes: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[AdapterEntry, _Mapping]]] = ..., counters: _Optional[_Mapping[str, float]] = ...) -> None: ...

class MergedAdapter(_message.Message):
    __slots__ = ("id", "version", "scale")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    id: str
    version: str
    scale: float
    def __init__(self, id: _Optional[str] = ..., version: _Optional[str] = ..., scale: _Optional[float] = ...) -> None: ...

class AdapterEntry(_message.Message):
    __slots__ = ("id", "version", "current", "rank", "bytes", "slot", "in_use", "source")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    version: str
    current: bool
    rank: int
    bytes: int
    slot: int
    in_use: int
    source: str
    def __init__(self, id: _Optional[str] = ..., version: _Optional[str] = ..., current: _Optional[bool] = ..., rank: _Optional[int] = ..., bytes: _Optional[int] = ..., slot: _Optional[int] = ..., in_use: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class GraphBucket(_message.Message):
    __slots__ = ("batch", "signature", "capture_s", "memory_bytes", "replay_ms")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLAY_MS_FIELD_NUMBER: _ClassVar[int]
    batch: int
    signature: str
    capture_s: float
    memory_bytes: int
    replay_ms: float
    def __init__(self, batch: _Optional[int] = ..., signature: _Optional[str] = ..., capture_s: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., replay_ms: _Optional[float] = ...) -> None: ...

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

class StateSnapshot(_message.Message):
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

class RestoreResponse(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class ReadArtifactRequest(_message.Message):
    __slots__ = ("artifact_id",)
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    def __init__(self, artifact_id: _Optional[str] = ...) -> None: ...

class ArtifactChunk(_message.Message):
    __slots__ = ("data", "total_bytes")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    total_bytes: int
    def __init__(self, data: _Optional[bytes] = ..., total_bytes: _Optional[int] = ...) -> None: ...
