from fastvideo3.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeploymentCard(_message.Message):
    __slots__ = ("engine_id", "version", "schema_version", "models", "capability_matrix", "role_pools", "programs", "parallel_plans", "cost_model", "health", "slo_classes", "transfer_endpoints", "default_model", "created_unix_ms", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_MATRIX_FIELD_NUMBER: _ClassVar[int]
    ROLE_POOLS_FIELD_NUMBER: _ClassVar[int]
    PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_PLANS_FIELD_NUMBER: _ClassVar[int]
    COST_MODEL_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASSES_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MODEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    version: str
    schema_version: str
    models: _containers.RepeatedCompositeFieldContainer[ModelCardSummary]
    capability_matrix: _containers.RepeatedCompositeFieldContainer[CapabilityCell]
    role_pools: _containers.RepeatedCompositeFieldContainer[RolePoolSpec]
    programs: _containers.RepeatedCompositeFieldContainer[ProgramSpec]
    parallel_plans: _containers.RepeatedCompositeFieldContainer[ParallelPlan]
    cost_model: CostModelSpec
    health: HealthSchema
    slo_classes: _containers.RepeatedCompositeFieldContainer[SloClass]
    transfer_endpoints: _containers.RepeatedCompositeFieldContainer[RoleEndpoints]
    default_model: str
    created_unix_ms: int
    labels: _containers.ScalarMap[str, str]
    def __init__(self, engine_id: _Optional[str] = ..., version: _Optional[str] = ..., schema_version: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelCardSummary, _Mapping]]] = ..., capability_matrix: _Optional[_Iterable[_Union[CapabilityCell, _Mapping]]] = ..., role_pools: _Optional[_Iterable[_Union[RolePoolSpec, _Mapping]]] = ..., programs: _Optional[_Iterable[_Union[ProgramSpec, _Mapping]]] = ..., parallel_plans: _Optional[_Iterable[_Union[ParallelPlan, _Mapping]]] = ..., cost_model: _Optional[_Union[CostModelSpec, _Mapping]] = ..., health: _Optional[_Union[HealthSchema, _Mapping]] = ..., slo_classes: _Optional[_Iterable[_Union[SloClass, _Mapping]]] = ..., transfer_endpoints: _Optional[_Iterable[_Union[RoleEndpoints, _Mapping]]] = ..., default_model: _Optional[str] = ..., created_unix_ms: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ModelCardSummary(_message.Message):
    __slots__ = ("card_id", "family", "capabilities", "limits", "defaults", "recipe", "precision", "runtime_fingerprint")
    CARD_ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    DEFAULTS_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    card_id: str
    family: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    limits: RequestLimits
    defaults: RequestDefaults
    recipe: str
    precision: str
    runtime_fingerprint: str
    def __init__(self, card_id: _Optional[str] = ..., family: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ..., limits: _Optional[_Union[RequestLimits, _Mapping]] = ..., defaults: _Optional[_Union[RequestDefaults, _Mapping]] = ..., recipe: _Optional[str] = ..., precision: _Optional[str] = ..., runtime_fingerprint: _Optional[str] = ...) -> None: ...

class RequestLimits(_message.Message):
    __slots__ = ("min_frames", "max_frames", "frames_multiple", "frames_offset", "min_height", "max_height", "min_width", "max_width", "size_multiple", "min_steps", "max_steps", "min_guidance_scale", "max_guidance_scale", "max_prompt_tokens", "samplers", "output_formats")
    MIN_FRAMES_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FRAMES_MULTIPLE_FIELD_NUMBER: _ClassVar[int]
    FRAMES_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    MIN_WIDTH_FIELD_NUMBER: _ClassVar[int]
    MAX_WIDTH_FIELD_NUMBER: _ClassVar[int]
    SIZE_MULTIPLE_FIELD_NUMBER: _ClassVar[int]
    MIN_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    MIN_GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    MAX_GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLERS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FORMATS_FIELD_NUMBER: _ClassVar[int]
    min_frames: int
    max_frames: int
    frames_multiple: int
    frames_offset: int
    min_height: int
    max_height: int
    min_width: int
    max_width: int
    size_multiple: int
    min_steps: int
    max_steps: int
    min_guidance_scale: float
    max_guidance_scale: float
    max_prompt_tokens: int
    samplers: _containers.RepeatedScalarFieldContainer[str]
    output_formats: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, min_frames: _Optional[int] = ..., max_frames: _Optional[int] = ..., frames_multiple: _Optional[int] = ..., frames_offset: _Optional[int] = ..., min_height: _Optional[int] = ..., max_height: _Optional[int] = ..., min_width: _Optional[int] = ..., max_width: _Optional[int] = ..., size_multiple: _Optional[int] = ..., min_steps: _Optional[int] = ..., max_steps: _Optional[int] = ..., min_guidance_scale: _Optional[float] = ..., max_guidance_scale: _Optional[float] = ..., max_prompt_tokens: _Optional[int] = ..., samplers: _Optional[_Iterable[str]] = ..., output_formats: _Optional[_Iterable[str]] = ...) -> None: ...

