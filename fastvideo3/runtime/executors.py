"""In-process executors for the encoder, denoiser and decoder roles.

Each executor owns its component's weights and the pool-resident data of the requests it serves,
keyed by request id: nothing per request lives anywhere else. Tensors leave an executor only as
references published on its transport; results carry references and a few numbers.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import ErrorInfo, FastVideoError, InvalidRequest, NumericFault, ResourceExhausted, Unavailable
from fastvideo3.loop import cfg as cfg_policy
from fastvideo3.loop.protocol import StepResult
from fastvideo3.loop.samplers import SamplerHistory, sampler_step
from fastvideo3.models.wan.components import TextEncoder, VideoDecoder, load_dit, precision_dtype
from fastvideo3.runtime.workunit import WorkUnit
from fastvideo3.transport.ref import TensorRef

FETCH_DEADLINE_S = 30.0


def _fail(unit: WorkUnit, exc: BaseException) -> StepResult:
    if isinstance(exc, torch.OutOfMemoryError):  # request-local: the next request may fit
        exc = ResourceExhausted(f"device out of memory: {exc}", field="memory", request_id=unit.request_id)
    info = ErrorInfo.of(exc)
    if info.step is None and unit.step is not None:  # every step failure names its step
        info = ErrorInfo(info.code, info.message, info.field, info.limit, unit.step, info.retry_after_s, info.details)
    return StepResult(unit.unit_id, unit.request_id, ok=False, error=info)


def _ref(d: dict) -> TensorRef:
    return TensorRef.from_dict(d)


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
    role = "encoder"

    def __init__(self, card: ModelCard, transport, device=None, precision=None, cache=None):
        super().__init__(card, transport, device, precision)
        self.encoder = TextEncoder(card, self.device, self.dtype)
        self.weights_digest = self.encoder.digest
        self.cache = cache  # optional feature cache (fastvideo3.cache), keyed by a full CacheKey

    def _execute(self, batch):
        out = []
        for unit in batch:
            try:
                prompts: dict[str, str] = unit.params["prompts"]
                names = list(prompts)
                embeds = self._encode([prompts[n] for n in names], unit.request_id)
                refs = {n: self.transport.publish(unit.request_id, n, embeds[i : i + 1]).to_dict()
                        for i, n in enumerate(names)}
                out.append(StepResult(unit.unit_id, unit.request_id, outputs=refs))
            except Exception as e:  # noqa: BLE001 - a unit's failure stays in its result
                out.append(_fail(unit, e))
        return out

    def _encode(self, texts: list[str], request_id: str) -> torch.Tensor:
        if self.cache is None:
            return self.encoder.encode(texts)
        return self.cache.encode(self, texts, request_id)  # the request holds its entries until release

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


class DenoiserExecutor(_Base):
    """Runs diffusion steps; batches compatible units across requests into one DiT forward."""

    role = "denoiser"

    def __init__(self, card: ModelCard, transport, device=None, precision=None, batching: bool = True,
                 fast: bool | None = None):
        super().__init__(card, transport, device, precision)
        self.dit, self.weights_digest = load_dit(card, self.device, self.dtype)
        # The fast path (fused kernels; CUDA graphs for buckets captured by prepare_graphs) is the
        # default on CUDA only: on a CPU the executor runs the reference DiT, exactly as before.
        self.fast = self.device.startswith("cuda") if fast is None else bool(fast)
        self._forward = self.dit
        self.graphs = None
        if self.fast:
            from fastvideo3.export import GraphRunner
            from fastvideo3.models.wan.fast import FastWanDiT
            self._forward = FastWanDiT(self.dit)
            self.graphs = GraphRunner("denoiser.dit")
        self.batching = batching
        self.regions: dict[str, Region] = {}
        self.counters.update({"forwards": 0, "rows": 0, "max_batch_rows": 0})
        self.fault_hook = None  # test hook: fn(unit, latent) -> latent, to inject numeric faults
        #: read-only step observers (behavior capture for rollouts, parity taps):
        #: fn(unit, latent_in, model_output, latent_out), called after each successful step.
        #: They must not mutate the tensors; with none installed the step body is unchanged.
        self.observers: list = []

    # -- region lifecycle --------------------------------------------------------------
    def _region(self, unit: WorkUnit) -> Region:
        reg = self.regions.get(unit.request_id)
        p = unit.params
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
        for name, d in unit.inputs.items():
            if name not in reg.embeds:  # fetched once per request, reused across steps
                fetched = self.transport.fetch(_ref(d), deadline_s=self.fetch_deadline_s)
                reg.embeds[name] = fetched.to(self.device, self.dtype)
        # resident only once its inputs arrived: a refused or failed first step leaves nothing behind
        self.regions[unit.request_id] = reg
        return reg

    def release(self, request_id: str) -> None:
        with self._lock:
            self.regions.pop(request_id, None)
        super().release(request_id)

    # -- snapshot / restore (fastvideo3.runtime.resident) ----------------------------------
    @property
    def identity(self):
        """The runtime identity snapshots are bound to (weights, precision, libraries, device)."""
        if getattr(self, "_identity", None) is None:
            from fastvideo3.runtime.resident import pool_identity
            self._identity = pool_identity(self.weights_digest, self.precision, self.device)
        return self._identity

    def snapshot(self, request_id: str) -> bytes:
        """The request's latent + sampler history, bound to this pool's fingerprint."""
        from fastvideo3.errors import NotFound
        from fastvideo3.runtime.resident import snapshot_regions
        with self._lock:
            reg = self.regions.get(request_id)
            if reg is None:
                raise NotFound("no resident region for this request", field="request_id")
            return snapshot_regions(self.identity, reg.latent, reg.history, reg.step)

    def restore(self, request_id: str, blob: bytes) -> int:
        """Replace the request's region with a snapshot (same fingerprint only); returns its step.
        Embeddings are fetched again by the next step (its unit names them)."""
        from fastvideo3.runtime.resident import restore_regions
        latent, history, step = restore_regions(self.identity, blob, self.device)
        with self._lock:
            self.regions[request_id] = Region(latent=latent, history=history, step=step)
        return step

    def describe(self) -> dict:
        d = super().describe()
        d["resident_regions"] = len(self.regions)
        d["weights_digest"] = self.weights_digest
        d["dit_path"] = "fast" if self.fast else "reference"
        d["graph_buckets"] = [list(map(list, k)) for k in self.graphs.buckets] if self.graphs else []
        return d

    # -- warm phase: CUDA graphs per shape bucket ----------------------------------------
    def prepare_graphs(self, rows_and_latent_shapes, text_len: int | None = None) -> None:
        """Capture the DiT forward for each ``(rows, (C, F, H, W))`` bucket (rows = samples x CFG
        branches in one forward). Warm phase only: a step replays a prepared bucket and runs
        any other shape eagerly, never capturing."""
        if self.graphs is None:
            return
        text_len = text_len or self.card.max_text_tokens
        text_dim = self.dit.cfg.text_dim
        for rows, shape in rows_and_latent_shapes:
            static = {
                "latents": torch.zeros(rows, *shape, dtype=self.dtype, device=self.device),
                "timestep": torch.zeros(rows, dtype=torch.float32, device=self.device),
                "text": torch.zeros(rows, text_len, text_dim, dtype=self.dtype, device=self.device),
            }
            key = (tuple(static["latents"].shape), tuple(static["text"].shape))
            with self._lock:
                self.graphs.prepare(key, self._forward, static)

    def _dit(self, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), tuple(text.shape))
        if self.graphs is not None and key in self.graphs:
            # the graph's output buffer is rewritten by the next replay: keep a copy
            return self.graphs.step(key, {"latents": x, "timestep": t, "text": text}).clone()
        return self._forward(x, t, text)

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
            groups.setdefault((unit.shape_sig, unit.params["cfg_policy"]), []).append((unit, reg))
        for members in groups.values():
            chunks = [members] if self.batching else [[m] for m in members]
            for chunk in chunks:
                self._run(chunk, results)
        return [results[u.unit_id] for u in batch]

    def _validate(self, unit: WorkUnit) -> None:
        p = unit.params
        if p.get("cfg_policy") not in cfg_policy.POLICIES:
            raise InvalidRequest(f"unknown cfg policy {p.get('cfg_policy')!r}", field="cfg_policy")
        needed = {"prompt_embeds"} | ({"negative_embeds"} if p["cfg_policy"] != "none" else set())
        if not needed <= set(unit.inputs) | set(self.regions.get(unit.request_id, Region(torch.empty(0), SamplerHistory())).embeds):
            raise InvalidRequest(f"missing inputs {sorted(needed - set(unit.inputs))}", field="inputs")

    @torch.no_grad()
    def _run(self, chunk: list[tuple[WorkUnit, Region]], results: dict[str, StepResult]) -> None:
        policy = chunk[0][0].params["cfg_policy"]
        names = {"cond": "prompt_embeds", "uncond": "negative_embeds"}
        branches = cfg_policy.branches(policy)
        # one forward per branch (classic) or one for all branches (batched / none)
        passes = [branches] if policy in ("batched", "none") else [(b,) for b in branches]
        preds: list[dict[str, torch.Tensor]] = [{} for _ in chunk]
        for branch_set in passes:
            lat, ts, txt, index = [], [], [], []
            for i, (unit, reg) in enumerate(chunk):
                for b in branch_set:
                    lat.append(reg.latent)
                    ts.append(float(unit.params["timestep"]))
                    txt.append(reg.embeds[names[b]])
                    index.append((i, b))
            x = torch.cat(lat).to(self.dtype)
            t = torch.tensor(ts, dtype=torch.float32, device=self.device)
            out = self._dit(x, t, torch.cat(txt))
            self.counters["forwards"] += 1
            self.counters["rows"] += len(index)
            self.counters["max_batch_rows"] = max(self.counters["max_batch_rows"], len(index))
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
                if p.get("final"):
                    res.outputs["latents"] = self.transport.publish(unit.request_id, "latents", new).to_dict()
                results[unit.unit_id] = res
            except Exception as e:  # noqa: BLE001 - request-local fault
                self.regions.pop(unit.request_id, None)
                results[unit.unit_id] = _fail(unit, e)


FRAME_DTYPES = ("uint8", "float32")


def frames_for_transport(frames: torch.Tensor, dtype: str) -> torch.Tensor:
    """Frames in ``[0, 1]`` as published: ``uint8`` (round(255 x), 4x fewer bytes, what a video
    encoder keeps anyway) or ``float32`` (exact)."""
    if dtype == "float32":
        return frames.float().contiguous()
    return frames.float().clamp(0.0, 1.0).mul(255.0).round_().to(torch.uint8).contiguous()


def frames_as_float(frames: torch.Tensor) -> torch.Tensor:
    """Fetched frames as float32 in ``[0, 1]``, whichever dtype crossed the wire."""
    if frames.dtype == torch.uint8:
        return frames.float().div_(255.0)
    return frames.float()


class DecoderExecutor(_Base):
    """Decodes latents into frames ``[F, H, W, 3]`` in ``[0, 1]`` and publishes them.

    Frames cross pools as ``uint8`` (``frames_dtype="auto"``: uint8 whenever the publishing
    backend moves bytes, float32 over ``inproc``, where nothing is copied). A consumer that needs
    the exact floats asks with the unit param ``frames_dtype="float32"``. The encoded file (the
    ``encode`` param) is always made from the float frames. Latents and embeddings keep their
    dtype everywhere.
    """

    role = "decoder"

    def __init__(self, card: ModelCard, transport, device=None, precision=None, frames_dtype: str = "auto"):
        # the VAE decodes in fp32 on CPU and keeps fp32 by default (as the reference pipeline's VAE does)
        super().__init__(card, transport, device, precision or "fp32")
        if frames_dtype not in ("auto",) + FRAME_DTYPES:
            raise InvalidRequest(f"unknown frames dtype {frames_dtype!r}", field="frames_dtype",
                                 limit="auto, " + ", ".join(FRAME_DTYPES))
        self.frames_dtype = frames_dtype
        self.vae = VideoDecoder(card, self.device, self.dtype)
        self.weights_digest = self.vae.digest

    def _frames_dtype(self, unit) -> str:
        asked = unit.params.get("frames_dtype") or self.frames_dtype
        if asked not in ("auto",) + FRAME_DTYPES:
            raise InvalidRequest(f"unknown frames dtype {asked!r}", field="frames_dtype",
                                 limit=", ".join(FRAME_DTYPES))
        if asked == "auto":
            return "float32" if getattr(self.transport, "backend", "") == "inproc" else "uint8"
        return asked

    def _execute(self, batch):
        out = []
        for unit in batch:
            try:
                latent = self.transport.fetch(_ref(unit.inputs["latents"]), deadline_s=self.fetch_deadline_s)
                frames = self.vae.decode(latent)[0].contiguous()  # [F, H, W, 3] float32 in [0, 1]
                wire = frames_for_transport(frames, self._frames_dtype(unit))
                ref = self.transport.publish(unit.request_id, "frames", wire)
                res = StepResult(unit.unit_id, unit.request_id, outputs={"frames": ref.to_dict()},
                                 payload={"frames_shape": list(frames.shape), "frames_dtype": ref.dtype})
                fmt = unit.params.get("encode")
                if fmt:  # the pool encodes the file itself; only its bytes travel back
                    res.inline = encode_media(frames.numpy(), fmt, int(unit.params.get("fps", self.card.limits.fps)))
                    res.payload.update({"media_format": fmt, "media_bytes": len(res.inline)})
                out.append(res)
            except Exception as e:  # noqa: BLE001
                out.append(_fail(unit, e))
        return out


MEDIA_FORMATS = ("mp4", "npy")


def encode_media(frames, fmt: str, fps: int) -> bytes:
    """Encode frames ([F, H, W, 3] float in [0, 1]) as an mp4 or npy file and return its bytes."""
    import tempfile
    from pathlib import Path

    from fastvideo3.media import save_video
    if fmt not in MEDIA_FORMATS:
        raise InvalidRequest(f"unknown output format {fmt!r}", field="output_format", limit=", ".join(MEDIA_FORMATS))
    with tempfile.TemporaryDirectory(prefix="fv3-media-") as tmp:
        path = Path(tmp) / f"video.{fmt}"
        save_video(frames, path, fps=fps)
        return path.read_bytes()
