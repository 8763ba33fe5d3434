"""The embedded engine: the scheduler and every pool in one process, over the in-process
transport. Same scheduler, same executors and loops as the fleet; only the transport differs.

    engine = fastvideo3.Engine(model="wan-tiny")
    video = engine.generate("a red circle moving left", num_frames=33, seed=0)
    video.save("out.mp4")
    engine.close()
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastvideo3.card.registry import resolve_card
from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import FastVideoError, Unavailable
from fastvideo3.loop.context import RequestContext
from fastvideo3.request.schema import GenerateRequest, ResolvedRequest, resolve
from fastvideo3.runtime.scheduling.scheduler import TERMINAL, CoreScheduler, Event, RequestRun
from fastvideo3.vocab import Role, RunStatus


@dataclass
class Video:
    """A generated video: ``frames`` is float32 [frames, height, width, 3] in [0, 1]."""

    frames: np.ndarray
    fps: int
    metadata: dict[str, Any] = field(default_factory=dict)
    latents: Any = None  # the final latents (torch.Tensor [1, C, F, H, W]) when kept

    def save(self, path: str | Path) -> list[Path]:
        from fastvideo3.media import save_video
        return save_video(self.frames, path, fps=self.fps, sidecar=self.metadata)


class Engine:
    def __init__(self, model: str | ModelCard = "wan-tiny", device: str | None = None, *,
                 precision: str | None = None, batching: bool = True, max_batch: int = 16,
                 keep_latents: bool = False, expert_pools: bool = False, batch_invariant: bool = False,
                 image_policy=None):
        """``expert_pools``: on a two-expert card, one denoiser pool per expert (the request's latent
        moves from one to the other at the switch) instead of one pool holding both.
        ``batch_invariant``: every denoise forward runs at ``max_batch`` requests' rows (padded), so
        a request's output is bit-identical whatever shares its batches (fastvideo3.runtime.scheduling.invariant).
        ``image_policy``: bounds on an image-to-video request's image, and whether an image URL may be
        fetched (fastvideo3.request.image.ImagePolicy; default: no URLs)."""
        from fastvideo3.runtime.pool.dit_executor import DenoiserExecutor
        from fastvideo3.runtime.pool.executors import EncoderExecutor
        from fastvideo3.runtime.pool.vae_executor import DecoderExecutor
        from fastvideo3.transport import make_transport

        self.card = model if isinstance(model, ModelCard) else resolve_card(model)
        self.transport = make_transport("inproc", owner="embedded")
        t0 = time.perf_counter()
        self.encoder = EncoderExecutor(self.card, self.transport, device, precision)
        experts = self.card.dit_components()
        if expert_pools and len(experts) > 1:
            self.denoisers = {f"denoiser:{e}": DenoiserExecutor(self.card, self.transport, device, precision,
                                                                batching=batching, experts=[e]) for e in experts}
        else:
            self.denoisers = {Role.DENOISER: DenoiserExecutor(self.card, self.transport, device, precision,
                                                           batching=batching)}
        self.denoiser = next(iter(self.denoisers.values()))
        self.decoder = DecoderExecutor(self.card, self.transport, device)
        self.load_seconds = time.perf_counter() - t0
        self.precision = self.denoiser.precision
        self.keep_latents = keep_latents
        self.image_policy = image_policy
        self.batch_bucket = (max_batch if batching else 1) if batch_invariant else None
        self.scheduler = CoreScheduler(
            {Role.ENCODER: [self.encoder], **{k: [v] for k, v in self.denoisers.items()}, Role.DECODER: [self.decoder]},
            max_batch=max_batch,
        )

    # -- requests ------------------------------------------------------------------------
    def resolve(self, prompt: str, **kw) -> ResolvedRequest:
        return resolve(GenerateRequest(prompt=prompt, **kw), self.card, precision=self.precision,
                       adapters=dict(self.denoiser.adapters.current), image_policy=self.image_policy)

    # -- adapters -------------------------------------------------------------------------
    def load_adapter(self, adapter_id: str, path: str | None = None, tensors: dict | None = None) -> dict:
        """Load a LoRA (a file in the diffusers/PEFT or Wan-trainer layout); requests admitted from
        now on that name ``adapter_id`` run this version."""
        return self.denoiser.load_adapter(adapter_id, path, tensors)

    def unload_adapter(self, adapter_id: str, wait_s: float = 0.0) -> list[str]:
        """Remove an adapter; refused (FAILED_PRECONDITION) while a request here names it (the
        embedded engine steps only inside ``run``, so there is nothing to wait for)."""
        from fastvideo3.errors import FailedPrecondition
        users = [r.request_id for r in self.scheduler.active()
                 if any(a["id"] == adapter_id for a in r.request.adapters)]
        if users:
            raise FailedPrecondition(f"adapter {adapter_id!r} is in use by {len(users)} request(s)",
                                     field="adapter_id", details={"requests": users[:8]})
        return self.denoiser.unload_adapter(adapter_id, wait_s)

    def submit(self, prompt: str, **kw) -> RequestRun:
        ctx = RequestContext(batch_bucket=self.batch_bucket) if self.batch_bucket else None
        return self.scheduler.submit(self.resolve(prompt, **kw), self.card, ctx=ctx)

    def cancel(self, request_id: str) -> bool:
        return self.scheduler.cancel(request_id)

    def run(self, until: Callable[[], bool] | None = None, on_event: Callable[[Event], None] | None = None) -> None:
        """Tick the scheduler until every request is terminal (or ``until()`` holds)."""
        prev = self.scheduler.on_event
        self.scheduler.on_event = on_event or prev
        try:
            while self.scheduler.active() and not (until and until()):
                self.scheduler.tick()
        finally:
            self.scheduler.on_event = prev

    def result(self, run: RequestRun) -> Video:
        """Collect a finished request's video and free everything it held."""
        try:
            if run.status != RunStatus.SUCCEEDED:
                raise (run.error.to_exception() if run.error else Unavailable("request did not finish"))
            from fastvideo3.runtime.pool.vae_executor import frames_as_float
            frames = frames_as_float(self.transport.fetch(run.ctx.ref("frames"), deadline_s=30.0)).numpy().copy()
            latents = None
            if self.keep_latents:
                latents = self.transport.fetch(run.ctx.ref("latents"), deadline_s=30.0).clone()
            return Video(frames=frames, fps=self.card.limits.fps, metadata=self._provenance(run), latents=latents)
        finally:
            self.scheduler.release(run.request_id)
            self.scheduler.forget(run.request_id)

    def generate(self, prompt: str, *, negative_prompt: str | None = None, num_frames: int | None = None,
                 height: int | None = None, width: int | None = None, num_inference_steps: int | None = None,
                 guidance_scale: float | None = None, guidance_scale_2: float | None = None, seed: int | None = None,
                 flow_shift: float | None = None, sampler: str | None = None, cfg_policy: str | None = None,
                 adapters: list | None = None, cache: dict | None = None, image: bytes | str | None = None,
                 request_id: str | None = None, on_event: Callable[[Event], None] | None = None) -> Video:
        """``image``: an image-to-video card's first frame (PNG/JPEG/WebP bytes, base64, or a URL
        where the engine's ``image_policy`` allows fetching one)."""
        prev = self.scheduler.on_event
        self.scheduler.on_event = on_event or prev
        try:
            run = self.submit(prompt, negative_prompt=negative_prompt, num_frames=num_frames, height=height,
                              width=width, num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
                              guidance_scale_2=guidance_scale_2, seed=seed, flow_shift=flow_shift, sampler=sampler,
                              cfg_policy=cfg_policy, adapters=adapters, cache=cache, request_id=request_id,
                              **({"image": image} if image is not None else {}))
            self.run(until=lambda: run.status in TERMINAL)
        finally:
            self.scheduler.on_event = prev
        return self.result(run)

    def _provenance(self, run: RequestRun) -> dict:
        from fastvideo3.provenance import provenance
        return provenance(
            self.card, run, phase_seconds=run.phase_seconds, fps=self.card.limits.fps,
            weights={"transformer": "+".join(d.weights_digest for d in self.denoisers.values()),
                     "text_encoder": self.encoder.encoder.digest, "vae": self.decoder.vae.digest,
                     **({"image_encoder": self.encoder.image_encoder.digest} if self.encoder.image_encoder else {})},
            runtime={"fingerprint": self.denoiser.runtime.fingerprint_hex,
                     "adapter_mode": self.denoiser.adapters.describe()["mode"]})

    def describe(self) -> dict:
        return {"card": self.card.model_id, "precision": self.precision,
                "pools": {Role.ENCODER: self.encoder.describe(), **{k: d.describe() for k, d in self.denoisers.items()},
                          Role.DECODER: self.decoder.describe()},
                "scheduler": dict(self.scheduler.counters), "batch_invariant_bucket": self.batch_bucket}

    def close(self) -> None:
        for run in list(self.scheduler.runs.values()):
            self.scheduler.release(run.request_id)
        self.scheduler.runs.clear()
        self.scheduler.close()
        self.transport.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
