"""What the scheduler knows of its pools' parallel plans: read from Describe, checked against
the card's parallelism contract, handed to the pricer (a multi-rank replica stays one
placement target; its plan changes what a step costs and what fits in memory)."""
from __future__ import annotations

from fastvideo3.errors import FailedPrecondition
from fastvideo3.parallel.plan import ParallelPlan


def replica_plan(description) -> ParallelPlan | None:
    """The plan a pool replica reports in Describe (None: a one-device replica)."""
    if not description.HasField("parallel") or not description.parallel.spec:
        return None
    return ParallelPlan.parse(description.parallel.spec, pad=description.parallel.pad)


def denoiser_plan(card, replicas: list) -> ParallelPlan | None:
    """The denoiser replicas' common plan, refused unless the card allows it."""
    plans = {(p.spec if p else "single"): p for p in (replica_plan(r.last_description) for r in replicas)}
    if len(plans) > 1:
        raise FailedPrecondition(f"denoiser replicas run different plans {sorted(plans)}", field="denoiser.plan",
                                 limit="one plan per pool")
    plan = next(iter(plans.values()))
    check_plan(card, plan)
    return plan


def check_plan(card, plan: ParallelPlan | None) -> None:
    contract = card.parallelism
    world = plan.world if plan else 1
    if world < contract.min_ranks:
        raise FailedPrecondition(f"card {card.model_id} needs a denoiser of at least {contract.min_ranks} ranks "
                                 f"(memory); the pool runs {plan.spec if plan else 'single'}",
                                 field="parallelism.min_ranks", limit=str(contract.min_ranks))
    if plan is None or world == 1:
        return
    for kind in plan.kind.split("+"):
        if kind == "cfg_parallel" and not contract.cfg_parallel:
            raise FailedPrecondition(f"card {card.model_id} does not allow CFG-parallel",
                                     field="parallelism.cfg_parallel")
        if kind != "cfg_parallel" and kind not in contract.plans:
            raise FailedPrecondition(f"card {card.model_id} does not allow plan {kind}", field="parallelism.plans",
                                     limit=", ".join(contract.plans))


def plan_entry(plan: ParallelPlan | None, device: str) -> dict:
    """Fields of a DeploymentCard ParallelPlan for a pool running ``plan``."""
    if plan is None:
        return {"name": "single", "degrees": {}, "gpus": 1 if "cuda" in device else 0}
    return {"name": plan.spec, "degrees": {"cfg": plan.cfg, "ring": plan.ring, "ulysses": plan.ulysses},
            "gpus": plan.world if "cuda" in device else 0}
