"""Checksums over a tensor's bytes, named by algorithm: ``"<algo>:<hex>"``.

Cheap on purpose: a checksum guards a transfer against corruption and stale reuse, it is not
a security boundary. The owner picks the algorithm (``"auto"``), the reader recomputes the one
named in the ref, so both ends never have to agree beforehand.

- ``xxh3_64``  host memory, ~10 GB/s per core (needs the ``xxhash`` package).
- ``crc32``    host memory, zlib; the fallback when ``xxhash`` is missing (~2 GB/s).
- ``fsum64``   any device, computed where the tensor lives (no device->host copy of the data):
               two 64-bit wrap-around sums over the 32-bit little-endian words,
               ``s1 = sum(w_i)`` and ``s2 = sum(i * w_i)`` (i from 1). Integer sums are exact and
               order-independent, so a GPU and a CPU compute the same digest. On a CUDA device
               one Triton kernel does it in one pass (``transport.device_checksum``); elsewhere
               torch integer ops do.
- ``none``     no check (an explicit opt-out; never the default).
"""
from __future__ import annotations

import zlib

import torch

from fastvideo3.errors import DataLoss, FailedPrecondition
from fastvideo3.transport import device_checksum as _device

try:  # optional accelerator for host checksums
    import xxhash as _xxhash
except ImportError:  # pragma: no cover - depends on the environment
    _xxhash = None

ALGORITHMS = ("xxh3_64", "crc32", "fsum64", "none")
_MASK64 = (1 << 64) - 1
_FSUM_CHUNK_WORDS = 1 << 24  # bounds the int64 temporaries to 128 MiB per chunk


def host_algorithm() -> str:
    """The best checksum for host memory available in this process."""
    return "xxh3_64" if _xxhash is not None else "crc32"


def pick_algorithm(requested: str, device: torch.device) -> str:
    """Resolve a configured algorithm (``"auto"`` or a name) for a tensor on ``device``."""
    if requested == "auto":
        return "fsum64" if device.type != "cpu" else host_algorithm()
    if requested not in ALGORITHMS:
        raise FailedPrecondition(f"unknown checksum algorithm {requested!r}",
                                 field="transport.checksum", limit=", ".join(("auto",) + ALGORITHMS))
    if requested == "xxh3_64" and _xxhash is None:
        raise FailedPrecondition("checksum xxh3_64 needs the xxhash package", field="transport.checksum")
    return requested


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a tensor's bytes (a contiguous copy only if it is not contiguous)."""
    if tensor.dtype == torch.uint8 and tensor.dim() == 1 and tensor.is_contiguous() and not tensor.requires_grad:
        return tensor  # already flat bytes (a mapped slab region): the hot path of a verified fetch
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


def _host_bytes(data: torch.Tensor):
    if data.device.type != "cpu":
        data = data.cpu()  # slow path: a host algorithm over device memory
    return memoryview(data.numpy())


def _fsum64(data: torch.Tensor) -> str:
    if data.device.type == "cuda":
        digest = _device.fsum64(data)
        if digest is not None:
            return digest
    return fsum64_torch(data)


def fsum64_torch(data: torch.Tensor) -> str:
    """fsum64 of a flat uint8 tensor with plain torch integer ops (the reference form)."""
    n = data.numel()
    n4 = n - n % 4
    s1 = s2 = 0
    if n4:
        body = data[:n4]
        if body.data_ptr() % 4:
            body = body.clone()
        words = body.view(torch.int32)
        for start in range(0, words.numel(), _FSUM_CHUNK_WORDS):
            w = words[start:start + _FSUM_CHUNK_WORDS].to(torch.int64) & 0xFFFFFFFF
            idx = torch.arange(start + 1, start + 1 + w.numel(), dtype=torch.int64, device=w.device)
            s1 += int(w.sum().item())
            s2 += int((w * idx).sum().item())
    if n != n4:  # trailing bytes form one zero-padded little-endian word
        tail = bytes(data[n4:].cpu().tolist())
        w = int.from_bytes(tail.ljust(4, b"\0"), "little")
        s1 += w
        s2 += w * (n4 // 4 + 1)
    return f"{s1 & _MASK64:016x}{s2 & _MASK64:016x}"


def compute(tensor: torch.Tensor, algorithm: str) -> str:
    """``"<algo>:<hex>"`` over the bytes of ``tensor`` (any dtype, any device, may be empty)."""
    data = byte_view(tensor)
    if algorithm == "xxh3_64":
        if _xxhash is None:
            raise FailedPrecondition("checksum xxh3_64 needs the xxhash package", field="checksum")
        return "xxh3_64:" + _xxhash.xxh3_64_hexdigest(_host_bytes(data))
    if algorithm == "crc32":
        return f"crc32:{zlib.crc32(_host_bytes(data)) & 0xFFFFFFFF:08x}"
    if algorithm == "fsum64":
        return "fsum64:" + _fsum64(data)
    if algorithm == "none":
        return "none:"
    raise FailedPrecondition(f"unknown checksum algorithm {algorithm!r}", field="checksum",
                             limit=", ".join(ALGORITHMS))


def verify(tensor: torch.Tensor, expected: str, *, what: str = "tensor") -> None:
    """Recompute the algorithm named in ``expected``; raise ``DataLoss`` when it differs."""
    algorithm = expected.split(":", 1)[0]
    if algorithm == "none":
        return
    got = compute(tensor, algorithm)
    if got != expected:
        raise DataLoss(f"checksum mismatch for {what}: expected {expected}, got {got}",
                       field="checksum", details={"expected": expected, "got": got})
