"""Ordered state regions, and snapshot / restore bound to a runtime fingerprint.

A state region is a named, typed, fixed-size span of pool-resident state (a request's latent,
its sampler history) at a byte offset in a state arena. The *ordered* list of regions is part
of the runtime identity: a restore matches regions by position, so their order, names, dtypes,
shapes, offsets and sizes are all fingerprinted.

A :class:`Snapshot` is the bytes of every region, in region order, tagged with the fingerprint
of the runtime that produced it. :func:`restore` refuses a snapshot whose fingerprint differs
from the target export's (:class:`FingerprintMismatch`) and validates every region before it
writes any byte, so a refused restore leaves live state untouched.

Wire form (:meth:`Snapshot.to_bytes`): ``MAGIC``, a little-endian u32 header length, a UTF-8
JSON header (version, fingerprint, regions, per-blob CRC32), then the raw blobs back to back.
"""
from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import torch

from fastvideo3.export.errors import (
    BufferMismatch,
    FingerprintMismatch,
    RegionLayoutError,
    SnapshotCorrupt,
)
from fastvideo3.export.identity import fingerprint_hex

if TYPE_CHECKING:  # only .fingerprint and .regions are read, so a ModelRuntime works too
    from fastvideo3.export.model_runtime import ModelRuntime, RuntimeExport

SNAPSHOT_MAGIC = b"FV3SNAP\x00"
SNAPSHOT_VERSION = 1
_LEN = struct.Struct("<I")


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.float32`` or ``"float32"`` -> ``"float32"`` (validated)."""
    return str(dtype_of(dtype)).removeprefix("torch.")


def dtype_of(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise BufferMismatch(f"unknown dtype {dtype!r}", field="dtype")
    return value


def _shape(shape: Iterable[int], what: str) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise RegionLayoutError(f"negative dimension in {dims}", field=what)
    return dims


def _shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


@dataclass(frozen=True)
class StateRegion:
    """One region of restorable state. ``nbytes`` must equal ``numel * itemsize``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def __post_init__(self) -> None:
        if not self.name:
            raise RegionLayoutError("region name must not be empty", field="regions")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        object.__setattr__(self, "shape", _shape(self.shape, f"regions.{self.name}.shape"))
        if self.offset < 0:
            raise RegionLayoutError("negative offset", field=f"regions.{self.name}.offset")
        expected = math.prod(self.shape) * dtype_of(self.dtype).itemsize
        if self.nbytes != expected:
            raise RegionLayoutError(
                f"nbytes {self.nbytes} != numel*itemsize {expected}",
                field=f"regions.{self.name}.nbytes",
            )

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    def identity_fields(self) -> tuple[str, ...]:
        return (self.name, self.dtype, _shape_text(self.shape), str(self.offset), str(self.nbytes))

    def to_json(self) -> dict:
        return {
            "name": self.name, "dtype": self.dtype, "shape": list(self.shape),
            "offset": self.offset, "nbytes": self.nbytes,
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "StateRegion":
        return cls(d["name"], d["dtype"], tuple(d["shape"]), int(d["offset"]), int(d["nbytes"]))

    def check_tensor(self, t: torch.Tensor) -> None:
        if t.dtype != dtype_of(self.dtype) or tuple(t.shape) != self.shape:
            raise BufferMismatch(
                f"tensor {t.dtype}{tuple(t.shape)} does not match region "
                f"{self.dtype}{self.shape}",
                field=f"regions.{self.name}",
            )


def pack_regions(
    specs: Iterable[tuple[str, torch.dtype | str, Sequence[int]]], align: int = 256
) -> tuple[StateRegion, ...]:
    """Lay ``(name, dtype, shape)`` specs out back to back, each offset aligned to ``align``."""
    regions, cursor = [], 0
    for name, dtype, shape in specs:
        cursor = -(-cursor // align) * align
        dims = _shape(shape, f"regions.{name}.shape")
        nbytes = math.prod(dims) * dtype_of(dtype).itemsize
        regions.append(StateRegion(name, dtype_name(dtype), dims, cursor, nbytes))
        cursor += nbytes
    return validate_layout(regions)


def validate_layout(regions: Iterable[StateRegion]) -> tuple[StateRegion, ...]:
    """Unique names, no overlapping spans. Declared order is kept (it is contractual)."""
    regions = tuple(regions)
    seen: set[str] = set()
    for r in regions:
        if not isinstance(r, StateRegion):
            raise RegionLayoutError(f"{r!r} is not a StateRegion", field="regions")
        if r.name in seen:
            raise RegionLayoutError(f"duplicate region {r.name!r}", field="regions")
        seen.add(r.name)
    spans = sorted((r.offset, r.end, r.name) for r in regions if r.nbytes)
    for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:]):
        if start_b < end_a:
            raise RegionLayoutError(f"regions {a!r} and {b!r} overlap", field="regions")
    return regions


