"""DBCache parity: cache-dit (the reference implementation) on diffusers' WanPipeline versus our
DBCache interceptor on our engine, on one tiny random 4-block checkpoint, same seed, same
settings: one front block, one back block, threshold 0.08, two warm-up steps, 12 steps, no CFG.
At these settings the decisions alternate (the middle is reused at steps 2, 3, 5, 7, 9 and
computed at the others), so a decision that differed anywhere would show.

Asserted: the same reused steps (the middle block range [1, 3) is the only one that can be
reused), the same measured change at every step, latents and frames within the card's C1
tolerances. cache-dit runs with ``enable_separate_cfg=False``: its Wan adapter otherwise treats
every second transformer call as a CFG branch even when no CFG runs.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fastvideo3.card import resolve_card
from fastvideo3.parity import rel_error
from fastvideo3.engine import Engine

pytestmark = pytest.mark.timeout(600)
OPTS = dict(num_frames=9, height=32, width=48, num_inference_steps=12)
PROMPT = "a red circle moving left"
SEED = 7
SETTINGS = dict(front_blocks=1, back_blocks=1, threshold=0.08, warmup_steps=2)


@pytest.fixture(scope="module")
def wan4(tmp_path_factory):
    from fastvideo3.testing.synthetic_wan import TINY_TRANSFORMER, build_wan_dir
    return build_wan_dir(tmp_path_factory.mktemp("wan4") / "wan", preset="tiny", seed=5,
                         transformer_config={**TINY_TRANSFORMER, "num_layers": 4})


def _cache_dit(path, taylorseer: bool):
    import cache_dit  # the dev extra installs it
    from diffusers import WanPipeline
    pipe = WanPipeline.from_pretrained(str(path))
    cfg = cache_dit.DBCacheConfig(
        Fn_compute_blocks=SETTINGS["front_blocks"], Bn_compute_blocks=SETTINGS["back_blocks"],
        residual_diff_threshold=SETTINGS["threshold"], max_warmup_steps=SETTINGS["warmup_steps"],
        max_cached_steps=-1, max_continuous_cached_steps=-1, enable_separate_cfg=False)
    calib = cache_dit.TaylorSeerCalibratorConfig(taylorseer_order=1) if taylorseer else None
    cache_dit.enable_cache(pipe, cache_config=cfg, calibrator_config=calib)
    out = {}
    for kind in ("latent", "np"):
        res = pipe(prompt=PROMPT, guidance_scale=1.0, generator=torch.Generator().manual_seed(SEED),
                   output_type=kind, **OPTS).frames
        stats = cache_dit.summary(pipe, logging=False)[0]
        out[kind] = (res, list(stats.cached_steps), dict(stats.residual_diffs))
    assert out["latent"][1] == out["np"][1]  # the two reference runs decided alike
    return out["latent"][0], out["np"][0][0], out["latent"][1], out["latent"][2]


@pytest.mark.parametrize("taylorseer", [False, True])
def test_dbcache_matches_cache_dit(wan4, taylorseer):
    want_lat, want_frames, want_reused, want_diffs = _cache_dit(wan4, taylorseer)
    card = resolve_card(str(wan4))
    with Engine(card, keep_latents=True) as engine:
        video = engine.generate(PROMPT, seed=SEED, guidance_scale=1.0,
                                cache={"policy": "dbcache", **SETTINGS, "taylorseer": taylorseer}, **OPTS)
    got = video.metadata["cache"]
    reused = got["reused_steps"]["dbcache/cond"]
    assert reused == want_reused
    assert 0 < len(reused) < OPTS["num_inference_steps"] - SETTINGS["warmup_steps"]  # mixed decisions
    diffs = got["diffs"]["dbcache/cond"]
    assert sorted(diffs, key=int) == sorted(want_diffs, key=int)
    for step, d in want_diffs.items():
        assert abs(diffs[step] - d) <= 1e-4 * max(1.0, abs(d)), step
    # block evaluations: 4 per computed step, 2 (front + back) per reused step
    steps = OPTS["num_inference_steps"]
    assert got["blocks_total"] == 4 * steps and got["blocks_computed"] == 4 * steps - 2 * len(reused)
    assert rel_error(video.latents, want_lat) <= card.parity.c1_latents_rel
    assert float(np.abs(video.frames - want_frames).max()) <= card.parity.c1_frames_abs
