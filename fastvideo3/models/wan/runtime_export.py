"""The denoiser's model as a runtime export: the Wan DiT over fixed IO buffers, per shape bucket.

:func:`build_dit_runtime` is how the denoiser pool obtains its model: one
:class:`~fastvideo3.export.ModelRuntime` whose identity covers the weights digest, precision,
library versions, device arch, graph names, the state-region layout, the port schema and the
stage DAG. Its pieces:

* **buckets** -- ``(rows, (C, F, H, W), text_len)``; all buckets share one text length and differ
  in rows (samples x CFG branches in one forward) and, when a card declares several shapes, in
  latent shape. Key: ``r2.16x21x60x104.t512`` (rows, then the bucket's signature).
* **buffers** -- ``latents``, ``timestep``, ``text``, ``noise_pred``, ``dt`` sized for the
  largest bucket, and ``state``: the arena of the state regions. With one latent shape the latent
  buffers are ``(rows, C, F, H, W)``; with several they are flat, each bucket a leading window.
* **state regions** (in this order) -- ``latent`` (fp32, the resident latent rows),
  ``history.model_output`` (fp32, the previous model output) and ``history.has_previous``
  (fp32 0/1 per row): the sampler history of the built-in second-order update (flat, like the
  latent buffers, when the buckets have several shapes).
* **ports** (SWAP, bucketed) -- inputs ``latents``, ``timestep``, ``text``, ``dt``; output
  ``noise_pred``.
* **stages** -- ``load`` (state latent -> ``latents``), ``dit`` (the forward into ``noise_pred``),
  ``update`` (a flow-matching Adams-Bashforth-2 step of the state latent by ``dt`` per row,
  Euler on a row's first step; it records the model output as history). ``step`` fires all
  three: a whole denoising step for a simple host. The pool's executor fires ``dit`` alone and
  applies its own CFG and sampler.

Every stage is a :class:`~fastvideo3.export.GraphRunner` per bucket: captured as a CUDA graph on
the runtime's own stream on a GPU, an eager recording on a CPU; ``prepare(bucket)`` (warm phase)
captures all three. Preparing may overwrite the state arena; load state after preparing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import torch

from fastvideo3.errors import InvalidRequest
from fastvideo3.export import (
    GraphRunner, ModelRuntime, PortSpec, RuntimeBuilder, Verbs, arena_views, detect_device_arch,
)
from fastvideo3.export.native import STATE_BUFFER
from fastvideo3.export.regions import arena_size, dtype_name, pack_regions
from fastvideo3.vocab import Role

STAGES = (("load", ()), ("dit", ("load",)), ("update", ("dit",)))
IN_PORTS = ("latents", "timestep", "text", "dt")
OUT_PORT = "noise_pred"


@dataclass(frozen=True)
class DitBucket:
    rows: int
    latent_shape: tuple[int, int, int, int]
    text_len: int

    @property
    def key(self) -> str:
        return bucket_key(self.rows, self.latent_shape, self.text_len)

    @property
    def signature(self) -> str:
        """The bucket's shape without its rows: ``16x21x60x104.t512`` (the key is ``r<rows>.`` + it)."""
        return shape_signature(self.latent_shape, self.text_len)


def shape_signature(latent_shape: Sequence[int], text_len: int) -> str:
    return "x".join(str(int(d)) for d in latent_shape) + f".t{text_len}"


def bucket_key(rows: int, latent_shape: Sequence[int], text_len: int) -> str:
    return f"r{rows}." + shape_signature(latent_shape, text_len)


#: the cost of one more forward in a cover (input copies, the replay call, the output copy, and a
#: small forward's lower efficiency), in rows: a cover of several forwards must save more than
#: this per extra forward over padding one
PIECE_OVERHEAD_ROWS = 0.5


