"""The procedural video dataset of the tiny recipe ("procedural shapes v1").

Clips of one shape (circle, square, triangle) of one color moving in a straight line (left,
right, up, down) across a plain background, drawn on the fly with anti-aliased signed distance
fields. Nothing is read from disk. Sample ``i`` of seed ``s`` is a pure function of ``(s, i)``:
its scene parameters come from a generator seeded with both, and rendering has no randomness.

    data = ShapesDataset(seed=0, frames=33, height=128, width=128)
    video, captions = data.batch(step=0, batch_size=8)   # video [B, 3, F, H, W] in [-1, 1]
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fastvideo3.models.reward.adherence import BACKGROUNDS, COLORS, MOTIONS, SHAPES, PromptFields


@dataclass(frozen=True)
class Scene:
    """One clip's parameters. Positions are fractions of the frame (x right, y down)."""

    shape: str
    color: str
    background: str
    motion: str
    radius: float  # fraction of the shorter side
    start: tuple[float, float]  # center at the first frame
    travel: float  # distance covered over the clip, fraction of the frame

    @property
    def fields(self) -> PromptFields:
        return PromptFields(self.color, self.shape, self.motion, self.background)

    @property
    def caption(self) -> str:
        return self.fields.caption()


def draw_scene(rng: np.random.Generator, fields: PromptFields | None = None) -> Scene:
    """Random geometry for the given prompt fields (random fields when None)."""
    if fields is None:
        fields = PromptFields(
            color=list(COLORS)[rng.integers(len(COLORS))], shape=SHAPES[rng.integers(len(SHAPES))],
            motion=list(MOTIONS)[rng.integers(len(MOTIONS))],
            background=list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))],
        )
    r = float(rng.uniform(0.10, 0.16))
    travel = float(rng.uniform(0.30, 0.50))
    dx, dy = MOTIONS[fields.motion]
    lo, hi = r, 1.0 - r
    # along the motion axis the whole path stays inside the frame; across it anywhere inside
    along = float(rng.uniform(lo + travel, hi)) if (dx < 0 or dy < 0) else float(rng.uniform(lo, hi - travel))
    across = float(rng.uniform(lo, hi))
    start = (along, across) if dx != 0 else (across, along)
    return Scene(fields.shape, fields.color, fields.background, fields.motion, r, start, travel)


