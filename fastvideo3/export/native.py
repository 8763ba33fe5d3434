"""The producer of the C ABI: fills ``fv3_runtime_export_v1`` / ``fv3_model_runtime_v1``.

:class:`NativeModelRuntime` takes a :class:`~fastvideo3.export.ModelRuntime` and lays it out as
the plain-data structs of ``include/fastvideo3/runtime.h`` (mirrored in :mod:`fastvideo3.export.cabi`):

* identity is the runtime's canonical string and fingerprint is its
  :attr:`~fastvideo3.export.RuntimeIdentity.fingerprint` -- the one FNV-1a implementation; this
  module never hashes anything;
* streams and graph exec handles are the CUDA ones on a GPU (``NULL`` on a CPU), one graph entry
  per (graph name, shape bucket); an entry's handle is filled once its bucket is prepared;
* buffers are the export's tensors (device pointers on a GPU); state regions point into the
  buffer named :data:`STATE_BUFFER`, in the export's region order;
* ports are one entry per (port, bucket); verbs move raw bytes in and out.

Lifetime: construction validates everything, then retains the model runtime once; the caller
gets one native reference. ``retain``/``release`` through the structs (or :meth:`retain` /
:meth:`release` here) move a thread-safe count; the last release drops the model runtime's
reference and the structs' memory. The callbacks are ctypes ``CFUNCTYPE`` thunks, which take
the GIL themselves, so a native host may release from any thread. Graph execs are
process-local: the host runs in the producer's process (it loads a shared library and is
handed :attr:`NativeModelRuntime.ptr`).
"""
from __future__ import annotations

import ctypes
import itertools
import json
import math
import threading
from typing import Any, Iterable, Mapping

import torch

from fastvideo3.errors import InvalidRequest
from fastvideo3.export import cabi
from fastvideo3.export.errors import (
    BucketNotPrepared, ExportReleased, RegionLayoutError, UnknownPort, VerbUnavailable,
)
from fastvideo3.export.graphs import GraphRunner
from fastvideo3.export.ports import Direction, UpdateClass, Verbs
from fastvideo3.export.regions import arena_size, dtype_of
from fastvideo3.export.model_runtime import ModelRuntime, _Lifetime, _RefCounted

#: the export buffer that holds the state regions (their offsets are into it)
STATE_BUFFER = "state"

_ANCHORS: dict[int, "NativeModelRuntime"] = {}  # ctx key -> live producer (keeps structs alive)
_ANCHOR_LOCK = threading.Lock()
_KEYS = itertools.count(1)
_LAST_ERROR = threading.local()


def _status(exc: BaseException) -> int:
    if isinstance(exc, ExportReleased):
        return cabi.ERR_RELEASED
    if isinstance(exc, UnknownPort):
        return cabi.ERR_UNKNOWN_PORT
    if isinstance(exc, BucketNotPrepared):
        return cabi.ERR_NOT_PREPARED
    if isinstance(exc, VerbUnavailable):
        return cabi.ERR_UNAVAILABLE
    if isinstance(exc, InvalidRequest):
        return cabi.ERR_INVALID_ARGUMENT
    return cabi.ERR_INTERNAL


def _call(ctx: int | None, fn) -> int:
    """Run ``fn(producer)`` for a callback; exceptions become status codes (never unwind into C)."""
    try:
        native = _ANCHORS.get(int(ctx or 0))
        if native is None:
            raise ExportReleased("native runtime was used after its final release")
        fn(native)
        _LAST_ERROR.buf = None
        return cabi.OK
    except BaseException as exc:  # noqa: BLE001 - nothing may propagate through a C frame
        field = getattr(exc, "field", None)
        msg = f"{type(exc).__name__}: {exc}" + (f" (field {field})" if field else "")
        _LAST_ERROR.buf = ctypes.create_string_buffer(msg.encode("utf-8", "replace"))
        return _status(exc)


@cabi.RetainFn
def _retain_cb(ctx):
    return _call(ctx, lambda n: n.retain())


@cabi.RetainFn
def _release_cb(ctx):
    return _call(ctx, lambda n: n.release())


@cabi.SetInputFn
def _set_input_cb(ctx, port, data, nbytes):
    return _call(ctx, lambda n: n._set_input_bytes(port.decode(), data, int(nbytes)))


@cabi.GetOutputFn
def _get_output_cb(ctx, port, dst, nbytes):
    return _call(ctx, lambda n: n._get_output_bytes(port.decode(), dst, int(nbytes)))


@cabi.PrepareFn
def _prepare_cb(ctx, bucket):
    return _call(ctx, lambda n: n._prepare(bucket.decode() if bucket else ""))


