"""ctypes mirror of ``include/fastvideo3/runtime.h``: the C structs, field for field.

Only layout lives here (the producer that fills these structs is :mod:`fastvideo3.export.native`).
A unit test compiles a probe against the header and compares every field's offset and every
struct's size with this mirror, so the two cannot drift apart silently.
"""
from __future__ import annotations

import ctypes
from ctypes import (
    CFUNCTYPE, POINTER, Structure, c_char_p, c_int32, c_int64, c_uint32, c_uint64, c_void_p,
)

import torch

RUNTIME_ABI_VERSION = 1
MODEL_RUNTIME_ABI_VERSION = 1
MAX_DIMS = 8

# status codes (enum in the header)
OK, ERR_INVALID_ARGUMENT, ERR_RELEASED, ERR_UNKNOWN_PORT = 0, 1, 2, 3
ERR_UNAVAILABLE, ERR_NOT_PREPARED, ERR_NO_EXTENSION, ERR_INTERNAL = 4, 5, 6, 7

DEVICE_CPU, DEVICE_CUDA = 1, 2
PORT_SWAP, PORT_STAGED, PORT_SETUP = 1, 2, 3
PORT_IN, PORT_OUT = 1, 2
EXTENSION_BUCKETS = 1

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float64: 4,
    torch.int64: 5, torch.int32: 6, torch.uint8: 7, torch.bool: 8,
}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}

RetainFn = CFUNCTYPE(c_int32, c_void_p)
SetInputFn = CFUNCTYPE(c_int32, c_void_p, c_char_p, c_void_p, c_uint64)
GetOutputFn = CFUNCTYPE(c_int32, c_void_p, c_char_p, c_void_p, c_uint64)
PrepareFn = CFUNCTYPE(c_int32, c_void_p, c_char_p)
StepFn = CFUNCTYPE(c_int32, c_void_p)
LastErrorFn = CFUNCTYPE(c_void_p, c_void_p)  # const char*; c_void_p so ctypes keeps no copy
QueryExtensionFn = CFUNCTYPE(c_int32, c_void_p, c_uint32, POINTER(c_void_p), POINTER(c_uint64))

Shape = c_int64 * MAX_DIMS


class Stream(Structure):
    _fields_ = [("name", c_char_p), ("native_handle", c_void_p), ("device_type", c_int32),
                ("device_index", c_int32)]


class Graph(Structure):
    _fields_ = [("name", c_char_p), ("bucket", c_char_p), ("exec_handle", c_void_p),
                ("stream_index", c_uint32), ("reserved", c_uint32)]


class Buffer(Structure):
    _fields_ = [("name", c_char_p), ("data", c_void_p), ("nbytes", c_uint64), ("dtype", c_uint32),
                ("device_type", c_int32), ("device_index", c_int32), ("ndim", c_uint32),
                ("shape", Shape)]


class StateRegion(Structure):
    _fields_ = [("name", c_char_p), ("buffer_index", c_uint32), ("dtype", c_uint32),
                ("offset", c_uint64), ("nbytes", c_uint64), ("ndim", c_uint32),
                ("reserved", c_uint32), ("shape", Shape)]


class RuntimeExportV1(Structure):
    _fields_ = [
        ("abi_version", c_uint32), ("struct_size", c_uint32), ("identity", c_char_p),
        ("fingerprint", c_uint64), ("manifest_json", c_char_p),
        ("num_streams", c_uint32), ("num_graphs", c_uint32), ("num_buffers", c_uint32),
        ("num_regions", c_uint32),
        ("streams", POINTER(Stream)), ("graphs", POINTER(Graph)), ("buffers", POINTER(Buffer)),
        ("regions", POINTER(StateRegion)),
        ("owner", c_void_p), ("retain", RetainFn), ("release", RetainFn),
    ]


class Port(Structure):
    _fields_ = [("name", c_char_p), ("bucket", c_char_p), ("direction", c_uint32),
                ("update", c_uint32), ("dtype", c_uint32), ("buffer_index", c_int32),
                ("nbytes", c_uint64), ("ndim", c_uint32), ("reserved", c_uint32), ("shape", Shape)]


class Stage(Structure):
    _fields_ = [("graph", c_char_p), ("num_after", c_uint32), ("reserved", c_uint32),
                ("after", POINTER(c_char_p))]


class ModelVerbsV1(Structure):
    _fields_ = [("set_input", SetInputFn), ("get_output", GetOutputFn), ("prepare", PrepareFn),
                ("step", StepFn)]


class ModelRuntimeV1(Structure):
    _fields_ = [
        ("abi_version", c_uint32), ("struct_size", c_uint32), ("exp", POINTER(RuntimeExportV1)),
        ("num_ports", c_uint32), ("num_stages", c_uint32),
        ("ports", POINTER(Port)), ("stages", POINTER(Stage)),
        ("ctx", c_void_p), ("verbs", ModelVerbsV1), ("last_error", LastErrorFn),
        ("retain", RetainFn), ("release", RetainFn),
        # ---- end of the v1 base ----
        ("query_extension", QueryExtensionFn),
    ]


class BucketTableV1(Structure):
    _fields_ = [("num_buckets", c_uint32), ("reserved", c_uint32), ("buckets", POINTER(c_char_p))]


def field_end(struct: type[Structure], name: str) -> int:
    f = getattr(struct, name)
    return f.offset + f.size


#: the base prefix of the model-runtime struct (ends at ``release``)
MODEL_RUNTIME_V1_BASE_SIZE = field_end(ModelRuntimeV1, "release")
#: struct_size from which ``query_extension`` may be read
MODEL_RUNTIME_V1_QUERY_EXTENSION_SIZE = field_end(ModelRuntimeV1, "query_extension")

#: every mirrored struct, by its C type name (the layout test walks this)
STRUCTS: dict[str, type[Structure]] = {
    "fv3_stream_v1": Stream, "fv3_graph_v1": Graph, "fv3_buffer_v1": Buffer,
    "fv3_state_region_v1": StateRegion, "fv3_runtime_export_v1": RuntimeExportV1,
    "fv3_port_v1": Port, "fv3_stage_v1": Stage, "fv3_model_verbs_v1": ModelVerbsV1,
    "fv3_model_runtime_v1": ModelRuntimeV1, "fv3_bucket_table_v1": BucketTableV1,
}


def fill_shape(dst: ctypes.Array, shape: tuple[int, ...], what: str) -> int:
    """Write ``shape`` into a fixed ``int64[MAX_DIMS]`` array; returns ndim."""
    from fastvideo3.errors import InvalidRequest
    if len(shape) > MAX_DIMS:
        raise InvalidRequest(f"{len(shape)} dimensions", field=what, limit=str(MAX_DIMS))
    for i, d in enumerate(shape):
        dst[i] = int(d)
    return len(shape)
