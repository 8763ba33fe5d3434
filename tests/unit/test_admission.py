"""AdmissionController: reservation before admission, with a fake clock and fake reservations."""
from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastvideo3.errors import FailedPrecondition, InvalidRequest, NotFound, ResourceExhausted
from fastvideo3.runtime.economy.admission import (
    AdmissionConfig,
    AdmissionController,
    Admitted,
    Refused,
    Reservation,
    SloClass,
    Wait,
)

GB = 1 << 30


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(memory: int = 10 * GB, interactive_s: float = 4.0, batch_s: float = 10.0, queue: int = 4,
         **kw) -> tuple[AdmissionController, FakeClock]:
    clock = FakeClock()
    config = AdmissionConfig(
        memory_budget_bytes=memory,
        classes=(
            SloClass("interactive", interactive_s, queue_bound=queue, max_wait_s=5.0, latency_sensitive=True),
            SloClass("batch", batch_s, queue_bound=queue, max_wait_s=60.0),
        ),
        **kw,
    )
    return AdmissionController(config, clock=clock), clock


def unit(s: float = 1.0, resident: int = GB, peak: int = GB) -> Reservation:
    return Reservation(s, resident, peak)


@pytest.mark.timeout(30)
def test_two_that_fit_alone_but_not_together_wait_then_admit_after_release():
    ctl, _ = make(memory=10 * GB)
    first = ctl.try_admit("a", [unit(2.0, 3 * GB, 3 * GB)], "batch")
    assert isinstance(first, Admitted) and first.reservation.memory_bytes == 6 * GB
    second = ctl.try_admit("b", [unit(2.0, 3 * GB, 3 * GB)], "batch")
    assert isinstance(second, Wait) and second.reason == "memory" and second.ahead == 0
    assert ctl.is_waiting("b") and not ctl.is_in_flight("b")
    assert isinstance(ctl.try_admit("b", [unit()], "batch"), Wait)  # asking again reports its place
    events = ctl.release("a")
    assert events == [Admitted("b", "batch", Reservation(2.0, 3 * GB, 3 * GB), False)]
    assert ctl.is_in_flight("b")
    c = ctl.counters()
    assert c["memory_reserved_bytes"] == 6 * GB
    assert c["classes"]["batch"]["admitted"] == 2 and c["classes"]["batch"]["waiting"] == 0


@pytest.mark.timeout(30)
def test_compute_budget_is_per_class():
    ctl, _ = make(interactive_s=4.0, batch_s=10.0, jumbo_threshold_s=100.0)
    assert isinstance(ctl.try_admit("b1", [unit(9.0, 0, 0)], "batch"), Admitted)
    assert isinstance(ctl.try_admit("i1", [unit(3.0, 0, 0)], "interactive"), Admitted)
    blocked = ctl.try_admit("b2", [unit(2.0, 0, 0)], "batch")
    assert isinstance(blocked, Wait) and blocked.reason == "compute"
    c = ctl.counters()["classes"]
    assert c["batch"]["reserved_gpu_seconds"] == pytest.approx(9.0)
    assert c["interactive"]["reserved_gpu_seconds"] == pytest.approx(3.0)


@pytest.mark.timeout(30)
def test_over_queue_bound_is_refused_with_retry_hint():
    ctl, _ = make(batch_s=2.0, queue=2)
    assert isinstance(ctl.try_admit("a", [unit(2.0, 0, 0)], "batch"), Admitted)
    assert isinstance(ctl.try_admit("b", [unit(1.0, 0, 0)], "batch"), Wait)
    assert isinstance(ctl.try_admit("c", [unit(1.0, 0, 0)], "batch"), Wait)
    refused = ctl.try_admit("d", [unit(1.0, 0, 0)], "batch")
    assert isinstance(refused, Refused)
    assert refused.retry_after_s is not None and refused.retry_after_s > 0
    assert isinstance(refused.error, ResourceExhausted)
    assert refused.error.code == "RESOURCE_EXHAUSTED" and refused.error.field == "queue"
    assert refused.error.retry_after_s == refused.retry_after_s
    # Backlog: 2 in flight + 2 queued + 1 own - 2 budget = 3 GPU-s at one GPU-s per second.
    assert refused.retry_after_s == pytest.approx(3.0)
    assert not ctl.is_waiting("d") and ctl.counters()["classes"]["batch"]["refused"] == 1


