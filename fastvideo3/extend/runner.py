"""One DiT forward over a batch of rows from many requests, with per-request interceptors.

The model is run in stages (``embed``, ``run_blocks(start, end)``, ``head``). Each request's
interceptors decide for its rows only; the block index range is cut at every request's
breakpoints, and each segment runs once on the rows that need it (gathered, then scattered
back). A request that reuses its middle or its whole step costs no block evaluation for those
blocks, so a batch of mixed decisions costs what its computing rows cost.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from fastvideo3.extend.protocols import RowView


@dataclass
class RowGroup:
    """One request's rows in this forward and its interceptors (None: it computes everything)."""

    rows: list[int]
    view: RowView | None = None
    step: object = None    # StepInterceptor
    block: object = None   # BlockInterceptor
    # filled by the run
    reused_step: bool = False
    reused_middle: bool = False
    blocks_run: int = 0
    front: int = 0
    mid_end: int = 0
    _front_in: torch.Tensor | None = field(default=None, repr=False)
    _mid_in: torch.Tensor | None = field(default=None, repr=False)


def _idx(rows: list[int], device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)


def _sel(rows: list[int]):
    """A view (slice) of a request's rows when they are contiguous, as they are from the executor."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return rows


@torch.no_grad()
def staged_forward(model, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
                   groups: list[RowGroup], fixed_rows: bool = False, lora=None) -> torch.Tensor:
    """The model's output for every row; ``groups`` partition the rows. ``fixed_rows``
    (batch-invariant mode): a segment some rows need runs over every row and keeps only theirs,
    so no GEMM's M depends on the other requests' decisions (a reusing row then saves nothing
    unless the whole batch reuses). ``lora``: the adapter store whose batch is open over these
    rows; blocks run over some rows take that subset's adapters."""
    stage = model.embed(latents, timestep, text)
    n_blocks = model.num_blocks
    h0 = stage.x
    h = h0.clone()
    dev = h.device
    # step interceptors: a reusing request runs no block this step
    for g in groups:
        g.front, g.mid_end = n_blocks, n_blocks
        if g.step is not None:
            probe = model.modulated_input(stage.select(_idx(g.rows, dev)), h0[_sel(g.rows)])
            g.reused_step = bool(g.step.reuse_step(g.view, probe))
        if g.block is not None and not g.reused_step:
            front, back = g.block.split(n_blocks)
            g.front, g.mid_end = front, n_blocks - back
    live = [g for g in groups if not g.reused_step]
    cuts = sorted({0, n_blocks, *(g.front for g in live), *(g.mid_end for g in live)})
    for i, start in enumerate(cuts):
        for g in live:  # decisions and bookkeeping at this breakpoint
            if g.block is None:
                continue
            if start == g.front:
                rows = _sel(g.rows)
                g.reused_middle = bool(g.block.reuse_middle(g.view, h[rows] - h0[rows]))
                if g.reused_middle:
                    h[rows] = h[rows] + g.block.middle_residual(g.view).to(h.dtype)
                else:
                    g._mid_in = h[rows].clone()
            if start == g.mid_end and not g.reused_middle:
                g.block.after_middle(g.view, h[_sel(g.rows)] - g._mid_in)
                g._mid_in = None
        if start == n_blocks:
            break
        end = cuts[i + 1]
        active = [g for g in live if not (g.reused_middle and g.front <= start < g.mid_end)]
        rows = sorted(r for g in active for r in g.rows)
        if not rows:
            continue
        for g in active:
            g.blocks_run += end - start
        if len(rows) == h.shape[0]:
            h = model.run_blocks(stage, h, start, end)
        elif fixed_rows:
            idx = _idx(rows, dev)
            h[idx] = model.run_blocks(stage, h.clone(), start, end)[idx]
        else:
            idx = _idx(rows, dev)
            with lora.subset(rows) if lora is not None else nullcontext():
                h[idx] = model.run_blocks(stage.select(idx), h[idx].contiguous(), start, end)
    for g in groups:
        if g.step is None:
            continue
        rows = _sel(g.rows)
        if g.reused_step:
            h[rows] = h0[rows] + g.step.reused_residual(g.view).to(h.dtype)
        else:
            g.step.after_step(g.view, h0[rows], h[rows])
    return model.head(stage, h.contiguous())
