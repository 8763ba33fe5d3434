"""CUDA IPC transport: pools on one host read each other's VRAM directly.

Owner: tensors are copied into *slabs*, device buffers taken from a per-device slab pool. A slab
is exported once, when it is created (PyTorch's own CUDA storage sharing: an IPC handle of the
allocation plus the slab's offset in it), and its export string travels in every ref to it. The
owner also keeps a small *generation table* in POSIX shared memory: one slot per live slab with
``(epoch, generation)``. ``epoch`` names the slab incarnation (unique per owner process);
``generation`` is the buffer currently published in it (0: none). ``publish`` writes the data,
waits for the copy, then sets the generation; ``release`` clears the generation before the slab
can be reused; destroying a slab clears its slot. The owner holds an exclusive ``flock`` on the
table for its whole life: the kernel drops it when the process dies, however it dies.

Reader: per fetch it checks the owner is alive (a non-blocking shared ``flock`` on the table
succeeds only when the owner is gone -> ``Unavailable``), checks the slot still holds the ref's
``(epoch, generation)`` (else ``NotFound``: released or slab reused), maps the slab once (mapping
cached per ``(table, epoch)``; dropped when the slot shows the slab was destroyed), copies the
region and verifies the checksum in the same pass (one Triton kernel for ``fsum64`` refs), then
re-reads the slot: a release that raced the copy is a ``NotFound``, never stale data.

``copy=False`` returns a zero-copy view of the owner's slab, verified, and *pinned*: the reader
holds a shared lock on the slab's byte of the generation table (an open-file-description lock,
dropped by the kernel if the reader dies) until the last tensor sharing the view's memory is
freed; the owner never reuses or frees a slab whose byte is locked (a new slab is taken instead).
So a view never sees another buffer's bytes. Its contents are what was published; after the
owner releases the request, new fetches of the ref fail, while an existing view stays valid
(until the reader transport closes, which drops its pins). Views are read-only by contract:
they are the owner's memory.

Both ends must share the host's POSIX shared memory (``/dev/shm``) and the GPU(s): in a
cluster, pods on one node with ``hostIPC`` (or a shared ``/dev/shm``) and the devices visible.
A reader on another GPU of the host opens the handle on the owner's device (by UUID) and copies
peer to peer.

The device layer is a seam: :class:`CudaLayer` (the real one) or :class:`HostLayer` (host
memory in shared memory, used by the CPU tests to exercise every path of this backend except
the CUDA calls themselves).
"""
from __future__ import annotations

import base64
import fcntl
import functools
import json
import mmap
import os
import struct
import threading
import uuid
import weakref
from multiprocessing import resource_tracker

import _posixshmem
import torch

from fastvideo3.errors import DataLoss, InvalidRequest, NotFound, ResourceExhausted, Unavailable
from fastvideo3.transport import checksum as _checksum
from fastvideo3.transport import device_checksum as _device_checksum
from fastvideo3.transport.ledger import Deadline, TransportBase
from fastvideo3.transport.ref import TensorRef
from fastvideo3.transport.slab import SlabPool

TABLE_SLOTS = 4096
_HEADER = struct.Struct("<8sQ")
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on Linux x86_64/aarch64 (l_pid must be 0 for OFD locks)
_TABLE_MAGIC = b"FV3IPCT1"
_TABLE_BYTES = _HEADER.size + 16 * TABLE_SLOTS


# --------------------------------------------------------------------------- device layers

