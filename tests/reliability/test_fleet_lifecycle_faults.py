"""RELIABILITY 3, 6, 7, 8, 10 (admission half) and 12, on a fleet of no-op pools (``--fake``:
no model math, simulated step times), so timing-driven phases are cheap and observable.

Schedulers over the same pools: the default one; ``sched_q`` (one running request, two queued,
a 100 MB memory budget); ``sched_redis`` (state in a redis-server the tests stop and freeze);
``sched_hang`` (two standalone denoisers with 1 s steps, health checked every 0.2 s).
"""
from __future__ import annotations

import signal
import statistics
import threading
import time

import pytest

from fastvideo3.client import FleetClient, error_from_rpc
from fastvideo3.errors import ResourceExhausted, Unavailable
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.v1 import pool_pb2
from services.common import convert
from tests.fleet_fixture import health, pool_describe, pool_stub, running, wait_until
from tests.redis_server import redis_process_fixture
from tests.reliability.conftest import pool_targets
from tests.reliability.helpers import (
    BUDGETS, SMALL, assert_pools_balanced, once_at_step, pool_units, run_all, sched_counters, sched_pools,
    store_leftovers, stream,
)

ENC_S, STEP_S, DEC_S = 0.3, 0.05, 0.4
HANG_STEP_S = 1.0


redis_proc = redis_process_fixture("module")  # this module stops and freezes it


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, redis_proc):
    from fleet.launcher import LocalFleet
    f = LocalFleet("wan-tiny-seeded", fake=True, roles=("encoder", "denoiser", "decoder"), replicas={"denoiser": 2},
                   scheduler_args=BUDGETS, log_dir=tmp_path_factory.mktemp("fake-fleet-logs"),
                   pool_args={"encoder": ["--fake-step-seconds", str(ENC_S)],
                              "denoiser": ["--fake-step-seconds", str(STEP_S)],
                              "decoder": ["--fake-step-seconds", str(DEC_S)]})
    with running(f, timeout_s=240):
        f.sched_q = f.add_scheduler(["--max-running", "1", "--max-queued", "2", "--memory-budget-bytes", "100000000",
                                     *BUDGETS], name="scheduler-q")
        f.sched_redis = f.add_scheduler(["--state-store", redis_proc.url, "--state-namespace", "rel-fake",
                                         "--state-timeout", "0.5", "--checkpoint-every", "1", *BUDGETS],
                                        name="scheduler-redis")
        yield f


def _status(target: str, rid: str) -> dict:
    from fastvideo3.errors import NotFound
    try:
        with FleetClient(target) as c:
            return c.get(rid)
    except NotFound:  # not submitted yet
        return {"state": None, "phase": None}


def _state(target: str, rid: str) -> str | None:
    return _status(target, rid)["state"]


def _phase(target: str, rid: str) -> str | None:
    return _status(target, rid)["phase"]


# -- RELIABILITY 3: client disconnect in each phase ----------------------------------------------

