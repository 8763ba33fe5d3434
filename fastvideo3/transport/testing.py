"""Fault injection for tests only. Nothing in the runtime imports this module.

These helpers reach into an owner's resident buffer (through the backend's
``_resident_bytes`` hook) to simulate what the checksum exists to catch: bytes that changed
between ``publish`` and ``fetch`` (a bad DIMM, a DMA into the wrong slab, a reuse bug).
"""
from __future__ import annotations

import torch

from fastvideo3.transport.ledger import TransportBase
from fastvideo3.transport.ref import TensorRef


def corrupt(transport: TransportBase, ref: TensorRef, *, index: int = 0) -> None:
    """Flip every bit of one byte of a published buffer, in place on the owner side."""
    data = transport._resident_bytes(ref)
    if data.numel() == 0:
        raise ValueError("an empty tensor has no byte to corrupt")
    i = index % data.numel()
    data[i:i + 1].bitwise_not_()
    if data.device.type == "cuda":
        torch.cuda.synchronize(data.device)


# --------------------------------------------------------------------------- owner processes

def _owner_loop(backend: str, cfg: dict, conn) -> None:
    import os

    from fastvideo3.transport import make_transport

    transport = make_transport(backend, owner="owner", **cfg)
    conn.send(("ready", os.getpid()))
    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "publish":
                request_id, name, tensor, device = args
                reply = transport.publish(request_id, name, tensor.to(device)).to_dict()
            elif cmd == "corrupt":
                reply = corrupt(transport, TensorRef.from_dict(args[0]))
            elif cmd == "release":
                reply = transport.release(args[0])
            elif cmd == "stats":
                reply = transport.stats()
            elif cmd == "close":
                transport.close()
                reply = transport.stats()
            else:
                raise ValueError(cmd)
            conn.send(("ok", reply))
        except Exception as exc:  # reported to the driver; the owner keeps serving
            conn.send(("err", repr(exc)))
        if cmd == "close":
            return


class OwnerProcess:
    """A spawned process that owns a transport, driven over a pipe (every wait has a timeout)."""

    def __init__(self, backend: str, cfg: dict | None = None, *, ready_timeout_s: float = 90.0) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_owner_loop, args=(backend, dict(cfg or {}), child), daemon=True)
        self.proc.start()
        kind, self.pid = self._recv(ready_timeout_s)
        if kind != "ready":
            raise RuntimeError(f"owner did not start: {self.pid}")

    def _recv(self, timeout: float):
        if not self.conn.poll(timeout):
            raise TimeoutError("owner process did not answer")
        return self.conn.recv()

    def call(self, *msg, timeout: float = 60.0):
        self.conn.send(msg)
        kind, value = self._recv(timeout)
        if kind != "ok":
            raise RuntimeError(value)
        return value

    def publish(self, request_id: str, name: str, tensor: torch.Tensor, device: str = "cpu") -> TensorRef:
        return TensorRef.from_dict(self.call("publish", request_id, name, tensor.cpu(), device))

    def stop(self) -> None:
        import os
        import signal

        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGCONT)
            try:
                self.call("close", timeout=10)
            except Exception:
                pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


