"""The one loop driver. Every loop, in every mode, is iterated here and nowhere else.

The driver is a small state machine itself, so a scheduler can interleave many of them:
``plan()`` returns the pending WorkPlan (or None once the loop is done), ``apply(result)`` folds a
result in. :func:`run_loop` is the blocking form for a single loop and uses the same two calls.
"""
from __future__ import annotations

from typing import Callable

from fastvideo3.errors import Internal
from fastvideo3.loop.protocol import Done, Loop, LoopResult, LoopState, StepResult, WorkPlan
from fastvideo3.transport.ref import TensorRef


class LoopDriver:
    def __init__(self, loop: Loop, state: LoopState):
        self.loop = loop
        self.state = state
        self._pending: WorkPlan | None = None
        self.result: LoopResult | None = None
        self.steps_applied = 0

    @property
    def done(self) -> bool:
        return self.result is not None

    def plan(self) -> WorkPlan | None:
        """The next WorkPlan, stable until :meth:`apply` is called; None when the loop is done."""
        if self.result is not None:
            return None
        if self._pending is None:
            nxt = self.loop.next(self.state)
            if isinstance(nxt, Done):
                self.result = nxt.result
                return None
            self._pending = nxt
        return self._pending

    def apply(self, result: StepResult) -> None:
        """Fold a result into the state. Raises the result's typed error when it failed."""
        if self._pending is None:
            raise Internal("apply() without a pending plan")
        if not result.ok:
            self._pending = None
            raise (result.error.to_exception() if result.error else Internal("step failed"))
        for name, ref in result.outputs.items():  # refs are objects in a process; dicts only on the wire
            if not isinstance(ref, TensorRef):
                raise Internal(f"result output {name!r} is a {type(ref).__name__}, not a TensorRef",
                               field=f"outputs.{name}")
        self.state = self.loop.advance(self.state, result)
        self._pending = None
        self.steps_applied += 1

    def finish(self) -> LoopResult:
        if self.plan() is not None or self.result is None:
            raise Internal("loop is not done")
        return self.result


def run_loop(loop: Loop, state: LoopState, execute: Callable[[WorkPlan], StepResult]) -> LoopResult:
    """Drive one loop to completion, calling ``execute`` for each plan."""
    driver = LoopDriver(loop, state)
    while (plan := driver.plan()) is not None:
        driver.apply(execute(plan))
    return driver.result  # type: ignore[return-value]
