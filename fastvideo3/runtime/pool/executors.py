"""In-process executors: the encoder's here, the denoiser's in dit_executor.py, the decoder's in
vae_executor.py (both importable from here too), and what they share (:class:`_Base`).

Each executor owns its component's weights and the pool-resident data of the requests it serves,
keyed by request id: nothing per request lives anywhere else. Tensors leave an executor only as
references published on its transport; results carry references and a few numbers.
"""
from __future__ import annotations

import threading
import time

import torch

from fastvideo3.card.family import family_module
from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import ErrorInfo, ResourceExhausted
from fastvideo3.loop.protocol import StepResult
from fastvideo3.models.wan.components import precision_dtype
from fastvideo3.runtime.pool.profiling import BatchProfiler, window_from_env
from fastvideo3.runtime.scheduling.workunit import WorkUnit
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
        self._busy_lock = threading.Lock()  # the batch counters, updated after the executor's lock
        self._busy_until = 0.0  # when the latest counted batch ended (perf_counter)
        # FASTVIDEO3_PROFILE_BATCHES=DIR,START,COUNT: a torch profile of a window of batches
        window = window_from_env()
        self._profiler = BatchProfiler(window, self.role) if window is not None else None

    def execute(self, batch: list[WorkUnit]) -> list[StepResult]:
        """The batch's work under the executor's lock. ``_execute`` returns its results, or a
        callable that completes them (e.g. the denoiser's one host read of the batch's device
        results): that part runs after the lock is released, so a batch sent beside this one
        starts queueing its device work meanwhile. ``busy_seconds`` counts the union of the
        batches' times, so the two never count twice."""
        with self._lock:  # time the work only: waiting for the lock is queueing, not busy time
            t0 = time.perf_counter()
            if self._profiler is not None:
                with self._profiler.batch():
                    results = self._execute(batch)
                    if callable(results):  # a profiled batch completes inside its window
                        results = results()
            else:
                results = self._execute(batch)
        if callable(results):
            results = results()
        end = time.perf_counter()
        dt = end - t0
        with self._busy_lock:
            self.counters["units"] += len(batch)
            self.counters["batches"] += 1
            self.counters["busy_seconds"] += max(0.0, end - max(t0, self._busy_until))
            self._busy_until = max(self._busy_until, end)
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
        from fastvideo3.runtime.pool.image_units import image_embeds
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


#: the decoder pool's executor and its frame helpers live in fastvideo3.runtime.pool.vae_executor
_MOVED = ("DecoderExecutor", "FRAME_DTYPES", "MEDIA_FORMATS", "encode_media", "frames_as_float", "frames_for_transport")


#: the denoiser's executor lives in fastvideo3.runtime.pool.dit_executor (which imports this module)
_MOVED_DIT = ("DenoiserExecutor", "Region")


def __getattr__(name: str):  # the old import path of the moved names keeps working (resolved lazily)
    if name in _MOVED:
        from fastvideo3.runtime.pool import vae_executor
        return getattr(vae_executor, name)
    if name in _MOVED_DIT:
        from fastvideo3.runtime.pool import dit_executor
        return getattr(dit_executor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
