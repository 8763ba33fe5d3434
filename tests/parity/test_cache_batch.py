"""Per-request caching inside cross-request batches: four requests at different steps, two
reusing their middle blocks and two computing, in one forward, give each the frames it gets
alone — bit-identical with step batching off, within the card's C1 tolerance with it on — and
the mixed forward runs only the blocks its computing rows need."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastvideo3.extend.runner as runner
from fastvideo3.card import resolve_card
from fastvideo3.parity import rel_error
from fastvideo3.engine import Engine

pytestmark = pytest.mark.timeout(600)
OPTS = dict(num_frames=9, height=32, width=32, num_inference_steps=8)
# threshold 1.0 reuses the middle at every step after the two warm-up steps
CACHE = {"policy": "dbcache", "front_blocks": 1, "back_blocks": 1, "threshold": 1.0, "warmup_steps": 2}
REQS = [("a red circle moving left", 1), ("a blue square moving up", 22),
        ("a green triangle moving right", 333), ("a yellow circle moving down", 4444)]


def _alone(card):
    with Engine(card, keep_latents=True, batching=False) as engine:
        return [engine.generate(p, seed=s, cache=CACHE, **OPTS) for p, s in REQS]


def _staggered(card, batching):
    """Two requests start; once they are past warm-up (reusing), two more start (computing)."""
    with Engine(card, keep_latents=True, batching=batching) as engine:
        first = [engine.submit(p, seed=s, cache=CACHE, **OPTS) for p, s in REQS[:2]]
        engine.run(until=lambda: all(r.progress()[0] >= 3 for r in first))
        rest = [engine.submit(p, seed=s, cache=CACHE, **OPTS) for p, s in REQS[2:]]
        engine.run()
        return [engine.result(r) for r in first + rest]


@pytest.fixture()
def forwards(monkeypatch):
    seen = []
    real = runner.staged_forward

    def spy(model, latents, timestep, text, groups, fixed_rows=False, lora=None):
        out = real(model, latents, timestep, text, groups, fixed_rows=fixed_rows, lora=lora)
        seen.append([(g.reused_middle, g.blocks_run, len(g.rows)) for g in groups])
        return out
    monkeypatch.setattr(runner, "staged_forward", spy)
    return seen


def test_mixed_batch_equals_each_request_alone(forwards):
    card = resolve_card("wan-tiny-seeded")
    alone = _alone(card)
    forwards.clear()
    serial = _staggered(card, batching=False)
    assert all(len(f) == 1 for f in forwards)  # batching off: one request per forward
    for a, b in zip(serial, alone):
        assert np.array_equal(a.frames, b.frames) and torch.equal(a.latents, b.latents)
    forwards.clear()
    batched = _staggered(card, batching=True)
    mixed = [f for f in forwards if len(f) == 4 and sorted(g[0] for g in f) == [False, False, True, True]]
    assert mixed, "no forward held two reusing and two computing requests"
    for f in mixed:  # reusing rows ran only the front and back block; computing rows all four
        assert sorted((g[0], g[1]) for g in f) == [(False, 4), (False, 4), (True, 2), (True, 2)]
    for a, b in zip(batched, alone):
        assert rel_error(a.latents, b.latents) <= card.parity.c1_latents_rel
        assert float(np.abs(a.frames - b.frames).max()) <= card.parity.c1_frames_abs
        assert a.metadata["cache"]["reused_steps"] == b.metadata["cache"]["reused_steps"]
    assert not np.array_equal(alone[0].frames, alone[1].frames)
