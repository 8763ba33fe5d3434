"""The decoder pool's executor: latents in, frames (and optionally an encoded file) out.

A batch from the scheduler holds ``vae_tile`` units of several requests (the planner batches
units of one shape signature). The executor fetches every unit's latent, groups them by latent
shape and decodes each group in one VAE call, ``max_decode_batch`` latents at a time; a call that
runs out of device memory is split in halves and retried, down to one latent, before the unit
fails with RESOURCE_EXHAUSTED. Each request's frames are its own row of the batched call, equal to
decoding it alone (within rounding on CUDA; bit-equal on a CPU, where a family's decoder
decodes a call's rows one by one: tests/unit/test_vae_batch.py).

The VAE runs in the card's decode precision (``precision.vae_cuda`` / ``precision.vae_cpu``, fp32
unless the card allows bf16) unless the pool is given another; on CUDA it takes the fast decode
of :mod:`fastvideo3.models.wan.vae_decode`. That path autotunes cuDNN per convolution shape, which
costs seconds the first time a shape (latent size x batch) is decoded; the warm phase
(:meth:`DecoderExecutor.warm_decode`) pays it before the pool serves, for the card's bucket shapes
at each decode batch size, instead of inside the first requests' decodes.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from fastvideo3.card.family import family_module, family_of
from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import InvalidRequest, ResourceExhausted
from fastvideo3.loop.protocol import StepResult
from fastvideo3.runtime.pool.executors import _Base, _fail
from fastvideo3.vocab import OUTPUT_FORMATS, OutputFormat, Role, UnitKind

FRAME_DTYPES = ("uint8", "float32")
MEDIA_FORMATS = OUTPUT_FORMATS
#: latents per VAE call when the pool is given no other bound
DEFAULT_DECODE_BATCH = 4
MAX_DECODE_BATCH = 64
#: the warm phase's decoder modes (``--decode-warm``): nothing, or the card's bucket shapes
DECODE_WARM_MODES = ("off", "card")
#: the warm phase decodes a bucket shape at every batch size whose call holds at most this many
#: video frames x pixels (one 81x480x832 clip; a larger shape warms at batch 1 only)
WARM_PIXEL_BUDGET = 81 * 480 * 832
#: files of one decode batch encoded at once (an mp4 is an ffmpeg process: they run side by side;
#: a 17x256^2 clip takes about 0.15 s, so a batch's files one after another held its reply)
ENCODE_WORKERS = 8

log = logging.getLogger("fastvideo3.decoder")


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


def warm_plan(card: ModelCard, max_decode_batch: int) -> list[tuple[tuple[int, int, int], tuple[int, ...], list[int]]]:
    """What the warm phase decodes: per graph-bucket shape of ``card``, ``((frames, height, width),
    latent shape without batch, batch sizes)`` -- 1..``max_decode_batch`` while a call holds at most
    :data:`WARM_PIXEL_BUDGET` frames x pixels, and batch 1 for a shape larger than that."""
    fam = family_of(card)
    plan = []
    for s in card.graph_buckets.shapes:
        fit = WARM_PIXEL_BUDGET // (s.frames * s.height * s.width)
        plan.append(((s.frames, s.height, s.width), tuple(fam.latent_shape(card, s.frames, s.height, s.width)),
                     list(range(1, max(1, min(max_decode_batch, fit)) + 1))))
    return plan


class DecoderExecutor(_Base):
    """Decodes latents into frames ``[F, H, W, 3]`` in ``[0, 1]`` and publishes them.

    Frames cross pools as ``uint8`` (``frames_dtype="auto"``: uint8 whenever the publishing
    backend moves bytes, float32 over ``inproc``, where nothing is copied). A consumer that needs
    the exact floats asks with the unit param ``frames_dtype="float32"``. The encoded file (the
    ``encode`` param) is always made from the float frames. Latents and embeddings keep their
    dtype everywhere.
    """

    role = Role.DECODER

    def __init__(self, card: ModelCard, transport, device=None, precision=None, frames_dtype: str = "auto",
                 max_decode_batch: int = DEFAULT_DECODE_BATCH, fast: bool | None = None):
        from fastvideo3.runtime.pool.executors import _auto_device
        dev = _auto_device(device)
        # the card's decode precision for the device (fp32 unless it declares bf16)
        super().__init__(card, transport, dev, precision or card.precision.vae_for(dev))
        if frames_dtype not in ("auto",) + FRAME_DTYPES:
            raise InvalidRequest(f"unknown frames dtype {frames_dtype!r}", field="frames_dtype",
                                 limit="auto, " + ", ".join(FRAME_DTYPES))
        if isinstance(max_decode_batch, bool) or not isinstance(max_decode_batch, int) \
                or not 1 <= max_decode_batch <= MAX_DECODE_BATCH:
            raise InvalidRequest(f"{max_decode_batch!r}", field="max_decode_batch", limit=f"1..{MAX_DECODE_BATCH}")
        self.frames_dtype = frames_dtype
        self.max_decode_batch = max_decode_batch
        self.vae = family_module(card).VideoDecoder(card, self.device, self.dtype, fast=fast)
        self.weights_digest = self.vae.digest
        self.counters.update({"decode_calls": 0, "decoded_latents": 0, "max_decode_batch_seen": 0, "oom_splits": 0,
                              "decode_seconds": 0.0, "publish_seconds": 0.0, "encode_seconds": 0.0})
        #: the warm phase's record, one entry per bucket shape (Describe's diagnostics "decode_warm")
        self.warmed: list[dict] = []
        # Every VAE call (the warm phase's too) runs on this one thread. PyTorch keeps cuDNN's
        # autotuned convolution plans per thread, so a decode on any other thread (each gRPC worker)
        # tuned every convolution again, ~1-3 s per batch size and thread (H200: a 4-latent
        # 17x256^2 decode took 1.15 s in the pool against 0.11 s once tuned).
        self._vae_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.role}-vae")
        self._encode_pool = ThreadPoolExecutor(max_workers=ENCODE_WORKERS, thread_name_prefix=f"{self.role}-encode")
        self._count_lock = self._busy_lock  # one lock for the counters the batches update outside the executor's
        #: per calling thread: the encode futures of the batch that thread is executing
        self._encoding = threading.local()

    def on_vae_thread(self, fn, *args):
        """``fn(*args)`` on the executor's VAE thread (where cuDNN's tuned plans live); its result."""
        return self._vae_thread.submit(fn, *args).result()

    def warm_decode(self, mode: str = "card") -> list[dict]:
        """The warm phase: on CUDA's fast path, decode zeros of each of the card's graph-bucket
        shapes at every batch size 1..``max_decode_batch`` within :data:`WARM_PIXEL_BUDGET`, so cuDNN
        has tuned those convolution shapes before a request's decode meets them. Nothing elsewhere
        (a CPU, the reference path, ``mode="off"``). A batch size that runs out of memory ends that
        shape's warm-up (its decodes tune on first use). Returns ``[{frames, height, width,
        batches, seconds}]``."""
        if mode not in DECODE_WARM_MODES:
            raise InvalidRequest(f"unknown decode warm mode {mode!r}", field="decode_warm",
                                 limit=", ".join(DECODE_WARM_MODES))
        self.warmed = []
        if mode == "off" or not self.vae.fast or not str(self.device).startswith("cuda"):
            return self.warmed
        for (frames, height, width), latent, batches in warm_plan(self.card, self.max_decode_batch):
            done, t0 = [], time.perf_counter()
            for b in batches:
                try:
                    self.on_vae_thread(self.vae.decode, torch.zeros((b, *latent), device=self.device, dtype=self.dtype))
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    break
                done.append(b)
            self.on_vae_thread(torch.cuda.synchronize, self.device)
            rec = {"frames": frames, "height": height, "width": width, "batches": done,
                   "seconds": round(time.perf_counter() - t0, 3)}
            log.info("decode warmed %dx%dx%d at batch sizes %s in %.2f s", frames, height, width, done, rec["seconds"])
            self.warmed.append(rec)
        return self.warmed

    def _frames_dtype(self, unit) -> str:
        asked = unit.params.get("frames_dtype") or self.frames_dtype
        if asked not in ("auto",) + FRAME_DTYPES:
            raise InvalidRequest(f"unknown frames dtype {asked!r}", field="frames_dtype",
                                 limit=", ".join(FRAME_DTYPES))
        if asked == "auto":
            return "float32" if getattr(self.transport, "backend", "") == "inproc" else "uint8"
        return asked

    def _execute(self, batch):
        results: dict[str, StepResult] = {}
        groups: dict[tuple, list[tuple]] = {}
        for unit in batch:  # fetch and validate each unit on its own: one bad unit fails alone
            if unit.kind == UnitKind.VAE_ENCODE:  # image-to-video: the first-frame image latent
                try:
                    from fastvideo3.runtime.pool.image_units import vae_encode
                    results[unit.unit_id] = vae_encode(self, unit)
                except Exception as e:  # noqa: BLE001
                    results[unit.unit_id] = _fail(unit, e)
                continue
            try:
                wire = self._frames_dtype(unit)
                latent = self.transport.fetch(unit.inputs["latents"], deadline_s=self.fetch_deadline_s)
                groups.setdefault((tuple(latent.shape[1:]), str(latent.dtype)), []).append((unit, latent, wire))
            except Exception as e:  # noqa: BLE001
                results[unit.unit_id] = _fail(unit, e)
        # (unit, its file's encode future): awaited by execute after the lock, or here when
        # called without it
        outer = getattr(self._encoding, "pending", None)
        pending: list[tuple] = outer if outer is not None else []
        for members in groups.values():
            for i in range(0, len(members), self.max_decode_batch):
                self._decode_group(members[i : i + self.max_decode_batch], results, pending)
        if outer is None:
            for unit, fut in pending:
                try:
                    fut.result()
                except Exception as e:  # noqa: BLE001 - the unit's failure
                    results[unit.unit_id] = _fail(unit, e)
        return [results[u.unit_id] for u in batch]

    def execute(self, batch):
        """The batch's VAE calls and frames under the executor's lock; its files' encodes (ffmpeg
        processes on the encode threads) are awaited after it, so a batch sent beside this one
        (the scheduler keeps two decode batches at a replica) makes its VAE calls meanwhile."""
        self._encoding.pending = pending = []
        try:
            results = super().execute(batch)
        finally:
            self._encoding.pending = None
        index = {u.unit_id: i for i, u in enumerate(batch)}
        for unit, fut in pending:
            try:
                fut.result()
            except Exception as e:  # noqa: BLE001 - the unit's failure
                i = index[unit.unit_id]
                failed = _fail(unit, e)
                failed.measured_seconds = getattr(results[i], "measured_seconds", 0.0)
                results[i] = failed
                with self._count_lock:
                    self.counters["failed_units"] += 1
        return results

    def _decode_group(self, members: list[tuple], results: dict[str, StepResult], pending: list) -> None:
        """One VAE call for ``members`` (same latent shape); halves on device OOM. Each member's
        file (its ``encode`` param) is submitted to the encode threads; ``pending`` gets the futures."""
        try:
            frames = self._decode([lat for _, lat, _ in members])
        except torch.OutOfMemoryError as e:
            if len(members) == 1:
                unit = members[0][0]
                results[unit.unit_id] = _fail(unit, ResourceExhausted(
                    f"device out of memory decoding one latent of shape {list(members[0][1].shape)}: {e}",
                    field="memory", request_id=unit.request_id))
                return
            self.counters["oom_splits"] += 1
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            half = len(members) // 2
            self._decode_group(members[:half], results, pending)
            self._decode_group(members[half:], results, pending)
            return
        except Exception as e:  # noqa: BLE001 - the call's failure is each member's
            for unit, _, _ in members:
                results[unit.unit_id] = _fail(unit, e)
            return
        for (unit, _, wire), f in zip(members, frames):
            # a row of a batched call is cloned: its frames must not pin the whole batch's memory
            f = f.clone() if len(members) > 1 else f
            try:
                results[unit.unit_id] = self._publish(unit, f, wire)
            except Exception as e:  # noqa: BLE001
                results[unit.unit_id] = _fail(unit, e)
                continue
            if unit.params.get("encode"):  # encoded beside the next group's decode and the other files
                pending.append((unit, self._encode_pool.submit(self._encode, results[unit.unit_id], unit, f)))

    def _decode(self, latents: list[torch.Tensor]) -> torch.Tensor:
        t0 = time.perf_counter()
        z = latents[0] if len(latents) == 1 else torch.cat([x.to(latents[0].device) for x in latents])
        frames = self.on_vae_thread(self.vae.decode, z)  # [B, F, H, W, 3] float32 in [0, 1]
        self.counters["decode_seconds"] += time.perf_counter() - t0
        self.counters["decode_calls"] += 1
        self.counters["decoded_latents"] += len(latents)
        self.counters["max_decode_batch_seen"] = max(self.counters["max_decode_batch_seen"], len(latents))
        return frames

    def _publish(self, unit, frames: torch.Tensor, wire_dtype: str) -> StepResult:
        t0 = time.perf_counter()
        ref = self.transport.publish(unit.request_id, "frames", frames_for_transport(frames, wire_dtype))
        res = StepResult(unit.unit_id, unit.request_id, outputs={"frames": ref},
                         payload={"frames_shape": list(frames.shape), "frames_dtype": ref.dtype})
        self.counters["publish_seconds"] += time.perf_counter() - t0
        return res

    def _encode(self, res: StepResult, unit, frames: torch.Tensor) -> None:
        """The file the unit's ``encode`` param names, made by the pool itself into ``res.inline``
        (only its bytes travel back). Runs on the encode threads, one per file of a batch."""
        t0 = time.perf_counter()
        fmt = unit.params["encode"]
        res.inline = encode_media(frames.numpy(), fmt, int(unit.params.get("fps", self.card.limits.fps)))
        res.payload.update({"media_format": fmt, "media_bytes": len(res.inline)})
        with self._count_lock:
            self.counters["encode_seconds"] += time.perf_counter() - t0  # summed over the batch's files

    def describe(self) -> dict:
        d = super().describe()
        d["decode"] = {"max_decode_batch": self.max_decode_batch, "fast": self.vae.fast,
                       "time_chunk": self.vae.time_chunk, "channels_last": self.vae.channels_last,
                       "fused": self.vae.fused}
        d["decode_warm"] = [dict(w) for w in self.warmed]
        return d


def encode_media(frames, fmt: str, fps: int) -> bytes:
    """Encode frames ([F, H, W, 3] float in [0, 1]) as an mp4 or npy file and return its bytes."""
    import tempfile
    from pathlib import Path

    from fastvideo3.media import npy_bytes, save_video
    if fmt not in MEDIA_FORMATS:
        raise InvalidRequest(f"unknown output format {fmt!r}", field="output_format", limit=", ".join(MEDIA_FORMATS))
    if fmt == OutputFormat.NPY:  # made in memory: no temporary file written and read back
        return npy_bytes(frames)
    with tempfile.TemporaryDirectory(prefix="fv3-media-") as tmp:
        path = Path(tmp) / f"video.{fmt}"
        save_video(frames, path, fps=fps)
        return path.read_bytes()
