"""The cost router's choice (fleet/routing.py): capability filter, health, policies, load."""
from __future__ import annotations

import math

import pytest

from fastvideo3.errors import InvalidRequest, Unavailable
from fastvideo3.runtime.economy.cost import CalibratedCostModel
from fleet.deployment_card import CostModelSpec, card_for_model
from fleet.routing import FleetRouter, FleetState, refusal

SMALL = {"num_frames": 9, "height": 32, "width": 32, "num_inference_steps": 4}


def _card(max_frames: int | None = None, denoise_factor: float = 1.0, denoiser_replicas: int = 1):
    """wan-tiny's card, optionally limited, with a cost model calibrated to ``denoise_factor`` x
    the prior (what a slower or faster fleet's scheduler would have learned)."""
    from fastvideo3.card.registry import get_card
    from fastvideo3.runtime.economy.pricing import Pricer
    from fleet.routing import request_fields
    card = card_for_model("wan-tiny")
    model = CalibratedCostModel()
    pricer = Pricer(model)
    req = request_fields(card, "wan-tiny", SMALL)
    # as on a real fleet the denoiser dominates: the CPU prior of the tiny VAE is far too high
    dec = pricer.predict("vae_tile", "x", get_card("wan-tiny"), req)
    den = pricer.predict("diffusion_step", "x", get_card("wan-tiny"), req)
    for _ in range(5):
        model.observe("vae_tile", "x", dec.prior_seconds * 0.01, dec)
        if denoise_factor != 1.0:
            model.observe("diffusion_step", "x", den.prior_seconds * denoise_factor, den)
    update = {"cost_model": CostModelSpec.of(model)}
    if max_frames is not None:
        m = card.models[0]
        update["models"] = [m.model_copy(update={"limits": m.limits.model_copy(update={"max_frames": max_frames})})]
    pools = [p.model_copy(update={"replicas": denoiser_replicas}) if p.role == "denoiser" else p
             for p in card.role_pools]
    update["role_pools"] = pools
    return card.model_copy(update=update)


def test_refusal_names_the_limit():
    card = _card(max_frames=17)
    assert refusal(card, "wan-tiny", SMALL) == ""
    assert "num_frames=33" in refusal(card, "wan-tiny", {**SMALL, "num_frames": 33})
    assert "not 4k+1" in refusal(card, "wan-tiny", {**SMALL, "num_frames": 8})
    assert "not served" in refusal(card, "other-model", SMALL)
    assert "task 'i2v'" in refusal(card, "wan-tiny", SMALL, task="i2v")


def test_only_a_fleet_that_can_serve_is_chosen_under_every_policy():
    for policy in ("cost", "least-loaded", "round-robin", "random"):
        fleets = [FleetState("a", "x:1", _card(max_frames=17)), FleetState("b", "x:2", _card(max_frames=17)),
                  FleetState("big", "x:3", _card(denoise_factor=20.0))]
        router = FleetRouter(fleets, policy, seed=0)
        picks = {router.pick(f"r{i}", "wan-tiny", {**SMALL, "num_frames": 33}).name for i in range(12)}
        assert picks == {"big"}, policy
        with pytest.raises(InvalidRequest) as err:
            router.pick("too-long", "wan-tiny", {**SMALL, "num_frames": 129})
        assert "a: num_frames=129" in err.value.message and "big: num_frames=129" in err.value.message


def test_a_fleet_not_serving_is_never_chosen():
    router = FleetRouter([FleetState("a", "x:1", _card()), FleetState("b", "x:2", _card())], "round-robin")
    router.set_serving("a", False)
    assert {router.pick(f"r{i}", "wan-tiny", SMALL).name for i in range(6)} == {"b"}
    router.set_serving("b", False)
    with pytest.raises(Unavailable):
        router.pick("none", "wan-tiny", SMALL)


def test_cost_prefers_the_faster_fleet_until_its_backlog_outweighs_the_speed():
    fast, slow = FleetState("fast", "x:1", _card()), FleetState("slow", "x:2", _card(denoise_factor=5.0))
    router = FleetRouter([fast, slow], "cost")
    picks = [router.pick(f"r{i}", "wan-tiny", SMALL).name for i in range(12)]
    assert picks[0] == "fast"
    # a slow fleet is 5x dearer: it is used once about five requests wait on the fast one
    assert 6 <= picks.count("fast") <= 11 and "slow" in picks, picks
    # finishing the fast fleet's work makes it the choice again
    for i, name in enumerate(picks):
        if name == "fast":
            router.done("fast", f"r{i}")
    assert router.pick("next", "wan-tiny", SMALL).name == "fast"


def test_cost_divides_the_backlog_by_replicas():
    one, four = FleetState("one", "x:1", _card()), FleetState("four", "x:2", _card(denoiser_replicas=4))
    router = FleetRouter([one, four], "cost")
    picks = [router.pick(f"r{i}", "wan-tiny", SMALL).name for i in range(10)]
    assert picks.count("four") >= 7, picks


def test_progress_shrinks_what_a_request_owes():
    f = FleetState("a", "x:1", _card())
    router = FleetRouter([f], "cost")
    router.pick("r", "wan-tiny", SMALL)
    full = f.backlog_s()["denoiser"]
    router.progress("a", "r", 3, 4)
    assert math.isclose(f.backlog_s()["denoiser"], full / 4)
    assert "_denoise_total" not in f.backlog_s()
    router.done("a", "r")
    assert f.backlog_s() == {} and f.in_flight == 0


def test_least_loaded_counts_requests_and_round_robin_rotates():
    fleets = [FleetState(n, f"x:{i}", _card()) for i, n in enumerate("abc")]
    ll = FleetRouter(fleets, "least-loaded")
    assert [ll.pick(f"r{i}", "wan-tiny", SMALL).name for i in range(6)] == list("abcabc")
    rr = FleetRouter([FleetState(n, f"x:{i}", _card()) for i, n in enumerate("abc")], "round-robin")
    assert [rr.pick(f"r{i}", "wan-tiny", SMALL).name for i in range(4)] == list("abca")
    with pytest.raises(InvalidRequest):
        FleetRouter(fleets, "fastest")


def test_a_fleet_without_free_memory_for_the_request_is_priced_as_waiting():
    roomy, full = FleetState("roomy", "x:1", _card()), FleetState("full", "x:2", _card(denoise_factor=0.5))
    router = FleetRouter([roomy, full], "cost")
    router.pick("r0", "wan-tiny", SMALL)  # both now owe something; "full" is the faster one
    router.pick("r1", "wan-tiny", SMALL)
    cost = full.predict("wan-tiny", SMALL)
    assert cost["_memory_bytes"] > 0
    full.set_reported({}, requests=0, memory_free_bytes=int(cost["_memory_bytes"]) - 1)
    roomy.set_reported({}, requests=0, memory_free_bytes=None)  # unknown: no penalty
    assert full.finish_estimate_s(cost) > full.finish_estimate_s({**cost, "_memory_bytes": 0.0})
    full.set_reported({}, requests=0, memory_free_bytes=10**15)
    assert full.finish_estimate_s(cost) == full.finish_estimate_s({**cost, "_memory_bytes": 0.0})