@pytest.mark.timeout(30)
def test_waiting_past_max_wait_is_refused_on_pump():
    ctl, clock = make(batch_s=2.0)
    ctl.try_admit("a", [unit(2.0, 0, 0)], "batch")
    assert isinstance(ctl.try_admit("b", [unit(1.0, 0, 0)], "batch"), Wait)
    clock.now = 59.0
    assert ctl.pump() == []
    clock.now = 61.0
    (event,) = ctl.pump()
    assert isinstance(event, Refused) and event.request_id == "b"
    assert event.error.field == "wait" and event.retry_after_s > 0
    assert not ctl.is_waiting("b")
    assert ctl.counters()["classes"]["batch"]["expired"] == 1


@pytest.mark.timeout(30)
def test_peak_over_whole_budget_is_refused_immediately_naming_memory():
    ctl, _ = make(memory=10 * GB)
    out = ctl.try_admit("huge", [unit(1.0, 0, 11 * GB)], "batch")
    assert isinstance(out, Refused) and out.retry_after_s is None
    assert out.error.field == "memory" and str(10 * GB) in out.error.limit
    assert "RESOURCE_EXHAUSTED" in out.error.one_line()
    assert not ctl.is_waiting("huge") and not ctl.is_in_flight("huge")
    # The same holds for a request whose sum can never fit, and for compute over a class budget.
    out = ctl.try_admit("sum", [unit(1.0, 3 * GB, 3 * GB)] * 2, "batch")
    assert isinstance(out, Refused) and out.error.field == "memory"
    out = ctl.try_admit("long", [unit(11.0, 0, 0)], "batch")
    assert isinstance(out, Refused) and out.error.field == "compute"
    assert ctl.counters()["memory_reserved_bytes"] == 0


