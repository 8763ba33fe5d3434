"""The denoiser executor's CUDA-graph shape buckets: the warm phase that captures them through the
model's runtime export, and the step's replays of the prepared buckets that cover a batch's rows
(:class:`GraphBuckets`, a part of :class:`~fastvideo3.runtime.pool.dit_executor.DenoiserExecutor`).
Every forward reports the path it ran (:class:`ForwardPath`)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from fastvideo3.errors import FailedPrecondition, InvalidRequest
from fastvideo3.runtime.scheduling.invariant import pad_rows
from fastvideo3.telemetry import names as N

log = logging.getLogger("fastvideo3.denoiser")

#: the warm phase's modes (``--graph-buckets``): capture nothing, or the card's buckets
GRAPH_OFF, GRAPH_CARD = "off", "card"
GRAPH_MODES = (GRAPH_OFF, GRAPH_CARD)

#: A batch is padded up to a larger graph bucket only while the padded forward holds at most this
#: many tokens: graphs pay where launch overheads do (on an H200 at 17x256x256, 1,280 tokens a
#: row, a replay is 3.3x faster than eager at 1 row, 1.5x at 4 and no faster from 8), while at
#: 81x480x832 (32,760 tokens a row) a replay is no faster and padded rows are pure cost (3 rows
#: in a 4-row bucket: 1,976 ms against 1,456 ms eager). A batch that fills its bucket exactly
#: replays at any size.
PAD_TOKEN_LIMIT = 8_192


def _tokens_per_row(latent_fhw, patch_size, patch_size_t: int = 1) -> int:
    """Tokens of one row: ``patch_size`` a (t, h, w) triple (Wan) or one spatial size with its
    temporal size apart (HunyuanVideo 1.5's ``patch_size`` and ``patch_size_t``)."""
    f, h, w = (int(d) for d in latent_fhw)
    pt, ph, pw = patch_size if isinstance(patch_size, (tuple, list)) else (patch_size_t, patch_size, patch_size)
    return (f // pt) * (h // ph) * (w // pw)


@dataclass(frozen=True)
class ForwardPath:
    """How one DiT forward ran: the graph bucket it replayed (or ``eager`` and why) and the
    padding rows the bucket added."""

    bucket: str
    padding_rows: int = 0
    eager_reason: str | None = None

    @classmethod
    def eager(cls, reason: str) -> "ForwardPath":
        return cls(N.GRAPH_EAGER, 0, reason)

    def span_attrs(self) -> dict:
        return {N.A_GRAPH_BUCKET: self.bucket, N.A_GRAPH_PADDING_ROWS: self.padding_rows,
                N.A_GRAPH_EAGER_REASON: self.eager_reason}


def _merge_paths(paths: list[ForwardPath]) -> ForwardPath:
    """One step's path over its forwards (classic CFG runs two): eager if any ran eagerly."""
    eager = [p for p in paths if p.bucket == N.GRAPH_EAGER]
    if eager:
        return eager[0]
    keys = sorted({p.bucket for p in paths})
    return ForwardPath(",".join(keys), sum(p.padding_rows for p in paths))


class GraphBuckets:
    """The denoiser executor's graph buckets (a mixin: the executor holds the model, the runtime
    export, its lock and its counters)."""

    def _build_runtime(self, buckets):
        from fastvideo3.models.wan.runtime_export import build_dit_runtime
        return build_dit_runtime(self._forward, weights_digest=self.weights_digest, precision=self.precision,
                                 dtype=self.dtype, text_dim=self.dit.cfg.text_dim, buckets=buckets,
                                 device=self.device, manifest={"card": self.card.model_id})

    def prepare_graphs(self, rows_and_latent_shapes, text_len: int | None = None) -> list[dict]:
        """Declare the shape buckets ``(rows, (C, F, H, W))`` (rows = samples x CFG branches in one
        forward) and capture them through the model runtime (see :meth:`capture_graphs`)."""
        from fastvideo3.models.wan.runtime_export import DitBucket
        text_len = text_len or self.card.max_text_tokens
        return self.capture_graphs(tuple(DitBucket(int(r), tuple(int(d) for d in shape), text_len)
                                         for r, shape in rows_and_latent_shapes))

    def capture_graphs(self, buckets=None) -> list[dict]:
        """Warm phase: capture ``buckets`` (default: the card's ``graph_buckets``) through the
        runtime's ``prepare`` verb -- CUDA graphs on a GPU, eager recordings on a CPU -- and return
        what each cost: ``{"batch", "signature", "capture_s", "memory_bytes"}`` (memory: the device
        memory the capture keeps, i.e. the graph pool's growth; 0 on a CPU). A step replays a
        prepared bucket and runs any other shape eagerly, never capturing. Buckets the runtime does
        not declare re-plan it (a new fingerprint), so that is refused while requests are resident.
        A bucket that does not fit in device memory is skipped (logged; it runs eagerly). The
        reference (non-fast) path keeps no graphs."""
        from fastvideo3.models.wan.runtime_export import card_buckets
        if not self.fast:
            self.graph_capture = "none: the reference DiT path keeps no graphs"
            return []
        buckets = tuple(buckets or card_buckets(self.card))
        if buckets and not getattr(self._forward, "capturable", True):
            self.graph_capture = ("none: this DiT forward cannot be captured in a CUDA graph "
                                  "(it reads per-row text lengths on the host); it runs eagerly")
            return []
        with self._lock:
            declared = set(self.runtime.ports["latents"].bucket_shapes)
            if not {b.key for b in buckets} <= declared:
                if self.regions:
                    raise FailedPrecondition("new shape buckets change the runtime fingerprint; "
                                             "declare them before requests are resident", field="buckets")
                new = self._build_runtime(buckets)
                self.runtime.release()
                self.runtime, self._prepared, self.graph_buckets = new, {}, []
            for b in buckets:
                if b.key not in self._prepared:
                    self._capture(b)
            self.graph_capture = GRAPH_CARD
        return [dict(g) for g in self.graph_buckets]

    def warm_graphs(self, mode: str = GRAPH_CARD) -> list[dict]:
        """The pool's warm phase: ``card`` captures the card's buckets when the DiT runs on CUDA
        (on a CPU a step is cheap next to a capture, and eager recordings would only change which
        rows share a GEMM); ``off`` captures nothing. Returns Describe's ``graph_buckets``."""
        if mode not in GRAPH_MODES:
            raise InvalidRequest(f"unknown graph bucket mode {mode!r}", field="graph_buckets",
                                 limit=", ".join(GRAPH_MODES))
        if mode == GRAPH_OFF:
            self.graph_capture = GRAPH_OFF
            return []
        if not self.device.startswith("cuda"):
            self.graph_capture = "none: graphs are captured on CUDA only"
            return []
        return self.capture_graphs()

    def _capture(self, bucket) -> None:
        cuda = self.device.startswith("cuda")
        if cuda:  # cached blocks are released around the capture: the delta is what the graph keeps
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            before = torch.cuda.memory_reserved(self.device)
        t0 = time.perf_counter()
        try:
            self.runtime.prepare(bucket.key)
            if cuda:
                torch.cuda.synchronize(self.device)
        except torch.OutOfMemoryError as e:
            torch.cuda.empty_cache()
            log.warning("graph bucket %s skipped (runs eagerly): %s", bucket.key, str(e).splitlines()[0])
            return
        capture_s = time.perf_counter() - t0
        memory = 0
        if cuda:
            torch.cuda.empty_cache()
            memory = max(0, torch.cuda.memory_reserved(self.device) - before)
        self._prepared[bucket.key] = bucket
        record = {"batch": bucket.rows, "signature": bucket.signature,
                  "capture_s": round(capture_s, 6), "memory_bytes": int(memory)}
        if cuda:  # timed replays: the DiT's own cost at this bucket, beside which a step's overhead shows
            record["replay_ms"] = round(self._time_replay(bucket), 3)
        self.graph_buckets.append(record)
        log.info("graph bucket %s captured in %.2f s (%.1f MiB)", bucket.key, capture_s, memory / 2**20)

    def _time_replay(self, bucket) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.runtime.prepare(bucket.key)  # selects the captured bucket
        self.runtime.fire("dit")  # the first replay uploads the graph: untimed
        times = []
        for _ in range(3):  # the median of three, on the inputs the capture left in place
            start.record()
            self.runtime.fire("dit")
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[1]

    def _forward_rows(self, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor, expert: str | None = None,
                      image: torch.Tensor | None = None) -> tuple[torch.Tensor, "ForwardPath"]:
        """The DiT forward of ``x``'s rows, and the path it took: replays of the prepared buckets of
        its shape that cover its rows at the least cost (:func:`~fastvideo3.models.wan.runtime_export.cover_rows`:
        12 rows as an 8-row and a 4-row replay rather than one 16-row replay with 4 rows of padding;
        a padded bucket takes copies of its first row and only the real rows come back), else eagerly."""
        from fastvideo3.models.wan.runtime_export import cover_rows, shape_signature
        if image is not None:  # image-to-video: eager (the runtime export's ports carry no image yet)
            return self._forwards[expert or self.experts[0]](x, t, text, image=image), ForwardPath.eager("image")
        if expert is not None and expert != self.experts[0]:
            return self._forwards[expert](x, t, text), ForwardPath.eager("expert")  # the export covers the first
        if self.adapters.active:  # captured graphs hold no adapter deltas
            return self._forward(x, t, text), ForwardPath.eager("adapters")
        n = x.shape[0]
        cover = None
        if self._prepared and text.shape[2] == self.dit.cfg.text_dim:
            cfg = self.dit.cfg
            tokens = _tokens_per_row(x.shape[2:], cfg.patch_size, getattr(cfg, "patch_size_t", 1))
            cover = cover_rows(self._prepared.values(), n, x.shape[1:], text.shape[1],
                               may_pad=lambda b: b.rows * tokens <= PAD_TOKEN_LIMIT)
            sig = shape_signature(x.shape[1:], text.shape[1])
            if cover is None and any(b.signature == sig for b in self._prepared.values()):
                # buckets of its shape exist: every cover needs a padding past the token limit
                return self._forward(x, t, text), ForwardPath.eager("padding_cost")
        if cover is None:
            return self._forward(x, t, text), ForwardPath.eager("no_bucket" if self._prepared else "no_graphs")
        rt = self.runtime
        out, start, keys, padding = None, 0, [], 0
        for bucket, take in cover:
            xs, ts, texts = x[start:start + take], t[start:start + take], text[start:start + take]
            pad = bucket.rows - take
            if pad:
                xs, ts, texts, _, _ = pad_rows(xs, ts, texts, [], bucket.rows)
            rt.prepare(bucket.key)  # selects the prepared bucket; captures nothing
            rt.set_input("latents", xs)
            rt.set_input("timestep", ts)
            rt.set_input("text", texts)
            rt.fire("dit")
            # the output window is rewritten by the next replay: keep a copy of the real rows
            got = rt.get_output("noise_pred")[:take]
            if len(cover) == 1:
                return got.clone(), ForwardPath(bucket.key, pad)
            if out is None:
                out = torch.empty((n, *got.shape[1:]), dtype=got.dtype, device=got.device)
            out[start:start + take].copy_(got)
            start, padding = start + take, padding + pad
            keys.append(bucket.key)
        self.counters["cover_forwards"] += len(cover)
        return out, ForwardPath("+".join(keys), padding)
