"""The cost model: every WorkUnit priced in predicted GPU-seconds, peak and resident bytes.

Two layers live here:

* **Work counts** per unit kind: a diffusion step's come from its model family's FLOP formulas
  (Wan's: models/wan/flops.py, reached through fastvideo3.card.family); the other unit kinds
  have small priors here.
* **CalibratedCostModel**: an analytic prior (FLOPs over sustained FLOP/s plus bytes over
  bandwidth) multiplied by a calibration factor learned online from measured step times.

The same object prices admission in the scheduler and is published, via ``to_dict()``, in the
fleet's DeploymentCard. Pure Python: no torch import, safe in the scheduler process.

"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from fastvideo3.card.family import get_family
from fastvideo3.errors import InvalidRequest
from fastvideo3.vocab import Role, UnitKind

COST_MODEL_VERSION = 1

UNIT_KINDS = (UnitKind.DIFFUSION_STEP, UnitKind.ENCODER_CHUNK, UnitKind.VAE_TILE, UnitKind.REWARD_BATCH,
              UnitKind.VAE_ENCODE)


# ---------------------------------------------------------------------------------------------
# Features per unit kind


@dataclass(frozen=True)
class DiffusionStepFeatures:
    #: the family's DiT config (its ``family`` attribute names whose formulas price it) and step shape
    config: Any
    shape: Any
    pool: str = Role.DENOISER
    sampler_history: int = 2
    weight_bytes_per_param: int = 2
    act_bytes: int = 2
    #: the replica's fastvideo3.parallel.ParallelPlan (None: one device) and the cost of one
    #: byte between its ranks in device-memory bytes (fastvideo3.parallel.cost.link_ratio)
    plan: Any = None
    link_ratio: float = 1.0


@dataclass(frozen=True)
class EncoderChunkFeatures:
    """A text-encoder chunk: ``batch`` prompts of ``tokens`` tokens (T5-style encoder)."""

    params: int
    tokens: int
    batch: int = 1
    hidden: int = 4096
    ffn_dim: int = 10240
    pool: str = Role.ENCODER
    weight_bytes_per_param: int = 2
    act_bytes: int = 2


@dataclass(frozen=True)
class VaeTileFeatures:
    """A VAE decode tile, counted in output pixels: ``batch * frames * height * width``."""

    frames: int
    height: int
    width: int
    batch: int = 1
    pool: str = Role.DECODER


@dataclass(frozen=True)
class RewardBatchFeatures:
    frames: int
    batch: int = 1
    pool: str = Role.REWARD


Features = DiffusionStepFeatures | EncoderChunkFeatures | VaeTileFeatures | RewardBatchFeatures
_FEATURES_BY_KIND: dict[str, type] = {
    UnitKind.DIFFUSION_STEP: DiffusionStepFeatures,
    UnitKind.ENCODER_CHUNK: EncoderChunkFeatures,
    UnitKind.VAE_TILE: VaeTileFeatures,
    UnitKind.REWARD_BATCH: RewardBatchFeatures,
    # the VAE's encoder over an I2V request's conditioning video: priced like a decode of its shape
    UnitKind.VAE_ENCODE: VaeTileFeatures,
}


@dataclass(frozen=True)
class Work:
    """What a unit does, before any device is involved."""

    flops: float
    bytes: float
    peak_bytes: int
    resident_bytes: int


@dataclass(frozen=True)
class PriorCoefficients:
    """Priors for kinds without a closed form. Rough on purpose: calibration corrects them.

    VAE decode: a Wan-style causal conv3d decoder does about 1e7 FLOPs per output pixel
    (several 3x3x3 convs at each of four resolutions). Reward: per frame, about a ViT-L/14 at
    224 px. Encoder activations: ``encoder_peak_factor`` live tensors of tokens x hidden.
    """

    vae_flops_per_pixel: float = 1.0e7
    vae_bytes_per_pixel: float = 4.0e3
    vae_peak_bytes_per_pixel: float = 1.0e3
    vae_resident_bytes_per_pixel: float = 3.0  # the uint8 RGB frames it emits
    reward_flops_per_frame: float = 1.6e11
    reward_bytes_per_frame: float = 2.0e7
    reward_peak_bytes_per_frame: float = 6.0e7
    encoder_peak_factor: float = 8.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def unit_work(kind: str, features: Features, priors: PriorCoefficients = PriorCoefficients()) -> Work:
    """FLOPs, bytes moved, peak and per-request resident bytes of one unit of ``kind``."""
    expected = _FEATURES_BY_KIND.get(kind)
    if expected is None:
        raise InvalidRequest(f"unknown unit kind {kind!r}", field="unit_kind", limit=", ".join(UNIT_KINDS))
    if not isinstance(features, expected):
        raise InvalidRequest(f"{kind} needs {expected.__name__}, got {type(features).__name__}",
                             field="features")
    if isinstance(features, DiffusionStepFeatures):
        c, s = features.config, features.shape
        fwd, peak, res = get_family(c.family).step_work(
            c, s, weight_bytes_per_param=features.weight_bytes_per_param, act_bytes=features.act_bytes,
            sampler_history=features.sampler_history)
        work = Work(fwd.flops, fwd.bytes, peak, res.per_request)
        if features.plan is not None and features.plan.world > 1:
            return features.plan.price(work, fwd.weight_bytes, c, s, features.act_bytes, features.link_ratio)
        return work
    if isinstance(features, EncoderChunkFeatures):
        tokens = features.batch * features.tokens
        flops = 2.0 * features.params * tokens
        act = tokens * features.hidden * features.act_bytes
        nbytes = features.params * features.weight_bytes_per_param + 2 * act * 12  # ~12 passes
        peak = int(act * priors.encoder_peak_factor
                   + tokens * features.ffn_dim * features.act_bytes * 2)
        return Work(flops, nbytes, peak, int(act))  # the output embeddings stay resident
    if isinstance(features, VaeTileFeatures):
        px = features.batch * features.frames * features.height * features.width
        return Work(px * priors.vae_flops_per_pixel, px * priors.vae_bytes_per_pixel,
                    int(px * priors.vae_peak_bytes_per_pixel), int(px * priors.vae_resident_bytes_per_pixel))
    frames = features.batch * features.frames
    return Work(frames * priors.reward_flops_per_frame, frames * priors.reward_bytes_per_frame,
                int(frames * priors.reward_peak_bytes_per_frame), 0)


# ---------------------------------------------------------------------------------------------
# Devices


@dataclass(frozen=True)
class DeviceProfile:
    """Sustained rates of one device. ``prior = flops / (peak_flops * efficiency)
    + bytes / (bandwidth * bandwidth_efficiency) + overhead_s`` (a sum, not a max: conservative)."""

    name: str
    peak_flops: float
    bandwidth: float
    efficiency: float = 0.5
    bandwidth_efficiency: float = 0.8
    overhead_s: float = 0.0

    def seconds(self, flops: float, nbytes: float) -> float:
        return (flops / (self.peak_flops * self.efficiency)
                + nbytes / (self.bandwidth * self.bandwidth_efficiency) + self.overhead_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


DEVICE_PROFILES: dict[str, DeviceProfile] = {
    # Conservative sustained figures for a CPU running the tiny model; already derated.
    # A per-unit overhead dominates tiny models on a CPU (framework dispatch, small kernels).
    "cpu": DeviceProfile("cpu", peak_flops=50e9, bandwidth=10e9, efficiency=1.0, bandwidth_efficiency=1.0,
                         overhead_s=5e-3),
    # A conservative sustained bf16 rate, below the ~989 TFLOP/s dense datasheet figure; HBM3e.
    "h200": DeviceProfile("h200", peak_flops=755e12, bandwidth=4.0e12, efficiency=0.6, overhead_s=2e-4),
}


def device_profile(name: str, **overrides: Any) -> DeviceProfile:
    """A built-in profile with fields overridden, e.g. ``device_profile("h200", efficiency=0.5)``."""
    if name not in DEVICE_PROFILES:
        raise InvalidRequest(f"unknown device profile {name!r}", field="device",
                             limit=", ".join(DEVICE_PROFILES))
    return replace(DEVICE_PROFILES[name], **overrides)


# ---------------------------------------------------------------------------------------------
# The protocol


@dataclass(frozen=True)
class Prediction:
    """A priced unit. ``prior_seconds`` and ``pool`` let ``observe`` learn from it later."""

    gpu_seconds: float
    peak_bytes: int
    resident_bytes: int
    prior_seconds: float = 0.0
    pool: str = ""


@runtime_checkable
class CostModel(Protocol):
    """Prices WorkUnits in one currency, predicted GPU-seconds, and learns from measurements.

    Contract:
    * ``predict(unit_kind, shape_key, features)`` is pure with respect to the model's state:
      no side effects, cheap (microseconds), deterministic for the same state. ``shape_key`` is
      the unit's shape signature (batch compatibility key); it selects a calibration bucket.
      Unknown kinds or mismatched features raise ``InvalidRequest``.
    * ``observe(unit_kind, shape_key, measured_seconds, predicted)`` folds one measured time
      for one unit into the calibration; ``predicted`` is the Prediction that priced the unit.
      Measurements of a batch are split across its units first (see ``split_measured``).
      Non-positive or non-finite measurements are dropped, never raise.
    * Both are thread-safe. Calibration refines predictions; it never changes a reservation
      already made (admission refunds realized savings, it does not re-price in flight).
    """

    def predict(self, unit_kind: str, shape_key: str, features: Features) -> Prediction: ...

    def observe(self, unit_kind: str, shape_key: str, measured_seconds: float,
                predicted: Prediction) -> None: ...


def split_measured(batch_seconds: float, predictions: list[Prediction]) -> list[float]:
    """Share one batch's measured time among its units in proportion to their priors."""
    total = sum(p.prior_seconds for p in predictions)
    if total <= 0:
        return [batch_seconds / max(1, len(predictions))] * len(predictions)
    return [batch_seconds * p.prior_seconds / total for p in predictions]


