"""RELIABILITY 9 — bad input at the gRPC edge, named cases and a fuzzer, on a fleet of no-op
pools serving the 4-step distilled card (so recipe violations are reachable).

Each bad request is refused before anything is queued: INVALID_ARGUMENT or FAILED_PRECONDITION
naming the field (an unknown model is NOT_FOUND naming ``model``, the project's code for an
unknown card); nothing is admitted or allocated for it, and the server keeps serving. A message
over the front door's size limit is refused by gRPC itself with RESOURCE_EXHAUSTED (before any
handler runs, so no field can be named). The transfer-descriptor case lives in test_faults.py.
"""
from __future__ import annotations

import math

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fastvideo3.client import FleetClient, error_from_rpc
from fastvideo3.errors import FastVideoError
from tests.fleet_fixture import fleet_fixture, resident_total, wait_until
from tests.reliability.helpers import BUDGETS, sched_counters

CARD = "wan-tiny-4step"
fleet = fleet_fixture(scope="module", card=CARD, fake=True, roles=("encoder", "denoiser", "decoder"),
                      scheduler_args=BUDGETS)
OK = dict(num_inference_steps=4, sampler="euler", num_frames=9, height=32, width=32, output_format="npy")

CASES = [
    ("oversized prompt", dict(prompt="x" * 2001), "INVALID_ARGUMENT", "prompt"),
    ("empty prompt", dict(prompt=""), "INVALID_ARGUMENT", "prompt"),
    ("frames over the card's limit", dict(num_frames=129), "INVALID_ARGUMENT", "num_frames"),
    ("frames not 4k+1", dict(num_frames=10), "INVALID_ARGUMENT", "num_frames"),
    ("height over the limit", dict(height=4096), "INVALID_ARGUMENT", "height"),
    ("zero width", dict(width=0), "INVALID_ARGUMENT", "width"),
    ("negative height", dict(height=-32), "INVALID_ARGUMENT", "height"),
    ("size not a multiple of 16", dict(width=40), "INVALID_ARGUMENT", "width"),
    ("NaN guidance", dict(guidance_scale=math.nan), "INVALID_ARGUMENT", "guidance_scale"),
    ("infinite flow shift", dict(flow_shift=math.inf), "INVALID_ARGUMENT", "flow_shift"),
    ("unknown card", dict(model="no-such-card"), "NOT_FOUND", "model"),
    ("wrong step count for a distilled card", dict(num_inference_steps=8), "FAILED_PRECONDITION",
     "num_inference_steps"),
    ("wrong sampler for a distilled card", dict(sampler="unipc"), "FAILED_PRECONDITION", "sampler"),
    ("unknown sampler", dict(sampler="ddim"), "INVALID_ARGUMENT", "sampler"),
    ("unknown CFG policy", dict(cfg_policy="sideways", guidance_scale=3.0), "INVALID_ARGUMENT", "cfg_policy"),
    ("unknown output format", dict(output_format="gif"), "INVALID_ARGUMENT", "output_format"),
    ("fps of zero", dict(fps=0), "INVALID_ARGUMENT", "fps"),
    ("request id with spaces", dict(request_id="a b"), "INVALID_ARGUMENT", "request_id"),
    ("seed beyond 63 bits", dict(seed=2**64 - 1), "INVALID_ARGUMENT", "seed"),
    ("zero deadline", dict(deadline_s=0.0), "INVALID_ARGUMENT", "deadline_s"),
    ("unknown SLO class", dict(slo_class="gold"), "INVALID_ARGUMENT", "slo_class"),
    ("reward scorers without a reward pool", dict(rewards=["aesthetic"]), "FAILED_PRECONDITION", "reward_scorers"),
]


def _first_event_or_error(target: str, **kw):
    """Submit; return ("accepted", None) once the request is accepted (then go away), or
    ("error", typed error) if the call was refused."""
    kw = {**OK, **kw}
    prompt = kw.pop("prompt", "a valid prompt")
    with FleetClient(target, timeout_s=30) as c:
        call = c.stub.Generate(c.request(prompt, **kw), timeout=30)
        try:
            for msg in call:
                return msg.WhichOneof("event"), None
            return "empty", None
        except grpc.RpcError as err:
            return "error", error_from_rpc(err)
        finally:
            call.cancel()