class CudaLayer:
    """Slabs in VRAM, shared with PyTorch's CUDA storage sharing (legacy CUDA IPC handles)."""

    name = "cuda"

    def alloc(self, capacity: int, device: torch.device) -> tuple[torch.Tensor, str]:
        buf = torch.empty(capacity, dtype=torch.uint8, device=device)
        (dev, handle, size, offset, rc_handle, rc_offset, ev_handle, ev_sync) = buf.untyped_storage()._share_cuda_()
        export = {"dev": int(dev), "uuid": str(torch.cuda.get_device_properties(dev).uuid),
                  "h": _b64(handle), "size": int(size), "off": int(offset), "rc": _b64(rc_handle),
                  "rco": int(rc_offset), "ev": _b64(ev_handle), "evs": bool(ev_sync)}
        return buf, json.dumps(export, separators=(",", ":"))

    def open(self, export: str, reader_device: torch.device | None) -> torch.Tensor:
        e = json.loads(export)
        dev = _local_index(e["uuid"], e["dev"], reader_device)
        storage = torch.UntypedStorage._new_shared_cuda(
            dev, _unb64(e["h"]), e["size"], e["off"], _unb64(e["rc"]), e["rco"], _unb64(e["ev"]), e["evs"])
        return torch.empty(0, dtype=torch.uint8, device=f"cuda:{dev}").set_(storage, 0, (e["size"],), (1,))

    def free(self, buf: torch.Tensor) -> None:
        del buf  # back to PyTorch's allocator (held until readers drop their mappings)

    def view(self, slab: torch.Tensor, nbytes: int, on_free) -> torch.Tensor:
        """A tensor over ``slab[:nbytes]`` with its own storage; ``on_free`` runs when the last
        tensor sharing that storage is gone."""
        region = _CudaRegion(slab, nbytes)
        weakref.finalize(region, on_free)
        return torch.as_tensor(region)


class HostLayer:
    """Slabs in host shared memory: a stand-in for VRAM so the CPU tests exercise this backend's
    tables, checks and caches across real processes. Not a production backend (``shm`` is)."""

    name = "host"

    def alloc(self, capacity: int, device: torch.device) -> tuple[torch.Tensor, str]:
        from fastvideo3.transport.shm import _Segment
        seg = _Segment(f"fv3ipc-{uuid.uuid4().hex[:16]}", capacity)
        buf = seg.u8
        buf._fv3_segment = seg  # the segment lives as long as its tensor is in the slab
        return buf, json.dumps({"segment": seg.name, "size": capacity})

    def open(self, export: str, reader_device: torch.device | None) -> torch.Tensor:
        e = json.loads(export)
        fd = _posixshmem.shm_open("/" + e["segment"], os.O_RDWR, mode=0)
        try:
            mm = mmap.mmap(fd, e["size"])
        finally:
            os.close(fd)
        return torch.frombuffer(mm, dtype=torch.uint8)

    def free(self, buf: torch.Tensor) -> None:
        seg = getattr(buf, "_fv3_segment", None)
        if seg is not None:
            seg.destroy()

    def view(self, slab: torch.Tensor, nbytes: int, on_free) -> torch.Tensor:
        array = slab.numpy()[:nbytes]  # a new array object; torch keeps it alive
        weakref.finalize(array, on_free)
        return torch.from_numpy(array)


class _CudaRegion:
    """``__cuda_array_interface__`` over part of a mapped slab (keeps the mapping alive)."""

    def __init__(self, slab: torch.Tensor, nbytes: int) -> None:
        self.slab = slab
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "strides": None,
                                         "data": (slab.data_ptr(), False), "version": 2}


def _b64(raw) -> str:
    return base64.b64encode(raw if isinstance(raw, bytes) else bytes(raw or b"")).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _local_index(dev_uuid: str, dev: int, reader_device: torch.device | None) -> int:
    """The owner's GPU as this process numbers it (device indices differ per process)."""
    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid) == dev_uuid:
            return i
    # Not visible here: CUDA still opens the handle, mapped through the reader's own device.
    if reader_device is not None and reader_device.type == "cuda":
        return reader_device.index if reader_device.index is not None else torch.cuda.current_device()
    return dev


# --------------------------------------------------------------------------- generation table