def arena_size(regions: Iterable[StateRegion]) -> int:
    return max((r.end for r in regions), default=0)


def arena_views(arena: torch.Tensor, regions: Iterable[StateRegion]) -> dict[str, torch.Tensor]:
    """Typed views of each region into one contiguous ``uint8`` arena (no copies)."""
    regions = tuple(regions)
    if arena.dtype != torch.uint8 or arena.dim() != 1 or not arena.is_contiguous():
        raise BufferMismatch("arena must be a contiguous 1-D uint8 tensor", field="arena")
    if arena.numel() < arena_size(regions):
        raise BufferMismatch(
            f"arena has {arena.numel()} bytes, layout needs {arena_size(regions)}", field="arena"
        )
    views = {}
    for r in regions:
        dt = dtype_of(r.dtype)
        if r.offset % dt.itemsize:
            # A typed view of a byte span needs its offset aligned to the element size.
            raise RegionLayoutError(
                f"offset {r.offset} not aligned to {dt.itemsize}", field=f"regions.{r.name}.offset"
            )
        span = arena[r.offset : r.end]
        views[r.name] = span.view(dt).view(r.shape) if r.nbytes else torch.empty(
            r.shape, dtype=dt, device=arena.device
        )
    return views


def _to_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def _from_bytes(blob: bytes, region: StateRegion) -> torch.Tensor:
    dt = dtype_of(region.dtype)
    if not blob:
        return torch.empty(region.shape, dtype=dt)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).view(dt).reshape(region.shape)


