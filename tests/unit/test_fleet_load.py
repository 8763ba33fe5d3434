"""A fleet's live load: the scheduler's ledger of GPU-seconds owed, its Describe form, and the
Prometheus text the Dynamo workers append to Dynamo's /metrics."""
from __future__ import annotations

import pytest

from fastvideo3.telemetry.scaling import WorkLedger
from fleet.dynamo.load import FleetLoad, expfmt
from fleet.routing import FleetRouter, FleetState


def test_ledger_owes_until_done_and_shrinks_with_progress():
    ledger = WorkLedger()
    ledger.add("a", {"encoder": 0.1, "denoiser": 8.0, "decoder": 1.0})
    ledger.add("b", {"encoder": 0.1, "denoiser": 4.0, "decoder": 1.0})
    assert ledger.owed() == pytest.approx({"encoder": 0.2, "denoiser": 12.0, "decoder": 2.0})
    ledger.progress("a", 3, 4)  # three of four steps done; encoding is over
    assert ledger.owed() == pytest.approx({"encoder": 0.1, "denoiser": 6.0, "decoder": 2.0})
    ledger.progress("unknown", 1, 2)  # ignored
    ledger.remove("a")
    ledger.remove("a")
    assert len(ledger) == 1 and ledger.owed()["denoiser"] == pytest.approx(4.0)


def test_load_from_describe_and_its_prometheus_text():
    prometheus_parser = pytest.importorskip("prometheus_client.parser")
    described = {"running_requests": 3, "description": {"load": {
        "owed_gpu_seconds": {"denoiser": 12.0, "decoder": 2.0}, "requests": 3,
        "replicas": {"denoiser": 4, "decoder": 1}, "memory_budget_bytes": 100, "memory_free_bytes": 40,
        "admission_reserved_gpu_seconds": 0.5, "admission_waiting": 1}}}
    load = FleetLoad.from_description(described)
    assert load.requests == 3 and load.memory_free_bytes == 40
    assert load.seconds_to_drain() == pytest.approx(3.0)  # the busiest role: denoiser 12 s on 4, decoder 2 on 1
    text = expfmt({"a": load, 'b"x': FleetLoad(serving=False)})
    fams = {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}
    owed = {(s.labels["fleet"], s.labels["role"]): s.value for s in fams["fastvideo3_fleet_owed_gpu_seconds"].samples}
    assert owed == {("a", "denoiser"): 12.0, ("a", "decoder"): 2.0}
    serving = {s.labels["fleet"]: s.value for s in fams["fastvideo3_fleet_serving"].samples}
    assert serving == {"a": 1.0, 'b"x': 0.0}
    assert FleetLoad.from_description({}).owed_gpu_seconds == {}  # a scheduler without the report


def test_outside_load_counts_only_beyond_the_routers_own_requests():
    from fleet.deployment_card import card_for_model
    f = FleetState("a", "x:1", card_for_model("wan-tiny"))
    router = FleetRouter([f], "cost")
    router.pick("mine", "wan-tiny", {"num_frames": 9, "height": 32, "width": 32, "num_inference_steps": 2})
    mine = f.backlog_s()["denoiser"]
    f.set_reported({"denoiser": mine}, requests=1)  # the fleet runs only ours
    assert f.backlog_s()["denoiser"] == pytest.approx(mine)
    f.set_reported({"denoiser": mine + 5.0}, requests=3)  # two more from elsewhere
    assert f.backlog_s()["denoiser"] == pytest.approx(mine + 5.0)
