"""The scheduler with pricing and admission: reservation before a request steps, refusals that
come back at once with a retry hint, and a cost model that calibrates on measured steps."""
import json
from pathlib import Path

import pytest

from fastvideo3.card import get_card
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.economy.admission import AdmissionConfig, AdmissionController, SloClass
from fastvideo3.runtime.economy.cost import CalibratedCostModel
from fastvideo3.runtime.economy.pricing import Pricer
from fastvideo3.runtime.scheduling.scheduler import PROGRAM_T2V, TERMINAL, CoreScheduler
from tests.helpers_fake_pool import fake_result

pytestmark = pytest.mark.timeout(60)
CARD = get_card("wan-tiny")
DATA = Path(__file__).parent.parent / "data"


class FakePool:
    """Answers every unit at once with the references the loops expect."""

    def __init__(self, role):
        self.role = role
        self.seen: list[str] = []

    def execute(self, batch):
        out = []
        for u in batch:
            self.seen.append(u.request_id)
            out.append(fake_result(self.role, u))
        return out

    def release(self, request_id):
        pass

    def describe(self):
        return {"role": self.role}


def _req(rid, **kw):
    return resolve(GenerateRequest(prompt="x", request_id=rid, num_inference_steps=3, **kw), CARD)


def _scheduler(memory_budget, queue_bound=8):
    pricer = Pricer(CalibratedCostModel())
    classes = (SloClass("interactive", compute_budget_s=1e6, queue_bound=queue_bound, max_wait_s=60.0,
                        latency_sensitive=True),
               SloClass("batch", compute_budget_s=1e6, queue_bound=queue_bound))
    adm = AdmissionController(AdmissionConfig(memory_budget_bytes=memory_budget, classes=classes))
    pools = {r: [FakePool(r)] for r in ("encoder", "denoiser", "decoder")}
    return CoreScheduler(pools, pricer=pricer, admission=adm), pricer, adm


def test_two_requests_that_fit_alone_but_not_together_run_one_after_the_other():
    probe = Pricer(CalibratedCostModel()).reservation(CARD, _req("p"), PROGRAM_T2V)
    sched, _, adm = _scheduler(int(probe.memory_bytes * 1.5))
    a = sched.submit(_req("a"), CARD)
    b = sched.submit(_req("b"), CARD)
    overlap = False
    while sched.active():
        sched.tick()
        overlap |= a.status == "RUNNING" and b.status == "RUNNING"
    assert not overlap
    assert a.status == b.status == "SUCCEEDED"
    assert adm.counters()["classes"]["interactive"]["admitted"] == 2 if "classes" in adm.counters() else True
    assert not adm.in_flight_ids()


def test_memory_that_can_never_fit_is_refused_at_once_and_others_complete():
    probe = Pricer(CalibratedCostModel()).reservation(CARD, _req("p"), PROGRAM_T2V)
    sched, _, _ = _scheduler(int(probe.memory_bytes * 1.5))
    ok = sched.submit(_req("ok"), CARD)
    huge = sched.submit(_req("huge", num_frames=65, height=512, width=512), CARD)
    sched.tick()
    assert huge.status == "FAILED" and huge.error.code == "RESOURCE_EXHAUSTED"
    assert huge.error.field == "memory"
    while sched.active():
        sched.tick()
    assert ok.status == "SUCCEEDED"


def test_queue_bound_refuses_with_retry_hint_and_queued_ones_complete():
    probe = Pricer(CalibratedCostModel()).reservation(CARD, _req("p"), PROGRAM_T2V)
    sched, _, _ = _scheduler(int(probe.memory_bytes * 1.5), queue_bound=1)
    runs = [sched.submit(_req(f"r{i}"), CARD) for i in range(4)]
    sched.tick()
    refused = [r for r in runs if r.status == "FAILED"]
    assert refused and all(r.error.code == "RESOURCE_EXHAUSTED" and r.error.retry_after_s for r in refused)
    while sched.active():
        sched.tick()
    done = [r for r in runs if r.status == "SUCCEEDED"]
    assert len(done) == 2 and all(r.status in TERMINAL for r in runs)


def test_units_carry_predicted_gpu_seconds():
    sched, pricer, _ = _scheduler(1 << 40)
    seen = []
    orig = sched.executors["denoiser"][0].execute
    sched.executors["denoiser"][0].execute = lambda batch: (seen.extend(u.resources.gpu_seconds for u in batch),
                                                            orig(batch))[1]
    sched.submit(_req("a"), CARD)
    while sched.active():
        sched.tick()
    assert seen and all(s > 0 for s in seen)
    assert pricer.cost_model.error_stats()["count"] > 0


def test_calibration_on_recorded_tiny_model_timings():
    """Step timings recorded from 20 tiny-model requests (bench/cost_calibration.py): replayed
    through a fresh cost model in arrival order, the calibrated predictions of the second half
    are within 25% median absolute error, and no worse than the uncalibrated prior."""
    rec = json.loads((DATA / "tiny_step_timings.json").read_text())
    units = rec["units"]
    assert rec["requests"] >= 20 and len(units) >= 100
    pricer = Pricer(CalibratedCostModel())
    errs, prior_errs = [], []
    for i, u in enumerate(units):
        req = resolve(GenerateRequest(**u["request"]), CARD)
        pred = pricer.predict(u["kind"], u["shape_sig"], CARD, req, prompts=u.get("prompts", 1))
        if i >= len(units) // 2 and u["kind"] == "diffusion_step":
            errs.append(abs(pred.gpu_seconds - u["seconds"]) / u["seconds"])
            prior_errs.append(abs(pred.prior_seconds - u["seconds"]) / u["seconds"])
        pricer.cost_model.observe(u["kind"], u["shape_sig"], u["seconds"], pred)
    errs.sort()
    prior_errs.sort()
    median = errs[len(errs) // 2]
    assert median <= 0.25, median
    assert median <= prior_errs[len(prior_errs) // 2] + 0.02  # calibration never makes it worse
