"""The DeploymentCard: what a fleet tells an orchestrator (NVIDIA Dynamo) and its clients.

A card says which model cards the fleet serves and within which limits, what each of them can
do (the capability matrix), how the fleet is laid out (role pools, their device needs and
parallel plans), which programs it runs, how it prices work (the *same* cost model the
scheduler admits with, serialized with ``to_dict``), how it reports health, the SLO classes
it admits under, and where each role's data plane listens.

Three forms: the wire message ``fastvideo3.v1.DeploymentCard`` (served by ``Scheduler.Describe``),
its pydantic model (user-facing: CLI output, config, Dynamo metadata; ``extra="forbid"`` so a
misspelt key is an error; :meth:`DeploymentCard.model_json_schema` is its JSON schema) and plain
JSON (``model_dump(mode="json")``, the Dynamo worker's runtime data). The model is generated from
the wire message in :mod:`fleet.deployment_schema`, which also holds the conversions
(``to_proto`` / ``from_proto``, exact both ways); this module re-exports it.

Builders: :func:`build_deployment_card` (model cards + pools + cost model + endpoints) and
:func:`card_from_fleet_config` (a ``fleet.yaml``, the format the Helm chart and the local
launcher write).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from pydantic import ValidationError

from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import InvalidRequest
from fastvideo3.runtime.economy.cost import CalibratedCostModel
from fastvideo3.vocab import KINDS_OF_ROLE, PROGRAM_LOOPS, Program, ROLES, Role, Task
from fleet.deployment_schema import (  # noqa: F401  (the card's models are this module's API)
    HEALTH_LABEL_PREFIX, SCHEMA_VERSION, CapabilityCell, CostModelSpec, DeploymentCard, DeviceNeeds, HealthSchema,
    ModelCardSummary, ParallelPlan, ProgramSpec, RequestDefaults, RequestLimits, RoleEndpoints, RolePoolSpec,
    SloClass, TransferEndpoint, parse_card,
)

#: WorkUnit kinds each role executes (the pool service's table).
ROLE_KINDS = {role: list(kinds) for role, kinds in KINDS_OF_ROLE.items()}
#: program name -> loops it runs, in order.
PROGRAMS = {Program.T2V: list(PROGRAM_LOOPS[Program.T2V])}
SCHEDULER_SERVICE = "fastvideo3.v1.Scheduler"
POOL_SERVICE = "fastvideo3.v1.RolePool"


def card_from_description(described: Mapping[str, Any]) -> DeploymentCard | None:
    """The card inside ``FleetClient.describe()`` output (proto JSON), or None when absent."""
    from google.protobuf.json_format import ParseDict

    from fastvideo3.v1 import deployment_pb2

    if not described.get("card"):
        return None
    return DeploymentCard.from_proto(ParseDict(described["card"], deployment_pb2.DeploymentCard()))


# ---------------------------------------------------------------------------------------------
# Building a card from model cards, pools, the cost model and endpoints

#: the SLO classes the scheduler admits under, with their targets
DEFAULT_SLO_CLASSES = (
    SloClass(name="interactive", priority=10, target_queue_s=1.0, target_latency_p50_s=30.0,
             target_latency_p95_s=60.0, gpu_seconds_budget=0.0, max_concurrent_requests=32),
    SloClass(name="batch", priority=0, target_queue_s=600.0, target_latency_p50_s=600.0,
             target_latency_p95_s=1800.0, gpu_seconds_budget=0.0, max_concurrent_requests=256),
)

#: the exported metrics a router or autoscaler reads (names as fastvideo3.telemetry.metrics writes them)
HEALTH_METRICS = {
    "fastvideo3_queue_depth": "requests waiting to be admitted or to start",
    "fastvideo3_inflight_requests": "requests admitted and not yet terminal",
    "fastvideo3_requests_refused_total": "requests refused, by reason (RESOURCE_EXHAUSTED: back off)",
    "fastvideo3_step_latency_seconds": "wall seconds of one batch of units, by pool and kind",
    "fastvideo3_gpu_seconds_total": "GPU-seconds spent, the cost model's currency",
    "fastvideo3_cost_model_error_ratio": "relative error of predicted vs measured GPU-seconds",
}


def summarize_card(card: ModelCard, *, precision: str | None = None, fingerprint: str = "") -> ModelCardSummary:
    """The client-facing summary of a ModelCard: limits and defaults as requests see them."""
    from fastvideo3.card.summary import card_summary
    return ModelCardSummary.model_validate(card_summary(card, precision=precision, fingerprint=fingerprint))


def capability_cells(card: ModelCard, roles: set[str]) -> list[CapabilityCell]:
    """The card's row of the capability matrix, given the roles the fleet runs."""
    caps = card.capabilities
    rows: list[tuple[str, bool, str]] = [
        (Program.T2V, Task.TEXT_TO_VIDEO in caps.tasks and {Role.ENCODER, Role.DENOISER, Role.DECODER} <= roles,
         "needs encoder, denoiser and decoder pools"),
        ("negative_prompt", caps.negative_prompt, ""),
        ("seed", caps.seeds, "bit-reproducible for a fixed seed, card and fingerprint"),
        ("cross_request_batching", caps.batching, "compatible denoise steps share one DiT call"),
        ("cfg_parallel", card.parallelism.cfg_parallel, ""),
        ("reward_scoring", Role.REWARD in roles, "needs a reward pool"),
        ("cancellation", True, "takes effect at the next step boundary"),
    ]
    return [CapabilityCell(card_id=card.model_id, capability=name, level="supported", note=note)
            for name, ok, note in rows if ok]