# ---------------------------------------------------------------------------------------------
# Calibration


class _RatioWindow:
    """The last ``size`` log(measured / prior) values; the estimate is their median.

    A median over a window is robust to the odd outlier (a preempted step, a cold cache) and
    still follows a real shift within half a window."""

    def __init__(self, size: int, values: list[float] | None = None, count: int = 0) -> None:
        self.values: deque[float] = deque(values or [], maxlen=size)
        self.count = count

    def add(self, value: float) -> None:
        self.values.append(value)
        self.count += 1

    def estimate(self) -> float:
        return _quantile(sorted(self.values), 0.5) if self.values else 0.0


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class CalibrationConfig:
    window: int = 32  # samples per ratio window
    min_bucket_samples: int = 5  # a shape bucket overrides its (pool, kind) factor from here on
    max_buckets: int = 256  # least recently observed buckets are forgotten past this
    max_factor: float = 1000.0  # the factor stays in [1/max_factor, max_factor]
    error_window: int = 1024  # relative errors kept for error_stats()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CalibratedCostModel:
    """Analytic prior times a learned calibration factor, per (pool, kind) and shape bucket.

    ``predict``: ``prior = device.seconds(flops, bytes)``; the factor is the median log-ratio of
    the shape bucket once it has ``min_bucket_samples`` samples, else that of (pool, kind), else
    1; it is clamped to ``[1/max_factor, max_factor]``. ``observe`` adds log(measured / prior)
    to both windows and records ``|predicted - measured| / measured`` for ``error_stats``.
    """

    device: DeviceProfile = field(default_factory=lambda: DEVICE_PROFILES["cpu"])
    priors: PriorCoefficients = field(default_factory=PriorCoefficients)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str, str], _RatioWindow] = {}
        self._buckets: OrderedDict[tuple[str, str, str], _RatioWindow] = OrderedDict()
        self._errors: deque[float] = deque(maxlen=self.calibration.error_window)
        self._errors_total = 0
        self._dropped = 0

    # -- the protocol ----------------------------------------------------------------------

    def predict(self, unit_kind: str, shape_key: str, features: Features) -> Prediction:
        work = unit_work(unit_kind, features, self.priors)
        prior = self.device.seconds(work.flops, work.bytes)
        pool = features.pool
        with self._lock:
            log_factor = self._log_factor(pool, unit_kind, shape_key)
        return Prediction(prior * math.exp(log_factor), work.peak_bytes, work.resident_bytes, prior, pool)

    def observe(self, unit_kind: str, shape_key: str, measured_seconds: float,
                predicted: Prediction) -> None:
        if not (math.isfinite(measured_seconds) and measured_seconds > 0 and predicted.prior_seconds > 0):
            with self._lock:
                self._dropped += 1
            return
        ratio = math.log(measured_seconds / predicted.prior_seconds)
        error = abs(predicted.gpu_seconds - measured_seconds) / measured_seconds
        cal = self.calibration
        with self._lock:
            kind_key = (predicted.pool, unit_kind)
            self._kinds.setdefault(kind_key, _RatioWindow(cal.window)).add(ratio)
            bucket_key = (predicted.pool, unit_kind, shape_key)
            bucket = self._buckets.pop(bucket_key, None) or _RatioWindow(cal.window)
            bucket.add(ratio)
            self._buckets[bucket_key] = bucket  # most recently observed last
            while len(self._buckets) > cal.max_buckets:
                self._buckets.popitem(last=False)
            self._errors.append(error)
            self._errors_total += 1

    # -- introspection ---------------------------------------------------------------------

    def factor(self, pool: str, unit_kind: str, shape_key: str = "") -> float:
        """The multiplicative calibration that ``predict`` applies right now."""
        with self._lock:
            return math.exp(self._log_factor(pool, unit_kind, shape_key))

    def error_stats(self) -> dict[str, float]:
        """Median and p90 absolute relative error over the recent window, for metrics."""
        with self._lock:
            errs = sorted(self._errors)
            return {
                "count": float(len(errs)),
                "total": float(self._errors_total),
                "dropped": float(self._dropped),
                "median": _quantile(errs, 0.5) if errs else float("nan"),
                "p90": _quantile(errs, 0.9) if errs else float("nan"),
            }

    def _log_factor(self, pool: str, unit_kind: str, shape_key: str) -> float:
        cal = self.calibration
        bucket = self._buckets.get((pool, unit_kind, shape_key))
        if bucket is not None and bucket.count >= cal.min_bucket_samples:
            value = bucket.estimate()
        else:
            kind = self._kinds.get((pool, unit_kind))
            value = kind.estimate() if kind is not None else 0.0
        bound = math.log(cal.max_factor)
        return min(bound, max(-bound, value))

    # -- serialization (the DeploymentCard carries this dict) --------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, versioned state: device, priors, calibration config and learned windows."""
        with self._lock:
            kinds = [{"pool": p, "kind": k, "count": w.count, "log_ratios": list(w.values)}
                     for (p, k), w in sorted(self._kinds.items())]
            buckets = [{"pool": p, "kind": k, "shape_key": s, "count": w.count,
                        "log_ratios": list(w.values)}
                       for (p, k, s), w in self._buckets.items()]
        return {
            "version": COST_MODEL_VERSION,
            "type": "CalibratedCostModel",
            "device": self.device.to_dict(),
            "priors": self.priors.to_dict(),
            "calibration": self.calibration.to_dict(),
            "kinds": kinds,
            "buckets": buckets,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CalibratedCostModel":
        if d.get("version") != COST_MODEL_VERSION or d.get("type") != "CalibratedCostModel":
            raise InvalidRequest(f"unsupported cost model {d.get('type')!r} v{d.get('version')!r}",
                                 field="version", limit=f"CalibratedCostModel v{COST_MODEL_VERSION}")
        cal = CalibrationConfig(**d["calibration"])
        model = cls(DeviceProfile(**d["device"]), PriorCoefficients(**d["priors"]), cal)
        for e in d.get("kinds", []):
            model._kinds[(e["pool"], e["kind"])] = _RatioWindow(cal.window, e["log_ratios"], e["count"])
        for e in d.get("buckets", []):
            model._buckets[(e["pool"], e["kind"], e["shape_key"])] = _RatioWindow(
                cal.window, e["log_ratios"], e["count"])
        return model
