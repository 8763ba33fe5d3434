"""RemoteExecutor: the core Executor protocol over one pool replica's RolePool gRPC service.

The scheduler's CoreScheduler holds these exactly where the embedded engine holds in-process
executors. Every RPC has a deadline: Execute gets ``rpc_timeout_s`` capped by the earliest unit
deadline of the batch; Release, Describe and health checks get ``control_timeout_s``. A failed
RPC raises the typed error its status names (a lost pool is ``Unavailable``), which the core
scheduler turns into failed results for that batch only.

Health: ``healthy`` follows the replica's grpc.health.v1 status (the scheduler's monitor calls
:meth:`check_health` with a deadline). A replica that stops *answering* (dead, or alive but
hung) gets its in-flight Execute calls cancelled at once, so their batches fail with
``Unavailable`` — resumable elsewhere from a snapshot — instead of waiting out the RPC timeout.
A replica that answers NOT_SERVING (draining) keeps its in-flight calls and gets no new work.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fastvideo3.rpc import error_from_rpc
from fastvideo3.errors import DeadlineExceeded, Unavailable
from fastvideo3.loop.protocol import StepResult
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.v1 import pool_pb2, pool_pb2_grpc
from services.common import convert
from services.common.server import CHANNEL_OPTIONS

_batch_ids = itertools.count(1)
#: a replica relaunched on its address is reached within ~2 s (gRPC's default backoff grows to 2 min)
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                     ("grpc.max_reconnect_backoff_ms", 2000)]


class RemoteExecutor:
    def __init__(self, role: str, target: str, *, rpc_timeout_s: float = 300.0, control_timeout_s: float = 10.0,
                 security=None, unhealthy_after: int = 1):
        self.role = role
        self.target = target
        self.rpc_timeout_s = rpc_timeout_s
        self.control_timeout_s = control_timeout_s
        self.output_transport = ""  # set by the topology: the backend for this role's outgoing edge
        self.replica_id = target
        self.healthy = False
        self.last_description: pool_pb2.PoolDescription | None = None
        self.fingerprint = ""  # the replica's runtime fingerprint (from Describe)
        self.unhealthy_after = max(1, int(unhealthy_after))  # failed checks in a row before "lost"
        self._misses = 0
        self.health_changed_unix = time.time()  # when ``healthy`` last flipped
        self._calls: set = set()  # in-flight Execute futures, cancelled when the replica is lost
        self._pending_release: set[str] = set()  # releases a non-answering replica still owes
        self._calls_lock = threading.Lock()
        self.counters = {"rpcs": 0, "rpc_errors": 0, "units": 0, "rpc_seconds": 0.0, "aborted_calls": 0}
        options = CHANNEL_OPTIONS + RECONNECT_OPTIONS
        self.channel = (security.channel(target, options) if security is not None
                        else grpc.insecure_channel(target, options=options))
        self.stub = pool_pb2_grpc.RolePoolStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    # -- the Executor protocol ---------------------------------------------------------------
    def execute(self, batch: list[WorkUnit]) -> list[StepResult]:
        return self.execute_after_release([], batch)

    def execute_after_release(self, finished_request_ids: list[str], batch: list[WorkUnit]) -> list[StepResult]:
        """Execute, with the ids of ended requests riding on the RPC: the replica frees them on
        receipt (ExecuteRequest.finished_request_ids), before it runs the batch."""
        timeout = self.rpc_timeout_s
        deadlines = [u.deadline_unix for u in batch if u.deadline_unix]
        if deadlines:
            timeout = min(timeout, min(deadlines) - time.time())
            if timeout <= 0:
                raise DeadlineExceeded("request deadline passed before dispatch", field="deadline_s")
        req = pool_pb2.ExecuteRequest(units=[convert.unit_to_wire(u, self.output_transport) for u in batch],
                                      batch_id=f"b{next(_batch_ids)}",
                                      finished_request_ids=list(finished_request_ids))
        t0 = time.perf_counter()
        self.counters["rpcs"] += 1
        self.counters["units"] += len(batch)
        # the scheduler's own traffic: WorkUnits out, StepResults in (references, not tensors)
        self.counters["bytes_sent"] = self.counters.get("bytes_sent", 0) + req.ByteSize()
        try:
            resp = self._call(self.stub.Execute, req, timeout)
        except Exception:
            self.counters["rpc_errors"] += 1
            raise
        finally:
            self.counters["rpc_seconds"] += time.perf_counter() - t0
        inline = sum(len(r.inline_data) for r in resp.results)  # encoded media: the artifact itself
        self.counters["bytes_received"] = self.counters.get("bytes_received", 0) + resp.ByteSize() - inline
        t_back = time.perf_counter()
        results = [convert.result_from_wire(r) for r in resp.results]
        for r, res in zip(resp.results, results):
            if r.artifact_id:  # too large for the reply: held in the pool, read now in chunks
                res.inline = self._read_artifact(r.artifact_id, r.artifact_bytes, timeout - (time.perf_counter() - t0))
                inline += len(res.inline)
        self.counters["results_seconds"] = self.counters.get("results_seconds", 0.0) + time.perf_counter() - t_back
        self.counters["artifact_bytes"] = self.counters.get("artifact_bytes", 0) + inline
        return results

    def _read_artifact(self, artifact_id: str, nbytes: int, timeout: float) -> bytes:
        """The bytes of a result the replica held back (RolePool.ReadArtifact), within ``timeout``."""
        if timeout <= 0:
            raise DeadlineExceeded("deadline passed before a held-back result was read", field="deadline_s")
        call = self.stub.ReadArtifact(pool_pb2.ReadArtifactRequest(artifact_id=artifact_id), timeout=timeout)
        with self._tracked(call):
            data = b"".join(chunk.data for chunk in call)
        if len(data) != nbytes:
            raise Unavailable(f"held-back result {artifact_id!r} came back {len(data)} of {nbytes} bytes",
                              field="artifact_bytes")
        self.counters["artifact_reads"] = self.counters.get("artifact_reads", 0) + 1
        return data

    def _call(self, method, req, timeout: float):
        """A unary call that :meth:`abort_inflight` can cancel; raises the typed error."""
        call = method.future(req, timeout=timeout)
        with self._tracked(call):
            return call.result()

    @contextlib.contextmanager
    def _tracked(self, call):
        """While the block runs, :meth:`abort_inflight` can cancel ``call``; its gRPC failure
        leaves as the typed error (a cancelled call: the replica stopped answering)."""
        with self._calls_lock:
            self._calls.add(call)
        try:
            yield
        except (grpc.FutureCancelledError, grpc.RpcError) as err:
            if isinstance(err, grpc.FutureCancelledError) or err.code() == grpc.StatusCode.CANCELLED:
                raise Unavailable(f"{self.role} replica {self.target} stopped answering health checks",
                                  field="replica") from None
            raise error_from_rpc(err) from None
        finally:
            with self._calls_lock:
                self._calls.discard(call)

    def abort_inflight(self) -> int:
        """Cancel every in-flight Execute (the replica is lost); returns how many."""
        with self._calls_lock:
            calls = list(self._calls)
        for call in calls:
            call.cancel()
        self.counters["aborted_calls"] += len(calls)
        return len(calls)

    # -- resident snapshots (RolePool Snapshot / Restore) ------------------------------------
    def snapshot(self, request_id: str) -> bytes:
        resp = self._call(self.stub.Snapshot, pool_pb2.SnapshotRequest(request_id=request_id), self.control_timeout_s)
        return bytes(resp.blob)

    def restore(self, request_id: str, blob: bytes) -> None:
        import hashlib
        req = pool_pb2.StateSnapshot(request_id=request_id, blob=blob,
                                     checksum="sha256:" + hashlib.sha256(blob).hexdigest())
        self._call(self.stub.Restore, req, self.control_timeout_s)

    # -- adapters (RolePool LoadAdapter / UnloadAdapter) --------------------------------------
    def load_adapter(self, adapter_id: str, path: str | None = None, tensors=None) -> dict:
        from fastvideo3.v1 import adapter_pb2
        if tensors is not None:
            raise ValueError("a remote pool loads adapters from a file path")
        # reading and checking a file can take a while: the control deadline is not enough
        resp = self._call(self.stub.LoadAdapter, adapter_pb2.LoadAdapterRequest(adapter_id=adapter_id, path=path or ""),
                          self.rpc_timeout_s)
        return {"id": resp.adapter_id, "version": resp.version, "rank": resp.rank, "bytes": resp.bytes}

    def unload_adapter(self, adapter_id: str, wait_s: float = 0.0) -> list[str]:
        from fastvideo3.v1 import adapter_pb2
        req = adapter_pb2.UnloadAdapterRequest(adapter_id=adapter_id, wait_s=wait_s)
        resp = self._call(self.stub.UnloadAdapter, req, self.control_timeout_s + wait_s)
        return list(resp.versions)

    def release(self, request_id: str) -> None:
        """Free the request on the replica. While it does not answer, the release is kept and
        sent once it serves again (a hung replica must not hold the scheduler, nor leak)."""
        if not self.healthy:
            with self._calls_lock:
                self._pending_release.add(request_id)
            return
        try:
            self._call(self.stub.Release, pool_pb2.ReleaseRequest(request_id=request_id), self.control_timeout_s)
        except Unavailable:
            with self._calls_lock:
                self._pending_release.add(request_id)
            raise

    def _flush_releases(self) -> None:
        with self._calls_lock:
            pending, self._pending_release = self._pending_release, set()
        for rid in pending:
            try:
                self.release(rid)
            except Exception:  # noqa: BLE001 - kept for the next time it serves
                pass

    def describe_raw(self, timeout: float | None = None) -> pool_pb2.PoolDescription:
        try:
            d = self.stub.Describe(pool_pb2.DescribePoolRequest(), timeout=timeout or self.control_timeout_s)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
        self.last_description = d
        self.replica_id = d.replica_id or self.target
        self.fingerprint = d.runtime_fingerprint
        return d

    # -- health ------------------------------------------------------------------------------
    def check_health(self, timeout: float | None = None) -> bool:
        """One health check with a deadline. No answer ``unhealthy_after`` times in a row means
        the replica is lost: it is marked unhealthy and its in-flight calls are cancelled."""
        try:
            r = self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout or self.control_timeout_s)
            self._misses = 0
            was, self.healthy = self.healthy, r.status == health_pb2.HealthCheckResponse.SERVING
            if self.healthy != was:
                self.health_changed_unix = time.time()
            if self.healthy and not was and self._pending_release:
                self._flush_releases()
        except grpc.RpcError:
            self._misses += 1
            if self._misses >= self.unhealthy_after:
                if self.healthy:
                    self.health_changed_unix = time.time()
                self.healthy = False
                self.abort_inflight()
        return self.healthy

    def wait_serving(self, timeout_s: float, stop=None) -> None:
        """Block until the replica reports SERVING (polling with backoff), or raise Unavailable."""
        end = time.monotonic() + timeout_s
        delay = 0.05
        while time.monotonic() < end:
            if stop is not None and stop.is_set():
                raise Unavailable("stopped while waiting for pools", field="pools")
            if self.check_health(timeout=min(2.0, max(0.05, end - time.monotonic()))):
                return
            (stop.wait if stop is not None else time.sleep)(delay)
            delay = min(0.5, delay * 1.5)
        raise Unavailable(f"{self.role} pool at {self.target} is not SERVING after {timeout_s:.0f}s",
                          field=f"pools.{self.role}")

    def close(self) -> None:
        self.channel.close()
