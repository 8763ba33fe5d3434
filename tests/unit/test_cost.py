"""The cost model: closed-form DiT work counts, online calibration, serialization."""
from __future__ import annotations

import json
import math
import random
import statistics
import threading

import pytest

from fastvideo3.errors import InvalidRequest
from fastvideo3.runtime.economy.cost import (
    CalibratedCostModel,
    CalibrationConfig,
    CostModel,
    DiffusionStepFeatures,
    EncoderChunkFeatures,
    Prediction,
    RewardBatchFeatures,
    VaeTileFeatures,
    device_profile,
    split_measured,
)
from fastvideo3.models.wan.flops import (
    DitConfig, StepShape, dit_forward_cost, dit_peak_activation_bytes, dit_resident_memory,
)

WAN_1_3B = DitConfig.wan21_1_3b()


@pytest.mark.timeout(30)
def test_wan_1_3b_forward_is_about_283_tflop():
    shape = StepShape.from_video(81, 480, 832)
    assert (shape.latent_frames, shape.latent_height, shape.latent_width) == (21, 60, 104)
    assert shape.tokens(WAN_1_3B) == 32_760
    flops = dit_forward_cost(WAN_1_3B, shape).flops
    assert abs(flops - 283e12) / 283e12 <= 0.10
    # The model is the "1.3B" one: weights plus embedders land in the right range.
    assert 1.2e9 <= WAN_1_3B.param_count() <= 1.5e9


@pytest.mark.timeout(30)
def test_flops_scale_quadratically_for_attention_linearly_for_ffn():
    small = StepShape(latent_frames=10, latent_height=30, latent_width=52)
    double = StepShape(latent_frames=20, latent_height=30, latent_width=52)
    assert double.tokens(WAN_1_3B) == 2 * small.tokens(WAN_1_3B)
    a, b = dit_forward_cost(WAN_1_3B, small), dit_forward_cost(WAN_1_3B, double)
    assert b.components["self_attn_core"].flops / a.components["self_attn_core"].flops == pytest.approx(4.0)
    assert b.components["ffn"].flops / a.components["ffn"].flops == pytest.approx(2.0)
    assert b.components["self_attn_proj"].flops / a.components["self_attn_proj"].flops == pytest.approx(2.0)
    # Text K/V projections do not depend on the video length at all.
    assert b.components["cross_attn_kv"].flops == pytest.approx(a.components["cross_attn_kv"].flops)
    # Batch and CFG branches multiply FLOPs, but weights are read once per call.
    cfg = StepShape(10, 30, 52, batch=2, cfg_branches=2)
    c = dit_forward_cost(WAN_1_3B, cfg)
    assert c.flops == pytest.approx(4 * a.flops)
    assert c.bytes < 4 * a.bytes


@pytest.mark.timeout(30)
def test_memory_estimates_are_flash_style_and_count_sampler_history():
    shape = StepShape.from_video(81, 480, 832)
    tok, d = shape.tokens(WAN_1_3B), WAN_1_3B.hidden
    peak = dit_peak_activation_bytes(WAN_1_3B, shape)
    assert peak < tok * tok * 2  # no L x L score matrix
    assert peak > tok * d * 4 + tok * WAN_1_3B.ffn_dim * 2 * 2  # residual + FFN hidden, at least
    one = dit_resident_memory(WAN_1_3B, shape, sampler_history=0)
    two = dit_resident_memory(WAN_1_3B, shape, sampler_history=2)
    assert one.latent == 16 * 21 * 60 * 104 * 4
    assert two.sampler_history == 2 * two.latent
    assert two.total == two.weights + two.per_request
    assert two.weights == WAN_1_3B.param_count() * 2


def _shapes(rng: random.Random, n: int) -> list[StepShape]:
    return [StepShape(latent_frames=rng.choice([1, 5, 9, 13, 21]), latent_height=rng.choice([30, 60, 90]),
                      latent_width=rng.choice([52, 104]), cfg_branches=rng.choice([1, 2]))
            for _ in range(n)]


