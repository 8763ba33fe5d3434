"""The reward role's executor: scores decoded clips with :mod:`fastvideo3.models.reward` scorers.

It pulls the frames a decoder pool published (by reference, through the transport), runs every
scorer a unit names, and answers with the scores as metrics (``reward.<name>``) and payload.
"""
from __future__ import annotations

import hashlib

from fastvideo3.card.spec import ModelCard
from fastvideo3.loop.protocol import StepResult
from fastvideo3.models.reward.scorers import SCORERS, check_scorer_names, make_scorer
from fastvideo3.runtime.pool.executors import FETCH_DEADLINE_S, _Base, _fail, frames_as_float
from fastvideo3.vocab import Role


class RewardExecutor(_Base):
    role = Role.REWARD

    def __init__(self, card: ModelCard, transport, device=None, precision=None, scorers: list[str] | None = None):
        super().__init__(card, transport, device, precision or "fp32")
        names = check_scorer_names(scorers if scorers is not None else list(SCORERS))
        self.scorers = {n: make_scorer(n) for n in names}
        ident = ",".join(f"{n}@{s.version}" for n, s in sorted(self.scorers.items()))
        self.weights_digest = "scorers:" + hashlib.sha256(ident.encode()).hexdigest()[:32]

    def _execute(self, batch):
        out = []
        for unit in batch:
            try:
                names = check_scorer_names(unit.params.get("scorers") or [], available=self.scorers)
                frames = frames_as_float(self.transport.fetch(unit.inputs["frames"],
                                                              deadline_s=FETCH_DEADLINE_S))
                scores = {n: float(self.scorers[n].score(frames)) for n in names}
                out.append(StepResult(unit.unit_id, unit.request_id, payload={"scores": scores},
                                      metrics={f"reward.{n}": v for n, v in scores.items()}))
            except Exception as e:  # noqa: BLE001 - a unit's failure stays in its result
                out.append(_fail(unit, e))
        return out

    def describe(self) -> dict:
        d = super().describe()
        d["scorers"] = {n: s.version for n, s in self.scorers.items()}
        return d
