"""Property test of the memory StateStore against a plain model of the contract.

Random sequences of put / checkpoint / artifact / end / delete / clock advance / restart must
keep: an ended or deleted request is never in flight; the latest checkpoint written while in
flight wins; writes after end or delete are refused and leave no key; ended requests vanish
after their TTL and in-flight ones never do.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from fastvideo3.state import INFLIGHT, Checkpoint, MemoryData, MemoryStateStore, StoreConfig

TTL_S = 10.0
IDS = st.sampled_from(["a", "b", "c", "d"])
STATUSES = st.sampled_from(["SUCCEEDED", "FAILED", "CANCELLED"])


@dataclass
class ModelRequest:
    meta: dict
    status: str = INFLIGHT
    checkpoint: Checkpoint | None = None
    artifacts: dict = field(default_factory=dict)
    expires_at: float | None = None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class MemoryStoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.data = MemoryData()
        self.store = self._new_store()
        self.model: dict[str, ModelRequest] = {}

    def _new_store(self) -> MemoryStateStore:
        return MemoryStateStore(StoreConfig(ttl_after_end_s=TTL_S), data=self.data, clock=self.clock)

    def _expire_model(self) -> None:
        now = self.clock.now
        for rid in [r for r, m in self.model.items() if m.expires_at is not None and m.expires_at <= now]:
            del self.model[rid]

    @rule(rid=IDS, n=st.integers(0, 3))
    def put(self, rid: str, n: int) -> None:
        self.store.put_request(rid, {"n": n})
        self.model[rid] = ModelRequest(meta={"n": n})

    @rule(rid=IDS, step=st.integers(0, 50), blob=st.binary(max_size=16))
    def checkpoint(self, rid: str, step: int, blob: bytes) -> None:
        wrote = self.store.checkpoint(rid, step, blob)
        entry = self.model.get(rid)
        expect = entry is not None and entry.status == INFLIGHT
        assert wrote == expect
        if expect:
            entry.checkpoint = Checkpoint(step, blob)

    @rule(rid=IDS, name=st.sampled_from(["video", "preview"]), size=st.integers(0, 9))
    def artifact(self, rid: str, name: str, size: int) -> None:
        wrote = self.store.put_artifact(rid, name, {"bytes": size})
        entry = self.model.get(rid)
        expect = entry is not None and entry.status == INFLIGHT
        assert wrote == expect
        if expect:
            entry.artifacts[name] = {"bytes": size}

    @rule(rid=IDS, status=STATUSES)
    def end(self, rid: str, status: str) -> None:
        ended = self.store.end_request(rid, status)
        entry = self.model.get(rid)
        expect = entry is not None and entry.status == INFLIGHT
        assert ended == expect
        if expect:
            entry.status = status
            entry.expires_at = self.clock.now + TTL_S

    @rule(rid=IDS)
    def delete(self, rid: str) -> None:
        self.store.delete_request(rid)
        self.model.pop(rid, None)
        assert self.store.keys_for(rid) == []

    @rule(seconds=st.sampled_from([0.5, 3.0, 7.0, TTL_S]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.now += seconds
        self._expire_model()

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store = self._new_store()

    @invariant()
    def store_matches_model(self) -> None:
        inflight = self.store.list_inflight()
        assert inflight == sorted(r for r, m in self.model.items() if m.status == INFLIGHT)
        for rid in ["a", "b", "c", "d"]:
            entry = self.model.get(rid)
            if entry is None:
                assert self.store.keys_for(rid) == []
                assert self.store.get_request(rid) is None
                assert rid not in inflight
                continue
            if entry.status != INFLIGHT:
                assert rid not in inflight  # an ended request is never in flight
            assert self.store.status(rid) == entry.status
            assert self.store.get_request(rid) == entry.meta
            assert self.store.load_checkpoint(rid) == entry.checkpoint  # latest write wins
            assert self.store.artifacts(rid) == entry.artifacts


@pytest.mark.timeout(60)
def test_memory_store_keeps_its_invariants() -> None:
    run_state_machine_as_test(
        MemoryStoreMachine,
        settings=settings(
            max_examples=150, stateful_step_count=40, deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
