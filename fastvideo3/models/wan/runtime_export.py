"""The denoiser's model as a runtime export: the Wan DiT over fixed IO buffers, per shape bucket.

:func:`build_dit_runtime` is how the denoiser pool obtains its model: one
:class:`~fastvideo3.export.ModelRuntime` whose identity covers the weights digest, precision,
library versions, device arch, graph names, the state-region layout, the port schema and the
stage DAG. Its pieces:

* **buckets** -- ``(rows, (C, F, H, W), text_len)``; all buckets share one latent shape and text
  length and differ in rows (samples x CFG branches in one forward). Key: ``r2.16x21x60x104.t512``.
* **buffers** -- ``latents``, ``timestep``, ``text``, ``noise_pred``, ``dt`` sized for the
  largest bucket, and ``state``: the arena of the state regions.
* **state regions** (in this order) -- ``latent`` (fp32, the resident latent rows),
  ``history.model_output`` (fp32, the previous model output) and ``history.has_previous``
  (fp32 0/1 per row): the sampler history of the built-in second-order update.
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
from typing import Any, Callable, Hashable, Mapping, Sequence

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


def bucket_key(rows: int, latent_shape: Sequence[int], text_len: int) -> str:
    return f"r{rows}." + "x".join(str(int(d)) for d in latent_shape) + f".t{text_len}"


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
        if b.rows < 1 or len(b.latent_shape) != 4 or b.text_len < 1:
            raise InvalidRequest(f"bad bucket {b}", field="buckets")
        if (b.latent_shape, b.text_len) != (first.latent_shape, first.text_len):
            raise InvalidRequest("buckets must share one latent shape and text length", field="buckets",
                                 limit=first.key)
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
    c, f, h, w = buckets[0].latent_shape
    text_len = buckets[0].text_len
    stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None

    def alloc(shape, dt):
        return torch.empty(shape, dtype=dt, device=device)

    lat_shape = (rows, c, f, h, w)
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

    def window(name: str, b: DitBucket) -> torch.Tensor:
        t = buffers[name]
        return t.view(-1)[: math.prod((b.rows, *t.shape[1:]))].view(b.rows, *t.shape[1:])

    def prepare(key: str | None) -> None:
        b = by_key[key]
        lat, out = window("latents", b), window(OUT_PORT, b)
        sl, prev = state["latent"][: b.rows], state["history.model_output"][: b.rows]
        has = state["history.has_previous"][: b.rows]
        runners["load"].prepare(key, _load, {"state_latent": sl, "latents": lat})
        runners["dit"].prepare(key, lambda **s: _dit(forward, **s), {
            "latents": lat, "timestep": window("timestep", b), "text": window("text", b), "out": out})
        runners["update"].prepare(key, _update, {
            "state_latent": sl, "noise_pred": out, "dt": window("dt", b), "prev": prev, "has_prev": has})
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
    shapes = {"latents": lambda b: (b.rows, c, f, h, w), "timestep": lambda b: (b.rows,),
              "text": lambda b: (b.rows, text_len, text_dim), "dt": lambda b: (b.rows,),
              OUT_PORT: lambda b: (b.rows, c, f, h, w)}
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