PHASES = ["queued", "encode", "denoise", "decode", "transfer"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("phase", PHASES)
def test_client_disconnect_cancels_server_side_and_issues_no_more_units(fleet, phase):
    target = fleet.sched_q if phase == "queued" else fleet.target
    rid = f"disconnect-{phase}"
    blocker = None
    if phase == "queued":  # one request runs; ours waits behind it
        blocker = threading.Thread(target=stream, args=(target, "blocker"),
                                   kwargs=dict(num_inference_steps=30, request_id="disconnect-blocker", **SMALL))
        blocker.start()
        wait_until(lambda: _state(target, "disconnect-blocker") == "RUNNING", 10, "the blocker running")
    with FleetClient(target, timeout_s=60) as c:
        it = c.stream("going away", request_id=rid, num_inference_steps=20, output_format="npy", **SMALL)
        for ev in it:
            if phase == "queued" and ev.kind == "queued":
                assert _state(target, rid) == "QUEUED"
                break
            if phase == "encode" and ev.kind == "queued":
                wait_until(lambda: _phase(target, rid) == "encode", 5, "the encode phase")
                break
            if phase == "denoise" and ev.kind == "progress" and ev.data["phase"] == "denoise" and ev.data["step"] == 5:
                break
            if phase == "decode" and ev.kind == "progress" and ev.data["phase"] == "denoise" and ev.data["step"] == 20:
                wait_until(lambda: _phase(target, rid) == "decode", 5, "the decode phase")
                break
            if phase == "transfer" and ev.kind == "artifact":
                break
        it.close()  # the client goes away mid-stream
    want = "SUCCEEDED" if phase == "transfer" else "CANCELLED"  # a finished request has nothing to cancel
    wait_until(lambda: _state(target, rid) == want, 10, f"{rid} {want}")
    if blocker is not None:
        blocker.join(timeout=60)
    # no further WorkUnit: a barrier request of known size moves the pools' counters by exactly its own units
    units = pool_units(pool_targets(fleet))
    assert stream(fleet.target, "barrier", num_inference_steps=3, **SMALL).state == "SUCCEEDED"
    assert pool_units(pool_targets(fleet)) - units == 1 + 3 + 1
    assert_pools_balanced(pool_targets(fleet))


# -- RELIABILITY 8 and 10: backpressure and memory-aware admission --------------------------------

@pytest.mark.timeout(120)
def test_past_the_queue_bound_refused_fast_with_retry_hint_and_queued_ones_complete(fleet):
    target = fleet.sched_q
    results: list = []
    running = threading.Thread(target=lambda: results.append(stream(target, "runs", num_inference_steps=30,
                                                                     request_id="bp-run", **SMALL)))
    running.start()
    wait_until(lambda: _state(target, "bp-run") == "RUNNING", 10, "one request running")
    queued = [threading.Thread(target=lambda i=i: results.append(stream(target, "waits", num_inference_steps=2,
                                                                         request_id=f"bp-q{i}", **SMALL)))
              for i in range(2)]
    for t in queued:
        t.start()
    wait_until(lambda: all(_state(target, f"bp-q{i}") == "QUEUED" for i in range(2)), 10, "two queued")
    t0 = time.monotonic()
    with pytest.raises(ResourceExhausted) as refused, FleetClient(target) as c:
        c.generate("one too many", num_inference_steps=2, output_format="npy", **SMALL)
    assert time.monotonic() - t0 < 1.0
    assert refused.value.retry_after_s and refused.value.retry_after_s > 0
    assert refused.value.field == "queue"
    for t in [running, *queued]:
        t.join(timeout=60)
    assert sorted(o.state for o in results) == ["SUCCEEDED"] * 3
    # a multi-sample request would be admitted all or nothing: the schema has no multi-sample
    # request yet; AdmissionController's all-or-nothing rule is covered in tests/unit/test_admission.py


@pytest.mark.timeout(60)
def test_work_over_the_memory_budget_is_refused_before_its_first_step(fleet):
    units = pool_units(pool_targets(fleet))
    out = stream(fleet.sched_q, "too large", num_frames=33, height=128, width=128, num_inference_steps=4)
    assert out.state == "FAILED" and out.error_event["code"] == "RESOURCE_EXHAUSTED", out.error_event
    assert out.error_event["field"] == "memory"
    assert pool_units(pool_targets(fleet)) == units  # refused before any WorkUnit
    assert stream(fleet.sched_q, "fits", num_inference_steps=2, **SMALL).state == "SUCCEEDED"


# -- RELIABILITY 12: state-store outage -----------------------------------------------------------

@pytest.mark.timeout(180)
def _denoise_step_times(into: dict[str, list[float]]):
    """An event hook recording each request's denoise progress events (one per step)."""
    def hook(out, ev):
        if ev.kind == "progress" and ev.data["phase"] == "denoise":
            into.setdefault(out.request_id, []).append(time.monotonic())
    return hook


def _step_intervals(times: dict[str, list[float]]) -> list[float]:
    return [b - a for ts in times.values() for a, b in zip(ts, ts[1:])]


def test_state_store_outage_fails_admissions_fast_and_in_flight_requests_end(fleet, redis_proc):
    target, steps = fleet.sched_redis, 40
    # the step rate with the store answering: the same two requests, a checkpoint every step
    healthy: dict[str, list[float]] = {}
    base = run_all([(target, "healthy", dict(num_inference_steps=steps, request_id=f"healthy-{i}", **SMALL,
                                             on_event=_denoise_step_times(healthy))) for i in range(2)])
    assert [o.state for o in base] == ["SUCCEEDED", "SUCCEEDED"]
    base_step_s = statistics.median(_step_intervals(healthy))
    units = pool_units(pool_targets(fleet))
    started = threading.Barrier(3, timeout=30)
    at_step_3 = once_at_step(3, started.wait)
    paused_at: list[float] = []
    steps_seen: dict[str, list[float]] = {}

    def hook(out, ev):
        at_step_3(out, ev)
        if paused_at and ev.kind == "progress" and ev.data["phase"] == "denoise":
            steps_seen.setdefault(out.request_id, []).append(time.monotonic())

    jobs = [(target, "in flight", dict(num_inference_steps=steps, request_id=f"outage-{i}", **SMALL,
                                       on_event=hook)) for i in range(2)]
    outs: list = []
    t = threading.Thread(target=lambda: outs.extend(run_all(jobs)))
    t.start()
    started.wait()
    redis_proc.pause()  # hung: answers nothing
    paused_at.append(time.monotonic())
    try:
        t0 = time.monotonic()
        with pytest.raises(Unavailable), FleetClient(target) as c:
            c.generate("refused while the store hangs", num_inference_steps=2, output_format="npy", **SMALL)
        assert time.monotonic() - t0 < 2.0
        t.join(timeout=120)
        assert [o.state for o in outs] == ["SUCCEEDED", "SUCCEEDED"]  # in flight: finished regardless
        # ... and at their step rate: checkpoint writes (one per step) and ends wait on the hung
        # store off the step path, so no step waits out a store timeout (0.5 s; a step is 0.05 s)
        gaps = [b - a for ts in steps_seen.values() for a, b in zip([paused_at[0], *ts], ts)]
        assert len(gaps) >= steps, steps_seen
        assert sum(g >= 0.45 for g in gaps) <= 1, sorted(gaps)[-6:]
        # the step rate while the store hangs: within 10% of the healthy run's
        paused_step_s = statistics.median(_step_intervals(steps_seen))
        assert paused_step_s <= 1.10 * base_step_s, (paused_step_s, base_step_s)
        assert sched_counters(target)["state.pending_ends"] >= 2  # their ends (and the refused one's cleanup)
    finally:
        redis_proc.resume()
    wait_until(lambda: sched_counters(target)["state.pending_ends"] == 0, 10, "deferred ends written")
    assert store_leftovers(redis_proc.url, "rel-fake") == []  # nothing orphaned
    assert pool_units(pool_targets(fleet)) - units == 2 * (1 + steps + 1)  # no duplicate work
    # down (refused connections): refused at once, and admitted again once it is back
    redis_proc.stop()
    t0 = time.monotonic()
    with pytest.raises(Unavailable), FleetClient(target) as c:
        c.generate("refused while the store is down", num_inference_steps=2, output_format="npy", **SMALL)
    assert time.monotonic() - t0 < 1.0
    redis_proc.start()
    wait_until(lambda: stream(target, "back", num_inference_steps=2, **SMALL).state == "SUCCEEDED", 10,
               "admissions after the store is back", interval_s=0.25)
    assert store_leftovers(redis_proc.url, "rel-fake") == []


# -- RELIABILITY 6: an alive but hung pool ---------------------------------------------------------

@pytest.mark.timeout(180)
def test_hung_pool_is_detected_within_two_step_times_and_routed_around(fleet):
    a = fleet.spawn_pool("denoiser", ["--fake-step-seconds", str(HANG_STEP_S)])
    b = fleet.spawn_pool("denoiser", ["--fake-step-seconds", str(HANG_STEP_S)])
    target = fleet.add_scheduler(["--pools", f"denoiser={a.target},{b.target}", "--health-interval", "0.2",
                                  "--health-timeout", "0.3", "--unhealthy-after", "2", *BUDGETS],
                                 name="scheduler-hang")
    try:
        started = threading.Barrier(3, timeout=60)
        hook = once_at_step(1, started.wait)  # a request moved off the hung pool reports step 1 again
        jobs = [(target, "slow", dict(num_inference_steps=6, request_id=f"hang-{i}", on_event=hook, **SMALL))
                for i in range(2)]
        outs: list = []
        t = threading.Thread(target=lambda: outs.extend(run_all(jobs, timeout_s=120)))
        t.start()
        started.wait()
        victim = max((a, b), key=lambda p: pool_describe(p.target).resident_buffers)
        assert pool_describe(victim.target).resident_buffers >= 1  # a request is on it
        t_stop = time.time()
        victim.proc.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: sched_pools(target).get(victim.target) is False, 10,
                       "the scheduler to stop trusting the hung pool", interval_s=0.05)
            with FleetClient(target) as c:
                seen = {p.get("target"): p for p in c.describe()["description"]["pools"].values()}
            detected = seen[victim.target]["health_changed_unix"] - t_stop
            assert 0 < detected <= 2 * HANG_STEP_S, detected  # as the scheduler recorded it
            t.join(timeout=120)
            assert [o.state for o in outs] == ["SUCCEEDED", "SUCCEEDED"], [(o.error, o.error_event) for o in outs]
            assert sched_counters(target)["state.recovered"] >= 1  # moved off the hung pool
            t1 = time.monotonic()  # new work goes to the healthy replica only
            assert stream(target, "routed around", num_inference_steps=3, **SMALL).state == "SUCCEEDED"
            assert time.monotonic() - t1 < 3 * 3 * HANG_STEP_S
        finally:
            victim.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: sched_pools(target).get(victim.target) is True, 10, "the pool trusted again")
        assert_pools_balanced([a.target, b.target])  # the releases it owed were delivered
    finally:
        sched = fleet.process("scheduler-hang")
        fleet.terminate(sched)
        fleet.schedulers.remove(sched)
        for p in (a, b):
            fleet.terminate(p)
            fleet.standalone.remove(p)


