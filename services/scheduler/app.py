"""The scheduler process: listen (NOT_SERVING), wait for every pool replica to be SERVING,
describe them, choose the transport per edge, start the tick thread, then SERVING. On SIGTERM:
NOT_SERVING, refuse new requests, let running streams finish (bounded by the drain timeout),
cancel what is left, release it on the pools, exit."""
from __future__ import annotations

import dataclasses
import logging
import sys
import threading

from fastvideo3.v1 import scheduler_pb2_grpc
from fastvideo3.vocab import Role
from services.common.server import ServiceHost, setup_logging
from services.scheduler.config import SchedulerConfig, parse_args

log = logging.getLogger("fastvideo3.scheduler")


FORWARDED_BY = "x-fastvideo3-forwarded-by"  # metadata of a call a standby forwarded to the leader


class _Gate(scheduler_pb2_grpc.SchedulerServicer):
    """Answers UNAVAILABLE until the fleet is connected, then delegates to the real servicer."""

    def __init__(self) -> None:
        self.target = None
        self.leadership = None  # services.scheduler.leader.Leadership when replicas elect a leader
        self.security = None
        self._channels: dict[str, object] = {}

    def _get(self, context):
        if self.target is None:
            from fastvideo3.errors import Unavailable
            from services.common.errors import abort
            abort(context, Unavailable("the scheduler is still connecting to its pools", retry_after_s=1.0))
        return self.target

    def _leader(self, context):
        """A stub to the leader when this replica is a standby, else None (serve here)."""
        lead = self.leadership
        if lead is None or lead.is_leader:
            return None
        address = lead.leader_address
        forwarded = any(k == FORWARDED_BY for k, _ in context.invocation_metadata())
        if not address or address == lead.address or forwarded:
            # no leader; or the lease still names a dead incarnation of this very replica
            # (restarted on the same address before its lease expired); or another standby sent
            # this call here believing this replica leads: forwarding again could loop (each hop
            # holding a server thread until the deadline), so the client is told to retry
            from fastvideo3.errors import Unavailable, loss_report
            from services.common.errors import abort
            why = ("no scheduler leader right now (an election is under way)" if not address or address == lead.address
                   else f"this replica is not the scheduler leader (the lease names {lead.holder})")
            abort(context, Unavailable(f"{why}: send the same request again (same id and parameters) to any replica",
                                       retry_after_s=lead.ttl_s,
                                       details=loss_report(retryable=True, role="scheduler")))
        channel = self._channels.get(address)
        if channel is None:
            import grpc
            channel = (self.security.channel(address) if self.security is not None and self.security.enabled
                       else grpc.insecure_channel(address))
            self._channels[address] = channel
        return scheduler_pb2_grpc.SchedulerStub(channel)

    def _forwarded(self, context) -> list:
        keep = [(k, v) for k, v in context.invocation_metadata() if k in ("authorization", "traceparent")]
        return [*keep, (FORWARDED_BY, self.leadership.owner)]  # one hop only (see _leader)

    def _unary(self, name: str, request, context):
        stub = self._leader(context)
        if stub is None:
            return getattr(self._get(context), name)(request, context)
        import grpc
        try:
            return getattr(stub, name)(request, timeout=context.time_remaining(), metadata=self._forwarded(context))
        except grpc.RpcError as err:
            from services.common.errors import abort, error_from_rpc
            abort(context, error_from_rpc(err))

    def Generate(self, request, context):  # noqa: N802 - gRPC naming
        stub = self._leader(context)
        if stub is None:
            yield from self._get(context).Generate(request, context)
            return
        import grpc
        call = stub.Generate(request, timeout=context.time_remaining(), metadata=self._forwarded(context))
        context.add_callback(call.cancel)  # the client went away: so does the forwarded call
        try:
            yield from call
        except grpc.RpcError as err:
            from services.common.errors import abort, error_from_rpc
            abort(context, error_from_rpc(err))

    def Cancel(self, request, context):  # noqa: N802
        return self._unary("Cancel", request, context)

    def GetRequest(self, request, context):  # noqa: N802
        return self._unary("GetRequest", request, context)

    def Describe(self, request, context):  # noqa: N802
        return self._get(context).Describe(request, context)

    def LoadAdapter(self, request, context):  # noqa: N802
        return self._get(context).LoadAdapter(request, context)

    def UnloadAdapter(self, request, context):  # noqa: N802
        return self._get(context).UnloadAdapter(request, context)


