"""gRPC streaming-bytes transport: the fallback that works wherever gRPC does.

Owner: ``publish`` copies the tensor into a host slab; the buffer is served by the unary-stream
method ``/fastvideo3.v1.TensorTransfer/Fetch`` (raw bytes in and out, no protobuf): the
request is ``b"<owner>\\n<buffer_id>"``, the reply a stream of chunks of at most
:data:`CHUNK_BYTES`. Pools mount the method on the gRPC server they already run with
:meth:`GrpcBytesTransport.add_to_server` (sync or ``grpc.aio`` servers) and advertise that
server's address; or the transport runs its own small server (``listen="host:port"``).

Reader: ``fetch`` streams the chunks into a fresh tensor under a gRPC timeout equal to the
time left before the deadline, then the checksum is verified. gRPC status maps to typed
errors: ``DEADLINE_EXCEEDED`` -> ``DeadlineExceeded``, ``NOT_FOUND`` -> ``NotFound``, anything
else (refused, reset, peer gone) -> ``Unavailable``. A buffer being served is pinned: a
``release`` during a stream frees it when the stream ends.
"""
from __future__ import annotations

import threading
from concurrent import futures

import grpc
import numpy as np
import torch

from fastvideo3.errors import (
    DataLoss, DeadlineExceeded, FailedPrecondition, InvalidRequest, NotFound, Unavailable,
)
from fastvideo3.transport import checksum as _checksum
from fastvideo3.transport.ledger import Deadline, TransportBase
from fastvideo3.transport.ref import TensorRef
from fastvideo3.transport.slab import SlabPool

SERVICE = "fastvideo3.v1.TensorTransfer"
METHOD = "Fetch"
FULL_METHOD = f"/{SERVICE}/{METHOD}"
CHUNK_BYTES = 1 << 20
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 4 * CHUNK_BYTES),
    ("grpc.max_send_message_length", 4 * CHUNK_BYTES),
]
#: how readers dial owners: ``fn(address, options) -> grpc.Channel``. Plaintext by default; a
#: process serving with TLS and/or a token sets its own (services/common/auth.py) at startup.
_channel_factory = None


def set_channel_factory(factory) -> None:
    """Dial owners with ``factory(address, options)`` (process-wide setting, not per request)."""
    global _channel_factory
    _channel_factory = factory


