"""SPMD inside one parallel replica: rank 0 serves, every rank computes.

Rank 0 runs the pool service with a :class:`LeaderExecutor`. Each call the service makes
(execute, release, snapshot, restore) is first broadcast to the other ranks on the control
group, with the inputs rank 0 fetched for the batch (the other ranks have no transport of their
own), and then run on rank 0 while :func:`serve_worker` runs the same call on every other rank.
Only rank 0's results are answered; the others' are dropped. Calls are serialised (one lock),
so every rank sees the same sequence. While idle the leader sends a heartbeat, so a healthy
worker never waits past the group's timeout and a dead leader is noticed within it.

A broken group (a rank died, a collective failed or timed out) is terminal for the replica:
the batch in hand fails with UNAVAILABLE (``lost_region``: the scheduler resumes or fails the
request as for any lost denoiser), later calls are refused the same way, ``on_broken`` is called
(the launcher stops the service) and the surviving ranks exit.
"""
from __future__ import annotations

import logging
import threading
import time

import torch
import torch.distributed as dist

from fastvideo3.errors import FastVideoError, NotFound, Unavailable
from fastvideo3.parallel.executor import ParallelDenoiserExecutor, ref_key
from fastvideo3.runtime.pool.executors import _fail

log = logging.getLogger("fastvideo3.parallel")

HEARTBEAT_S = 5.0


def _broadcast(mesh, msg=None):
    box = [msg]
    dist.broadcast_object_list(box, src=0, group=mesh.control)
    return box[0]


class LeaderExecutor(ParallelDenoiserExecutor):
    """Rank 0's executor: broadcasts every call to the other ranks, then runs it."""

    def __init__(self, card, transport, mesh, device=None, precision=None, batching: bool = True,
                 heartbeat_s: float = HEARTBEAT_S, on_broken=None):
        super().__init__(card, transport, mesh, device, precision, batching)
        self.broken: str | None = None
        self.on_broken = on_broken
        self.rank_pids: list[int] = []
        self._spmd = threading.Lock()
        self._last_sent = time.monotonic()
        self._stop = threading.Event()
        self.heartbeat_s = heartbeat_s
        if mesh.world > 1:
            threading.Thread(target=self._heartbeat, name="spmd-heartbeat", daemon=True).start()

    # -- control channel ---------------------------------------------------------------
    def _send(self, msg) -> None:
        if self.broken:
            raise Unavailable(f"parallel replica is broken: {self.broken}", field="replica",
                              details={"lost_region": True})
        try:
            _broadcast(self.mesh, msg)
        except Exception as e:  # noqa: BLE001 - any failure of the control group breaks the replica
            self.mark_broken(f"control broadcast failed: {e}")
            raise Unavailable(f"parallel replica is broken: {self.broken}", field="replica",
                              details={"lost_region": True}) from e
        self._last_sent = time.monotonic()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s / 2):
            if self.broken:
                return
            if time.monotonic() - self._last_sent < self.heartbeat_s or not self._spmd.acquire(timeout=0):
                continue
            try:
                self._send(("ping",))
            except Unavailable:
                return
            finally:
                self._spmd.release()

    def mark_broken(self, why: str) -> None:
        if self.broken:
            return
        self.broken = why
        log.error("parallel replica broken: %s", why)
        if self.on_broken is not None:
            threading.Thread(target=self.on_broken, args=(why,), name="spmd-broken", daemon=True).start()

    def stop(self) -> None:
        """Tell the other ranks to exit (a clean shutdown)."""
        self._stop.set()
        with self._spmd:
            if not self.broken and self.mesh.world > 1:
                try:
                    self._send(("stop",))
                except Unavailable:
                    pass
            self.broken = self.broken or "stopped"

    # -- the calls ---------------------------------------------------------------------
    def _lost(self, batch, why: str):
        err = Unavailable(f"parallel replica lost: {why}", field="replica", details={"lost_region": True})
        return [_fail(u, err) for u in batch]

    def _prefetch(self, batch) -> dict:
        out = {}
        for u in batch:
            reg = self.regions.get(u.request_id)
            for name, ref in u.inputs.items():
                if reg is not None and name in reg.embeds:
                    continue
                key = ref_key(ref)
                if key in out:
                    continue
                try:
                    out[key] = self.transport.inner.fetch(ref, deadline_s=self.fetch_deadline_s).cpu()
                except Exception as e:  # noqa: BLE001 - every rank fails the unit the same way
                    out[key] = e if isinstance(e, FastVideoError) else Unavailable(f"fetch failed: {e}", field="inputs")
        return out

    def execute(self, batch):
        with self._spmd:
            if self.broken:
                return self._lost(batch, self.broken)
            prefetched = self._prefetch(batch)
            try:
                self._send(("execute", batch, prefetched))
            except Unavailable:
                return self._lost(batch, self.broken or "control channel")
            self.transport.prefetched = prefetched
            try:
                return super().execute(batch)
            except FastVideoError:
                raise
            except Exception as e:  # noqa: BLE001 - a collective failed: a peer is gone
                self.mark_broken(f"step collective failed: {e}")
                with self._lock:
                    self.regions.clear()
                return self._lost(batch, self.broken)
            finally:
                self.transport.prefetched = {}

    def release(self, request_id: str) -> None:
        with self._spmd:
            if not self.broken:
                try:
                    self._send(("release", request_id))
                except Unavailable:
                    pass
            super().release(request_id)

    def snapshot(self, request_id: str) -> bytes:
        with self._spmd:
            if request_id not in self.regions:
                raise NotFound("no resident region for this request", field="request_id")
            self._send(("snapshot", request_id))
            return self._guard(super().snapshot, request_id)

    def restore(self, request_id: str, blob: bytes) -> int:
        with self._spmd:
            from fastvideo3.runtime.pool.resident import restore_regions
            restore_regions(self.identity, blob, "cpu")  # refuse before any rank changes
            self._send(("restore", request_id, blob))
            return self._guard(super().restore, request_id, blob)

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except FastVideoError:
            raise
        except Exception as e:  # noqa: BLE001
            self.mark_broken(f"collective failed: {e}")
            raise Unavailable(f"parallel replica lost: {self.broken}", field="replica",
                              details={"lost_region": True}) from e

    def describe(self) -> dict:
        d = super().describe()
        d["parallel"].update({"rank_pids": list(self.rank_pids), "broken": self.broken or ""})
        return d


def serve_worker(executor: ParallelDenoiserExecutor) -> int:
    """Every rank but 0: run what the leader broadcasts until it says stop (0) or the group
    breaks (1). Request-level failures are the leader's to report; they do not stop the loop."""
    mesh = executor.mesh
    while True:
        try:
            msg = _broadcast(mesh)
        except Exception as e:  # noqa: BLE001 - leader gone or timed out
            log.error("rank %d: control channel lost: %s", mesh.rank, e)
            return 1
        op = msg[0]
        if op == "stop":
            return 0
        try:
            if op == "execute":
                executor.transport.prefetched = msg[2]
                executor.execute(msg[1])
                executor.transport.prefetched = {}
            elif op == "release":
                executor.release(msg[1])
            elif op == "snapshot":
                executor.snapshot(msg[1])
            elif op == "restore":
                executor.restore(msg[1], msg[2])
        except FastVideoError:
            continue
        except Exception as e:  # noqa: BLE001 - a collective failed: the group is broken
            log.error("rank %d: %s failed: %s", mesh.rank, op, e)
            return 1


def rank_device(device: str | None, rank: int) -> str:
    """The device of one rank: ``cuda:<rank>`` where the replica runs on CUDA, else the CPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        return f"cuda:{rank}"
    return device
