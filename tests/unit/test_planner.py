"""The planner alone: no executor is called, no thread started, no pool, no gRPC. Batches are
answered by hand-made StepResults, as vLLM's scheduler tests feed hand-made model outputs.

It checks the decisions the scheduler makes: batching (same-signature steps of different
requests share a batch under ``max_batch``; other shapes do not; a busy replica's units wait
for its next batch; a large round is cut in two for double buffering), admission (the running
set is bounded, a request over the memory budget is refused, one that fits only alone waits)
and cancellation (a cancelled request gets no further unit, and the result of its unit in
flight is dropped)."""
import threading

import pytest

from fastvideo3.card import get_card
from fastvideo3.loop.protocol import StepResult
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.economy.admission import AdmissionConfig, AdmissionController, SloClass
from fastvideo3.runtime.economy.cost import CalibratedCostModel
from fastvideo3.runtime.scheduling.planner import PROGRAM_T2V, TERMINAL, Planner, RequestRun
from fastvideo3.runtime.economy.pricing import Pricer
from tests.helpers_fake_pool import fake_result

pytestmark = pytest.mark.timeout(60)
CARD = get_card("wan-tiny")


class Replica:
    """A placeholder in the replica table: the planner may look at it, never run it."""

    def __init__(self, role: str, healthy: bool = True):
        self.role, self.healthy = role, healthy

    def execute(self, batch):  # pragma: no cover - the test fails if the planner calls it
        raise AssertionError("the planner called an executor")

    def release(self, request_id):  # pragma: no cover
        raise AssertionError("the planner released on an executor")

    def describe(self):  # pragma: no cover
        raise AssertionError("the planner asked an executor")


def answer(batch) -> list[StepResult]:
    """The results a pool would send back: references the loops expect."""
    return [fake_result(u.role, u) for u in batch.work]


def _req(rid: str, steps: int = 3, **kw):
    return resolve(GenerateRequest(prompt=f"prompt {rid}", request_id=rid, num_inference_steps=steps, **kw), CARD)


def _planner(denoisers: int = 1, **kw) -> Planner:
    table = {"encoder": [Replica("encoder")], "denoiser": [Replica("denoiser") for _ in range(denoisers)],
             "decoder": [Replica("decoder")]}
    return Planner(table, **kw)


def _submit(p: Planner, request) -> RequestRun:
    queued = p.reserve(request)
    return p.add(RequestRun(request=request, card=CARD, program=PROGRAM_T2V), queued)


def _round(p: Planner, **kw):
    """One round: schedule, then answer every batch. Returns the batches."""
    batches = p.schedule(**kw)
    for b in batches:
        p.update_from_output(b, answer(b), 0.01)
    return batches


def _denoise(batches):
    return [b for b in batches if b.units[0][0].kind == "diffusion_step"]


@pytest.fixture(autouse=True)
def no_threads():
    before = threading.active_count()
    yield
    assert threading.active_count() == before  # the planner started none


def test_same_signature_steps_of_different_requests_share_a_batch_under_max_batch():
    p = _planner(max_batch=2)
    runs = [_submit(p, _req(f"r{i}")) for i in range(3)]
    other = _submit(p, _req("wide", width=192))  # another shape: never in their batches
    seen = []
    while p.active():
        seen += _denoise(_round(p))
    assert all(r.status == "SUCCEEDED" for r in runs + [other])
    assert all(len(b.units) <= 2 for b in seen)  # max_batch
    mixed = [b for b in seen if len({u.request_id for u, _ in b.units}) > 1]
    assert mixed, "steps of different requests never shared a batch"
    for b in seen:
        assert len({u.shape_sig for u, _ in b.units}) == 1
        assert ("wide" in {u.request_id for u, _ in b.units}) == (len(b.units) == 1 and b.units[0][1] is other)
    # every request took one step per round: three steps each, in three rounds of denoising
    assert sum(len(b.units) for b in seen) == 4 * 3
    assert p.counters["diffusion_step.multi_request_batches"] == len(mixed)


def test_new_requests_go_to_the_least_loaded_replica_and_stay_there():
    p = _planner(denoisers=2)
    a, b = _submit(p, _req("a")), _submit(p, _req("b"))
    placed = {}
    while p.active():
        for batch in _denoise(_round(p)):
            for _, run in batch.units:
                placed.setdefault(run.request_id, set()).add(batch.replica)
    assert placed == {"a": {0}, "b": {1}} or placed == {"a": {1}, "b": {0}}
    assert ("denoiser", a.placement["denoiser"]) in a.touched