# -- RELIABILITY 7: health lifecycle --------------------------------------------------------------

@pytest.mark.timeout(120)
def test_not_serving_while_loading_and_after_sigterm_drain_then_exit(fleet):
    fp = fleet._pool_process("denoiser", 90)
    fp.name, fp.log_path = "denoiser-loading", fleet.log_dir / "denoiser-loading.log"
    fp.argv += ["--fake-load-seconds", "4", "--fake-step-seconds", "2.0"]
    fleet._spawn(fp)
    fleet.standalone.append(fp)
    sched = fleet._scheduler_process(None, ["--pools", f"denoiser={fp.target}", *BUDGETS], "scheduler-loading")
    fleet._spawn(sched)
    fleet.schedulers.append(sched)
    try:
        wait_until(lambda: health(fp.target) == "NOT_SERVING", 30, "the loading pool to answer health")
        assert pool_describe(fp.target).state == "loading"
        unit = WorkUnit("u1", "lifecycle", "diffusion_denoise", "diffusion_step", "denoiser", "wan-tiny-seeded",
                        "sig", step=0, params={"step": 0, "final": True, "latent_shape": [16, 3, 4, 4]})
        req = pool_pb2.ExecuteRequest(units=[convert.unit_to_wire(unit)])
        with pytest.raises(Exception) as refused:
            pool_stub(fp.target).Execute(req, timeout=5)
        assert isinstance(error_from_rpc(refused.value), Unavailable)  # no work while loading
        wait_until(lambda: health(sched.target) == "NOT_SERVING", 30, "the scheduler to answer health")
        assert not fp.serving.is_set()  # the scheduler waits for its pools, not serving meanwhile
        fleet.wait_serving(60, [fp, sched])
        seen = fp.statuses()
        assert seen[:2] == ["NOT_SERVING", "SERVING"] and sched.statuses()[:2] == ["NOT_SERVING", "SERVING"]
        # SIGTERM with work in flight: NOT_SERVING at once, new work refused, the in-flight unit finishes
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(r=pool_stub(fp.target).Execute(req, timeout=30)))
        t.start()
        wait_until(lambda: pool_describe(fp.target).counters.get("inflight_rpcs", 0) >= 1, 10, "work in flight")
        fp.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: health(fp.target) != "SERVING", 5, "NOT_SERVING after SIGTERM")
        with pytest.raises(Exception) as late:
            pool_stub(fp.target).Execute(req, timeout=5)
        assert isinstance(error_from_rpc(late.value), Unavailable)
        t.join(timeout=30)
        assert convert.result_from_wire(out["r"].results[0]).ok
        assert fp.proc.wait(timeout=30) == 0
        assert fleet.terminate(sched) == 0
    finally:
        for p in (sched, fp):
            fleet.terminate(p)
        fleet.schedulers.remove(sched)
        fleet.standalone.remove(fp)
