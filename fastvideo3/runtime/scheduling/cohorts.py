"""Cohorts: how many requests one denoise batch takes, from what the DiT costs per row.

Once a forward's rows fill the GPU, more rows cost the same per row: on an H100 the 1.3B DiT
replays 17x256x256 rows at 6.7 ms each from 4 rows to 32. A batch larger than that buys no DiT
efficiency, and it costs latency and overlap: the requests in one batch finish together, so
their decodes queue behind each other while the denoiser idles. Capping the batch makes
*cohorts*: the requests already stepping stay in front (the planner keeps arrival order), each
cohort finishes in turn, and its decode runs beside the next cohort's steps.

The cap is read from the denoiser replica's warm phase: Describe's ``graph_buckets`` carry each
captured bucket's replay time (``replay_ms``). :func:`cohort_rows` picks the fewest rows per
forward whose per-row cost is within :data:`COHORT_TOLERANCE` of the best bucket of that shape;
:func:`cohort_units` turns rows into units (requests) and keeps a batch large enough to be
double-buffered. A shape with no timed bucket (a CPU pool, graphs off, an uncaptured shape) is
not capped: its batches go up to ``max_batch`` as before.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

from fastvideo3.loop.cfg import branches
from fastvideo3.vocab import UnitKind

#: a bucket whose per-row replay cost is within this fraction of the shape's best is "as good"
COHORT_TOLERANCE = 0.05
#: the scheduler option's values besides a fixed number of rows
COHORT_MODES = ("auto", "off")


def _field(bucket: Any, name: str, default=None):
    """A bucket record's field, from a dict (the executor's own records) or a GraphBucket proto."""
    if isinstance(bucket, dict):
        return bucket.get(name, default)
    return getattr(bucket, name, default)


def cohort_rows(buckets: Iterable[Any], latent_shape: Sequence[int],
                tolerance: float = COHORT_TOLERANCE) -> int | None:
    """The fewest rows per DiT forward at which this latent shape (C, F, H, W) runs within
    ``tolerance`` of its best per-row replay cost, from ``buckets`` (records with ``batch``,
    ``signature`` = ``CxFxHxW.t<text>`` and ``replay_ms``); None if no bucket of the shape was
    timed."""
    prefix = "x".join(str(int(d)) for d in latent_shape) + ".t"
    per_row: dict[int, float] = {}
    for b in buckets:
        rows, ms = int(_field(b, "batch", 0) or 0), float(_field(b, "replay_ms", 0.0) or 0.0)
        if rows > 0 and ms > 0 and str(_field(b, "signature", "")).startswith(prefix):
            per_row[rows] = min(per_row.get(rows, math.inf), ms / rows)
    if not per_row:
        return None
    best = min(per_row.values())
    return min(r for r, c in per_row.items() if c <= best * (1.0 + tolerance))


def rows_per_unit(cfg_policy: str) -> int:
    """DiT rows one request adds to a forward: both CFG branches when they share it (``batched``),
    one otherwise (``classic`` runs a forward per branch; ``none`` has one branch)."""
    return len(branches(cfg_policy)) if cfg_policy == "batched" else 1


def cohort_units(rows: int, per_unit: int, *, min_units: int = 1) -> int:
    """Units (requests) per batch for a cap of ``rows`` DiT rows, at least ``min_units`` (a batch
    the dispatcher double-buffers: see the planner's ``split_min_units``)."""
    return max(1, min_units, math.ceil(rows / max(1, per_unit)))


def parse_cohort_rows(value: Any) -> str | int:
    """The scheduler's ``cohort_rows`` option: ``auto``, ``off`` or a number of rows in [1, 4096];
    raises ValueError naming the allowed values."""
    text = str(value).strip().lower()
    if text in COHORT_MODES:
        return text
    try:
        rows = int(text)
    except ValueError:
        rows = 0
    if not 1 <= rows <= 4096:
        raise ValueError(f"{value!r} is not auto, off or a number of rows in [1, 4096]")
    return rows


def batch_cap(mode: str | int, *, split_min_units: int = 0) -> Callable[[Any, Any], int | None] | None:
    """The planner's ``batch_cap(unit, executor)`` for ``mode`` (:func:`parse_cohort_rows`), or
    None for ``off``. ``auto`` reads the replica's ``last_description.graph_buckets`` on each call
    (a description refreshed after a re-capture takes effect at once); a number caps every denoise
    batch at that many rows. A cap below ``split_min_units // 2`` units is raised to it, so a
    cohort's batch is still sent beside the one in flight."""
    if mode == "off":
        return None
    min_units = max(1, split_min_units // 2) if split_min_units > 0 else 1

    def cap(unit, executor) -> int | None:
        if unit.kind != UnitKind.DIFFUSION_STEP:
            return None
        policy = str(unit.params.get("cfg_policy", "batched"))
        if mode == "auto":
            desc = getattr(executor, "last_description", None)
            shape = unit.params.get("latent_shape")
            if desc is None or not shape:
                return None
            rows = cohort_rows(list(desc.graph_buckets), shape)
            if rows is None:
                return None
        else:
            rows = int(mode)
        return cohort_units(rows, rows_per_unit(policy), min_units=min_units)

    return cap
