"""RELIABILITY 1 — scheduler invariants, property-based, on a CPU with fake pools.

Random interleavings of arrive / tick / fail / cancel / pool-loss against a real CoreScheduler
(with the real pricer, admission controller, tracing and checkpointer) whose pools answer at
once. After every rule:

* admitted work never exceeds the budget: RUNNING requests <= max_running, QUEUED <=
  max_queued, reserved memory and per-class GPU-seconds <= their budgets;
* no WorkUnit is issued for a request after its cancel was acknowledged;
* a request has at most one terminal event, and a terminal status iff it has one.

At the end every request is driven to exactly one terminal state, and nothing is left: no
reservation, no open span, no in-flight key in the state store.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fastvideo3.card.registry import resolve_card
from fastvideo3.errors import ErrorInfo, ResourceExhausted, Unavailable
from fastvideo3.loop.protocol import StepResult
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.economy.admission import AdmissionConfig, AdmissionController, SloClass
from fastvideo3.runtime.durability.checkpointer import Checkpointer
from fastvideo3.runtime.economy.cost import CalibratedCostModel
from fastvideo3.runtime.economy.pricing import Pricer
from fastvideo3.runtime.scheduling.scheduler import TERMINAL, CoreScheduler
from fastvideo3.state import MemoryStateStore
from fastvideo3.telemetry.hooks import SchedulerTelemetry
from fastvideo3.telemetry.tracing import init_tracing
from tests.helpers_fake_pool import fake_result

CARD = resolve_card("wan-tiny-seeded")
MAX_RUNNING, MAX_QUEUED = 3, 4
SIZES = [dict(num_frames=9, height=32, width=32), dict(num_frames=17, height=64, width=64),
         dict(num_frames=33, height=128, width=128)]


class FakePool:
    """Answers every unit at once; can fail one request's next unit, or lose a whole batch."""

    def __init__(self, role: str):
        self.role = role
        self.healthy = True
        self.issued: dict[str, int] = {}  # request id -> units received
        self.fail_next: set[str] = set()
        self.lose_next_batch = False
        self.regions: dict[str, int] = {}

    def execute(self, batch):
        if self.lose_next_batch:
            self.lose_next_batch = False
            raise Unavailable(f"{self.role} pool lost")
        out = []
        for u in batch:
            self.issued[u.request_id] = self.issued.get(u.request_id, 0) + 1
            if u.request_id in self.fail_next:
                self.fail_next.discard(u.request_id)
                out.append(StepResult(u.unit_id, u.request_id, ok=False, error=ErrorInfo("INTERNAL", "injected")))
                continue
            if u.kind == "diffusion_step":
                self.regions[u.request_id] = u.params["step"] + 1
            out.append(fake_result(self.role, u))
        return out

    def release(self, request_id):
        self.regions.pop(request_id, None)

    def describe(self):
        return {"role": self.role}


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pools = {"encoder": [FakePool("encoder")], "denoiser": [FakePool("denoiser"), FakePool("denoiser")],
                      "decoder": [FakePool("decoder")]}
        classes = (SloClass("interactive", compute_budget_s=400.0, queue_bound=8, max_wait_s=1e6,
                            latency_sensitive=True),
                   SloClass("batch", compute_budget_s=2000.0, queue_bound=8, max_wait_s=1e6))
        self.admission = AdmissionController(AdmissionConfig(memory_budget_bytes=2 << 30, classes=classes))
        self.spans = InMemorySpanExporter()
        self.telemetry = SchedulerTelemetry(init_tracing("scheduler", exporter=self.spans, set_global=False))
        self.store = MemoryStateStore()
        self.cp = Checkpointer(self.store, every=2)
        self.sched = CoreScheduler(self.pools, max_running=MAX_RUNNING, max_queued=MAX_QUEUED, max_batch=4,
                                   pricer=Pricer(CalibratedCostModel()), admission=self.admission,
                                   telemetry=self.telemetry, checkpoint=self.cp.checkpoint,
                                   admit_hook=self.cp.register, recover=self.cp.recover)
        self.cp.attach(self.sched)
        self.runs = []  # every RequestRun ever queued (ids may be reused)
        self.cancel_acked: dict[int, int] = {}  # id(run) -> units issued when its cancel was acknowledged
        self.n = 0

    def _issued(self, rid: str) -> int:
        return sum(p.issued.get(rid, 0) for reps in self.pools.values() for p in reps)

    def _tick(self) -> None:
        self.sched.tick()
        for run in self.runs:  # what FleetRuntime does after each tick
            if run.status in TERMINAL and not getattr(run, "_ended", False):
                run._ended = True
                self.cp.finish(run)

    # -- rules ---------------------------------------------------------------------------
    @rule(size=st.sampled_from(range(len(SIZES))), steps=st.integers(1, 6), reuse=st.booleans(),
          slo=st.sampled_from(["interactive", "batch"]))
    def arrive(self, size, steps, reuse, slo):
        ended = sorted({r.request_id for r in self.runs if self.sched.runs[r.request_id].status in TERMINAL})
        rid = ended[0] if reuse and ended else f"r{self.n}"
        self.n += 1
        req = resolve(GenerateRequest(prompt="p", request_id=rid, num_inference_steps=steps, seed=self.n,
                                      slo_class=slo, **SIZES[size]), CARD)
        queued = sum(r.status == "QUEUED" for r in self.sched.runs.values())
        try:
            run = self.sched.submit(req, CARD)
        except ResourceExhausted as e:
            assert queued >= MAX_QUEUED and e.retry_after_s
            return
        self.runs.append(run)

    @rule()
    def tick(self):
        self._tick()

    @precondition(lambda self: any(r.status not in TERMINAL for r in self.runs))
    @rule(data=st.data())
    def cancel(self, data):
        live = [r for r in self.runs if r.status not in TERMINAL]
        run = data.draw(st.sampled_from(live))
        if self.sched.cancel(run.request_id):
            self.cancel_acked.setdefault(id(run), self._issued(run.request_id))

    @precondition(lambda self: any(r.status == "RUNNING" for r in self.runs))
    @rule(data=st.data(), role=st.sampled_from(["encoder", "denoiser", "decoder"]))
    def fail_next_unit(self, data, role):
        run = data.draw(st.sampled_from([r for r in self.runs if r.status == "RUNNING"]))
        for p in self.pools[role]:
            p.fail_next.add(run.request_id)

    @rule(replica=st.integers(0, 1))
    def lose_denoiser_batch(self, replica):
        self.pools["denoiser"][replica].lose_next_batch = True

    @rule(replica=st.integers(0, 1))
    def denoiser_health_back(self, replica):
        self.pools["denoiser"][replica].healthy = True

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def budgets_hold(self):
        runs = list(self.sched.runs.values())
        assert sum(r.status == "RUNNING" for r in runs) <= MAX_RUNNING
        assert sum(r.status == "QUEUED" for r in runs) <= MAX_QUEUED
        c = self.admission.counters()
        assert c["memory_reserved_bytes"] <= c["memory_budget_bytes"]
        for cls in c["classes"].values():
            assert cls["reserved_gpu_seconds"] <= cls["compute_budget_s"] + 1e-6

    @invariant()
    def nothing_after_an_acknowledged_cancel(self):
        for run in self.runs:
            if id(run) in self.cancel_acked and self.sched.runs.get(run.request_id) is run:
                assert self._issued(run.request_id) == self.cancel_acked[id(run)], run.request_id

    @invariant()
    def one_terminal_event_at_most(self):
        for run in self.runs:
            finished = [e for e in run.events if e.kind == "finished"]
            assert len(finished) <= 1
            assert (len(finished) == 1) == (run.status in TERMINAL)

    def teardown(self):
        for p in self.pools["denoiser"]:
            p.healthy, p.lose_next_batch = True, False
        for _ in range(500):
            if not self.sched.active():
                break
            self._tick()
        for run in self.runs:
            assert run.status in TERMINAL, (run.request_id, run.status)
            assert [e.kind for e in run.events].count("finished") == 1
            if id(run) in self.cancel_acked:  # acknowledged: cancelled, unless it had already ended
                assert run.status in ("CANCELLED", "SUCCEEDED", "FAILED")
        c = self.admission.counters()
        assert not self.admission.in_flight_ids() and c["memory_reserved_bytes"] == 0
        assert not self.telemetry._live and not self.telemetry._units  # no open span
        assert self.store.list_inflight() == []  # every request ended (or deleted) in the store
        assert self.cp.latest == {} and self.cp.pending_ends == {}
        counted = self.sched.counters
        assert counted["succeeded"] + counted["failed"] + counted["cancelled"] == len(self.runs)


SchedulerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
test_scheduler_invariants = pytest.mark.timeout(240)(SchedulerMachine.TestCase)
