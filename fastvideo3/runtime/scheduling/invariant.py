"""Batch-invariant denoise batches: a request's output does not depend on its batch-mates.

A batched DiT forward is bit-identical per row only when every kernel's reduction order is the
same whoever shares the batch. Row-wise kernels (norms, attention per sample, elementwise
modulation) are; GEMMs are not in general: a BLAS picks its blocking, micro-kernel and thread
split from the GEMM's M, so a row's sums can change with the batch size. On a CPU the timestep
MLP (M = rows) and the patch embedding (M = rows x tokens, K = 64) give a row other bits at
another M, so one request alone and the same request beside others differ in the last bits, and
a resumed request whose batch-mates changed does not reproduce its uninterrupted run.

The mode pins M: a request carries a bucket (``batch_bucket``, in units) chosen by the scheduler
that planned it, and every forward holding it runs at exactly ``bucket x branches`` rows — larger
groups are cut into bucket-sized forwards and the last is padded with copies of its first row,
computed and discarded. The bucket travels in the request's denoise state, so a request resumed
after a crash keeps the bucket it started with.
"""
from __future__ import annotations

import torch


def bucket_of(unit) -> int | None:
    """The unit's bucket (units per forward) in batch-invariant mode, or None."""
    b = unit.params.get("batch_bucket")
    return int(b) if b else None


def cut(members: list, bucket: int | None, batching: bool) -> list[list]:
    """A group of compatible units as the forwards that run it: bucket-sized slices in
    batch-invariant mode, the whole group when batching, one unit each when not."""
    if not batching:
        return [[m] for m in members]
    if bucket is None:
        return [members]
    return [members[i:i + bucket] for i in range(0, len(members), bucket)]


def pad_rows(x: torch.Tensor, t: torch.Tensor, text: torch.Tensor, tags: list, rows: int | None):
    """``(x, t, text, tags)`` with copies of row 0 appended up to ``rows`` rows (None: unchanged),
    and the number of rows added. ``tags`` is per-row metadata (adapters), extended the same way.
    Copies, not zeros, keep the padding's arithmetic that of a real row: no denormals, no NaN."""
    extra = 0 if rows is None else rows - x.shape[0]
    if extra < 0:
        raise ValueError(f"{x.shape[0]} rows exceed the bucket of {rows}")
    if extra == 0:
        return x, t, text, tags, 0

    def grow(a: torch.Tensor) -> torch.Tensor:
        return torch.cat([a, a[:1].expand(extra, *a.shape[1:])])
    return grow(x), grow(t), grow(text), list(tags) + list(tags[:1]) * extra, extra
