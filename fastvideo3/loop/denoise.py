"""diffusion_denoise: flow-matching denoising, one WorkPlan per step.

The latent and the sampler history live in the denoiser pool (created there from the seed on
the first step); this state holds the schedule, the policy, references and per-step stats, so
it is small and a resume point at every step boundary.
"""
from __future__ import annotations

from typing import Any

from fastvideo3.errors import NumericFault
from fastvideo3.loop.context import RequestContext
from fastvideo3.loop.protocol import Done, LoopResult, LoopState, Ref, Resources, StepResult, WorkPlan
from fastvideo3.loop.params import DiffusionStepParams
from fastvideo3.loop.samplers import make_schedule
from fastvideo3.vocab import LoopId, Role, UnitKind


#: output / input names of the latent and sampler history handed from one expert's pool to the other's
HANDOFF_PREFIX = "handoff."


def _experts(card, request, num_train_timesteps: int) -> dict:
    e = card.denoise.experts
    if e is None:
        return {}
    return {"experts": [e.high_noise, e.low_noise], "boundary_timestep": e.boundary_ratio * num_train_timesteps,
            "guidance_2": request.guidance_scale_2 if request.guidance_scale_2 is not None else request.guidance_scale}


class DenoiseState(LoopState):
    model_id: str
    step: int = 0
    num_steps: int
    timesteps: list[float]
    sigmas: list[float]
    guidance: float
    #: two experts (high noise, low noise), the timestep at which the low-noise one takes over and
    #: its guidance; an empty list means one DiT ("transformer") for every step
    experts: list[str] = []
    boundary_timestep: float | None = None
    guidance_2: float | None = None
    #: references to the latent and sampler history published at the expert switch, so a pool
    #: holding only the low-noise expert can take the request over (see DenoiserExecutor)
    handoff: dict[str, Ref] = {}
    handoff_meta: dict = {}
    cfg_policy: str
    sampler: str
    solver_order: int = 2
    seed: int
    latent_shape: list[int]  # [C, F, H, W]
    precision: str
    embeds: dict[str, Ref]  # name -> the encoder pool's ref, fetched once by the pool
    latent_norms: list[float] = []
    adapters: list[dict] = []  # [{"id", "version", "scale"}]: applied per row by the denoiser
    outputs: dict[str, Ref] = {}
    #: the request's interceptor settings (fastvideo3.extend), None for none
    cache: dict | None = None
    #: interceptor state (JSON): policy -> CFG stream -> values; the pool returns it updated
    #: with each step's result, and it is checkpointed with the rest of this state
    plugin_state: dict[str, Any] = {}
    #: batch-invariant mode (fastvideo3.runtime.scheduling.invariant): the units per forward every step of
    #: this request runs at, fixed when the loop starts (a resume keeps it); None = off
    batch_bucket: int | None = None


