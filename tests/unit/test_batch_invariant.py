"""Batch-invariant mode (fastvideo3.runtime.scheduling.invariant) in one process: the same request alone and
beside three different batch-mates gives bit-identical frames, with and without step caching;
without the mode the batch-mates change the last bits on this CPU (the control shows the test can
fail). The scheduler flag resolves as documented."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastvideo3
from fastvideo3.runtime.scheduling.invariant import cut, pad_rows

CARD = "wan-tiny-seeded"
KW = dict(num_frames=9, height=32, width=32, num_inference_steps=6)
ME = ("a red circle moving left", dict(seed=3))
#: three different batch-mates: another prompt that ends early (the batch shrinks under the
#: request), another guidance and step count, and one that runs to the end beside it
MATES = [("a blue square", dict(seed=5, num_inference_steps=2)),
         ("a green ball", dict(seed=6, num_inference_steps=4, guidance_scale=3.0)),
         ("yellow stripes", dict(seed=7))]
pytestmark = pytest.mark.timeout(180)


def alone_and_together(invariant: bool, cache: dict | None = None):
    """``ME``'s frames run alone, then beside MATES (one batch of up to four), on one engine."""
    extra = {"cache": cache} if cache else {}
    with fastvideo3.Engine(CARD, max_batch=4, batch_invariant=invariant) as engine:
        alone = engine.generate(ME[0], **{**KW, **ME[1], **extra})
        runs = [engine.submit(ME[0], **{**KW, **ME[1], **extra})]
        runs += [engine.submit(p, **{**KW, **kw, **extra}) for p, kw in MATES]
        engine.run()
        together = engine.result(runs[0])
        for r in runs[1:]:
            engine.result(r)
        assert engine.scheduler.counters["multi_request_batches"] >= 3  # it did share its batches
        return alone, together, dict(engine.denoiser.counters)


def test_alone_and_with_three_batch_mates_bit_identical():
    alone, together, counters = alone_and_together(True)
    assert np.array_equal(alone.frames, together.frames)
    # alone: 6 forwards of 1 real + 3 padding units (x2 rows, batched CFG); beside mates fewer pads
    assert counters["padding_rows"] > 0 and counters["max_batch_rows"] == 8
    assert alone.metadata["runtime"]["batch_invariant_bucket"] == 4


def test_with_step_caching_the_padding_rows_run_every_block():
    alone, together, _ = alone_and_together(True, cache={"policy": "fbcache", "warmup_steps": 1, "threshold": 0.2})
    assert alone.metadata["cache"]["block_savings"] > 0  # some steps reused: rows of mixed decisions
    assert np.array_equal(alone.frames, together.frames)


def test_without_the_mode_batch_mates_change_the_bits():
    """The control: with the mode off the comparison above is not bit-identical on a CPU whose BLAS
    picks its GEMM kernel by M (here: the timestep MLP's and the patch embedding's GEMMs)."""
    alone, together, counters = alone_and_together(False)
    assert counters["padding_rows"] == 0 and alone.metadata["runtime"]["batch_invariant_bucket"] is None
    np.testing.assert_allclose(alone.frames, together.frames, atol=1e-4)  # batching reorders sums only
    if np.array_equal(alone.frames, together.frames):
        pytest.xfail("this BLAS happens to be batch-invariant without padding")


def test_cut_and_pad_rows():
    members = list(range(10))
    assert cut(members, 4, True) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert cut(members, None, True) == [members] and cut([1, 2], 4, False) == [[1], [2]]
    x, t, text = torch.randn(3, 4, 2), torch.tensor([1.0, 2.0, 3.0]), torch.randn(3, 5, 6)
    px, pt, ptext, tags, extra = pad_rows(x, t, text, ["a", "b", "c"], 8)
    assert extra == 5 and px.shape[0] == pt.shape[0] == ptext.shape[0] == len(tags) == 8 and tags[3:] == ["a"] * 5
    assert torch.equal(px[:3], x) and torch.equal(px[3:], x[:1].expand(5, 4, 2))
    assert torch.equal(pt[3:], t[:1].expand(5)) and torch.equal(ptext[3:], text[:1].expand(5, 5, 6))
    assert pad_rows(x, t, text, [1, 2, 3], 3)[4] == 0 and pad_rows(x, t, text, [1, 2, 3], None)[4] == 0
    with pytest.raises(ValueError):
        pad_rows(x, t, text, [1, 2, 3], 2)


@pytest.mark.parametrize("argv, bucket", [
    ([], None),                                                             # memory store: auto is off
    (["--state-store", "redis://127.0.0.1:1/0"], 4),                       # durable checkpoints: on
    (["--state-store", "redis://127.0.0.1:1/0", "--checkpoint-every", "0"], None),
    (["--state-store", "redis://127.0.0.1:1/0", "--batch-invariant", "off"], None),
    (["--batch-invariant", "on"], 4),
    (["--batch-invariant", "on", "--no-batching"], 1),
])
def test_scheduler_flag_resolves(argv, bucket):
    from services.scheduler.config import parse_args
    cfg = parse_args(["--pools", "encoder=h:1", "--pools", "denoiser=h:2", "--pools", "decoder=h:3", *argv])
    assert cfg.batch_bucket(4) == bucket


def test_scheduler_flag_refuses_other_values(tmp_path):
    from fastvideo3.errors import InvalidRequest
    from services.scheduler.config import parse_args
    path = tmp_path / "fleet.yaml"
    path.write_text("pools: {encoder: h:1, denoiser: h:2, decoder: h:3}\nscheduler: {batch_invariant: maybe}\n")
    with pytest.raises(InvalidRequest, match="batch_invariant"):
        parse_args(["--config", str(path)])
    path.write_text("pools: {encoder: h:1, denoiser: h:2, decoder: h:3}\nscheduler: {batch_invariant: true}\n")
    assert parse_args(["--config", str(path)]).batch_invariant == "on"
