"""Interceptor settings, the card contract, the CacheKey field, and the resident snapshot of
interceptor tensors (pure, CPU, no model)."""
from __future__ import annotations

import json

import pytest
import torch

from fastvideo3.cache.key import CacheKey
from fastvideo3.card.registry import get_card
from fastvideo3.errors import FailedPrecondition, InvalidRequest
from fastvideo3.extend.policies import DBCache, TeaCache
from fastvideo3.extend.protocols import RowView
from fastvideo3.extend.settings import resolve_cache, settings_key
from fastvideo3.loop.samplers import SamplerHistory
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.pool.resident import pool_identity, restore_regions, snapshot_regions


def test_settings_are_filled_and_checked():
    card = get_card("wan-tiny")
    s = resolve_cache({"policy": "dbcache", "threshold": 0.2}, card, 50)
    assert s["threshold"] == 0.2 and s["front_blocks"] == 1 and s["taylorseer"] is True  # the card's tuning
    assert resolve_cache({"policy": "fbcache"}, card, 50)["threshold"] == 0.08  # the policy's default
    assert resolve_cache(None, card, 50) is None and resolve_cache({"policy": "none"}, card, 50) is None
    cases = [
        ({"policy": "nope"}, "cache.policy", "none, dbcache, fbcache, teacache"),
        ({"policy": "dbcache", "threshold": 0.0}, "cache.threshold", "(0.0, 1.0]"),
        ({"policy": "dbcache", "threshold": 1.5}, "cache.threshold", "(0.0, 1.0]"),
        ({"policy": "teacache", "threshold": "x"}, "cache.threshold", "(0.0, 2.0]"),
        ({"policy": "dbcache", "warmup_steps": 51}, "cache.warmup_steps", "[0, 50]"),
        ({"policy": "dbcache", "front_blocks": 2.5}, "cache.front_blocks", "[1, 1000]"),
        ({"policy": "dbcache", "front_blocks": 2, "back_blocks": 2}, "cache.back_blocks",
         "front_blocks + back_blocks <= 3"),
        ({"policy": "dbcache", "taylorseer": 1}, "cache.taylorseer", "true or false"),
        ({"policy": "fbcache", "front_blocks": 2}, "cache.front_blocks", None),
    ]
    for req, field, limit in cases:
        with pytest.raises(InvalidRequest) as ei:
            resolve_cache(req, card, 50)
        assert ei.value.field == field, req
        if limit is not None:
            assert ei.value.limit == limit, req


def test_distilled_card_refuses_caching_and_a_card_default_applies():
    distilled = get_card("wan-tiny-4step")
    with pytest.raises(FailedPrecondition) as ei:
        resolve(GenerateRequest(prompt="x", cache={"policy": "fbcache"}), distilled)
    assert ei.value.code == "FAILED_PRECONDITION" and ei.value.field == "cache.policy"
    assert resolve(GenerateRequest(prompt="x"), distilled).cache is None
    data = get_card("wan-tiny").model_dump(mode="json")
    data["extensions"].update(default={"policy": "dbcache"}, params={"dbcache": {"threshold": 0.3}})
    card = type(distilled).model_validate(data)
    r = resolve(GenerateRequest(prompt="x", num_inference_steps=20), card)
    assert r.cache["policy"] == "dbcache" and r.cache["threshold"] == 0.3
    assert resolve(GenerateRequest(prompt="x", cache={"policy": "none"}), card).cache is None
    assert resolve(GenerateRequest(prompt="x", cache={"policy": "dbcache", "threshold": 0.1}), card).cache[
        "threshold"] == 0.1


def test_every_output_changing_setting_splits_the_cache_key():
    card = get_card("wan-tiny")
    base = dict(model_id="m", component_id="c", weights_version="w", precision="fp32", device="cpu", max_len=8,
                shape_sig="s", input_hash="h")
    keys = {CacheKey(**base).digest()}
    for req in ({"policy": "dbcache"}, {"policy": "dbcache", "threshold": 0.09},
                {"policy": "dbcache", "taylorseer": False}, {"policy": "teacache"}, {"policy": "fbcache"}):
        keys.add(CacheKey(**base, interceptors=settings_key(resolve_cache(req, card, 50))).digest())
    assert len(keys) == 6


