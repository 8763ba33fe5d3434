"""The scheduler's one config object, from flags or a ``fleet.yaml``.

    python -m services.scheduler --port 50051 --card wan-tiny \\
        --pools encoder=127.0.0.1:50061 --pools denoiser=127.0.0.1:50062,127.0.0.1:50063 \\
        --pools decoder=127.0.0.1:50064 [--pools reward=...] [--transport auto|cuda_ipc|shm|grpc|nixl] \\
        [--edge-transport denoiser->decoder=grpc] [--no-batching] [--max-running N] [--batch-invariant auto|on|off]
    python -m services.scheduler --config fleet.yaml        # same keys; flags given also win

fleet.yaml::

    card: wan-tiny
    port: 50051
    pools: {encoder: [127.0.0.1:50061], denoiser: [127.0.0.1:50062, 127.0.0.1:50063], decoder: [...]}
    transport: {default: auto, edges: {"denoiser->decoder": grpc}}
    scheduler: {batching: true, max_batch: 16, max_running: 64, max_queued: 256, batch_invariant: auto}
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fastvideo3.errors import InvalidRequest
from fastvideo3.vocab import ROLES, Role

REQUIRED_ROLES = (Role.ENCODER, Role.DENOISER, Role.DECODER)
EDGES = ((Role.ENCODER, Role.DENOISER), (Role.DENOISER, Role.DECODER), (Role.DECODER, Role.REWARD))
TRANSPORTS = ("auto", "cuda_ipc", "shm", "grpc", "nixl")
BATCH_INVARIANT = ("auto", "on", "off")


@dataclass(frozen=True)
class SchedulerConfig:
    port: int = 50051
    host: str = "127.0.0.1"
    card: str = "wan-tiny"
    pools: dict[str, tuple[str, ...]] = field(default_factory=dict)
    transport: str = "auto"
    edge_transport: dict[str, str] = field(default_factory=dict)  # "encoder->denoiser" -> backend
    batching: bool = True
    max_batch: int = 16
    max_running: int = 64
    max_queued: int = 256
    rpc_timeout_s: float = 300.0       # Execute deadline (capped by each unit's own deadline)
    control_timeout_s: float = 10.0    # Describe / Release / health deadline
    connect_timeout_s: float = 300.0   # how long to wait for every pool to be SERVING
    drain_timeout_s: float = 60.0
    retain_finished: int = 1000        # finished requests kept for GetRequest
    # double-buffered dispatch (fastvideo3.runtime.scheduling.dispatcher): batches a denoiser replica holds at
    # once, and the denoise round (units) from which it is cut in two halves that alternate (0 = off)
    pipeline_depth: int = 2
    double_buffer_min_units: int = 8
    # cohorts (fastvideo3.runtime.scheduling.cohorts): a denoise batch's rows, capped where more rows
    # cost the same per row: auto (from the replicas' timed graph buckets), off, or a number of rows
    cohort_rows: str | int = "auto"
    release_after_s: float = 1.0       # an ended request's id waits this long for an Execute to ride on
    engine_id: str = "fastvideo3/local"
    metrics_port: int | None = None
    # pricing and admission: one currency, predicted GPU-seconds (see fastvideo3.runtime.economy.cost)
    device_profile: str = "cpu"
    memory_budget_bytes: int = 64 << 30  # resident + peak bytes admitted at once, net of weights
    interactive_budget_s: float = 8.0    # predicted GPU-seconds in flight, interactive class
    batch_budget_s: float = 120.0        # the same, batch class
    trace_file: str | None = None        # JSON-lines span export (fastvideo3 slo report reads it)
    otlp_endpoint: str | None = None     # OTLP span export; off by default
    # scaling signals (fastvideo3.telemetry.scaling): replicas needed per role
    scaling_target_utilization: float = 0.7
    scaling_window_s: float = 60.0
    # durability (fastvideo3.runtime.durability.checkpointer): where request state is checkpointed
    state_store: str = "memory://"       # or redis://host:port/db: survives a scheduler restart
    state_namespace: str | None = None   # key prefix (default: the engine id): one per deployment
    state_ttl_s: float = 3600.0          # keys of an ended request expire after this
    state_timeout_s: float = 2.0         # bound on one store operation
    # denoise steps between checkpoints (each carries a snapshot of the request's latent and
    # sampler history, copied to the host): a resume redoes at most this many steps; 0 = off
    checkpoint_every: int = 4
    # batch-invariant mode (fastvideo3.runtime.scheduling.invariant): every denoise forward padded to the
    # max batch, so a request's output is bit-identical whatever its batch-mates (and a resume
    # with batching on reproduces the uninterrupted run). auto = on when checkpoints go to a
    # durable store (checkpoint_every > 0 and a state store other than memory://)
    batch_invariant: str = "auto"
    # high availability (services/scheduler/leader.py): with a lease, replicas over one store
    # elect a leader (the only one that admits and steps); the others forward to it and take
    # over its requests from their checkpoints when its lease expires. 0 = no election.
    leader_lease_s: float = 0.0
    # a decode (or encode) whose last replica was lost waits this long for one to serve again
    replica_wait_s: float = 30.0
    advertise: str | None = None         # host:port the other replicas forward to (default host:port)
    # pool health: checked every interval with a deadline; lost after N unanswered checks
    health_interval_s: float = 1.0
    health_timeout_s: float = 1.0
    unhealthy_after: int = 2
    max_request_bytes: int = 4 << 20     # largest Generate message accepted
    # image-to-video requests (fastvideo3.request.image): the image size cap, and whether (and
    # how long) the scheduler may fetch an image URL; off by default
    max_image_bytes: int = 16 << 20
    allow_image_urls: bool = False
    image_url_timeout_s: float = 10.0
    tls_cert: str | None = None          # security (services/common/auth.py): off by default
    tls_key: str | None = None
    tls_ca: str | None = None
    auth_token_file: str | None = None
    exit_with_parent: bool = False
    log_level: str = "INFO"

    def batch_bucket(self, max_batch: int) -> int | None:
        """Units per denoise forward in batch-invariant mode (the max batch; 1 without batching),
        or None when the mode is off."""
        on = self.batch_invariant == "on" or (self.batch_invariant == "auto" and self.checkpoint_every > 0
                                              and not self.state_store.startswith("memory"))
        return (max_batch if self.batching else 1) if on else None

    def security(self):
        from services.common.auth import from_args
        return from_args(self.__dict__)

    def edge_backend(self, producer: str, consumer: str) -> str:
        return self.edge_transport.get(f"{producer}->{consumer}", self.transport)


def _on_off(v) -> str:
    """A YAML boolean or one of BATCH_INVARIANT."""
    v = {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else str(v)
    if v not in BATCH_INVARIANT:
        raise InvalidRequest(f"{v!r}", field="batch_invariant", limit=", ".join(BATCH_INVARIANT))
    return v


def _cohort_rows(v) -> str | int:
    from fastvideo3.runtime.scheduling.cohorts import parse_cohort_rows
    try:
        return parse_cohort_rows(v)
    except ValueError as e:
        raise InvalidRequest(str(e), field="cohort_rows", limit="auto, off or [1, 4096] rows") from None


def _pool_spec(text: str) -> tuple[str, tuple[str, ...]]:
    role, sep, targets = text.partition("=")
    base, colon, expert = role.partition(":")  # denoiser:EXPERT: the pools of one denoising expert
    if not sep or base not in ROLES or (colon and (base != Role.DENOISER or not expert.isidentifier())):
        raise InvalidRequest(f"bad --pools value {text!r}", field="pools",
                             limit=f"ROLE=HOST:PORT[,HOST:PORT] with ROLE in {', '.join(ROLES)} or denoiser:EXPERT")
    addrs = tuple(a.strip() for a in targets.split(",") if a.strip())
    for a in addrs:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidRequest(f"bad pool address {a!r}", field=f"pools.{role}", limit="HOST:PORT")
    if not addrs:
        raise InvalidRequest("no address", field=f"pools.{role}", limit="HOST:PORT[,HOST:PORT]")
    return role, addrs


def _edge_spec(text: str) -> tuple[str, str]:
    edge, sep, backend = text.partition("=")
    pairs = {f"{a}->{b}" for a, b in EDGES}
    if not sep or edge not in pairs or backend not in TRANSPORTS:
        raise InvalidRequest(f"bad --edge-transport value {text!r}", field="edge_transport",
                             limit=f"EDGE=BACKEND with EDGE in {', '.join(sorted(pairs))} "
                                   f"and BACKEND in {', '.join(TRANSPORTS)}")
    return edge, backend


def parse_args(argv: list[str] | None = None) -> SchedulerConfig:
    p = argparse.ArgumentParser(prog="python -m services.scheduler", description="fastvideo3 scheduler service")
    p.add_argument("--config", default=None, help="fleet.yaml (flags given on the command line win)")
    from services.common.args import add_service_args
    add_service_args(p)
    p.add_argument("--pools", action="append", default=[], help="ROLE=HOST:PORT[,HOST:PORT...] (repeat per role)")
    p.add_argument("--transport", default=None, choices=TRANSPORTS, help="default transport for every edge")
    p.add_argument("--edge-transport", action="append", default=[], help="EDGE=BACKEND, e.g. denoiser->decoder=grpc")
    p.add_argument("--no-batching", action="store_true", help="one WorkUnit per pool call (no step batching)")
    p.add_argument("--max-batch", type=int, default=None)
    p.add_argument("--max-running", type=int, default=None, help="requests stepping at once (1 = request-at-a-time)")
    p.add_argument("--max-queued", type=int, default=None)
    p.add_argument("--pipeline-depth", type=int, default=None,
                   help="batches a denoiser replica holds at once (2: the next waits beside the running one)")
    p.add_argument("--double-buffer-min-units", type=int, default=None,
                   help="a denoise round of at least this many units is cut in two alternating halves (0 = off)")
    p.add_argument("--cohort-rows", default=None,
                   help="DiT rows at most in one denoise batch: auto (the fewest at which the replica's timed graph "
                        "buckets cost as little per row as the best), off (up to --max-batch), or a number")
    p.add_argument("--release-after", type=float, default=None, dest="release_after_s",
                   help="seconds an ended request's id waits for an Execute to ride on before a Release call")
    p.add_argument("--retain-finished", type=int, default=None,
                   help="ended requests kept in memory (older ones are read back from the state store)")
    p.add_argument("--rpc-timeout", type=float, default=None, dest="rpc_timeout_s")
    p.add_argument("--connect-timeout", type=float, default=None, dest="connect_timeout_s")
    p.add_argument("--engine-id", default=None)
    p.add_argument("--device-profile", default=None, choices=("cpu", "h200"), help="cost-model device prior")
    p.add_argument("--memory-budget-bytes", type=int, default=None, help="admission memory budget")
    p.add_argument("--interactive-budget-s", type=float, default=None)
    p.add_argument("--batch-budget-s", type=float, default=None)
    p.add_argument("--state-store", default=None, help="memory:// (default) or redis://host:port/db")
    p.add_argument("--state-namespace", default=None, help="state key prefix (default: the engine id)")
    p.add_argument("--state-ttl", type=float, default=None, dest="state_ttl_s",
                   help="seconds an ended request's state stays readable")
    p.add_argument("--state-timeout", type=float, default=None, dest="state_timeout_s")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="checkpoint (and snapshot) each request every N denoise steps; 0 = off")
    p.add_argument("--batch-invariant", default=None, choices=BATCH_INVARIANT,
                   help="pad every denoise batch to the max batch: outputs independent of batch-mates "
                        "(auto: on when checkpointing to a durable state store)")
    p.add_argument("--leader-lease", type=float, default=None, dest="leader_lease_s",
                   help="seconds: elect one leader among scheduler replicas sharing the state store (needs redis)")
    p.add_argument("--replica-wait", type=float, default=None, dest="replica_wait_s",
                   help="seconds a decode/encode whose last replica died waits for one to come back (0 = fail)")
    p.add_argument("--advertise", default=None, help="host:port other scheduler replicas reach this one at")
    p.add_argument("--health-interval", type=float, default=None, dest="health_interval_s")
    p.add_argument("--health-timeout", type=float, default=None, dest="health_timeout_s")
    p.add_argument("--unhealthy-after", type=int, default=None, help="unanswered health checks before a pool is lost")
    p.add_argument("--max-request-bytes", type=int, default=None)
    p.add_argument("--max-image-bytes", type=int, default=None, help="image-to-video: largest image (default 16 MiB)")
    p.add_argument("--allow-image-urls", action="store_true", default=None,
                   help="image-to-video: fetch a request's image_url (off by default)")
    p.add_argument("--image-url-timeout", type=float, default=None, dest="image_url_timeout_s",
                   help="image-to-video: seconds to fetch an image URL (default 10)")
    p.add_argument("--scaling-target-utilization", type=float, default=None,
                   help="utilization the replicas_needed signals aim for, in (0, 1] (default 0.7)")
    p.add_argument("--scaling-window", type=float, default=None, dest="scaling_window_s",
                   help="seconds of arrivals the scaling signals average over (default 60)")
    a = p.parse_args(argv)
    return build_config(a)


def build_config(a: argparse.Namespace) -> SchedulerConfig:
    data: dict = {}
    if a.config:
        try:
            data = yaml.safe_load(Path(a.config).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise InvalidRequest(f"cannot read fleet config: {e}", field="config") from None
        if not isinstance(data, dict):
            raise InvalidRequest("fleet config must be a mapping", field="config")
    sched = data.get("scheduler") or {}
    tcfg = data.get("transport") or {}
    if isinstance(tcfg, str):
        tcfg = {"default": tcfg}
    pools: dict[str, tuple[str, ...]] = {}
    for role, addrs in (data.get("pools") or {}).items():
        if isinstance(addrs, dict):  # the Helm chart's form: {address, replicas, card, ...}
            if "address" not in addrs:
                raise InvalidRequest(f"pools.{role} has no address", field=f"pools.{role}.address")
            addrs = addrs["address"]
        addrs = [addrs] if isinstance(addrs, str) else list(addrs)
        pools[role] = _pool_spec(f"{role}={','.join(addrs)}")[1]
    for spec in a.pools:  # flags win, per role
        role, addrs = _pool_spec(spec)
        pools[role] = addrs
    missing = [r for r in REQUIRED_ROLES if r not in {k.partition(":")[0] for k in pools}]
    if missing:
        raise InvalidRequest(f"no {missing[0]} pool given", field="pools",
                             limit=f"at least {', '.join(REQUIRED_ROLES)}")
    edges = {str(k): str(v) for k, v in (tcfg.get("edges") or {}).items()}
    for spec in a.edge_transport:
        k, v = _edge_spec(spec)
        edges[k] = v
    for k, v in edges.items():
        _edge_spec(f"{k}={v}")
    default = a.transport or tcfg.get("default", "auto")
    if default not in TRANSPORTS:
        raise InvalidRequest(f"unknown transport {default!r}", field="transport", limit=", ".join(TRANSPORTS))

    def pick(flag, key, fallback, src=data):
        return flag if flag is not None else src.get(key, fallback)

    cfg = SchedulerConfig(
        port=int(pick(a.port, "port", 50051)), host=pick(a.host, "host", "127.0.0.1"),
        card=pick(a.card, "card", "wan-tiny"),
        pools=pools, transport=default, edge_transport=edges,
        batching=not a.no_batching and bool(sched.get("batching", True)),
        max_batch=int(pick(a.max_batch, "max_batch", 16, sched)),
        max_running=int(pick(a.max_running, "max_running", 64, sched)),
        max_queued=int(pick(a.max_queued, "max_queued", 256, sched)),
        retain_finished=int(pick(a.retain_finished, "retain_finished", 1000, sched)),
        pipeline_depth=int(pick(a.pipeline_depth, "pipeline_depth", 2, sched)),
        double_buffer_min_units=int(pick(a.double_buffer_min_units, "double_buffer_min_units", 8, sched)),
        release_after_s=float(pick(a.release_after_s, "release_after_s", 1.0, sched)),
        cohort_rows=_cohort_rows(pick(getattr(a, "cohort_rows", None), "cohort_rows", "auto", sched)),
        rpc_timeout_s=float(pick(a.rpc_timeout_s, "rpc_timeout_s", 300.0, sched)),
        connect_timeout_s=float(pick(a.connect_timeout_s, "connect_timeout_s", 300.0, sched)),
        drain_timeout_s=float(pick(a.drain_timeout_s, "drain_timeout_s", 60.0, sched)),
        engine_id=pick(a.engine_id, "engine_id", "fastvideo3/local"),
        metrics_port=pick(a.metrics_port, "metrics_port", None),
        device_profile=pick(a.device_profile, "device_profile", "cpu", sched),
        memory_budget_bytes=int(pick(a.memory_budget_bytes, "memory_budget_bytes", 64 << 30, sched)),
        interactive_budget_s=float(pick(a.interactive_budget_s, "interactive_budget_s", 8.0, sched)),
        batch_budget_s=float(pick(a.batch_budget_s, "batch_budget_s", 120.0, sched)),
        trace_file=pick(a.trace_file, "trace_file", None, sched),
        otlp_endpoint=pick(a.otlp_endpoint, "otlp_endpoint", None, sched),
        state_store=pick(a.state_store, "state_store", "memory://", sched),
        state_namespace=pick(a.state_namespace, "state_namespace", None, sched),
        state_ttl_s=float(pick(a.state_ttl_s, "state_ttl_s", 3600.0, sched)),
        state_timeout_s=float(pick(a.state_timeout_s, "state_timeout_s", 2.0, sched)),
        checkpoint_every=int(pick(a.checkpoint_every, "checkpoint_every", 4, sched)),
        batch_invariant=_on_off(pick(a.batch_invariant, "batch_invariant", "auto", sched)),
        leader_lease_s=float(pick(a.leader_lease_s, "leader_lease_s", 0.0, sched)),
        advertise=pick(a.advertise, "advertise", None, sched),
        replica_wait_s=float(pick(a.replica_wait_s, "replica_wait_s", 30.0, sched)),
        health_interval_s=float(pick(a.health_interval_s, "health_interval_s", 1.0, sched)),
        health_timeout_s=float(pick(a.health_timeout_s, "health_timeout_s", 1.0, sched)),
        unhealthy_after=int(pick(a.unhealthy_after, "unhealthy_after", 2, sched)),
        max_request_bytes=int(pick(a.max_request_bytes, "max_request_bytes", 4 << 20, sched)),
        max_image_bytes=int(pick(getattr(a, "max_image_bytes", None), "max_image_bytes", 16 << 20, sched)),
        allow_image_urls=bool(pick(getattr(a, "allow_image_urls", None), "allow_image_urls", False, sched)),
        image_url_timeout_s=float(pick(getattr(a, "image_url_timeout_s", None), "image_url_timeout_s", 10.0, sched)),
        tls_cert=pick(a.tls_cert, "tls_cert", None, sched), tls_key=pick(a.tls_key, "tls_key", None, sched),
        tls_ca=pick(a.tls_ca, "tls_ca", None, sched),
        auth_token_file=pick(a.auth_token_file, "auth_token_file", None, sched),
        scaling_target_utilization=float(pick(getattr(a, "scaling_target_utilization", None),
                                              "scaling_target_utilization", 0.7, sched)),
        scaling_window_s=float(pick(getattr(a, "scaling_window_s", None), "scaling_window_s", 60.0, sched)),
        exit_with_parent=a.exit_with_parent, log_level=pick(a.log_level, "log_level", "INFO"),
    )
    for name in ("state_ttl_s", "state_timeout_s", "health_interval_s", "health_timeout_s"):
        if getattr(cfg, name) <= 0:
            raise InvalidRequest(f"must be > 0, got {getattr(cfg, name)}", field=name, limit="> 0")
    if cfg.leader_lease_s < 0 or (cfg.leader_lease_s and cfg.leader_lease_s < 0.5):
        raise InvalidRequest(f"must be 0 (off) or >= 0.5 s, got {cfg.leader_lease_s}", field="leader_lease_s",
                             limit="0 or >= 0.5")
    if cfg.leader_lease_s and cfg.state_store.startswith("memory"):
        raise InvalidRequest("a leader lease needs a shared state store (redis://...)", field="leader_lease_s",
                             limit="--state-store redis://...")
    if not 0 <= cfg.replica_wait_s <= 3600:
        raise InvalidRequest(f"must be in [0, 3600] s, got {cfg.replica_wait_s}", field="replica_wait_s",
                             limit="[0, 3600]")
    if cfg.checkpoint_every < 0:
        raise InvalidRequest(f"must be >= 0, got {cfg.checkpoint_every}", field="checkpoint_every", limit=">= 0")
    if cfg.max_image_bytes < 1024 or not 0 < cfg.image_url_timeout_s <= 300:
        raise InvalidRequest("out of range", field="max_image_bytes/image_url_timeout_s", limit=">= 1024 / (0, 300] s")
    if cfg.unhealthy_after < 1 or cfg.max_request_bytes < 1024:
        raise InvalidRequest("out of range", field="unhealthy_after/max_request_bytes", limit=">= 1 / >= 1024")
    for name in ("memory_budget_bytes", "interactive_budget_s", "batch_budget_s"):
        if getattr(cfg, name) <= 0:
            raise InvalidRequest(f"must be > 0, got {getattr(cfg, name)}", field=name, limit="> 0")
    if not 0 < cfg.scaling_target_utilization <= 1:
        raise InvalidRequest(f"{cfg.scaling_target_utilization} is out of range",
                             field="scaling_target_utilization", limit="(0, 1]")
    if not 1 <= cfg.scaling_window_s <= 3600:
        raise InvalidRequest(f"{cfg.scaling_window_s} is out of range", field="scaling_window_s",
                             limit="[1, 3600] seconds")
    for name in ("max_batch", "max_running", "max_queued", "retain_finished"):
        if getattr(cfg, name) < 1:
            raise InvalidRequest(f"must be >= 1, got {getattr(cfg, name)}", field=name, limit=">= 1")
    if not 1 <= cfg.pipeline_depth <= 4:
        raise InvalidRequest(f"{cfg.pipeline_depth} is out of range", field="pipeline_depth", limit="[1, 4]")
    if cfg.double_buffer_min_units != 0 and not 2 <= cfg.double_buffer_min_units <= 4096:
        raise InvalidRequest(f"{cfg.double_buffer_min_units} is out of range", field="double_buffer_min_units",
                             limit="0 (off) or [2, 4096]")
    if not 0 < cfg.release_after_s <= 600:
        raise InvalidRequest(f"{cfg.release_after_s} is out of range", field="release_after_s",
                             limit="(0, 600] seconds")
    return cfg
