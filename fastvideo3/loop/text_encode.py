"""text_encode: one encoder_chunk that turns the prompt (and negative prompt) into embeddings
held by the encoder pool; the loop keeps only their references."""
from __future__ import annotations

from fastvideo3.loop.context import RequestContext
from fastvideo3.loop.params import EncoderChunkParams
from fastvideo3.loop.protocol import Done, LoopResult, LoopState, Ref, StepResult, WorkPlan
from fastvideo3.vocab import LoopId, Role, UnitKind


class TextEncodeState(LoopState):
    model_id: str
    prompts: dict[str, str]  # output name -> text
    max_len: int
    outputs: dict[str, Ref] = {}
    adapter_versions: list[str] = []  # enter the prompt cache's key


class TextEncodeLoop:
    loop_id = LoopId.TEXT_ENCODE

    def init(self, request, card, ctx: RequestContext) -> TextEncodeState:
        prompts = {"prompt_embeds": request.prompt}
        if request.cfg_policy != "none":
            prompts["negative_embeds"] = request.negative_prompt
        return TextEncodeState(request_id=request.request_id, loop_id=self.loop_id, model_id=card.model_id,
                               prompts=prompts, max_len=card.max_text_tokens,
                               adapter_versions=list(getattr(request, "adapter_versions", ())))

    def next(self, state: TextEncodeState) -> WorkPlan | Done:
        if state.done:
            return Done(self.finalize(state))
        return WorkPlan(loop_id=self.loop_id, request_id=state.request_id, kind=UnitKind.ENCODER_CHUNK,
                        role=Role.ENCODER,
                        shape_sig=f"encoder_chunk|{state.model_id}|{state.max_len}",
                        params=EncoderChunkParams(prompts=state.prompts,
                                                  adapter_versions=state.adapter_versions or None))

    def advance(self, state: TextEncodeState, result: StepResult) -> TextEncodeState:
        missing = set(state.prompts) - set(result.outputs)
        if missing:
            raise ValueError(f"encoder result lacks {sorted(missing)}")
        return state.model_copy(update={"outputs": dict(result.outputs), "done": True})

    def finalize(self, state: TextEncodeState) -> LoopResult:
        return LoopResult(state.request_id, self.loop_id, outputs=dict(state.outputs))
