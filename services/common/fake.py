"""A no-op executor for any role: well-formed results, no math, no weights.

It lets the whole fleet run (and be benchmarked for scheduling overhead) without a model: refs
it returns point at nothing (backend ``"fake"``) and are never fetched by another fake pool.
``step_seconds`` simulates compute time per batch (for drain and overload tests).
"""
from __future__ import annotations

import io
import threading
import time

from fastvideo3.card.family import family_of
from fastvideo3.loop.protocol import StepResult
from fastvideo3.transport.ref import TensorRef, expected_nbytes
from fastvideo3.vocab import OutputFormat, UnitKind

FAKE_TEXT_DIM = 32


def fake_ref(owner: str, request_id: str, name: str, shape: list[int], dtype: str = "float32") -> TensorRef:
    """A well-formed ref to nothing (backend ``"fake"``): no transport serves it."""
    return TensorRef(owner=owner, buffer_id=f"{request_id}/{name}#fake", dtype=dtype, shape=tuple(shape),
                     nbytes=expected_nbytes(dtype, tuple(shape)), checksum="none:0", backend="fake")


def _tiny_npy() -> bytes:
    import numpy as np
    buf = io.BytesIO()
    np.save(buf, np.zeros((1, 2, 2, 3), dtype=np.float32), allow_pickle=False)
    return buf.getvalue()


class FakeExecutor:
    def __init__(self, role: str, card, transport, step_seconds: float = 0.0):
        self.role = role
        self.card = card
        self.transport = transport
        self.step_seconds = step_seconds
        self.device, self.precision = "cpu", "fp32"
        self.weights_digest = f"fake:{role}"
        self.regions: dict[str, int] = {}  # request -> denoise step, like the real denoiser's residency
        self.counters = {"units": 0, "batches": 0, "failed_units": 0, "busy_seconds": 0.0}
        self._lock = threading.Lock()
        self._npy = _tiny_npy()

    def execute(self, batch) -> list[StepResult]:
        t0 = time.perf_counter()
        if self.step_seconds > 0:
            time.sleep(self.step_seconds)  # simulated compute, not synchronization
        with self._lock:
            out = [self._one(u) for u in batch]
            dt = time.perf_counter() - t0
            self.counters["units"] += len(batch)
            self.counters["batches"] += 1
            self.counters["busy_seconds"] += dt
        for r in out:
            r.measured_seconds = dt
        return out

    def _one(self, unit) -> StepResult:
        p, rid, owner = unit.params, unit.request_id, self.role
        res = StepResult(unit.unit_id, rid)
        if unit.kind == UnitKind.ENCODER_CHUNK:
            res.outputs = {n: fake_ref(owner, rid, n, [1, self.card.max_text_tokens, FAKE_TEXT_DIM])
                           for n in p.get("prompts", {})}
        elif unit.kind == UnitKind.DIFFUSION_STEP:
            step = int(p.get("step", 0))
            if step and self.regions.get(rid) != step:  # like the real denoiser: state lost -> resume
                from fastvideo3.errors import ErrorInfo, Unavailable
                return StepResult(unit.unit_id, rid, ok=False, error=ErrorInfo.of(Unavailable(
                    f"no resident region for request at step {step}", step=step, field="request_id",
                    details={"lost_region": True})))
            self.regions[rid] = step + 1
            res.metrics = {"latent_norm": 1.0, "finite": 1.0}
            if p.get("final"):
                res.outputs = {"latents": fake_ref(owner, rid, "latents", [1, *p["latent_shape"]])}
        elif unit.kind == UnitKind.VAE_TILE:
            c, f, h, w = unit.inputs["latents"].shape[1:]
            dtype = "float32" if p.get("frames_dtype") == "float32" else "uint8"  # as the real decoder
            fam = family_of(self.card)
            _, sh, sw = fam.latent_stride(self.card)
            shape = [fam.frames_of_latent(self.card, f), h * sh, w * sw, 3]
            res.outputs = {"frames": fake_ref(owner, rid, "frames", shape, dtype)}
            if p.get("encode"):
                res.inline = self._npy
                res.payload = {"media_format": OutputFormat.NPY, "media_bytes": len(self._npy)}
        elif unit.kind == UnitKind.REWARD_BATCH:
            res.payload = {"scores": {n: 0.0 for n in p.get("scorers", [])}}
        return res

    def release(self, request_id: str) -> None:
        with self._lock:
            self.regions.pop(request_id, None)

    # -- snapshot / restore: the step counter is the whole resident state -----------------
    @property
    def identity(self):
        from fastvideo3.runtime.pool.resident import pool_identity
        return pool_identity(self.weights_digest, self.precision, "cpu")

    def snapshot(self, request_id: str) -> bytes:
        import torch

        from fastvideo3.errors import NotFound
        from fastvideo3.runtime.pool.resident import snapshot_tensors
        with self._lock:
            if request_id not in self.regions:
                raise NotFound("no resident region for this request", field="request_id")
            step = self.regions[request_id]
        return snapshot_tensors(self.identity, [("step", torch.tensor([step], dtype=torch.int64))])

    def restore(self, request_id: str, blob: bytes) -> int:
        from fastvideo3.runtime.pool.resident import restore_tensors
        step = int(restore_tensors(self.identity, blob)["step"][0])
        with self._lock:
            self.regions[request_id] = step
        return step

    def describe(self) -> dict:
        with self._lock:
            return {"role": self.role, "card": self.card.model_id, "device": "cpu (fake)", "precision": "fp32",
                    "weights_digest": self.weights_digest, "counters": dict(self.counters),
                    "resident_regions": len(self.regions), "transport": self.transport.stats(), "fake": True}
