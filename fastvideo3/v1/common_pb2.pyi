from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransportDescriptor(_message.Message):
    __slots__ = ("backend", "address", "descriptor", "attrs")
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    address: str
    descriptor: bytes
    attrs: _containers.ScalarMap[str, str]
    def __init__(self, backend: _Optional[str] = ..., address: _Optional[str] = ..., descriptor: _Optional[bytes] = ..., attrs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TensorRef(_message.Message):
    __slots__ = ("owner_pool", "buffer_id", "dtype", "shape", "nbytes", "checksum", "transport", "name")
    OWNER_POOL_FIELD_NUMBER: _ClassVar[int]
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    owner_pool: str
    buffer_id: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    checksum: str
    transport: TransportDescriptor
    name: str
    def __init__(self, owner_pool: _Optional[str] = ..., buffer_id: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., checksum: _Optional[str] = ..., transport: _Optional[_Union[TransportDescriptor, _Mapping]] = ..., name: _Optional[str] = ...) -> None: ...

class ShapeSignature(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("gpu_seconds", "resident_bytes", "peak_bytes")
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    gpu_seconds: float
    resident_bytes: int
    peak_bytes: int
    def __init__(self, gpu_seconds: _Optional[float] = ..., resident_bytes: _Optional[int] = ..., peak_bytes: _Optional[int] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "field", "limit", "step", "retry_after_s", "request_id", "details", "retryable", "resume_from_step", "loss")
    class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNSPECIFIED: _ClassVar[Error.Code]
        INVALID_ARGUMENT: _ClassVar[Error.Code]
        FAILED_PRECONDITION: _ClassVar[Error.Code]
        NOT_FOUND: _ClassVar[Error.Code]
        RESOURCE_EXHAUSTED: _ClassVar[Error.Code]
        CANCELLED: _ClassVar[Error.Code]
        UNAVAILABLE: _ClassVar[Error.Code]
        DATA_LOSS: _ClassVar[Error.Code]
        DEADLINE_EXCEEDED: _ClassVar[Error.Code]
        ABORTED: _ClassVar[Error.Code]
        INTERNAL: _ClassVar[Error.Code]
        UNAUTHENTICATED: _ClassVar[Error.Code]
        ALREADY_EXISTS: _ClassVar[Error.Code]
    UNSPECIFIED: Error.Code
    INVALID_ARGUMENT: Error.Code
    FAILED_PRECONDITION: Error.Code
    NOT_FOUND: Error.Code
    RESOURCE_EXHAUSTED: Error.Code
    CANCELLED: Error.Code
    UNAVAILABLE: Error.Code
    DATA_LOSS: Error.Code
    DEADLINE_EXCEEDED: Error.Code
    ABORTED: Error.Code
    INTERNAL: Error.Code
    UNAUTHENTICATED: Error.Code
    ALREADY_EXISTS: Error.Code
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    code: Error.Code
    message: str
    field: str
    limit: str
    step: int
    retry_after_s: float
    request_id: str
    details: _containers.ScalarMap[str, str]
    retryable: bool
    resume_from_step: int
    loss: Loss
    def __init__(self, code: _Optional[_Union[Error.Code, str]] = ..., message: _Optional[str] = ..., field: _Optional[str] = ..., limit: _Optional[str] = ..., step: _Optional[int] = ..., retry_after_s: _Optional[float] = ..., request_id: _Optional[str] = ..., details: _Optional[_Mapping[str, str]] = ..., retryable: _Optional[bool] = ..., resume_from_step: _Optional[int] = ..., loss: _Optional[_Union[Loss, _Mapping]] = ...) -> None: ...

class Loss(_message.Message):
    __slots__ = ("role", "replica", "step_reached", "checkpoint")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    STEP_REACHED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    role: str
    replica: str
    step_reached: int
    checkpoint: bool
    def __init__(self, role: _Optional[str] = ..., replica: _Optional[str] = ..., step_reached: _Optional[int] = ..., checkpoint: _Optional[bool] = ...) -> None: ...

class TransferEndpoint(_message.Message):
    __slots__ = ("backend", "address", "replica_id")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    backend: str
    address: str
    replica_id: str
    def __init__(self, backend: _Optional[str] = ..., address: _Optional[str] = ..., replica_id: _Optional[str] = ...) -> None: ...