def _monitor(replicas: dict[str, list], stop: threading.Event, interval_s: float = 1.0,
             timeout_s: float = 1.0) -> list[threading.Thread]:
    """One health-check loop per replica (a hung replica never delays the checks of the others).
    A replica that stops answering is routed around and its in-flight calls are cancelled
    (RemoteExecutor.check_health); it is used again once it reports SERVING."""

    def watch(rep) -> None:
        while not stop.wait(interval_s):
            was = rep.healthy
            if rep.check_health(timeout=timeout_s) != was:
                log.warning("%s pool %s is now %s", rep.role, rep.target, "SERVING" if rep.healthy else "NOT SERVING")

    threads = [threading.Thread(target=watch, args=(rep,), name=f"health-{rep.target}", daemon=True)
               for reps in replicas.values() for rep in reps]
    for t in threads:
        t.start()
    return threads


def connect(cfg: SchedulerConfig, card_id: str, stop: threading.Event):
    """RemoteExecutors for every configured replica, SERVING and described, with edges chosen."""
    from fastvideo3.errors import FailedPrecondition
    from services.scheduler.remote import RemoteExecutor
    from services.scheduler.topology import caps_of, choose_edges, output_transport
    security = cfg.security()
    replicas = {role: [RemoteExecutor(role, t, rpc_timeout_s=cfg.rpc_timeout_s, control_timeout_s=cfg.control_timeout_s,
                                      security=security if security.enabled else None,
                                      unhealthy_after=cfg.unhealthy_after)
                       for t in targets] for role, targets in cfg.pools.items()}
    for reps in replicas.values():
        for rep in reps:
            rep.wait_serving(cfg.connect_timeout_s, stop)
    caps = {}
    for role, reps in replicas.items():
        for rep in reps:
            d = rep.describe_raw()
            if d.role != role.partition(":")[0]:  # denoiser:EXPERT pools are denoiser pools
                raise FailedPrecondition(f"{rep.target} is a {d.role or 'unknown'} pool", field=f"pools.{role}",
                                         limit=role)
            if card_id not in d.card_ids:
                raise FailedPrecondition(f"{rep.target} serves {list(d.card_ids)}, not {card_id!r}",
                                         field=f"pools.{role}", limit=card_id)
            caps.setdefault(role.partition(":")[0], []).append(caps_of(d))
    edges = choose_edges(cfg, caps)
    for role, reps in replicas.items():
        for rep in reps:
            rep.output_transport = output_transport(edges, role.partition(":")[0])
    return replicas, edges


def denoiser_replica(replicas: dict[str, list]):
    """A denoiser replica: of the ``denoiser`` pools, or of the first expert's (``denoiser:EXPERT``)."""
    for role, reps in replicas.items():
        if role.partition(":")[0] == Role.DENOISER and reps:
            return reps[0]
    raise KeyError(Role.DENOISER)


