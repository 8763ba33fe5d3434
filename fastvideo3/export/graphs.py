"""GraphRunner: per-shape-bucket CUDA-graph capture and replay, with an eager CPU fallback.

The contract, identical on both backends:

* ``prepare(bucket, fn, static_inputs)`` is the only place work is captured. With CUDA, it
  warms ``fn`` up on a side stream (so lazy kernel selection and allocator growth happen
  outside the capture) and then captures one ``torch.cuda.CUDAGraph`` for the bucket. Without
  CUDA (or with CPU inputs) it records an eager fallback: ``fn`` is run once to produce the
  static outputs and is re-run on every replay.
* ``replay(bucket)`` runs the bucket on whatever its static input tensors hold: callers write
  new values into them (``copy_``, never rebinding: a SWAP port's window is such a tensor).
* A bucket that was never prepared is a :class:`BucketNotPrepared` error in ``replay`` --
  capture never happens lazily on the hot path.
* Outputs live in static tensors owned by the runner: every replay of a bucket returns the same
  tensor objects with new contents. Copy them if they must outlive the next replay.

The runner is generic (``fn`` takes the static inputs as keyword arguments); the denoiser wraps
its DiT forward with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping

import torch

from fastvideo3.export.errors import BucketNotPrepared, BufferMismatch, VerbUnavailable


@dataclass
class _Bucket:
    fn: Callable[..., Any]
    static_inputs: dict[str, torch.Tensor]
    static_outputs: Any
    graph: "torch.cuda.CUDAGraph | None"  # None: eager fallback


def _copy_into(dst: Any, src: Any, where: str) -> None:
    """Copy an eager result into the static output structure recorded at prepare time."""
    if isinstance(dst, torch.Tensor):
        if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
            raise BufferMismatch(f"output {where} changed type or shape since prepare", field=where)
        dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        if not isinstance(src, (tuple, list)) or len(src) != len(dst):
            raise BufferMismatch(f"output {where} changed structure since prepare", field=where)
        for i, (d, s) in enumerate(zip(dst, src)):
            _copy_into(d, s, f"{where}[{i}]")
    elif isinstance(dst, Mapping):
        if not isinstance(src, Mapping) or set(src) != set(dst):
            raise BufferMismatch(f"output {where} changed keys since prepare", field=where)
        for k in dst:
            _copy_into(dst[k], src[k], f"{where}[{k!r}]")
    # Non-tensor leaves (None, ints) are static by definition and are left as recorded.


def _clone_outputs(out: Any) -> Any:
    """Give the eager fallback its own static output storage (never an alias of an input)."""
    if isinstance(out, torch.Tensor):
        return out.detach().clone()
    if isinstance(out, tuple):
        return tuple(_clone_outputs(o) for o in out)
    if isinstance(out, list):
        return [_clone_outputs(o) for o in out]
    if isinstance(out, Mapping):
        return {k: _clone_outputs(v) for k, v in out.items()}
    return out


class GraphRunner:
    """Captured (or eager-recorded) executions of one function, one per shape bucket.

    ``use_cuda_graphs``: ``None`` decides per bucket (CUDA available and every static input on
    a CUDA device); ``False`` always records the eager fallback; ``True`` requires CUDA.
    ``share_pool``: buckets share one graph memory pool. Safe because buckets of one runner
    never replay concurrently and every bucket's outputs stay referenced by the runner, so the
    allocator never hands one bucket's live outputs to another.
    """

    def __init__(
        self,
        name: str = "graph",
        *,
        use_cuda_graphs: bool | None = None,
        warmup_iters: int = 2,
        share_pool: bool = True,
    ) -> None:
        self.name = name
        self.use_cuda_graphs = use_cuda_graphs
        self.warmup_iters = max(1, int(warmup_iters))
        self.share_pool = share_pool
        self._buckets: dict[Hashable, _Bucket] = {}
        self._pool: Any = None
        self._stepping = False

    # -- inspection ------------------------------------------------------------------------
    @property
    def buckets(self) -> tuple[Hashable, ...]:
        return tuple(self._buckets)

    def __contains__(self, bucket_key: Hashable) -> bool:
        return bucket_key in self._buckets

    def is_captured(self, bucket_key: Hashable) -> bool:
        """True if the bucket replays a CUDA graph, False if it is an eager fallback."""
        return self._get(bucket_key).graph is not None

    def exec_handle(self, bucket_key: Hashable) -> int | None:
        """The bucket's ``cudaGraphExec_t`` as an integer (None for an eager fallback).

        Valid while the bucket stays prepared; a native host may launch it on the stream the
        runner replays on, with the same static inputs and outputs."""
        graph = self._get(bucket_key).graph
        return int(graph.raw_cuda_graph_exec()) if graph is not None else None

    def static_inputs(self, bucket_key: Hashable) -> Mapping[str, torch.Tensor]:
        """The bucket's static input tensors: write into them directly, then ``replay``."""
        return dict(self._get(bucket_key).static_inputs)

    def static_outputs(self, bucket_key: Hashable) -> Any:
        return self._get(bucket_key).static_outputs

    # -- warm phase ------------------------------------------------------------------------
    def prepare(
        self, bucket_key: Hashable, fn: Callable[..., Any], static_inputs: Mapping[str, torch.Tensor]
    ) -> Any:
        """Capture (CUDA) or record (eager) ``fn(**static_inputs)`` for ``bucket_key``.

        The runner keeps references to ``static_inputs``; they are the tensors later steps write
        into. Preparing an existing bucket replaces it. Returns the static outputs.
        """
        if self._stepping:
            raise VerbUnavailable(
                f"{self.name}: prepare is not allowed inside step", field="prepare"
            )
        static = dict(static_inputs)
        for k, v in static.items():
            if not isinstance(v, torch.Tensor):
                raise BufferMismatch(f"static input {k!r} is not a tensor", field=f"inputs.{k}")
        if self._wants_graph(static):
            bucket = self._capture(fn, static)
        else:
            bucket = _Bucket(fn, static, _clone_outputs(fn(**static)), None)
        self._buckets.pop(bucket_key, None)
        self._buckets[bucket_key] = bucket
        return bucket.static_outputs

    def _wants_graph(self, static: Mapping[str, torch.Tensor]) -> bool:
        cuda_ok = torch.cuda.is_available()
        if self.use_cuda_graphs is True and not cuda_ok:
            raise VerbUnavailable(f"{self.name}: CUDA graphs requested but CUDA is unavailable")
        if self.use_cuda_graphs is False or not cuda_ok:
            return False
        on_cuda = [t.is_cuda for t in static.values()]
        if self.use_cuda_graphs is True and not all(on_cuda):
            raise BufferMismatch(f"{self.name}: CUDA graph capture needs CUDA static inputs")
        return bool(on_cuda) and all(on_cuda)

    def _capture(self, fn: Callable[..., Any], static: dict[str, torch.Tensor]) -> _Bucket:
        device = next(iter(static.values())).device
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device=device)
        side.wait_stream(current)
        # Warm up off the default stream: first calls pick kernels and grow the allocator,
        # which must not happen during capture.
        with torch.cuda.stream(side):
            for _ in range(self.warmup_iters):
                fn(**static)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool if self.share_pool else None):
            out = fn(**static)
        if self.share_pool and self._pool is None:
            self._pool = graph.pool()
        return _Bucket(fn, static, out, graph)

    # -- hot phase -------------------------------------------------------------------------
    def _get(self, bucket_key: Hashable) -> _Bucket:
        bucket = self._buckets.get(bucket_key)
        if bucket is None:
            raise BucketNotPrepared(
                f"{self.name}: bucket {bucket_key!r} is not prepared; call prepare(bucket) "
                "in the warm phase first",
                field="bucket",
                limit=", ".join(repr(b) for b in self._buckets) or "none prepared",
            )
        return bucket

    def replay(self, bucket_key: Hashable) -> Any:
        """Run the bucket on whatever its static inputs hold now. No copies, no capture."""
        bucket = self._get(bucket_key)
        self._stepping = True
        try:
            if bucket.graph is not None:
                bucket.graph.replay()
            else:
                _copy_into(bucket.static_outputs, bucket.fn(**bucket.static_inputs), "out")
        finally:
            self._stepping = False
        return bucket.static_outputs

    def release(self) -> None:
        """Drop every bucket (graphs, static inputs and outputs) and the shared pool."""
        self._buckets.clear()
        self._pool = None

