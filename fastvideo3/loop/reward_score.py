"""reward_score: one reward_batch unit that scores the decoded frames in the reward pool.

It runs after vae_decode when a request asks for scores (``rewards: [...]`` in the request
context); the frames stay in the decoder pool and the reward pool pulls them by reference.
"""
from __future__ import annotations

from fastvideo3.loop.context import RequestContext
from fastvideo3.loop.params import RewardBatchParams
from fastvideo3.loop.protocol import Done, LoopResult, LoopState, Ref, StepResult, WorkPlan
from fastvideo3.vocab import LoopId, Role, UnitKind


class RewardScoreState(LoopState):
    model_id: str
    frames: Ref  # the decoded frames [F, H, W, 3], in the decoder pool
    scorers: list[str]
    scores: dict[str, float] = {}


class RewardScoreLoop:
    loop_id = LoopId.REWARD_SCORE

    def init(self, request, card, ctx: RequestContext) -> RewardScoreState:
        return RewardScoreState(request_id=request.request_id, loop_id=self.loop_id, model_id=card.model_id,
                                frames=ctx.ref("frames"), scorers=list(ctx.rewards))

    def next(self, state: RewardScoreState) -> WorkPlan | Done:
        if state.done or not state.scorers:
            return Done(self.finalize(state))
        f, h, w = (list(state.frames.shape) + [0, 0, 0])[:3]
        return WorkPlan(loop_id=self.loop_id, request_id=state.request_id, kind=UnitKind.REWARD_BATCH, role=Role.REWARD,
                        shape_sig=f"reward_batch|{state.model_id}|{f}x{h}x{w}|{','.join(state.scorers)}",
                        inputs={"frames": state.frames}, params=RewardBatchParams(scorers=list(state.scorers)))

    def advance(self, state: RewardScoreState, result: StepResult) -> RewardScoreState:
        scores = dict(result.payload.get("scores") or {})
        missing = set(state.scorers) - set(scores)
        if missing:
            raise ValueError(f"reward result lacks {sorted(missing)}")
        return state.model_copy(update={"scores": {k: float(v) for k, v in scores.items()}, "done": True})

    def finalize(self, state: RewardScoreState) -> LoopResult:
        return LoopResult(state.request_id, self.loop_id, payload={"scores": dict(state.scores)})