def run_scheduler(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    setup_logging(cfg.log_level)
    from services.scheduler.service import SERVICE
    host = ServiceHost([SERVICE], cfg.host, cfg.port, security=cfg.security(), max_receive_bytes=cfg.max_request_bytes)
    gate = _Gate()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(gate, host.server)
    port = host.start()
    host.install_signals()
    if cfg.exit_with_parent:
        host.watch_parent()
    print(f"scheduler listening on {cfg.host}:{port} (connecting to pools)", flush=True)
    try:
        servicer, runtime, replicas = _build(cfg, host)
    except Exception as e:  # noqa: BLE001
        from fastvideo3.errors import FastVideoError
        msg = e.one_line() if isinstance(e, FastVideoError) else f"{type(e).__name__}: {e}"
        stopping = host.stop_event.is_set()
        log.log(logging.INFO if stopping else logging.ERROR, "scheduler %s: %s",
                "stopped while connecting" if stopping else "cannot start", msg)
        host.request_stop()
        host.wait_and_drain(1.0)
        if stopping:
            return 0
        return 2 if isinstance(e, FastVideoError) and e.code in ("INVALID_ARGUMENT", "NOT_FOUND") else 1
    leadership = None
    if cfg.leader_lease_s:  # elected (or not) before the gate opens: a standby never serves a call itself
        leadership = _elect(cfg, port, runtime, servicer.card)
        gate.leadership, gate.security = leadership, cfg.security()
    gate.target = servicer
    monitor_stop = threading.Event()
    _monitor(replicas, monitor_stop, cfg.health_interval_s, cfg.health_timeout_s)
    if cfg.metrics_port is not None:
        from fastvideo3.telemetry.metrics import start_metrics_server
        metrics = runtime.telemetry.metrics
        metrics.watch_values(servicer.metrics, "scheduler")
        metrics.watch_cost_model(runtime.pricer.cost_model, servicer.card.model_id)
        metrics.watch_admission(runtime.admission, Role.DENOISER)
        metrics.watch_scaling(servicer.scaling, cfg.engine_id, servicer.ledger)
        start_metrics_server(cfg.metrics_port, metrics.registry, addr=cfg.host)
    host.set_serving(True)
    if not host.stop_event.is_set():
        print(f"scheduler serving on {cfg.host}:{port} (edges: {servicer.edges})", flush=True)
    handed_over = threading.Event()

    def hand_over() -> None:  # a leader leaving (e.g. a rolling update): the standby adopts its requests
        if leadership is not None and leadership.is_leader:
            left = runtime.hand_over()
            leadership.stop()  # release the lease now: a standby takes it without waiting for it to expire
            handed_over.set()
            log.info("handed %d request(s) over to the next leader: %s", len(left), ", ".join(left) or "none")

    host.wait_and_drain(cfg.drain_timeout_s, on_drain=hand_over)
    if leadership is not None and not handed_over.is_set():
        leadership.stop()
    monitor_stop.set()
    runtime.stop(cancel_active=not handed_over.is_set())
    runtime.telemetry.tracing.shutdown()  # flush the last spans: SIGTERM runs no exit hooks
    for reps in replicas.values():
        for rep in reps:
            rep.close()
    return 0


def _build(cfg: SchedulerConfig, host: ServiceHost):
    from fastvideo3.card.registry import resolve_card
    from services.scheduler.deployment import build_card
    from services.scheduler.fleet_runtime import FleetRuntime
    from services.scheduler.service import SERVICE, SchedulerServicer
    card = resolve_card(cfg.card)
    replicas, edges = connect(cfg, card.model_id, host.stop_event)
    # never send a pool a bigger batch than it accepts
    max_batch = min([cfg.max_batch] + [r.last_description.max_batch_units or cfg.max_batch
                                       for reps in replicas.values() for r in reps])
    precision = denoiser_replica(replicas).last_description.precision or card.precision.default_cpu
    pricer, admission, telemetry = _economy(cfg)
    from services.scheduler.plans import denoiser_plan
    # a multi-rank replica prices by its plan (denoiser pools, one per expert where the card has two)
    plan = denoiser_plan(card, [r for key, reps in replicas.items() if key.split(":")[0] == Role.DENOISER
                                for r in reps])
    if plan is not None:
        pricer.plans[Role.DENOISER] = plan
    checkpointer = _checkpointer(cfg)
    runtime = FleetRuntime(replicas, batching=cfg.batching, max_batch=max_batch, max_running=cfg.max_running,
                           max_queued=cfg.max_queued, retain_finished=cfg.retain_finished, pricer=pricer,
                           admission=admission, telemetry=telemetry, checkpointer=checkpointer,
                           batch_bucket=cfg.batch_bucket(max_batch), pipeline_depth=cfg.pipeline_depth,
                           split_min_units=cfg.double_buffer_min_units, release_after_s=cfg.release_after_s,
                           cohort_rows=cfg.cohort_rows)
    runtime.card_of = lambda card_id: card if card_id == card.model_id else None
    if not cfg.leader_lease_s:  # with an election, the elected replica resumes (see _elect)
        _resume(checkpointer, card)
    deployment = build_card(cfg, card, replicas, edges, ["", SERVICE], cost_model=pricer.cost_model)
    config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}
    servicer = SchedulerServicer(host, runtime, card, precision=precision, replicas=replicas, edges=edges,
                                 deployment_card=deployment, config=config)
    runtime.start()
    return servicer, runtime, replicas


