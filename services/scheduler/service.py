"""The Scheduler gRPC servicer: Generate (a stream of typed events), Cancel, GetRequest, Describe.

Validation happens before anything is queued (INVALID_ARGUMENT / FAILED_PRECONDITION naming the
field); a Generate stream whose client goes away cancels its request server-side, so no further
WorkUnits are issued for it.
"""
from __future__ import annotations

import json
import logging
import queue
import time
from typing import Any

import fastvideo3
from fastvideo3.errors import FailedPrecondition, FastVideoError, InvalidRequest, NotFound, Unavailable
from fastvideo3.models.reward.scorers import check_scorer_names
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.scheduler import PROGRAM_T2V
from fastvideo3.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.convert import error_to_wire
from services.common.errors import abort
from services.common.server import ServiceHost, flatten
from services.scheduler.events import PHASES, STATE, WireStream
from services.scheduler.runtime import FleetRuntime

log = logging.getLogger("fastvideo3.scheduler")

SERVICE = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
OUTPUT_FORMATS = ("mp4", "npy")
_OPTIONAL = ("negative_prompt", "num_frames", "height", "width", "num_inference_steps", "guidance_scale", "seed",
             "flow_shift", "sampler", "cfg_policy", "deadline_s")


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
        self.weights: dict[str, str] = {}
        for role, key in (("encoder", "text_encoder"), ("denoiser", "transformer"), ("decoder", "vae"),
                          ("reward", "reward")):
            if role in replicas:
                info = json.loads(replicas[role][0].last_description.description_json or b"{}")
                self.weights[key] = info.get("weights_digest", "")
                if role == "reward":
                    self.scorers = sorted((info.get("executor") or {}).get("scorers") or {})

    # -- Generate -----------------------------------------------------------------------------
    def prepare(self, msg) -> tuple[Any, tuple[str, ...], dict]:
        """Validate a wire request against the card; returns (resolved, program, ctx)."""
        if msg.model and msg.model != self.card.model_id:
            raise NotFound(f"this fleet serves {self.card.model_id!r}, not {msg.model!r}", field="model",
                           limit=self.card.model_id)
        kw = {name: getattr(msg, name) for name in _OPTIONAL if msg.HasField(name)}
        req = GenerateRequest(prompt=msg.prompt, request_id=msg.request_id or None,
                              slo_class=msg.slo_class or "interactive", **kw)
        resolved = resolve(req, self.card, precision=self.precision)
        fmt = msg.output_format or "mp4"
        if fmt not in OUTPUT_FORMATS:
            raise InvalidRequest(f"unknown output format {fmt!r}", field="output_format",
                                 limit=", ".join(OUTPUT_FORMATS))
        fps = msg.fps if msg.HasField("fps") else self.card.limits.fps
        if not 1 <= fps <= 120:
            raise InvalidRequest(f"{fps} is out of range", field="fps", limit="[1, 120]")
        program: tuple[str, ...] = PROGRAM_T2V
        rewards: list[str] = []
        if msg.reward_scorers:
            if "reward" not in self.replicas:
                raise FailedPrecondition("this fleet has no reward pool", field="reward_scorers", limit="none")
            try:
                rewards = check_scorer_names(list(msg.reward_scorers), available=self.scorers)
            except InvalidRequest as e:
                raise InvalidRequest(e.message, field="reward_scorers", limit=e.limit) from None
            program = (*PROGRAM_T2V, "reward_score")
        ctx = {"encode": fmt, "fps": fps, "rewards": rewards, "metadata": dict(msg.metadata)}
        if msg.detached:
            ctx["detached"] = True
        return resolved, program, ctx

    def Generate(self, request, context):  # noqa: N802 - gRPC naming
        try:
            with self.host.work():  # the whole stream counts as in-flight work for draining
                resolved, program, ctx = self.prepare(request)
                from fastvideo3.telemetry.tracing import extract_context
                parent = extract_context(context.invocation_metadata())
                stream = self.runtime.submit(resolved, self.card, program=program, ctx=ctx, trace_parent=parent)
                context.add_callback(lambda: self.runtime.disconnect(stream))
                yield from self._pump(stream, context)
        except FastVideoError as e:
            abort(context, e)

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
                if ev.kind == "moved":  # this replica handed its requests over (services/scheduler/leader.py)
                    from fastvideo3.errors import loss_report
                    raise Unavailable(f"this scheduler replica stopped and handed request {stream.request_id!r} "
                                      "over to another replica: send the same request again (same id and "
                                      "parameters) to any replica to re-attach", retry_after_s=1.0,
                                      request_id=stream.request_id,
                                      details=loss_report(retryable=True, role="scheduler"))
                yield from wire.convert(ev)
                if ev.kind == "finished":
                    return
        finally:
            self.runtime.close_stream(stream)

    def sidecar(self, run, data: dict) -> dict:
        """Provenance of one output, as the embedded engine writes it (plus the fleet's view)."""
        r = run.request
        return {
            "card": self.card.model_id,
            "recipe": self.card.recipe.model_dump(mode="json"),
            "request": r.to_dict(),
            "weights": {k: v for k, v in self.weights.items() if k != "reward"},
            "timings_s": {k: round(v, 4) for k, v in data.get("phase_seconds", {}).items()},
            "latent_norms": run.ctx.get("payloads", {}).get("diffusion_denoise", {}).get("latent_norms", []),
            "fps": run.ctx.get("fps", self.card.limits.fps),
            "fastvideo3_version": fastvideo3.__version__,
            "output_format": run.ctx.get("encode"),
            "rewards": run.ctx.get("payloads", {}).get("reward_score", {}).get("scores", {}),
            "metadata": run.ctx.get("metadata", {}),
            "fleet": {"engine_id": self.deployment_card.engine_id, "transport": dict(self.edges),
                      "batching": self.runtime.batching,
                      "replicas": {role: self.replicas[role][i].replica_id for role, i in run.placement.items()}},
        }

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
            last = next((e for e in reversed(run.events) if e.kind == "progress"), None)
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
        pools, live = [], {}
        every = [(role, rep) for role, reps in self.replicas.items() for rep in reps]

        def ask(rep) -> dict:
            # a replica that stopped answering is not asked; the others answer within 1 s, together
            if not rep.healthy:
                raise Unavailable("not serving (failed health checks)")
            return rep.describe(timeout=min(1.0, rep.control_timeout_s))

        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=max(1, len(every)), thread_name_prefix="describe") as ex:
            answers = [ex.submit(ask, rep) for _, rep in every]
        for (role, rep), fut in zip(every, answers):
            pools.append(scheduler_pb2.PoolStatus(role=role, replica_id=rep.replica_id, address=rep.target,
                                                  healthy=rep.healthy,
                                                  in_flight_units=int(self.runtime.sched.inflight.get(id(rep), 0))))
            try:
                live[rep.replica_id] = fut.result()
            except FastVideoError as e:
                live[rep.replica_id] = {"role": role, "target": rep.target, "error": e.one_line()}
            live[rep.replica_id]["remote_counters"] = dict(rep.counters)
            live[rep.replica_id]["health_changed_unix"] = rep.health_changed_unix
        sched = self.runtime.sched
        desc = {"transport_edges": self.edges, "batching": self.runtime.batching, "config": self.config,
                "pools": live, "scheduler": counters,
                "recent_denoise_batch_sizes": list(sched.batch_sizes)[-64:]}
        card = self.deployment_card
        if sched.pricer is not None:  # publish the live, calibrated cost model
            from services.scheduler.deployment import cost_model_spec
            card = scheduler_pb2.SchedulerDescription().card.__class__.FromString(card.SerializeToString())
            card.cost_model.CopyFrom(cost_model_spec(sched.pricer.cost_model))
            desc["cost_model_error"] = sched.pricer.cost_model.error_stats()
        if sched.admission is not None:
            desc["admission"] = sched.admission.counters()
        return scheduler_pb2.SchedulerDescription(
            card=card, queued_requests=int(counters["queued_requests"]),
            running_requests=int(counters["running_requests"]), pools=pools,
            counters={k: float(v) for k, v in flatten(counters).items()},
            description_json=json.dumps(desc, default=str).encode())

    def metrics(self) -> dict[str, float]:
        out = flatten(self.runtime.counters())
        out["serving"] = float(self.host.serving and not self.host.draining)
        for role, reps in self.replicas.items():
            out[f"pools.{role}.healthy_replicas"] = float(sum(r.healthy for r in reps))
        return out