def default_health(roles: Iterable[str]) -> HealthSchema:
    roles = sorted(set(roles))
    serving = {
        "": "the process is up, loaded and accepting work (NOT_SERVING while loading and draining)",
        SCHEDULER_SERVICE: "Generate is accepted: every role the programs need has a SERVING replica",
    }
    if roles:
        serving[POOL_SERVICE] = ("the pool's weights are loaded and warm and it executes WorkUnits "
                                 f"(one per replica of: {', '.join(roles)})")
    return HealthSchema(services=list(serving), serving=serving, metrics=dict(HEALTH_METRICS))


def _pool(spec: RolePoolSpec | Mapping[str, Any], card_ids: list[str]) -> RolePoolSpec:
    pool = spec if isinstance(spec, RolePoolSpec) else RolePoolSpec.model_validate(dict(spec))
    update: dict[str, Any] = {}
    if not pool.card_ids:
        update["card_ids"] = list(card_ids)
    if not pool.kinds:
        update["kinds"] = list(ROLE_KINDS[pool.role])
    if not pool.parallel_plan:
        update["parallel_plan"] = "single"
    return pool.model_copy(update=update) if update else pool


def build_deployment_card(
    cards: Iterable[ModelCard],
    pools: Iterable[RolePoolSpec | Mapping[str, Any]],
    cost_model: CalibratedCostModel | None,
    endpoints: Mapping[str, Iterable[tuple[str, str] | tuple[str, str, str]]] | None = None,
    *,
    engine_id: str = "fastvideo3/local",
    default_model: str | None = None,
    slo_classes: Iterable[SloClass | Mapping[str, Any]] | None = None,
    fingerprints: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    created_unix_ms: int | None = None,
) -> DeploymentCard:
    """A DeploymentCard for a fleet config.

    ``pools``: RolePoolSpecs (or dicts of their fields); a pool that names no cards serves all
    of them, one without kinds gets its role's, one without a plan runs ``"single"``.
    ``cost_model``: the object the scheduler admits with; published via ``to_dict()``.
    ``endpoints``: role -> [(backend, address[, replica_id])].
    """
    cards = list(cards)
    if not cards:
        raise InvalidRequest("a deployment serves at least one model card", field="cards")
    ids = [c.model_id for c in cards]
    pools = [_pool(p, ids) for p in pools]
    roles = {p.role for p in pools}
    on_gpu = any(p.device.gpus > 0 for p in pools if p.role == Role.DENOISER)
    fingerprints = dict(fingerprints or {})
    models = [summarize_card(c, precision=c.precision.default_cuda if on_gpu else c.precision.default_cpu,
                             fingerprint=fingerprints.get(c.model_id, "")) for c in cards]
    plans: dict[tuple[str, str], ParallelPlan] = {}
    for p in pools:
        plans.setdefault((p.parallel_plan, p.role), ParallelPlan(
            name=p.parallel_plan, role=p.role, degrees={} if p.parallel_plan == "single" else {"tp": p.device.gpus},
            gpus=p.device.gpus))
    shared = {name for name, _ in plans if sum(n == name for n, _ in plans) > 1}
    if shared:  # a name several roles run (e.g. "single") becomes one plan per role: "single@encoder"
        plans = {(k if k[0] not in shared else (f"{k[0]}@{k[1]}", k[1])):
                 (plan if k[0] not in shared else plan.model_copy(update={"name": f"{k[0]}@{k[1]}"}))
                 for k, plan in plans.items()}
        pools = [p if p.parallel_plan not in shared else
                 p.model_copy(update={"parallel_plan": f"{p.parallel_plan}@{p.role}"}) for p in pools]
    t2v_cards = [c.model_id for c in cards if Task.TEXT_TO_VIDEO in c.capabilities.tasks]
    programs = [ProgramSpec(name=name, loops=list(loops), card_ids=t2v_cards)
                for name, loops in PROGRAMS.items() if t2v_cards]
    transfer = [RoleEndpoints(role=role, endpoints=[TransferEndpoint(backend=e[0], address=e[1],
                                                                     replica_id=e[2] if len(e) > 2 else "")
                                                    for e in eps])
                for role, eps in (endpoints or {}).items()]
    slos = [s if isinstance(s, SloClass) else SloClass.model_validate(dict(s))
            for s in (slo_classes if slo_classes is not None else DEFAULT_SLO_CLASSES)]
    data = dict(
        engine_id=engine_id, models=models,
        capability_matrix=[cell for c in cards for cell in capability_cells(c, roles)],
        role_pools=pools, programs=programs, parallel_plans=list(plans.values()),
        cost_model=CostModelSpec.of(cost_model) if cost_model is not None else None,
        health=default_health(roles), slo_classes=slos, transfer_endpoints=transfer,
        default_model=default_model or ids[0],
        created_unix_ms=int(time.time() * 1000) if created_unix_ms is None else created_unix_ms,
        labels=dict(labels or {}),
    )
    try:
        return DeploymentCard(**data)
    except ValidationError as e:
        err = e.errors()[0]
        raise InvalidRequest(err["msg"], field=".".join(str(x) for x in err["loc"]) or "deployment_card") from None


