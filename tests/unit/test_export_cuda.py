"""GraphRunner and the export contract on a real CUDA device. Skipped where CUDA is absent."""
from __future__ import annotations

import pytest
import torch

from fastvideo3.export import (
    BucketNotPrepared,
    Direction,
    GraphRunner,
    PortSpec,
    RuntimeBuilder,
    UpdateClass,
    Verbs,
    detect_device_arch,
    pack_regions,
    restore,
    snapshot,
)
from tests.helpers_export import counting

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _forward(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x @ x.transpose(-1, -2) * t).sum(-1)


@pytest.mark.timeout(60)
def test_cuda_capture_per_bucket_and_replay_without_recapture():
    fn, calls = counting(_forward)

    runner = GraphRunner("dit", warmup_iters=2)
    dev = torch.device("cuda")
    statics = {
        "small": {"x": torch.zeros(2, 8, 16, device=dev), "t": torch.zeros(2, 1, 1, device=dev)},
        "large": {"x": torch.zeros(4, 32, 16, device=dev), "t": torch.zeros(4, 1, 1, device=dev)},
    }
    outs = {k: runner.prepare(k, fn, v) for k, v in statics.items()}
    assert all(runner.is_captured(k) for k in statics)
    captured_calls = len(calls)
    assert captured_calls == 2 * (2 + 1)  # warm-ups + one capture per bucket

    g = torch.Generator(device=dev).manual_seed(0)
    for round_ in range(3):
        for key in ("large", "small"):  # interleave buckets that share one graph pool
            shape = statics[key]["x"].shape
            x = torch.randn(shape, device=dev, generator=g)
            t = torch.rand((shape[0], 1, 1), device=dev, generator=g)
            statics[key]["x"].copy_(x)  # the static inputs are what the graph reads
            statics[key]["t"].copy_(t)
            out = runner.replay(key)
            assert out is outs[key]
            torch.testing.assert_close(out, _forward(x, t))
    assert len(calls) == captured_calls  # replays ran the graphs, never fn
    with pytest.raises(BucketNotPrepared):
        runner.replay("medium")
    runner.release()


@pytest.mark.timeout(60)
def test_cuda_runtime_swap_ports_feed_captured_graph_and_snapshot_regions():
    dev = torch.device("cuda")
    runner = GraphRunner("dit")
    x_buf = torch.zeros(64, device=dev)
    t_buf = torch.zeros(1, device=dev)
    results = {}

    def prepare(bucket):
        n = {"a": 32, "b": 64}[bucket]
        x = x_buf[:n].view(-1, 8)
        results[bucket] = runner.prepare(bucket, lambda x, t: (x * t).cumsum(-1), {"x": x, "t": t_buf})

    b = RuntimeBuilder(weights_digest="sha256:cuda", precision="fp32")
    assert detect_device_arch().startswith("cuda:sm_")
    b.add_graph("dit", runner).add_buffer("x", x_buf).add_buffer("t", t_buf)
    b.set_regions(pack_regions([("x", torch.float32, (64,))]))
    b.add_port(PortSpec("x", Direction.IN, "float32", buckets={"a": (32,), "b": (64,)},
                        update=UpdateClass.SWAP, buffer="x"))
    b.add_port(PortSpec("t", Direction.IN, "float32", shape=(1,), update=UpdateClass.SWAP, buffer="t"))
    b.set_verbs(Verbs(prepare=prepare)).add_stage("dit")
    rt = b.finish()
    for bucket, n in (("a", 32), ("b", 64), ("a", 32)):
        rt.prepare(bucket)
        x = torch.randn(n, device=dev)
        rt.set_input("x", x)
        rt.set_input("t", torch.tensor([0.5], device=dev))
        rt.step()
        torch.testing.assert_close(results[bucket], (x.view(-1, 8) * 0.5).cumsum(-1))

    snap = snapshot({"x": x_buf}, rt)
    expected = x_buf.clone()
    x_buf.zero_()
    restore(snap, rt, into={"x": x_buf})
    assert x_buf.is_cuda and torch.equal(x_buf, expected)
    rt.release()
    assert runner.buckets == ("a", "b")  # the owner (none here) frees; the runner is the producer's
