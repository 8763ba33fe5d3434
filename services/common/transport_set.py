"""One pool's transports behind the single Transport interface its executor uses.

A pool offers one or more backends (``--transport shm,grpc`` or ``auto``: see
:func:`parse_backends`). It *publishes* each
unit's outputs through the backend the scheduler chose for the edge to the consuming pool
(``WorkUnit.output_transport``, applied with :meth:`TransportSet.use`), and *fetches* a ref
through whichever backend the ref names (a reader for a backend it does not offer is built on
first use). ``release`` frees a request on every backend.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from fastvideo3.errors import FailedPrecondition, InvalidRequest
from fastvideo3.transport.base import BACKENDS, TransportCaps, available_backends, local_caps, make_transport
from fastvideo3.transport.ref import TensorRef

log = logging.getLogger(__name__)

#: what ``auto`` offers across processes on a host pool: shared memory on one host, gRPC bytes
#: anywhere. A GPU pool (see :func:`parse_backends`) also offers cuda_ipc and, when installed, NIXL.
AUTO_BACKENDS = ("shm", "grpc")
#: the automatic per-edge choice, best first (see services/scheduler/topology.py)
AUTO_ORDER = ("cuda_ipc", "shm", "nixl", "grpc")
_NAMES = "auto, cuda_ipc, shm, grpc, nixl"


def parse_backends(spec: str, device: str | None = "cpu") -> tuple[str, ...]:
    """``auto`` or a comma list of backend names -> the backends a pool offers.

    ``auto`` on a pool whose ``device`` is a GPU offers cuda_ipc (VRAM to VRAM on one host) and,
    when the package is installed, nixl (across hosts), then shm and grpc; on a host pool, shm
    and grpc."""
    if spec in ("", "auto"):
        names = AUTO_BACKENDS
        if device is not None and str(device).startswith("cuda"):
            names = tuple(b for b in ("cuda_ipc", "nixl") if b in available_backends()) + AUTO_BACKENDS
    else:
        names = tuple(s.strip() for s in spec.split(",") if s.strip())
    for n in names:
        if n not in BACKENDS or n == "inproc":
            raise InvalidRequest(f"unknown transport backend {n!r}", field="transport", limit=_NAMES)
    missing = [n for n in names if n not in available_backends()]
    if missing:
        raise FailedPrecondition(f"transport backend {missing[0]!r} is not installed here", field="transport",
                                 limit=", ".join(b for b in available_backends() if b != "inproc"))
    return tuple(dict.fromkeys(names))


class _HandlerShim:
    """Collects the generic handlers a backend mounts, for a server that is already running."""

    def __init__(self, sink: list):
        self.sink = sink

    def add_generic_rpc_handlers(self, handlers) -> None:
        self.sink.extend(handlers)


class TransportSet:
    """The Transport protocol over several backends (see module docstring)."""

    def __init__(self, owner: str, offered: tuple[str, ...], *, advertise: str | None = None,
                 handler_sink: list | None = None, device: str = "cpu", host_id: str | None = None,
                 ucx_report_dir: str | None = None, nixl_error_handling: str | None = None):
        self.owner = owner
        self.offered = tuple(offered)
        self.device = device
        self._host_id = host_id
        self._ucx_report_dir = ucx_report_dir
        self._nixl_error_handling = nixl_error_handling
        self._backends: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        for name in self.offered:
            cfg = self._cfg(name, owner)
            if name == "grpc":
                cfg["advertise"] = advertise
            t = make_transport(name, **cfg)
            if name == "grpc":
                t.add_to_server(_HandlerShim(handler_sink if handler_sink is not None else []))
            self._backends[name] = t
        self.default = self.offered[0] if self.offered else "grpc"
        self.publish_counts: dict[str, int] = {}

    # -- which backend publishes ---------------------------------------------------------
    @property
    def backend(self) -> str:
        return getattr(self._local, "backend", None) or self.default

    @contextlib.contextmanager
    def use(self, backend: str | None):
        """Publish through ``backend`` (one the pool offers) inside the block, on this thread."""
        if backend and backend not in self._backends:
            raise FailedPrecondition(f"this pool does not offer transport {backend!r}", field="output_transport",
                                     limit=", ".join(self.offered))
        prev = getattr(self._local, "backend", None)
        self._local.backend = backend or None
        try:
            yield self
        finally:
            self._local.backend = prev

    def caps(self) -> TransportCaps:
        return local_caps(self.offered, host_id=self._host_id)

    # -- the Transport protocol ----------------------------------------------------------
    def publish(self, request_id: str, name: str, tensor) -> TensorRef:
        backend = self.backend
        ref = self._backends[backend].publish(request_id, name, tensor)
        with self._lock:
            self.publish_counts[backend] = self.publish_counts.get(backend, 0) + 1
        return ref

    def fetch(self, ref: TensorRef, *, deadline_s: float, copy: bool = False):
        return self._reader(ref.backend).fetch(ref, deadline_s=deadline_s, copy=copy)

    def release(self, request_id: str) -> int:
        with self._lock:
            backends = list(self._backends.values())
        return sum(t.release(request_id) for t in backends)

    def release_ref(self, ref: TensorRef) -> bool:
        t = self._backends.get(ref.backend)
        return bool(t is not None and ref.owner == self.owner and t.release_ref(ref))

    def close(self) -> None:
        with self._lock:
            backends, self._backends = list(self._backends.values()), {}
        for t in backends:
            t.close()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            per = {name: t.stats() for name, t in self._backends.items()}
            counts = dict(self.publish_counts)
        total: dict[str, Any] = {"backend": self.default, "owner": self.owner, "offered": list(self.offered),
                                 "published_by_backend": counts, "backends": per}
        for s in per.values():
            for k, v in s.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    total[k] = total.get(k, 0) + v
        return total

    def _cfg(self, backend: str, owner: str) -> dict[str, Any]:
        """Constructor arguments: GPU-capable backends land fetched tensors on the pool's device;
        NIXL reports the UCX transports it selects when a report folder is configured."""
        cfg: dict[str, Any] = {"owner": owner}
        on_gpu = str(self.device).startswith("cuda")
        if backend == "cuda_ipc" or (backend == "nixl" and on_gpu):
            cfg["device"] = self.device if on_gpu else None
        if backend == "nixl" and self._ucx_report_dir:
            cfg["ucx_log_dir"] = self._ucx_report_dir
        if backend == "nixl" and self._nixl_error_handling:
            cfg["ucx_error_handling"] = self._nixl_error_handling
        return cfg

    def _reader(self, backend: str):
        with self._lock:
            t = self._backends.get(backend)
            if t is None:
                if backend not in available_backends() or backend == "inproc":
                    raise InvalidRequest(f"cannot fetch a {backend!r} ref in this pool", field="backend",
                                         limit=", ".join(self.offered))
                log.info("building a %s reader for refs from other pools", backend)
                t = self._backends[backend] = make_transport(backend, **self._cfg(backend, f"{self.owner}/reader-{backend}"))
            return t
