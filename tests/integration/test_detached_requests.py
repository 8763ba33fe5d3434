"""Detached requests (GenerateRequest.detached), on a fleet of no-op pools (``--fake``).

A detached request outlives its stream: the client going away does not cancel it, and a Generate
with the same id and parameters re-attaches — to the events still to come while it runs, or to its
kept result once it ended. A request that is not detached is still cancelled by a disconnect. This
is what lets the OpenAI gateway be restarted mid-job (tests/e2e/test_openai_gateway.py).
"""
from __future__ import annotations

import pytest

from fastvideo3.client import FleetClient
from tests.fleet_fixture import fleet_fixture, wait_until

fleet = fleet_fixture(scope="module", fake=True, roles=("encoder", "denoiser", "decoder"),
                      pool_args={"denoiser": ["--fake-step-seconds", "0.05"]})
pytestmark = pytest.mark.timeout(180)
PARAMS = {"output_format": "npy", "num_inference_steps": 40, "seed": 3}


def _drop_after_progress(client: FleetClient, rid: str, detached: bool) -> None:
    """Open the stream, read until denoising has started, then close it (the client goes away)."""
    stream = client.stream("goes away", request_id=rid, detached=detached, **PARAMS)
    for ev in stream:
        if ev.kind == "progress" and ev.data["phase"] == "denoise" and ev.data["step"] >= 1:
            break
    stream.close()


def _kinds(events) -> list[str]:
    return [ev.kind for ev in events]


def test_a_detached_request_runs_on_and_its_result_is_kept_for_a_reattach(fleet):
    with FleetClient(fleet.target) as c:
        _drop_after_progress(c, "detached-done", detached=True)
        final = wait_until(lambda: (s := c.get("detached-done"))["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")
                           and s, 60.0, "the detached request to end")
        assert final["state"] == "SUCCEEDED"  # nobody was attached when it finished
        events = list(c.stream("goes away", request_id="detached-done", detached=True, **PARAMS))
    kinds = _kinds(events)
    assert kinds[0] == "accepted" and kinds[-1] == "finished" and "artifact" in kinds, kinds
    assert events[-1].data["state"] == "SUCCEEDED"


def test_reattach_mid_run_gets_the_remaining_events(fleet):
    with FleetClient(fleet.target) as c:
        _drop_after_progress(c, "detached-live", detached=True)
        assert c.get("detached-live")["state"] in ("QUEUED", "RUNNING")
        # the old stream may still be closing on the scheduler: retry the re-attach briefly
        events = wait_until(lambda: _try_stream(c, "detached-live"), 30.0, "a re-attach")
    steps = [ev.data["step"] for ev in events if ev.kind == "progress" and ev.data["phase"] == "denoise"]
    assert steps and steps[0] > 1 and steps[-1] == 40, steps  # it did not start over
    assert events[-1].kind == "finished" and events[-1].data["state"] == "SUCCEEDED"


def _try_stream(c: FleetClient, rid: str):
    from fastvideo3.errors import AlreadyExists
    try:
        return list(c.stream("goes away", request_id=rid, detached=True, **PARAMS))
    except AlreadyExists:  # the old stream is still attached
        return None


def test_an_attached_request_is_still_cancelled_by_a_disconnect(fleet):
    with FleetClient(fleet.target) as c:
        _drop_after_progress(c, "attached", detached=False)
        final = wait_until(lambda: (s := c.get("attached"))["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")
                           and s, 60.0, "the request to end")
    assert final["state"] == "CANCELLED"
