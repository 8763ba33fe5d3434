from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class AdapterRef(_message.Message):
    __slots__ = ("id", "scale")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    id: str
    scale: float
    def __init__(self, id: _Optional[str] = ..., scale: _Optional[float] = ...) -> None: ...

class LoadAdapterRequest(_message.Message):
    __slots__ = ("adapter_id", "path")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    path: str
    def __init__(self, adapter_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class AdapterInfo(_message.Message):
    __slots__ = ("adapter_id", "version", "rank", "bytes", "replicas")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    version: str
    rank: int
    bytes: int
    replicas: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, adapter_id: _Optional[str] = ..., version: _Optional[str] = ..., rank: _Optional[int] = ..., bytes: _Optional[int] = ..., replicas: _Optional[_Iterable[str]] = ...) -> None: ...

class UnloadAdapterRequest(_message.Message):
    __slots__ = ("adapter_id", "wait_s")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    wait_s: float
    def __init__(self, adapter_id: _Optional[str] = ..., wait_s: _Optional[float] = ...) -> None: ...

class UnloadAdapterResponse(_message.Message):
    __slots__ = ("adapter_id", "versions")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    versions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, adapter_id: _Optional[str] = ..., versions: _Optional[_Iterable[str]] = ...) -> None: ...
