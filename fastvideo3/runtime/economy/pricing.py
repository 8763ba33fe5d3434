"""Pricing: every WorkUnit in one currency, predicted GPU-seconds, from the card's shapes.

The :class:`Pricer` turns a unit (or a whole request, for admission) into cost-model features
— the DiT's architecture from the card, the step's latent shape, CFG branches, precision — asks
the :class:`~fastvideo3.runtime.economy.cost.CalibratedCostModel` for a prediction, and feeds measured
batch times back so the model calibrates online. The same cost-model object is what the fleet
publishes in its DeploymentCard.
"""
from __future__ import annotations

import threading
from typing import Any

from fastvideo3.loop.protocol import Resources
from fastvideo3.runtime.economy.admission import Reservation
from fastvideo3.card.family import family_of
from fastvideo3.runtime.economy.cost import (
    CalibratedCostModel, DiffusionStepFeatures, EncoderChunkFeatures, Prediction, RewardBatchFeatures,
    VaeTileFeatures, split_measured,
)
from fastvideo3.vocab import LoopId, Role, UnitKind

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def vae_spatial_scale(card) -> int:
    """The VAE's spatial compression (the card's family says: Wan2.1's is 8, Wan2.2 TI2V-5B's 16)."""
    return family_of(card).latent_stride(card)[1]


def dit_config(card):
    """The card's DiT in the form its family's FLOP formulas read."""
    return family_of(card).dit_config(card)


def _encoder_features(card, prompts: int) -> EncoderChunkFeatures:
    c = card.components["text_encoder"].config
    d = int(c.get("d_model", 4096))
    ff = int(c.get("d_ff", 10240))
    layers = int(c.get("num_layers", 24))
    vocab = int(c.get("vocab_size", 256384))
    params = vocab * d + layers * (4 * d * d + 3 * d * ff)  # embeddings + attention + gated FFN
    return EncoderChunkFeatures(params=params, tokens=int(card.max_text_tokens), batch=prompts, hidden=d, ffn_dim=ff)


class Pricer:
    """Prices units and requests; learns from measured batches. Thread-safe."""

    def __init__(self, cost_model: CalibratedCostModel | None = None):
        self.cost_model = cost_model or CalibratedCostModel()
        #: role -> the fastvideo3.parallel.ParallelPlan its replicas run (from their Describe)
        self.plans: dict[str, Any] = {}
        self._pending: dict[str, tuple[str, str, Prediction]] = {}  # unit id -> (kind, shape key, prediction)
        self._lock = threading.Lock()

    def features(self, kind: str, card, request, *, prompts: int = 1) -> Any:
        if kind == UnitKind.DIFFUSION_STEP:
            branches = 1 if request.cfg_policy == "none" else 2
            fam = family_of(card)
            shape = fam.step_shape(request.num_frames, request.height, request.width, cfg_branches=branches,
                                   stride=fam.latent_stride(card))
            b = _BYTES.get(request.precision, 2)
            plan = self.plans.get(Role.DENOISER)
            if plan is not None and plan.world > 1:
                return DiffusionStepFeatures(dit_config(card), shape, weight_bytes_per_param=b, act_bytes=b,
                                             plan=plan, link_ratio=plan.link_ratio(self.cost_model.device))
            return DiffusionStepFeatures(dit_config(card), shape, weight_bytes_per_param=b, act_bytes=b)
        if kind == UnitKind.ENCODER_CHUNK:
            return _encoder_features(card, prompts)
        if kind in (UnitKind.VAE_TILE, UnitKind.VAE_ENCODE):
            return VaeTileFeatures(request.num_frames, request.height, request.width)
        return RewardBatchFeatures(request.num_frames)

    def predict(self, kind: str, shape_key: str, card, request, *, prompts: int = 1) -> Prediction:
        return self.cost_model.predict(kind, shape_key, self.features(kind, card, request, prompts=prompts))

    def price_unit(self, unit, card, request) -> Prediction:
        prompts = len(unit.params.get("prompts", {})) or 1
        pred = self.predict(unit.kind, unit.shape_sig, card, request, prompts=prompts)
        unit.resources = Resources(pred.gpu_seconds, pred.resident_bytes, pred.peak_bytes)
        with self._lock:
            self._pending[unit.unit_id] = (unit.kind, unit.shape_sig, pred)
        return pred

    def reservation(self, card, request, program: tuple[str, ...]) -> Reservation:
        """What a request holds while it runs. Compute: one denoise step in flight at a time (the
        unit that repeats and bounds iteration latency; encode and decode run once, on their own
        pools). Memory: the largest resident and peak bytes of any of its loops."""
        kinds = {LoopId.TEXT_ENCODE: UnitKind.ENCODER_CHUNK, LoopId.DIFFUSION_DENOISE: UnitKind.DIFFUSION_STEP,
                 LoopId.VAE_DECODE: UnitKind.VAE_TILE, LoopId.REWARD_SCORE: UnitKind.REWARD_BATCH}
        preds = {kinds[loop]: self.predict(kinds[loop], f"admission|{kinds[loop]}", card, request,
                                           prompts=1 if request.cfg_policy == "none" else 2)
                 for loop in program if loop in kinds}
        step = preds.get(UnitKind.DIFFUSION_STEP) or max(preds.values(), key=lambda p: p.gpu_seconds)
        return Reservation(step.gpu_seconds, max(p.resident_bytes for p in preds.values()),
                           max(p.peak_bytes for p in preds.values()))

    def observe_batch(self, unit_ids: list[str], batch_seconds: float) -> None:
        """Split a batch's measured time across its units (by prior) and calibrate."""
        with self._lock:
            entries = [self._pending.pop(u, None) for u in unit_ids]
        known = [e for e in entries if e is not None]
        if not known or batch_seconds <= 0:
            return
        for (kind, key, pred), secs in zip(known, split_measured(batch_seconds, [p for _, _, p in known])):
            self.cost_model.observe(kind, key, secs, pred)

    def forget(self, unit_ids: list[str]) -> None:
        with self._lock:
            for u in unit_ids:
                self._pending.pop(u, None)