@dataclass(frozen=True)
class Snapshot:
    """Region bytes in region order, bound to the fingerprint of the runtime that wrote them."""

    fingerprint: int
    regions: tuple[StateRegion, ...]
    blobs: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if len(self.regions) != len(self.blobs):
            raise SnapshotCorrupt("one blob per region is required", field="blobs")
        for r, b in zip(self.regions, self.blobs):
            if len(b) != r.nbytes:
                raise SnapshotCorrupt(
                    f"blob of {len(b)} bytes for a {r.nbytes}-byte region", field=f"regions.{r.name}"
                )

    @property
    def fingerprint_hex(self) -> str:
        return fingerprint_hex(self.fingerprint)

    def to_bytes(self) -> bytes:
        header = {
            "version": SNAPSHOT_VERSION,
            "fingerprint": self.fingerprint_hex,
            "regions": [r.to_json() for r in self.regions],
            "crc32": [zlib.crc32(b) for b in self.blobs],
        }
        head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
        return b"".join([SNAPSHOT_MAGIC, _LEN.pack(len(head)), head, *self.blobs])

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> "Snapshot":
        data = memoryview(data)
        start = len(SNAPSHOT_MAGIC) + _LEN.size
        if len(data) < start or bytes(data[: len(SNAPSHOT_MAGIC)]) != SNAPSHOT_MAGIC:
            raise SnapshotCorrupt("not a fastvideo3 snapshot (bad magic)")
        (head_len,) = _LEN.unpack(data[len(SNAPSHOT_MAGIC) : start])
        try:
            header = json.loads(bytes(data[start : start + head_len]).decode("utf-8"))
            if header["version"] != SNAPSHOT_VERSION:
                raise SnapshotCorrupt(f"unsupported snapshot version {header['version']}")
            fingerprint = int(header["fingerprint"], 16)
            regions = tuple(StateRegion.from_json(r) for r in header["regions"])
            crcs = list(header["crc32"])
        except SnapshotCorrupt:
            raise
        except (ValueError, KeyError, TypeError, RegionLayoutError, BufferMismatch) as exc:
            raise SnapshotCorrupt(f"bad snapshot header: {exc}") from exc
        if len(crcs) != len(regions):
            raise SnapshotCorrupt("header lists a different number of checksums and regions")
        cursor, blobs = start + head_len, []
        for r, crc in zip(regions, crcs):
            blob = bytes(data[cursor : cursor + r.nbytes])
            if len(blob) != r.nbytes:
                raise SnapshotCorrupt("snapshot is truncated", field=f"regions.{r.name}")
            if zlib.crc32(blob) != crc:
                raise SnapshotCorrupt("checksum mismatch", field=f"regions.{r.name}")
            blobs.append(blob)
            cursor += r.nbytes
        if cursor != len(data):
            raise SnapshotCorrupt(f"{len(data) - cursor} trailing bytes after the last region")
        return cls(fingerprint, regions, tuple(blobs))


def _ordered(
    tensors: Mapping[str, torch.Tensor] | Sequence[torch.Tensor], regions: tuple[StateRegion, ...]
) -> list[torch.Tensor]:
    if isinstance(tensors, Mapping):
        missing = [r.name for r in regions if r.name not in tensors]
        extra = sorted(set(tensors) - {r.name for r in regions})
        if missing or extra:
            raise BufferMismatch(f"missing regions {missing}, unknown regions {extra}", field="regions")
        out = [tensors[r.name] for r in regions]
    else:
        out = list(tensors)
        if len(out) != len(regions):
            raise BufferMismatch(f"{len(out)} tensors for {len(regions)} regions", field="regions")
    for r, t in zip(regions, out):
        r.check_tensor(t)
    return out


def snapshot(
    region_tensors: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
    export: "RuntimeExport | ModelRuntime",
) -> Snapshot:
    """Copy every region (by name, or positionally in region order) to host bytes."""
    regions = tuple(export.regions)
    tensors = _ordered(region_tensors, regions)
    return Snapshot(export.fingerprint, regions, tuple(_to_bytes(t) for t in tensors))


def restore(
    snap: Snapshot,
    export: "RuntimeExport | ModelRuntime",
    into: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Rebuild region tensors from ``snap``; with ``into``, copy them into live tensors in place.

    Raises :class:`FingerprintMismatch` before touching anything if ``snap`` was written by a
    runtime with another identity (or, defensively, with another region layout).
    """
    if snap.fingerprint != export.fingerprint:
        raise FingerprintMismatch(
            f"snapshot fingerprint {snap.fingerprint_hex} != runtime {fingerprint_hex(export.fingerprint)}",
            field="fingerprint",
            details={"snapshot": snap.fingerprint_hex, "runtime": fingerprint_hex(export.fingerprint)},
        )
    regions = tuple(export.regions)
    if snap.regions != regions:
        raise FingerprintMismatch("snapshot region layout differs from the runtime's", field="regions")
    restored = {r.name: _from_bytes(b, r) for r, b in zip(regions, snap.blobs)}
    if into is None:
        return restored
    live = _ordered(into, regions)  # validates every target before the first write
    for r, dst in zip(regions, live):
        dst.copy_(restored[r.name])
    return {r.name: dst for r, dst in zip(regions, live)}
