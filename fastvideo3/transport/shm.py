"""POSIX shared-memory transport for pools on one host.

Owner: ``publish`` copies the tensor into a named segment taken from a per-owner slab pool
(segments are created once, pages reserved with ``posix_fallocate`` so a full ``/dev/shm``
is a clean ``ResourceExhausted`` instead of a SIGBUS later, and reused across requests);
a 64-byte trailer after the data carries a generation number. ``release`` invalidates the
trailer and gives the segment back to the pool; evicted segments are unlinked. The owner
registers its segments with Python's resource tracker so a crashed owner's segments are
unlinked by the tracker.

Reader: ``fetch`` opens the segment by name and maps it copy-on-write (``MAP_PRIVATE``): no
bytes are copied, and writes by the reader never reach the owner. With ``copy=True`` or
``out=`` the bytes are read with ``preadv`` straight into the destination (one kernel copy). The returned tensor keeps
the mapping alive (``torch.frombuffer`` holds it), but its *contents* are the owner's pages:
they stay valid only until the owner releases the request (the segment is then reused). A
reader that keeps the tensor longer must pass ``copy=True`` (or copy it itself). Readers
never register segments with the resource tracker (so a reader's exit never unlinks an
owner's segment — the classic ``multiprocessing.shared_memory`` pitfall on Python < 3.13).
"""
from __future__ import annotations

import mmap
import os
import threading
import uuid
from multiprocessing import resource_tracker

import _posixshmem  # CPython's own shm_open/shm_unlink, as used by multiprocessing.shared_memory
import torch

from fastvideo3.errors import InvalidRequest, NotFound, ResourceExhausted, Unavailable
from fastvideo3.transport import checksum as _checksum
from fastvideo3.transport.ledger import (
    TRAILER_BYTES, TRAILER_MAGIC, Deadline, TransportBase, pack_trailer, slab_bytes_needed,
    trailer_offset, unpack_trailer,
)
from fastvideo3.transport.ref import TensorRef
from fastvideo3.transport.slab import SlabPool

_INVALID_TRAILER = bytes(TRAILER_BYTES)


class _Segment:
    """An owner's mapped segment plus a uint8 tensor over it."""

    __slots__ = ("name", "size", "mm", "u8")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                _posixshmem.shm_unlink("/" + name)
                raise ResourceExhausted(f"cannot reserve {size} bytes of shared memory: {exc}",
                                        field="transport.shm") from None
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        resource_tracker.register("/" + name, "shared_memory")
        self.u8 = torch.frombuffer(self.mm, dtype=torch.uint8)

    def destroy(self) -> None:
        self.u8 = None  # drop our buffer export before closing the map
        try:
            self.mm.close()
        except BufferError:  # a test still holds a view; the map goes with it
            pass
        try:
            _posixshmem.shm_unlink("/" + self.name)
        except FileNotFoundError:
            pass
        resource_tracker.unregister("/" + self.name, "shared_memory")


class ShmTransport(TransportBase):
    """Shared-memory transport (see module docstring)."""

    backend = "shm"
    verifies_in_fetch = True

    def __init__(self, owner: str, *, device: str | torch.device | None = "cpu",
                 checksum: str = "auto", max_cached_bytes: int = 1 << 30) -> None:
        super().__init__(owner, device=device, checksum=checksum)
        self._prefix = f"fv3-{uuid.uuid4().hex[:10]}"
        self._names = 0
        self._names_lock = threading.Lock()
        self._slabs = SlabPool(self._create_segment, lambda seg: seg.destroy(),
                               max_cached_bytes=max_cached_bytes)

    def _create_segment(self, capacity: int) -> _Segment:
        with self._names_lock:
            self._names += 1
            name = f"{self._prefix}-{self._names}"
        return _Segment(name, capacity)

    # ------------------------------------------------------------------ owner
    def _staging_device(self, tensor: torch.Tensor) -> torch.device:
        return torch.device("cpu")  # device tensors are staged in host memory

    def _publish(self, buffer_id: str, tensor: torch.Tensor, csum_algo: str):
        nbytes = tensor.numel() * tensor.element_size()
        slab = self._slabs.acquire(slab_bytes_needed(nbytes))
        try:
            seg: _Segment = slab.handle
            csum, gen = self._stage(seg.u8[:nbytes], tensor, csum_algo)
            off = trailer_offset(nbytes)
            seg.mm[off:off + TRAILER_BYTES] = pack_trailer(gen, nbytes)
        except BaseException:
            self._slabs.give_back(slab)
            raise
        descriptor = {"segment": seg.name, "generation": gen}
        return (slab, gen, off), csum, descriptor

    def _free(self, payload) -> None:
        slab, _gen, off = payload
        slab.handle.mm[off:off + TRAILER_BYTES] = _INVALID_TRAILER
        self._slabs.give_back(slab)

    def _resident_bytes(self, ref: TensorRef) -> torch.Tensor:
        slab, _gen, _off = self._lookup(ref).payload
        return slab.handle.u8[:ref.nbytes]

    def _close_backend(self) -> None:
        self._slabs.clear()

    def _backend_stats(self):
        return self._slabs.stats()

    # ------------------------------------------------------------------ reader
    def _fetch(self, ref: TensorRef, deadline: Deadline, copy: bool,
               out: torch.Tensor | None) -> torch.Tensor:
        name = ref.descriptor.get("segment")
        gen = ref.descriptor.get("generation")
        if not isinstance(name, str) or not isinstance(gen, int):
            raise InvalidRequest("shm descriptor needs 'segment' and 'generation'", field="descriptor")
        deadline.check(f"shm fetch of {ref.buffer_id}")
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0)
        except FileNotFoundError:
            raise Unavailable(f"shared-memory segment {name!r} of {ref.owner} is gone "
                              "(released or owner exited)", field="descriptor.segment") from None
        try:
            off = trailer_offset(ref.nbytes)
            raw = os.pread(fd, TRAILER_BYTES, off) if os.fstat(fd).st_size >= off + TRAILER_BYTES else b""
            if len(raw) != TRAILER_BYTES or unpack_trailer(raw) != (TRAILER_MAGIC, gen, ref.nbytes):
                raise NotFound(f"{ref.owner} released {ref.buffer_id} (segment reused)", field="buffer_id")
            if out is None and not copy and ref.nbytes:
                # Copy-on-write mapping: zero-copy reads, and a reader's writes stay private.
                mm = mmap.mmap(fd, off, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                view = torch.frombuffer(mm, dtype=torch.uint8, count=ref.nbytes)
                self._verify(view, ref)
                return view.view(ref.torch_dtype).reshape(ref.shape)  # holds the mapping
            dst = out if out is not None else torch.empty(ref.shape, dtype=ref.torch_dtype)
            host = dst if dst.device.type == "cpu" else torch.empty(ref.shape, dtype=ref.torch_dtype)
            _read_exact(fd, memoryview(self._bytes_of(host).numpy()), ref)
            self._verify(host, ref)
            return dst.copy_(host) if host is not dst else dst
        finally:
            os.close(fd)


def _read_exact(fd: int, dst: memoryview, ref: TensorRef) -> None:
    """Read the segment's first ``len(dst)`` bytes into ``dst`` (one kernel copy, no mapping)."""
    pos = 0
    while pos < len(dst):
        got = os.preadv(fd, [dst[pos:]], pos)
        if got <= 0:
            raise NotFound(f"segment of {ref.buffer_id} ended early", field="buffer_id")
        pos += got
