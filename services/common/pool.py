"""The role-pool service: a RolePool servicer around one core executor, and the process main.

A role's ``__main__`` only says how to build its executor (``build(cfg, card, transport)``);
everything else — flags, server, health transitions, draining, conversion at the edge, error
mapping, Describe — is here and is the same for every role.
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

from fastvideo3.runtime.scheduling.executor import Executor, Identified, Prefetches, PullsInputs, TakesAdapters, is_resumable
from fastvideo3.v1 import common_pb2, pool_pb2, pool_pb2_grpc
from fastvideo3.vocab import KINDS_OF_ROLE, Role
from services.common.args import GRAPH_BUCKET_MODES, add_graph_bucket_args, add_service_args
from services.common.artifacts import ArtifactStore, hold_back_large
from services.common.server import ServiceHost, flatten, setup_logging

log = logging.getLogger("fastvideo3.pool")

SERVICE = pool_pb2.DESCRIPTOR.services_by_name["RolePool"].full_name
KINDS = {role: list(kinds) for role, kinds in KINDS_OF_ROLE.items()}
#: most ended-request ids one Execute may carry (ExecuteRequest.finished_request_ids)
MAX_FINISHED_IDS = 4096


@dataclass(frozen=True)
class PoolConfig:
    role: str
    port: int
    host: str = "127.0.0.1"
    card: str = "wan-tiny"
    device: str | None = None
    precision: str | None = None
    transport: str = "auto"
    ucx_report_dir: str | None = None
    nixl_error_handling: str | None = None
    host_id: str | None = None
    replica_id: str = ""
    metrics_port: int | None = None
    trace_file: str | None = None
    otlp_endpoint: str | None = None
    max_batch_units: int = 64
    drain_timeout_s: float = 30.0
    fake: bool = False
    fake_step_seconds: float = 0.0
    feature_cache_mb: float = 256.0
    scorers: str = ""
    no_batching: bool = False
    #: denoiser: the card's denoising experts this pool holds ("" = all; e.g. "transformer_2")
    experts: str = ""
    #: decoder: latents per VAE call (the decoder's batch bound; device OOM halves a call)
    max_decode_batch: int = 4
    exit_with_parent: bool = False
    log_level: str = "INFO"
    fetch_timeout_s: float = 30.0
    fake_load_seconds: float = 0.0
    inject_fault: tuple[str, ...] = ()
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    auth_token_file: str | None = None
    checkpoint_root: str | None = None
    checkpoint_digests: str | None = None
    advertise_host: str | None = None
    load_failure_hold_s: float = 0.0
    lora_slots: int = 8
    lora_max_rank: int = 64
    #: device GiB for merged-segment weight sets (one per adapter combination a batch names; 0 = off)
    lora_merge_cache_gib: float = 24.0
    merge_adapter: str | None = None
    merge_scale: float = 1.0
    #: denoiser: capture the card's CUDA-graph buckets at warm-up ("card") or none ("off")
    graph_buckets: str = "card"
    #: decoder: decode the card's bucket shapes at warm-up ("card": cuDNN tuned before serving) or not ("off")
    decode_warm: str = "card"

    @property
    def public_host(self) -> str:
        """The host other processes reach this replica at (TensorRefs, Describe, replica id)."""
        return self.advertise_host or self.host

    def security(self):
        from services.common.auth import from_args
        return from_args(self.__dict__)


def parse_args(role: str, argv: list[str] | None = None) -> PoolConfig:
    p = argparse.ArgumentParser(prog=f"python -m services.{role}", description=f"fastvideo3 {role} pool")
    add_service_args(p, port_required=True, host="127.0.0.1", card="wan-tiny", drain_timeout_s=30.0,
                     log_level="INFO")
    p.add_argument("--advertise-host", default=None,
                   help="address other processes reach this replica at (default: --host), e.g. the pod IP")
    p.add_argument("--checkpoint-root", default=None,
                   help="directory the card's weights load from (replaces the card's checkpoint.root)")
    p.add_argument("--checkpoint-digests", default=None,
                   help="YAML file {card: {relative path: sha256:HEX}} checked with the card's own digests")
    p.add_argument("--load-failure-hold", type=float, default=0.0, dest="load_failure_hold_s",
                   help="when loading fails, stay up NOT_SERVING this many seconds (Describe tells why), then exit")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (auto)")
    p.add_argument("--precision", default=None, help="fp32, bf16 (card default for the device)")
    p.add_argument("--transport", default="auto",
                   help="backends offered: auto (GPU pools: cuda_ipc,nixl,shm,grpc; else shm,grpc) or a list, "
                        "e.g. shm,grpc,nixl")
    p.add_argument("--ucx-report-dir", default=None,
                   help="folder where UCX reports the transports NIXL selects (shown in Describe)")
    p.add_argument("--nixl-error-handling", default=None, choices=("none", "peer"),
                   help="error-handling mode of NIXL's UCX backend (default: NIXL's, peer)")
    p.add_argument("--host-id", default=None,
                   help="name of the host for same-host transports (cuda_ipc, shm): pods of one node that "
                        "share /dev/shm pass the node name (default: this hostname)")
    p.add_argument("--replica-id", default="", help="replica name (default ROLE@HOST:PORT)")
    p.add_argument("--max-batch-units", type=int, default=64)
    p.add_argument("--fake", action="store_true", help="no-op executor: results without math (overhead tests)")
    p.add_argument("--fake-step-seconds", type=float, default=0.0, help="simulated compute per batch in --fake")
    if role == Role.ENCODER:
        p.add_argument("--feature-cache-mb", type=float, default=256.0, help="prompt cache budget (0 = off)")
    if role == Role.REWARD:
        p.add_argument("--scorers", default="", help="comma list of scorers to host (default: all built-in)")
    if role == Role.DENOISER:
        p.add_argument("--no-batching", action="store_true", help="run each unit of a batch as its own forward")
        p.add_argument("--lora-slots", type=int, default=8, help="LoRA adapters resident on the device at once")
        p.add_argument("--lora-max-rank", type=int, default=64, help="largest LoRA rank accepted (a power of two)")
        p.add_argument("--lora-merge-cache-gib", type=float, default=24.0,
                       help="device GiB for merged-segment weights: each adapter combination a batch names folded "
                            "into a weight copy (a Wan 1.3B set is ~2.8 GB; 0 = always the low-rank kernels)")
        p.add_argument("--merge-adapter", default=None, metavar="ID=PATH",
                       help="dedicate this pool to one LoRA merged into its weights (no per-row delta)")
        p.add_argument("--merge-scale", type=float, default=1.0, help="the merged adapter's scale")
        p.add_argument("--experts", default="", help="two-expert cards: the expert(s) this pool holds, comma "
                       "separated (default: all; the scheduler routes each step to a pool holding its expert)")
        add_graph_bucket_args(p)
    if role == Role.DECODER:
        p.add_argument("--max-decode-batch", type=int, default=4, help="latents decoded in one VAE call (1-64)")
        p.add_argument("--decode-warm", default="card", choices=GRAPH_BUCKET_MODES,
                       help="card: on CUDA, decode the card's bucket shapes at each batch size before serving "
                            "(cuDNN tunes then, not in a request's decode); off: tune on first use")
    p.add_argument("--fetch-timeout", type=float, default=30.0, dest="fetch_timeout_s",
                   help="deadline of one pull of an input from another pool")
    p.add_argument("--fake-load-seconds", type=float, default=0.0, help="simulated load time in --fake (tests)")
    p.add_argument("--inject-fault", action="append", default=[],
                   help="test only: KIND:REQUEST_ID@N (see services/common/faults.py)")
    a = vars(p.parse_args(argv))
    a["inject_fault"] = tuple(a["inject_fault"])
    if a["load_failure_hold_s"] < 0:
        p.error(f"--load-failure-hold must be >= 0 (got {a['load_failure_hold_s']})")
    if role == Role.DENOISER:
        if not 1 <= a["lora_slots"] <= 1024:
            p.error(f"--lora-slots must be in [1, 1024] (got {a['lora_slots']})")
        r = a["lora_max_rank"]
        if not 16 <= r <= 512 or r & (r - 1):
            p.error(f"--lora-max-rank must be a power of two in [16, 512] (got {r})")
        if not 0 <= a["lora_merge_cache_gib"] <= 4096:
            p.error(f"--lora-merge-cache-gib must be in [0, 4096] (got {a['lora_merge_cache_gib']})")
        if a["merge_adapter"] is not None and "=" not in a["merge_adapter"]:
            p.error(f"--merge-adapter must be ID=PATH (got {a['merge_adapter']!r})")
    if role == Role.DECODER and not 1 <= a["max_decode_batch"] <= 64:
        p.error(f"--max-decode-batch must be in [1, 64] (got {a['max_decode_batch']})")
    return PoolConfig(role=role, **a)


def fingerprint(weights_digest: str, precision: str, device: str) -> str:
    try:  # the identity snapshots are bound to (fastvideo3.runtime.pool.resident)
        from fastvideo3.runtime.pool.resident import pool_fingerprint, pool_identity
        return pool_fingerprint(pool_identity(weights_digest, precision, device))
    except Exception:  # noqa: BLE001 - discovery data only; never fail a pool over it
        return ""


class RolePoolServicer(pool_pb2_grpc.RolePoolServicer):
    def __init__(self, cfg: PoolConfig, host: ServiceHost, replica_id: str):
        self.cfg = cfg
        self.host = host
        self.replica_id = replica_id
        self.executor: Executor | None = None
        self.transport: Any = None
        self.card: Any = None
        self.fingerprint = ""
        self.telemetry: Any = None  # telemetry.hooks.PoolTelemetry, set by run_pool
        self.counters = {"execute_rpcs": 0, "release_rpcs": 0, "describe_rpcs": 0, "expired_units": 0}
        self.started = time.time()
        self.load_error: dict | None = None  # why loading failed: {code, field, message}
        self.artifacts = ArtifactStore()  # inline results too large for an Execute reply

    def attach(self, executor, transport, card) -> None:
        self.executor, self.transport, self.card = executor, transport, card
        d = executor.describe()
        if isinstance(executor, Identified):  # the executor's model runtime, when it has one
            from fastvideo3.runtime.pool.resident import pool_fingerprint
            self.fingerprint = pool_fingerprint(executor.identity)
        else:
            self.fingerprint = fingerprint(d.get("weights_digest", ""), d.get("precision", ""), str(d.get("device", "")))

    # -- RPCs ---------------------------------------------------------------------------
    def Execute(self, request, context):  # noqa: N802 - gRPC naming
        from fastvideo3.errors import DeadlineExceeded, ErrorInfo, FastVideoError, FailedPrecondition, InvalidRequest
        from fastvideo3.loop.protocol import StepResult
        from services.common import convert
        from services.common.errors import abort
        self.counters["execute_rpcs"] += 1
        try:
            with self.host.work():
                if len(request.units) > self.cfg.max_batch_units:
                    raise InvalidRequest(f"batch of {len(request.units)} units", field="units",
                                         limit=f"at most {self.cfg.max_batch_units}")
                if len(request.finished_request_ids) > MAX_FINISHED_IDS:
                    raise InvalidRequest(f"{len(request.finished_request_ids)} finished request ids",
                                         field="finished_request_ids", limit=f"at most {MAX_FINISHED_IDS}")
                if any(not rid for rid in request.finished_request_ids):
                    raise InvalidRequest("must not contain an empty id", field="finished_request_ids")
                units = [convert.unit_from_wire(u) for u in request.units]
                for u in units:
                    if u.role and u.role != self.cfg.role:
                        raise InvalidRequest(f"unit for role {u.role!r} sent to a {self.cfg.role} pool", field="role",
                                             limit=self.cfg.role)
                    if u.card_id != self.card.model_id:
                        raise FailedPrecondition(f"unit for card {u.card_id!r}", field="card_id",
                                                 limit=self.card.model_id)
                for rid in request.finished_request_ids:  # ended requests: freed before this batch runs
                    self.executor.release(rid)
                    self.artifacts.release(rid)
                    self.counters["carried_releases"] = self.counters.get("carried_releases", 0) + 1
                now = time.time()
                live = [u for u in units if not u.expired(now)]
                out: dict[str, StepResult] = {}
                for u in units:
                    if u.expired(now):  # past its deadline: answered without running
                        self.counters["expired_units"] += 1
                        out[u.unit_id] = StepResult(u.unit_id, u.request_id, ok=False, error=ErrorInfo.of(
                            DeadlineExceeded("unit deadline passed before it ran", field="deadline_unix_ms")))
                if live and isinstance(self.executor, Prefetches):
                    # inputs pulled before the step lock: a batch sent while another runs (double-
                    # buffered dispatch) finds them in place when its turn comes
                    self.executor.prefetch(live)
                t0 = time.perf_counter()
                if live:
                    backend = request.units[0].output_transport or None
                    with self.transport.use(backend):
                        execute = self.executor.execute
                        results = (self.telemetry.run_batch(live, execute, metadata=context.invocation_metadata())
                                   if self.telemetry is not None else execute(live))
                        for u, r in zip(live, results):
                            out[u.unit_id] = r
                t_reply = time.perf_counter()
                wire = [convert.result_to_wire(out[u.unit_id], self.replica_id) for u in units]
                hold_back_large(wire, self.artifacts)  # the reply stays far below the message limit
                self.counters["reply_build_seconds"] = (self.counters.get("reply_build_seconds", 0.0)
                                                        + time.perf_counter() - t_reply)
                return pool_pb2.ExecuteResponse(results=wire, batch_id=request.batch_id, replica_id=self.replica_id,
                                                batch_seconds=time.perf_counter() - t0)
        except FastVideoError as e:
            abort(context, e)
        except Exception as e:  # noqa: BLE001 - never a traceback over the wire
            log.exception("Execute failed")
            abort(context, e)

    def Release(self, request, context):  # noqa: N802
        from fastvideo3.errors import InvalidRequest
        from services.common.errors import abort
        self.counters["release_rpcs"] += 1
        if not request.request_id:
            abort(context, InvalidRequest("must not be empty", field="request_id"))
        if self.executor is None:
            return pool_pb2.ReleaseResponse()
        self.artifacts.release(request.request_id)
        before = self.transport.stats()
        self.executor.release(request.request_id)
        after = self.transport.stats()
        return pool_pb2.ReleaseResponse(
            released_buffers=int(after.get("buffers_released", 0) - before.get("buffers_released", 0)),
            released_bytes=int(before.get("resident_bytes", 0) - after.get("resident_bytes", 0)))

    def ReadArtifact(self, request, context):  # noqa: N802
        """Stream a result Execute held back (services/common/artifacts.py)."""
        from fastvideo3.errors import FastVideoError, InvalidRequest
        from services.common.errors import abort
        try:
            if not request.artifact_id:
                raise InvalidRequest("must not be empty", field="artifact_id")
            for data, total in self.artifacts.chunks(request.artifact_id):
                yield pool_pb2.ArtifactChunk(data=data, total_bytes=total)
        except FastVideoError as e:
            abort(context, e)

    def Describe(self, request, context):  # noqa: N802
        self.counters["describe_rpcs"] += 1
        return self.description()

    @contextmanager
    def _rpc(self, context):
        """The frame of the state and adapter RPCs: counted as work (a draining pool finishes
        it), and a FastVideoError becomes the call's status."""
        from fastvideo3.errors import FastVideoError
        from services.common.errors import abort
        try:
            with self.host.work():
                yield
        except FastVideoError as e:
            abort(context, e)

    def _resident_state(self, request, context) -> None:
        """Snapshot and Restore name a request of a pool that keeps resident state."""
        from fastvideo3.errors import InvalidRequest
        if not request.request_id:
            raise InvalidRequest("must not be empty", field="request_id")
        if not is_resumable(self.executor):
            context.abort(grpc_status("UNIMPLEMENTED"), f"a {self.cfg.role} pool keeps no resident state")

    def Snapshot(self, request, context):  # noqa: N802
        """A request's resident regions, bound to this pool's runtime fingerprint."""
        from fastvideo3.export.regions import Snapshot
        with self._rpc(context):
            self._resident_state(request, context)
            blob = self.executor.snapshot(request.request_id)
            self.counters["snapshots"] = self.counters.get("snapshots", 0) + 1
            names = [r.name for r in Snapshot.from_bytes(blob).regions]
            return pool_pb2.StateSnapshot(request_id=request.request_id, blob=blob,
                                          runtime_fingerprint=self.fingerprint, regions=names,
                                          checksum="sha256:" + hashlib.sha256(blob).hexdigest())

    def Restore(self, request, context):  # noqa: N802
        """Load a snapshot; FAILED_PRECONDITION unless it was written under this fingerprint."""
        from fastvideo3.errors import DataLoss
        from fastvideo3.export.errors import FingerprintMismatch
        with self._rpc(context):
            self._resident_state(request, context)
            if request.runtime_fingerprint and request.runtime_fingerprint != self.fingerprint:
                raise FingerprintMismatch(f"snapshot from runtime {request.runtime_fingerprint}",
                                          field="runtime_fingerprint", limit=self.fingerprint)
            if request.checksum and request.checksum != "sha256:" + hashlib.sha256(request.blob).hexdigest():
                raise DataLoss("snapshot checksum mismatch", field="checksum")
            self.executor.restore(request.request_id, request.blob)
            self.counters["restores"] = self.counters.get("restores", 0) + 1
            return pool_pb2.RestoreResponse(request_id=request.request_id)

    # -- adapters (denoiser pools) ---------------------------------------------------------
    def LoadAdapter(self, request, context):  # noqa: N802
        """Load a LoRA while serving; reading the file takes no step lock (see the executor)."""
        from fastvideo3.v1 import adapter_pb2
        with self._rpc(context):
            info = self._adapter_executor(context).load_adapter(request.adapter_id, request.path or None)
            log.info("adapter %s loaded (version %s)", info["id"], info["version"])
            return adapter_pb2.AdapterInfo(adapter_id=info["id"], version=info["version"], rank=info["rank"],
                                           bytes=info["bytes"], replicas=[self.replica_id])

    def UnloadAdapter(self, request, context):  # noqa: N802
        from fastvideo3.v1 import adapter_pb2
        with self._rpc(context):
            versions = self._adapter_executor(context).unload_adapter(request.adapter_id, request.wait_s)
            log.info("adapter %s unloaded (%s)", request.adapter_id, ", ".join(versions))
            return adapter_pb2.UnloadAdapterResponse(adapter_id=request.adapter_id, versions=versions)

    def _adapter_executor(self, context):
        if not isinstance(self.executor, TakesAdapters):
            context.abort(grpc_status("UNIMPLEMENTED"), f"a {self.cfg.role} pool takes no adapters"
                          + (" (--fake)" if self.cfg.fake else ""))
        return self.executor

    # -- Describe -----------------------------------------------------------------------
    def description(self) -> pool_pb2.PoolDescription:
        from services.common.description import diagnostics, executor_fields
        cfg = self.cfg
        state = "serving" if self.host.serving and not self.host.draining else (
            "draining" if self.host.draining else "failed" if self.load_error is not None else "loading")
        msg = pool_pb2.PoolDescription(role=cfg.role, replica_id=self.replica_id, kinds=KINDS.get(cfg.role, []),
                                       max_batch_units=cfg.max_batch_units, state=state,
                                       executor=pool_pb2.ExecutorSummary(fake=cfg.fake))
        if self.load_error is not None:
            e = self.load_error
            codes = common_pb2.Error.Code
            code = str(e.get("code") or "INTERNAL")
            msg.load_error.CopyFrom(common_pb2.Error(code=codes.Value(code) if code in codes.keys() else codes.INTERNAL,
                                                     field=str(e.get("field") or ""), message=str(e.get("message") or "")))
        info: dict[str, Any] = {"inflight_rpcs": self.host.inflight, "rpc_counters": dict(self.counters),
                                "uptime_s": round(time.time() - self.started, 3)}
        if self.executor is None:
            msg.diagnostics_json = diagnostics(info, None)
            return msg
        d = self.executor.describe()
        ts = d.get("transport", {})
        caps = self.transport.caps()
        cache = d.get("cache") or {}
        counters = {**flatten(d.get("counters", {})), **{f"rpc.{k}": float(v) for k, v in self.counters.items()},
                    **{f"held.{k}": float(v) for k, v in self.artifacts.counters.items()},
                    "held.bytes_now": float(self.artifacts.held_bytes), "inflight_rpcs": float(self.host.inflight)}
        info.update({"transport_chosen": ts.get("published_by_backend", {}), "transport_default": ts.get("backend"),
                     "nixl_ucx": {k: v for k, v in (ts.get("backends", {}).get("nixl") or {}).items()
                                  if k in ("ucx", "ucx_transports")}})
        address = f"{cfg.public_host}:{self.host.port}"
        fields = executor_fields(d, role=cfg.role, fake=cfg.fake)
        msg.MergeFrom(pool_pb2.PoolDescription(
            card_ids=[self.card.model_id], runtime_fingerprint=self.fingerprint,
            resident_buffers=int(ts.get("resident_buffers", 0)) + fields["executor"].resident_regions,
            resident_bytes=int(ts.get("resident_bytes", 0)),
            cache_stats={f"feature_cache.{k}": float(v) for k, v in cache.items()},
            transport_backends=list(caps.backends), host_id=caps.host_id, process_id=caps.process_id,
            transfer_endpoints=[common_pb2.TransferEndpoint(backend=b, address=address if b == "grpc" else "",
                                                            replica_id=self.replica_id) for b in caps.backends],
            counters=counters, device=str(d.get("device", "")), diagnostics_json=diagnostics(info, d), **fields))
        return msg

    def metrics(self) -> dict[str, float]:
        d = self.description()
        out = dict(d.counters)
        out.update(d.cache_stats)
        out["resident_buffers"] = float(d.resident_buffers)
        out["serving"] = float(self.host.serving and not self.host.draining)
        return out


