"""In-process executors for the encoder and denoiser roles (the decoder's: vae_executor.py).

Each executor owns its component's weights and the pool-resident data of the requests it serves,
keyed by request id: nothing per request lives anywhere else. Tensors leave an executor only as
references published on its transport; results carry references and a few numbers.
"""
from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field

import torch

from fastvideo3.card.family import family_module
from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import (ErrorInfo, FailedPrecondition, FastVideoError, InvalidRequest, NumericFault,
                               ResourceExhausted, Unavailable)
from fastvideo3.loop import cfg as cfg_policy
from fastvideo3.loop.denoise import HANDOFF_PREFIX
from fastvideo3.loop.protocol import StepResult
from fastvideo3.loop.samplers import SamplerHistory, sampler_step
from fastvideo3.models.wan.components import precision_dtype
from fastvideo3.request.schema import ID_CHARS
from fastvideo3.runtime.adapters import adapter_refs
from fastvideo3.runtime.invariant import bucket_of, cut, pad_rows
from fastvideo3.runtime.workunit import WorkUnit
from fastvideo3.vocab import Role

FETCH_DEADLINE_S = 30.0


def _fail(unit: WorkUnit, exc: BaseException) -> StepResult:
    if isinstance(exc, torch.OutOfMemoryError):  # request-local: the next request may fit
        exc = ResourceExhausted(f"device out of memory: {exc}", field="memory", request_id=unit.request_id)
    info = ErrorInfo.of(exc)
    if info.step is None and unit.step is not None:  # every step failure names its step
        info = ErrorInfo(info.code, info.message, info.field, info.limit, unit.step, info.retry_after_s, info.details)
    return StepResult(unit.unit_id, unit.request_id, ok=False, error=info)


def load_dit(card: ModelCard, device: str, dtype: torch.dtype, component: str = "transformer"):
    """The card's DiT ``component`` (model, weights digest), loaded by its family's weights code."""
    return family_module(card).load_dit(card, device, dtype, component=component)


def _auto_device(device: str | None) -> str:
    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


class _Base:
    role = "base"

    def __init__(self, card: ModelCard, transport, device: str | None = None, precision: str | None = None):
        self.card = card
        self.transport = transport
        self.device = _auto_device(device)
        self.precision = precision or (card.precision.default_cuda if self.device.startswith("cuda") else card.precision.default_cpu)
        self.dtype = precision_dtype(self.precision)
        self.counters: dict[str, float] = {"units": 0, "batches": 0, "failed_units": 0, "busy_seconds": 0.0}
        self.fetch_deadline_s = FETCH_DEADLINE_S  # bound on pulling one input from another pool
        self._lock = threading.RLock()

    def execute(self, batch: list[WorkUnit]) -> list[StepResult]:
        with self._lock:  # time the work only: waiting for the lock is queueing, not busy time
            t0 = time.perf_counter()
            results = self._execute(batch)
            dt = time.perf_counter() - t0
            self.counters["units"] += len(batch)
            self.counters["batches"] += 1
            self.counters["busy_seconds"] += dt
            self.counters["failed_units"] += sum(not r.ok for r in results)
        for r in results:
            r.measured_seconds = dt
        return results

    def _execute(self, batch: list[WorkUnit]) -> list[StepResult]:  # pragma: no cover - abstract
        raise NotImplementedError

    def release(self, request_id: str) -> None:
        self.transport.release(request_id)

    def describe(self) -> dict:
        return {"role": self.role, "card": self.card.model_id, "device": self.device, "precision": self.precision,
                "weights_digest": getattr(self, "weights_digest", ""),
                "counters": dict(self.counters), "transport": self.transport.stats()}


