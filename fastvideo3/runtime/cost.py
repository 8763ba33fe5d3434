"""The cost model: every WorkUnit priced in predicted GPU-seconds, peak and resident bytes.

Two layers live here:

* **Closed-form work counts** for a Wan-style DiT forward (FLOPs and bytes moved per component,
  peak activation memory, resident memory), plus small priors for the other unit kinds.
* **CalibratedCostModel**: an analytic prior (FLOPs over sustained FLOP/s plus bytes over
  bandwidth) multiplied by a calibration factor learned online from measured step times.

The same object prices admission in the scheduler and is published, via ``to_dict()``, in the
fleet's DeploymentCard. Pure Python: no torch import, safe in the scheduler process.

DiT FLOP formula (one multiply-add = 2 FLOPs). With hidden size ``D = heads * head_dim``, FFN
width ``F``, text length ``T``, ``n = batch * cfg_branches`` sequences and
``L = (F_lat/pt) * (H_lat/ph) * (W_lat/pw)`` tokens per sequence, one forward costs ``n`` times:

    patch embed      2 * L * (C_in * pt*ph*pw) * D          (the conv3d is a matmul per patch)
    per block, times num_layers:
      self-attn proj   4 * 2 * L * D^2                      (Q, K, V, O)
      self-attn core   2 * 2 * L^2 * D                      (scores and values)
      cross-attn proj  2 * 2 * L * D^2 + 2 * 2 * T * D^2    (Q, O on video; K, V on text)
      cross-attn core  2 * 2 * L * T * D
      ffn              2 * 2 * L * D * F
    embedders        2 * T * (text_dim * D + D^2) + 2 * (freq_dim * D + D^2 + 6 * D^2)
    head             2 * L * D * (C_out * pt*ph*pw)

Norms, modulation and RoPE are elementwise and left out (well under 1% at video sizes). For
Wan2.1 1.3B at 81 x 480 x 832 (latent 21 x 60 x 104, L = 32,760) this is about 283 TFLOP.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from fastvideo3.errors import InvalidRequest
from fastvideo3.vocab import Role, UnitKind

COST_MODEL_VERSION = 1

UNIT_KINDS = (UnitKind.DIFFUSION_STEP, UnitKind.ENCODER_CHUNK, UnitKind.VAE_TILE, UnitKind.REWARD_BATCH)


# ---------------------------------------------------------------------------------------------
# Shapes and work counts


@dataclass(frozen=True)
class DitConfig:
    """The shape of a Wan-style DiT (what the FLOP formula needs, nothing more)."""

    num_layers: int
    num_heads: int
    head_dim: int
    ffn_dim: int
    text_dim: int = 4096
    freq_dim: int = 256
    in_channels: int = 16
    out_channels: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512

    @property
    def hidden(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def patch_volume(self) -> int:
        pt, ph, pw = self.patch_size
        return pt * ph * pw

    def param_count(self) -> int:
        """Parameter count, biases and norm affines included (Wan2.1 1.3B gives ~1.42e9)."""
        d, f = self.hidden, self.ffn_dim
        attn = 4 * (d * d + d) + 2 * d  # q, k, v, o and the q/k RMSNorm weights
        block = 2 * attn + (d * f + f + f * d + d) + 2 * d + 6 * d  # + cross-norm, modulation
        patch = self.in_channels * self.patch_volume * d + d
        text = self.text_dim * d + d + d * d + d
        time = self.freq_dim * d + d + d * d + d + d * 6 * d + 6 * d
        head = d * self.out_channels * self.patch_volume + self.out_channels * self.patch_volume + 2 * d
        return self.num_layers * block + patch + text + time + head

    @classmethod
    def wan21_1_3b(cls) -> "DitConfig":
        return cls(num_layers=30, num_heads=12, head_dim=128, ffn_dim=8960)

    @classmethod
    def wan21_14b(cls) -> "DitConfig":
        return cls(num_layers=40, num_heads=40, head_dim=128, ffn_dim=13824)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["patch_size"] = list(self.patch_size)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DitConfig":
        return cls(**{**d, "patch_size": tuple(d.get("patch_size", (1, 2, 2)))})


@dataclass(frozen=True)
class StepShape:
    """One denoise step: ``batch`` samples, each run ``cfg_branches`` times, on one latent size."""

    latent_frames: int
    latent_height: int
    latent_width: int
    batch: int = 1
    cfg_branches: int = 1

    @classmethod
    def from_video(cls, frames: int, height: int, width: int, *, batch: int = 1, cfg_branches: int = 1,
                   stride: tuple[int, int, int] = (4, 8, 8)) -> "StepShape":
        """Latent shape of a Wan VAE (causal in time: ``1 + (frames - 1) / 4``)."""
        st, sh, sw = stride
        return cls(1 + (frames - 1) // st, height // sh, width // sw, batch, cfg_branches)

    @property
    def sequences(self) -> int:
        return self.batch * self.cfg_branches

    def tokens(self, config: DitConfig) -> int:
        """Tokens per sequence: L = (F/pt) * (H/ph) * (W/pw)."""
        pt, ph, pw = config.patch_size
        return (self.latent_frames // pt) * (self.latent_height // ph) * (self.latent_width // pw)

    def key(self) -> str:
        return f"f{self.latent_frames}h{self.latent_height}w{self.latent_width}b{self.batch}c{self.cfg_branches}"


@dataclass(frozen=True)
class ComponentCost:
    flops: float
    bytes: float  # weights read once per forward plus activations read and written

    def __add__(self, other: "ComponentCost") -> "ComponentCost":
        return ComponentCost(self.flops + other.flops, self.bytes + other.bytes)

    def scaled(self, k: float) -> "ComponentCost":
        return ComponentCost(self.flops * k, self.bytes * k)


@dataclass(frozen=True)
class DitForwardCost:
    """Work of one DiT call over all ``batch * cfg_branches`` sequences, per component."""

    components: dict[str, ComponentCost]
    tokens: int
    weight_bytes: float

    @property
    def flops(self) -> float:
        return sum(c.flops for c in self.components.values())

    @property
    def bytes(self) -> float:
        return sum(c.bytes for c in self.components.values())


def dit_forward_cost(config: DitConfig, shape: StepShape, *, weight_bytes_per_param: int = 2,
                     act_bytes: int = 2) -> DitForwardCost:
    """FLOPs and bytes moved of one forward (the formula in the module docstring).

    Bytes: each component's weights once per call (the CFG branches and samples are batched in
    one call), plus its input and output activations once per sequence. Attention is modelled
    flash-style: Q, K, V read once, O written once, no L x L matrix in memory.
    """
    d, f, t, nl = config.hidden, config.ffn_dim, config.text_len, config.num_layers
    n, tok = shape.sequences, shape.tokens(config)
    if tok <= 0:
        raise InvalidRequest("latent smaller than one patch", field="shape", limit=str(config.patch_size))
    wb, ab = weight_bytes_per_param, act_bytes
    pv_in, pv_out = config.in_channels * config.patch_volume, config.out_channels * config.patch_volume

    def lin(tokens: int, d_in: int, d_out: int, count: int = 1) -> ComponentCost:
        """``count`` linear layers, tokens x d_in -> tokens x d_out, per sequence."""
        return ComponentCost(
            flops=count * n * 2.0 * tokens * d_in * d_out,
            bytes=count * (d_in * d_out * wb + n * tokens * (d_in + d_out) * ab),
        )

    self_core = ComponentCost(n * 2 * 2.0 * tok * tok * d, n * 4.0 * tok * d * ab)
    cross_core = ComponentCost(n * 2 * 2.0 * tok * t * d, n * (2.0 * tok * d + 2.0 * t * d) * ab)
    components = {
        "patch_embed": lin(tok, pv_in, d),
        "self_attn_proj": lin(tok, d, d, count=4).scaled(nl),
        "self_attn_core": self_core.scaled(nl),
        "cross_attn_proj": lin(tok, d, d, count=2).scaled(nl),
        "cross_attn_kv": lin(t, d, d, count=2).scaled(nl),
        "cross_attn_core": cross_core.scaled(nl),
        "ffn": (lin(tok, d, f) + lin(tok, f, d)).scaled(nl),
        # text MLP; time MLP, whose second linear and 6-way projection are lumped as d -> 7d
        "embedders": lin(t, config.text_dim, d) + lin(t, d, d) + lin(1, config.freq_dim, d) + lin(1, d, 7 * d),
        "head": lin(tok, d, pv_out),
    }
    return DitForwardCost(components, tok, float(config.param_count() * wb))


def dit_peak_activation_bytes(config: DitConfig, shape: StepShape, *, act_bytes: int = 2,
                              residual_bytes: int = 4) -> int:
    """Largest set of live activations in one forward (one block at a time; weights excluded).

    The residual stream stays live throughout (fp32 in Wan). On top of it, the attention phase
    holds the normed input, Q, K, V (plus rotated Q, K) and the output: 7 x L x D; the FFN phase
    holds the normed input and the hidden and activated tensors: L x D + 2 x L x F. Flash
    attention keeps no L x L matrix. The text context (K, V for one block) is added.
    """
    n, tok, d = shape.sequences, shape.tokens(config), config.hidden
    residual = n * tok * d * residual_bytes
    attn_phase = n * tok * d * 7 * act_bytes
    ffn_phase = n * tok * (d + 2 * config.ffn_dim) * act_bytes
    context = n * config.text_len * d * 3 * act_bytes
    return int(residual + max(attn_phase, ffn_phase) + context)


@dataclass(frozen=True)
class ResidentMemory:
    """Bytes that stay on the device across steps. ``per_request`` is what admission reserves;
    the weights are charged once to the pool (its memory budget is net of them)."""

    weights: int
    latent: int
    sampler_history: int
    text_embeds: int

    @property
    def per_request(self) -> int:
        return self.latent + self.sampler_history + self.text_embeds

    @property
    def total(self) -> int:
        return self.weights + self.per_request


def dit_resident_memory(config: DitConfig, shape: StepShape, *, sampler_history: int = 2,
                        weight_bytes_per_param: int = 2, latent_bytes: int = 4,
                        embed_bytes: int = 2) -> ResidentMemory:
    """Weights, the fp32 latent, ``sampler_history`` latent-sized sampler buffers (multistep
    samplers keep past model outputs) and the prompt embeddings of every CFG branch."""
    latent = shape.batch * config.out_channels * shape.latent_frames * shape.latent_height \
        * shape.latent_width * latent_bytes
    embeds = shape.sequences * config.text_len * config.text_dim * embed_bytes
    return ResidentMemory(config.param_count() * weight_bytes_per_param, latent,
                          latent * sampler_history, embeds)


# ---------------------------------------------------------------------------------------------
# Features per unit kind


@dataclass(frozen=True)
class DiffusionStepFeatures:
    config: DitConfig
    shape: StepShape
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
        fwd = dit_forward_cost(c, s, weight_bytes_per_param=features.weight_bytes_per_param,
                               act_bytes=features.act_bytes)
        peak = dit_peak_activation_bytes(c, s, act_bytes=features.act_bytes)
        res = dit_resident_memory(c, s, sampler_history=features.sampler_history,
                                  weight_bytes_per_param=features.weight_bytes_per_param)
        work = Work(fwd.flops, fwd.bytes, peak, res.per_request)
        if features.plan is not None and features.plan.world > 1:
            from fastvideo3.parallel.cost import parallel_work
            return parallel_work(work, fwd.weight_bytes, c, s, features.plan, features.act_bytes, features.link_ratio)
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
