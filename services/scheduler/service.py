"""The Scheduler gRPC servicer: Generate (a stream of typed events), Cancel, GetRequest, Describe.

Validation happens before anything is queued (INVALID_ARGUMENT / FAILED_PRECONDITION naming the
field); a Generate stream whose client goes away cancels its request server-side, so no further
WorkUnits are issued for it.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Any

from fastvideo3.errors import FailedPrecondition, FastVideoError, InvalidRequest, NotFound, Unavailable
from fastvideo3.loop.context import RequestContext
from fastvideo3.models.reward.scorers import check_scorer_names
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.scheduling.scheduler import PROGRAM_T2V
from fastvideo3.v1 import scheduler_pb2, scheduler_pb2_grpc
from fastvideo3.vocab import EventKind, LoopId, OUTPUT_FORMATS, OutputFormat, Role
from services.common.convert import error_to_wire
from services.common.errors import abort
from services.common.server import ServiceHost, flatten
from services.scheduler.events import PHASES, STATE, WireStream
from services.scheduler.fleet_runtime import FleetRuntime

log = logging.getLogger("fastvideo3.scheduler")

SERVICE = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
_OPTIONAL = ("negative_prompt", "num_frames", "height", "width", "num_inference_steps", "guidance_scale",
             "guidance_scale_2", "seed", "flow_shift", "sampler", "cfg_policy", "deadline_s")


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, host: ServiceHost, runtime: FleetRuntime, card, *, precision: str, replicas: dict[str, list],
                 edges: dict[str, str], deployment_card, config: dict[str, Any]):
        self.host = host
        self.runtime = runtime
        self.card = card
        self.precision = precision
        self.replicas = replicas
        self.edges = edges
        self.deployment_card = deployment_card
        self.config = config
        self.scorers: list[str] = []
        from fastvideo3.telemetry.scaling import ScalingSignals, WorkLedger
        self.ledger = WorkLedger()  # live load: predicted GPU-seconds owed per role
        self.scaling = ScalingSignals(target_utilization=float(config.get("scaling_target_utilization", 0.7)),
                                      window_s=float(config.get("scaling_window_s", 60.0)),
                                      roles=tuple(r for r in (Role.ENCODER, Role.DENOISER, Role.DECODER, Role.REWARD)
                                                  if r in replicas))
        self.weights: dict[str, str] = {}
        for role, key in ((Role.ENCODER, "text_encoder"), (Role.DENOISER, "transformer"), (Role.DECODER, "vae"),
                          (Role.REWARD, Role.REWARD)):
            pools = [k for k in replicas if k.partition(":")[0] == role]  # denoiser:EXPERT pools too
            if pools:
                descs = [replicas[k][0].last_description for k in pools]
                self.weights[key] = "+".join(d.weights_digest for d in descs)
                if role == Role.REWARD:
                    self.scorers = sorted(descs[0].scorers)
        # the adapters requests may name (id -> version); a restarted scheduler learns the ones
        # every denoiser replica already holds
        self.adapters: dict[str, str] = _common_adapters(replicas.get(Role.DENOISER, []))
        self._adapter_lock = threading.Lock()
        from fastvideo3.request.image import ImagePolicy
        self.image_policy = ImagePolicy(max_bytes=int(config.get("max_image_bytes", 16 << 20)),
                                        allow_urls=bool(config.get("allow_image_urls", False)),
                                        url_timeout_s=float(config.get("image_url_timeout_s", 10.0)))

    # -- Generate -----------------------------------------------------------------------------
    def prepare(self, msg) -> tuple[Any, tuple[str, ...], dict]:
        """Validate a wire request against the card; returns (resolved, program, ctx)."""
        if msg.model and msg.model != self.card.model_id:
            raise NotFound(f"this fleet serves {self.card.model_id!r}, not {msg.model!r}", field="model",
                           limit=self.card.model_id)
        kw = {name: getattr(msg, name) for name in _OPTIONAL if msg.HasField(name)}
        if msg.adapters:
            kw["adapters"] = [{"id": a.id, "scale": a.scale} for a in msg.adapters]
            if any(a.id not in self.adapters for a in msg.adapters):
                self._refresh_adapters()  # loaded through another scheduler replica, perhaps
        if msg.HasField("cache"):
            kw["cache"] = {"policy": msg.cache.policy, **dict(msg.cache.params), **dict(msg.cache.flags)}
        source = msg.WhichOneof("image_source")
        if source == "image":
            kw["image"] = bytes(msg.image)
        elif source == "image_url":
            if not msg.image_url.startswith(("http://", "https://")):
                raise InvalidRequest("must be an http(s) URL", field="image", limit="http://, https://")
            kw["image"] = msg.image_url
        req = GenerateRequest(prompt=msg.prompt, request_id=msg.request_id or None,
                              slo_class=msg.slo_class or "interactive", **kw)
        resolved = resolve(req, self.card, precision=self.precision, adapters=dict(self.adapters),
                           image_policy=self.image_policy)
        fmt = msg.output_format or OutputFormat.MP4
        if fmt not in OUTPUT_FORMATS:
            raise InvalidRequest(f"unknown output format {fmt!r}", field="output_format",
                                 limit=", ".join(OUTPUT_FORMATS))
        fps = msg.fps if msg.HasField("fps") else self.card.limits.fps
        if not 1 <= fps <= 120:
            raise InvalidRequest(f"{fps} is out of range", field="fps", limit="[1, 120]")
        program: tuple[str, ...] = PROGRAM_T2V
        rewards: list[str] = []
        if msg.reward_scorers:
            if Role.REWARD not in self.replicas:
                raise FailedPrecondition("this fleet has no reward pool", field="reward_scorers", limit="none")
            try:
                rewards = check_scorer_names(list(msg.reward_scorers), available=self.scorers)
            except InvalidRequest as e:
                raise InvalidRequest(e.message, field="reward_scorers", limit=e.limit) from None
            program = (*PROGRAM_T2V, LoopId.REWARD_SCORE)
        ctx = RequestContext(encode=fmt, fps=fps, rewards=rewards, metadata=dict(msg.metadata),
                             detached=bool(msg.detached))
        return resolved, program, ctx

    def Generate(self, request, context):  # noqa: N802 - gRPC naming
        try:
            with self.host.work():  # the whole stream counts as in-flight work for draining
                resolved, program, ctx = self.prepare(request)
                cost = self._observe_arrival(resolved, program)
                from fastvideo3.telemetry.tracing import extract_context
                parent = extract_context(context.invocation_metadata())
                stream = self.runtime.submit(resolved, self.card, program=program, ctx=ctx, trace_parent=parent)
                if cost:
                    self.ledger.add(stream.request_id, cost)
                context.add_callback(lambda: self.runtime.disconnect(stream))
                yield from self._pump(stream, context)
        except FastVideoError as e:
            abort(context, e)

    def _observe_arrival(self, resolved, program) -> dict[str, float]:
        """Feed the scaling signals; returns this request's predicted GPU-seconds per role."""
        pricer = self.runtime.pricer
        if pricer is None:
            return {}
        from fastvideo3.telemetry.scaling import request_role_seconds
        cost: dict[str, float] = {}
        try:
            cost = request_role_seconds(pricer, self.card, resolved, program)
            self.scaling.observe(cost)
        except FastVideoError as e:  # pricing never blocks a request
            log.warning("scaling signal: cannot price request: %s", e.one_line())
        for role, reps in self.replicas.items():
            if role in self.scaling.roles:
                self.scaling.set_current(role, sum(r.healthy for r in reps))
        return cost

    def load(self) -> scheduler_pb2.LoadReport:
        """The fleet's live load for routers: GPU-seconds owed per role, requests, free memory."""
        out = scheduler_pb2.LoadReport(owed_gpu_seconds=self.ledger.owed(), requests=len(self.ledger),
                                       replicas={role: sum(r.healthy for r in reps)
                                                 for role, reps in self.replicas.items()})
        adm = self.runtime.admission
        if adm is not None:
            c = adm.counters()
            out.admission = True
            out.memory_budget_bytes = int(c["memory_budget_bytes"])
            out.memory_free_bytes = int(c["memory_budget_bytes"]) - int(c["memory_reserved_bytes"])
            out.admission_reserved_gpu_seconds = sum(k["reserved_gpu_seconds"] for k in c["classes"].values())
            out.admission_waiting = sum(int(k["waiting"]) for k in c["classes"].values())
        return out

    def _pump(self, stream, context):
        run = self.runtime.get(stream.request_id)
        wire = WireStream(run, self.sidecar)
        try:
            while True:
                try:
                    ev = stream.events.get(timeout=0.5)
                except queue.Empty:
                    if not context.is_active():  # the client is gone (the callback also fires)
                        self.runtime.disconnect(stream)
                        return
                    continue
                if ev.kind == EventKind.PROGRESS and ev.data.get("phase") in ("denoise", LoopId.DIFFUSION_DENOISE):
                    self.ledger.progress(stream.request_id, int(ev.data.get("step", 0)), int(ev.data.get("total", 0)))
                if ev.kind == EventKind.MOVED:  # this replica handed its requests over (services/scheduler/leader.py)
                    from fastvideo3.errors import loss_report
                    raise Unavailable(f"this scheduler replica stopped and handed request {stream.request_id!r} "
                                      "over to another replica: send the same request again (same id and "
                                      "parameters) to any replica to re-attach", retry_after_s=1.0,
                                      request_id=stream.request_id,
                                      details=loss_report(retryable=True, role="scheduler"))
                yield from wire.convert(ev)
                if ev.kind == EventKind.FINISHED:
                    return
        finally:
            self.ledger.remove(stream.request_id)
            self.runtime.close_stream(stream)

    def sidecar(self, run, data: dict) -> dict:
        """Provenance of one output, as the embedded engine writes it (plus the fleet's view)."""
        from fastvideo3.provenance import provenance
        fingerprints = {role: self.replicas[role][i].fingerprint for role, i in run.placement.items()
                        if role == Role.DENOISER}
        return {
            **provenance(self.card, run, phase_seconds=data.get("phase_seconds", {}),
                         fps=run.ctx.fps if run.ctx.fps is not None else self.card.limits.fps,
                         weights={k: v for k, v in self.weights.items() if k != Role.REWARD},
                         runtime={"fingerprints": fingerprints}),
            "output_format": run.ctx.encode,
            "rewards": run.ctx.payloads.get(LoopId.REWARD_SCORE, {}).get("scores", {}),
            "metadata": run.ctx.metadata,
            "fleet": {"engine_id": self.deployment_card.engine_id, "transport": dict(self.edges),
                      "batching": self.runtime.batching,
                      "replicas": {role: self.replicas[role][i].replica_id for role, i in run.placement.items()}},
        }

    # -- adapters (admin) ----------------------------------------------------------------------
    def LoadAdapter(self, request, context):  # noqa: N802
        """Load into every denoiser replica; only when all hold the same version do new requests
        get it (a replica that fails leaves the previous version in force)."""
        from fastvideo3.v1 import adapter_pb2
        try:
            with self.host.work(), self._adapter_lock:
                reps = self.replicas.get(Role.DENOISER, [])
                if not reps:
                    raise FailedPrecondition("this fleet has no denoiser pool", field="adapter_id")
                infos = [rep.load_adapter(request.adapter_id, request.path) for rep in reps]
                versions = {i["version"] for i in infos}
                if len(versions) != 1:
                    raise FailedPrecondition(f"replicas loaded different versions {sorted(versions)}", field="path")
                self.adapters[request.adapter_id] = infos[0]["version"]
                log.info("adapter %s now at version %s", request.adapter_id, infos[0]["version"])
                return adapter_pb2.AdapterInfo(adapter_id=request.adapter_id, version=infos[0]["version"],
                                               rank=infos[0]["rank"], bytes=infos[0]["bytes"],
                                               replicas=[r.replica_id for r in reps])
        except FastVideoError as e:
            abort(context, e)

    def UnloadAdapter(self, request, context):  # noqa: N802
        """New requests naming the adapter are refused from now on; the pools remove it once the
        requests using it are done (waiting up to ``wait_s``)."""
        from fastvideo3.v1 import adapter_pb2
        try:
            with self.host.work():
                if not 0.0 <= request.wait_s <= 3600.0:
                    raise InvalidRequest(f"{request.wait_s}", field="wait_s", limit="[0, 3600]")
                with self._adapter_lock:
                    version = self.adapters.pop(request.adapter_id, None)
                    if version is None:
                        raise NotFound(f"adapter {request.adapter_id!r} is not loaded", field="adapter_id")
                versions: set[str] = set()
                deadline = time.monotonic() + request.wait_s
                try:
                    # admitted requests that have not reached the denoiser yet hold no pin there:
                    # wait for every request naming it here first, then let the pools remove it
                    while users := self._requests_naming(request.adapter_id):
                        if time.monotonic() >= deadline:
                            raise FailedPrecondition(f"adapter {request.adapter_id!r} is in use by "
                                                     f"{len(users)} request(s)", field="adapter_id",
                                                     details={"requests": users[:8]})
                        time.sleep(0.05)  # bounded by the deadline above
                    left = max(0.0, deadline - time.monotonic())
                    for rep in self.replicas.get(Role.DENOISER, []):
                        versions.update(rep.unload_adapter(request.adapter_id, left))
                except FastVideoError:  # refused (still in use): requests may name it again
                    with self._adapter_lock:
                        self.adapters.setdefault(request.adapter_id, version)
                    raise
                return adapter_pb2.UnloadAdapterResponse(adapter_id=request.adapter_id, versions=sorted(versions))
        except FastVideoError as e:
            abort(context, e)

    def _requests_naming(self, adapter_id: str) -> list[str]:
        runs = self.runtime.active()
        return [r.request_id for r in runs if any(a["id"] == adapter_id for a in r.request.adapters)]

    def _refresh_adapters(self) -> None:
        reps = [r for r in self.replicas.get(Role.DENOISER, []) if r.healthy]
        try:
            for rep in reps:
                rep.describe_raw(timeout=min(2.0, rep.control_timeout_s))
        except FastVideoError:
            return  # keep what we know; the request is refused NOT_FOUND if it is not there
        with self._adapter_lock:
            self.adapters = _common_adapters(reps)

    # -- Cancel / GetRequest ------------------------------------------------------------------
    def Cancel(self, request, context):  # noqa: N802
        run = self.runtime.lookup(request.request_id)
        if run is None:
            abort(context, NotFound("no such request", field="request_id"))
        ok = self.runtime.cancel(request.request_id)
        if ok:
            log.info("cancel %s (%s)", request.request_id, request.reason or "no reason given")
        return scheduler_pb2.CancelResponse(request_id=request.request_id, cancelled=ok, state=STATE.Value(run.status))

    def GetRequest(self, request, context):  # noqa: N802
        run = self.runtime.lookup(request.request_id)  # an ended request is read back from the store
        if run is None:
            abort(context, NotFound("no such request (or no longer retained)", field="request_id"))
        step, total = run.progress()
        phase = PHASES.get(run.loop_id or "", run.loop_id or "done")
        if run.driver is None:  # between loops or ended: report the last progress it made
            last = next((e for e in reversed(run.events) if e.kind == EventKind.PROGRESS), None)
            if last is not None:
                step, total = int(last.data.get("step", 0)), int(last.data.get("total", 0))
                phase = PHASES.get(last.data.get("phase"), last.data.get("phase", phase))
        msg = scheduler_pb2.RequestStatus(
            request_id=run.request_id, state=STATE.Value(run.status), card_id=run.card.model_id,
            phase=phase, step=step, total=total,
            created_unix_ms=int(run.created * 1000), updated_unix_ms=int(time.time() * 1000),
            last_seq=max(0, len(run.events) - 1))
        if run.error is not None:
            msg.error.CopyFrom(error_to_wire(run.error, run.request_id))
        return msg

    # -- Describe -----------------------------------------------------------------------------
    def Describe(self, request, context):  # noqa: N802
        counters = self.runtime.counters()
        pools = []
        every = [(role, rep) for role, reps in self.replicas.items() for rep in reps]

        def ask(rep):
            # a replica that stopped answering is not asked; the others answer within 1 s, together
            if not rep.healthy:
                raise Unavailable("not serving (failed health checks)")
            return rep.describe_raw(timeout=min(1.0, rep.control_timeout_s))

        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=max(1, len(every)), thread_name_prefix="describe") as ex:
            answers = [ex.submit(ask, rep) for _, rep in every]
        for (role, rep), fut in zip(every, answers):
            status = scheduler_pb2.PoolStatus(role=role, replica_id=rep.replica_id, address=rep.target,
                                              healthy=rep.healthy,
                                              in_flight_units=self.runtime.in_flight_units(rep),
                                              health_changed_unix=rep.health_changed_unix,
                                              remote_counters={k: float(v) for k, v in rep.counters.items()},
                                              output_transport=rep.output_transport)
            try:
                status.description.CopyFrom(fut.result())
            except FastVideoError as e:
                status.error = e.one_line()
            pools.append(status)
        pricer, admission = self.runtime.pricer, self.runtime.admission
        diag = {"config": self.config, "scheduler": counters,
                "recent_denoise_batch_sizes": self.runtime.recent_batch_sizes(64)}
        card = self.deployment_card
        if pricer is not None:  # publish the live, calibrated cost model
            from services.scheduler.deployment import cost_model_spec
            card = scheduler_pb2.SchedulerDescription().card.__class__.FromString(card.SerializeToString())
            card.cost_model.CopyFrom(cost_model_spec(pricer.cost_model))
            diag["cost_model_error"] = pricer.cost_model.error_stats()
        if admission is not None:
            diag["admission"] = admission.counters()
        diag["scaling"] = self.scaling.values()
        return scheduler_pb2.SchedulerDescription(
            card=card, queued_requests=int(counters["queued_requests"]),
            running_requests=int(counters["running_requests"]), pools=pools,
            counters={k: float(v) for k, v in flatten(counters).items()},
            transport_edges=self.edges, batching=bool(self.runtime.batching),
            batch_invariant_bucket=int(self.runtime.batch_bucket or 0),
            adapters=dict(self.adapters),  # id -> the version new requests get
            load=self.load(), diagnostics_json=json.dumps(diag, default=str))

    def metrics(self) -> dict[str, float]:
        out = flatten(self.runtime.counters())
        out["serving"] = float(self.host.serving and not self.host.draining)
        for role, reps in self.replicas.items():
            out[f"pools.{role}.healthy_replicas"] = float(sum(r.healthy for r in reps))
        return out


def _common_adapters(replicas) -> dict[str, str]:
    """id -> version of the current adapters every replica reports in its last Describe."""
    from services.common.description import current_adapters
    seen = [current_adapters(rep.last_description) if rep.last_description is not None else {} for rep in replicas]
    if not seen:
        return {}
    common = dict(seen[0])
    for other in seen[1:]:
        common = {k: v for k, v in common.items() if other.get(k) == v}
    return common
