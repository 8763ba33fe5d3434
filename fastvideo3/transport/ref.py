"""``TensorRef``: the handle the scheduler holds instead of a tensor.

A ref names a buffer that lives in one pool (its *owner*) and says everything a reader needs
to pull it: dtype, shape, size, a checksum of the bytes, which transport backend serves it and
a backend-specific ``descriptor`` (a segment name, an address, NIXL agent metadata...). Refs are
small, immutable and hashable, and inside a process they are always these objects (WorkUnit
inputs, StepResult outputs, loop states, the request context). Their dict form,
:meth:`TensorRef.to_dict` / :meth:`TensorRef.from_dict`, is for JSON only (request checkpoints,
process pipes); on the gRPC wire they are ``v1.TensorRef`` (services/common/convert.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from fastvideo3.errors import InvalidRequest

# The dtypes a ref may carry, by the name torch gives them (``str(torch.float32)`` minus
# the ``torch.`` prefix). Names missing from the installed torch are skipped.
_DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16",
    "float8_e4m3fn", "float8_e5m2",
    "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64",
    "bool", "complex64", "complex128",
)
DTYPES: dict[str, torch.dtype] = {
    n: getattr(torch, n) for n in _DTYPE_NAMES if isinstance(getattr(torch, n, None), torch.dtype)
}
_NAME_OF: dict[torch.dtype, str] = {d: n for n, d in DTYPES.items()}

DescriptorValue = str | int


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of a torch dtype (``torch.bfloat16`` -> ``"bfloat16"``)."""
    try:
        return _NAME_OF[dtype]
    except KeyError:
        raise InvalidRequest(f"dtype {dtype} cannot be transported", field="tensor.dtype",
                             limit=", ".join(sorted(DTYPES))) from None


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a wire name; raises ``InvalidRequest`` naming ``dtype``."""
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise InvalidRequest(f"unknown dtype {name!r}", field="dtype",
                             limit=", ".join(sorted(DTYPES))) from None


def expected_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * torch_dtype(dtype).itemsize


@dataclass(frozen=True)
class TensorRef:
    """An immutable pointer to a pool-resident tensor.

    Fields:
      owner      name of the pool / agent that holds the buffer.
      buffer_id  unique within the owner; released buffers are never renamed to another tensor.
      dtype      torch dtype name (``"float32"``, ``"bfloat16"``...).
      shape      tuple of non-negative ints (``()`` for a 0-d tensor).
      nbytes     exactly ``prod(shape) * itemsize``.
      checksum   ``"<algo>:<hex>"`` over the tensor's bytes (see ``transport.checksum``).
      backend    the transport that serves it (``inproc``/``shm``/``grpc``/``nixl``).
      descriptor backend-specific ``str -> str | int`` map telling a reader where to fetch.
    """

    owner: str
    buffer_id: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    checksum: str
    backend: str
    # Excluded from hashing (dicts are unhashable); still part of equality.
    descriptor: Mapping[str, DescriptorValue] = field(default_factory=dict, hash=False)

    def validate(self) -> "TensorRef":
        """Check every field; raise ``InvalidRequest`` naming the first bad one. Returns self."""
        for name in ("owner", "buffer_id", "backend"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidRequest(f"{name} must be a non-empty string, got {value!r}", field=name)
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise InvalidRequest(f"unknown dtype {self.dtype!r}", field="dtype",
                                 limit=", ".join(sorted(DTYPES)))
        if not isinstance(self.shape, tuple):
            raise InvalidRequest(f"shape must be a tuple, got {type(self.shape).__name__}", field="shape")
        for i, dim in enumerate(self.shape):
            if isinstance(dim, bool) or not isinstance(dim, int):
                raise InvalidRequest(f"shape[{i}] must be an int, got {dim!r}", field="shape")
            if dim < 0:
                raise InvalidRequest(f"shape[{i}] is negative ({dim})", field="shape", limit=">= 0")
        if isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int) or self.nbytes < 0:
            raise InvalidRequest(f"nbytes must be a non-negative int, got {self.nbytes!r}", field="nbytes")
        want = expected_nbytes(self.dtype, self.shape)
        if self.nbytes != want:
            raise InvalidRequest(
                f"nbytes {self.nbytes} disagrees with {self.dtype}{list(self.shape)} = {want} bytes",
                field="nbytes", limit=str(want))
        if not isinstance(self.checksum, str) or ":" not in self.checksum:
            raise InvalidRequest(f"checksum must look like 'algo:hex', got {self.checksum!r}",
                                 field="checksum")
        if not isinstance(self.descriptor, Mapping):
            raise InvalidRequest("descriptor must be a mapping", field="descriptor")
        for key, value in self.descriptor.items():
            if not isinstance(key, str):
                raise InvalidRequest(f"descriptor key {key!r} is not a string", field="descriptor")
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise InvalidRequest(f"descriptor[{key!r}] must be str or int, got {type(value).__name__}",
                                     field="descriptor")
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (lists for tuples) — the form refs take on the wire."""
        return {
            "owner": self.owner,
            "buffer_id": self.buffer_id,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "nbytes": self.nbytes,
            "checksum": self.checksum,
            "backend": self.backend,
            "descriptor": dict(self.descriptor),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TensorRef":
        """Rebuild and validate a ref; a missing or mistyped field raises ``InvalidRequest``."""
        if not isinstance(data, Mapping):
            raise InvalidRequest("a TensorRef must be a mapping", field="ref")
        missing = [k for k in ("owner", "buffer_id", "dtype", "shape", "nbytes", "checksum", "backend")
                   if k not in data]
        if missing:
            raise InvalidRequest(f"missing field {missing[0]!r}", field=missing[0])
        shape = data["shape"]
        if not isinstance(shape, (list, tuple)):
            raise InvalidRequest(f"shape must be a list, got {type(shape).__name__}", field="shape")
        ref = cls(
            owner=data["owner"],
            buffer_id=data["buffer_id"],
            dtype=data["dtype"],
            shape=tuple(shape),
            nbytes=data["nbytes"],
            checksum=data["checksum"],
            backend=data["backend"],
            descriptor=dict(data.get("descriptor") or {}),
        )
        return ref.validate()
