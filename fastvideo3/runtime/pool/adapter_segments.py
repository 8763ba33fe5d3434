"""Merged segments: a batch mixing LoRA adapters run as per-segment GEMMs on merged weights.

The low-rank path (:mod:`fastvideo3.kernels.lora_grouped`, :mod:`~fastvideo3.kernels.lora_norm`)
adds every row's delta ``scale * (x @ down.T) @ up.T`` next to the layer's GEMM: cheap in FLOPs,
but each delta is a pass over activations that are already in memory once, and at short clips
those passes cost more than the 4% of FLOPs they add (bench/lora.py). Where the device has the
room, it is cheaper to fold each adapter into a copy of the weights once, ``W + scale * up @ down``
(computed in fp32 from the slot's weights, rounded once), and to run each adapted GEMM of a
batch as one GEMM per *segment*: a run of consecutive rows with the same adapters (a request's
cond and uncond rows are one), with its set's weights, rows without adapters on the base weights.
The batch still shares one DiT forward; nothing but the GEMMs sees the adapters, so the
residual + norm passes are the plain ones.

:class:`MergedSets` keeps the merged weight sets (one per ``(id, version, scale)`` combination a
row names) under a byte budget, least recently used first out, never one the current batch uses.
:class:`SegmentPlan` is one forward's segments; its :meth:`~SegmentPlan.linear` is the layer's
GEMM (``torch.addmm`` into the segment's rows of one output, the FFN's bias + GELU epilogue
kept), optionally on CUDA each segment on a stream of its own. A batch falls back
to the low-rank path when a segment is shorter than ``min_segment_tokens`` (a short GEMM runs
below the tensor cores' rate), when its sets do not fit the budget, or in the store's static
(CUDA-graph) mode, where a captured forward must serve any assignment.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

#: device bytes for merged weight sets (a Wan2.1-1.3B set is ~2.8 GB: every adapted GEMM's weight)
DEFAULT_MERGE_CACHE_BYTES = 24 << 30
#: device bytes left free beside new merged sets (the forward's activations need them)
DEFAULT_MERGE_HEADROOM_BYTES = 8 << 30
#: a batch runs as merged segments only if each of its segments holds at least this many tokens
DEFAULT_MIN_SEGMENT_TOKENS = 1024
MAX_STREAMS = 8

#: unit name -> (the fast path's weight [out, in], [(adapted layer, its first output row)])
Units = dict[str, tuple[torch.Tensor, list[tuple[str, int]]]]
Key = tuple[tuple[str, str, float], ...]


def runs(row_refs: list[list[tuple[str, str, float]]]) -> list[tuple[int, int, Key]]:
    """Consecutive rows naming the same adapters (in order, with scales): ``[(start, end, key)]``,
    ``key == ()`` for rows without adapters."""
    out: list[tuple[int, int, Key]] = []
    for i, refs in enumerate(row_refs):
        key = tuple((a, v, round(float(s), 6)) for a, v, s in refs)
        if out and out[-1][2] == key:
            out[-1] = (out[-1][0], i + 1, key)
        else:
            out.append((i, i + 1, key))
    return out


@dataclass
class _Set:
    weights: dict[str, torch.Tensor]
    nbytes: int
    build_s: float


class MergedSets:
    """Merged weight sets by key, under ``budget`` device bytes (least recently used out first)."""

    def __init__(self, budget: int = DEFAULT_MERGE_CACHE_BYTES):
        self.budget = budget
        self.sets: OrderedDict[Key, _Set] = OrderedDict()
        self.counters = {"builds": 0, "evictions": 0, "fallbacks": 0, "segment_forwards": 0}
        self.last_fallback: str | None = None
        #: the model the sets were merged from (a set is only valid for its weights)
        self.model_ref: int | None = None

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.sets.values())

    def drop(self, match=None) -> None:
        """Drop every set (or those whose key ``match(key)`` is true)."""
        for key in [k for k in self.sets if match is None or match(k)]:
            del self.sets[key]

    def get(self, key: Key, need: int, build) -> dict[str, torch.Tensor]:
        """The set for ``key``, built by ``build(key)`` (``need`` bytes) if absent; the caller
        makes the room first (:meth:`make_room`)."""
        hit = self.sets.get(key)
        if hit is not None:
            self.sets.move_to_end(key)
            return hit.weights
        t0 = time.monotonic()
        weights = build(key)
        self.sets[key] = _Set(weights, need, time.monotonic() - t0)
        self.counters["builds"] += 1
        return weights

    def make_room(self, need: int, keep: set[Key]) -> bool:
        """Evict least recently used sets not in ``keep`` until ``need`` more bytes fit (False,
        evicting nothing, if they cannot fit beside the kept ones)."""
        if need + sum(s.nbytes for k, s in self.sets.items() if k in keep) > self.budget:
            return False
        while self.nbytes + need > self.budget:
            victim = next((k for k in self.sets if k not in keep), None)
            if victim is None:
                return False
            del self.sets[victim]
            self.counters["evictions"] += 1
        return True

    def describe(self) -> dict:
        return {"budget_bytes": self.budget, "bytes": self.nbytes, "sets": len(self.sets),
                "last_fallback": self.last_fallback, "counters": dict(self.counters),
                "build_s": [round(s.build_s, 4) for s in self.sets.values()]}


class SegmentPlan:
    """One forward's segments: ``[(start_row, end_row, weights by unit or None for the base)]``."""

    def __init__(self, segments: list[tuple[int, int, dict[str, torch.Tensor] | None]],
                 streams: list | None):
        self.segments, self.streams = segments, streams

    def linear(self, unit: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor,
               gelu: str | None = None) -> torch.Tensor:
        """``x [B, N, in] -> [B, N, out]``: each segment's rows through its set's weight for
        ``unit`` (the base ``w`` where the segment has none), ``bias`` added. ``gelu``: ``"epilogue"``
        for the GEMM's fused bias + tanh GELU (cuBLASLt), ``"tanh"`` for a GELU pass after."""
        b, n, k = x.shape
        x2 = x.reshape(b * n, k)
        y = torch.empty(b * n, w.shape[0], device=x.device, dtype=x.dtype)
        cur = torch.cuda.current_stream() if self.streams else None
        for j, (r0, r1, weights) in enumerate(self.segments):
            wt = w if weights is None else weights[unit]
            xs, ys = x2[r0 * n:r1 * n], y[r0 * n:r1 * n]
            if cur is not None:
                side = self.streams[j % len(self.streams)]
                side.wait_stream(cur)
                with torch.cuda.stream(side):
                    _gemm(xs, wt, bias, ys, gelu)
            else:
                _gemm(xs, wt, bias, ys, gelu)
        if cur is not None:
            for side in self.streams[:len(self.segments)]:
                cur.wait_stream(side)
        if gelu == "tanh":
            y = torch.nn.functional.gelu(y, approximate="tanh")
        return y.view(b, n, w.shape[0])


def _gemm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, gelu: str | None) -> None:
    if gelu == "epilogue":
        torch._addmm_activation(bias, x, w.t(), use_gelu=True, out=out)
    else:
        torch.addmm(bias, x, w.t(), out=out)


def units_bytes(units: Units) -> int:
    """The device bytes of one merged set over ``units``."""
    return sum(w.numel() * w.element_size() for w, _ in units.values())


def merge_units(units: Units, key: Key, layer_delta, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every unit's weight with the key's adapters folded in: ``W[rows of layer] += scale * up @ down``
    for each (adapter, scale) of ``key`` and adapted layer of the unit, in fp32, rounded once.
    ``layer_delta(ref, layer)`` -> ``up @ down`` (fp32, ``[out, in]``) or None where the adapter
    leaves the layer alone."""
    out = {}
    for unit, (w, members) in units.items():
        merged = None
        for layer, row in members:
            for ref in key:
                delta = layer_delta(ref, layer)
                if delta is None:
                    continue
                if merged is None:
                    merged = w.to(torch.float32, copy=True)  # never the base weight itself
                merged[row:row + delta.shape[0]].add_(delta, alpha=ref[2])
        out[unit] = w if merged is None else merged.to(dtype)
    return out
