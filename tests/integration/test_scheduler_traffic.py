"""The scheduler moves references, never tensors: its own gRPC traffic per request (WorkUnits
out, StepResults in, the encoded artifact aside) is a small fraction of the tensors the pools
moved to each other for that request."""

import grpc
import pytest

from fastvideo3.client import FleetClient
from fastvideo3.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.fleet_fixture import fleet_fixture

pytestmark = pytest.mark.timeout(400)
fleet = fleet_fixture(scope="module", roles=("encoder", "denoiser", "decoder"))


def _remote_counters(target):
    with grpc.insecure_channel(target) as ch:
        d = scheduler_pb2_grpc.SchedulerStub(ch).Describe(scheduler_pb2.DescribeSchedulerRequest(), timeout=30)
    tot = {"bytes_sent": 0, "bytes_received": 0, "artifact_bytes": 0}
    for pool in d.pools:
        for k in tot:
            tot[k] += pool.remote_counters.get(k, 0)
    return tot


def test_scheduler_traffic_is_much_smaller_than_the_tensors_it_routes(fleet):
    frames, h, w, steps = 33, 256, 256, 4
    before = _remote_counters(fleet.target)
    with FleetClient(fleet.target) as c:
        video = c.generate("a red circle moving left", num_frames=frames, height=h, width=w,
                           num_inference_steps=steps, seed=0, output_format="npy")
    after = _remote_counters(fleet.target)
    control = (after["bytes_sent"] - before["bytes_sent"]) + (after["bytes_received"] - before["bytes_received"])
    latent_bytes = 16 * ((frames - 1) // 4 + 1) * (h // 8) * (w // 8) * 4
    frames_bytes = frames * h * w * 3 * 4
    assert control > 0 and after["artifact_bytes"] > before["artifact_bytes"]
    # latents (and the decoded frames) went pool to pool; the scheduler saw only references
    assert control < 0.1 * latent_bytes, (control, latent_bytes)
    assert control < 0.01 * frames_bytes
    import io

    import numpy as np
    assert np.load(io.BytesIO(video.data)).shape == (frames, h, w, 3)
