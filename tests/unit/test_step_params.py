"""Typed WorkUnit params: the loops write them, they read like the dicts they replace, and the wire
carries the same JSON as before (optional keys left out while unset)."""
from __future__ import annotations

import json

from fastvideo3.loop.params import (
    DiffusionStepParams, EncoderChunkParams, RewardBatchParams, VaeTileParams, params_from_dict, params_to_dict,
)
from fastvideo3.loop.protocol import WorkPlan
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.vocab import LoopId, Role, UnitKind
from services.common.convert import unit_from_wire, unit_to_wire


def _step(**kw) -> DiffusionStepParams:
    base = dict(step=2, timestep=750.0, sigmas=[1.0, 0.5, 0.0], guidance=5.0, cfg_policy="batched",
                sampler="unipc", solver_order=2, seed=7, latent_shape=[16, 3, 4, 4], final=False)
    return DiffusionStepParams(**{**base, **kw})


def test_params_read_like_their_dict_and_leave_unset_optional_keys_out():
    p = _step()
    assert p["step"] == 2 and p.get("expert") is None and "cache" not in p and "final" in p
    assert dict(p) == p.to_dict() and "adapters" not in p.to_dict() and p == p.to_dict()
    p.expert, p.handoff = "transformer_2", False
    assert p["handoff"] is False and p.to_dict()["expert"] == "transformer_2"
    assert EncoderChunkParams(prompts={"prompt": "a"}).to_dict() == {"prompts": {"prompt": "a"}}
    assert VaeTileParams().to_dict() == {} and VaeTileParams(encode="mp4", fps=16).to_dict() == {"encode": "mp4",
                                                                                                 "fps": 16}
    assert RewardBatchParams(scorers=["aesthetic"])["scorers"] == ["aesthetic"]


def test_the_wire_carries_the_same_json_and_comes_back_typed():
    p = _step(cache={"policy": "dbcache"}, plugin_state={}, num_steps=3)
    plan = WorkPlan(LoopId.DIFFUSION_DENOISE, "r1", UnitKind.DIFFUSION_STEP, Role.DENOISER, "sig", params=p)
    unit = WorkUnit.from_plan(plan, "wan-tiny")
    assert isinstance(unit.params, DiffusionStepParams) and unit.params is not p
    msg = unit_to_wire(unit)
    assert json.loads(msg.params_json) == p.to_dict()
    back = unit_from_wire(msg)
    assert isinstance(back.params, DiffusionStepParams) and back.params.to_dict() == p.to_dict()
    # a dict the kind's class does not describe stays a dict (ad-hoc loops, hand-made units)
    assert params_from_dict(UnitKind.DIFFUSION_STEP, {"x": 1}) == {"x": 1}
    assert params_to_dict({"x": 1}) == {"x": 1}


def test_the_loops_write_typed_params():
    from fastvideo3.card.registry import get_card
    from fastvideo3.loop.context import RequestContext
    from fastvideo3.loop.denoise import DenoiseLoop
    from fastvideo3.request.schema import GenerateRequest, resolve
    card = get_card("wan-tiny")
    req = resolve(GenerateRequest("x", num_frames=9, height=32, width=32, num_inference_steps=2, seed=1), card)
    loop = DenoiseLoop()
    plan = loop.next(loop.init(req, card, RequestContext()))
    assert isinstance(plan.params, DiffusionStepParams) and plan.params.step == 0 and plan.params.seed == 1