class DenoiseLoop:
    loop_id = LoopId.DIFFUSION_DENOISE

    def init(self, request, card, ctx: RequestContext) -> DenoiseState:
        from fastvideo3.card.family import family_of
        spec = card.denoise.sampler
        sched = make_schedule(request.sampler, request.num_inference_steps, request.flow_shift,
                              spec.num_train_timesteps if spec else 1000,
                              sigma_spacing=spec.sigma_spacing if spec else "scheduler")
        return DenoiseState(
            request_id=request.request_id, loop_id=self.loop_id, model_id=card.model_id,
            num_steps=request.num_inference_steps, timesteps=sched.timesteps, sigmas=sched.sigmas,
            guidance=request.guidance_scale, cfg_policy=request.cfg_policy, sampler=request.sampler,
            solver_order=spec.solver_order if spec else 2, seed=request.seed,
            latent_shape=list(family_of(card).latent_shape(card, request.num_frames, request.height, request.width)),
            precision=request.precision,
            # image-to-video: the image's CLIP hidden states and first-frame latent, read every step
            embeds={k: ctx.refs[k] for k in ("prompt_embeds", "negative_embeds", "image_embeds", "image_latents")
                    if k in ctx.refs},
            adapters=[dict(a) for a in getattr(request, "adapters", ())],
            **_experts(card, request, spec.num_train_timesteps if spec else 1000),
            cache=getattr(request, "cache", None),
            batch_bucket=ctx.batch_bucket,
        )

    def expert(self, state: DenoiseState, k: int) -> str:
        """The DiT that runs step ``k``: loop semantics, as diffusers' WanPipeline decides it (the
        high-noise expert while the step's timestep is >= the boundary)."""
        if not state.experts:
            return "transformer"
        return state.experts[0] if state.timesteps[k] >= state.boundary_timestep else state.experts[1]

    def shape_sig(self, state: DenoiseState, expert: str = "transformer") -> str:
        c, f, h, w = state.latent_shape
        sig = f"diffusion_step|{state.model_id}|{c}x{f}x{h}x{w}|{state.precision}|{state.cfg_policy}"
        return sig if not state.experts else f"{sig}|{expert}"  # a batch never mixes experts

    def next(self, state: DenoiseState) -> WorkPlan | Done:
        if state.step >= state.num_steps:
            return Done(self.finalize(state))
        k = state.step
        expert = self.expert(state, k)
        low = bool(state.experts) and expert == state.experts[1]
        params = DiffusionStepParams(
            step=k, timestep=state.timesteps[k], sigmas=state.sigmas,
            guidance=state.guidance_2 if low else state.guidance,
            cfg_policy=state.cfg_policy, sampler=state.sampler, solver_order=state.solver_order,
            seed=state.seed, latent_shape=state.latent_shape, final=k == state.num_steps - 1,
        )
        if state.adapters:
            params.adapters = [dict(a) for a in state.adapters]
        if state.cache:
            params.cache, params.plugin_state, params.num_steps = state.cache, state.plugin_state, state.num_steps
        if state.batch_bucket:
            params.batch_bucket = state.batch_bucket
        inputs = dict(state.embeds)
        if state.experts:
            params.expert = expert
            # the step after which the other expert runs: its pool may not hold this request
            params.handoff = k + 1 < state.num_steps and self.expert(state, k + 1) != expert
            if state.handoff and low:
                inputs.update(state.handoff)
                params.handoff_meta = state.handoff_meta
        return WorkPlan(
            loop_id=self.loop_id, request_id=state.request_id, kind=UnitKind.DIFFUSION_STEP, role=Role.DENOISER,
            shape_sig=self.shape_sig(state, expert), inputs=inputs, step=k, total=state.num_steps,
            params=params, resources=Resources(),
        )

    def advance(self, state: DenoiseState, result: StepResult) -> DenoiseState:
        norm = float(result.metrics.get("latent_norm", 0.0))
        if result.metrics.get("finite", 1.0) != 1.0:
            raise NumericFault("latents became non-finite", step=state.step, request_id=state.request_id)
        upd = {"step": state.step + 1, "latent_norms": [*state.latent_norms, norm]}
        handoff = {k: v for k, v in result.outputs.items() if k.startswith(HANDOFF_PREFIX)}
        if handoff:
            upd["handoff"], upd["handoff_meta"] = handoff, dict(result.payload.get("handoff_meta", {}))
        if state.cache and "plugin_state" in result.payload:
            upd["plugin_state"] = result.payload["plugin_state"]
        if state.step + 1 >= state.num_steps:
            upd["outputs"] = dict(result.outputs)
            upd["done"] = True
        return state.model_copy(update=upd)

    def finalize(self, state: DenoiseState) -> LoopResult:
        payload = {"latent_norms": list(state.latent_norms)}
        if state.cache:
            from fastvideo3.extend.stats import summarize
            payload["cache"] = {"settings": dict(state.cache), **summarize(state.plugin_state)}
        return LoopResult(state.request_id, self.loop_id, outputs=dict(state.outputs), payload=payload)
