"""The loss report of a terminal error (retryable, resume_from_step, loss): typed wire fields
that survive every hop — convert, the client's event data, the gRPC trailer, the gateway's job
error — plus the scheduler's policy for which codes are retryable, and the state store's lease."""
from __future__ import annotations

from fastvideo3.client import error_data, loss_details
from fastvideo3.errors import ErrorInfo, Unavailable, loss_report
from fastvideo3.state import StoreConfig
from fastvideo3.state.memory import MemoryStateStore
from services.common.convert import error_from_wire, error_to_wire

REPORT = loss_report(retryable=True, resume_from_step=6, role="denoiser", replica="denoiser-0", step_reached=7,
                     checkpoint=True)


def test_the_report_is_typed_on_the_wire_and_comes_back():
    info = ErrorInfo("UNAVAILABLE", "lost", field="role", step=7, details={"cause": "Stream removed", **REPORT})
    wire = error_to_wire(info, "r1")
    assert wire.retryable is True and wire.resume_from_step == 6
    assert (wire.loss.role, wire.loss.replica, wire.loss.step_reached, wire.loss.checkpoint) == \
        ("denoiser", "denoiser-0", 7, True)
    assert dict(wire.details) == {"cause": "Stream removed"}  # the report is not duplicated as text
    back = error_from_wire(wire)
    assert {k: back.details[k] for k in REPORT} == REPORT
    data = error_data(wire)  # what FleetClient puts in an error event
    assert data["retryable"] is True and data["resume_from_step"] == 6 and data["loss"]["replica"] == "denoiser-0"
    assert {k: v for k, v in loss_details(data).items() if k in REPORT} == REPORT


def test_an_error_without_a_report_says_nothing():
    wire = error_to_wire(ErrorInfo("INTERNAL", "bug"))
    assert not wire.HasField("retryable") and not wire.HasField("loss") and not wire.HasField("resume_from_step")
    assert error_data(wire)["retryable"] is None


def test_trailer_keeps_the_report_typed():
    import json

    from services.common.errors import trailer_of
    body = json.loads(trailer_of(ErrorInfo("UNAVAILABLE", "lost", details=REPORT))[0][1])
    assert body["details"]["retryable"] is True and body["details"]["step_reached"] == 7


def test_gateway_job_error_carries_the_report():
    from fleet.gateway.errors import job_error
    out = job_error(Unavailable("lost", field="role", details=REPORT))
    assert out["retryable"] is True and out["resume_from_step"] == 6
    assert out["lost"] == {"role": "denoiser", "replica": "denoiser-0", "step_reached": 7, "checkpoint": True}
    wire = error_data(error_to_wire(ErrorInfo("UNAVAILABLE", "lost", details=REPORT)))
    assert job_error(wire)["lost"]["replica"] == "denoiser-0"  # from an error event's data too


def test_scheduler_marks_every_terminal_error():
    from fastvideo3.card.registry import resolve_card
    from fastvideo3.errors import NumericFault
    from fastvideo3.request.schema import GenerateRequest, resolve
    from fastvideo3.runtime.scheduling.scheduler import CoreScheduler
    card = resolve_card("wan-tiny")
    sched = CoreScheduler({}, checkpoint_step=lambda run: 4)
    for exc, retry in ((Unavailable("gone"), True), (NumericFault("nan"), False)):
        run = sched.submit(resolve(GenerateRequest(prompt="x", num_inference_steps=4), card), card)
        sched._terminate(run, "FAILED", exc)
        assert run.error.details["retryable"] is retry
        assert run.error.details.get("resume_from_step") == (4 if retry else None)
        assert run.error.details["checkpoint"] is True


def test_lease_is_taken_once_renewed_by_its_holder_and_expires():
    now = [0.0]
    store = MemoryStateStore(StoreConfig(namespace="lease"), clock=lambda: now[0])
    assert store.acquire_lease("scheduler", "a@h:1", 2.0) == "a@h:1"
    assert store.acquire_lease("scheduler", "b@h:2", 2.0) == "a@h:1"  # held: b stays standby
    now[0] = 1.5
    assert store.acquire_lease("scheduler", "a@h:1", 2.0) == "a@h:1"  # renewed to 3.5
    now[0] = 3.0
    assert store.lease_holder("scheduler") == "a@h:1"
    now[0] = 3.6  # a stopped renewing: the lease expired
    assert store.lease_holder("scheduler") == ""
    assert store.acquire_lease("scheduler", "b@h:2", 2.0) == "b@h:2"
    store.release_lease("scheduler", "a@h:1")  # not a's any more: nothing happens
    assert store.lease_holder("scheduler") == "b@h:2"
    store.release_lease("scheduler", "b@h:2")
    assert store.lease_holder("scheduler") == ""