@pytest.mark.timeout(30)
def test_calibration_learns_a_3_7x_slower_device():
    rng = random.Random(7)
    model = CalibratedCostModel(device=device_profile("h200"))
    truth = 3.7

    def feats(s: StepShape) -> DiffusionStepFeatures:
        return DiffusionStepFeatures(WAN_1_3B, s)

    # Before calibration the prior is off by the full factor: |1 - 3.7| / 3.7 = 73%.
    before = []
    for s in _shapes(rng, 20):
        p = model.predict("diffusion_step", s.key(), feats(s))
        before.append(abs(p.gpu_seconds - p.prior_seconds * truth) / (p.prior_seconds * truth))
    assert statistics.median(before) >= 0.6

    for s in _shapes(rng, 20):
        p = model.predict("diffusion_step", s.key(), feats(s))
        model.observe("diffusion_step", s.key(), p.prior_seconds * truth * rng.uniform(0.9, 1.1), p)

    after = []
    for s in _shapes(rng, 20):
        p = model.predict("diffusion_step", s.key(), feats(s))
        measured = p.prior_seconds * truth * rng.uniform(0.9, 1.1)
        after.append(abs(p.gpu_seconds - measured) / measured)
    assert statistics.median(after) <= 0.25
    assert model.factor("denoiser", "diffusion_step") == pytest.approx(truth, rel=0.1)

    stats = model.error_stats()
    assert stats["count"] == 20
    assert stats["median"] <= 0.25  # only the first observation carried the prior's error
    assert stats["p90"] >= stats["median"]


@pytest.mark.timeout(30)
def test_calibration_is_per_pool_and_kind_and_refines_per_shape_bucket():
    model = CalibratedCostModel(calibration=CalibrationConfig(min_bucket_samples=3))
    small, big = StepShape(5, 30, 52), StepShape(21, 60, 104)
    for _ in range(10):
        for shape, factor in ((small, 2.0), (big, 6.0)):
            p = model.predict("diffusion_step", shape.key(), DiffusionStepFeatures(WAN_1_3B, shape))
            model.observe("diffusion_step", shape.key(), p.prior_seconds * factor, p)
    assert model.factor("denoiser", "diffusion_step", small.key()) == pytest.approx(2.0)
    assert model.factor("denoiser", "diffusion_step", big.key()) == pytest.approx(6.0)
    # An unseen shape falls back to the (pool, kind) median; other kinds are untouched.
    assert 2.0 <= model.factor("denoiser", "diffusion_step", "unseen") <= 6.0
    enc = model.predict("encoder_chunk", "t512", EncoderChunkFeatures(params=5_000_000_000, tokens=512))
    assert enc.gpu_seconds == pytest.approx(enc.prior_seconds)
    # A different pool name keeps its own calibration.
    other = DiffusionStepFeatures(WAN_1_3B, small, pool="denoiser-b")
    p = model.predict("diffusion_step", small.key(), other)
    assert p.gpu_seconds == pytest.approx(p.prior_seconds)


@pytest.mark.timeout(30)
def test_calibration_is_robust_and_bounded():
    model = CalibratedCostModel(calibration=CalibrationConfig(max_factor=10.0))
    f = RewardBatchFeatures(frames=16)
    for i in range(15):
        p = model.predict("reward_batch", "r16", f)
        outlier = 1000.0 if i % 5 == 0 else 1.5  # a preempted step now and then
        model.observe("reward_batch", "r16", p.prior_seconds * outlier, p)
    assert model.factor("reward", "reward_batch", "r16") == pytest.approx(1.5)
    for _ in range(40):
        p = model.predict("reward_batch", "r16", f)
        model.observe("reward_batch", "r16", p.prior_seconds * 1e6, p)
    assert model.factor("reward", "reward_batch", "r16") == pytest.approx(10.0)
    # Garbage measurements are dropped and counted, never raise.
    p = model.predict("reward_batch", "r16", f)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        model.observe("reward_batch", "r16", bad, p)
    assert model.error_stats()["dropped"] == 4


