"""RELIABILITY (request ids) on a fleet of no-op pools and a real redis-server.

* An ended request stays readable for ``--state-ttl`` across a scheduler restart: GetRequest
  answers from the store, and a re-attach (same id, same parameters) gets its video back,
  byte-identical (the video is stored before the request is marked SUCCEEDED).
* Reusing the id of a live or retained request with other parameters is refused with
  ALREADY_EXISTS naming ``request_id``; a cancelled request's id is free again.
* An ended request no longer in the scheduler's memory (``--retain-finished``) is read back from
  the store until ``--state-ttl``; after that its id is unknown and free.
"""
from __future__ import annotations

import threading
import time

import pytest

from fastvideo3.client import FleetClient
from fastvideo3.errors import AlreadyExists, NotFound
from tests.fleet_fixture import START_TIMEOUT_S, started, wait_until
from tests.reliability.helpers import stream

NS = "rel-ids"
PARAMS = {"output_format": "npy", "num_inference_steps": 6, "seed": 5, "num_frames": 9, "height": 32, "width": 32}
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def fake_fleet(real_redis, tmp_path_factory):
    from fleet.launcher import LocalFleet
    fleet = LocalFleet("wan-tiny", fake=True, roles=("encoder", "denoiser", "decoder"),
                       scheduler_args=["--state-store", real_redis.url, "--state-namespace", NS, "--state-ttl", "120",
                                       "--checkpoint-every", "1"],
                       pool_args={"denoiser": ["--fake-step-seconds", "0.05"]},
                       log_dir=tmp_path_factory.mktemp("ids-logs"))
    with started(fleet):
        yield fleet


def test_an_ended_request_stays_readable_across_a_restart(fake_fleet):
    fleet = fake_fleet
    first = stream(fleet.target, "kept", request_id="kept-1", **PARAMS)
    assert first.state == "SUCCEEDED", (first.error, first.error_event)
    sched = fleet.process("scheduler")
    fleet.kill(sched)
    fleet.restart(sched)
    with FleetClient(fleet.target) as c:
        status = c.get("kept-1")  # read back from the store
    assert status["state"] == "SUCCEEDED" and status["step"] == PARAMS["num_inference_steps"], status
    again = stream(fleet.target, "kept", request_id="kept-1", **PARAMS)  # re-attach: its result, replayed
    assert again.state == "SUCCEEDED" and again.events[0].kind == "accepted"
    assert again.artifact() == first.artifact() and again.artifact()
    assert not any(e.kind == "progress" for e in again.events)  # nothing ran again
    with pytest.raises(AlreadyExists) as err:
        list(FleetClient(fleet.target).stream("kept", request_id="kept-1", **{**PARAMS, "seed": 6}))
    assert err.value.field == "request_id" and "kept-1" in err.value.message


def test_reusing_a_live_id_with_other_parameters_is_refused(fake_fleet):
    fleet = fake_fleet
    started = threading.Event()
    outs = {}

    def run():
        outs["live"] = stream(fleet.target, "live", request_id="live-1",
                              on_event=lambda o, e: e.kind == "progress" and started.set(),
                              **{**PARAMS, "num_inference_steps": 60})

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(60)
    with FleetClient(fleet.target) as c:
        with pytest.raises(AlreadyExists) as err:
            list(c.stream("other prompt", request_id="live-1", **{**PARAMS, "num_inference_steps": 60}))
        assert err.value.field == "request_id"
        with pytest.raises(AlreadyExists):  # same parameters, but its client is still attached
            list(c.stream("live", request_id="live-1", **{**PARAMS, "num_inference_steps": 60}))
        assert c.cancel("live-1")
    t.join(60)
    assert outs["live"].state == "CANCELLED"
    # a cancelled id is free again, with any parameters
    again = stream(fleet.target, "something else", request_id="live-1", **PARAMS)
    assert again.state == "SUCCEEDED", (again.error, again.error_event)


def test_ended_requests_are_read_back_from_the_store_until_the_ttl_then_the_id_is_free(fake_fleet, real_redis):
    """With one ended request kept in memory (``--retain-finished 1``), an older one is read back
    from the store — GetRequest, re-attach, id reuse refused — until ``--state-ttl``; then it is
    unknown and its id names a new request."""
    fleet, ttl_s = fake_fleet, 4.0
    target = fleet.add_scheduler(["--state-store", real_redis.url, "--state-namespace", NS + "-ttl", "--state-ttl",
                                  str(ttl_s), "--checkpoint-every", "1", "--retain-finished", "1"],
                                 name="scheduler-ttl", timeout_s=START_TIMEOUT_S)
    try:
        old = stream(target, "old", request_id="ttl-old", **PARAMS)
        t_end = time.monotonic()
        assert old.state == "SUCCEEDED", (old.error, old.error_event)
        assert stream(target, "newer", request_id="ttl-new", **PARAMS).state == "SUCCEEDED"  # pushes it out
        with FleetClient(target) as c:
            assert c.get("ttl-old")["state"] == "SUCCEEDED"  # from the store
            with pytest.raises(AlreadyExists) as err:
                list(c.stream("other", request_id="ttl-old", **PARAMS))
            assert err.value.field == "request_id"
        replay = stream(target, "old", request_id="ttl-old", **PARAMS)
        assert replay.state == "SUCCEEDED" and replay.artifact() == old.artifact()
        assert not replay.denoise_steps()  # its result, not a new run
        assert time.monotonic() - t_end < ttl_s, "too slow to check within the TTL"
        stream(target, "newer still", request_id="ttl-newest", **PARAMS)  # ttl-old leaves memory again

        def unknown() -> bool:
            try:
                with FleetClient(target) as c:
                    c.get("ttl-old")
                return False
            except NotFound:
                return True

        wait_until(unknown, ttl_s + 5.0, "the ended request's keys to expire", interval_s=0.25)
        assert time.monotonic() - t_end >= ttl_s - 1.0  # kept for its TTL (the store counts from its end)
        fresh = stream(target, "other", request_id="ttl-old", **PARAMS)  # the id is free again
        assert fresh.state == "SUCCEEDED" and fresh.denoise_steps(), (fresh.error, fresh.error_event)
    finally:
        fp = fleet.process("scheduler-ttl")
        fleet.terminate(fp)
        fleet.schedulers.remove(fp)
