"""vae_decode: one vae_tile batch that turns the final latent into frames in the decoder pool.

When the request context names an ``encode`` format ("mp4" or "npy"), the decoder pool also
encodes the file itself and returns its bytes inline, so the frames never travel as a tensor
to the scheduler.
"""
from __future__ import annotations

from fastvideo3.loop.context import RequestContext
from fastvideo3.loop.params import VaeTileParams
from fastvideo3.loop.protocol import Done, LoopResult, LoopState, Ref, StepResult, WorkPlan
from fastvideo3.vocab import LoopId, Role, UnitKind


class DecodeState(LoopState):
    model_id: str
    latent: Ref  # the final latents, in the denoiser pool
    latent_shape: list[int]
    encode: str | None = None  # "mp4" | "npy": the decoder pool returns the encoded file inline
    fps: int = 16
    outputs: dict[str, Ref] = {}
    payload: dict = {}


class DecodeLoop:
    loop_id = LoopId.VAE_DECODE

    def init(self, request, card, ctx: RequestContext) -> DecodeState:
        ref = ctx.ref("latents")
        return DecodeState(request_id=request.request_id, loop_id=self.loop_id, model_id=card.model_id,
                           latent=ref, latent_shape=list(ref.shape)[1:], encode=ctx.encode,
                           fps=int(ctx.fps or card.limits.fps))

    def next(self, state: DecodeState) -> WorkPlan | Done:
        if state.done:
            return Done(self.finalize(state))
        c, f, h, w = state.latent_shape
        params = VaeTileParams(encode=state.encode, fps=state.fps) if state.encode else VaeTileParams()
        return WorkPlan(loop_id=self.loop_id, request_id=state.request_id, kind=UnitKind.VAE_TILE, role=Role.DECODER,
                        shape_sig=f"vae_tile|{state.model_id}|{c}x{f}x{h}x{w}", inputs={"latents": state.latent},
                        params=params)

    def advance(self, state: DecodeState, result: StepResult) -> DecodeState:
        return state.model_copy(update={"outputs": dict(result.outputs), "payload": dict(result.payload), "done": True})

    def finalize(self, state: DecodeState) -> LoopResult:
        return LoopResult(state.request_id, self.loop_id, outputs=dict(state.outputs), payload=dict(state.payload))