@pytest.mark.timeout(30)
def test_other_kinds_have_priors_that_scale_with_their_size():
    model = CalibratedCostModel(device=device_profile("h200"))
    e1 = model.predict("encoder_chunk", "a", EncoderChunkFeatures(params=5_000_000_000, tokens=256))
    e2 = model.predict("encoder_chunk", "b", EncoderChunkFeatures(params=5_000_000_000, tokens=512, batch=2))
    assert e2.gpu_seconds > e1.gpu_seconds and e2.peak_bytes > e1.peak_bytes
    v1 = model.predict("vae_tile", "a", VaeTileFeatures(frames=17, height=240, width=416))
    v2 = model.predict("vae_tile", "b", VaeTileFeatures(frames=17, height=480, width=832))
    assert v2.peak_bytes == 4 * v1.peak_bytes and v2.gpu_seconds > 3 * v1.gpu_seconds
    r1 = model.predict("reward_batch", "a", RewardBatchFeatures(frames=8))
    r2 = model.predict("reward_batch", "b", RewardBatchFeatures(frames=16))
    assert r2.peak_bytes == 2 * r1.peak_bytes
    assert {e1.pool, v1.pool, r1.pool} == {"encoder", "decoder", "reward"}


@pytest.mark.timeout(30)
def test_unknown_kind_or_wrong_features_are_typed_errors():
    model = CalibratedCostModel()
    with pytest.raises(InvalidRequest) as err:
        model.predict("ar_token", "x", RewardBatchFeatures(frames=1))
    assert err.value.field == "unit_kind"
    with pytest.raises(InvalidRequest) as err:
        model.predict("vae_tile", "x", RewardBatchFeatures(frames=1))
    assert err.value.field == "features"
    with pytest.raises(InvalidRequest):
        device_profile("tpu")


@pytest.mark.timeout(30)
def test_device_profiles_and_overrides():
    cpu, h200 = device_profile("cpu"), device_profile("h200")
    assert cpu.peak_flops == 50e9 and cpu.bandwidth == 10e9
    assert h200.peak_flops == pytest.approx(755e12) and h200.bandwidth == pytest.approx(4.0e12)
    slow = device_profile("h200", efficiency=h200.efficiency / 2)
    assert slow.seconds(1e15, 0) == pytest.approx(2 * (h200.seconds(1e15, 0) - h200.overhead_s) + h200.overhead_s)
    feats = DiffusionStepFeatures(WAN_1_3B, StepShape(21, 60, 104))
    on_cpu = CalibratedCostModel(device=cpu).predict("diffusion_step", "k", feats)
    on_gpu = CalibratedCostModel(device=h200).predict("diffusion_step", "k", feats)
    assert on_cpu.gpu_seconds > 1000 * on_gpu.gpu_seconds


@pytest.mark.timeout(30)
def test_serialization_round_trip_is_json_safe_and_versioned():
    model = CalibratedCostModel(device=device_profile("h200", efficiency=0.55))
    shape = StepShape(21, 60, 104, cfg_branches=2)
    feats = DiffusionStepFeatures(WAN_1_3B, shape)
    for factor in (3.0, 3.2, 3.1, 2.9, 3.0, 3.3):
        p = model.predict("diffusion_step", shape.key(), feats)
        model.observe("diffusion_step", shape.key(), p.prior_seconds * factor, p)
    d = model.to_dict()
    text = json.dumps(d, allow_nan=False)
    again = CalibratedCostModel.from_dict(json.loads(text))
    assert again.to_dict() == d
    assert d["version"] == 1
    a = model.predict("diffusion_step", shape.key(), feats)
    b = again.predict("diffusion_step", shape.key(), feats)
    assert a == b
    # Calibration keeps working after the restore.
    again.observe("diffusion_step", shape.key(), b.prior_seconds * 3.0, b)
    with pytest.raises(InvalidRequest) as err:
        CalibratedCostModel.from_dict({**d, "version": 99})
    assert err.value.field == "version"
    assert DitConfig.from_dict(json.loads(json.dumps(WAN_1_3B.to_dict()))) == WAN_1_3B


@pytest.mark.timeout(30)
def test_protocol_split_and_thread_safety():
    model = CalibratedCostModel()
    assert isinstance(model, CostModel)
    preds = [Prediction(1.0, 0, 0, prior_seconds=1.0), Prediction(3.0, 0, 0, prior_seconds=3.0)]
    assert split_measured(8.0, preds) == [2.0, 6.0]
    feats = VaeTileFeatures(frames=5, height=64, width=64)

    def worker() -> None:
        for _ in range(200):
            p = model.predict("vae_tile", "t", feats)
            model.observe("vae_tile", "t", p.prior_seconds * 2.0, p)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    stats = model.error_stats()
    assert stats["total"] == 800
    assert math.isclose(model.factor("decoder", "vae_tile", "t"), 2.0)
