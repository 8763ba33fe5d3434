"""The denoiser's executor: diffusion steps batched across requests into one DiT forward.

The pool obtains its model as a runtime export (:func:`fastvideo3.models.wan.runtime_export.build_dit_runtime`:
identity, fingerprint, ports, stages, graphs, state regions) declared over the card's shape
buckets (``ModelCard.graph_buckets``). The warm phase (:meth:`DenoiserExecutor.capture_graphs`)
captures those buckets through the runtime's ``prepare`` verb; a step then runs a batch as the
replays of the prepared buckets of its shape that cover its rows at the least cost (one bucket
that holds them, padded up to it with copies of its first row, computed and discarded, or several
back to back: 12 rows as 8 + 4 rather than 16 with 4 rows of padding), through the runtime's verbs
(``set_input``, ``fire``, ``get_output``). A batch no bucket of its shape covers runs eagerly, and
its results say so: every result carries the path it ran (:data:`GRAPH_BUCKET_ATTR`, ``"eager"``
or the bucket keys joined by ``+``) and the padding rows (:data:`GRAPH_PADDING_ATTR`) as span
attributes for the pool's execute span.
"""
from __future__ import annotations

import copy
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from fastvideo3.card.family import family_module
from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import FailedPrecondition, FastVideoError, InvalidRequest, NumericFault, Unavailable
from fastvideo3.loop import cfg as cfg_policy
from fastvideo3.loop.denoise import HANDOFF_PREFIX
from fastvideo3.loop.protocol import StepResult
from fastvideo3.loop.samplers import SamplerHistory, sampler_step
from fastvideo3.request.schema import ID_CHARS
from fastvideo3.runtime.pool.adapters import adapter_refs
from fastvideo3.runtime.pool.executors import _Base, _fail, load_dit
from fastvideo3.runtime.scheduling.invariant import bucket_of, cut, pad_rows
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.telemetry import names as N
from fastvideo3.vocab import Role

log = logging.getLogger("fastvideo3.denoiser")

#: the environment variable that says where a denoise batch's host read runs (see DenoiserExecutor)
TAIL_ENV = "FASTVIDEO3_DENOISER_TAIL"


def _tail_mode(value: str) -> bool:
    """True for ``after`` (the default: the host read after the executor's lock), False for ``lock``."""
    if value not in ("after", "lock"):
        raise ValueError(f"{TAIL_ENV} must be 'after' or 'lock', got {value!r}")
    return value == "after"

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


@dataclass
class Region:
    """A request's resident data in the denoiser: latent, sampler history, fetched embeddings."""

    latent: torch.Tensor
    history: SamplerHistory
    embeds: dict[str, torch.Tensor] = field(default_factory=dict)
    step: int = 0
    #: interceptor tensors ("policy/stream" -> name -> tensor); their JSON state is in the LoopState
    plugin: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    #: CUDA: an event recorded once the last step's writes of latent and history were queued, so
    #: a snapshot's copies wait for that step alone (not for the batches queued after it)
    ready: Any = None


