"""Prompt adherence for the procedural-shapes data contract ("procedural shapes v1").

The contract's vocabulary lives here (the core), so the scorer and the training data share one
definition without the core importing the training plane. A caption reads
``"a {color} {shape} moving {motion} on a {background} background"``.

:class:`AdherenceScorer` finds the moving shape in a clip and reads back what the prompt asked
for: the background is the median color of the frame border, the shape is every pixel far from
it, its color is the nearest palette color to the median foreground color, and its motion is the
sign of the dominant axis of a least-squares line through the per-frame centroids. A clip
*adheres* when both the color and the direction match the prompt (the shape class is reported
too, from how much of its bounding box the mask fills, but is not part of the criterion).

Frames are ``[F, H, W, 3]`` floats in [0, 1] (numpy or torch). Everything runs in float64 on the
CPU, so a score depends only on the clip.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

#: shape colors (RGB in [0, 1]); chosen to stay far from every background and from each other
COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.90, 0.12, 0.12),
    "green": (0.10, 0.70, 0.20),
    "blue": (0.12, 0.25, 0.95),
    "yellow": (0.95, 0.85, 0.10),
    "purple": (0.60, 0.15, 0.80),
}
BACKGROUNDS: dict[str, tuple[float, float, float]] = {
    "white": (0.95, 0.95, 0.95),
    "black": (0.05, 0.05, 0.05),
    "gray": (0.50, 0.50, 0.50),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
#: unit direction of travel in image coordinates (x right, y down)
MOTIONS: dict[str, tuple[float, float]] = {
    "left": (-1.0, 0.0), "right": (1.0, 0.0), "up": (0.0, -1.0), "down": (0.0, 1.0),
}
DATA_CONTRACT = "procedural shapes v1"
_CAPTION = re.compile(r"^a (\w+) (\w+) moving (\w+) on a (\w+) background$")


@dataclass(frozen=True)
class PromptFields:
    color: str
    shape: str
    motion: str
    background: str

    def caption(self) -> str:
        return f"a {self.color} {self.shape} moving {self.motion} on a {self.background} background"


def caption(color: str, shape: str, motion: str, background: str) -> str:
    return PromptFields(color, shape, motion, background).caption()


def parse_prompt(prompt: str) -> PromptFields | None:
    """The fields of a contract caption, or None when the prompt is not one."""
    m = _CAPTION.match(prompt.strip().lower())
    if m is None:
        return None
    color, shape, motion, background = m.groups()
    if color not in COLORS or shape not in SHAPES or motion not in MOTIONS or background not in BACKGROUNDS:
        return None
    return PromptFields(color, shape, motion, background)


def _as_array(frames) -> np.ndarray:
    if hasattr(frames, "detach"):
        frames = frames.detach().cpu().numpy()
    a = np.asarray(frames, dtype=np.float64)
    if a.ndim != 4 or a.shape[-1] != 3 or a.shape[0] < 2:
        raise ValueError(f"frames must be [F>=2, H, W, 3], got {a.shape}")
    return a


class AdherenceScorer:
    """Reads color, motion direction and shape class back from a clip and compares them with
    the prompt. ``score(frames, prompt)`` returns a dict; ``adherent`` is 1.0 when color and
    direction both match."""

    name = "prompt_adherence"
    version = "1"

    def __init__(self, fg_threshold: float = 0.25, min_fg_fraction: float = 0.004,
                 min_travel: float = 0.06):
        self.fg_threshold = fg_threshold  # RGB distance from the background that counts as shape
        self.min_fg_fraction = min_fg_fraction  # a frame needs this much foreground to have a centroid
        self.min_travel = min_travel  # fitted travel (fraction of the frame) below which: no motion

    def analyze(self, frames) -> dict:
        a = _as_array(frames)
        f, h, w, _ = a.shape
        border = np.concatenate([a[:, 0], a[:, -1], a[:, :, 0], a[:, :, -1]], axis=1)  # [F, 2(H+W), 3]
        bg = np.median(border.reshape(-1, 3), axis=0)
        dist = np.linalg.norm(a - bg, axis=-1)  # [F, H, W]
        mask = dist > self.fg_threshold
        frac = mask.reshape(f, -1).mean(axis=1)
        out: dict = {"background_rgb": [round(float(v), 4) for v in bg],
                     "background": _nearest(bg, BACKGROUNDS), "fg_fraction": float(frac.mean())}
        present = frac >= self.min_fg_fraction
        if present.sum() < 2:
            out.update(color="none", direction="none", shape="none", travel=0.0)
            return out
        fg = a[mask]
        out["color_rgb"] = [round(float(v), 4) for v in np.median(fg, axis=0)]
        out["color"] = _nearest(np.median(fg, axis=0), COLORS)
        ys, xs = np.mgrid[0:h, 0:w]
        t, cx, cy = [], [], []
        for i in np.nonzero(present)[0]:
            m = mask[i]
            t.append(i / max(1, f - 1))
            cx.append(float(xs[m].mean()) / w)
            cy.append(float(ys[m].mean()) / h)
        t_arr = np.asarray(t)
        dx = _slope(t_arr, np.asarray(cx))  # fitted travel over the whole clip, in frame units
        dy = _slope(t_arr, np.asarray(cy))
        out["travel"] = float(np.hypot(dx, dy))
        out["velocity"] = [round(dx, 4), round(dy, 4)]
        if out["travel"] < self.min_travel:
            out["direction"] = "none"
        elif abs(dx) >= abs(dy):
            out["direction"] = "right" if dx > 0 else "left"
        else:
            out["direction"] = "down" if dy > 0 else "up"
        out["shape"] = _shape_class(mask[present])
        return out

    def score(self, frames, prompt: str) -> dict:
        want = parse_prompt(prompt)
        got = self.analyze(frames)
        if want is None:
            raise ValueError(f"prompt is not a {DATA_CONTRACT!r} caption: {prompt!r}")
        got["expected"] = {"color": want.color, "direction": want.motion, "shape": want.shape}
        got["color_ok"] = float(got["color"] == want.color)
        got["direction_ok"] = float(got["direction"] == want.motion)
        got["shape_ok"] = float(got["shape"] == want.shape)
        got["adherent"] = float(got["color_ok"] and got["direction_ok"])
        return got


def _nearest(rgb: np.ndarray, table: dict[str, tuple[float, float, float]]) -> str:
    return min(table, key=lambda k: float(np.linalg.norm(np.asarray(table[k]) - rgb)))


def _slope(t: np.ndarray, v: np.ndarray) -> float:
    """Least-squares slope of v(t) for t in [0, 1]: the travel over the clip."""
    if np.ptp(t) == 0:
        return 0.0
    return float(np.polyfit(t, v, 1)[0])


def _shape_class(masks: np.ndarray) -> str:
    """circle / square / triangle from the median fill of the mask's bounding box
    (pi/4 ~ 0.785 for a disc, 1 for an axis-aligned square, 1/2 for a triangle)."""
    fills = []
    for m in masks:
        ys, xs = np.nonzero(m)
        box = (np.ptp(ys) + 1) * (np.ptp(xs) + 1)
        fills.append(m.sum() / box)
    fill = float(np.median(fills))
    if fill > 0.89:
        return "square"
    if fill > 0.64:
        return "circle"
    return "triangle"