def grpc_status(name: str):
    import grpc
    return grpc.StatusCode[name]


BuildFn = Callable[[PoolConfig, Any, Any], Any]
#: the warm phase of a role's executor (``warm(cfg, executor)``): after loading, before serving
WarmFn = Callable[[PoolConfig, Any], None]


def run_pool(role: str, build: BuildFn, argv: list[str] | None = None, warm: WarmFn | None = None) -> int:
    """The process main of a role pool (see module docstring). Returns the exit status. ``warm``
    runs once the executor is built, while health is still NOT_SERVING (e.g. the denoiser's graph
    capture); a failure there fails the load like any other."""
    cfg = parse_args(role, argv)
    setup_logging(cfg.log_level)
    security = cfg.security()
    security.install()
    host = ServiceHost([SERVICE], cfg.host, cfg.port, security=security)
    replica_id = cfg.replica_id or f"{role}@{cfg.public_host}:{cfg.port}"
    servicer = RolePoolServicer(cfg, host, replica_id)
    pool_pb2_grpc.add_RolePoolServicer_to_server(servicer, host.server)
    port = host.start()
    if not cfg.replica_id and cfg.port == 0:
        servicer.replica_id = replica_id = f"{role}@{cfg.public_host}:{port}"
    host.install_signals()
    if cfg.exit_with_parent:
        host.watch_parent()
    print(f"{role} pool {replica_id} listening on {cfg.host}:{port} (loading)", flush=True)
    try:
        executor, transport, card = _load(cfg, build, replica_id, host, port, warm)
    except Exception as e:  # noqa: BLE001 - a pool that cannot load says why and exits
        from fastvideo3.errors import FastVideoError
        msg = e.one_line() if isinstance(e, FastVideoError) else f"{type(e).__name__}: {e}"
        log.error("cannot load the %s pool: %s", role, msg)
        servicer.load_error = {"code": getattr(e, "code", "INTERNAL"), "field": getattr(e, "field", None),
                               "message": msg}
        if cfg.load_failure_hold_s > 0:  # health stays NOT_SERVING; Describe says why
            log.error("staying up NOT_SERVING for %.0f s (Describe: state=failed), then exiting",
                      cfg.load_failure_hold_s)
            end = time.monotonic() + cfg.load_failure_hold_s
            while not host.stop_event.wait(0.2) and time.monotonic() < end:  # timed: signals stay handled
                pass
        host.request_stop()
        host.wait_and_drain(1.0)
        return 2 if isinstance(e, FastVideoError) and e.code in ("INVALID_ARGUMENT", "NOT_FOUND") else 1
    servicer.attach(executor, transport, card)
    from fastvideo3.telemetry.hooks import PoolTelemetry
    from fastvideo3.telemetry.metrics import ServiceMetrics, start_metrics_server
    from fastvideo3.telemetry.tracing import init_tracing
    tracing = init_tracing(role, otlp_endpoint=cfg.otlp_endpoint, trace_file=cfg.trace_file)
    metrics = ServiceMetrics(role, service=replica_id) if cfg.metrics_port is not None else None
    servicer.telemetry = PoolTelemetry(role, tracing=tracing, metrics=metrics, replica=replica_id)
    if metrics is not None:
        metrics.watch_values(servicer.metrics, role)
        start_metrics_server(cfg.metrics_port, metrics.registry, addr=cfg.host)
    host.set_serving(True)
    if not host.stop_event.is_set():
        print(f"{role} pool {replica_id} serving", flush=True)
    host.wait_and_drain(cfg.drain_timeout_s)
    tracing.shutdown()  # flush the last spans: SIGTERM runs no exit hooks
    transport.close()
    return 0


