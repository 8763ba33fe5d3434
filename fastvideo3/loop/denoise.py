"""diffusion_denoise: flow-matching denoising, one WorkPlan per step.

The latent and the sampler history live in the denoiser pool (created there from the seed on
the first step); this state holds the schedule, the policy, references and per-step stats, so
it is small and a resume point at every step boundary.
"""
from __future__ import annotations

from typing import Any

from fastvideo3.errors import NumericFault
from fastvideo3.loop.protocol import Done, LoopResult, LoopState, Resources, StepResult, WorkPlan
from fastvideo3.loop.samplers import make_schedule


class DenoiseState(LoopState):
    model_id: str
    step: int = 0
    num_steps: int
    timesteps: list[float]
    sigmas: list[float]
    guidance: float
    cfg_policy: str
    sampler: str
    solver_order: int = 2
    seed: int
    latent_shape: list[int]  # [C, F, H, W]
    precision: str
    embeds: dict[str, dict]  # name -> TensorRef dict, fetched once by the pool
    latent_norms: list[float] = []
    outputs: dict[str, dict] = {}
    #: the request's interceptor settings (fastvideo3.extend), None for none
    cache: dict | None = None
    #: interceptor state (JSON): policy -> CFG stream -> values; the pool returns it updated
    #: with each step's result, and it is checkpointed with the rest of this state
    plugin_state: dict[str, Any] = {}


class DenoiseLoop:
    loop_id = "diffusion_denoise"

    def init(self, request, card, ctx: dict) -> DenoiseState:
        from fastvideo3.models.wan.components import latent_shape
        spec = card.denoise.sampler
        sched = make_schedule(request.sampler, request.num_inference_steps, request.flow_shift,
                              spec.num_train_timesteps if spec else 1000)
        return DenoiseState(
            request_id=request.request_id, loop_id=self.loop_id, model_id=card.model_id,
            num_steps=request.num_inference_steps, timesteps=sched.timesteps, sigmas=sched.sigmas,
            guidance=request.guidance_scale, cfg_policy=request.cfg_policy, sampler=request.sampler,
            solver_order=spec.solver_order if spec else 2, seed=request.seed,
            latent_shape=list(latent_shape(card, request.num_frames, request.height, request.width)),
            precision=request.precision,
            embeds={k: ctx[k] for k in ("prompt_embeds", "negative_embeds") if k in ctx},
            cache=getattr(request, "cache", None),
        )

    def shape_sig(self, state: DenoiseState) -> str:
        c, f, h, w = state.latent_shape
        return f"diffusion_step|{state.model_id}|{c}x{f}x{h}x{w}|{state.precision}|{state.cfg_policy}"

    def next(self, state: DenoiseState) -> WorkPlan | Done:
        if state.step >= state.num_steps:
            return Done(self.finalize(state))
        k = state.step
        return WorkPlan(
            loop_id=self.loop_id, request_id=state.request_id, kind="diffusion_step", role="denoiser",
            shape_sig=self.shape_sig(state), inputs=dict(state.embeds), step=k, total=state.num_steps,
            params={
                "step": k, "timestep": state.timesteps[k], "sigmas": state.sigmas, "guidance": state.guidance,
                "cfg_policy": state.cfg_policy, "sampler": state.sampler, "solver_order": state.solver_order,
                "seed": state.seed, "latent_shape": state.latent_shape, "final": k == state.num_steps - 1,
                **({"cache": state.cache, "plugin_state": state.plugin_state, "num_steps": state.num_steps}
                   if state.cache else {}),
            },
            resources=Resources(),
        )

    def advance(self, state: DenoiseState, result: StepResult) -> DenoiseState:
        norm = float(result.metrics.get("latent_norm", 0.0))
        if result.metrics.get("finite", 1.0) != 1.0:
            raise NumericFault("latents became non-finite", step=state.step, request_id=state.request_id)
        upd = {"step": state.step + 1, "latent_norms": [*state.latent_norms, norm]}
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
