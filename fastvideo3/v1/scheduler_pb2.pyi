from fastvideo3.v1 import adapter_pb2 as _adapter_pb2
from fastvideo3.v1 import common_pb2 as _common_pb2
from fastvideo3.v1 import deployment_pb2 as _deployment_pb2
from fastvideo3.v1 import pool_pb2 as _pool_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "model", "prompt", "negative_prompt", "num_frames", "height", "width", "num_inference_steps", "guidance_scale", "seed", "flow_shift", "sampler", "fps", "output_format", "slo_class", "deadline_s", "reward_scorers", "previews", "capture_behavior", "metadata", "cfg_policy", "detached", "adapters", "guidance_scale_2", "cache", "image", "image_url")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    NUM_INFERENCE_STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FLOW_SHIFT_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    REWARD_SCORERS_FIELD_NUMBER: _ClassVar[int]
    PREVIEWS_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_BEHAVIOR_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CFG_POLICY_FIELD_NUMBER: _ClassVar[int]
    DETACHED_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_2_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_URL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
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
    fps: int
    output_format: str
    slo_class: str
    deadline_s: float
    reward_scorers: _containers.RepeatedScalarFieldContainer[str]
    previews: bool
    capture_behavior: bool
    metadata: _containers.ScalarMap[str, str]
    cfg_policy: str
    detached: bool
    adapters: _containers.RepeatedCompositeFieldContainer[_adapter_pb2.AdapterRef]
    guidance_scale_2: float
    cache: CacheSettings
    image: bytes
    image_url: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt: _Optional[str] = ..., negative_prompt: _Optional[str] = ..., num_frames: _Optional[int] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., num_inference_steps: _Optional[int] = ..., guidance_scale: _Optional[float] = ..., seed: _Optional[int] = ..., flow_shift: _Optional[float] = ..., sampler: _Optional[str] = ..., fps: _Optional[int] = ..., output_format: _Optional[str] = ..., slo_class: _Optional[str] = ..., deadline_s: _Optional[float] = ..., reward_scorers: _Optional[_Iterable[str]] = ..., previews: _Optional[bool] = ..., capture_behavior: _Optional[bool] = ..., metadata: _Optional[_Mapping[str, str]] = ..., cfg_policy: _Optional[str] = ..., detached: _Optional[bool] = ..., adapters: _Optional[_Iterable[_Union[_adapter_pb2.AdapterRef, _Mapping]]] = ..., guidance_scale_2: _Optional[float] = ..., cache: _Optional[_Union[CacheSettings, _Mapping]] = ..., image: _Optional[bytes] = ..., image_url: _Optional[str] = ...) -> None: ...

class CacheSettings(_message.Message):
    __slots__ = ("policy", "params", "flags")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class FlagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bool
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bool] = ...) -> None: ...
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    params: _containers.ScalarMap[str, float]
    flags: _containers.ScalarMap[str, bool]
    def __init__(self, policy: _Optional[str] = ..., params: _Optional[_Mapping[str, float]] = ..., flags: _Optional[_Mapping[str, bool]] = ...) -> None: ...

