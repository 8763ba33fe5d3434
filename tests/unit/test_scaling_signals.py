"""Scaling signals (fastvideo3/telemetry/scaling.py): replicas needed per role from arrivals and
the cost model's per-role price, and their Prometheus export."""
from __future__ import annotations

import math

import pytest

from fastvideo3.errors import InvalidRequest
from fastvideo3.telemetry.scaling import ScalingSignals, replicas_needed, request_role_seconds


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_the_formula():
    # 2 requests/s x 3 GPU-s each = 6 busy GPUs; at 75% target: 8 replicas; 2 GPUs each: 4
    assert replicas_needed(2.0, 3.0, 0.75) == pytest.approx(8.0)
    assert replicas_needed(2.0, 3.0, 0.75, gpus_per_replica=2) == pytest.approx(4.0)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(InvalidRequest) as err:
            replicas_needed(1.0, 1.0, bad)
        assert err.value.field == "target_utilization"


def test_signals_over_a_window():
    clock = Clock()
    s = ScalingSignals(target_utilization=0.5, window_s=10.0, roles=("encoder", "denoiser", "decoder"),
                       clock=clock)
    for _ in range(20):  # 20 arrivals over 10 s: 2 per second
        clock.t += 0.5
        s.observe({"encoder": 0.01, "denoiser": 1.5, "decoder": 0.25})
    snap = s.snapshot()
    assert snap["denoiser"].arrivals_per_s == pytest.approx(2.0)
    assert snap["denoiser"].gpu_seconds_per_request == pytest.approx(1.5)
    assert snap["denoiser"].replicas_needed == pytest.approx(2.0 * 1.5 / 0.5)
    assert snap["denoiser"].replicas_needed_ceil == 6
    assert snap["decoder"].replicas_needed == pytest.approx(1.0)
    assert snap["encoder"].replicas_needed_ceil == 1  # the minimum, never 0 by default
    clock.t += 11.0  # the window passes with no arrivals: the need falls to the minimum
    assert s.snapshot()["denoiser"].replicas_needed == 0.0
    assert s.snapshot()["denoiser"].replicas_needed_ceil == 1


def test_inputs_are_validated():
    with pytest.raises(InvalidRequest) as err:
        ScalingSignals(window_s=0.5)
    assert err.value.field == "window_s"
    with pytest.raises(InvalidRequest) as err:
        ScalingSignals(roles=("denoiser", "upscaler"))
    assert err.value.field == "roles"
    s = ScalingSignals(roles=("denoiser",))
    s.observe({"denoiser": float("nan"), "other": 3.0})  # dropped quietly, never raises
    assert s.snapshot()["denoiser"].gpu_seconds_per_request == 0.0


def test_prometheus_families():
    pytest.importorskip("prometheus_client")
    clock = Clock()
    s = ScalingSignals(window_s=10.0, roles=("denoiser",), clock=clock)
    clock.t += 10.0
    s.observe({"denoiser": 7.0})
    s.set_current("denoiser", 3)
    fams = {f.name: f for f in s.families("fleet-a")}
    need = fams["fastvideo3_scaling_replicas_needed"].samples[0]
    assert need.labels == {"fleet": "fleet-a", "role": "denoiser"}
    assert need.value == pytest.approx(0.1 * 7.0 / 0.7)
    assert fams["fastvideo3_scaling_replicas_current"].samples[0].value == 3
    assert fams["fastvideo3_scaling_target_utilization"].samples[0].value == 0.7


def test_role_seconds_come_from_the_cost_model():
    from types import SimpleNamespace

    from fastvideo3.card.registry import get_card
    from fastvideo3.runtime.economy.pricing import Pricer
    card = get_card("wan-tiny")
    req = SimpleNamespace(num_frames=9, height=32, width=32, num_inference_steps=4, cfg_policy="cfg",
                          precision="fp32")
    pricer = Pricer()
    four = request_role_seconds(pricer, card, req)
    eight = request_role_seconds(pricer, card, SimpleNamespace(**{**vars(req), "num_inference_steps": 8}))
    assert set(four) == {"encoder", "denoiser", "decoder"}
    assert math.isclose(eight["denoiser"], 2 * four["denoiser"])  # one diffusion_step per step
    assert eight["decoder"] == four["decoder"] and four["encoder"] > 0