def test_a_busy_replica_holds_units_for_its_next_batch_and_a_large_round_is_cut_in_two():
    p = _planner()
    runs = [_submit(p, _req(f"r{i}")) for i in range(4)]
    busy = {"n": 1}

    def capacity(ex):
        return (2 - busy["n"], busy["n"]) if ex.role == "denoiser" else None

    for b in p.schedule(capacity):  # encode
        p.update_from_output(b, answer(b), 0.01)
    assert p.schedule(capacity) == []  # the denoiser runs another batch: held back to join its next
    assert p.schedule(capacity, split_min_units=16) == []  # too few to double-buffer beside it
    assert all(r.pending is not None and not r.in_flight for r in runs)
    busy["n"] = 0
    batches = p.schedule(capacity, split_min_units=4)
    assert [len(b.units) for b in batches] == [2, 2]  # two halves, sent back to back
    assert all(r.in_flight and r.pending is None for r in runs)
    assert p.schedule(lambda ex: (2, 0)) == []  # all four have their one step in flight
    p.update_from_output(batches[0], answer(batches[0]), 0.01)
    busy["n"] = 1  # the other half still runs: this half goes beside it (double buffering)
    again = p.schedule(capacity, split_min_units=4)
    assert [sorted(u.request_id for u, _ in b.units) for b in again] == [["r0", "r1"]]
    p.update_from_output(batches[1], answer(batches[1]), 0.01)
    p.update_from_output(again[0], answer(again[0]), 0.01)
    assert [r.driver.state.step for r in runs] == [2, 2, 1, 1]
    busy["n"] = 0  # without double buffering the round goes as one batch
    assert [len(b.units) for b in p.schedule(capacity)] == [4]


def test_running_set_is_bounded_and_admission_refuses_or_holds_by_memory():
    p = _planner(max_running=1)
    a, b = _submit(p, _req("a")), _submit(p, _req("b"))
    overlap = False
    while p.active():
        _round(p)
        overlap |= a.status == "RUNNING" and b.status == "RUNNING"
    assert not overlap and a.status == b.status == "SUCCEEDED"

    pricer = Pricer(CalibratedCostModel())
    one = pricer.reservation(CARD, _req("probe"), PROGRAM_T2V).memory_bytes
    classes = (SloClass("interactive", compute_budget_s=1e6, queue_bound=8, max_wait_s=60.0,
                        latency_sensitive=True), SloClass("batch", compute_budget_s=1e6, queue_bound=8))
    adm = AdmissionController(AdmissionConfig(memory_budget_bytes=int(one * 1.5), classes=classes))
    p = _planner(pricer=pricer, admission=adm)
    x, y = _submit(p, _req("x")), _submit(p, _req("y"))
    huge = _submit(p, _req("huge", num_frames=65, height=512, width=512))
    first = p.schedule()
    assert huge.status == "FAILED" and huge.error.code == "RESOURCE_EXHAUSTED" and huge.error.field == "memory"
    assert (x.status, y.status) == ("RUNNING", "QUEUED")  # y fits only alone: it waits
    assert {u.request_id for b in first for u, _ in b.units} == {"x"}
    for b in first:
        p.update_from_output(b, answer(b), 0.01)
    while p.active():
        _round(p)
        assert not (x.status == "RUNNING" and y.status == "RUNNING")
    assert x.status == y.status == "SUCCEEDED" and not adm.in_flight_ids()


def test_queue_bound_refuses_with_the_field_and_the_limit():
    p = _planner(max_queued=2)
    _submit(p, _req("a"))
    _submit(p, _req("b"))
    with pytest.raises(Exception) as e:
        p.reserve(_req("c"))
    assert e.value.code == "RESOURCE_EXHAUSTED" and e.value.field == "queue" and e.value.limit == "2"
    with pytest.raises(Exception) as e:
        p.reserve(_req("a"))
    assert e.value.code == "INVALID_ARGUMENT" and e.value.field == "request_id"


def test_a_cancelled_request_gets_no_further_unit_and_its_in_flight_result_is_dropped():
    p = _planner()
    keep, gone = _submit(p, _req("keep", steps=6)), _submit(p, _req("gone", steps=6))
    _round(p)  # encode
    _round(p)  # step 0 of both
    batches = p.schedule()
    assert {u.request_id for b in batches for u, _ in b.units} == {"keep", "gone"}
    assert p.cancel("gone")
    step_before = gone.driver.state.step
    events_before = len(gone.events)
    for b in batches:
        p.update_from_output(b, answer(b), 0.01)
    assert gone.driver.state.step == step_before  # its result was dropped at the step boundary
    assert len(gone.events) == events_before
    assert keep.driver.state.step == step_before + 1
    later = []
    while p.active():
        later += [u.request_id for b in _round(p) for u, _ in b.units]
    assert "gone" not in later and "keep" in later
    assert gone.status == "CANCELLED" and gone.error.code == "CANCELLED" and keep.status == "SUCCEEDED"
    ended = {e.request_id: e for e in p.take_ended()}
    assert ended["gone"].status == "CANCELLED"
    assert {pool for pool, _ in ended["gone"].replicas} == {"encoder", "denoiser"}  # what to free
    assert {pool for pool, _ in ended["keep"].replicas} == {"encoder", "denoiser", "decoder"}
    assert p.take_ended() == []


