"""ParityAligner: named taps per step and per block, recorded or compared.

Record mode stores every tap (``name``, ``step``) -> tensor. Compare mode checks each incoming
tap against a recorded reference as it arrives and keeps the first one that diverges beyond its
tolerance, so a mismatch report points at the earliest block of the earliest step that broke,
not at the final output.

    ref = ParityAligner()                       # record the reference
    ...run reference with ref.tap...
    cmp = ParityAligner(reference=ref, rel_tol=1e-5)
    ...run ours with cmp.tap...
    assert cmp.first_divergence is None, cmp.report()
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Divergence:
    name: str
    step: int
    max_abs: float
    rel: float
    tol: float

    def __str__(self) -> str:
        return (f"first divergence at tap {self.name!r} step {self.step}: max abs error {self.max_abs:.3g}, "
                f"relative error {self.rel:.3g} > tolerance {self.tol:.3g}")


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    denom = b.norm().item()
    return (a - b).norm().item() / (denom if denom > 0 else 1.0)


class ParityAligner:
    def __init__(self, reference: "ParityAligner | None" = None, *, rel_tol: float = 1e-5,
                 tolerances: dict[str, float] | None = None):
        self.reference = reference
        self.rel_tol = rel_tol
        self.tolerances = dict(tolerances or {})
        self.step = 0
        self.taps: dict[tuple[str, int], torch.Tensor] = {}
        self.order: list[tuple[str, int]] = []
        self.checked = 0
        self.first_divergence: Divergence | None = None
        self.worst: dict[str, float] = {}

    def at_step(self, step: int) -> "ParityAligner":
        self.step = step
        return self

    def tap(self, name: str, tensor: torch.Tensor) -> None:
        key = (name, self.step)
        if self.reference is None:
            self.taps[key] = tensor.detach().float().cpu().clone()
            self.order.append(key)
            return
        ref = self.reference.taps.get(key)
        if ref is None:
            return
        ours = tensor.detach().float().cpu()
        if ours.shape != ref.shape:
            err, mx = float("inf"), float("inf")
        else:
            err, mx = rel_error(ours, ref), (ours - ref).abs().max().item()
        self.checked += 1
        self.worst[name] = max(self.worst.get(name, 0.0), err)
        tol = self.tolerances.get(name.split(".")[0], self.rel_tol)
        if err > tol and self.first_divergence is None:
            self.first_divergence = Divergence(name, self.step, mx, err, tol)

    def report(self) -> str:
        if self.first_divergence is not None:
            return str(self.first_divergence)
        return f"{self.checked} taps within tolerance (worst relative error {max(self.worst.values(), default=0):.3g})"


def hook_reference_blocks(model: torch.nn.Module, aligner: ParityAligner) -> Callable[[], None]:
    """Tap the outputs of a diffusers WanTransformer3DModel's blocks under the names our DiT uses
    (``block.{i}`` and ``output``). Returns a function that removes the hooks."""
    handles = []
    for i, block in enumerate(model.blocks):
        handles.append(block.register_forward_hook(lambda m, a, out, i=i: aligner.tap(f"block.{i}", out)))
    handles.append(model.patch_embedding.register_forward_hook(
        lambda m, a, out: aligner.tap("patch_embed", out.flatten(2).transpose(1, 2))))

    def _out(m, a, out):
        aligner.tap("output", out[0] if isinstance(out, tuple) else out.sample)

    handles.append(model.register_forward_hook(_out))
    return lambda: [h.remove() for h in handles]
