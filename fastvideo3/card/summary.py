"""A ModelCard as clients see it: the fields of the DeploymentCard's ``ModelCardSummary``
(request limits and defaults, capabilities, recipe, precision, fingerprint), computed once.

The scheduler service builds its served card's summary from this (services/scheduler/
deployment.py, as the wire message) and so does a card built from a fleet config
(fleet/deployment_card.py, as the pydantic model); both take the same plain fields.
"""
from __future__ import annotations

from typing import Any

from fastvideo3 import vocab
from fastvideo3.vocab import Program, Sampler, Task


def card_summary(card, *, precision: str | None = None, fingerprint: str = "") -> dict[str, Any]:
    """The summary fields of ``card``; ``precision`` defaults to the card's CPU precision."""
    lim, den, rec = card.limits, card.denoise, card.recipe
    sampler = den.sampler
    steps = rec.assumes_steps or den.default_steps or 50
    lo, hi = (rec.assumes_steps, rec.assumes_steps) if rec.assumes_steps else (den.min_steps, den.max_steps)
    caps = [Program.T2V] if Task.TEXT_TO_VIDEO in card.capabilities.tasks else []
    caps += [t for t in card.capabilities.tasks if t != Task.TEXT_TO_VIDEO]
    return dict(
        card_id=card.model_id, family=card.family, capabilities=[str(c) for c in caps],
        limits=dict(
            min_frames=lim.min_frames, max_frames=lim.max_frames, frames_multiple=4, frames_offset=1,
            min_height=lim.min_size, max_height=lim.max_height, min_width=lim.min_size, max_width=lim.max_width,
            size_multiple=lim.size_multiple, min_steps=lo, max_steps=hi, min_guidance_scale=0.0,
            max_guidance_scale=lim.max_guidance, max_prompt_tokens=card.max_text_tokens,
            samplers=[rec.assumes_sampler] if rec.assumes_sampler else [Sampler.UNIPC, Sampler.EULER],
            output_formats=list(vocab.OUTPUT_FORMATS)),
        defaults=dict(
            num_frames=lim.default_frames, height=lim.default_height, width=lim.default_width,
            num_inference_steps=steps, guidance_scale=lim.default_guidance,
            flow_shift=sampler.flow_shift if sampler else 3.0, sampler=sampler.name if sampler else Sampler.UNIPC,
            fps=lim.fps, negative_prompt=""),
        recipe=f"{rec.method}-{rec.assumes_steps}step" if rec.assumes_steps else rec.method,
        precision=precision or card.precision.default_cpu,
        runtime_fingerprint=fingerprint,
    )
