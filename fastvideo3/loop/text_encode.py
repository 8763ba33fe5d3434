"""text_encode: one encoder_chunk that turns the prompt (and negative prompt) into embeddings
held by the encoder pool; the loop keeps only their references.

On an image-to-video request the same loop conditions on the image too: the encoder chunk also
carries the image (the pool returns its CLIP hidden states, ``image_embeds``), and a second unit,
``vae_encode`` on the decoder pool (which holds the VAE), returns the first-frame image latent
(``image_latents``). Both are encoded once per request and read by every denoise step.
"""
from __future__ import annotations

from fastvideo3.loop.context import RequestContext
from fastvideo3.loop.params import EncoderChunkParams, VaeEncodeParams
from fastvideo3.loop.protocol import Done, LoopResult, LoopState, Ref, StepResult, WorkPlan
from fastvideo3.vocab import LoopId, Role, UnitKind

#: the outputs of an image-to-video request's conditioning, by unit
IMAGE_EMBEDS, IMAGE_LATENTS = "image_embeds", "image_latents"


class TextEncodeState(LoopState):
    model_id: str
    prompts: dict[str, str]  # output name -> text
    max_len: int
    outputs: dict[str, Ref] = {}
    adapter_versions: list[str] = []  # enter the prompt cache's key
    #: image-to-video: the image (base64 of its bytes), its digest and the size it is encoded at
    image: str | None = None
    image_digest: str | None = None
    size: list[int] = []  # [num_frames, height, width]


class TextEncodeLoop:
    loop_id = LoopId.TEXT_ENCODE

    def init(self, request, card, ctx: RequestContext) -> TextEncodeState:
        prompts = {"prompt_embeds": request.prompt}
        if request.cfg_policy != "none":
            prompts["negative_embeds"] = request.negative_prompt
        image = getattr(request, "image", None)
        return TextEncodeState(request_id=request.request_id, loop_id=self.loop_id, model_id=card.model_id,
                               prompts=prompts, max_len=card.max_text_tokens,
                               adapter_versions=list(getattr(request, "adapter_versions", ())),
                               image=image, image_digest=getattr(request, "image_digest", None) if image else None,
                               size=[request.num_frames, request.height, request.width] if image else [])

    def next(self, state: TextEncodeState) -> WorkPlan | Done:
        if state.done:
            return Done(self.finalize(state))
        if state.image and state.outputs:  # prompts and image embeddings are in: the image latent
            f, h, w = state.size
            return WorkPlan(loop_id=self.loop_id, request_id=state.request_id, kind=UnitKind.VAE_ENCODE,
                            role=Role.DECODER, shape_sig=f"vae_encode|{state.model_id}|{f}x{h}x{w}",
                            params=VaeEncodeParams(image=state.image, image_digest=state.image_digest or "",
                                                   height=h, width=w, num_frames=f))
        return WorkPlan(loop_id=self.loop_id, request_id=state.request_id, kind=UnitKind.ENCODER_CHUNK,
                        role=Role.ENCODER,
                        shape_sig=f"encoder_chunk|{state.model_id}|{state.max_len}",
                        params=EncoderChunkParams(prompts=state.prompts,
                                                  adapter_versions=state.adapter_versions or None,
                                                  image=state.image, image_digest=state.image_digest))

    def advance(self, state: TextEncodeState, result: StepResult) -> TextEncodeState:
        if state.image and state.outputs:
            if IMAGE_LATENTS not in result.outputs:
                raise ValueError(f"decoder result lacks {IMAGE_LATENTS}")
            return state.model_copy(update={"outputs": {**state.outputs, IMAGE_LATENTS: result.outputs[IMAGE_LATENTS]},
                                            "done": True})
        missing = set(state.prompts) - set(result.outputs) | ({IMAGE_EMBEDS} - set(result.outputs) if state.image
                                                               else set())
        if missing:
            raise ValueError(f"encoder result lacks {sorted(missing)}")
        return state.model_copy(update={"outputs": dict(result.outputs), "done": not state.image})

    def finalize(self, state: TextEncodeState) -> LoopResult:
        return LoopResult(state.request_id, self.loop_id, outputs=dict(state.outputs))
