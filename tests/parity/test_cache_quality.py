"""The trained tiny card's default caching policy (dbcache with the card's tuned parameters) on
two prompts of the quality set at the card's defaults (50 steps): at least 40% of the block
evaluations skipped, frames at least 30 dB PSNR against the uncached run. The whole prompt set
is bench/cache_quality.py (bench/results/cache_quality_cpu.json)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fastvideo3.engine import Engine
from fastvideo3.training.data import eval_prompts

pytestmark = pytest.mark.timeout(900)


def test_default_policy_saves_blocks_at_30_db():
    prompts = [eval_prompts()[0], eval_prompts()[-1]]
    with Engine("wan-tiny") as engine:
        runs = [(engine.submit(p, seed=0), engine.submit(p, seed=0, cache={"policy": "dbcache"})) for p in prompts]
        engine.run()
        for ref_run, cached_run in runs:
            ref, cached = engine.result(ref_run), engine.result(cached_run)
            c = cached.metadata["cache"]
            assert c["settings"]["taylorseer"] is True and c["settings"]["threshold"] == 0.2  # the card's tuning
            mse = float(np.mean((cached.frames.astype(np.float64) - ref.frames) ** 2))
            assert c["block_savings"] >= 0.40
            assert 10 * math.log10(1.0 / mse) >= 30.0