@cabi.StepFn
def _step_cb(ctx):
    return _call(ctx, lambda n: n.runtime.step())


@cabi.LastErrorFn
def _last_error_cb(ctx):
    buf = getattr(_LAST_ERROR, "buf", None)
    if buf is None:
        _LAST_ERROR.buf = buf = ctypes.create_string_buffer(b"")
    return ctypes.addressof(buf)


@cabi.QueryExtensionFn
def _query_extension_cb(ctx, ext_id, table, size):
    def run(n: "NativeModelRuntime") -> None:
        if ext_id != cabi.EXTENSION_BUCKETS:
            raise LookupError(f"no extension {ext_id}")
        table[0] = ctypes.addressof(n._bucket_table)
        size[0] = ctypes.sizeof(cabi.BucketTableV1)
    status = _call(ctx, run)
    return cabi.ERR_NO_EXTENSION if status == cabi.ERR_INTERNAL else status


#: calls that reached the query_extension slot of a base-only struct (a host that skipped the
#: size probe); lets a test prove the slot is never read.
UNPROBED_TAIL_CALLS = [0]


@cabi.QueryExtensionFn
def _unprobed_tail_cb(ctx, ext_id, table, size):
    UNPROBED_TAIL_CALLS[0] += 1
    return cabi.ERR_INTERNAL


def _dtype_code(dtype: torch.dtype | str, what: str) -> int:
    code = cabi.DTYPE_CODES.get(dtype_of(dtype))
    if code is None:
        raise InvalidRequest(f"dtype {dtype} has no C code", field=what,
                             limit=", ".join(str(d) for d in cabi.DTYPE_CODES))
    return code


def _device(t: torch.Tensor) -> tuple[int, int]:
    if t.device.type == "cuda":
        return cabi.DEVICE_CUDA, int(t.device.index or 0)
    if t.device.type == "cpu":
        return cabi.DEVICE_CPU, 0
    raise InvalidRequest(f"device {t.device} cannot cross the C ABI", field="buffers")


def _graph_entries(name: str, handle: Any, buckets: Iterable[str]) -> list[tuple[str, str, Any]]:
    if isinstance(handle, GraphRunner):
        keys = sorted(set(buckets) | {str(b) for b in handle.buckets})
        return [(name, b, handle) for b in keys] or [(name, "", handle)]
    return [(name, "", handle)]


def _exec_handle(bucket: str, handle: Any) -> int | None:
    if isinstance(handle, GraphRunner):
        return handle.exec_handle(bucket) if bucket in handle else None
    raw = getattr(handle, "raw_cuda_graph_exec", None)
    return int(raw()) if callable(raw) else None