# ---------------------------------------------------------------------------------------------
# From a fleet.yaml


def card_from_fleet_config(config: Mapping[str, Any] | str | Path, *,
                           cost_model: CalibratedCostModel | None = None) -> DeploymentCard:
    """A DeploymentCard from a fleet config (a path to fleet.yaml, or its parsed mapping).

    Keys read (the format the Helm chart and the local launcher write; others are ignored)::

        fleet: {name, namespace}
        card: wan-tiny                       # default card; pools may name their own
        cards_file: cards.yaml               # optional: {cards: {name: card spec}}
        pools: {ROLE: {address, replicas, gpus_per_replica, card, transports, max_batch_units}}
        slo_classes: [{name, priority, target_latency_p50_s, ...}]   # optional
        cost_model: {device: cpu}  or  {file: cost.json}              # optional
    """
    import yaml

    from fastvideo3.card.registry import resolve_card

    base = Path(".")
    if not isinstance(config, Mapping):
        base = Path(config).parent
        try:
            config = yaml.safe_load(Path(config).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise InvalidRequest(f"cannot read fleet config: {e}", field="config") from None
        if not isinstance(config, Mapping):
            raise InvalidRequest("fleet config must be a mapping", field="config")
    extra_cards: dict[str, Any] = {}
    if config.get("cards_file"):
        path = Path(config["cards_file"])
        path = path if path.is_absolute() else base / path
        if path.exists():
            extra_cards = (yaml.safe_load(path.read_text()) or {}).get("cards") or {}

    def load(name: str) -> ModelCard:
        if name in extra_cards:
            spec = dict(extra_cards[name])
            spec.setdefault("model_id", name)
            return ModelCard.model_validate(spec)
        return resolve_card(name)

    default = str(config.get("card") or "wan-tiny")
    pool_cfg = config.get("pools") or {}
    if not isinstance(pool_cfg, Mapping):
        raise InvalidRequest("pools must map role -> pool config", field="pools")
    names, pools, endpoints = [default], [], {}
    for role, p in pool_cfg.items():
        if role not in ROLES:
            raise InvalidRequest(f"unknown role {role!r}", field="pools", limit=", ".join(ROLES))
        p = dict(p or {})
        if p.get("enabled") is False:
            continue
        card = str(p.get("card") or default)
        names.append(card)
        gpus = int(p.get("gpus_per_replica", p.get("gpus", 0)) or 0)
        backends = list(p.get("transports") or (["nixl", "grpc"] if gpus else ["shm", "grpc"]))
        pools.append(dict(role=role, replicas=int(p.get("replicas", 1)), card_ids=[card],
                          device=dict(gpus=gpus, gpu_memory_bytes=int(p.get("gpu_memory_bytes", 0)),
                                      host_memory_bytes=int(p.get("host_memory_bytes", 0)),
                                      accelerator=str(p.get("accelerator", "nvidia-gpu" if gpus else ""))),
                          max_batch_units=int(p.get("max_batch_units", 64)), transport_backends=backends))
        if p.get("address"):
            endpoints[role] = [("grpc", str(p["address"]))]
    cards = [load(n) for n in dict.fromkeys(names)]
    if cost_model is None:
        cost_model = _cost_model_from(config.get("cost_model"), base)
    fleet = config.get("fleet") or {}
    engine_id = "fastvideo3/" + ".".join(str(x) for x in (fleet.get("name") or "local", fleet.get("namespace")) if x)
    return build_deployment_card(cards, pools, cost_model, endpoints, engine_id=engine_id, default_model=default,
                                 slo_classes=config.get("slo_classes"), labels=config.get("labels"))


def _cost_model_from(spec: Any, base: Path) -> CalibratedCostModel:
    from fastvideo3.runtime.economy.cost import device_profile

    if not spec:
        return CalibratedCostModel()
    if not isinstance(spec, Mapping):
        raise InvalidRequest("cost_model must be a mapping: {device: NAME} or {file: PATH}", field="cost_model")
    if spec.get("file"):
        path = Path(spec["file"])
        path = path if path.is_absolute() else base / path
        try:
            return CalibratedCostModel.from_dict(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise InvalidRequest(f"cannot read cost model: {e}", field="cost_model.file") from None
    return CalibratedCostModel(device=device_profile(str(spec.get("device", "cpu"))))


def card_for_model(name: str, *, cost_model: CalibratedCostModel | None = None) -> DeploymentCard:
    """The card of a one-replica-per-role local fleet serving one model card (``--card NAME``)."""
    from fastvideo3.card.registry import resolve_card

    card = resolve_card(name)
    pools = [dict(role=r, replicas=1, transport_backends=["shm", "grpc"])
             for r in (Role.ENCODER, Role.DENOISER, Role.DECODER)]
    return build_deployment_card([card], pools, cost_model or CalibratedCostModel(), None,
                                 engine_id=f"fastvideo3/{card.model_id}")
