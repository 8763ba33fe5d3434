"""The transport plane: ``TensorRef`` plus the backends that move pool-resident tensors.

Start at :mod:`fastvideo3.transport.base` (the ``Transport`` contract, ``choose_backend``,
``make_transport``). Backends: ``inproc`` (one process, zero-copy), ``cuda_ipc`` (GPUs of one
host, VRAM to VRAM), ``shm`` (one host), ``grpc`` (anywhere gRPC reaches), ``nixl`` (UCX: RDMA /
CUDA IPC / CMA / TCP).
"""
from fastvideo3.transport.base import (
    BACKENDS,
    DEFAULT_ORDER,
    Transport,
    TransportCaps,
    available_backends,
    choose_backend,
    feasible_backends,
    local_caps,
    make_transport,
    register_backend,
)
from fastvideo3.transport.ref import DTYPES, TensorRef, dtype_name, torch_dtype

__all__ = [
    "BACKENDS", "DEFAULT_ORDER", "DTYPES", "TensorRef", "Transport", "TransportCaps",
    "available_backends", "choose_backend", "dtype_name", "feasible_backends", "local_caps",
    "make_transport", "register_backend", "torch_dtype",
]
