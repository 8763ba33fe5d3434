"""Built-in reward scorers that need no downloaded weights.

``temporal_consistency``  how little consecutive frames change: ``1 / (1 + k * d)`` with ``d``
                          the mean absolute difference between consecutive frames (RGB in
                          [0, 1]); 1.0 for a static clip, about 0.23 for uniform noise.
``image_quality``         a prompt-free proxy: the mean of three squashed statistics of each
                          sampled frame — sharpness (variance of the Laplacian of luma), RMS
                          contrast (std of luma) and colorfulness (Hasler & Suesstrunk). 0 for a
                          flat gray frame; higher for sharp, contrasted, colorful frames.

Scores are floats in [0, 1], deterministic, and computed in float64 so a score does not depend
on batch-mates or thread count.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from fastvideo3.errors import InvalidRequest


@runtime_checkable
class Scorer(Protocol):
    """Scores one clip. ``frames`` is ``[F, H, W, 3]`` float in [0, 1]; returns a float.

    ``name`` is the scorer's public name (what a request lists in ``rewards``); ``version``
    changes whenever the scorer's output for the same input can change (weights, formula).
    """

    name: str
    version: str

    def score(self, frames: torch.Tensor) -> float: ...


def _check(frames: torch.Tensor) -> torch.Tensor:
    if not isinstance(frames, torch.Tensor) or frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < 1:
        shape = tuple(frames.shape) if isinstance(frames, torch.Tensor) else type(frames).__name__
        raise InvalidRequest(f"frames must be [F, H, W, 3], got {shape}", field="frames")
    return frames.detach().to("cpu", torch.float64)


def _squash(x: torch.Tensor | float, scale: float) -> float:
    x = float(x)
    return x / (x + scale) if x > 0 else 0.0


class TemporalConsistencyScorer:
    name = "temporal_consistency"
    version = "1"

    def __init__(self, sensitivity: float = 10.0):
        self.sensitivity = sensitivity

    def score(self, frames: torch.Tensor) -> float:
        f = _check(frames)
        if f.shape[0] < 2:
            return 1.0
        d = (f[1:] - f[:-1]).abs().mean()
        return float(1.0 / (1.0 + self.sensitivity * d))


_LAPLACIAN = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64)


class ImageQualityScorer:
    name = "image_quality"
    version = "1"

    def __init__(self, max_frames: int = 8):
        self.max_frames = max_frames

    def frame_terms(self, frame: torch.Tensor) -> dict[str, float]:
        """The three squashed terms of one ``[H, W, 3]`` frame (float64)."""
        r, g, b = frame[..., 0], frame[..., 1], frame[..., 2]
        luma = 0.299 * r + 0.587 * g + 0.114 * b
        lap = torch.nn.functional.conv2d(luma[None, None], _LAPLACIAN[None, None])
        rg, yb = r - g, 0.5 * (r + g) - b
        colorful = torch.sqrt(rg.std(unbiased=False) ** 2 + yb.std(unbiased=False) ** 2) \
            + 0.3 * torch.sqrt(rg.mean() ** 2 + yb.mean() ** 2)
        return {
            "sharpness": _squash(lap.var(unbiased=False) if lap.numel() else 0.0, 0.01),
            "contrast": _squash(luma.std(unbiased=False), 0.1),
            "colorfulness": _squash(colorful, 0.1),
        }

    def score(self, frames: torch.Tensor) -> float:
        f = _check(frames)
        n = f.shape[0]
        picks = sorted({round(i * (n - 1) / max(1, self.max_frames - 1)) for i in range(min(n, self.max_frames))})
        total = 0.0
        for i in picks:
            terms = self.frame_terms(f[i])
            total += sum(terms.values()) / len(terms)
        return total / len(picks)


SCORERS: dict[str, type] = {
    TemporalConsistencyScorer.name: TemporalConsistencyScorer,
    ImageQualityScorer.name: ImageQualityScorer,
}


def check_scorer_names(names, available=None) -> list[str]:
    """Validate a request's ``rewards`` list; raises InvalidRequest naming the field."""
    allowed = sorted(available if available is not None else SCORERS)
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise InvalidRequest("must be a list of scorer names", field="rewards", limit=", ".join(allowed))
    out = list(dict.fromkeys(names))
    for n in out:
        if n not in allowed:
            raise InvalidRequest(f"unknown reward scorer {n!r}", field="rewards", limit=", ".join(allowed))
    return out


def make_scorer(name: str) -> Scorer:
    check_scorer_names([name])
    return SCORERS[name]()