def cover_rows(buckets: Iterable[DitBucket], rows: int, latent_shape: Sequence[int], text_len: int, *,
               may_pad: Callable[[DitBucket], bool] = lambda b: True) -> list[tuple[DitBucket, int]] | None:
    """The forwards that run ``rows`` rows through buckets of this signature at the least cost:
    ``[(bucket, rows it takes)]``, largest bucket first; at most one takes fewer rows than its
    bucket holds (padded), and only a bucket ``may_pad`` allows. None: no bucket of the signature,
    or no cover without a padding ``may_pad`` refuses.

    A forward costs its bucket's rows (a DiT's forward is linear in its rows once the GPU is full:
    an H200 at 17x256x256 replays 7.1-7.3 ms a row from 2 rows to 32,
    bench/results/graph_buckets_h200_17x256.json) plus :data:`PIECE_OVERHEAD_ROWS`; ties go to
    fewer forwards. Over buckets of 1, 2, 4, 8, 16 and 32 rows: 12 rows run as 8 + 4 (not 16 with
    4 rows of padding), 15 as 16 with one, 40 as 32 + 8."""
    sig = shape_signature(latent_shape, text_len)
    fits = sorted({b.key: b for b in buckets if b.signature == sig}.values(), key=lambda b: -b.rows)
    if not fits or rows < 1:
        return None
    inf = float("inf")
    best = [0.0] + [inf] * rows  # best[m]: the least cost of covering m rows
    pick: list[DitBucket | None] = [None] * (rows + 1)
    for m in range(1, rows + 1):
        for b in fits:
            if b.rows > m and not may_pad(b):
                continue
            c = best[max(0, m - b.rows)] + b.rows + PIECE_OVERHEAD_ROWS
            if c < best[m]:
                best[m], pick[m] = c, b
    if best[rows] == inf:
        return None
    out, m = [], rows
    while m > 0:
        b = pick[m]
        out.append((b, min(b.rows, m)))
        m -= min(b.rows, m)
    return sorted(out, key=lambda p: (-p[0].rows, -p[1]))


class _StreamRunner(GraphRunner):
    """A GraphRunner that captures and replays on one stream, ordered with the caller's."""

    def __init__(self, name: str, stream: Any) -> None:
        super().__init__(name)
        self.stream = stream

    def _on_stream(self, fn: Callable[[], Any]) -> Any:
        if self.stream is None:
            return fn()
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            out = fn()
        current.wait_stream(self.stream)
        return out

    def prepare(self, bucket_key: Hashable, fn, static_inputs):
        return self._on_stream(lambda: GraphRunner.prepare(self, bucket_key, fn, static_inputs))

    def replay(self, bucket_key: Hashable):
        return self._on_stream(lambda: GraphRunner.replay(self, bucket_key))


def _check_buckets(buckets: Sequence[DitBucket]) -> tuple[DitBucket, ...]:
    buckets = tuple(buckets)
    if not buckets:
        raise InvalidRequest("at least one shape bucket is needed", field="buckets")
    first = buckets[0]
    for b in buckets:
        if b.rows < 1 or len(b.latent_shape) != 4 or min(b.latent_shape) < 1 or b.text_len < 1:
            raise InvalidRequest(f"bad bucket {b}", field="buckets")
        if b.text_len != first.text_len:
            raise InvalidRequest("buckets must share one text length", field="buckets", limit=first.key)
    if len({b.key for b in buckets}) != len(buckets):
        raise InvalidRequest("duplicate bucket", field="buckets")
    return buckets


