"""WorkUnit: the smallest schedulable action — one loop step with a reservation and a deadline.

A WorkUnit is a WorkPlan stamped by the scheduler with an id, the card, a deadline and a cancel
scope. It is a plain dataclass inside the process (its inputs are TensorRef objects) and
``fastvideo3.v1.WorkUnit`` on the wire (services/common/convert.py converts both ways).
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from fastvideo3.loop.params import StepParams
from fastvideo3.loop.protocol import Resources, WorkPlan
from fastvideo3.transport.ref import TensorRef

_ids = itertools.count(1)


def copy_params(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """A unit's own (shallow) copy of its plan's params, keeping their type."""
    return params.copy() if isinstance(params, StepParams) else dict(params)


@dataclass
class WorkUnit:
    unit_id: str
    request_id: str
    loop_id: str
    kind: str
    role: str
    card_id: str
    shape_sig: str
    #: typed per kind (fastvideo3.loop.params) inside a process; a dict only at the wire edge
    params: Mapping[str, Any] = field(default_factory=dict)
    inputs: dict[str, TensorRef] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    deadline_unix: float = 0.0  # 0 = none
    step: int | None = None
    total: int | None = None
    trace: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_plan(cls, plan: WorkPlan, card_id: str, deadline_unix: float = 0.0) -> "WorkUnit":
        return cls(
            unit_id=f"u{next(_ids)}", request_id=plan.request_id, loop_id=plan.loop_id, kind=plan.kind,
            role=plan.role, card_id=card_id, shape_sig=plan.shape_sig, params=copy_params(plan.params),
            inputs=dict(plan.inputs), resources=plan.resources, deadline_unix=deadline_unix,
            step=plan.step, total=plan.total,
        )

    @property
    def batch_key(self) -> tuple:
        """Units with equal keys may run in one batch (card, kind, shape, precision, CFG policy
        are all folded into ``shape_sig`` by the loop that planned them)."""
        return (self.role, self.card_id, self.kind, self.shape_sig)

    def expired(self, now: float | None = None) -> bool:
        return bool(self.deadline_unix) and (now or time.time()) > self.deadline_unix