class EncoderExecutor(_Base):
    role = Role.ENCODER

    def __init__(self, card: ModelCard, transport, device=None, precision=None, cache=None):
        super().__init__(card, transport, device, precision)
        self.encoder = family_module(card).TextEncoder(card, self.device, self.dtype)
        self.weights_digest = self.encoder.digest
        self.cache = cache  # optional feature cache (fastvideo3.cache), keyed by a full CacheKey
        # image-to-video cards: the CLIP image encoder runs here too (models/wan/image.py)
        self.image_encoder = None
        if "image_encoder" in card.components:
            from fastvideo3.models.wan.image import ImageEncoder
            self.image_encoder = ImageEncoder(card, self.device, torch.float32)
            self.weights_digest = f"{self.weights_digest}+image_encoder={self.image_encoder.digest}"

    def _execute(self, batch):
        out = []
        for unit in batch:
            try:
                prompts: dict[str, str] = unit.params["prompts"]
                names = list(prompts)
                embeds = self._encode([prompts[n] for n in names], unit.request_id,
                                      tuple(unit.params.get("adapter_versions", ())))
                refs = {n: self.transport.publish(unit.request_id, n, embeds[i : i + 1]) for i, n in enumerate(names)}
                if unit.params.get("image"):
                    img = self._encode_image(unit)
                    refs["image_embeds"] = self.transport.publish(unit.request_id, "image_embeds", img)
                out.append(StepResult(unit.unit_id, unit.request_id, outputs=refs))
            except Exception as e:  # noqa: BLE001 - a unit's failure stays in its result
                out.append(_fail(unit, e))
        return out

    def _encode_image(self, unit: WorkUnit) -> torch.Tensor:
        from fastvideo3.runtime.image_units import image_embeds
        return image_embeds(self, unit)

    def _encode(self, texts: list[str], request_id: str, adapter_versions: tuple[str, ...] = ()) -> torch.Tensor:
        if self.cache is None:
            return self.encoder.encode(texts)
        # the request holds its entries until release; the adapters' versions are in the key, so
        # an entry made under one version is never served to a request running another
        return self.cache.encode(self, texts, request_id, adapter_versions)

    def release(self, request_id: str) -> None:
        if self.cache is not None:
            self.cache.release(request_id)
        super().release(request_id)

    def describe(self) -> dict:
        d = super().describe()
        if self.cache is not None:
            d["cache"] = self.cache.stats()
        return d


@dataclass
class Region:
    """A request's resident data in the denoiser: latent, sampler history, fetched embeddings."""

    latent: torch.Tensor
    history: SamplerHistory
    embeds: dict[str, torch.Tensor] = field(default_factory=dict)
    step: int = 0
    #: interceptor tensors ("policy/stream" -> name -> tensor); their JSON state is in the LoopState
    plugin: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


