"""LoopState round trips, the one driver on a fake loop, and the loops' plans."""
import pytest

from fastvideo3.card import get_card
from fastvideo3.errors import NumericFault
from fastvideo3.loop import (
    STATES, DecodeLoop, DenoiseLoop, Done, LoopDriver, LoopResult, LoopState, RequestContext, StepResult,
    TextEncodeLoop, WorkPlan, run_loop,
)
from fastvideo3.request.schema import GenerateRequest, resolve
from services.common.fake import fake_ref

pytestmark = pytest.mark.timeout(30)
CARD = get_card("wan-tiny")
REQ = resolve(GenerateRequest(prompt="a red circle", seed=7, num_inference_steps=5, request_id="r1"), CARD)
EMBEDS = {"prompt_embeds": fake_ref("encoder", "r1", "a", [1, 8, 4]),
          "negative_embeds": fake_ref("encoder", "r1", "b", [1, 8, 4])}

FINAL = fake_ref("denoiser", "r1", "final", [1, 16, 9, 16, 16])


class CountLoop:
    """A fake loop: counts to n, doubling a value from each result."""

    loop_id = "count"

    class State(LoopState):
        n: int
        i: int = 0
        acc: list[float] = []

    def init(self, request, card, ctx):
        return self.State(request_id="x", loop_id=self.loop_id, n=ctx["n"])

    def next(self, s):
        if s.i >= s.n:
            return Done(LoopResult("x", self.loop_id, payload={"acc": s.acc}))
        return WorkPlan(self.loop_id, "x", "fake", "fake", "sig", params={"i": s.i})

    def advance(self, s, r):
        return s.model_copy(update={"i": s.i + 1, "acc": [*s.acc, r.metrics["v"]]})

    def finalize(self, s):
        return LoopResult("x", self.loop_id)


def test_driver_runs_a_fake_loop_to_completion():
    loop = CountLoop()
    seen = []

    def execute(plan):
        seen.append(plan.params["i"])
        return StepResult("u", "x", metrics={"v": 2.0 * plan.params["i"]})

    result = run_loop(loop, loop.init(None, None, {"n": 4}), execute)
    assert seen == [0, 1, 2, 3]
    assert result.payload["acc"] == [0.0, 2.0, 4.0, 6.0]


def test_driver_plan_is_stable_until_applied_and_failures_raise():
    loop = CountLoop()
    d = LoopDriver(loop, loop.init(None, None, {"n": 2}))
    p1 = d.plan()
    assert d.plan() is p1
    d.apply(StepResult("u", "x", metrics={"v": 1.0}))
    assert d.plan() is not p1 and d.plan().params["i"] == 1
    from fastvideo3.errors import ErrorInfo
    with pytest.raises(NumericFault):
        d.apply(StepResult("u", "x", ok=False, error=ErrorInfo("ABORTED", "nan")))
    assert not d.done


@pytest.mark.parametrize("loop_id", ["text_encode", "diffusion_denoise", "vae_decode"])
def test_loop_states_round_trip_unchanged(loop_id):
    loop = {"text_encode": TextEncodeLoop, "diffusion_denoise": DenoiseLoop, "vae_decode": DecodeLoop}[loop_id]()
    ctx = RequestContext(refs={**EMBEDS, "latents": fake_ref("denoiser", "r1", "z", [1, 16, 9, 16, 16])})
    state = loop.init(REQ, CARD, ctx)
    if loop_id == "diffusion_denoise":
        state = loop.advance(state, StepResult("u", "r1", metrics={"latent_norm": 3.5}))
    text = state.to_json()
    again = STATES[loop_id].from_json(text)
    assert again == state and again.to_json() == text


def test_denoise_loop_plans_every_step_then_finishes():
    loop = DenoiseLoop()
    state = loop.init(REQ, CARD, RequestContext(refs=dict(EMBEDS)))
    assert len(state.sigmas) == 6 and state.sigmas[-1] == 0.0
    steps = []
    while not isinstance(plan := loop.next(state), Done):
        steps.append(plan.params["step"])
        assert plan.kind == "diffusion_step" and plan.role == "denoiser"
        assert plan.shape_sig.startswith("diffusion_step|wan-tiny|16x9x16x16|")
        out = {"latents": FINAL} if plan.params["final"] else {}
        state = loop.advance(state, StepResult("u", "r1", outputs=out, metrics={"latent_norm": 1.0}))
    assert steps == [0, 1, 2, 3, 4]
    assert loop.finalize(state).outputs == {"latents": FINAL}


def test_denoise_loop_aborts_on_non_finite_result():
    loop = DenoiseLoop()
    state = loop.init(REQ, CARD, RequestContext(refs=dict(EMBEDS)))
    with pytest.raises(NumericFault) as e:
        loop.advance(state, StepResult("u", "r1", metrics={"finite": 0.0}))
    assert e.value.code == "ABORTED" and e.value.step == 0