class GrpcBytesTransport(TransportBase):
    """Chunked gRPC byte streaming (see module docstring).

    ``listen``: start an own server on that address (``"127.0.0.1:0"`` picks a port).
    ``advertise``: the address readers dial (default: the own server's bound address). Without
    ``listen`` the caller mounts :meth:`add_to_server` on its server and passes ``advertise``.
    """

    backend = "grpc"
    verifies_in_fetch = True

    def __init__(self, owner: str, *, listen: str | None = None, advertise: str | None = None,
                 device: str | torch.device | None = "cpu", checksum: str = "auto",
                 max_cached_bytes: int = 1 << 30, server_workers: int = 8) -> None:
        super().__init__(owner, device=device, checksum=checksum)
        self._slabs = SlabPool(lambda cap: torch.empty(cap, dtype=torch.uint8), lambda buf: None,
                               max_cached_bytes=max_cached_bytes)
        self._channels: dict[str, grpc.Channel] = {}
        self._channels_lock = threading.Lock()
        self._server: grpc.Server | None = None
        self.serve_hook = None  # test hook: fn(request_id) called before a buffer is served
        self.address = advertise
        if listen is not None:
            self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=server_workers),
                                       options=_CHANNEL_OPTIONS)
            self.add_to_server(self._server)
            port = self._server.add_insecure_port(listen)
            if port == 0:
                raise Unavailable(f"cannot listen on {listen!r}", field="transport.listen")
            self._server.start()
            if self.address is None:
                self.address = f"{listen.rsplit(':', 1)[0]}:{port}"

    # ------------------------------------------------------------------ server side
    def add_to_server(self, server) -> None:
        """Mount ``TensorTransfer/Fetch`` on an existing ``grpc.Server`` or ``grpc.aio.Server``."""
        if isinstance(server, grpc.aio.Server):
            behavior = self._serve_async
        else:
            behavior = self._serve_sync
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            METHOD: grpc.unary_stream_rpc_method_handler(
                behavior, request_deserializer=None, response_serializer=None),
        })
        server.add_generic_rpc_handlers((handler,))

    def _resolve(self, request: bytes):
        owner, _, buffer_id = bytes(request).decode("utf-8", "replace").partition("\n")
        if owner != self.owner:
            return None, f"this server's owner is {self.owner!r}, not {owner!r}"
        entry = self._pin(buffer_id)
        if entry is None:
            return None, f"{self.owner} holds no buffer {buffer_id!r}"
        return entry, ""

    def _chunks(self, entry):
        slab, nbytes = entry.payload
        view = memoryview(slab.handle[:nbytes].numpy())
        for start in range(0, nbytes, CHUNK_BYTES):
            yield bytes(view[start:start + CHUNK_BYTES])

    def _serve_sync(self, request: bytes, context):
        entry, why = self._resolve(request)
        if entry is None:
            context.abort(grpc.StatusCode.NOT_FOUND, why)
        try:
            if self.serve_hook is not None:
                self.serve_hook(entry.request_id)
            yield from self._chunks(entry)
            self._count("served")
            self._count("served_bytes", entry.ref.nbytes)
        finally:
            self._unpin(entry)

    async def _serve_async(self, request: bytes, context):
        entry, why = self._resolve(request)
        if entry is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, why)
        try:
            for chunk in self._chunks(entry):
                yield chunk
            self._count("served")
            self._count("served_bytes", entry.ref.nbytes)
        finally:
            self._unpin(entry)

    # ------------------------------------------------------------------ owner
    def _staging_device(self, tensor: torch.Tensor) -> torch.device:
        return torch.device("cpu")  # device tensors are staged in host memory

    def _publish(self, buffer_id: str, tensor: torch.Tensor, csum_algo: str):
        if not self.address:
            raise FailedPrecondition("grpc transport has no advertised address: pass listen= or "
                                     "advertise= and mount add_to_server()", field="transport.advertise")
        nbytes = tensor.numel() * tensor.element_size()
        slab = self._slabs.acquire(nbytes)
        try:
            data = slab.handle[:nbytes]
            if nbytes:
                data.copy_(_checksum.byte_view(tensor))
            csum = _checksum.compute(data, csum_algo)
        except BaseException:
            self._slabs.give_back(slab)
            raise
        return (slab, nbytes), csum, {"address": self.address}

    def _free(self, payload) -> None:
        self._slabs.give_back(payload[0])

    def _resident_bytes(self, ref: TensorRef) -> torch.Tensor:
        slab, nbytes = self._lookup(ref).payload
        return slab.handle[:nbytes]

    def _backend_stats(self):
        return self._slabs.stats()

    def _close_backend(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        with self._channels_lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
        self._slabs.clear()

    # ------------------------------------------------------------------ reader
    def _channel(self, address: str) -> grpc.Channel:
        with self._channels_lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = (_channel_factory(address, _CHANNEL_OPTIONS) if _channel_factory is not None
                           else grpc.insecure_channel(address, options=_CHANNEL_OPTIONS))
                self._channels[address] = channel
            return channel

    def _fetch(self, ref: TensorRef, deadline: Deadline, copy: bool,
               out: torch.Tensor | None) -> torch.Tensor:
        address = ref.descriptor.get("address")
        if not isinstance(address, str) or not address:
            raise InvalidRequest("grpc descriptor needs 'address'", field="descriptor.address")
        deadline.check(f"grpc fetch of {ref.buffer_id}")
        call = self._channel(address).unary_stream(
            FULL_METHOD, request_serializer=None, response_deserializer=None)
        host = out if out is not None and out.device.type == "cpu" else torch.empty(
            ref.shape, dtype=ref.torch_dtype)
        dst = self._bytes_of(host).numpy()
        pos = 0
        stream = call(f"{ref.owner}\n{ref.buffer_id}".encode(), timeout=max(deadline.remaining(), 1e-3))
        try:
            for chunk in stream:
                end = pos + len(chunk)
                if end > ref.nbytes:
                    raise DataLoss(f"{ref.owner} sent more than {ref.nbytes} bytes for {ref.buffer_id}",
                                   field="nbytes")
                dst[pos:end] = np.frombuffer(chunk, dtype=np.uint8)
                pos = end
        except grpc.RpcError as exc:
            raise _typed(exc, ref, deadline) from None
        finally:
            stream.cancel()  # no-op when complete; frees the call on any early exit
        if pos != ref.nbytes:
            raise DataLoss(f"{ref.owner} sent {pos} of {ref.nbytes} bytes for {ref.buffer_id}",
                           field="nbytes")
        self._verify(host, ref)
        return out.copy_(host) if out is not None and out is not host else host


def _typed(exc: grpc.RpcError, ref: TensorRef, deadline: Deadline):
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    what = f"grpc fetch of {ref.owner}:{ref.buffer_id} from {ref.descriptor.get('address')}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"{what}: deadline of {deadline.deadline_s:.3f}s exceeded",
                                field="deadline_s", limit=f"{deadline.deadline_s:.3f}s")
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(f"{what}: {detail}", field="buffer_id")
    return Unavailable(f"{what}: {code.name if code else 'error'}: {detail}", field="owner")
