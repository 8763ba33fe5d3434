"""The dispatcher: ended request ids ride on a busy replica's next Execute (Release calls only for
idle replicas, cancellations and ids that waited too long), and pipelined dispatch keeps a
denoiser replica's next batch waiting beside the running one while no request ever has two
units in flight and every request's steps arrive in order."""
import threading
import time

import pytest

from fastvideo3.card import get_card
from fastvideo3.errors import Unavailable
from fastvideo3.loop.protocol import StepResult
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.scheduling.dispatcher import Dispatcher
from fastvideo3.runtime.scheduling.executor import CarriesReleases
from fastvideo3.runtime.scheduling.run import Batch, Ended
from fastvideo3.runtime.scheduling.scheduler import CoreScheduler
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.telemetry.hooks import SchedulerTelemetry
from tests.helpers_fake_pool import fake_outputs

pytestmark = pytest.mark.timeout(120)
CARD = get_card("wan-tiny")


def results_for(batch) -> list[StepResult]:
    return [StepResult(u.unit_id, u.request_id, outputs=fake_outputs(u.role, u), metrics={"latent_norm": 1.0})
            for u in batch]


class Pool:
    """A replica that answers at once (or after ``gate`` opens), recording what it was sent."""

    def __init__(self, role, gate: threading.Event | None = None):
        self.role, self.gate, self.healthy = role, gate, True
        self.calls: list[tuple[list[str], list[str]]] = []  # (ids carried, request ids of the batch)
        self.released: list[str] = []
        self.fail_next = False

    def execute(self, batch):
        if self.gate is not None:
            assert self.gate.wait(10)
        self.calls.append(([], [u.request_id for u in batch]))
        return results_for(batch)

    def release(self, request_id):
        self.released.append(request_id)

    def describe(self):
        return {"role": self.role}


class Carrier(Pool):
    def execute_after_release(self, finished_request_ids, batch):
        if self.fail_next:
            self.fail_next = False
            raise Unavailable("replica lost", field="replica")
        if self.gate is not None:
            assert self.gate.wait(10)
        self.calls.append((list(finished_request_ids), [u.request_id for u in batch]))
        return results_for(batch)


def _unit(rid: str) -> WorkUnit:
    return WorkUnit(f"u-{rid}", rid, "diffusion_denoise", "diffusion_step", "denoiser", CARD.model_id, "sig",
                    params={"step": 0, "final": False})


def _ended(rid: str, status: str = "SUCCEEDED") -> Ended:
    return Ended(rid, status, (("denoiser", 0), ("encoder", 0)))


def test_ids_ride_on_a_busy_replicas_next_execute_and_idle_ones_get_release():
    gate = threading.Event()
    den, enc = Carrier("denoiser", gate), Pool("encoder")
    assert isinstance(den, CarriesReleases) and not isinstance(enc, CarriesReleases)
    disp = Dispatcher({"denoiser": [den], "encoder": [enc]}, telemetry=SchedulerTelemetry(), threads=True)
    back = threading.Event()
    running = Batch([(_unit("a"), None)], "denoiser", 0, den)
    disp.send(running, lambda b, res, dt, ok: (disp.settle(b), back.set()))
    disp.release_ended(_ended("done-1"))  # the denoiser is busy, the encoder idle
    assert enc.released == ["done-1"] and den.released == []
    disp.release_ended(_ended("cancelled", "CANCELLED"))  # cancelled: Release everywhere, now
    assert den.released == ["cancelled"] and enc.released == ["done-1", "cancelled"]
    assert disp.pending_releases() == 1 and disp.flush_releases() == 0  # not waited long enough yet
    gate.set()
    assert back.wait(10)
    results, ok = disp.execute(Batch([(_unit("b"), None)], "denoiser", 0, den))
    assert ok and results[0].ok
    assert den.calls[-1] == (["done-1"], ["b"])  # carried by the next Execute, no Release call
    assert den.released == ["cancelled"] and disp.pending_releases() == 0
    assert disp.counters["releases_carried"] == 1
    disp.close()


def test_ids_come_back_when_their_execute_fails_and_wait_at_most_the_bound():
    den = Carrier("denoiser")
    disp = Dispatcher({"denoiser": [den]}, telemetry=SchedulerTelemetry(), release_after_s=0.2)
    disp.busy[id(den)] = 1  # a batch in flight
    disp.release_ended(Ended("r1", "SUCCEEDED", (("denoiser", 0),)))
    den.fail_next = True
    results, ok = disp.execute(Batch([(_unit("x"), None)], "denoiser", 0, den))
    assert not ok and results[0].error.code == "UNAVAILABLE" and results[0].error.details["dispatch_failed"]
    assert disp.pending_releases() == 1  # not known to have arrived: kept
    time.sleep(0.25)
    assert disp.flush_releases() == 1 and den.released == ["r1"]  # no Execute for the bound: Release
    # a plain executor is released just before the batch it would have ridden on
    plain = Pool("denoiser")
    disp = Dispatcher({"denoiser": [plain]}, telemetry=SchedulerTelemetry())
    disp.busy[id(plain)] = 1
    disp.release_ended(Ended("r2", "FAILED", (("denoiser", 0),)))
    assert plain.released == []
    disp.execute(Batch([(_unit("y"), None)], "denoiser", 0, plain))
    assert plain.released == ["r2"] and plain.calls[-1] == ([], ["y"])


