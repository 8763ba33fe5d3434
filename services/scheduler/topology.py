"""The fleet's topology: which transport backend each edge (producer pool -> consumer pool) uses.

Per edge the configured backend wins (``--transport`` / ``--edge-transport`` / fleet.yaml); it
must be feasible between every producer replica and every consumer replica, else startup fails
with FAILED_PRECONDITION naming the edge. ``auto`` picks the first backend in (cuda_ipc, shm,
nixl, grpc) that every pair can use: CUDA IPC between GPU pools on one host, shared memory for
host tensors on one host, NIXL across hosts (GPU pools offer it when it is installed), gRPC
bytes otherwise. An edge without a consumer pool is
``inline`` (the decoder returns the encoded file in its StepResult).
"""
from __future__ import annotations

from fastvideo3.errors import FailedPrecondition
from fastvideo3.transport.base import TransportCaps, choose_backend, feasible_backends
from services.common.transport_set import AUTO_ORDER
from services.scheduler.config import EDGES, SchedulerConfig


def caps_of(description) -> TransportCaps:
    from services.common.description import transport_caps
    return transport_caps(description)


def choose_edges(cfg: SchedulerConfig, caps: dict[str, list[TransportCaps]]) -> dict[str, str]:
    """``{"encoder->denoiser": "shm", ...}`` for every edge whose producer pool exists."""
    edges: dict[str, str] = {}
    for producer, consumer in EDGES:
        name = f"{producer}->{consumer}"
        if producer not in caps:
            continue
        if consumer not in caps:
            edges[name] = "inline"
            continue
        wanted = cfg.edge_backend(producer, consumer)
        pairs = [(p, c) for p in caps[producer] for c in caps[consumer]]
        if wanted != "auto":
            for p, c in pairs:
                try:
                    choose_backend(p, c, preferred=wanted)
                except FailedPrecondition as e:
                    raise FailedPrecondition(f"edge {name}: {e.message}", field=f"transport.{name}",
                                             limit=e.limit) from None
            edges[name] = wanted
            continue
        common = set(AUTO_ORDER)
        for p, c in pairs:
            common &= feasible_backends(p, c)
        choice = next((b for b in AUTO_ORDER if b in common), None)
        if choice is None:
            raise FailedPrecondition(f"edge {name}: no transport every replica pair can use", field=f"transport.{name}",
                                     limit=", ".join(AUTO_ORDER))
        edges[name] = choice
    return edges


def output_transport(edges: dict[str, str], role: str) -> str:
    """The backend a pool of ``role`` publishes with ("" when its outputs only go inline)."""
    for producer, consumer in EDGES:
        if producer == role:
            backend = edges.get(f"{producer}->{consumer}", "")
            return "" if backend == "inline" else backend
    return ""