def _resume(checkpointer, card) -> None:
    resumed = checkpointer.resume(card)  # requests a previous scheduler left in flight
    if resumed:
        log.info("resumed %d in-flight request(s) from %s: %s", len(resumed), checkpointer.store.address,
                 ", ".join(resumed))


def _elect(cfg: SchedulerConfig, port: int, runtime, card):
    """Join the leader election (services/scheduler/leader.py); the elected replica adopts what
    the store lists in flight."""
    import os
    import socket
    from services.scheduler.leader import Leadership
    address = cfg.advertise or f"{cfg.host if cfg.host not in ('0.0.0.0', '::', '') else socket.gethostname()}:{port}"
    me = f"{socket.gethostname()}-{os.getpid()}"
    lead = Leadership(runtime.checkpointer.store, me, address, cfg.leader_lease_s,
                      on_elected=lambda: _resume(runtime.checkpointer, card))
    lead.start()
    log.info("leader election: %s (lease %.1fs); leader now %s", lead.owner, cfg.leader_lease_s, lead.holder or "none")
    return lead


def _checkpointer(cfg: SchedulerConfig):
    """The state store (checked now: a scheduler that cannot reach it does not start) and the
    checkpointer over it."""
    from fastvideo3.runtime.durability.checkpointer import Checkpointer
    from fastvideo3.state import StoreConfig, make_store
    store = make_store(cfg.state_store, StoreConfig(namespace=cfg.state_namespace or cfg.engine_id,
                                                    ttl_after_end_s=cfg.state_ttl_s, timeout_s=cfg.state_timeout_s))
    store.ping()
    return Checkpointer(store, every=cfg.checkpoint_every, retry_s=max(0.5, cfg.state_timeout_s),
                        replica_wait_s=cfg.replica_wait_s).start_writer()


def _economy(cfg: SchedulerConfig):
    """The scheduler's pricer (cost model), admission controller and telemetry hooks."""
    from fastvideo3.runtime.economy.admission import AdmissionConfig, AdmissionController, SloClass
    from fastvideo3.runtime.economy.cost import CalibratedCostModel, device_profile
    from fastvideo3.runtime.economy.pricing import Pricer
    from fastvideo3.telemetry.hooks import SchedulerTelemetry
    from fastvideo3.telemetry.metrics import ServiceMetrics
    from fastvideo3.telemetry.tracing import init_tracing
    pricer = Pricer(CalibratedCostModel(device=device_profile(cfg.device_profile)))
    classes = (
        SloClass("interactive", compute_budget_s=cfg.interactive_budget_s, queue_bound=cfg.max_queued,
                 max_wait_s=60.0, latency_sensitive=True),
        SloClass("batch", compute_budget_s=cfg.batch_budget_s, queue_bound=cfg.max_queued, max_wait_s=600.0),
    )
    admission = AdmissionController(AdmissionConfig(memory_budget_bytes=cfg.memory_budget_bytes, classes=classes))
    tracing = init_tracing("scheduler", otlp_endpoint=cfg.otlp_endpoint, trace_file=cfg.trace_file)
    telemetry = SchedulerTelemetry(tracing, ServiceMetrics("scheduler", service=cfg.engine_id))
    return pricer, admission, telemetry


if __name__ == "__main__":
    sys.exit(run_scheduler())