def test_interceptor_tensors_snapshot_bit_identical():
    hist = SamplerHistory(order=2)
    plugin = {"dbcache/cond+uncond": {"front_residual": torch.randn(2, 5, 3), "taylor.0": torch.randn(2, 5, 3),
                                      "taylor.1": torch.randn(2, 5, 3)}}
    ident = pool_identity("w", "fp32", "cpu")
    blob = snapshot_regions(ident, torch.randn(1, 4, 2, 2), hist, 3, plugin=plugin)
    _, _, step, back = restore_regions(ident, blob, with_plugin=True)
    assert step == 3 and back.keys() == plugin.keys()
    for k, t in plugin["dbcache/cond+uncond"].items():
        assert torch.equal(back["dbcache/cond+uncond"][k], t)
    assert len(restore_regions(ident, blob)) == 3  # the old form is unchanged


def test_policy_state_is_json_and_decisions_follow_the_reference_rules():
    db = DBCache({"threshold": 0.5, "warmup_steps": 1, "max_cached_steps": -1, "max_continuous_cached_steps": 1})
    row = RowView(step=0, num_steps=6, state={})
    r = torch.ones(1, 4, 2)
    decisions = []
    for k in range(5):
        row.step = k
        reuse = db.reuse_middle(row, r * (1 + 0.01 * k))
        decisions.append(reuse)
        if not reuse:
            db.after_middle(row, r)
    # warm-up computes step 0; then at most one reuse in a row
    assert decisions == [False, True, False, True, False]
    assert json.loads(json.dumps(row.state)) == row.state
    tea = TeaCache({"threshold": 0.05, "warmup_steps": 1, "final_steps": 1, "rescale": False})
    row = RowView(step=0, num_steps=4, state={})
    out = []
    for k in range(4):
        row.step = k
        out.append(tea.reuse_step(row, r * (1 + 0.02 * k)))
        if not out[-1]:
            tea.after_step(row, r, 2 * r)
    assert out == [False, True, True, False]  # accumulated 0.02, 0.02+0.0196 < 0.05; the last step computes


@pytest.mark.timeout(120)
def test_staged_forward_is_the_forward_on_both_dit_paths():
    from fastvideo3.extend.runner import RowGroup, staged_forward
    from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig
    from fastvideo3.models.wan.fast import FastWanDiT
    torch.manual_seed(0)
    cfg = WanDiTConfig(num_attention_heads=2, attention_head_dim=12, text_dim=16, freq_dim=16, ffn_dim=32,
                       num_layers=4, rope_max_seq_len=32)
    dit = WanDiT(cfg).eval()
    x, t, text = torch.randn(3, 16, 3, 8, 8), torch.tensor([900.0, 500.0, 20.0]), torch.randn(3, 7, 16)
    with torch.no_grad():
        want = dit(x, t, text)
        # reference path: bit-identical, whole batch and row by row through gathered segments
        assert torch.equal(staged_forward(dit, x, t, text, [RowGroup([0, 1, 2])]), want)
        db = DBCache({"front_blocks": 1, "back_blocks": 1, "threshold": 0.5, "warmup_steps": 0,
                      "max_cached_steps": -1, "max_continuous_cached_steps": -1})
        views = [RowView(step=0, num_steps=2, state={}), RowView(step=0, num_steps=2, state={})]
        groups = [RowGroup([0], views[0], None, db), RowGroup([1]), RowGroup([2], views[1], None, db)]
        got = staged_forward(dit, x, t, text, groups)  # nothing cached yet: every row computes
        assert [g.blocks_run for g in groups] == [4, 4, 4]
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()
        fast = FastWanDiT(dit, kernels="torch")
        got = staged_forward(fast, x, t, text, [RowGroup([0, 1, 2])])
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()
        # the next step with the same input: both cached rows reuse their middle, the plain row computes
        for v in views:
            v.step = 1
        groups = [RowGroup([0], views[0], None, db), RowGroup([1]), RowGroup([2], views[1], None, db)]
        got = staged_forward(dit, x, t, text, groups)
        assert [(g.reused_middle, g.blocks_run) for g in groups] == [(True, 2), (False, 4), (True, 2)]
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()  # same input: the residual is exact
