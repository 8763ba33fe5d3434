"""The process groups of one replica's plan, and the collectives the plan uses.

:class:`Mesh` is built once per rank after ``torch.distributed`` is initialised; every rank
creates every group in the same order (a ``new_group`` rule). A degree-1 axis has no group
and its collectives are identities, so the plan code at degree 1 adds no communication.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from fastvideo3.parallel.plan import SINGLE, ParallelPlan

DEFAULT_TIMEOUT_S = 60.0


@dataclass
class Mesh:
    plan: ParallelPlan
    rank: int = 0
    world: int = 1
    groups: dict = field(default_factory=dict)  # axis -> (ProcessGroup, ranks) of this rank
    control: object = None  # a gloo group for control messages (objects), whatever the backend

    @property
    def coords(self) -> tuple[int, int, int]:
        return self.plan.coords(self.rank)

    @property
    def sp_index(self) -> int:
        _, r, u = self.coords
        return r * self.plan.ulysses + u

    def group(self, axis: str):
        """This rank's group on ``axis`` (``cfg``, ``ring``, ``ulysses``, ``sp`` or ``world``);
        None where the axis has degree 1."""
        if axis == "world":
            return dist.group.WORLD if self.world > 1 else None
        g = self.groups.get(axis)
        return g[0] if g else None

    def ranks(self, axis: str) -> list[int]:
        if axis == "world":
            return list(range(self.world))
        g = self.groups.get(axis)
        return g[1] if g else [self.rank]

    # -- collectives ----------------------------------------------------------------------
    def all_gather(self, t: torch.Tensor, axis: str, dim: int = 0) -> torch.Tensor:
        """Concatenate ``t`` from every rank of ``axis`` (in axis order) along ``dim``."""
        g = self.group(axis)
        if g is None:
            return t
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in self.ranks(axis)]
        dist.all_gather(parts, t, group=g)
        return torch.cat(parts, dim=dim)

    def all_reduce(self, t: torch.Tensor, axis: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
        g = self.group(axis)
        if g is not None:
            dist.all_reduce(t, op=op, group=g)
        return t

    def all_to_all(self, t: torch.Tensor, axis: str) -> torch.Tensor:
        """``t``'s dim 0 is split over the axis' ranks; chunk ``j`` goes to rank ``j``."""
        g = self.group(axis)
        if g is None:
            return t
        t = t.contiguous()
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t, group=g)
        return out


def single_mesh() -> Mesh:
    return Mesh(SINGLE)


def backend_for(device: str) -> str:
    return "nccl" if str(device).startswith("cuda") else "gloo"


def init_mesh(plan: ParallelPlan, rank: int, world: int, master: str, device: str,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> Mesh:
    """Join the replica's process group (``master`` = ``host:port`` of rank 0's store) and build
    the plan's groups. NCCL on CUDA devices, gloo otherwise; control messages always on gloo."""
    plan.check_world(world)
    host, port = master.rsplit(":", 1)
    timeout = datetime.timedelta(seconds=timeout_s)
    if str(device).startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if not dist.is_initialized():
        dist.init_process_group(backend_for(device), init_method=f"tcp://{host}:{port}", rank=rank,
                                world_size=world, timeout=timeout)
    return build_mesh(plan, rank, world, device, timeout_s)


def build_mesh(plan: ParallelPlan, rank: int, world: int, device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Mesh:
    """The plan's groups on an initialised default group (every rank calls this, in step)."""
    plan.check_world(world)
    timeout = datetime.timedelta(seconds=timeout_s)
    mesh = Mesh(plan, rank, world)
    gloo = backend_for(device) == "gloo"
    mesh.control = dist.group.WORLD if gloo else dist.new_group(backend="gloo", timeout=timeout)
    for axis, lists in plan.groups().items():
        for ranks in lists:
            g = dist.new_group(ranks, timeout=timeout) if len(ranks) > 1 else None
            if rank in ranks and g is not None:
                mesh.groups[axis] = (g, ranks)
    return mesh


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group cannot always be torn down cleanly
            pass
