"""The denoiser executor of one rank of a parallel replica.

Every rank of the replica holds one :class:`ParallelDenoiserExecutor` and runs the same step
on the same batch (SPMD, driven by :mod:`fastvideo3.parallel.spmd`). A request's latent and
sampler history are resident in token layout, sharded along the sequence over the plan's
sequence ranks and replicated over its CFG ranks (:mod:`fastvideo3.parallel.dit`): the sampler
update runs on the shard, and only a final latent, a snapshot or a norm ever crosses ranks.
Snapshots gather the shards into the ordinary ``[1, C, F, H, W]`` layout and restores re-shard
them, bound to a fingerprint that also names the plan (a snapshot restores only on a replica
of the same weights, precision, device and plan).

Control flow that decides a step's outcome (a finite latent, a failed unit) is agreed on by
all ranks with one all-reduce per unit, so no rank takes a branch another does not.
"""
from __future__ import annotations

import dataclasses
import json
import math

import torch

from fastvideo3.errors import FastVideoError, NotFound, NumericFault
from fastvideo3.loop import cfg as cfg_policy
from fastvideo3.loop.samplers import SamplerHistory, sampler_step
from fastvideo3.parallel.dit import ShardedDiT, gather_latent, grid_of, shard_latent
from fastvideo3.parallel.mesh import Mesh
from fastvideo3.runtime.pool.dit_executor import DenoiserExecutor, Region
from fastvideo3.runtime.pool.executors import _fail
from fastvideo3.loop.protocol import StepResult
from fastvideo3.transport.ref import TensorRef


def ref_key(ref: TensorRef) -> str:
    """The key a broadcast input travels under (every field, the descriptor included)."""
    return json.dumps(ref.to_dict(), sort_keys=True, default=str)


class RankTransport:
    """The transport a rank's executor sees: inputs come from what the leader fetched and
    broadcast with the batch; publishing and releasing are the leader's (others have none)."""

    def __init__(self, inner=None):
        self.inner = inner
        self.prefetched: dict[str, torch.Tensor] = {}

    def fetch(self, ref, deadline_s: float | None = None):
        key = ref_key(ref)
        if key in self.prefetched:
            value = self.prefetched[key]
            if isinstance(value, BaseException):  # the leader's fetch failed: every rank fails alike
                raise value
            return value
        if self.inner is None:
            raise FastVideoError("input was not broadcast by the leader rank", field="inputs")
        return self.inner.fetch(ref, deadline_s=deadline_s)

    def publish(self, request_id, name, tensor):
        if self.inner is None:
            raise FastVideoError("only the leader rank publishes", field="transport")
        return self.inner.publish(request_id, name, tensor)

    def release(self, request_id):
        if self.inner is not None:
            self.inner.release(request_id)

    def stats(self):
        return self.inner.stats() if self.inner is not None else {}

    def __getattr__(self, name):  # caps(), use(), close() ... of the leader's transport
        if self.inner is None:
            raise AttributeError(name)
        return getattr(self.inner, name)


