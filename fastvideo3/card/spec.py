"""The model plane: a ModelCard is a (recipe, runtime) pair, validated before any weight loads.

Specs are pydantic models with ``extra="forbid"`` so a typo in a user's card is an error, not a
silently ignored field. Validation that spans fields (recipe vs loops, components vs tasks)
lives in :meth:`ModelCard._check_consistency`. Request-time checks against a card live in
:mod:`fastvideo3.request.schema`; the recipe's teeth are :meth:`ModelCard.check_recipe`.
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fastvideo3.errors import RecipeMismatch
from fastvideo3.vocab import LoopId, Sampler, Task

#: ``fp8_e4m3``: the DiT's block Linear layers in e4m3 (weights per output channel, activations per
#: token or per tensor, dynamic), everything else in bf16; see :mod:`fastvideo3.models.wan.fp8`.
#: Needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9).
Precision = Literal["fp32", "bf16", "fp16", "fp8_e4m3"]
FP8 = "fp8_e4m3"
TaskName = Literal[Task.TEXT_TO_VIDEO, Task.IMAGE_TO_VIDEO, Task.VAE_DECODE, Task.REWARD]
ComponentKind = Literal["dit", "vae", "text_encoder", "tokenizer", "scheduler", "reward_head", "image_encoder",
                        "image_processor"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Fp8Spec(_Spec):
    """How a component of precision ``fp8_e4m3`` is quantized (weights: always per output channel)."""

    #: activation scales: one per token (fused into the kernel before each GEMM) or one per tensor
    activation_scaling: Literal["token", "tensor"] = "token"
    #: self-attention in FP8 where the GPU's kernel supports it (FlashAttention-3), else bf16
    attention: Literal["fp8", "bf16"] = "fp8"
    #: FP8 attention's Q/K scales: "bound" (static, from the RMSNorm weights: no pass), "amax"
    #: (measured per sample and head) or "smooth_k" (K minus its token mean, then measured)
    attention_scales: Literal["bound", "amax", "smooth_k"] = "bound"
    #: GEMM partial sums: "fp32" (promoted, the default) or "fast" (kept in the tensor cores'
    #: narrower FP8 accumulator: faster, less exact)
    accumulation: Literal["fp32", "fast"] = "fp32"


class ComponentSpec(_Spec):
    """One component of a card: what it is, where its weights come from, what it needs."""

    component_id: str
    kind: ComponentKind
    #: how to instantiate: "seeded" (deterministic weights from ``seed``, no files),
    #: "shipped" (trained weights inside the package: ``fastvideo3/weights/<subfolder>``, a
    #: safetensors file) or "diffusers_dir" (a subfolder of a diffusers-format checkpoint directory).
    source: Literal["seeded", "shipped", "diffusers_dir"] = "seeded"
    subfolder: str | None = None
    #: architecture config (e.g. the DiT's heads, dims, layers). Checked against the checkpoint.
    config: dict = Field(default_factory=dict)
    precision: Precision = "fp32"
    #: name of the explicit key map used to load its weights (see CheckpointManifest).
    key_map: str | None = None
    #: the FP8 scheme of a ``precision: fp8_e4m3`` DiT (defaults apply when omitted)
    fp8: Fp8Spec | None = None

    @model_validator(mode="after")
    def _check_fp8(self) -> "ComponentSpec":
        if self.precision == FP8 and self.kind != "dit":
            raise ValueError(f"precision {FP8} is only defined for a dit component, not {self.kind!r}")
        if self.fp8 is not None and self.precision != FP8:
            raise ValueError(f"fp8 settings are given but precision is {self.precision!r}, not {FP8!r}")
        return self


class CheckpointManifest(_Spec):
    """Explicit components and the task sets each is required or optional for. No guessing."""

    root: str | None = None  # a diffusers-format directory, or None for seeded weights
    seed: int = 0
    required_for: dict[str, list[str]] = Field(default_factory=dict)  # task -> component ids
    optional_for: dict[str, list[str]] = Field(default_factory=dict)
    #: weight files, relative to the root (for shipped components: to the package's weights
    #: directory unless ``root`` is set) -> ``sha256:<64 hex>`` of the whole file. A pool checks
    #: them at start (fastvideo3/card/verify.py) and refuses to serve on a missing or wrong file.
    digests: dict[str, str] = Field(default_factory=dict)

    @field_validator("digests")
    @classmethod
    def _digests(cls, v: dict[str, str]) -> dict[str, str]:
        check_digests(v)
        return v


_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def check_digests(digests: dict[str, str]) -> None:
    """Relative paths inside the root, each with a ``sha256:<64 lowercase hex>`` digest."""
    for path, digest in digests.items():
        parts = path.split("/")
        if not path or path.startswith("/") or ".." in parts or "" in parts:
            raise ValueError(f"digests: {path!r} must be a relative path inside the checkpoint root")
        if not _DIGEST.match(digest):
            raise ValueError(f"digests.{path}: {digest!r} is not sha256:<64 lowercase hex>")


class SamplerSpec(_Spec):
    name: Literal[Sampler.UNIPC, Sampler.EULER] = Sampler.UNIPC
    flow_shift: float = Field(3.0, gt=0.0, le=100.0)
    solver_order: int = Field(2, ge=1, le=3)
    num_train_timesteps: int = 1000
    #: the sigmas a request's steps take: "scheduler" (the scheduler's own spacing for a step count,
    #: as ``set_timesteps(num_inference_steps)`` makes it) or "linear" (``linspace(1, 0, steps + 1)``
    #: without its last point, then shifted: what HunyuanVideo15Pipeline passes as ``sigmas``)
    sigma_spacing: Literal["scheduler", "linear"] = "scheduler"


class ExpertsSpec(_Spec):
    """Two denoising experts split by noise level (Wan2.2 A14B): ``high_noise`` runs the steps whose
    timestep is >= ``boundary_ratio * num_train_timesteps``, ``low_noise`` the rest, with
    ``guidance_scale_2`` (the request's, else its ``guidance_scale``). Which pool holds which
    expert is the deployment's choice, not the card's."""

    high_noise: str = "transformer"
    low_noise: str = "transformer_2"
    boundary_ratio: float = Field(gt=0.0, lt=1.0)
    #: guidance of the low-noise expert when a request names neither guidance scale
    default_guidance_2: float | None = Field(None, ge=0.0)


class LoopSpec(_Spec):
    """A loop the card serves and its limits. ``loop_id`` names the loop class in fastvideo3.loop."""

    loop_id: Literal[LoopId.TEXT_ENCODE, LoopId.DIFFUSION_DENOISE, LoopId.VAE_DECODE, LoopId.REWARD_SCORE]
    default_steps: int | None = Field(None, ge=1)
    min_steps: int = Field(1, ge=1)
    max_steps: int = Field(1000, ge=1)
    sampler: SamplerSpec | None = None
    cfg_policies: list[Literal["none", "classic", "batched"]] = Field(default_factory=lambda: ["none", "classic", "batched"])
    default_cfg_policy: Literal["none", "classic", "batched"] = "batched"
    #: two experts split by noise level (diffusion_denoise only); None: one DiT, ``transformer``
    experts: ExpertsSpec | None = None


class RecipeSpec(_Spec):
    """What produced these weights, and what serving them assumes. The assumptions are enforced."""

    method: str = "base"  # "base" | "seeded" | "flow_matching" | "step_distill" | ...
    parents: list[str] = Field(default_factory=list)
    data_contract: str = ""
    assumes_loop: str = LoopId.DIFFUSION_DENOISE
    #: a distilled recipe pins the step count it was trained for; None = any in the loop's range
    assumes_steps: int | None = None
    assumes_sampler: str | None = None
    assumes_precision: Precision | None = None
    consistency_required: str = "C1"
    training_command: str | None = None


class ParitySpec(_Spec):
    """Declared tolerances of the parity ladder; tests read them from here."""

    reference: str = "diffusers.WanPipeline"
    c0_dit_rel: float = 1e-5
    c0_vae_abs: float = 1e-4
    c0_text_rel: float = 1e-5
    c1_latents_rel: float = 1e-4
    c1_frames_abs: float = 1e-3
    bf16_rel: float = 2e-2
    #: frames of a bf16 (or fp16) VAE decode against the fp32 decode of the same latents, in [0, 1]:
    #: the largest difference of any pixel, and the mean (about one level of 8-bit video)
    vae_bf16_frames_abs: float = 1e-1
    vae_bf16_frames_mean_abs: float = 5e-3
    #: DiT output of an fp8_e4m3 card against the same weights in bf16 (relative Frobenius)
    fp8_rel: float = 5e-2


class PrecisionContract(_Spec):
    supported: list[Precision] = Field(default_factory=lambda: ["fp32", "bf16"])
    default_cpu: Precision = "fp32"
    default_cuda: Precision = "bf16"
    #: the precision the decoder pool runs the VAE in, per device: fp32 unless the card allows
    #: less (its frames then stay within ``parity.vae_bf16_frames_abs`` of the fp32 decode)
    vae_cpu: Literal["fp32", "bf16", "fp16"] = "fp32"
    vae_cuda: Literal["fp32", "bf16", "fp16"] = "fp32"

    def vae_for(self, device: str) -> str:
        return self.vae_cuda if str(device).startswith("cuda") else self.vae_cpu


class ParallelismContract(_Spec):
    """Plans a denoiser replica of this card may run (fastvideo3.parallel.PLAN_KINDS), whether
    CFG-parallel is allowed, and the fewest ranks it needs (memory: weights or activations
    that do not fit one device)."""

    plans: list[Literal["single", "sp_ulysses", "sp_ring", "hybrid"]] = Field(default_factory=lambda: ["single"])
    cfg_parallel: bool = False
    min_ranks: int = Field(1, ge=1, le=64)


class Limits(_Spec):
    """Request limits the card accepts. Frames must be 4k+1; sizes multiples of ``size_multiple``."""

    min_frames: int = 1
    max_frames: int = 129
    min_size: int = 16
    max_height: int = 1280
    max_width: int = 1280
    size_multiple: int = 16
    max_prompt_chars: int = 2000
    max_guidance: float = 50.0
    default_frames: int = 81
    default_height: int = 480
    default_width: int = 832
    default_guidance: float = 5.0
    fps: int = 16


#: at most this many CUDA-graph buckets (rows x shapes) per card: each costs a capture at warm-up
#: and its graph's memory for as long as the pool lives
MAX_GRAPH_BUCKETS = 32
#: the largest DiT forward (rows) a graph bucket may declare
MAX_GRAPH_ROWS = 256


class GraphShape(_Spec):
    """One request shape a graph bucket covers (video frames, height, width: a request's own sizes)."""

    frames: int
    height: int
    width: int


class GraphBucketSpec(_Spec):
    """The shape buckets the denoiser captures as CUDA graphs at warm-up: every ``rows`` x ``shapes``
    pair is one bucket. ``rows`` counts DiT rows per forward (requests x CFG branches in one
    forward: a request with batched CFG is 2 rows). A batch runs as the replays of its shape's
    buckets that cover its rows at the least cost (one bucket padded up to its rows, or several:
    fastvideo3.models.wan.runtime_export.cover_rows); a batch of a shape with no bucket runs
    eagerly. Empty: no graphs."""

    rows: list[int] = Field(default_factory=list)
    shapes: list[GraphShape] = Field(default_factory=list)

    @field_validator("rows")
    @classmethod
    def _rows(cls, v: list[int]) -> list[int]:
        for i, r in enumerate(v):
            if not 1 <= r <= MAX_GRAPH_ROWS:
                raise ValueError(f"rows[{i}] is {r}; rows must be in [1, {MAX_GRAPH_ROWS}]")
        if len(set(v)) != len(v):
            raise ValueError(f"rows {v} repeat a value")
        return sorted(v)

    @model_validator(mode="after")
    def _count(self) -> "GraphBucketSpec":
        if bool(self.rows) != bool(self.shapes):
            raise ValueError("rows and shapes must both be given (or both left empty)")
        keys = [(s.frames, s.height, s.width) for s in self.shapes]
        if len(set(keys)) != len(keys):
            raise ValueError("shapes repeat a shape")
        if len(self.rows) * len(self.shapes) > MAX_GRAPH_BUCKETS:
            raise ValueError(f"{len(self.rows)} rows x {len(self.shapes)} shapes = "
                             f"{len(self.rows) * len(self.shapes)} buckets; at most {MAX_GRAPH_BUCKETS}")
        return self

    @property
    def count(self) -> int:
        return len(self.rows) * len(self.shapes)


def _shape_problem(s: GraphShape, lim: Limits) -> str | None:
    """What keeps a request from asking for bucket shape ``s`` under ``lim`` (None: nothing)."""
    if (s.frames - 1) % 4 or not lim.min_frames <= s.frames <= lim.max_frames:
        return f"frames must be 4k+1 in [{lim.min_frames}, {lim.max_frames}]"
    for name, v, hi in (("height", s.height, lim.max_height), ("width", s.width, lim.max_width)):
        if v % lim.size_multiple or not lim.min_size <= v <= hi:
            return f"{name} must be a multiple of {lim.size_multiple} in [{lim.min_size}, {hi}]"
    return None


def check_graph_shapes(spec: GraphBucketSpec, lim: Limits) -> None:
    """Each bucket shape is one a request may ask for under the card's limits (raises ValueError
    naming ``shapes[i]``): frames 4k+1 in range, sizes multiples of ``size_multiple`` in range."""
    for i, s in enumerate(spec.shapes):
        problem = _shape_problem(s, lim)
        if problem is not None:
            raise ValueError(f"shapes[{i}] ({s.frames}x{s.height}x{s.width} frames x height x width): {problem}")


def graph_buckets_within(spec: GraphBucketSpec, lim: Limits) -> GraphBucketSpec:
    """The buckets whose shapes a request may ask for under ``lim`` (none when no shape fits):
    a card whose limits were narrowed keeps the buckets it can still serve."""
    shapes = [s for s in spec.shapes if _shape_problem(s, lim) is None]
    return GraphBucketSpec(rows=list(spec.rows), shapes=shapes) if shapes else GraphBucketSpec()


class CapabilityMatrix(_Spec):
    tasks: list[TaskName] = Field(default_factory=lambda: [Task.TEXT_TO_VIDEO, Task.VAE_DECODE])
    negative_prompt: bool = True
    seeds: bool = True
    batching: bool = True


class ExtensionContract(_Spec):
    """Which interceptors (fastvideo3.extend) the card allows, its default, and its tuned
    parameters per policy. A distilled few-step recipe allows none: every step matters."""

    allowed: list[str] = Field(default_factory=lambda: ["teacache", "fbcache", "dbcache"])
    #: the interceptor a request gets when it names none ({"policy": ..., params}); None = none
    default: dict[str, Any] | None = None
    #: policy -> parameter defaults tuned for this card (a request's values override them)
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> "ExtensionContract":
        from fastvideo3.extend.settings import POLICIES
        for name in [*self.allowed, *self.params, *([self.default.get("policy")] if self.default else [])]:
            if name not in POLICIES and name != "none":
                raise ValueError(f"extensions: unknown interceptor {name!r} (known: {', '.join(sorted(POLICIES))})")
        return self


class ModelCard(_Spec):
    model_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
    #: the model family (fastvideo3.card.family) whose rules read this card; it must be registered
    family: str = "wan"
    description: str = ""
    components: dict[str, ComponentSpec]
    loops: dict[str, LoopSpec]
    capabilities: CapabilityMatrix = Field(default_factory=CapabilityMatrix)
    recipe: RecipeSpec = Field(default_factory=RecipeSpec)
    parity: ParitySpec = Field(default_factory=ParitySpec)
    precision: PrecisionContract = Field(default_factory=PrecisionContract)
    parallelism: ParallelismContract = Field(default_factory=ParallelismContract)
    checkpoint: CheckpointManifest = Field(default_factory=CheckpointManifest)
    limits: Limits = Field(default_factory=Limits)
    extensions: ExtensionContract = Field(default_factory=ExtensionContract)
    #: text encoder sequence length (Wan: 512)
    max_text_tokens: int = Field(512, ge=1, le=4096)
    #: CUDA-graph shape buckets the denoiser captures at warm-up (empty: none)
    graph_buckets: GraphBucketSpec = Field(default_factory=GraphBucketSpec)

    @field_validator("graph_buckets")
    @classmethod
    def _graph_shapes(cls, v: GraphBucketSpec, info) -> GraphBucketSpec:
        lim = info.data.get("limits")
        if lim is not None:  # a bad limits field is reported on its own
            check_graph_shapes(v, lim)
        return v

    @field_validator("family")
    @classmethod
    def _registered_family(cls, v: str) -> str:
        from fastvideo3.card.family import families
        if v not in families():
            raise ValueError(f"unknown model family {v!r} (registered: {', '.join(families()) or 'none'})")
        return v

    @model_validator(mode="after")
    def _check_consistency(self) -> "ModelCard":
        if self.recipe.assumes_loop not in self.loops:
            raise ValueError(f"recipe.assumes_loop {self.recipe.assumes_loop!r} is not one of the card's loops {sorted(self.loops)}")
        for key, comp in self.components.items():
            if comp.component_id != key:
                raise ValueError(f"components.{key}.component_id is {comp.component_id!r}, expected {key!r}")
        for table in ("required_for", "optional_for"):
            for task, comps in getattr(self.checkpoint, table).items():
                for c in comps:
                    if c not in self.components:
                        raise ValueError(f"checkpoint.{table}.{task} names unknown component {c!r}")
        for task in self.capabilities.tasks:
            if task not in self.checkpoint.required_for:
                raise ValueError(f"capability {task!r} has no checkpoint.required_for entry")
        d = self.loops.get(LoopId.DIFFUSION_DENOISE)
        if d is not None:
            if d.min_steps > d.max_steps:
                raise ValueError("loops.diffusion_denoise.min_steps exceeds max_steps")
            if d.default_steps is not None and not d.min_steps <= d.default_steps <= d.max_steps:
                raise ValueError("loops.diffusion_denoise.default_steps is outside [min_steps, max_steps]")
            if d.default_cfg_policy not in d.cfg_policies:
                raise ValueError("loops.diffusion_denoise.default_cfg_policy is not in cfg_policies")
            if self.recipe.assumes_steps is not None and not d.min_steps <= self.recipe.assumes_steps <= d.max_steps:
                raise ValueError("recipe.assumes_steps is outside the denoise loop's step range")
            for name in self.dit_components():
                if name not in self.components or self.components[name].kind != "dit":
                    raise ValueError(f"loops.diffusion_denoise names expert {name!r}, which is not a dit component")
            if d.experts is not None and d.experts.high_noise == d.experts.low_noise:
                raise ValueError("loops.diffusion_denoise.experts: high_noise and low_noise must differ")
        self._check_fp8_contract()
        lim = self.limits
        if (lim.default_frames - 1) % 4 or not lim.min_frames <= lim.default_frames <= lim.max_frames:
            raise ValueError("limits.default_frames must be 4k+1 within [min_frames, max_frames]")
        for f in ("default_height", "default_width"):
            if getattr(lim, f) % lim.size_multiple:
                raise ValueError(f"limits.{f} must be a multiple of limits.size_multiple")
        return self

    def _check_fp8_contract(self) -> None:
        """An FP8 card is FP8 throughout: its DiT, its precision contract and its recipe agree."""
        dits = [c for c in self.components.values() if c.kind == "dit"]
        dit_fp8 = any(c.precision == FP8 for c in dits)
        pc = self.precision
        if dit_fp8:
            if pc.supported != [FP8] or pc.default_cpu != FP8 or pc.default_cuda != FP8:
                raise ValueError(f"a card whose DiT is {FP8} must support only {FP8} (precision.supported, "
                                 "default_cpu, default_cuda)")
            if self.recipe.assumes_precision != FP8:
                raise ValueError(f"a card whose DiT is {FP8} must have recipe.assumes_precision {FP8}")
        elif FP8 in pc.supported or self.recipe.assumes_precision == FP8:
            raise ValueError(f"precision {FP8} needs a dit component declared with precision {FP8}")

    # -- the recipe's teeth -------------------------------------------------------------
    def check_recipe(self, *, loop: str, steps: int, sampler: str, precision: str) -> None:
        """Refuse a request that asks for a loop, step count, sampler or precision the recipe
        does not allow. Raises :class:`RecipeMismatch` (FAILED_PRECONDITION at the edges)."""
        r = self.recipe
        for field, assumed, asked, mismatch in (
            ("loop", r.assumes_loop, loop,
             f"was produced by recipe {r.method!r} for loop {r.assumes_loop!r}, not {loop!r}"),
            ("num_inference_steps", r.assumes_steps, steps,
             f"is a {r.method} recipe that assumes {r.assumes_steps} steps; {steps} requested"),
            ("sampler", r.assumes_sampler, sampler, f"assumes sampler {r.assumes_sampler!r}; {sampler!r} requested"),
            ("precision", r.assumes_precision, precision,
             f"assumes precision {r.assumes_precision}; {precision} requested"),
        ):
            if assumed is not None and asked != assumed:
                raise RecipeMismatch(f"card {self.model_id} {mismatch}", field=field, limit=str(assumed))

    @property
    def denoise(self) -> LoopSpec:
        return self.loops[LoopId.DIFFUSION_DENOISE]

    def dit_components(self) -> list[str]:
        """The DiT components the denoise loop runs: its two experts (high noise first), or
        ``transformer``."""
        d = self.loops.get(LoopId.DIFFUSION_DENOISE)
        if d is not None and d.experts is not None:
            return [d.experts.high_noise, d.experts.low_noise]
        return ["transformer"]

    def component_of_kind(self, kind: str) -> ComponentSpec:
        for c in self.components.values():
            if c.kind == kind:
                return c
        raise KeyError(kind)