def test_deadlines_follow_the_injected_clock_and_unhealthy_replicas_are_not_chosen():
    now = [1000.0]
    table = {"encoder": [Replica("encoder")], "denoiser": [Replica("denoiser", healthy=False), Replica("denoiser")],
             "decoder": [Replica("decoder")]}
    p = Planner(table, clock=lambda: now[0])
    late = _submit(p, _req("late", deadline_s=5.0))
    late.created = now[0]
    ok = _submit(p, _req("ok"))
    ok.created = now[0]
    _round(p)
    batches = p.schedule()
    assert {b.replica for b in batches} == {1}  # the healthy one
    now[0] += 10.0  # past late's deadline, before its result is applied
    for b in batches:
        p.update_from_output(b, answer(b), 0.01)
    assert late.status == "RUNNING"  # acted on at its step boundary, not mid-step
    p.schedule()
    assert late.status == "FAILED" and late.error.code == "DEADLINE_EXCEEDED" and late.error.field == "deadline_s"
    assert all(r.status in TERMINAL or r is ok for r in (late, ok))


def test_small_requests_take_a_busy_replica_before_a_large_one_and_waiting_raises_the_large_one():
    """The replica takes one batch per round and the clock moves by what each batch is priced at:
    the small requests' steps all go before the large request's, although it came first; a large
    request that has waited long (its slowdown is the higher) goes before fresh small ones."""
    now = [1000.0]
    p = _planner(pricer=Pricer(CalibratedCostModel()), clock=lambda: now[0])
    large = _submit(p, _req("large", steps=6, width=192, height=192))
    small = [_submit(p, _req(f"s{i}", steps=3)) for i in range(2)]

    def one_batch(ex):
        return (1, 0) if ex.role == "denoiser" else None

    order = []
    while p.active():
        for b in p.schedule(capacity=one_batch):
            if b.units[0][0].kind == "diffusion_step":
                order.append(sorted(u.request_id for u, _ in b.units))
            now[0] += max(u.resources.gpu_seconds for u in b.work)
            p.update_from_output(b, answer(b), 0.01)
    assert all(r.status == "SUCCEEDED" for r in [large, *small])
    assert order[:3] == [["s0", "s1"]] * 3  # all small steps first
    assert order[3:] == [["large"]] * 6

    late = _submit(p, _req("late", steps=6, width=192, height=192))
    fresh = [_submit(p, _req(f"f{i}", steps=3)) for i in range(2)]
    _round(p, capacity=one_batch)  # encode
    assert p.schedule(lambda ex: (0, 1) if ex.role == "denoiser" else None) == []  # busy: all planned, held
    late_work = late.request.num_inference_steps * late.pending.resources.gpu_seconds
    small_work = fresh[0].request.num_inference_steps * fresh[0].pending.resources.gpu_seconds
    assert late_work > small_work > 0
    for r in fresh:
        r.started = now[0] - small_work  # slowdown 1
    late.started = now[0] - 2 * late_work  # slowdown 2
    first = next(b for b in p.schedule(capacity=one_batch) if b.units[0][0].kind == "diffusion_step")
    assert [u.request_id for u, _ in first.units] == ["late"]
    assert all(r.pending is not None for r in fresh)


def test_a_large_batch_is_not_sent_beside_small_ones_in_flight():
    """Double buffering sends a second batch beside the one in flight; a second batch of requests
    far less slowed-down (under half) than those in flight would hold their next step behind it,
    so it waits."""
    now = [1000.0]
    p = _planner(pricer=Pricer(CalibratedCostModel()), clock=lambda: now[0])
    large = [_submit(p, _req(f"l{i}", steps=4, width=192, height=192)) for i in range(2)]
    small = [_submit(p, _req(f"s{i}", steps=4)) for i in range(2)]
    busy = {"n": 0}

    def capacity(ex):
        return (2 - busy["n"], busy["n"]) if ex.role == "denoiser" else None

    _round(p, capacity=capacity)  # encode
    now[0] += 1.0  # all four have waited a second: the small ones are far more slowed down
    batches = p.schedule(capacity, split_min_units=4)
    assert [sorted(u.request_id for u, _ in b.units) for b in batches] == [["s0", "s1"]]
    assert all(r.pending is not None for r in large)  # two of them would double-buffer, but not beside these
    p.update_from_output(batches[0], answer(batches[0]), 0.01)
    assert [r.driver.state.step for r in small + large] == [1, 1, 0, 0]
    while any(r.driver.state.step < 4 for r in small):  # never beside the small ones: after them
        for b in p.schedule(capacity, split_min_units=4):
            assert {u.request_id for u in b.work} <= {"s0", "s1"}
            p.update_from_output(b, answer(b), 0.01)
    assert [r.driver.state.step for r in large] == [0, 0]
    batches = p.schedule(capacity, split_min_units=4)
    assert [sorted(u.request_id for u in b.work) for b in batches if b.units[0][0].kind == "diffusion_step"] == [
        ["l0", "l1"]]
