"""The transport seam: how pool-resident tensors move between pools.

One protocol, :class:`Transport`, with five sibling backends (``inproc``, ``cuda_ipc``, ``shm``,
``grpc``, ``nixl``). A pool owns one transport object per backend it serves; the same object is both the
*owner* side (publishes its tensors as :class:`~fastvideo3.transport.ref.TensorRef`) and the
*reader* side (fetches refs other pools published). The scheduler only ever sees refs.

:func:`choose_backend` picks the backend two ends share (from the capabilities each end
advertises, e.g. in a pool's Describe reply); :func:`make_transport` builds one by name.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

import torch

from fastvideo3.errors import FailedPrecondition, InvalidRequest
from fastvideo3.transport.ref import TensorRef

BACKENDS = ("inproc", "cuda_ipc", "shm", "grpc", "nixl")
# Preference, best first: one process (inproc), one host with GPUs at both ends (cuda_ipc),
# one host (shm), across hosts (nixl), anywhere (grpc). A backend is only a candidate where
# both ends offer it: a pool offers cuda_ipc only when it has a CUDA device.
DEFAULT_ORDER = ("inproc", "cuda_ipc", "shm", "nixl", "grpc")
# Backends that need both ends on one host (sharing /dev/shm; for cuda_ipc also the GPUs).
SAME_HOST = ("shm", "cuda_ipc")


@runtime_checkable
class Transport(Protocol):
    """Moves tensors from the pool that owns them to the pool that needs them.

    Owner side
      ``publish(request_id, name, tensor) -> TensorRef``
          Snapshot ``tensor`` into a buffer owned by this transport (a slab buffer reused
          across requests; ``inproc`` keeps the tensor itself, zero-copy) and return a validated
          ref. The buffer is keyed by ``request_id``; the tensor must not be mutated afterwards
          (``inproc`` shares its storage). Each call makes a new buffer with a new ``buffer_id``.
      ``release(request_id) -> int``
          Free every buffer of that request (slabs go back to the pool); returns how many.
          Called when the request ends, whatever way it ends. Idempotent.
      ``release_ref(ref) -> bool``
          Free one buffer early; False if it was already gone.

    Reader side
      ``fetch(ref, *, deadline_s, copy=False, out=None) -> torch.Tensor``
          Pull the bytes, verify the checksum named in the ref, return a tensor with the ref's
          dtype and shape on this transport's ``device``. ``deadline_s`` (seconds, > 0) bounds
          the whole call. ``copy=False`` lets a backend return a view whose contents stay
          valid only while the owner holds the request (``inproc``: the owner's storage;
          ``shm``: a copy-on-write mapping of the owner's segment); ``copy=True`` always
          returns private memory. ``grpc`` and ``nixl`` always return private memory.
          ``out`` (a contiguous tensor of the ref's dtype and shape, on any device) receives
          the bytes instead and is returned: a pool that keeps a warm buffer avoids a fresh
          allocation (whose first touch costs more than the copy on small hosts). If the
          fetch fails, ``out`` holds unspecified bytes.
          Raises:
            ``DataLoss``          checksum (or length) mismatch; nothing is kept.
            ``DeadlineExceeded``  the deadline passed (a hung peer), or ``deadline_s <= 0``.
            ``Unavailable``       the owner cannot be reached (gone, refused, transfer error).
            ``NotFound``          the owner answered but no longer holds that buffer.
            ``InvalidRequest``    the ref is malformed or belongs to another backend.
          On any failure every reader-side resource of that fetch is released (a destination
          buffer a peer might still write into is quarantined, never reused).

    Both
      ``close()``  release every request and every slab; idempotent.
      ``stats() -> dict``  counters, at least: ``buffers_created``, ``buffers_released``,
          ``resident_buffers``, ``resident_bytes``, ``slabs_created``, ``slabs_destroyed``,
          ``slab_bytes``, ``fetches``, ``fetch_bytes``, ``fetch_errors``,
          ``checksum_failures``, ``served``, ``served_bytes``. After every request is
          released, ``buffers_created == buffers_released`` and ``resident_* == 0``.

    Attributes: ``backend`` (its name in :data:`BACKENDS`), ``owner`` (the owner name put in
    refs), ``device`` (where fetched tensors land).
    """

    backend: str
    owner: str
    device: torch.device

    def publish(self, request_id: str, name: str, tensor: torch.Tensor) -> TensorRef: ...

    def release(self, request_id: str) -> int: ...

    def release_ref(self, ref: TensorRef) -> bool: ...

    def fetch(self, ref: TensorRef, *, deadline_s: float, copy: bool = False,
              out: torch.Tensor | None = None) -> torch.Tensor: ...

    def close(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...


# --------------------------------------------------------------------------- capabilities

def _default_host_id() -> str:
    return socket.gethostname()


_PROCESS_TOKEN = (os.getpid(), uuid.uuid4().hex[:12])


def _process_id() -> str:
    # A forked child inherits the module, so the token is re-made when the pid changes.
    global _PROCESS_TOKEN
    if _PROCESS_TOKEN[0] != os.getpid():
        _PROCESS_TOKEN = (os.getpid(), uuid.uuid4().hex[:12])
    return f"{os.getpid()}-{_PROCESS_TOKEN[1]}"


def available_backends() -> tuple[str, ...]:
    """Backends this process can run (``nixl`` only when the package is importable,
    ``cuda_ipc`` only with a CUDA device)."""
    found = ["inproc", "shm"]
    if torch.cuda.is_available():
        found.insert(1, "cuda_ipc")
    if importlib.util.find_spec("grpc") is not None:
        found.append("grpc")
    if any(importlib.util.find_spec(m) is not None for m in ("nixl", "nixl_cu13", "nixl_cu12")):
        found.append("nixl")
    return tuple(found)


@dataclass(frozen=True)
class TransportCaps:
    """What one endpoint can do: backend names plus where it runs.

    ``shm`` and ``cuda_ipc`` need both ends on one host (same ``host_id``: containers that do
    not share ``/dev/shm``, or for ``cuda_ipc`` the GPUs, must advertise different ids); ``inproc`` needs the same ``process_id``.
    """

    backends: tuple[str, ...]
    host_id: str
    process_id: str
    extra: Mapping[str, str] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {"backends": list(self.backends), "host_id": self.host_id,
                "process_id": self.process_id, "extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TransportCaps":
        try:
            return cls(tuple(data["backends"]), str(data["host_id"]), str(data["process_id"]),
                       dict(data.get("extra") or {}))
        except (KeyError, TypeError) as exc:
            raise InvalidRequest(f"bad transport caps: {exc}", field="caps") from None


def local_caps(backends: Iterable[str] | None = None, *, host_id: str | None = None) -> TransportCaps:
    """Caps of this process: the given backends (default: all available) on this host."""
    names = tuple(backends) if backends is not None else available_backends()
    for name in names:
        if name not in BACKENDS:
            raise InvalidRequest(f"unknown transport backend {name!r}", field="transport.backends",
                                 limit=", ".join(BACKENDS))
    return TransportCaps(names, host_id or _default_host_id(), _process_id())


def feasible_backends(local: TransportCaps, peer: TransportCaps) -> set[str]:
    """Backends both ends support and that can work between where they run."""
    common = set(local.backends) & set(peer.backends)
    if local.process_id != peer.process_id:
        common.discard("inproc")
    if local.host_id != peer.host_id:
        common.difference_update(SAME_HOST)
    return common


def choose_backend(
    local: TransportCaps,
    peer: TransportCaps,
    preferred: str | None = None,
    order: Sequence[str] = DEFAULT_ORDER,
) -> str:
    """Pick the backend to move tensors between ``local`` and ``peer``.

    ``preferred`` is an operator override: it is used if feasible, otherwise this raises
    ``FailedPrecondition`` (an explicit choice is never silently replaced). Without it, the
    first feasible name in ``order`` wins: inproc (same process) > cuda_ipc (same host, GPUs at
    both ends) > shm (same host) > nixl (across hosts) > grpc.
    """
    feasible = feasible_backends(local, peer)
    if preferred is not None:
        if preferred not in BACKENDS:
            raise InvalidRequest(f"unknown transport backend {preferred!r}",
                                 field="transport.preferred", limit=", ".join(BACKENDS))
        if preferred not in feasible:
            raise FailedPrecondition(
                f"preferred transport {preferred!r} is not usable between these endpoints",
                field="transport.preferred", limit=", ".join(sorted(feasible)) or "none")
        return preferred
    for name in order:
        if name in feasible:
            return name
    raise FailedPrecondition("no transport backend is shared by both endpoints",
                             field="transport.backends",
                             details={"local": list(local.backends), "peer": list(peer.backends)})


# --------------------------------------------------------------------------- registry

_FACTORIES: dict[str, str | Callable[..., Transport]] = {
    "inproc": "fastvideo3.transport.inproc:InprocTransport",
    "shm": "fastvideo3.transport.shm:ShmTransport",
    "grpc": "fastvideo3.transport.grpc_bytes:GrpcBytesTransport",
    "nixl": "fastvideo3.transport.nixl_backend:NixlTransport",
    "cuda_ipc": "fastvideo3.transport.cuda_ipc:CudaIpcTransport",
}


def register_backend(name: str, factory: Callable[..., Transport]) -> None:
    """Add (or replace) a backend factory, e.g. a fake in tests."""
    _FACTORIES[name] = factory


def make_transport(backend: str, **cfg: Any) -> Transport:
    """Build a transport by backend name; ``cfg`` goes to its constructor (``owner=`` at least).

    Backends import lazily, so a process that never uses NIXL never loads it.
    """
    try:
        factory = _FACTORIES[backend]
    except KeyError:
        raise InvalidRequest(f"unknown transport backend {backend!r}", field="transport.backend",
                             limit=", ".join(sorted(_FACTORIES))) from None
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory(**cfg)