@pytest.mark.timeout(30)
def test_multi_unit_requests_are_all_or_nothing():
    ctl, _ = make(memory=10 * GB, batch_s=10.0)
    assert isinstance(ctl.try_admit("a", [unit(1.0, 2 * GB, 2 * GB)], "batch"), Admitted)
    four_samples = [unit(0.5, GB // 2, GB // 2)] * 4  # 4 GB total, fits next to "a"
    assert isinstance(ctl.try_admit("b", four_samples, "batch"), Admitted)
    before = ctl.counters()
    eight = [unit(0.5, GB // 2, GB // 2)] * 8  # each sample fits; all eight do not
    out = ctl.try_admit("c", eight, "batch")
    assert isinstance(out, Wait) and out.reason == "memory"
    after = ctl.counters()
    assert after["memory_reserved_bytes"] == before["memory_reserved_bytes"] == 8 * GB
    assert after["classes"]["batch"]["reserved_gpu_seconds"] == pytest.approx(3.0)
    assert ctl.release("a") == []  # 6 GB free, still not 8
    (event,) = ctl.release("b")
    assert isinstance(event, Admitted) and event.reservation == Reservation(4.0, 4 * GB, 4 * GB)


@pytest.mark.timeout(30)
def test_refund_and_release_never_exceed_the_cap():
    ctl, _ = make(memory=10 * GB, batch_s=10.0)
    ctl.try_admit("a", [unit(6.0, 2 * GB, 2 * GB)], "batch")
    ctl.refund("a", gpu_seconds=2.0)  # a realized saving: 2 s back early
    c = ctl.counters()["classes"]["batch"]
    assert c["reserved_gpu_seconds"] == pytest.approx(4.0) and c["refunded_gpu_seconds"] == pytest.approx(2.0)
    ctl.refund("a", gpu_seconds=100.0, resident_bytes=100 * GB, peak_bytes=100 * GB)  # clamped
    c = ctl.counters()
    assert c["classes"]["batch"]["reserved_gpu_seconds"] == 0.0 and c["memory_reserved_bytes"] == 0
    ctl.release("a", measured_gpu_seconds=1.0)  # measured far below predicted: no extra room
    c = ctl.counters()
    assert c["classes"]["batch"]["reserved_gpu_seconds"] == 0.0 and c["memory_reserved_bytes"] == 0
    assert c["classes"]["batch"]["measured_savings_s"] == pytest.approx(5.0)
    # The budget is exactly its cap: 10 s fits, 10.5 s never does.
    assert isinstance(ctl.try_admit("full", [unit(10.0, 0, 0)], "batch"), Admitted)
    ctl.release("full", measured_gpu_seconds=12.0)
    assert ctl.counters()["classes"]["batch"]["overrun_s"] == pytest.approx(2.0)
    assert isinstance(ctl.try_admit("over", [unit(10.5, 0, 0)], "batch"), Refused)
    with pytest.raises(NotFound):
        ctl.release("a")  # exactly once
    with pytest.raises(NotFound):
        ctl.refund("a", 1.0)


@pytest.mark.timeout(30)
def test_jumbo_and_interactive_are_never_in_flight_together():
    ctl, clock = make(interactive_s=4.0, batch_s=50.0, jumbo_threshold_s=5.0, jumbo_drain_after_s=None)
    assert isinstance(ctl.try_admit("jumbo", [unit(30.0, 0, 0)], "batch"), Admitted)
    out = ctl.try_admit("chat", [unit(0.5, 0, 0)], "interactive")
    assert isinstance(out, Wait) and out.reason == "jumbo"
    # Non-jumbo batch work is free to share the pool with a jumbo.
    assert isinstance(ctl.try_admit("bulk", [unit(1.0, 0, 0)], "batch"), Admitted)
    (event,) = ctl.release("jumbo")
    assert event == Admitted("chat", "interactive", Reservation(0.5, 0, 0), False)
    # And the other way round: a flagged jumbo waits while interactive work is in flight.
    out = ctl.try_admit("flagged", [unit(1.0, 0, 0)], "batch", jumbo=True)
    assert isinstance(out, Wait) and out.reason == "jumbo"
    (event,) = ctl.release("chat")
    assert isinstance(event, Admitted) and event.request_id == "flagged" and event.jumbo
    assert ctl.counters()["jumbo_in_flight"] == 1


@pytest.mark.timeout(30)
def test_a_waiting_jumbo_drains_interactive_work_instead_of_starving():
    ctl, clock = make(interactive_s=4.0, batch_s=50.0, jumbo_threshold_s=5.0, jumbo_drain_after_s=2.0)
    ctl.try_admit("chat1", [unit(0.5, 0, 0)], "interactive")
    assert isinstance(ctl.try_admit("jumbo", [unit(30.0, 0, 0)], "batch"), Wait)
    clock.now = 1.0  # not waited long enough: interactive keeps flowing
    assert isinstance(ctl.try_admit("chat2", [unit(0.5, 0, 0)], "interactive"), Admitted)
    clock.now = 3.0  # now new interactive work holds off so the pool drains
    held = ctl.try_admit("chat3", [unit(0.5, 0, 0)], "interactive")
    assert isinstance(held, Wait) and held.reason == "jumbo"
    assert ctl.release("chat1") == []
    (event,) = ctl.release("chat2")
    assert event.request_id == "jumbo"
    (event,) = ctl.release("jumbo")
    assert event.request_id == "chat3"


@pytest.mark.timeout(30)
def test_fifo_within_a_class_and_cancel():
    ctl, _ = make(batch_s=3.0)
    ctl.try_admit("a", [unit(3.0, 0, 0)], "batch")
    ctl.try_admit("big", [unit(3.0, 0, 0)], "batch")
    small = ctl.try_admit("small", [unit(0.5, 0, 0)], "batch")
    assert isinstance(small, Wait) and small.ahead == 1  # would fit later, but waits its turn
    ctl.cancel("big")
    assert ctl.counters()["classes"]["batch"]["cancelled"] == 1
    (event,) = ctl.release("a")
    assert event.request_id == "small"
    ctl.cancel("small")  # in flight: released
    assert ctl.counters()["classes"]["batch"]["reserved_gpu_seconds"] == 0.0
    with pytest.raises(NotFound):
        ctl.cancel("small")


@pytest.mark.timeout(30)
def test_bad_input_is_a_typed_error():
    ctl, _ = make()
    with pytest.raises(InvalidRequest) as err:
        ctl.try_admit("x", [unit()], "premium")
    assert err.value.field == "slo_class"
    with pytest.raises(InvalidRequest):
        ctl.try_admit("x", [], "batch")
    with pytest.raises(InvalidRequest):
        ctl.try_admit("x", [Reservation(float("nan"))], "batch")
    ctl.try_admit("x", [unit()], "batch")
    with pytest.raises(FailedPrecondition):
        ctl.try_admit("x", [unit()], "batch")


@pytest.mark.timeout(30)
def test_concurrent_admit_and_release_keep_the_books_balanced():
    ctl, _ = make(memory=8 * GB, batch_s=4.0, queue=10_000)

    def worker(k: int) -> None:
        for i in range(200):
            rid = f"{k}-{i}"
            if isinstance(ctl.try_admit(rid, [unit(1.0, GB // 2, GB // 2)], "batch"), Admitted):
                ctl.release(rid)
            elif ctl.is_waiting(rid):
                ctl.cancel(rid)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    for rid in ctl.in_flight_ids():  # waiters promoted by another thread's release
        ctl.release(rid)
    c = ctl.counters()
    assert c["memory_reserved_bytes"] == 0 and c["classes"]["batch"]["reserved_gpu_seconds"] == 0.0
    assert c["classes"]["batch"]["in_flight"] == 0 and c["classes"]["batch"]["waiting"] == 0


_admit = st.tuples(
    st.just("admit"), st.sampled_from(["interactive", "batch"]),
    st.lists(st.tuples(st.floats(0.0, 6.0), st.integers(0, 4), st.integers(0, 8)), min_size=1, max_size=3),
    st.booleans(),
)
_op = st.one_of(
    _admit, _admit,  # admissions twice as likely as anything else
    st.tuples(st.just("release"), st.integers(0, 1000), st.floats(0.0, 20.0)),
    st.tuples(st.just("refund"), st.integers(0, 1000), st.floats(0.0, 5.0)),
    st.tuples(st.just("tick"), st.floats(0.0, 30.0)),
    st.tuples(st.just("cancel"), st.integers(0, 1000)),
)


@pytest.mark.timeout(30)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, min_size=10, max_size=80))
def test_random_sequences_never_exceed_budgets_and_release_exactly_once(ops):
    ctl, clock = make(memory=10 * GB, interactive_s=4.0, batch_s=10.0, queue=3, jumbo_threshold_s=3.0)
    budgets = {"interactive": 4.0, "batch": 10.0}
    in_flight: dict[str, tuple[str, Reservation, bool]] = {}  # id -> (class, still held, jumbo)
    ever_admitted: set[str] = set()
    released: set[str] = set()
    n = 0

    def apply(events) -> None:
        for e in events:
            if isinstance(e, Admitted):
                assert e.request_id not in ever_admitted, "admitted twice"
                ever_admitted.add(e.request_id)
                in_flight[e.request_id] = (e.slo_class, e.reservation, e.jumbo)

    def check() -> None:
        c = ctl.counters()
        assert c["memory_reserved_bytes"] <= 10 * GB
        assert sum(r.memory_bytes for _, r, _ in in_flight.values()) <= 10 * GB
        for name, cap in budgets.items():
            held = sum(r.gpu_seconds for k, r, _ in in_flight.values() if k == name)
            assert held <= cap + 1e-6
            assert c["classes"][name]["reserved_gpu_seconds"] <= cap + 1e-6
            assert c["classes"][name]["waiting"] <= 3
        jumbo = any(j for _, _, j in in_flight.values())
        interactive = any(k == "interactive" and not j for k, _, j in in_flight.values())
        assert not (jumbo and interactive)
        assert set(in_flight) == {r for r in in_flight if ctl.is_in_flight(r)}

    for op in ops:
        if op[0] == "admit":
            _, cls, units, jumbo = op
            rid, n = f"r{n}", n + 1
            out = ctl.try_admit(rid, [Reservation(s, r * GB // 2, p * GB // 2) for s, r, p in units], cls, jumbo)
            apply([out])
            if isinstance(out, Refused):
                assert out.error.code == "RESOURCE_EXHAUSTED"
        elif op[0] in ("release", "refund", "cancel") and in_flight:
            rid = sorted(in_flight)[op[1] % len(in_flight)]
            if op[0] == "refund":
                cls, held, jumbo = in_flight[rid]
                back = min(op[2], held.gpu_seconds)  # refunds are clamped to what is held
                in_flight[rid] = (cls, Reservation(held.gpu_seconds - back, held.resident_bytes,
                                                   held.peak_bytes), jumbo)
                apply(ctl.refund(rid, op[2]))
                check()
                continue
            apply(ctl.release(rid, op[2]) if op[0] == "release" else ctl.cancel(rid))
            del in_flight[rid]
            assert rid not in released
            released.add(rid)
            with pytest.raises(NotFound):
                ctl.release(rid)
        elif op[0] == "tick":
            clock.now += op[1]
            apply(ctl.pump())
        check()

    # Drain: release everything; waiters get admitted (or expire) and are released in turn.
    while in_flight:
        rid = next(iter(in_flight))
        del in_flight[rid]
        apply(ctl.release(rid))
        released.add(rid)
        check()
    clock.now += 1000.0
    apply(ctl.pump())
    assert not in_flight
    assert released == ever_admitted
    c = ctl.counters()
    assert c["memory_reserved_bytes"] == 0
    assert all(v["reserved_gpu_seconds"] == 0.0 and v["in_flight"] == 0 for v in c["classes"].values())
