"""fastvideo3: a serving and rollout runtime for video diffusion models.

``fastvideo3.Engine`` runs everything in one process (the embedded mode); the role-pool
services and the scheduler service in ``services/`` run the same code as a gRPC fleet.
"""
__version__ = "0.1.0"

from fastvideo3.models import families as _families  # noqa: E402,F401  registers the built-in model families

__all__ = ["Engine", "Video", "__version__"]


def __getattr__(name: str):  # lazy: importing the package must not import torch
    if name in ("Engine", "Video"):
        from fastvideo3 import engine
        return getattr(engine, name)
    raise AttributeError(name)