class NativeModelRuntime(_RefCounted):
    """The C structs of one model runtime, alive while a native reference is held.

    ``streams`` maps a stream name to a ``torch.cuda.Stream`` (graphs are replayed on the first).
    ``with_tails=False`` writes only the v1 base (``struct_size`` = base size): how a producer
    built before the ``query_extension`` tail looks to a host.
    """

    def __init__(
        self,
        runtime: ModelRuntime,
        *,
        streams: Mapping[str, Any] | None = None,
        with_tails: bool = True,
    ) -> None:
        export = runtime.export  # raises ExportReleased on a dead runtime
        self._keep: list[Any] = []
        buffers = dict(export.buffers)
        self._buffer_index = {name: i for i, name in enumerate(buffers)}
        self._buffers = self._fill_buffers(buffers)
        self._regions = self._fill_regions(export.regions, buffers)
        self._streams = self._fill_streams(streams if streams is not None else getattr(export, "streams", {}))
        buckets = sorted({b for p in runtime.ports.values() for b in p.bucket_shapes})
        entries = [e for name, h in export.graphs.items() for e in _graph_entries(name, h, buckets)]
        self._graph_handles = [(bucket, h) for _, bucket, h in entries]
        self._graphs = (cabi.Graph * max(1, len(entries)))()
        for i, (name, bucket, _) in enumerate(entries):
            self._graphs[i].name, self._graphs[i].bucket = name.encode(), bucket.encode()
        self._ports = self._fill_ports(runtime)
        self._stages = self._fill_stages(runtime)
        names = [b.encode() for b in buckets]
        arr = (ctypes.c_char_p * max(1, len(names)))(*names)
        self._keep.append(arr)
        self._bucket_table = cabi.BucketTableV1(len(names), 0, ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)))

        # everything validated: take the reference, then publish
        runtime.retain()
        self.runtime = runtime
        self.key = next(_KEYS)
        self._life = _Lifetime("native model runtime", self._free)
        self.refresh_graphs()
        exp = cabi.RuntimeExportV1()
        exp.abi_version, exp.struct_size = cabi.RUNTIME_ABI_VERSION, ctypes.sizeof(cabi.RuntimeExportV1)
        exp.identity = runtime.identity.canonical().encode("utf-8")
        exp.fingerprint = runtime.fingerprint
        exp.manifest_json = json.dumps(export.manifest, sort_keys=True, default=str).encode("utf-8")
        exp.num_streams, exp.streams = self._num_streams, self._streams
        exp.num_graphs, exp.graphs = len(entries), self._graphs
        exp.num_buffers, exp.buffers = len(buffers), self._buffers
        exp.num_regions, exp.regions = len(export.regions), self._regions
        exp.owner, exp.retain, exp.release = self.key, _retain_cb, _release_cb
        self._export = exp
        m = cabi.ModelRuntimeV1()
        m.abi_version = cabi.MODEL_RUNTIME_ABI_VERSION
        m.exp = ctypes.pointer(exp)
        m.num_ports, m.ports = self._num_ports, self._ports
        m.num_stages, m.stages = len(runtime.stages), self._stages
        m.ctx = self.key
        m.verbs = cabi.ModelVerbsV1(_set_input_cb, _get_output_cb, _prepare_cb, _step_cb)
        m.last_error, m.retain, m.release = _last_error_cb, _retain_cb, _release_cb
        if with_tails:
            m.struct_size = ctypes.sizeof(cabi.ModelRuntimeV1)
            m.query_extension = _query_extension_cb
        else:  # an older producer: the bytes past the base are not part of the struct
            m.struct_size = cabi.MODEL_RUNTIME_V1_BASE_SIZE
            m.query_extension = _unprobed_tail_cb  # whatever lies there must never be called
        self._model = m
        with _ANCHOR_LOCK:
            _ANCHORS[self.key] = self

    # -- struct filling (pure; raises before anything is retained) ----------------------
    def _fill_buffers(self, buffers: Mapping[str, torch.Tensor]) -> ctypes.Array:
        arr = (cabi.Buffer * max(1, len(buffers)))()
        for i, (name, t) in enumerate(buffers.items()):
            if not t.is_contiguous():
                raise InvalidRequest("buffer is not contiguous", field=f"buffers.{name}")
            b = arr[i]
            b.name, b.data, b.nbytes = name.encode(), t.data_ptr(), t.numel() * t.element_size()
            b.dtype = _dtype_code(t.dtype, f"buffers.{name}")
            b.device_type, b.device_index = _device(t)
            b.ndim = cabi.fill_shape(b.shape, tuple(t.shape), f"buffers.{name}.shape")
        return arr

    def _fill_regions(self, regions, buffers: Mapping[str, torch.Tensor]) -> ctypes.Array:
        arr = (cabi.StateRegion * max(1, len(regions)))()
        if not regions:
            return arr
        arena = buffers.get(STATE_BUFFER)
        if arena is None:
            raise RegionLayoutError(f"state regions need a buffer named {STATE_BUFFER!r}", field="buffers")
        have = arena.numel() * arena.element_size()
        if have < arena_size(regions):
            raise RegionLayoutError(f"state buffer holds {have} bytes, regions need {arena_size(regions)}",
                                    field=f"buffers.{STATE_BUFFER}")
        for i, r in enumerate(regions):
            c = arr[i]
            c.name, c.buffer_index = r.name.encode(), self._buffer_index[STATE_BUFFER]
            c.dtype = _dtype_code(r.dtype, f"regions.{r.name}")
            c.offset, c.nbytes = r.offset, r.nbytes
            c.ndim = cabi.fill_shape(c.shape, r.shape, f"regions.{r.name}.shape")
        return arr

    def _fill_streams(self, streams: Mapping[str, Any]) -> ctypes.Array:
        arr = (cabi.Stream * max(1, len(streams)))()
        self._num_streams = len(streams)
        for i, (name, s) in enumerate(streams.items()):
            arr[i].name, arr[i].native_handle = name.encode(), int(s.cuda_stream) or None
            arr[i].device_type, arr[i].device_index = cabi.DEVICE_CUDA, int(s.device.index or 0)
        return arr

    def _fill_ports(self, runtime: ModelRuntime) -> ctypes.Array:
        rows = [(spec, b) for spec in runtime.ports.values()
                for b in (sorted(spec.bucket_shapes) if spec.bucketed else [""])]
        arr = (cabi.Port * max(1, len(rows)))()
        self._num_ports = len(rows)
        for i, (spec, bucket) in enumerate(rows):
            shape = spec.shape_for(bucket or None)
            p = arr[i]
            p.name, p.bucket = spec.name.encode(), bucket.encode()
            p.direction = cabi.PORT_IN if spec.direction is Direction.IN else cabi.PORT_OUT
            p.update = {UpdateClass.SWAP: cabi.PORT_SWAP, UpdateClass.STAGED: cabi.PORT_STAGED,
                        UpdateClass.SETUP: cabi.PORT_SETUP}[spec.update]
            p.dtype = _dtype_code(spec.dtype, f"ports.{spec.name}")
            p.buffer_index = self._buffer_index[spec.buffer] if spec.buffer else -1
            p.nbytes = math.prod(shape) * dtype_of(spec.dtype).itemsize
            p.ndim = cabi.fill_shape(p.shape, shape, f"ports.{spec.name}.shape")
        return arr

    def _fill_stages(self, runtime: ModelRuntime) -> ctypes.Array:
        arr = (cabi.Stage * max(1, len(runtime.stages)))()
        for i, s in enumerate(runtime.stages):
            after = (ctypes.c_char_p * max(1, len(s.after)))(*[a.encode() for a in s.after])
            self._keep.append(after)
            arr[i].graph, arr[i].num_after = s.graph.encode(), len(s.after)
            arr[i].after = ctypes.cast(after, ctypes.POINTER(ctypes.c_char_p))
        return arr

    # -- what a host is handed ------------------------------------------------------------
    @property
    def ptr(self) -> int:
        """Address of the ``fv3_model_runtime_v1`` (valid while a reference is held)."""
        self._life.check()
        return ctypes.addressof(self._model)

    @property
    def export_ptr(self) -> int:
        self._life.check()
        return ctypes.addressof(self._export)

    @property
    def struct(self) -> cabi.ModelRuntimeV1:
        self._life.check()
        return self._model

    def refresh_graphs(self) -> None:
        """Fill each graph entry's exec handle from its runner (after a bucket was prepared)."""
        for i, (bucket, h) in enumerate(self._graph_handles):
            self._graphs[i].exec_handle = _exec_handle(bucket, h) or None

    # -- lifetime (retain, release, refcount: _RefCounted) ----------------------------------
    def _free(self) -> None:
        with _ANCHOR_LOCK:
            _ANCHORS.pop(self.key, None)
        self.runtime.release()

    # -- byte-level verbs ------------------------------------------------------------------
    def _port_shape(self, port: str) -> tuple[Any, tuple[int, ...]]:
        spec = self.runtime.ports.get(port)
        if spec is None:
            raise UnknownPort(f"no port {port!r}", field="port", limit=", ".join(self.runtime.ports))
        if spec.bucketed and self.runtime.bucket is None:
            raise BucketNotPrepared(f"port {port!r} is bucket-keyed; prepare a bucket first", field=port)
        return spec, spec.shape_for(self.runtime.bucket)

    def _set_input_bytes(self, port: str, data: int, nbytes: int) -> None:
        spec, shape = self._port_shape(port)
        dt = dtype_of(spec.dtype)
        want = math.prod(shape) * dt.itemsize
        if nbytes != want:
            raise InvalidRequest(f"port {port!r} takes {want} bytes, got {nbytes}", field=port, limit=str(want))
        raw = bytearray(ctypes.string_at(data, nbytes)) if nbytes else bytearray()
        value = torch.frombuffer(raw, dtype=torch.uint8).view(dt).reshape(shape) if nbytes else \
            torch.empty(shape, dtype=dt)
        if spec.buffer:
            value = value.to(self.runtime.export.buffers[spec.buffer].device)
        self.runtime.set_input(port, value)

    def _get_output_bytes(self, port: str, dst: int, nbytes: int) -> None:
        spec, shape = self._port_shape(port)
        value = self.runtime.get_output(port)
        if not isinstance(value, torch.Tensor):
            raise InvalidRequest(f"port {port!r} did not produce a tensor", field=port)
        flat = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        if nbytes != flat.numel():
            raise InvalidRequest(f"port {port!r} gives {flat.numel()} bytes, buffer has {nbytes}",
                                 field=port, limit=str(flat.numel()))
        if nbytes:
            ctypes.memmove(dst, flat.data_ptr(), nbytes)

    def _prepare(self, bucket: str) -> None:
        self.runtime.prepare(bucket or None)
        self.refresh_graphs()

    def __repr__(self) -> str:
        return f"NativeModelRuntime(refcount={self.refcount}, ptr=0x{ctypes.addressof(self._model):x})"


def live_native_runtimes() -> int:
    """How many native faces are still referenced (lifetime tests)."""
    with _ANCHOR_LOCK:
        return len(_ANCHORS)


__all__ = ["STATE_BUFFER", "NativeModelRuntime", "live_native_runtimes"]