class DenoiserExecutor(_Base):
    """Runs diffusion steps; batches compatible units across requests into one DiT forward."""

    role = Role.DENOISER

    def __init__(self, card: ModelCard, transport, device=None, precision=None, batching: bool = True,
                 fast: bool | None = None, experts: list[str] | None = None,
                 lora_slots: int = 8, lora_max_rank: int = 64):
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
        # LoRA adapters (fastvideo3.runtime.adapters): a per-row delta on the adapted layers of
        # whichever forward runs (hooks on the reference model, calls inside the fast path)
        from fastvideo3.runtime.adapters import AdapterStore
        shapes, linears, groups = parts.lora_layers(self.dit)
        self.adapters = AdapterStore(shapes, self.device, self.dtype, slots=lora_slots,
                                     max_rank=lora_max_rank, groups=groups)
        self.adapters.hook(self.dit, linears)
        if self.fast:
            self._forward.lora = self.adapters
        # The model as the pool sees it: a runtime export (identity, fingerprint, ports, stages,
        # graphs, state regions), with buckets at the card's default shape until prepare_graphs
        # declares others. Prepared buckets run through its SWAP ports and the "dit" stage.
        from fastvideo3.models.wan.runtime_export import default_buckets
        self._prepared: set[str] = set()
        self.runtime = self._build_runtime(default_buckets(card))
        self.batching = batching
        self.regions: dict[str, Region] = {}
        self.counters.update({"forwards": 0, "rows": 0, "max_batch_rows": 0, "padding_rows": 0})
        self.fault_hook = None  # test hook: fn(unit, latent) -> latent, to inject numeric faults
        #: read-only step observers (behavior capture for rollouts, parity taps):
        #: fn(unit, latent_in, model_output, latent_out), called after each successful step.
        #: They must not mutate the tensors; with none installed the step body is unchanged.
        self.observers: list = []

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
                fetched = self.transport.fetch(ref, deadline_s=self.fetch_deadline_s)
                reg.embeds[name] = fetched.to(self.device, self.dtype)
        # resident only once its inputs arrived: a refused or failed first step leaves nothing behind
        self.regions[unit.request_id] = reg
        return reg

    def release(self, request_id: str) -> None:
        with self._lock:
            self.regions.pop(request_id, None)
        self.adapters.release(request_id)
        super().release(request_id)

    # -- adapters (fastvideo3.runtime.adapters) -----------------------------------------------
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
        from fastvideo3.runtime.adapters import _Entry
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
            from fastvideo3.models.wan.runtime_export import default_buckets
            self.runtime, self._prepared = self._build_runtime(default_buckets(self.card)), set()
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

    # -- snapshot / restore (fastvideo3.runtime.resident) ----------------------------------
    @property
    def identity(self):
        """The identity snapshots are bound to: the model runtime's (weights, precision,
        libraries, device, graph names, state layout, ports, stages)."""
        return self.runtime.identity

    def snapshot(self, request_id: str) -> bytes:
        """The request's latent + sampler history, bound to this pool's fingerprint."""
        from fastvideo3.errors import NotFound
        from fastvideo3.runtime.resident import snapshot_regions
        with self._lock:
            reg = self.regions.get(request_id)
            if reg is None:
                raise NotFound("no resident region for this request", field="request_id")
            return snapshot_regions(self.identity, reg.latent, reg.history, reg.step, plugin=reg.plugin)

    def restore(self, request_id: str, blob: bytes) -> int:
        """Replace the request's region with a snapshot (same fingerprint only); returns its step.
        Embeddings are fetched again by the next step (its unit names them)."""
        from fastvideo3.runtime.resident import restore_regions
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
        d["graph_buckets"] = sorted(self._prepared)
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

    def prepare_graphs(self, rows_and_latent_shapes, text_len: int | None = None) -> None:
        """Declare the shape buckets ``(rows, (C, F, H, W))`` (rows = samples x CFG branches in one
        forward; one latent shape per call) and capture them through the model runtime. Warm phase
        only: a step replays a prepared bucket and runs any other shape eagerly, never capturing.
        Declaring other buckets re-plans the runtime (a new fingerprint), so it is refused while
        requests are resident. The reference (non-fast) path keeps no graphs."""
        from fastvideo3.errors import FailedPrecondition
        from fastvideo3.models.wan.runtime_export import DitBucket
        if not self.fast:
            return
        if not getattr(self._forward, "capturable", True):
            raise FailedPrecondition(f"card {self.card.model_id}'s DiT forward cannot be captured in a CUDA graph "
                                     "(it reads per-row text lengths on the host); it runs eagerly", field="buckets")
        text_len = text_len or self.card.max_text_tokens
        buckets = tuple(DitBucket(int(r), tuple(int(d) for d in shape), text_len)
                        for r, shape in rows_and_latent_shapes)
        with self._lock:
            declared = {b for b in self.runtime.ports["latents"].bucket_shapes}
            if not {b.key for b in buckets} <= declared:
                if self.regions:
                    raise FailedPrecondition("new shape buckets change the runtime fingerprint; "
                                             "declare them before requests are resident", field="buckets")
                new = self._build_runtime(buckets)
                self.runtime.release()
                self.runtime, self._prepared = new, set()
            for b in buckets:
                self.runtime.prepare(b.key)
                self._prepared.add(b.key)

    def _dit(self, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor, expert: str | None = None,
             image: torch.Tensor | None = None) -> torch.Tensor:
        from fastvideo3.models.wan.runtime_export import bucket_key
        if image is not None:  # image-to-video: eager (the runtime export's ports carry no image yet)
            return self._forwards[expert or self.experts[0]](x, t, text, image=image)
        if expert is not None and expert != self.experts[0]:
            return self._forwards[expert](x, t, text)  # the runtime export covers the first expert
        key = bucket_key(x.shape[0], x.shape[1:], text.shape[1])
        if key not in self._prepared or text.shape[2] != self.dit.cfg.text_dim or self.adapters.active:
            return self._forward(x, t, text)  # eager: captured graphs hold no adapter deltas
        rt = self.runtime
        rt.prepare(key)  # selects the prepared bucket; captures nothing
        rt.set_input("latents", x)
        rt.set_input("timestep", t)
        rt.set_input("text", text)
        rt.fire("dit")
        # the output window is rewritten by the next replay: keep a copy
        return rt.get_output("noise_pred").clone()

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
        for key, members in groups.items():
            for chunk in cut(members, key[-1], self.batching):  # bucket-sized in batch-invariant mode
                self._run(chunk, results)
        return [results[u.unit_id] for u in batch]

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
    def _run(self, chunk: list[tuple[WorkUnit, Region]], results: dict[str, StepResult]) -> None:
        policy = chunk[0][0].params["cfg_policy"]
        branches = cfg_policy.branches(policy)
        # one forward per branch (classic) or one for all branches (batched / none)
        passes = [branches] if policy in ("batched", "none") else [(b,) for b in branches]
        preds: list[dict[str, torch.Tensor]] = [{} for _ in chunk]
        intercepted = any(unit.params.get("cache") for unit, _ in chunk)
        bucket = bucket_of(chunk[0][0])
        # each request's interceptor state for this step: a copy of its LoopState's, returned updated
        plugin_states = [copy.deepcopy(unit.params.get("plugin_state") or {}) for unit, _ in chunk]
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
            with self.adapters.batch(rows):
                if intercepted:
                    out = self._dit_intercepted(x, t, text, index, chunk, "+".join(branch_set), plugin_states,
                                                chunk[0][0].params.get("expert"), fixed_rows=bucket is not None)
                else:
                    out = self._dit(x, t, text, chunk[0][0].params.get("expert"), image=image)
            self._count_forward(len(index), pad)
            for row, (i, b) in enumerate(index):
                preds[i][b] = out[row : row + 1]
        for i, (unit, reg) in enumerate(chunk):
            try:
                p = unit.params
                noise = cfg_policy.combine(policy, preds[i], float(p["guidance"]))
                new = sampler_step(p["sampler"], reg.history, noise, reg.latent, int(p["step"]), p["sigmas"])
                if self.fault_hook is not None:
                    new = self.fault_hook(unit, new)
                if not bool(torch.isfinite(new).all()):
                    raise NumericFault("latents became non-finite", step=int(p["step"]), request_id=unit.request_id)
                for observe in self.observers:
                    observe(unit, reg.latent, noise, new)
                reg.latent = new
                reg.step += 1
                res = StepResult(unit.unit_id, unit.request_id,
                                 metrics={"latent_norm": float(new.float().norm()), "finite": 1.0,
                                          "batch_rows": float(len(chunk) * len(branches))})
                if p.get("cache"):
                    res.payload["plugin_state"] = plugin_states[i]
                if p.get("final"):
                    res.outputs["latents"] = self.transport.publish(unit.request_id, "latents", new)
                if p.get("handoff") and any(e not in self.dits for e in self.card.dit_components()):
                    self._hand_off(unit, reg, res)  # the next step's expert lives in another pool
                results[unit.unit_id] = res
            except Exception as e:  # noqa: BLE001 - request-local fault
                self.regions.pop(unit.request_id, None)
                results[unit.unit_id] = _fail(unit, e)


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
        out = staged_forward(forward, x, t, text, groups + padding, fixed_rows=fixed_rows)
        n_blocks = forward.num_blocks
        for g in groups:
            if g.view is not None:  # block evaluations, counted per row
                g.view.state["blocks_computed"] = g.view.state.get("blocks_computed", 0) + g.blocks_run * len(g.rows)
                g.view.state["blocks_total"] = g.view.state.get("blocks_total", 0) + n_blocks * len(g.rows)
            self.counters["blocks_computed"] = self.counters.get("blocks_computed", 0) + g.blocks_run * len(g.rows)
            self.counters["blocks_total"] = self.counters.get("blocks_total", 0) + n_blocks * len(g.rows)
        return out


#: the decoder pool's executor and its frame helpers live in fastvideo3.runtime.vae_executor
_MOVED = ("DecoderExecutor", "FRAME_DTYPES", "MEDIA_FORMATS", "encode_media", "frames_as_float", "frames_for_transport")


def __getattr__(name: str):  # the old import path of the moved names keeps working
    if name in _MOVED:
        from fastvideo3.runtime import vae_executor
        return getattr(vae_executor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
