"""Rollout = the serving loop + behavior capture.

A rollout submits prompts to an :class:`~fastvideo3.engine.Engine`'s scheduler exactly as
serving does (same ``text_encode`` / ``diffusion_denoise`` / ``vae_decode`` loops, same
cross-request batching, same executors) with one read-only observer installed on the denoiser
executor. The observer turns every denoising step into a :class:`StepRecord`; each request
becomes a :class:`BehaviorRecord` (seed, timesteps, sigmas, guidance, latent norms or latents,
weights versions). There is no sampling loop here: iteration lives in the loop driver only.

    engine = Engine(card, keep_latents=True)
    records = Rollout(engine, capture="endpoints").run(prompts, seeds, num_inference_steps=25)
    records[0].final_latent, records[0].steps[0].latent_in    # teacher sample and its noise
"""
from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from fastvideo3.runtime.pool.executors import frames_as_float
from fastvideo3.runtime.scheduling.scheduler import PROGRAM_T2V
from fastvideo3.vocab import LoopId, RunStatus

CAPTURE_MODES = ("norms", "endpoints", "all")


@dataclass
class StepRecord:
    """One denoising step as it ran in the denoiser pool."""

    step: int
    timestep: float
    sigma: float
    sigma_next: float
    guidance: float
    cfg_policy: str
    sampler: str
    latent_in_norm: float
    model_output_norm: float
    latent_out_norm: float
    batch_rows: int = 1
    latent_in: torch.Tensor | None = None
    model_output: torch.Tensor | None = None
    latent_out: torch.Tensor | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("latent_in", "model_output", "latent_out"):
            d.pop(k)
        return d


@dataclass
class BehaviorRecord:
    """What one rollout request did, captured at generation time."""

    request_id: str
    card: str
    prompt: str
    negative_prompt: str
    seed: int
    num_inference_steps: int
    guidance: float
    cfg_policy: str
    sampler: str
    flow_shift: float
    precision: str
    weights_version: dict[str, str]
    steps: list[StepRecord] = field(default_factory=list)
    final_latent: torch.Tensor | None = None  # [1, C, F, H, W] as the denoise loop returned it
    frames: torch.Tensor | None = None  # [F, H, W, 3] in [0, 1] when decoded
    scores: dict[str, Any] = field(default_factory=dict)

    @property
    def noise(self) -> torch.Tensor | None:
        """The initial latent (captured when capture is "endpoints" or "all")."""
        return self.steps[0].latent_in if self.steps else None

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("steps", "final_latent", "frames")}
        d["steps"] = [s.to_dict() for s in self.steps]
        return d


class BehaviorCapture:
    """A denoiser-executor observer: ``fn(unit, latent_in, model_output, latent_out)``.

    ``capture``: "norms" keeps only numbers; "endpoints" also keeps the first step's input latent
    (the noise) and the last step's output; "all" keeps every step's tensors. Tensors are cloned
    to the CPU, so the pool's resident latents are never aliased or mutated.
    """

    def __init__(self, capture: str = "norms", request_ids: set[str] | None = None):
        if capture not in CAPTURE_MODES:
            raise ValueError(f"capture must be one of {CAPTURE_MODES}")
        self.capture = capture
        self.request_ids = request_ids  # None: every request
        self.steps: dict[str, list[StepRecord]] = {}

    def __call__(self, unit, latent_in: torch.Tensor, model_output: torch.Tensor, latent_out: torch.Tensor) -> None:
        if self.request_ids is not None and unit.request_id not in self.request_ids:
            return
        p = unit.params
        k = int(p["step"])
        sig = p["sigmas"]
        keep_in = self.capture == "all" or (self.capture == "endpoints" and k == 0)
        keep_out = self.capture == "all" or (self.capture == "endpoints" and bool(p.get("final")))
        rec = StepRecord(
            step=k, timestep=float(p["timestep"]), sigma=float(sig[k]), sigma_next=float(sig[k + 1]),
            guidance=float(p["guidance"]), cfg_policy=str(p["cfg_policy"]), sampler=str(p["sampler"]),
            latent_in_norm=float(latent_in.float().norm()), model_output_norm=float(model_output.float().norm()),
            latent_out_norm=float(latent_out.float().norm()),
            latent_in=latent_in.detach().to("cpu", copy=True) if keep_in else None,
            model_output=model_output.detach().to("cpu", copy=True) if self.capture == "all" else None,
            latent_out=latent_out.detach().to("cpu", copy=True) if keep_out else None,
        )
        self.steps.setdefault(unit.request_id, []).append(rec)

    def take(self, request_id: str) -> list[StepRecord]:
        return self.steps.pop(request_id, [])