class _Table:
    """The owner's (epoch, generation) slots in POSIX shared memory, plus its liveness lock."""

    def __init__(self, name: str, *, create: bool) -> None:
        self.name = name
        flags = (os.O_CREAT | os.O_EXCL | os.O_RDWR) if create else os.O_RDONLY
        self.fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        try:
            if create:
                os.ftruncate(self.fd, _TABLE_BYTES)
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until this process ends
                self.mm = mmap.mmap(self.fd, _TABLE_BYTES)
                _HEADER.pack_into(self.mm, 0, _TABLE_MAGIC, TABLE_SLOTS)
                resource_tracker.register("/" + name, "shared_memory")
            else:
                if os.fstat(self.fd).st_size < _TABLE_BYTES:
                    raise Unavailable(f"generation table {name!r} is not initialised", field="descriptor.table")
                self.mm = mmap.mmap(self.fd, _TABLE_BYTES, prot=mmap.PROT_READ)
                if _HEADER.unpack_from(self.mm, 0)[0] != _TABLE_MAGIC:
                    raise Unavailable(f"{name!r} is not a generation table", field="descriptor.table")
        except BaseException:
            os.close(self.fd)
            raise
        self.slots = memoryview(self.mm)[_HEADER.size:].cast("Q")  # 8-byte aligned: atomic on x86

    def read(self, slot: int) -> tuple[int, int]:
        return self.slots[2 * slot], self.slots[2 * slot + 1]

    def write(self, slot: int, epoch: int | None = None, generation: int | None = None) -> None:
        if epoch is not None:
            self.slots[2 * slot] = epoch
        if generation is not None:
            self.slots[2 * slot + 1] = generation

    def _lock_byte(self, kind: int, slot: int) -> bool:
        try:
            fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, slot, 1, 0))
            return True
        except (BlockingIOError, PermissionError):
            return False

    def pin(self, slot: int) -> bool:
        """Reader: a shared lock on the slot's byte (the owner will not reuse that slab)."""
        return self._lock_byte(fcntl.F_RDLCK, slot)

    def unpin(self, slot: int) -> None:
        self._lock_byte(fcntl.F_UNLCK, slot)

    def pinned(self, slot: int) -> bool:
        """Owner: whether some reader pins the slot (probe with an exclusive lock, then drop it)."""
        if not self._lock_byte(fcntl.F_WRLCK, slot):
            return True
        self._lock_byte(fcntl.F_UNLCK, slot)
        return False

    def owner_alive(self) -> bool:
        """True while the owner holds its exclusive lock (a reader's shared lock then fails)."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return False

    def close(self, *, unlink: bool) -> None:
        self.slots.release()
        try:
            self.mm.close()
        except BufferError:
            pass
        os.close(self.fd)
        if unlink:
            try:
                _posixshmem.shm_unlink("/" + self.name)
            except FileNotFoundError:
                pass
            resource_tracker.unregister("/" + self.name, "shared_memory")


class _IpcSlab:
    __slots__ = ("buf", "export", "slot", "epoch")

    def __init__(self, buf: torch.Tensor, export: str, slot: int, epoch: int) -> None:
        self.buf, self.export, self.slot, self.epoch = buf, export, slot, epoch


# --------------------------------------------------------------------------- the transport

class CudaIpcTransport(TransportBase):
    """CUDA IPC transport (see module docstring)."""

    backend = "cuda_ipc"
    verifies_in_fetch = True

    def __init__(self, owner: str, *, device: str | torch.device | None = None, checksum: str = "auto",
                 max_cached_bytes: int = 1 << 30, layer: str = "cuda") -> None:
        if layer not in ("cuda", "host"):
            raise InvalidRequest(f"layer must be cuda or host, not {layer!r}", field="transport.layer")
        if layer == "cuda" and not torch.cuda.is_available():
            raise Unavailable("cuda_ipc needs a CUDA device in this process", field="transport.backend")
        if device is None:
            device = "cuda" if layer == "cuda" else "cpu"
        super().__init__(owner, device=device, checksum=checksum)
        self.layer = CudaLayer() if layer == "cuda" else HostLayer()
        self._max_cached = max_cached_bytes
        self._pools: dict[str, SlabPool] = {}
        self._lock2 = threading.RLock()  # view finalizers may run (via GC) while it is held
        self._table: _Table | None = None  # owner side, made on first publish
        self._free_slots = list(range(TABLE_SLOTS - 1, -1, -1))
        self._epoch = 0
        self._tables: dict[str, _Table] = {}  # reader side, by name
        self._maps: dict[tuple[str, int], torch.Tensor] = {}  # (table, epoch) -> mapped slab
        self._pins: dict[tuple[str, int], int] = {}  # (table, slot) -> live views pinning it
        self.maps_opened = 0
        self.maps_dropped = 0
        self.views_pinned = 0

    # ------------------------------------------------------------------ owner
    def _owner_table(self) -> _Table:
        with self._lock2:
            if self._table is None:
                self._table = _Table(f"fv3ipc-{uuid.uuid4().hex[:16]}", create=True)
            return self._table

    def _slab_device(self, tensor: torch.Tensor) -> torch.device:
        if self.layer.name == "host":
            return torch.device("cpu")
        if tensor.device.type == "cuda":
            return tensor.device
        if self.device is not None and self.device.type == "cuda":
            return self.device
        raise InvalidRequest("cuda_ipc publishes CUDA tensors (or needs a CUDA device)", field="tensor.device")

    def _staging_device(self, tensor: torch.Tensor) -> torch.device:
        return self._slab_device(tensor)

    def _pool(self, device: torch.device) -> SlabPool:
        key = str(device)
        with self._lock2:
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = SlabPool(lambda cap: self._create_slab(cap, device), self._destroy_slab,
                                                   max_cached_bytes=self._max_cached, can_reuse=self._reusable)
            return pool

    def _create_slab(self, capacity: int, device: torch.device) -> _IpcSlab:
        table = self._owner_table()
        with self._lock2:
            if not self._free_slots:
                raise ResourceExhausted(f"cuda_ipc: more than {TABLE_SLOTS} live slabs", field="transport.slabs",
                                        limit=str(TABLE_SLOTS))
            slot = self._free_slots.pop()
            self._epoch += 1
            epoch = self._epoch
        try:
            buf, export = self.layer.alloc(capacity, device)
        except BaseException:
            with self._lock2:
                self._free_slots.append(slot)
            raise
        table.write(slot, epoch=epoch, generation=0)
        return _IpcSlab(buf, export, slot, epoch)

    def _reusable(self, slab: _IpcSlab) -> bool:
        return self._table is None or not self._table.pinned(slab.slot)

    def _destroy_slab(self, slab: _IpcSlab) -> None:
        if self._table is not None:
            self._table.write(slab.slot, epoch=0, generation=0)
        with self._lock2:
            self._free_slots.append(slab.slot)
        buf, slab.buf = slab.buf, None
        self.layer.free(buf)

    def _publish(self, buffer_id: str, tensor: torch.Tensor, csum_algo: str):
        device = self._slab_device(tensor)
        nbytes = tensor.numel() * tensor.element_size()
        pool = self._pool(device)
        slab = pool.acquire(max(nbytes, 1))
        try:
            ipc: _IpcSlab = slab.handle
            data = ipc.buf[:nbytes]
            src = _checksum.byte_view(tensor)
            if src.device != data.device:
                src = src.to(data.device)
            digest = None
            if csum_algo == "fsum64" and nbytes:
                digest = _device_checksum.copy_and_fsum64(data, src)
            if digest is None:
                if nbytes:
                    data.copy_(src)
                csum = _checksum.compute(data, csum_algo)
            else:
                csum = "fsum64:" + digest
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()  # readers copy on their own streams
            gen = self._next_generation()
            self._table.write(ipc.slot, generation=gen)
        except BaseException:
            pool.give_back(slab)
            raise
        descriptor = {"table": self._table.name, "slot": ipc.slot, "epoch": ipc.epoch, "generation": gen,
                      "layer": self.layer.name, "export": ipc.export}
        return (pool, slab), csum, descriptor

    def _free(self, payload) -> None:
        pool, slab = payload
        if self._table is not None:
            self._table.write(slab.handle.slot, generation=0)  # stale readers now see "released"
        pool.give_back(slab)

    def _resident_bytes(self, ref: TensorRef) -> torch.Tensor:
        _pool, slab = self._lookup(ref).payload
        return slab.handle.buf[:ref.nbytes]

    # ------------------------------------------------------------------ reader
    def _reader_table(self, name: str) -> _Table:
        with self._lock2:
            table = self._tables.get(name)
        if table is not None:
            return table
        try:
            table = _Table(name, create=False)
        except FileNotFoundError:
            raise Unavailable(f"cuda_ipc owner table {name!r} is gone (owner exited)",
                              field="descriptor.table") from None
        with self._lock2:
            return self._tables.setdefault(name, table)

    def _drop_maps(self, table: str, epoch: int | None = None) -> None:
        with self._lock2:
            keys = [k for k in self._maps if k[0] == table and (epoch is None or k[1] == epoch)]
            for k in keys:
                del self._maps[k]
            self.maps_dropped += len(keys)
            if epoch is None:
                stale = self._tables.pop(table, None)
        if epoch is None and stale is not None:
            stale.close(unlink=False)

    def _pin(self, table: _Table, slot: int) -> bool:
        key = (table.name, slot)
        with self._lock2:
            count = self._pins.get(key, 0)
            if count == 0 and not table.pin(slot):
                return False
            self._pins[key] = count + 1
            return True

    def _unpin(self, table: _Table, slot: int) -> None:
        key = (table.name, slot)
        with self._lock2:
            count = self._pins.get(key, 0) - 1
            if count > 0:
                self._pins[key] = count
                return
            self._pins.pop(key, None)
            if count == 0 and self._tables.get(table.name) is table:
                table.unpin(slot)

    def _check_slot(self, table: _Table, ref: TensorRef, slot: int, epoch: int, gen: int) -> None:
        slots = table.slots
        now_epoch, now_gen = slots[2 * slot], slots[2 * slot + 1]
        if now_epoch == epoch and now_gen == gen:  # the common case, first
            return
        if now_epoch != epoch:
            self._drop_maps(table.name, epoch)
            raise NotFound(f"{ref.owner} destroyed the slab of {ref.buffer_id}", field="buffer_id")
        if now_gen != gen:
            raise NotFound(f"{ref.owner} released {ref.buffer_id} (slab reused)", field="buffer_id")

    def _mapping(self, table: str, epoch: int, export: str) -> torch.Tensor:
        key = (table, epoch)
        with self._lock2:
            slab = self._maps.get(key)
        if slab is None:
            try:
                slab = self.layer.open(export, self.device)
            except (FileNotFoundError, RuntimeError, OSError, ValueError, KeyError) as exc:
                raise Unavailable(f"cannot map the owner's slab: {exc}", field="descriptor.export") from None
            with self._lock2:
                slab = self._maps.setdefault(key, slab)
                self.maps_opened += 1
        return slab

    def _fetch(self, ref: TensorRef, deadline: Deadline, copy: bool, out: torch.Tensor | None) -> torch.Tensor:
        d = ref.descriptor
        for key, kind in (("table", str), ("slot", int), ("epoch", int), ("generation", int), ("layer", str),
                          ("export", str)):
            if not isinstance(d.get(key), kind):
                raise InvalidRequest(f"cuda_ipc descriptor needs {key!r}", field=f"descriptor.{key}")
        if d["layer"] != self.layer.name:
            raise InvalidRequest(f"ref's device layer is {d['layer']!r}, this reader's is {self.layer.name!r}",
                                 field="descriptor.layer", limit=self.layer.name)
        if not 0 <= d["slot"] < TABLE_SLOTS:
            raise InvalidRequest("descriptor slot out of range", field="descriptor.slot", limit=f"< {TABLE_SLOTS}")
        deadline.check(f"cuda_ipc fetch of {ref.buffer_id}")
        table = self._reader_table(d["table"])
        if not table.owner_alive():
            self._drop_maps(table.name)
            raise Unavailable(f"cuda_ipc owner {ref.owner} has exited", field="owner")
        slot, epoch, gen, nbytes = d["slot"], d["epoch"], d["generation"], ref.nbytes
        algo = ref.checksum.split(":", 1)[0]
        if out is None and not copy:  # pin first, then check: one check suffices for a view
            return self._pinned_view(table, ref, slot, epoch, gen, d["export"], algo)
        self._check_slot(table, ref, slot, epoch, gen)
        slab = self._mapping(table.name, epoch, d["export"])
        if slab.numel() < nbytes:
            raise InvalidRequest("descriptor region exceeds the slab", field="descriptor.export")
        src = slab[:nbytes]
        device = out.device if out is not None else (self.device or src.device)
        result = out if out is not None else torch.empty(ref.shape, dtype=ref.torch_dtype, device=device)
        dst = self._bytes_of(result)
        digest = None
        if algo == "fsum64" and nbytes:
            digest = _device_checksum.copy_and_fsum64(dst, src)  # one pass; returns after the copy
        if digest is not None:
            got = "fsum64:" + digest
        else:
            if nbytes:
                dst.copy_(src)
            if algo != "none":
                got = _checksum.compute(dst, algo)  # reads the digest back: the copy is done
            else:
                got = ref.checksum
                if result.device.type == "cuda":
                    torch.cuda.current_stream(result.device).synchronize()
        # The owner may have released (and reused) the slab while we copied: check again.
        self._check_slot(table, ref, slot, epoch, gen)
        if got != ref.checksum:
            raise _mismatch(ref, got)
        return result

    def _pinned_view(self, table: _Table, ref: TensorRef, slot: int, epoch: int, gen: int,
                     export: str, algo: str) -> torch.Tensor:
        """Zero-copy: pin the slab, check it still holds the ref, map it (once per slab), verify,
        hand out a view whose last reference unpins it (see the module docstring)."""
        if not self._pin(table, slot):
            raise NotFound(f"{ref.owner} is reusing the slab of {ref.buffer_id}", field="buffer_id")
        pinned = True
        try:
            self._check_slot(table, ref, slot, epoch, gen)
            slab = self._mapping(table.name, epoch, export)
            if slab.numel() < ref.nbytes:
                raise InvalidRequest("descriptor region exceeds the slab", field="descriptor.export")
            src = slab[:ref.nbytes]
            got = _verify_digest(src, algo, ref.checksum)
            if got != ref.checksum:
                raise _mismatch(ref, got)
            view = self.layer.view(slab, ref.nbytes, functools.partial(self._unpin, table, slot))
            pinned = False  # the view's finalizer owns the pin now
            with self._lock2:
                self.views_pinned += 1
            return view.view(ref.torch_dtype).reshape(ref.shape)
        finally:
            if pinned:
                self._unpin(table, slot)

    # ------------------------------------------------------------------ both
    def _backend_stats(self):
        totals = {"slabs_created": 0, "slabs_destroyed": 0, "slab_bytes": 0, "slab_bytes_free": 0}
        with self._lock2:
            pools = list(self._pools.values())
            mapped = len(self._maps)
        for pool in pools:
            for key, value in pool.stats().items():
                totals[key] += value
        with self._lock2:
            pins = sum(self._pins.values())
        totals.update({"layer": self.layer.name, "mapped_slabs": mapped, "maps_opened": self.maps_opened,
                       "maps_dropped": self.maps_dropped, "views_pinned": self.views_pinned, "live_pins": pins})
        return totals

    def _close_backend(self) -> None:
        with self._lock2:
            pools = list(self._pools.values())
            tables = list(self._tables.values())
            self._tables.clear()
            self._maps.clear()
            self._pins.clear()  # closing a table's descriptor drops its locks
        for pool in pools:
            pool.clear()
        for table in tables:
            table.close(unlink=False)
        if self._table is not None:
            self._table.close(unlink=True)
            self._table = None



def _verify_digest(src_u8: torch.Tensor, algo: str, expected: str) -> str:
    """The digest of a flat byte region, through the device kernel where it runs."""
    if algo == "none":
        return expected
    if algo == "fsum64" and src_u8.device.type == "cuda":
        digest = _device_checksum.fsum64(src_u8)
        if digest is not None:
            return "fsum64:" + digest
    return _checksum.compute(src_u8, algo)


def _mismatch(ref: TensorRef, got: str) -> DataLoss:
    return DataLoss(f"checksum mismatch for {ref.owner}:{ref.buffer_id}: expected {ref.checksum}, got {got}",
                    field="checksum", details={"expected": ref.checksum, "got": got})