def _admitted(target: str) -> float:
    return sched_counters(target).get("admitted", 0.0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, kw, code, field", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_naming_the_field_and_allocates_nothing(fleet, name, kw, code, field):
    admitted = _admitted(fleet.target)
    kind, err = _first_event_or_error(fleet.target, **kw)
    assert kind == "error" and isinstance(err, FastVideoError), (name, kind)
    assert err.code == code and err.field == field, (name, err.code, err.field, err.message)
    assert _admitted(fleet.target) == admitted  # nothing queued
    wait_until(lambda: resident_total(fleet) == 0, 10, "no resident buffer in any pool")  # nothing allocated
    assert _first_event_or_error(fleet.target)[0] == "accepted"  # still serving


@pytest.mark.timeout(120)
def test_message_over_the_size_limit_is_refused_and_the_server_keeps_serving(fleet):
    kind, err = _first_event_or_error(fleet.target, prompt="x" * (5 << 20))
    assert kind == "error" and err.code == "RESOURCE_EXHAUSTED", err
    assert _first_event_or_error(fleet.target)[0] == "accepted"


_ints = st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, 5, 9, 17, 32, 64, 65, 129]))
_floats = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, 5.0, -1.0]))
_text = st.one_of(st.none(), st.text(max_size=40), st.sampled_from(["euler", "unipc", "none", "classic", "batched",
                                                                      "mp4", "npy", "wan-tiny-4step", ""]))
FIELDS = dict(num_frames=_ints, height=_ints, width=_ints, num_inference_steps=_ints, fps=_ints,
              guidance_scale=_floats, flow_shift=_floats, deadline_s=_floats, sampler=_text, cfg_policy=_text,
              negative_prompt=_text, seed=st.one_of(st.none(), st.integers(0, 2**64 - 1)))


@st.composite
def requests(draw):
    kw = {k: draw(v) for k, v in FIELDS.items()}
    kw = {k: v for k, v in kw.items() if v is not None}
    kw["prompt"] = draw(st.one_of(st.text(max_size=60), st.just("a cat")))
    kw["output_format"] = draw(st.sampled_from(["", "npy", "mp4", "avi"]))
    kw["model"] = draw(st.sampled_from(["", CARD, "other"]))
    kw["request_id"] = draw(st.one_of(st.just(None), st.text(max_size=20)))
    kw["slo_class"] = draw(st.sampled_from(["", "interactive", "batch", "x"]))
    kw["metadata"] = draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3))
    return kw


@pytest.mark.timeout(300)
def test_fuzzed_requests_get_only_validation_errors_or_success(fleet):
    allowed = {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND"}
    outcomes: dict[str, int] = {}

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(kw=requests())
    @example(kw={"model": CARD, "prompt": "a cat"})  # the card's own request: accepted
    @example(kw={"model": CARD, "prompt": "a cat", "num_frames": 32})  # not 4k+1: refused, naming the field
    def check(kw):
        model = kw.pop("model")
        base = {k: v for k, v in OK.items() if k not in kw}
        kind, err = _first_event_or_error(fleet.target, model=model, **{**base, **kw})
        if kind == "error":
            assert err.code in allowed, (kw, err.code, err.message)
            assert err.field, (kw, err.message)  # every refusal names what was wrong
            assert err.code != "NOT_FOUND" or err.field == "model"
            outcomes[err.code] = outcomes.get(err.code, 0) + 1
        else:
            assert kind == "accepted", kind
            outcomes["accepted"] = outcomes.get("accepted", 0) + 1

    check()
    assert outcomes.get("accepted") and outcomes.get("INVALID_ARGUMENT"), outcomes
    assert _first_event_or_error(fleet.target)[0] == "accepted"  # the server kept serving