class RequestDefaults(_message.Message):
    __slots__ = ("num_frames", "height", "width", "num_inference_steps", "guidance_scale", "flow_shift", "sampler", "fps", "negative_prompt")
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    NUM_INFERENCE_STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    FLOW_SHIFT_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    num_frames: int
    height: int
    width: int
    num_inference_steps: int
    guidance_scale: float
    flow_shift: float
    sampler: str
    fps: int
    negative_prompt: str
    def __init__(self, num_frames: _Optional[int] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., num_inference_steps: _Optional[int] = ..., guidance_scale: _Optional[float] = ..., flow_shift: _Optional[float] = ..., sampler: _Optional[str] = ..., fps: _Optional[int] = ..., negative_prompt: _Optional[str] = ...) -> None: ...

class CapabilityCell(_message.Message):
    __slots__ = ("card_id", "capability", "level", "note")
    CARD_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    card_id: str
    capability: str
    level: str
    note: str
    def __init__(self, card_id: _Optional[str] = ..., capability: _Optional[str] = ..., level: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class RolePoolSpec(_message.Message):
    __slots__ = ("role", "replicas", "device", "card_ids", "kinds", "max_batch_units", "transport_backends", "parallel_plan")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CARD_IDS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_UNITS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_PLAN_FIELD_NUMBER: _ClassVar[int]
    role: str
    replicas: int
    device: DeviceNeeds
    card_ids: _containers.RepeatedScalarFieldContainer[str]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    max_batch_units: int
    transport_backends: _containers.RepeatedScalarFieldContainer[str]
    parallel_plan: str
    def __init__(self, role: _Optional[str] = ..., replicas: _Optional[int] = ..., device: _Optional[_Union[DeviceNeeds, _Mapping]] = ..., card_ids: _Optional[_Iterable[str]] = ..., kinds: _Optional[_Iterable[str]] = ..., max_batch_units: _Optional[int] = ..., transport_backends: _Optional[_Iterable[str]] = ..., parallel_plan: _Optional[str] = ...) -> None: ...

class DeviceNeeds(_message.Message):
    __slots__ = ("gpus", "gpu_memory_bytes", "host_memory_bytes", "accelerator")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    gpu_memory_bytes: int
    host_memory_bytes: int
    accelerator: str
    def __init__(self, gpus: _Optional[int] = ..., gpu_memory_bytes: _Optional[int] = ..., host_memory_bytes: _Optional[int] = ..., accelerator: _Optional[str] = ...) -> None: ...

class ProgramSpec(_message.Message):
    __slots__ = ("name", "loops", "card_ids")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LOOPS_FIELD_NUMBER: _ClassVar[int]
    CARD_IDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    loops: _containers.RepeatedScalarFieldContainer[str]
    card_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., loops: _Optional[_Iterable[str]] = ..., card_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ParallelPlan(_message.Message):
    __slots__ = ("name", "role", "degrees", "gpus")
    class DegreesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DEGREES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    degrees: _containers.ScalarMap[str, int]
    gpus: int
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., degrees: _Optional[_Mapping[str, int]] = ..., gpus: _Optional[int] = ...) -> None: ...

class CostModelSpec(_message.Message):
    __slots__ = ("version", "unit", "cost_model_json", "calibrated_unix_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    COST_MODEL_JSON_FIELD_NUMBER: _ClassVar[int]
    CALIBRATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    version: str
    unit: str
    cost_model_json: bytes
    calibrated_unix_ms: int
    def __init__(self, version: _Optional[str] = ..., unit: _Optional[str] = ..., cost_model_json: _Optional[bytes] = ..., calibrated_unix_ms: _Optional[int] = ...) -> None: ...

class HealthSchema(_message.Message):
    __slots__ = ("protocol", "services", "check_interval_s", "unhealthy_after_s", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    CHECK_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    protocol: str
    services: _containers.RepeatedScalarFieldContainer[str]
    check_interval_s: float
    unhealthy_after_s: float
    metrics: _containers.ScalarMap[str, str]
    def __init__(self, protocol: _Optional[str] = ..., services: _Optional[_Iterable[str]] = ..., check_interval_s: _Optional[float] = ..., unhealthy_after_s: _Optional[float] = ..., metrics: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SloClass(_message.Message):
    __slots__ = ("name", "priority", "target_queue_s", "target_latency_p50_s", "target_latency_p95_s", "gpu_seconds_budget", "max_concurrent_requests")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TARGET_QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    TARGET_LATENCY_P50_S_FIELD_NUMBER: _ClassVar[int]
    TARGET_LATENCY_P95_S_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    priority: int
    target_queue_s: float
    target_latency_p50_s: float
    target_latency_p95_s: float
    gpu_seconds_budget: float
    max_concurrent_requests: int
    def __init__(self, name: _Optional[str] = ..., priority: _Optional[int] = ..., target_queue_s: _Optional[float] = ..., target_latency_p50_s: _Optional[float] = ..., target_latency_p95_s: _Optional[float] = ..., gpu_seconds_budget: _Optional[float] = ..., max_concurrent_requests: _Optional[int] = ...) -> None: ...

class RoleEndpoints(_message.Message):
    __slots__ = ("role", "endpoints")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    role: str
    endpoints: _containers.RepeatedCompositeFieldContainer[_common_pb2.TransferEndpoint]
    def __init__(self, role: _Optional[str] = ..., endpoints: _Optional[_Iterable[_Union[_common_pb2.TransferEndpoint, _Mapping]]] = ...) -> None: ...