def _sdf(shape: str, px: torch.Tensor, py: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Signed distance (negative inside) of a shape of size ``r`` centred at the origin."""
    if shape == "circle":
        return torch.sqrt(px * px + py * py) - r
    if shape == "square":
        return torch.maximum(px.abs(), py.abs()) - 0.85 * r
    # equilateral triangle pointing up (image y grows downward, so flip y); circumradius ~1.15 r
    k = math.sqrt(3.0)
    s = 1.0 * r
    x, y = px.abs() - s, -py + s / k
    flip = (x + k * y) > 0
    x, y = torch.where(flip, (x - k * y) / 2, x), torch.where(flip, (-k * x - y) / 2, y)
    x = x - torch.clamp(x, -2 * s, torch.zeros_like(s))
    return -torch.sqrt(x * x + y * y) * torch.sign(y)


def render(scenes: list[Scene], frames: int, height: int, width: int, device: str | torch.device = "cpu",
           span: float = 1.0) -> torch.Tensor:
    """Draw scenes as a video batch ``[B, 3, F, H, W]`` in [-1, 1] (the VAE's input range).
    ``span`` is the fraction of each scene's motion the clip covers (1: all of it)."""
    out = torch.empty(len(scenes), 3, frames, height, width, device=device)
    side = float(min(height, width))
    ys = (torch.arange(height, device=device, dtype=torch.float32) + 0.5) / side
    xs = (torch.arange(width, device=device, dtype=torch.float32) + 0.5) / side
    t = torch.linspace(0.0, span, frames, device=device).view(1, frames, 1, 1)

    def col(values) -> torch.Tensor:  # per-scene scalars as [n, 1, 1, 1]
        return torch.tensor(values, dtype=torch.float32, device=device).view(-1, 1, 1, 1)

    for shape in SHAPES:  # one vectorised pass per shape kind
        idx = [i for i, sc in enumerate(scenes) if sc.shape == shape]
        if not idx:
            continue
        group = [scenes[i] for i in idx]
        dx = col([MOTIONS[s.motion][0] for s in group])
        dy = col([MOTIONS[s.motion][1] for s in group])
        travel = col([s.travel for s in group])
        cx = (col([s.start[0] for s in group]) + dx * travel * t) * width / side  # [n, F, 1, 1]
        cy = (col([s.start[1] for s in group]) + dy * travel * t) * height / side
        px = xs.view(1, 1, 1, width) - cx
        py = ys.view(1, 1, height, 1) - cy
        d = _sdf(shape, px, py, col([s.radius for s in group]))
        alpha = torch.clamp(0.5 - d * side, 0.0, 1.0).unsqueeze(1)  # one-pixel anti-aliased edge
        fg = torch.tensor([COLORS[s.color] for s in group], device=device).view(-1, 3, 1, 1, 1)
        bg = torch.tensor([BACKGROUNDS[s.background] for s in group], device=device).view(-1, 3, 1, 1, 1)
        out[idx] = (bg + (fg - bg) * alpha) * 2.0 - 1.0
    return out


def to_frames(video: torch.Tensor) -> torch.Tensor:
    """``[3, F, H, W]`` in [-1, 1] -> ``[F, H, W, 3]`` in [0, 1] (what a decoder pool returns)."""
    return ((video.float() + 1.0) / 2.0).clamp(0, 1).permute(1, 2, 3, 0).contiguous()


class ShapesDataset:
    """Infinite, seeded clips and captions. ``scene(i)`` is deterministic in ``(seed, i)``."""

    def __init__(self, seed: int = 0, frames: int = 33, height: int = 128, width: int = 128,
                 motion_frames: int | None = None):
        if (frames - 1) % 4:
            raise ValueError("frames must be 4k+1 (the VAE's causal temporal layout)")
        self.seed, self.frames, self.height, self.width = seed, frames, height, width
        # a scene's motion spans motion_frames frames; a shorter clip shows its first part at the same speed
        self.span = (frames - 1) / ((motion_frames or frames) - 1) if frames > 1 else 1.0

    def rng(self, index: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, index])

    def scene(self, index: int) -> Scene:
        return draw_scene(self.rng(index))

    def scene_for(self, fields: PromptFields, index: int) -> Scene:
        """A scene with the given prompt fields and geometry drawn from ``(seed, index)``."""
        return draw_scene(self.rng(index), fields)

    def batch(self, step: int, batch_size: int, device: str | torch.device = "cpu") -> tuple[torch.Tensor, list[str]]:
        """Batch ``step``: samples ``step * batch_size ... + batch_size - 1``."""
        scenes = [self.scene(step * batch_size + i) for i in range(batch_size)]
        return self.render(scenes, device), [s.caption for s in scenes]

    def group_batch(self, step: int, groups: int, device: str | torch.device = "cpu") -> tuple[torch.Tensor, list[str]]:
        """``groups`` direction groups: each is one scene drawn in all four directions (same color,
        shape, background, size and speed; its own start per direction), consecutive in the
        batch. Inside a group only the direction word and the motion differ, so the direction is
        the one thing the text must carry; every batch is balanced over directions."""
        scenes = []
        for g in range(groups):
            idx = step * groups + g
            base = self.scene(idx)
            for k, motion in enumerate(MOTIONS):
                fields = PromptFields(base.color, base.shape, motion, base.background)
                sc = draw_scene(np.random.default_rng([self.seed, idx, 1 + k]), fields)
                scenes.append(_with_size(sc, base))
        return self.render(scenes, device), [s.caption for s in scenes]

    def render(self, scenes: list[Scene], device: str | torch.device = "cpu") -> torch.Tensor:
        return render(scenes, self.frames, self.height, self.width, device, self.span)

    def __iter__(self):
        i = 0
        while True:
            sc = self.scene(i)
            yield self.render([sc])[0], sc.caption
            i += 1


def _with_size(scene: Scene, like: Scene) -> Scene:
    """``scene`` with ``like``'s radius and travel, its start moved so the path stays inside."""
    dx, dy = MOTIONS[scene.motion]
    r, travel = like.radius, like.travel
    lo, hi = r, 1.0 - r
    along_old = scene.start[0] if dx != 0 else scene.start[1]
    across = scene.start[1] if dx != 0 else scene.start[0]
    u = (along_old - scene.radius) / max(1e-6, 1.0 - 2 * scene.radius - scene.travel) if (dx > 0 or dy > 0) \
        else (along_old - scene.radius - scene.travel) / max(1e-6, 1.0 - 2 * scene.radius - scene.travel)
    u = min(1.0, max(0.0, u))
    along = (lo + travel + u * (hi - lo - travel)) if (dx < 0 or dy < 0) else (lo + u * (hi - lo - travel))
    across = min(hi, max(lo, across))
    start = (along, across) if dx != 0 else (across, along)
    return Scene(scene.shape, scene.color, scene.background, scene.motion, r, start, travel)


def all_fields() -> list[PromptFields]:
    """Every prompt of the contract (colors x shapes x motions x backgrounds)."""
    return [PromptFields(c, s, m, b) for c in COLORS for s in SHAPES for m in MOTIONS for b in BACKGROUNDS]


def eval_prompts() -> list[str]:
    """The fixed adherence prompt set: every color x motion pair once (20 prompts), with the
    shape and background rotating so each appears about equally often."""
    out = []
    for i, (c, m) in enumerate((c, m) for c in COLORS for m in MOTIONS):
        out.append(PromptFields(c, SHAPES[i % len(SHAPES)], m, list(BACKGROUNDS)[(i // 2) % len(BACKGROUNDS)]).caption())
    return out
