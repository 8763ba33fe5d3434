"""The provenance of one output: what made it, written the same way by the embedded Engine (its
``Video.metadata``) and by the scheduler service (the artifact's sidecar, which adds the fleet's
view). Only the facts the two sources hold differently are passed in.
"""
from __future__ import annotations

from typing import Any

from fastvideo3.vocab import LoopId


def provenance(card, run, *, weights: dict[str, str], runtime: dict[str, Any], phase_seconds: dict[str, float],
               fps: float) -> dict[str, Any]:
    """``card``'s and ``run``'s record: card and recipe, the resolved request, weight digests by
    component, adapters, the runtime (``runtime`` plus the adapter versions), timings, the denoise
    loop's latent norms and cache report, fps and the package version."""
    import fastvideo3
    r = run.request
    denoise = run.ctx.payloads.get(LoopId.DIFFUSION_DENOISE, {})
    return {
        "card": card.model_id,
        "recipe": card.recipe.model_dump(mode="json"),
        # an image-to-video request's image is recorded by its digest (image_digest), not its bytes
        "request": {k: v for k, v in r.to_dict().items() if k != "image" or v is None},
        "weights": weights,
        "adapters": [dict(a) for a in r.adapters],
        "runtime": {**runtime, "adapters": list(r.adapter_versions),
                    # batch-invariant mode: the units every denoise forward ran at (None = off)
                    "batch_invariant_bucket": run.ctx.batch_bucket},
        "timings_s": {k: round(v, 4) for k, v in phase_seconds.items()},
        "latent_norms": denoise.get("latent_norms", []),
        # every output-changing interceptor setting, and what it reused
        "cache": denoise.get("cache"),
        "fps": fps,
        "fastvideo3_version": fastvideo3.__version__,
    }