class SlowDenoiser(Pool):
    """Takes ``seconds`` per batch and records overlapping calls (a replica holding two batches)."""

    def __init__(self, seconds: float):
        super().__init__("denoiser")
        self.seconds = seconds
        self.lock = threading.Lock()
        self.active = 0
        self.most = 0
        self.steps: dict[str, list[int]] = {}
        self.spans: dict[str, list[tuple[float, float]]] = {}

    def execute(self, batch):
        t0 = time.monotonic()
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
            for u in batch:
                self.steps.setdefault(u.request_id, []).append(int(u.params["step"]))
        time.sleep(self.seconds)
        with self.lock:
            self.active -= 1
            for u in batch:
                self.spans.setdefault(u.request_id, []).append((t0, time.monotonic()))
        return results_for(batch)


def _run_pipelined(depth: int, split: int, n: int = 8, steps: int = 6) -> SlowDenoiser:
    den = SlowDenoiser(0.03)
    wake = threading.Event()
    pools = {"encoder": [Pool("encoder")], "denoiser": [den], "decoder": [Pool("decoder")]}
    sched = CoreScheduler(pools, pipelined=True, pipeline_depth=depth, split_min_units=split, wake=wake.set,
                          dispatch_workers=6)
    runs = [sched.submit(resolve(GenerateRequest(prompt=f"p{i}", request_id=f"r{i}", num_inference_steps=steps),
                                 CARD), CARD) for i in range(n)]
    end = time.monotonic() + 60
    while sched.active() and time.monotonic() < end:
        if not sched.tick():
            wake.wait(0.01)
            wake.clear()
    sched.close()
    assert all(r.status == "SUCCEEDED" for r in runs), [(r.request_id, r.status, r.error) for r in runs]
    for rid, seen in den.steps.items():
        assert seen == list(range(steps)), (rid, seen)  # in order, each once
        spans = den.spans[rid]
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), rid  # never two units in flight
    return den


def test_double_buffered_dispatch_keeps_the_next_batch_at_the_denoiser():
    den = _run_pipelined(depth=2, split=4)
    assert den.most == 2  # a second batch waited at the replica while the first ran
    sizes = [len(v) for v in den.steps.values()]
    assert sizes == [6] * 8
    one = _run_pipelined(depth=1, split=4)
    assert one.most == 1  # depth 1: the replica never holds two of this scheduler's batches


@pytest.mark.parametrize("argv, field", [(["--pipeline-depth", "9"], "pipeline_depth"),
                                         (["--double-buffer-min-units", "1"], "double_buffer_min_units"),
                                         (["--release-after", "0"], "release_after_s")])
def test_scheduler_dispatch_flags_are_validated_naming_the_field(argv, field):
    from fastvideo3.errors import InvalidRequest
    from services.scheduler.config import parse_args
    pools = ["--pools", "encoder=127.0.0.1:1", "--pools", "denoiser=127.0.0.1:2", "--pools", "decoder=127.0.0.1:3"]
    with pytest.raises(InvalidRequest) as e:
        parse_args(pools + argv)
    assert e.value.field == field and e.value.limit
    cfg = parse_args(pools + ["--pipeline-depth", "1", "--double-buffer-min-units", "0"])
    assert (cfg.pipeline_depth, cfg.double_buffer_min_units, cfg.release_after_s) == (1, 0, 1.0)


def test_a_batchs_snapshots_are_taken_side_by_side():
    """The snapshots one batch's results ask for (a burst's requests reach a checkpoint step
    together) run at the same time, and every one is finished before the replica is settled."""
    jobs = [(f"run{i}", "denoiser") for i in range(4)]
    barrier = threading.Barrier(len(jobs), timeout=10)  # broken unless all four are in flight at once
    finished, settled = [], []

    class Snapshots:
        defer_snapshots = False

        def run_snapshot(self, job):
            barrier.wait()
            return b"blob-" + job[0].encode(), "fp"

        def finish_snapshot(self, job, taken):
            finished.append((job[0], taken))

    pools = {"encoder": [Pool("encoder")], "denoiser": [SlowDenoiser(0.0)], "decoder": [Pool("decoder")]}
    sched = CoreScheduler(pools, pipelined=True, snapshots=Snapshots())
    sched.dispatcher.settle = lambda batch: settled.append((batch, len(finished)))
    try:
        sched._snapshot(jobs, "the batch")
    finally:
        sched.close()
    assert sorted(finished) == [(f"run{i}", (f"blob-run{i}".encode(), "fp")) for i in range(4)]
    assert settled == [("the batch", 4)]