class GenerateEvent(_message.Message):
    __slots__ = ("request_id", "seq", "time_unix_ms", "accepted", "queued", "progress", "preview", "artifact", "error", "finished")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    seq: int
    time_unix_ms: int
    accepted: Accepted
    queued: Queued
    progress: Progress
    preview: Preview
    artifact: Artifact
    error: ErrorEvent
    finished: Finished
    def __init__(self, request_id: _Optional[str] = ..., seq: _Optional[int] = ..., time_unix_ms: _Optional[int] = ..., accepted: _Optional[_Union[Accepted, _Mapping]] = ..., queued: _Optional[_Union[Queued, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., preview: _Optional[_Union[Preview, _Mapping]] = ..., artifact: _Optional[_Union[Artifact, _Mapping]] = ..., error: _Optional[_Union[ErrorEvent, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ...) -> None: ...

class Accepted(_message.Message):
    __slots__ = ("card_id", "program", "seed", "num_inference_steps", "predicted_gpu_seconds", "resolved_params_json")
    CARD_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    NUM_INFERENCE_STEPS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    card_id: str
    program: str
    seed: int
    num_inference_steps: int
    predicted_gpu_seconds: float
    resolved_params_json: bytes
    def __init__(self, card_id: _Optional[str] = ..., program: _Optional[str] = ..., seed: _Optional[int] = ..., num_inference_steps: _Optional[int] = ..., predicted_gpu_seconds: _Optional[float] = ..., resolved_params_json: _Optional[bytes] = ...) -> None: ...

class Queued(_message.Message):
    __slots__ = ("position", "estimated_wait_s")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    position: int
    estimated_wait_s: float
    def __init__(self, position: _Optional[int] = ..., estimated_wait_s: _Optional[float] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("step", "total", "phase", "elapsed_s", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    step: int
    total: int
    phase: str
    elapsed_s: float
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., total: _Optional[int] = ..., phase: _Optional[str] = ..., elapsed_s: _Optional[float] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Preview(_message.Message):
    __slots__ = ("step", "mime_type", "data")
    STEP_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    step: int
    mime_type: str
    data: bytes
    def __init__(self, step: _Optional[int] = ..., mime_type: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class Artifact(_message.Message):
    __slots__ = ("name", "mime_type", "chunk_index", "last", "data", "total_bytes", "checksum", "sidecar_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    mime_type: str
    chunk_index: int
    last: bool
    data: bytes
    total_bytes: int
    checksum: str
    sidecar_json: bytes
    def __init__(self, name: _Optional[str] = ..., mime_type: _Optional[str] = ..., chunk_index: _Optional[int] = ..., last: _Optional[bool] = ..., data: _Optional[bytes] = ..., total_bytes: _Optional[int] = ..., checksum: _Optional[str] = ..., sidecar_json: _Optional[bytes] = ...) -> None: ...

class ErrorEvent(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("state", "timings", "rewards", "gpu_seconds")
    class TimingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class RewardsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    state: RequestStatus.State
    timings: _containers.ScalarMap[str, float]
    rewards: _containers.ScalarMap[str, float]
    gpu_seconds: float
    def __init__(self, state: _Optional[_Union[RequestStatus.State, str]] = ..., timings: _Optional[_Mapping[str, float]] = ..., rewards: _Optional[_Mapping[str, float]] = ..., gpu_seconds: _Optional[float] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("request_id", "cancelled", "state")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    cancelled: bool
    state: RequestStatus.State
    def __init__(self, request_id: _Optional[str] = ..., cancelled: _Optional[bool] = ..., state: _Optional[_Union[RequestStatus.State, str]] = ...) -> None: ...

class GetRequestRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class RequestStatus(_message.Message):
    __slots__ = ("request_id", "state", "card_id", "phase", "step", "total", "error", "created_unix_ms", "updated_unix_ms", "last_seq")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNSPECIFIED: _ClassVar[RequestStatus.State]
        QUEUED: _ClassVar[RequestStatus.State]
        RUNNING: _ClassVar[RequestStatus.State]
        SUCCEEDED: _ClassVar[RequestStatus.State]
        FAILED: _ClassVar[RequestStatus.State]
        CANCELLED: _ClassVar[RequestStatus.State]
    UNSPECIFIED: RequestStatus.State
    QUEUED: RequestStatus.State
    RUNNING: RequestStatus.State
    SUCCEEDED: RequestStatus.State
    FAILED: RequestStatus.State
    CANCELLED: RequestStatus.State
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CARD_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    state: RequestStatus.State
    card_id: str
    phase: str
    step: int
    total: int
    error: _common_pb2.Error
    created_unix_ms: int
    updated_unix_ms: int
    last_seq: int
    def __init__(self, request_id: _Optional[str] = ..., state: _Optional[_Union[RequestStatus.State, str]] = ..., card_id: _Optional[str] = ..., phase: _Optional[str] = ..., step: _Optional[int] = ..., total: _Optional[int] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., created_unix_ms: _Optional[int] = ..., updated_unix_ms: _Optional[int] = ..., last_seq: _Optional[int] = ...) -> None: ...

class DescribeSchedulerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolStatus(_message.Message):
    __slots__ = ("role", "replica_id", "address", "healthy", "in_flight_units", "description", "error", "health_changed_unix", "remote_counters", "output_transport")
    class RemoteCountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_UNITS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HEALTH_CHANGED_UNIX_FIELD_NUMBER: _ClassVar[int]
    REMOTE_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    role: str
    replica_id: str
    address: str
    healthy: bool
    in_flight_units: int
    description: _pool_pb2.PoolDescription
    error: str
    health_changed_unix: float
    remote_counters: _containers.ScalarMap[str, float]
    output_transport: str
    def __init__(self, role: _Optional[str] = ..., replica_id: _Optional[str] = ..., address: _Optional[str] = ..., healthy: _Optional[bool] = ..., in_flight_units: _Optional[int] = ..., description: _Optional[_Union[_pool_pb2.PoolDescription, _Mapping]] = ..., error: _Optional[str] = ..., health_changed_unix: _Optional[float] = ..., remote_counters: _Optional[_Mapping[str, float]] = ..., output_transport: _Optional[str] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("owed_gpu_seconds", "requests", "replicas", "admission", "admission_reserved_gpu_seconds", "admission_waiting", "memory_budget_bytes", "memory_free_bytes")
    class OwedGpuSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ReplicasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    OWED_GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_RESERVED_GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_WAITING_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    owed_gpu_seconds: _containers.ScalarMap[str, float]
    requests: int
    replicas: _containers.ScalarMap[str, int]
    admission: bool
    admission_reserved_gpu_seconds: float
    admission_waiting: int
    memory_budget_bytes: int
    memory_free_bytes: int
    def __init__(self, owed_gpu_seconds: _Optional[_Mapping[str, float]] = ..., requests: _Optional[int] = ..., replicas: _Optional[_Mapping[str, int]] = ..., admission: _Optional[bool] = ..., admission_reserved_gpu_seconds: _Optional[float] = ..., admission_waiting: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ..., memory_free_bytes: _Optional[int] = ...) -> None: ...

class SchedulerDescription(_message.Message):
    __slots__ = ("card", "queued_requests", "running_requests", "pools", "budget_gpu_seconds", "counters", "transport_edges", "batching", "batch_invariant_bucket", "adapters", "load", "diagnostics_json")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class TransportEdgesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AdaptersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CARD_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_EDGES_FIELD_NUMBER: _ClassVar[int]
    BATCHING_FIELD_NUMBER: _ClassVar[int]
    BATCH_INVARIANT_BUCKET_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSTICS_JSON_FIELD_NUMBER: _ClassVar[int]
    card: _deployment_pb2.DeploymentCard
    queued_requests: int
    running_requests: int
    pools: _containers.RepeatedCompositeFieldContainer[PoolStatus]
    budget_gpu_seconds: float
    counters: _containers.ScalarMap[str, float]
    transport_edges: _containers.ScalarMap[str, str]
    batching: bool
    batch_invariant_bucket: int
    adapters: _containers.ScalarMap[str, str]
    load: LoadReport
    diagnostics_json: str
    def __init__(self, card: _Optional[_Union[_deployment_pb2.DeploymentCard, _Mapping]] = ..., queued_requests: _Optional[int] = ..., running_requests: _Optional[int] = ..., pools: _Optional[_Iterable[_Union[PoolStatus, _Mapping]]] = ..., budget_gpu_seconds: _Optional[float] = ..., counters: _Optional[_Mapping[str, float]] = ..., transport_edges: _Optional[_Mapping[str, str]] = ..., batching: _Optional[bool] = ..., batch_invariant_bucket: _Optional[int] = ..., adapters: _Optional[_Mapping[str, str]] = ..., load: _Optional[_Union[LoadReport, _Mapping]] = ..., diagnostics_json: _Optional[str] = ...) -> None: ...
