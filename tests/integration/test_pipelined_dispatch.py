"""Pipelined dispatch in the scheduler service: a tick does not wait for the batches it sent.

On no-op pools (``--fake``) whose decode takes seconds and whose denoise step takes 50 ms, a
short request goes to the decoder while a long one is still denoising. The long request's
steps keep running during the decode (with a tick that waited for every batch, none of them
could), and the requests' results are both complete.
"""
from __future__ import annotations

import threading
import time

import pytest

from fastvideo3.client import FleetClient
from tests.fleet_fixture import fleet_fixture, pool_describe, resident_total, wait_until

DECODE_S = 4.0
fleet = fleet_fixture(scope="module", fake=True, roles=("encoder", "denoiser", "decoder"),
                      pool_args={"denoiser": ["--fake-step-seconds", "0.05"],
                                 "decoder": ["--fake-step-seconds", str(DECODE_S)]})


def _stream(target: str, prompt: str, steps: int, out: dict) -> None:
    try:
        with FleetClient(target, timeout_s=120) as c:
            out["events"] = [(time.monotonic(), ev) for ev in c.stream(prompt, output_format="npy",
                                                                        num_inference_steps=steps)]
    except Exception as e:  # noqa: BLE001 - reported by the test
        out["error"] = e


@pytest.mark.timeout(180)
def test_denoise_steps_run_while_another_request_decodes(fleet):
    short, long_ = {}, {}
    threads = [threading.Thread(target=_stream, args=(fleet.target, "short", 1, short)),
               threading.Thread(target=_stream, args=(fleet.target, "long", 12, long_))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    assert "error" not in short and "error" not in long_, (short.get("error"), long_.get("error"))
    for run in (short, long_):
        assert run["events"][-1][1].kind == "finished" and run["events"][-1][1].data["state"] == "SUCCEEDED"

    def first(events, pred):
        return next(t for t, ev in events if pred(ev))

    # the short request's decode started after its one denoise step, and ended with its artifact
    decode_start = first(short["events"], lambda ev: ev.kind == "progress" and ev.data["phase"] == "denoise")
    decode_end = first(short["events"], lambda ev: ev.kind == "progress" and ev.data["phase"] == "decode")
    assert decode_end - decode_start >= DECODE_S * 0.9
    during = [ev.data["step"] for t, ev in long_["events"]
              if ev.kind == "progress" and ev.data["phase"] == "denoise" and decode_start < t < decode_end]
    # with a tick that waited for the decode, at most one step of the long request could land here
    assert len(during) >= 5, (during, decode_end - decode_start)
    steps = [ev.data["step"] for _, ev in long_["events"] if ev.kind == "progress" and ev.data["phase"] == "denoise"]
    assert steps == list(range(1, 13))


@pytest.mark.timeout(180)
def test_ended_requests_ride_on_the_busy_denoisers_next_execute(fleet):
    """Three short requests end while a long one keeps the denoiser busy: their ids reach it on
    its next Execute (``finished_request_ids``), not by Release calls; once the long one ends
    too (the denoiser idle) nothing of any of them is left in any pool."""
    den = fleet.pools["denoiser"][0].target

    def counters() -> dict:
        return dict(pool_describe(den).counters)

    before = counters()
    long_ = {}
    t = threading.Thread(target=_stream, args=(fleet.target, "long", 300, long_))
    t.start()
    wait_until(lambda: counters().get("units", 0) > before.get("units", 0), 30, "the long request to step")
    shorts = [{} for _ in range(3)]
    threads = [threading.Thread(target=_stream, args=(fleet.target, f"short {i}", 1, out))
               for i, out in enumerate(shorts)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert all("error" not in out and out["events"][-1][1].data["state"] == "SUCCEEDED" for out in shorts)
    mid = wait_until(lambda: (c := counters()).get("rpc.carried_releases", 0) >= before.get(
        "rpc.carried_releases", 0) + 3 and c, 10, "the denoiser's next Execute to carry the short ones' ids")
    assert mid.get("rpc.release_rpcs", 0) == before.get("rpc.release_rpcs", 0)  # no Release call for them
    assert long_.get("events") is None  # the long one still runs: its steps carried the ids
    t.join(timeout=150)
    assert "error" not in long_ and long_["events"][-1][1].data["state"] == "SUCCEEDED"
    wait_until(lambda: resident_total(fleet) == 0, 10, "every pool to free every request")


@pytest.mark.timeout(180)
def test_a_large_round_is_double_buffered_and_every_request_steps_in_order(fleet):
    """Ten requests at once (more than the double-buffer threshold): the denoiser gets a second
    batch beside the running one, and every request still sees each of its steps once, in order."""
    import grpc

    from fastvideo3.v1 import scheduler_pb2, scheduler_pb2_grpc

    def dispatch_counters() -> dict:
        with grpc.insecure_channel(fleet.target) as ch:
            d = scheduler_pb2_grpc.SchedulerStub(ch).Describe(scheduler_pb2.DescribeSchedulerRequest(), timeout=30)
        return dict(d.counters)

    before = dispatch_counters().get("dispatch.double_buffered", 0)
    outs = [{} for _ in range(10)]
    threads = [threading.Thread(target=_stream, args=(fleet.target, f"many {i}", 6, out)) for i, out in enumerate(outs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    for out in outs:
        assert "error" not in out, out.get("error")
        assert out["events"][-1][1].data["state"] == "SUCCEEDED"
        steps = [ev.data["step"] for _, ev in out["events"] if ev.kind == "progress" and ev.data["phase"] == "denoise"]
        assert steps == list(range(1, 7))
    assert dispatch_counters().get("dispatch.double_buffered", 0) > before
