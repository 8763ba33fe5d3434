from fastvideo3.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PullRequest(_message.Message):
    __slots__ = ("ref", "chunk_bytes")
    REF_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    ref: _common_pb2.TensorRef
    chunk_bytes: int
    def __init__(self, ref: _Optional[_Union[_common_pb2.TensorRef, _Mapping]] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("offset", "data", "last", "checksum")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    last: bool
    checksum: str
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ..., checksum: _Optional[str] = ...) -> None: ...
