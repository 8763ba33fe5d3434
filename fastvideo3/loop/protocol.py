"""The loop contract: a loop is a serializable state machine the runtime drives.

    state = loop.init(request, card, ctx)
    while not isinstance(plan := loop.next(state), Done):
        result = execute(plan)            # the runtime admits, batches, places and runs
        state = loop.advance(state, result)
    return loop.finalize(state)

``next`` describes work and runs no kernels; ``advance`` folds a StepResult in and may branch on
it. All per-request state lives in the LoopState (small, typed, JSON-serializable) or in
pool-resident regions it names by reference. The only place iteration lives is
:class:`fastvideo3.loop.driver.LoopDriver`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Mapping, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, ValidationInfo

from fastvideo3.errors import ErrorInfo
from fastvideo3.transport.ref import TensorRef

if TYPE_CHECKING:
    from fastvideo3.loop.context import RequestContext


def _ref_in(value: Any, info: ValidationInfo) -> TensorRef:
    """A LoopState field holds TensorRef objects; only a checkpoint's JSON brings the dict form."""
    if isinstance(value, TensorRef):
        return value
    if info.mode == "json" and isinstance(value, Mapping):
        return TensorRef.from_dict(value)
    raise ValueError(f"expected a TensorRef, got {type(value).__name__}")


#: a LoopState field type: a TensorRef in the process, its ``to_dict()`` form in the state's JSON
Ref = Annotated[TensorRef, PlainValidator(_ref_in), PlainSerializer(lambda r: r.to_dict(), return_type=dict,
                                                                     when_used="json")]


class LoopState(BaseModel):
    """Base of every loop's typed state. Subclasses add fields; nothing else holds request state."""

    model_config = ConfigDict(extra="forbid")

    request_id: str
    loop_id: str
    done: bool = False

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> "LoopState":
        return cls.model_validate_json(text)


@dataclass(frozen=True)
class Resources:
    """What a unit of work reserves: predicted GPU-seconds, resident and peak bytes."""

    gpu_seconds: float = 0.0
    resident_bytes: int = 0
    peak_bytes: int = 0


@dataclass
class WorkPlan:
    """One step a loop wants run. ``shape_sig`` keys batch compatibility and graph capture."""

    loop_id: str
    request_id: str
    kind: str  # encoder_chunk | diffusion_step | vae_tile | reward_batch
    role: str  # the pool that runs it: encoder | denoiser | decoder | reward
    shape_sig: str
    #: the kind's typed params (fastvideo3.loop.params), or a plain mapping for ad-hoc loops
    params: Mapping[str, Any] = field(default_factory=dict)
    inputs: dict[str, TensorRef] = field(default_factory=dict)  # name -> ref, pulled by the pool
    resources: Resources = field(default_factory=Resources)
    step: int | None = None
    total: int | None = None


@dataclass
class StepResult:
    """What a pool returns for one WorkUnit: small values and references, never bulk tensors."""

    unit_id: str
    request_id: str
    ok: bool = True
    error: ErrorInfo | None = None
    outputs: dict[str, TensorRef] = field(default_factory=dict)  # name -> ref to what the pool published
    metrics: dict[str, float] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)
    measured_seconds: float = 0.0
    #: a small encoded artifact returned inline (e.g. the mp4 a decoder pool encoded itself);
    #: the scheduler streams it to the client and keeps it out of every LoopState.
    inline: bytes = b""
    #: span attributes for the pool's execute span of this unit (e.g. which CUDA-graph bucket ran
    #: it); read by the pool's telemetry, never sent over the wire
    span_attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoopResult:
    request_id: str
    loop_id: str
    outputs: dict[str, TensorRef] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass
class Done:
    result: LoopResult


@runtime_checkable
class Loop(Protocol):
    loop_id: str

    def init(self, request: Any, card: Any, ctx: "RequestContext") -> LoopState: ...

    def next(self, state: LoopState) -> WorkPlan | Done: ...

    def advance(self, state: LoopState, result: StepResult) -> LoopState: ...

    def finalize(self, state: LoopState) -> LoopResult: ...