def fault_suite(backend: str, owner_cfg: dict, reader, *, device: str = "cpu") -> dict[str, dict]:
    """The fault checks every cross-process backend must pass, against real owner processes:
    round trip, stale buffer (released), reused slab, checksum mismatch -> DataLoss, deadline,
    hung owner, dead owner. Returns ``{check: {"ok": bool, "detail": str}}``; never raises."""
    import os
    import signal
    import time

    from fastvideo3.errors import DataLoss, DeadlineExceeded, NotFound, Unavailable

    results: dict[str, dict] = {}

    def check(name, fn):
        try:
            detail = fn()
            results[name] = {"ok": True, "detail": str(detail or "")}
        except Exception as exc:
            results[name] = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}

    def expect(exc_types, fn, what):
        try:
            fn()
        except exc_types as exc:
            return f"{type(exc).__name__}: {exc}"
        raise AssertionError(f"{what}: no error raised")

    owner = OwnerProcess(backend, owner_cfg)
    try:
        x = torch.randn(256, 1024)

        def round_trip():
            ref = owner.publish("r1", "x", x, device)
            for kw in ({}, {"copy": True}):
                got = reader.fetch(ref, deadline_s=30, **kw)
                if not torch.equal(got.cpu(), x):
                    raise AssertionError(f"fetch {kw} returned other bytes")
            owner.call("release", "r1")

        def stale():
            ref = owner.publish("r2", "x", x, device)
            owner.call("release", "r2")
            return expect((NotFound, Unavailable), lambda: reader.fetch(ref, deadline_s=30), "released buffer")

        def reused():
            ref = owner.publish("r3", "x", x, device)
            owner.call("release", "r3")
            owner.publish("r4", "x", torch.randn(256, 1024), device)  # same size class: the same slab
            try:
                return expect((NotFound, Unavailable), lambda: reader.fetch(ref, deadline_s=30), "reused slab")
            finally:
                owner.call("release", "r4")

        def fetch_fails(request_id, exc_types, what, *, deadline_s=30, before=lambda ref: None):
            """Publish ``x``, run ``before(ref)``, expect the fetch to raise; release either way."""
            ref = owner.publish(request_id, "x", x, device)
            before(ref)
            try:
                return expect(exc_types, lambda: reader.fetch(ref, deadline_s=deadline_s), what)
            finally:
                owner.call("release", request_id)

        def corrupted():
            return fetch_fails("r5", DataLoss, "corrupted buffer",
                               before=lambda ref: owner.call("corrupt", ref.to_dict()))

        def deadline():
            return fetch_fails("r6", DeadlineExceeded, "deadline_s=0", deadline_s=0)

        def hung_owner():
            ref = owner.publish("r7", "x", x, device)
            os.kill(owner.pid, signal.SIGSTOP)
            start = time.monotonic()
            try:
                try:
                    got = reader.fetch(ref, deadline_s=2.0, copy=True)
                    outcome = "served without the owner" if torch.equal(got.cpu(), x) else None
                    if outcome is None:
                        raise AssertionError("hung owner: other bytes")
                except (DeadlineExceeded, Unavailable) as exc:
                    outcome = f"{type(exc).__name__}"
                took = time.monotonic() - start
                if took > 2.0 + 3.0:
                    raise AssertionError(f"hung owner: fetch took {took:.1f}s past a 2s deadline")
                return f"{outcome} in {took:.2f}s"
            finally:
                os.kill(owner.pid, signal.SIGCONT)
                owner.call("release", "r7")

        def dead_owner():
            ref = owner.publish("r8", "x", x, device)
            os.kill(owner.pid, signal.SIGKILL)
            owner.proc.join(10)
            return expect((Unavailable, DeadlineExceeded), lambda: reader.fetch(ref, deadline_s=5), "dead owner")

        for name, fn in (("round_trip", round_trip), ("stale_buffer", stale), ("reused_slab", reused),
                         ("checksum_mismatch", corrupted), ("deadline", deadline), ("hung_owner", hung_owner),
                         ("dead_owner", dead_owner)):
            check(name, fn)
    finally:
        owner.stop()
    return results


def pinned_view_check(owner_cfg: dict, reader, *, device: str = "cpu") -> dict:
    """cuda_ipc only: a zero-copy view pins its slab (the owner takes a new slab instead of
    reusing it) until the last tensor sharing it is freed. ``{"ok": bool, "detail": str}``."""
    import gc

    owner = OwnerProcess("cuda_ipc", owner_cfg)
    try:
        a = torch.randn(4096)
        ref_a = owner.publish("a", "x", a, device)
        part = reader.fetch(ref_a, deadline_s=30)[10:20]  # a derived view of the zero-copy view
        gc.collect()
        owner.call("release", "a")
        ref_b = owner.publish("b", "x", torch.randn(4096), device)
        if ref_b.descriptor["epoch"] == ref_a.descriptor["epoch"]:
            return {"ok": False, "detail": "the owner reused a pinned slab"}
        if not torch.equal(part.cpu(), a[10:20]):
            return {"ok": False, "detail": "the pinned view changed"}
        del part
        gc.collect()
        owner.call("release", "b")
        owner.publish("c", "x", torch.randn(4096), device)
        ref_d = owner.publish("d", "x", torch.randn(4096), device)
        if owner.call("stats")["slabs_created"] != 2 or reader.stats().get("live_pins") != 0:
            return {"ok": False, "detail": f"slab not released after the view died: {owner.call('stats')}"}
        return {"ok": True, "detail": f"pinned slab skipped, then reused (epoch {ref_d.descriptor['epoch']})"}
    except Exception as exc:
        return {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
    finally:
        owner.stop()
