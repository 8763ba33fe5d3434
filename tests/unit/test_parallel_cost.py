"""A parallel replica's pricing (compute split + communication term) and the scheduler's plan checks."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from fastvideo3.models.wan.cards import wan_tiny
from fastvideo3.errors import FailedPrecondition
from fastvideo3.parallel.cost import comm_bytes
from fastvideo3.parallel.plan import ParallelPlan
from fastvideo3.runtime.economy.cost import CalibratedCostModel, DiffusionStepFeatures, device_profile, unit_work
from fastvideo3.models.wan.flops import DitConfig, StepShape
from fastvideo3.runtime.economy.pricing import Pricer
from fastvideo3.v1 import pool_pb2


def _features(plan=None, ratio=1.0, branches=2):
    shape = StepShape.from_video(81, 480, 832, cfg_branches=branches)
    return DiffusionStepFeatures(DitConfig.wan21_14b(), shape, plan=plan, link_ratio=ratio)


def test_work_splits_over_ranks_and_adds_traffic():
    one = unit_work("diffusion_step", _features())
    for spec in ("ulysses2", "ring2", "cfg2", "ulysses2xring2", "cfg2xulysses2"):
        plan = ParallelPlan.parse(spec)
        w = unit_work("diffusion_step", _features(plan, ratio=10.0))
        assert w.flops == pytest.approx(one.flops / plan.world)
        assert w.peak_bytes == int(one.peak_bytes / plan.sp)
        assert w.bytes < one.bytes  # activations split, weights read by each rank
        moved = comm_bytes(DitConfig.wan21_14b(), _features().shape, plan)
        assert moved > 0, spec
        # the communication term is charged at the link ratio
        w2 = unit_work("diffusion_step", _features(plan, ratio=20.0))
        assert w2.bytes - w.bytes == pytest.approx(moved * 10.0)


def test_ulysses_moves_less_than_ring_for_long_sequences_and_cfg_least():
    cfg, shape = DitConfig.wan21_14b(), _features().shape
    u4, r4, c2 = (comm_bytes(cfg, shape, ParallelPlan.parse(s)) for s in ("ulysses4", "ring4", "cfg2"))
    assert c2 < u4 < r4


def test_pricer_prices_by_the_replica_plan():
    card = wan_tiny()
    req = SimpleNamespace(cfg_policy="batched", num_frames=33, height=128, width=128, precision="fp32")
    pricer = Pricer(CalibratedCostModel(device=device_profile("h200")))
    single = pricer.predict("diffusion_step", "k", card, req)
    pricer.plans["denoiser"] = ParallelPlan.parse("cfg2")
    par = pricer.predict("diffusion_step", "k", card, req)
    assert par.gpu_seconds != single.gpu_seconds
    assert pricer.features("diffusion_step", card, req).plan.spec == "cfg2"


def _desc(spec):
    from services.common.description import executor_fields
    par = {"spec": spec, "pad": True} if spec else {}
    return SimpleNamespace(last_description=pool_pb2.PoolDescription(
        **executor_fields({"parallel": par}, role="denoiser", fake=False)))


def test_scheduler_reads_and_checks_the_plan():
    from services.scheduler.plans import check_plan, denoiser_plan, plan_entry
    card = wan_tiny()
    assert denoiser_plan(card, [_desc("")]) is None
    assert denoiser_plan(card, [_desc("cfg2xulysses2"), _desc("cfg2xulysses2")]).world == 4
    with pytest.raises(FailedPrecondition) as e:
        denoiser_plan(card, [_desc("ulysses2"), _desc("")])
    assert e.value.field == "denoiser.plan"
    strict = card.model_copy(update={"parallelism": card.parallelism.model_copy(
        update={"plans": ["single", "sp_ring"], "cfg_parallel": False, "min_ranks": 2})})
    for spec, field in (("", "parallelism.min_ranks"), ("ulysses2", "parallelism.plans"),
                        ("cfg2", "parallelism.cfg_parallel")):
        with pytest.raises(FailedPrecondition) as e:
            check_plan(strict, ParallelPlan.parse(spec) if spec else None)
        assert e.value.field == field, spec
    check_plan(strict, ParallelPlan.parse("ring2"))
    assert plan_entry(ParallelPlan.parse("ulysses2xring2"), "cuda:0") == {
        "name": "ulysses2xring2", "degrees": {"cfg": 1, "ring": 2, "ulysses": 2}, "gpus": 4}