class ParallelDenoiserExecutor(DenoiserExecutor):
    """A :class:`DenoiserExecutor` whose forward and resident state follow ``mesh.plan``."""

    def __init__(self, card, transport, mesh: Mesh, device=None, precision=None, batching: bool = True):
        super().__init__(card, RankTransport(transport), device, precision, batching=batching, fast=False)
        self.mesh = mesh
        self.sharded = ShardedDiT(self.dit, mesh)
        self.patch = tuple(self.dit.cfg.patch_size)
        self.shapes: dict[str, tuple[int, ...]] = {}  # request id -> latent shape [C, F, H, W]

    @property
    def plan(self):
        return self.mesh.plan

    # -- regions -------------------------------------------------------------------------
    def _region(self, unit):
        reg = super()._region(unit)
        if reg.latent.dim() == 5:  # just created, full: keep this rank's shard only
            self.shapes[unit.request_id] = tuple(int(s) for s in unit.params["latent_shape"])
            reg.latent = shard_latent(reg.latent, self.mesh, self.patch)
        return reg

    def _valid_local(self, request_id: str, local_tokens: int) -> int:
        n = math.prod(grid_of(self.shapes[request_id], self.patch))
        return max(0, min(local_tokens, n - self.mesh.sp_index * local_tokens))

    def release(self, request_id: str) -> None:
        with self._lock:
            self.shapes.pop(request_id, None)
        super().release(request_id)

    # -- the step body -------------------------------------------------------------------
    @torch.no_grad()
    def _run(self, chunk, results) -> None:
        policy = chunk[0][0].params["cfg_policy"]
        branches = cfg_policy.branches(policy)
        # with a CFG degree both branches run in one forward (one per rank of the CFG group)
        passes = [branches] if policy in ("batched", "none") or self.plan.cfg > 1 else [(b,) for b in branches]
        preds: list[dict[str, torch.Tensor]] = [{} for _ in chunk]
        shape = self.shapes[chunk[0][0].request_id]
        grid = grid_of(shape, self.patch)
        for branch_set in passes:
            lat, ts, txt, index = cfg_policy.branch_rows(chunk, branch_set)
            t = torch.tensor(ts, dtype=torch.float32, device=self.device)
            out = self.sharded(torch.cat(lat).to(self.dtype), t, torch.cat(txt), grid)
            self._count_forward(len(index))
            for row, (i, b) in enumerate(index):
                preds[i][b] = out[row:row + 1]
        for i, (unit, reg) in enumerate(chunk):
            self._finish(unit, reg, policy, preds[i], len(chunk) * len(branches), results)

    def _finish(self, unit, reg: Region, policy, preds, rows: int, results) -> None:
        p = unit.params
        new, error = None, None
        try:
            noise = cfg_policy.combine(policy, preds, float(p["guidance"]))
            new = sampler_step(p["sampler"], reg.history, noise, reg.latent, int(p["step"]), p["sigmas"])
            if self.fault_hook is not None:
                new = self.fault_hook(unit, new)
            valid = self._valid_local(unit.request_id, new.shape[1])
            mine = new[:, :valid].float()
            stats = torch.stack([torch.tensor(0.0, device=mine.device),
                                 (~torch.isfinite(mine)).sum().float(), mine.pow(2).sum()])
        except Exception as e:  # noqa: BLE001 - request-local; agreed on below
            error = e
            stats = torch.tensor([1.0, 0.0, 0.0])
        stats = self.mesh.all_reduce(stats.to(self._stats_device()), "world")
        failed, nonfinite, sumsq = (float(v) for v in stats.cpu())
        try:
            if failed or error is not None:
                raise error or FastVideoError("a peer rank failed this step", step=int(p["step"]),
                                              request_id=unit.request_id)
            if nonfinite:
                raise NumericFault("latents became non-finite", step=int(p["step"]), request_id=unit.request_id)
            for observe in self.observers:
                observe(unit, reg.latent, noise, new)
            reg.latent = new
            reg.step += 1
            norm = math.sqrt(sumsq / self.plan.cfg)  # CFG ranks hold the same shard
            res = StepResult(unit.unit_id, unit.request_id,
                             metrics={"latent_norm": norm, "finite": 1.0, "batch_rows": float(rows)})
            if p.get("final"):
                full = gather_latent(new, self.mesh, self.shapes[unit.request_id], self.patch)
                if self.mesh.rank == 0:
                    res.outputs["latents"] = self.transport.publish(unit.request_id, "latents", full)
            results[unit.unit_id] = res
        except Exception as e:  # noqa: BLE001
            self.regions.pop(unit.request_id, None)
            self.shapes.pop(unit.request_id, None)
            results[unit.unit_id] = _fail(unit, e)

    def _stats_device(self):
        return torch.device(self.device) if str(self.device).startswith("cuda") else torch.device("cpu")

    # -- snapshot / restore --------------------------------------------------------------
    @property
    def identity(self):
        if getattr(self, "_identity", None) is None:
            from fastvideo3.runtime.pool.resident import pool_identity
            base = pool_identity(self.weights_digest, self.precision, self.device)
            self._identity = dataclasses.replace(base, graph_names=(f"parallel:{self.plan.spec}",))
        return self._identity

    def has_region(self, request_id: str) -> bool:
        return request_id in self.regions

    def snapshot(self, request_id: str) -> bytes:
        """Gather the request's shards and write the ordinary denoiser snapshot (every rank
        takes part; the leader's bytes are the answer)."""
        from fastvideo3.runtime.pool.resident import snapshot_regions
        with self._lock:
            reg = self.regions.get(request_id)
            if reg is None:
                raise NotFound("no resident region for this request", field="request_id")
            shape = self.shapes[request_id]
            full = lambda t: gather_latent(t, self.mesh, shape, self.patch)  # noqa: E731
            hist = SamplerHistory.rebuild(reg.history.meta(), {k: full(v) for k, v in reg.history.tensors().items()})
            return snapshot_regions(self.identity, full(reg.latent), hist, reg.step)

    def restore(self, request_id: str, blob: bytes) -> int:
        """Load a snapshot written under this plan's fingerprint and keep this rank's shards."""
        from fastvideo3.runtime.pool.resident import restore_regions
        latent, history, step = restore_regions(self.identity, blob, self.device)
        shape = tuple(latent.shape[1:])
        shard = lambda t: shard_latent(t, self.mesh, self.patch)  # noqa: E731
        hist = SamplerHistory.rebuild(history.meta(), {k: shard(v) for k, v in history.tensors().items()})
        with self._lock:
            self.regions[request_id] = Region(latent=shard(latent), history=hist, step=step)
            self.shapes[request_id] = shape
        return step

    def describe(self) -> dict:
        d = super().describe()
        d["dit_path"] = "sharded"
        d["parallel"] = {**self.plan.to_dict(), "rank": self.mesh.rank, "backend": _backend()}
        return d


def _backend() -> str:
    import torch.distributed as dist
    return dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"