class DenoiserExecutor(_Base):
    """Runs diffusion steps; batches compatible units across requests into one DiT forward."""

    role = Role.DENOISER

    def __init__(self, card: ModelCard, transport, device=None, precision=None, batching: bool = True,
                 fast: bool | None = None, experts: list[str] | None = None,
                 lora_slots: int = 8, lora_max_rank: int = 64,
                 lora_merge_cache_bytes: int | None = None):
        super().__init__(card, transport, device, precision)
        # A two-expert card's pool holds both experts unless the deployment gives it one
        # (``experts``): then a request's latent moves to the other expert's pool at the switch.
        names = list(experts or card.dit_components())
        unknown = [n for n in names if n not in card.dit_components()]
        if unknown or not names:
            raise InvalidRequest(f"card {card.model_id} has no denoising expert {unknown[0] if unknown else ''!r}",
                                 field="experts", limit=", ".join(card.dit_components()))
        self.experts = names
        self.dits: dict[str, object] = {}
        digests = []
        parts = family_module(card)  # the card's family's weights code
        for name in names:
            self.dits[name], digest = load_dit(card, self.device, self.dtype, component=name)
            digests.append(digest if len(names) == 1 and name == "transformer" else f"{name}={digest}")
        self.dit, self.weights_digest = self.dits[names[0]], "+".join(digests)
        self.base_weights_digest = self.weights_digest
        # The fast path (fused kernels; CUDA graphs for buckets captured by prepare_graphs) is the
        # default on CUDA only: on a CPU the executor runs the reference DiT, exactly as before.
        self.fast = self.device.startswith("cuda") if fast is None else bool(fast)
        self._forwards = dict(self.dits)
        if self.fast:
            self._forwards = {n: parts.fast_dit(m) for n, m in self.dits.items()}
        self._forward = self._forwards[names[0]]
        # LoRA adapters (fastvideo3.runtime.pool.adapters): a per-row delta on the adapted layers of
        # whichever forward runs (hooks on the reference model, calls inside the fast path)
        from fastvideo3.runtime.pool.adapters import AdapterStore
        shapes, linears, groups = parts.lora_layers(self.dit)
        self.adapters = AdapterStore(shapes, self.device, self.dtype, slots=lora_slots,
                                     max_rank=lora_max_rank, groups=groups)
        if lora_merge_cache_bytes is not None:
            self.adapters.merged_sets.budget = lora_merge_cache_bytes
            self.adapters.merge_segments = self.adapters.merge_segments and lora_merge_cache_bytes > 0
        self.adapters.hook(self.dit, linears)
        if self.fast:
            self._forward.lora = self.adapters
        # The model as the pool sees it: a runtime export (identity, fingerprint, ports, stages,
        # graphs, state regions) declared over the card's shape buckets (whether or not the warm
        # phase captures them, so the fingerprint does not depend on it). Prepared buckets run
        # through its SWAP ports and the "dit" stage.
        from fastvideo3.models.wan.runtime_export import card_buckets
        self._prepared: dict[str, object] = {}  # bucket key -> DitBucket, captured
        #: the warm phase's record of each captured bucket (Describe's "graph_buckets")
        self.graph_buckets: list[dict] = []
        #: what the warm phase did: "off" (not asked), "card" (captured the card's buckets), or why not
        self.graph_capture = GRAPH_OFF
        self.runtime = self._build_runtime(card_buckets(card))
        self.batching = batching
        self.regions: dict[str, Region] = {}
        #: CUDA: the stream snapshots copy on. On the stream the steps run on, a snapshot's copy
        #: would queue behind the batch dispatched after its step (double buffering), and the
        #: request would wait that batch out at every checkpoint
        self._copy_stream = torch.cuda.Stream(device=self.device) if self.device.startswith("cuda") else None
        #: (request, input name) -> the pulled tensor, or the error pulling it raised (see prefetch)
        #: (request id, input name, owner, buffer id) -> the prefetched tensor, or the pull's error; keyed by
        #: the ref too, so a request whose input was made again never gets the old one's pull
        self._staged: dict[tuple[str, str, str, str], object] = {}
        self.counters.update({"forwards": 0, "rows": 0, "max_batch_rows": 0, "padding_rows": 0,
                              "graph_forwards": 0, "eager_forwards": 0, "cover_forwards": 0,
                              "forward_device_seconds": 0.0})
        #: CUDA: (start, end) events around each DiT forward of the running batch, read when it ends
        #: (its results have synchronized by then): ``forward_device_seconds`` against
        #: ``busy_seconds`` is the batch's time outside the DiT
        self._forward_events: list = []
        self.fault_hook = None  # test hook: fn(unit, latent) -> latent, to inject numeric faults
        #: read-only step observers (behavior capture for rollouts, parity taps):
        #: fn(unit, latent_in, model_output, latent_out), called after each successful step.
        #: They must not mutate the tensors; with none installed the step body is unchanged.
        self.observers: list = []
        #: whether a batch's host read and results run after the executor's lock (see _execute);
        #: FASTVIDEO3_DENOISER_TAIL=lock keeps them under it (the former behaviour, for A/B runs)
        self.tail_after_lock = _tail_mode(os.environ.get(TAIL_ENV, "after"))

    # -- region lifecycle --------------------------------------------------------------
    def _region(self, unit: WorkUnit) -> Region:
        reg = self.regions.get(unit.request_id)
        p = unit.params
        if reg is None and p["step"] != 0 and p.get("handoff_meta"):
            reg = self._take_over(unit)  # the other expert's pool handed this request over
        if reg is None:
            if p["step"] != 0:  # the replica lost it (restarted): the scheduler resumes from a snapshot
                raise Unavailable(f"no resident latent for request at step {p['step']}", step=p["step"],
                                  field="request_id", details={"lost_region": True})
            shape = [1, *p["latent_shape"]]
            gen = torch.Generator(device="cpu").manual_seed(int(p["seed"]))
            latent = torch.randn(shape, generator=gen, dtype=torch.float32).to(self.device)
            reg = Region(latent=latent, history=SamplerHistory(order=int(p.get("solver_order", 2))))
        if reg.step != p["step"]:
            raise FastVideoError(f"step {p['step']} issued but the resident latent is at step {reg.step}", step=p["step"])
        for name, ref in unit.inputs.items():
            if name.startswith(HANDOFF_PREFIX):
                continue
            if name not in reg.embeds:  # fetched once per request, reused across steps (fetch validates the ref)
                fetched = self._staged.pop((unit.request_id, name, ref.owner, ref.buffer_id), None)
                if isinstance(fetched, BaseException):
                    raise fetched
                if fetched is None:
                    fetched = self.transport.fetch(ref, deadline_s=self.fetch_deadline_s)
                reg.embeds[name] = fetched.to(self.device, self.dtype)
        # resident only once its inputs arrived: a refused or failed first step leaves nothing behind
        self.regions[unit.request_id] = reg
        return reg

    def prefetch(self, batch: list[WorkUnit]) -> None:
        """Pull the inputs the batch's units still lack (a request's embeddings, at its first step)
        without the step lock: a batch that waits behind the running one has them in place when
        its turn comes. A failed pull is kept and raised by that unit's step, as if it pulled then."""
        for unit in batch:
            reg = self.regions.get(unit.request_id)
            for name, ref in unit.inputs.items():
                key = (unit.request_id, name, ref.owner, ref.buffer_id)
                if name.startswith(HANDOFF_PREFIX) or (reg is not None and name in reg.embeds) or key in self._staged:
                    continue
                try:
                    self._staged[key] = self.transport.fetch(ref, deadline_s=self.fetch_deadline_s).to(
                        self.device, self.dtype)
                except Exception as e:  # noqa: BLE001 - reported by the step that needs it
                    self._staged[key] = e

    def release(self, request_id: str) -> None:
        with self._lock:
            self.regions.pop(request_id, None)
            for key in [k for k in self._staged if k[0] == request_id]:
                del self._staged[key]
        self.adapters.release(request_id)
        super().release(request_id)

    # -- adapters (fastvideo3.runtime.pool.adapters) -----------------------------------------------
    def _read_adapter(self, adapter_id: str, path: str | None, tensors: dict | None):
        from fastvideo3.models.wan.lora import load_lora_file, parse_lora
        if not isinstance(adapter_id, str) or not 1 <= len(adapter_id) <= 128 or not set(adapter_id) <= ID_CHARS:
            raise InvalidRequest("must be 1-128 characters of [A-Za-z0-9-_.:]", field="adapter_id",
                                 limit="1..128 chars")
        if type(self._forward).__name__ == "Fp8FastWanDiT":
            raise FailedPrecondition("the FP8 fast path takes no LoRA adapters", field="adapter_id")
        if len(getattr(self, "experts", ())) > 1:  # the delta hooks sit on one expert's layers
            raise FailedPrecondition("a two-expert pool takes no LoRA adapters yet", field="adapter_id")
        if getattr(self, "mesh", None) is not None:  # every rank would need it, loaded in step
            raise FailedPrecondition("a multi-rank (parallel) replica takes no LoRA adapters yet", field="adapter_id")
        if getattr(self, "adapters", None) is not None and not self.adapters.shapes:  # the DiT adapts no layers
            raise FailedPrecondition(f"card {self.card.model_id}'s DiT takes no LoRA adapters", field="adapter_id")
        if tensors is not None:
            return parse_lora(tensors, self.dit.cfg, adapter_id, self.adapters.max_rank)
        if not path:
            raise InvalidRequest("an adapter needs a file", field="adapter_path")
        return load_lora_file(path, self.dit.cfg, adapter_id, self.adapters.max_rank)

    def load_adapter(self, adapter_id: str, path: str | None = None, tensors: dict | None = None) -> dict:
        """Load (or reload) an adapter while serving; returns its id, version, rank and bytes. Reading
        and checking the file happens outside the step lock; only the registration takes it."""
        adapter = self._read_adapter(adapter_id, path, tensors)
        return self.adapters.load(adapter, source=str(path or "memory"))

    def unload_adapter(self, adapter_id: str, wait_s: float = 0.0) -> list[str]:
        """Remove every version of an adapter, waiting up to ``wait_s`` for requests using it."""
        return self.adapters.unload(adapter_id, wait_s)

    def merge_adapter(self, adapter_id: str, scale: float, path: str | None = None,
                      tensors: dict | None = None) -> dict:
        """Dedicate this pool to one adapter merged into its weights (no per-row delta). Start-up
        only: refused once adapters are loaded or requests are resident."""
        from fastvideo3.models.wan.lora import merge_into_
        from fastvideo3.runtime.pool.adapters import _Entry
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not -8.0 <= float(scale) <= 8.0:
            raise InvalidRequest(f"{scale!r}", field="scale", limit="[-8, 8]")
        adapter = self._read_adapter(adapter_id, path, tensors)
        with self._lock:
            if self.regions or self.adapters.entries or self.adapters.merged:
                raise FailedPrecondition("merge an adapter before any other adapter or request", field="merge_adapter")
            merge_into_(self.dit, adapter, float(scale))
            store = self.adapters
            store.entries[(adapter_id, adapter.version)] = _Entry(adapter, str(path or "memory"))
            store.current[adapter_id] = adapter.version
            store.merged = (adapter_id, adapter.version, float(scale))
            # what ran is now other weights: the digest, and with it the runtime identity, says so
            self.weights_digest = f"{self.base_weights_digest}+lora:{adapter_id}@{adapter.version}*{float(scale):g}"
            self.runtime.release()
            from fastvideo3.models.wan.runtime_export import card_buckets
            # graphs captured before hold no merged weights' identity: the warm phase captures anew
            self.runtime, self._prepared, self.graph_buckets = self._build_runtime(card_buckets(self.card)), {}, []
            self.graph_capture = GRAPH_OFF
        return {"id": adapter_id, "version": adapter.version, "scale": float(scale), "mode": "merged"}

    # -- the expert switch across pools ------------------------------------------------------
    def _hand_off(self, unit: WorkUnit, reg: Region, res: StepResult) -> None:
        """After the last step of this pool's expert, when the next expert lives elsewhere: publish
        the latent and sampler history for the other pool and drop the region here."""
        tensors = {"latent": reg.latent, **{f"history.{k}": v for k, v in reg.history.tensors().items()}}
        for name, t in tensors.items():
            res.outputs[HANDOFF_PREFIX + name] = self.transport.publish(unit.request_id, HANDOFF_PREFIX + name, t)
        res.payload["handoff_meta"] = {"step": reg.step, "history": reg.history.meta()}
        self.regions.pop(unit.request_id, None)

    def _take_over(self, unit: WorkUnit) -> Region:
        p, meta = unit.params, unit.params["handoff_meta"]
        if int(meta["step"]) != int(p["step"]):
            raise FastVideoError(f"handed-over latent is at step {meta['step']}, step {p['step']} issued", step=p["step"])
        got = {}
        for name, ref in unit.inputs.items():
            if name.startswith(HANDOFF_PREFIX):
                got[name[len(HANDOFF_PREFIX):]] = self.transport.fetch(ref, deadline_s=self.fetch_deadline_s)
        if "latent" not in got:
            raise Unavailable("the expert switch names no handed-over latent", step=p["step"], field="inputs",
                              details={"lost_region": True})
        hist = {k[len("history."):]: v.to(self.device) for k, v in got.items() if k.startswith("history.")}
        history = SamplerHistory.rebuild(meta["history"], hist)
        return Region(latent=got["latent"].to(self.device), history=history, step=int(meta["step"]))

    # -- snapshot / restore (fastvideo3.runtime.pool.resident) ----------------------------------
    @property
    def identity(self):
        """The identity snapshots are bound to: the model runtime's (weights, precision,
        libraries, device, graph names, state layout, ports, stages)."""
        return self.runtime.identity

    def snapshot(self, request_id: str) -> bytes:
        """The request's latent + sampler history, bound to this pool's fingerprint.

        Taken without the executor's lock, which a batch holds for its whole execution: the
        scheduler snapshots a request at a step boundary, with none of its units in flight, while
        the replica runs the batch dispatched beside it (double buffering). Waiting for that
        batch held the request out of the next one at every checkpoint. Only this request's own
        step changes its region; should one have run meanwhile, the snapshot is refused
        (UNAVAILABLE, retryable) rather than pairing one step's latent with another's history."""
        from fastvideo3.errors import NotFound
        from fastvideo3.runtime.pool.resident import snapshot_regions
        reg = self.regions.get(request_id)  # one dict read: atomic beside the batch's own updates
        if reg is None:
            raise NotFound("no resident region for this request", field="request_id")
        latent, step, ready = reg.latent, reg.step, reg.ready
        # copied and serialized outside any lock, so the snapshots of a batch's requests are taken
        # side by side: the scheduler holds the request at this step boundary until it has the bytes
        if self._copy_stream is None or ready is None:
            blob = snapshot_regions(self.identity, latent, reg.history, step, plugin=reg.plugin)
        else:
            # on the copy stream, after the step that wrote the region: the copies run beside the
            # batch in flight (the region's tensors stay referenced until the copy has returned)
            with torch.cuda.stream(self._copy_stream):
                self._copy_stream.wait_event(ready)
                blob = snapshot_regions(self.identity, latent, reg.history, step, plugin=reg.plugin)
        if reg.step != step or reg.latent is not latent or self.regions.get(request_id) is not reg:
            raise Unavailable("the request's region changed while it was being snapshotted",
                              field="request_id", request_id=request_id, step=step)
        return blob

    def restore(self, request_id: str, blob: bytes) -> int:
        """Replace the request's region with a snapshot (same fingerprint only); returns its step.
        Embeddings are fetched again by the next step (its unit names them)."""
        from fastvideo3.runtime.pool.resident import restore_regions
        latent, history, step, plugin = restore_regions(self.identity, blob, self.device, with_plugin=True)
        with self._lock:
            self.regions[request_id] = Region(latent=latent, history=history, step=step, plugin=plugin)
        return step

    def describe(self) -> dict:
        d = super().describe()
        d["resident_regions"] = len(self.regions)
        d["weights_digest"] = self.weights_digest
        d["experts"] = list(self.experts)
        d["dit_path"] = "fast" if self.fast else "reference"
        d["adapters"] = self.adapters.describe()
        d["graph_buckets"] = [dict(g) for g in self.graph_buckets]
        d["graph_capture"] = self.graph_capture
        rt = self.runtime
        d["runtime_export"] = {"fingerprint": rt.fingerprint_hex, "graphs": list(rt.identity.graph_names),
                               "stages": [s.graph for s in rt.stages], "ports": sorted(rt.ports),
                               "regions": [r.name for r in rt.regions]}
        return d

    # -- warm phase: the model runtime and its buckets ------------------------------------
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

    def _dit(self, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor, expert: str | None = None,
             image: torch.Tensor | None = None) -> torch.Tensor:
        return self._forward_rows(x, t, text, expert, image)[0]

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

    # -- the step body -----------------------------------------------------------------
    def _execute(self, batch):
        results: dict[str, StepResult] = {}
        ready: list[tuple[WorkUnit, Region]] = []
        for unit in batch:
            try:
                self._validate(unit)
                ready.append((unit, self._region(unit)))
            except Exception as e:  # noqa: BLE001
                results[unit.unit_id] = _fail(unit, e)
        groups: dict[tuple, list[tuple[WorkUnit, Region]]] = {}
        for unit, reg in ready:
            key = (unit.shape_sig, unit.params["cfg_policy"], unit.params.get("expert"), bucket_of(unit))
            groups.setdefault(key, []).append((unit, reg))
        tails = []
        for key, members in groups.items():
            for chunk in cut(members, key[-1], self.batching):  # bucket-sized in batch-invariant mode
                tail = self._run(chunk, results)
                if tail is not None:
                    tails.append(tail)
        events, self._forward_events = self._forward_events, []

        def finish() -> list[StepResult]:
            # the batch's host reads and results: after the executor's lock (see _Base.execute), so
            # the batch dispatched beside this one queues its inputs and forward meanwhile and the
            # device does not wait on the host between the two
            for tail in tails:
                tail()
            if events:
                events[-1][1].synchronize()
                seconds = sum(a.elapsed_time(b) for a, b in events) / 1e3
                with self._busy_lock:
                    self.counters["forward_device_seconds"] += seconds
            return [results[u.unit_id] for u in batch]

        return finish

    def _validate(self, unit: WorkUnit) -> None:
        p = unit.params
        if p.get("expert", self.experts[0]) not in self.dits:
            raise Unavailable(f"this pool holds expert(s) {self.experts}, not {p.get('expert')!r}", field="expert",
                              step=p.get("step"))
        if p.get("cfg_policy") not in cfg_policy.POLICIES:
            raise InvalidRequest(f"unknown cfg policy {p.get('cfg_policy')!r}", field="cfg_policy")
        # unknown adapter: NOT_FOUND naming it, before the request's first step; pinned from here
        # until the request is released, so an unload never yanks it mid-request
        self.adapters.acquire(unit.request_id, adapter_refs(p.get("adapters")))
        needed = {"prompt_embeds"} | ({"negative_embeds"} if p["cfg_policy"] != "none" else set())
        if self.dit.cfg.image_to_video:  # the image conditioning, encoded once per request
            needed |= {"image_embeds", "image_latents"}
        if not needed <= set(unit.inputs) | set(self.regions.get(unit.request_id, Region(torch.empty(0), SamplerHistory())).embeds):
            raise InvalidRequest(f"missing inputs {sorted(needed - set(unit.inputs))}", field="inputs")

    def _count_forward(self, rows: int, padding: int = 0) -> None:
        self.counters["forwards"] += 1
        self.counters["rows"] += rows
        self.counters["padding_rows"] += padding  # batch-invariant mode: computed and discarded
        self.counters["max_batch_rows"] = max(self.counters["max_batch_rows"], rows)

    @torch.no_grad()
    def _run(self, chunk: list[tuple[WorkUnit, Region]], results: dict[str, StepResult]):
        """One chunk's forwards and sampler steps, queued on the device; returns the chunk's tail
        (the host read of its checks and its StepResults) for :meth:`_execute` to run after the
        executor's lock, or None when it already ran."""
        policy = chunk[0][0].params["cfg_policy"]
        branches = cfg_policy.branches(policy)
        # one forward per branch (classic) or one for all branches (batched / none)
        passes = [branches] if policy in ("batched", "none") else [(b,) for b in branches]
        preds: list[dict[str, torch.Tensor]] = [{} for _ in chunk]
        intercepted = any(unit.params.get("cache") for unit, _ in chunk)
        bucket = bucket_of(chunk[0][0])
        # each request's interceptor state for this step: a copy of its LoopState's, returned updated
        plugin_states = [copy.deepcopy(unit.params.get("plugin_state") or {}) for unit, _ in chunk]
        paths: list[ForwardPath] = []
        for branch_set in passes:
            lat, ts, txt, index = cfg_policy.branch_rows(chunk, branch_set)
            image = None
            if self.dit.cfg.image_to_video:  # each row: its latent beside its request's image latent
                lat = [torch.cat([lat[r], chunk[i][1].embeds["image_latents"].to(lat[r])], dim=1)
                       for r, (i, _) in enumerate(index)]
                image = torch.cat([chunk[i][1].embeds["image_embeds"] for i, _ in index])
            x = torch.cat(lat).to(self.dtype)
            t = torch.tensor(ts, dtype=torch.float32, device=self.device)
            rows = [adapter_refs(chunk[i][0].params.get("adapters")) for i, _ in index]
            # batch-invariant mode: every forward at the bucket's rows (padding rows take row 0's adapters)
            x, t, text, rows, pad = pad_rows(x, t, torch.cat(txt), rows, bucket and bucket * len(branch_set))
            if image is not None and pad:
                image = torch.cat([image, image[:1].expand(pad, *image.shape[1:])])
            timed = self._copy_stream is not None  # CUDA
            if timed:
                events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                events[0].record()
            with self.adapters.batch(rows):
                if intercepted:
                    out = self._dit_intercepted(x, t, text, index, chunk, "+".join(branch_set), plugin_states,
                                                chunk[0][0].params.get("expert"), fixed_rows=bucket is not None)
                    path = ForwardPath.eager("interceptor")  # per-row block decisions: the staged eager forward
                else:
                    out, path = self._forward_rows(x, t, text, chunk[0][0].params.get("expert"), image)
            if timed:
                events[1].record()
                self._forward_events.append(events)
            self._count_forward(len(index), pad + path.padding_rows)
            self.counters["eager_forwards" if path.bucket == N.GRAPH_EAGER else "graph_forwards"] += 1
            paths.append(path)
            for row, (i, b) in enumerate(index):
                preds[i][b] = out[row : row + 1]
        traced = _merge_paths(paths).span_attrs()
        # the sampler updates first (device work queued under the lock), then -- in the returned
        # tail, run after the lock -- one host read for every unit's finiteness and norm (a read
        # per unit would wait on the device once per request of the batch)
        stepped: list[tuple[int, torch.Tensor, torch.Tensor, object, object]] = []
        for i, (unit, reg) in enumerate(chunk):
            try:
                p = unit.params
                noise = cfg_policy.combine(policy, preds[i], float(p["guidance"]))
                new = sampler_step(p["sampler"], reg.history, noise, reg.latent, int(p["step"]), p["sigmas"])
                if self.fault_hook is not None:
                    new = self.fault_hook(unit, new)
                ready = None
                if self._copy_stream is not None:  # the step's end in stream order, before the next batch's work
                    ready = torch.cuda.Event()
                    ready.record()
                published = self.transport.publish(unit.request_id, "latents", new) if p.get("final") else None
                stepped.append((i, noise, new, ready, published))
            except Exception as e:  # noqa: BLE001 - request-local fault
                self.regions.pop(unit.request_id, None)
                results[unit.unit_id] = _fail(unit, e)
        if not stepped:
            return None
        checks = torch.stack([torch.stack([torch.isfinite(new).all().float(), new.float().norm()])
                              for _, _, new, _, _ in stepped])
        batch_rows = float(len(chunk) * len(branches))

        def tail() -> None:
            values = checks.tolist()
            for (i, noise, new, ready, published), (finite, norm) in zip(stepped, values):
                unit, reg = chunk[i]
                try:
                    p = unit.params
                    if not finite:
                        raise NumericFault("latents became non-finite", step=int(p["step"]), request_id=unit.request_id)
                    for observe in self.observers:
                        observe(unit, reg.latent, noise, new)
                    reg.latent = new
                    reg.step += 1
                    if ready is not None:
                        reg.ready = ready
                    res = StepResult(unit.unit_id, unit.request_id,
                                     metrics={"latent_norm": float(norm), "finite": 1.0, "batch_rows": batch_rows},
                                     span_attrs=dict(traced))
                    if p.get("cache"):
                        res.payload["plugin_state"] = plugin_states[i]
                    if published is not None:
                        res.outputs["latents"] = published
                    if p.get("handoff") and any(e not in self.dits for e in self.card.dit_components()):
                        self._hand_off(unit, reg, res)  # the next step's expert lives in another pool
                    results[unit.unit_id] = res
                except Exception as e:  # noqa: BLE001 - request-local fault
                    with self._lock:  # the request is dropped here, as a Release would
                        self.regions.pop(unit.request_id, None)
                        if published is not None:  # its final latents go with it
                            self.transport.release(unit.request_id)
                    results[unit.unit_id] = _fail(unit, e)

        # a hand-off or a step observer runs under the lock, as before (they touch other state)
        if not self.tail_after_lock or self.observers or any(u.params.get("handoff") for u, _ in chunk):
            tail()
            return None
        return tail


    def _dit_intercepted(self, x, t, text, index, chunk, stream: str, plugin_states: list[dict],
                         expert: str | None = None, fixed_rows: bool = False) -> torch.Tensor:
        """One forward where each request's interceptors decide for its own rows
        (:mod:`fastvideo3.extend.runner`); the eager path (no captured graph). Each expert of a
        two-expert card keeps its own cached state (a residual of one expert means nothing to the other).
        Rows past ``index`` are batch-invariant padding, computing every block (``fixed_rows``: see staged_forward)."""
        forward = self._forwards[expert] if expert is not None else self._forward
        if expert is not None and expert != self.experts[0]:
            stream = f"{stream}@{expert}"
        from fastvideo3.extend.policies import build
        from fastvideo3.extend.protocols import RowView
        from fastvideo3.extend.runner import RowGroup, staged_forward
        groups = []
        for i, (unit, reg) in enumerate(chunk):
            rows = [r for r, (j, _) in enumerate(index) if j == i]
            settings = unit.params.get("cache")
            if not settings:
                groups.append(RowGroup(rows))
                continue
            step_icpt, block_icpt = build(settings)
            name = settings["policy"]
            state = plugin_states[i].setdefault(name, {}).setdefault(stream, {})
            view = RowView(step=int(unit.params["step"]), num_steps=int(unit.params["num_steps"]), state=state,
                           tensors=reg.plugin.setdefault(f"{name}/{stream}", {}))
            groups.append(RowGroup(rows, view, step_icpt, block_icpt))
        padding = [RowGroup(list(range(len(index), x.shape[0])))] if x.shape[0] > len(index) else []
        out = staged_forward(forward, x, t, text, groups + padding, fixed_rows=fixed_rows, lora=self.adapters)
        n_blocks = forward.num_blocks
        for g in groups:
            if g.view is not None:  # block evaluations, counted per row
                g.view.state["blocks_computed"] = g.view.state.get("blocks_computed", 0) + g.blocks_run * len(g.rows)
                g.view.state["blocks_total"] = g.view.state.get("blocks_total", 0) + n_blocks * len(g.rows)
            self.counters["blocks_computed"] = self.counters.get("blocks_computed", 0) + g.blocks_run * len(g.rows)
            self.counters["blocks_total"] = self.counters.get("blocks_total", 0) + n_blocks * len(g.rows)
        return out

