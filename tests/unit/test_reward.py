"""Reward scorers (no downloaded weights), the reward_score loop and the RewardExecutor."""
from __future__ import annotations

import pytest
import torch

from fastvideo3.card import get_card
from fastvideo3.errors import InvalidRequest
from fastvideo3.loop import Done, RequestContext, RewardScoreLoop, StepResult
from fastvideo3.models.reward import ImageQualityScorer, Scorer, TemporalConsistencyScorer, check_scorer_names
from fastvideo3.request.schema import GenerateRequest, resolve
from services.common.fake import fake_ref

pytestmark = pytest.mark.timeout(60)


def _pattern(frames=5, size=32, blur=0):
    y, x = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    img = torch.stack([((x // 4 + y // 4) % 2).float(), (x / size), (y / size)], dim=-1)
    if blur:
        k = torch.ones(1, 1, blur, blur) / blur**2
        img = torch.nn.functional.conv2d(img.permute(2, 0, 1)[:, None], k, padding=blur // 2)[:, 0].permute(1, 2, 0)
        img = img[:size, :size]
    return img[None].repeat(frames, 1, 1, 1)


def test_scorers_satisfy_the_protocol():
    assert isinstance(TemporalConsistencyScorer(), Scorer) and isinstance(ImageQualityScorer(), Scorer)


def test_temporal_consistency_is_high_for_a_static_clip_and_low_for_noise():
    tc = TemporalConsistencyScorer()
    static = tc.score(_pattern())
    noise = tc.score(torch.rand(5, 32, 32, 3, generator=torch.Generator().manual_seed(0)))
    moving = tc.score(torch.stack([torch.roll(_pattern(1)[0], shifts=i, dims=1) for i in range(5)]))
    assert static == pytest.approx(1.0)
    assert noise < 0.4 < moving < static


def test_image_quality_orders_flat_below_blurred_below_sharp():
    iq = ImageQualityScorer()
    flat = iq.score(torch.full((3, 32, 32, 3), 0.5))
    blurred = iq.score(_pattern(3, blur=5))
    sharp = iq.score(_pattern(3))
    assert flat == pytest.approx(0.0, abs=1e-9)
    assert flat < blurred < sharp <= 1.0


def test_scores_are_deterministic_and_reject_bad_frames():
    clip = torch.rand(4, 16, 16, 3, generator=torch.Generator().manual_seed(1))
    assert ImageQualityScorer().score(clip) == ImageQualityScorer().score(clip.clone())
    with pytest.raises(InvalidRequest) as e:
        ImageQualityScorer().score(torch.zeros(16, 16, 3))
    assert e.value.field == "frames"


def test_unknown_scorer_names_the_field():
    with pytest.raises(InvalidRequest) as e:
        check_scorer_names(["aesthetics"])
    assert e.value.field == "rewards" and "image_quality" in e.value.limit
    assert check_scorer_names(["image_quality", "image_quality"]) == ["image_quality"]


def test_reward_loop_plans_one_unit_and_folds_the_scores():
    card = get_card("wan-tiny")
    req = resolve(GenerateRequest(prompt="p", request_id="r1"), card)
    loop = RewardScoreLoop()
    frames = fake_ref("decoder", "r1", "f", [9, 64, 64, 3], "uint8")
    state = loop.init(req, card, RequestContext(refs={"frames": frames}, rewards=["image_quality"]))
    plan = loop.next(state)
    assert plan.kind == "reward_batch" and plan.role == "reward" and plan.inputs == {"frames": frames}
    assert plan.shape_sig == "reward_batch|wan-tiny|9x64x64|image_quality"
    state = loop.advance(state, StepResult("u", "r1", payload={"scores": {"image_quality": 0.5}}))
    done = loop.next(state)
    assert isinstance(done, Done) and done.result.payload == {"scores": {"image_quality": 0.5}}
    with pytest.raises(ValueError):
        loop.advance(loop.init(req, card, RequestContext(refs={"frames": frames}, rewards=["image_quality"])),
                     StepResult("u", "r1"))


def test_reward_executor_scores_frames_pulled_through_the_transport():
    from fastvideo3.runtime.pool.reward_executor import RewardExecutor
    from fastvideo3.runtime.scheduling.workunit import WorkUnit
    from fastvideo3.transport import make_transport
    transport = make_transport("inproc", owner="test")
    ex = RewardExecutor(get_card("wan-tiny"), transport, device="cpu")
    ref = transport.publish("r1", "frames", _pattern(3))
    unit = WorkUnit("u1", "r1", "reward_score", "reward_batch", "reward", "wan-tiny", "sig",
                    params={"scorers": ["temporal_consistency", "image_quality"]}, inputs={"frames": ref})
    bad = WorkUnit("u2", "r2", "reward_score", "reward_batch", "reward", "wan-tiny", "sig",
                   params={"scorers": ["nope"]}, inputs={"frames": ref})
    ok, failed = ex.execute([unit, bad])
    assert ok.ok and ok.payload["scores"]["temporal_consistency"] == pytest.approx(1.0)
    assert ok.metrics["reward.image_quality"] == ok.payload["scores"]["image_quality"]
    assert not failed.ok and failed.error.field == "rewards"
    ex.release("r1")
    assert transport.stats()["resident_buffers"] == 0