def build_dit_runtime(
    forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    weights_digest: str,
    precision: str,
    dtype: torch.dtype,
    text_dim: int,
    buckets: Sequence[DitBucket],
    device: str | torch.device = "cpu",
    manifest: Mapping[str, Any] | None = None,
) -> ModelRuntime:
    """The DiT as a :class:`ModelRuntime` (integrated build: one identity for all of it)."""
    buckets = _check_buckets(buckets)
    device = torch.device(device)
    rows = max(b.rows for b in buckets)
    text_len = buckets[0].text_len
    stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None

    def alloc(shape, dt):
        return torch.empty(shape, dtype=dt, device=device)

    if len({b.latent_shape for b in buckets}) == 1:
        lat_shape: tuple[int, ...] = (rows, *buckets[0].latent_shape)
    else:  # several shapes: flat buffers, each bucket a leading window of them
        lat_shape = (max(b.rows * math.prod(b.latent_shape) for b in buckets),)
    buffers = {
        "latents": alloc(lat_shape, dtype), "timestep": alloc((rows,), torch.float32),
        "text": alloc((rows, text_len, text_dim), dtype), OUT_PORT: alloc(lat_shape, dtype),
        "dt": alloc((rows,), torch.float32),
    }
    regions = pack_regions([("latent", torch.float32, lat_shape),
                            ("history.model_output", torch.float32, lat_shape),
                            ("history.has_previous", torch.float32, (rows,))])
    buffers[STATE_BUFFER] = torch.zeros(arena_size(regions), dtype=torch.uint8, device=device)
    state = arena_views(buffers[STATE_BUFFER], regions)
    runners = {name: _StreamRunner(f"denoiser.{name}", stream) for name, _ in STAGES}
    by_key = {b.key: b for b in buckets}

    def window(t: torch.Tensor, b: DitBucket, per_row: Sequence[int]) -> torch.Tensor:
        return t.view(-1)[: b.rows * math.prod(per_row)].view(b.rows, *per_row)

    def row_shape(name: str, b: DitBucket) -> tuple[int, ...]:
        return tuple(b.latent_shape) if name in ("latents", OUT_PORT) else tuple(buffers[name].shape[1:])

    def prepare(key: str | None) -> None:
        b = by_key[key]
        lat, out = window(buffers["latents"], b, b.latent_shape), window(buffers[OUT_PORT], b, b.latent_shape)
        sl = window(state["latent"], b, b.latent_shape)
        prev = window(state["history.model_output"], b, b.latent_shape)
        has = state["history.has_previous"][: b.rows]
        t_rows, txt, dt = (window(buffers[n], b, row_shape(n, b)) for n in ("timestep", "text", "dt"))
        runners["load"].prepare(key, _load, {"state_latent": sl, "latents": lat})
        runners["dit"].prepare(key, lambda **s: _dit(forward, **s), {
            "latents": lat, "timestep": t_rows, "text": txt, "out": out})
        runners["update"].prepare(key, _update, {
            "state_latent": sl, "noise_pred": out, "dt": dt, "prev": prev, "has_prev": has})
        buffers[STATE_BUFFER].zero_()  # warm-up ran the update: start from empty state

    builder = RuntimeBuilder(weights_digest=weights_digest or "none", precision=precision,
                             device_arch=detect_device_arch(device))
    for name, t in buffers.items():
        builder.add_buffer(name, t)
    for name, _ in STAGES:
        builder.add_graph(name, runners[name])
    for name, after in STAGES:
        builder.add_stage(name, after)
    if stream is not None:
        builder.add_stream(Role.DENOISER, stream)
    shapes = {"latents": lambda b: (b.rows, *b.latent_shape), "timestep": lambda b: (b.rows,),
              "text": lambda b: (b.rows, text_len, text_dim), "dt": lambda b: (b.rows,),
              OUT_PORT: lambda b: (b.rows, *b.latent_shape)}
    for name, shape in shapes.items():
        builder.add_port(PortSpec(
            name=name, direction="out" if name == OUT_PORT else "in", dtype=buffers[name].dtype,
            buckets={b.key: shape(b) for b in buckets}, update="swap", buffer=name))
    builder.set_regions(regions)
    builder.set_verbs(Verbs(prepare=prepare))
    builder.set_manifest({"model": "wan-dit", "dtype": dtype_name(dtype), "device": str(device),
                          "buckets": [b.key for b in buckets], **dict(manifest or {})})
    builder.set_owner(lambda: [r.release() for r in runners.values()])
    return builder.finish()


@torch.no_grad()
def _load(state_latent: torch.Tensor, latents: torch.Tensor) -> None:
    latents.copy_(state_latent)


@torch.no_grad()
def _dit(forward, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(forward(latents, timestep, text))


@torch.no_grad()
def _update(state_latent, noise_pred, dt, prev, has_prev) -> None:
    shape = (-1,) + (1,) * (state_latent.dim() - 1)
    v = noise_pred.float()
    # select, never multiply by the flag: whatever a row without history holds must not leak in
    slope = torch.where(has_prev.view(shape) > 0, 1.5 * v - 0.5 * prev, v)
    state_latent.add_(dt.view(shape) * slope)
    prev.copy_(v)
    has_prev.fill_(1.0)


def default_buckets(card, text_dim: int | None = None) -> tuple[DitBucket, ...]:
    """One request (rows 1) and one request with CFG (rows 2) at the card's default shape."""
    from fastvideo3.card.family import family_of
    lim = card.limits
    shape = family_of(card).latent_shape(card, lim.default_frames, lim.default_height, lim.default_width)
    return tuple(DitBucket(r, shape, card.max_text_tokens) for r in (1, 2))


def card_buckets(card) -> tuple[DitBucket, ...]:
    """The buckets the card declares (``graph_buckets``: rows x request shapes, as latent shapes),
    largest rows first (so the first capture of a shape sizes the graph pool and smaller ones
    reuse it); the default buckets when it declares none."""
    from fastvideo3.models.wan.components import latent_shape
    spec = card.graph_buckets
    if not spec.count:
        return default_buckets(card)
    shapes = [latent_shape(card, s.frames, s.height, s.width) for s in spec.shapes]
    out = [DitBucket(r, tuple(shape), card.max_text_tokens) for shape in shapes for r in sorted(spec.rows, reverse=True)]
    return tuple(dict.fromkeys(out))  # two request shapes may share a latent shape