def _transport_device(cfg: PoolConfig) -> str:
    """Where the pool's tensors live, as the transports see it (``--device``, else CUDA if present;
    fake pools hold no tensors: host)."""
    if cfg.device:
        return cfg.device
    if cfg.fake:
        return "cpu"
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _load(cfg: PoolConfig, build: BuildFn, replica_id: str, host: ServiceHost, port: int,
          warm: WarmFn | None = None):
    from fastvideo3.card.registry import resolve_card
    from services.common.fake import FakeExecutor
    from services.common.transport_set import TransportSet, parse_backends
    card = resolve_card(cfg.card)
    if cfg.checkpoint_root:
        from fastvideo3.card.registry import bind_checkpoint
        card = bind_checkpoint(card, cfg.checkpoint_root)
    if not cfg.fake:  # every file this role loads is present and matches its digest, or no start
        from fastvideo3.card.verify import ROLE_KINDS, load_digest_file, verify_checkpoint
        extra = load_digest_file(cfg.checkpoint_digests, card.model_id) if cfg.checkpoint_digests else None
        checked = verify_checkpoint(card, ROLE_KINDS.get(cfg.role, frozenset()), extra)
        log.info("checkpoint verified: %d file digest(s) match", len(checked))
    device = _transport_device(cfg)
    transport = TransportSet(replica_id, parse_backends(cfg.transport, device), advertise=f"{cfg.public_host}:{port}",
                             handler_sink=host.late_handlers, device=device, host_id=cfg.host_id,
                             ucx_report_dir=cfg.ucx_report_dir, nixl_error_handling=cfg.nixl_error_handling)
    try:
        if cfg.fake:
            if cfg.fake_load_seconds > 0:  # simulated weight loading (health stays NOT_SERVING)
                host.stop_event.wait(cfg.fake_load_seconds)
            executor = FakeExecutor(cfg.role, card, transport, cfg.fake_step_seconds)
        else:
            executor = build(cfg, card, transport)
            if warm is not None:
                t0 = time.perf_counter()
                warm(cfg, executor)
                log.info("warm phase done in %.2f s", time.perf_counter() - t0)
        if isinstance(executor, PullsInputs):
            executor.fetch_deadline_s = cfg.fetch_timeout_s
        if cfg.inject_fault:
            from services.common import faults
            faults.install(executor, transport, faults.parse(cfg.inject_fault))
            log.warning("test faults armed: %s", ", ".join(cfg.inject_fault))
    except BaseException:
        transport.close()
        raise
    return executor, transport, card


def main(role: str, build: BuildFn) -> None:
    sys.exit(run_pool(role, build))