class Rollout:
    """Drives prompt batches through an engine's scheduler with behavior capture on.

    ``decode=True`` adds the ``vae_decode`` loop (the serving program) and returns frames;
    ``scorer(frames, prompt) -> dict`` then fills ``BehaviorRecord.scores``. Requests are
    submitted in waves of ``wave`` so a large prompt set never overflows the queue.
    """

    def __init__(self, engine, capture: str = "norms", wave: int | None = None):
        self.engine = engine
        self.capture = capture
        self.wave = wave or engine.scheduler.max_running

    def run(self, prompts: list[str], seeds: list[int], *, decode: bool = False,
            scorer: Callable[[torch.Tensor, str], dict] | None = None, **request_kw) -> list[BehaviorRecord]:
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        out: list[BehaviorRecord] = []
        for i in range(0, len(prompts), self.wave):
            out.extend(self._wave(prompts[i : i + self.wave], seeds[i : i + self.wave], decode, scorer, request_kw))
        return out

    def _wave(self, prompts, seeds, decode, scorer, request_kw) -> list[BehaviorRecord]:
        eng = self.engine
        program = PROGRAM_T2V if decode else tuple(p for p in PROGRAM_T2V if p != LoopId.VAE_DECODE)
        runs = []
        for prompt, seed in zip(prompts, seeds):
            req = eng.resolve(prompt, seed=seed, request_id=f"rollout-{uuid.uuid4().hex[:12]}", **request_kw)
            runs.append(eng.scheduler.submit(req, eng.card, program=program))
        capture = BehaviorCapture(self.capture, {r.request_id for r in runs})
        eng.denoiser.observers.append(capture)
        try:
            eng.run()
        finally:
            eng.denoiser.observers.remove(capture)
        records = []
        versions = {"transformer": eng.denoiser.weights_digest, "text_encoder": eng.encoder.weights_digest,
                    "vae": eng.decoder.weights_digest}
        for run in runs:
            try:
                if run.status != RunStatus.SUCCEEDED:
                    raise (run.error.to_exception() if run.error else RuntimeError("rollout request did not finish"))
                r = run.request
                rec = BehaviorRecord(
                    request_id=r.request_id, card=eng.card.model_id, prompt=r.prompt, negative_prompt=r.negative_prompt,
                    seed=r.seed, num_inference_steps=r.num_inference_steps, guidance=r.guidance_scale,
                    cfg_policy=r.cfg_policy, sampler=r.sampler, flow_shift=r.flow_shift, precision=r.precision,
                    weights_version=dict(versions), steps=capture.take(r.request_id),
                )
                rec.final_latent = eng.transport.fetch(run.ctx.ref("latents"), deadline_s=30.0).clone()
                if decode:
                    rec.frames = frames_as_float(eng.transport.fetch(run.ctx.ref("frames"), deadline_s=30.0)).clone()
                    if scorer is not None:
                        rec.scores = scorer(rec.frames, r.prompt)
                records.append(rec)
            finally:
                eng.scheduler.release(run.request_id)
                eng.scheduler.forget(run.request_id)
        return records
