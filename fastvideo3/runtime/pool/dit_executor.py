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
from dataclasses import dataclass, field
from typing import Any

import torch

from fastvideo3.card.family import family_module
from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import FastVideoError, InvalidRequest, NumericFault, Unavailable
from fastvideo3.loop import cfg as cfg_policy
from fastvideo3.loop.denoise import HANDOFF_PREFIX
from fastvideo3.loop.protocol import StepResult
from fastvideo3.loop.samplers import SamplerHistory, sampler_step
from fastvideo3.runtime.pool.adapters import adapter_refs
from fastvideo3.runtime.pool.dit_adapters import AdapterVerbs
from fastvideo3.runtime.pool.dit_graphs import GRAPH_OFF, ForwardPath, GraphBuckets, _merge_paths
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


class DenoiserExecutor(GraphBuckets, AdapterVerbs, _Base):
    """Runs diffusion steps; batches compatible units across requests into one DiT forward. Its
    graph buckets are :class:`~fastvideo3.runtime.pool.dit_graphs.GraphBuckets`, its adapter verbs
    :class:`~fastvideo3.runtime.pool.dit_adapters.AdapterVerbs`."""

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

    def _dit(self, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor, expert: str | None = None,
             image: torch.Tensor | None = None) -> torch.Tensor:
        return self._forward_rows(x, t, text, expert, image)[0]

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

