"""A Wan2.2 two-expert request served end to end by a fleet with one denoiser pool per expert:
the scheduler routes each step to the pool holding the expert the loop names, the latent and the
sampler history move from the high-noise pool to the low-noise pool at the switch, and the frames
match diffusers' two-expert WanPipeline."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from fastvideo3.client import FleetClient
from fastvideo3.errors import InvalidRequest
from fleet.launcher import LocalFleet
from tests.fleet_fixture import pool_describe, running
from tests.helpers_moe import OPTS, PROMPT, moe_dir  # noqa: F401 - moe_dir: the module fixture

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def fleet(moe_dir, tmp_path_factory):
    f = LocalFleet(str(moe_dir), roles=("encoder", "denoiser", "decoder"),
                   denoiser_experts=("transformer", "transformer_2"), log_dir=tmp_path_factory.mktemp("fleet-logs"))
    with running(f) as started:
        yield started


def _pool(target: str) -> tuple[float, list[str]]:
    d = pool_describe(target)
    return d.counters["forwards"], list(d.executor.experts)


def test_two_expert_request_with_one_pool_per_expert(fleet, moe_dir):
    from diffusers import WanPipeline
    assert set(fleet.pools) == {"encoder", "denoiser:transformer", "denoiser:transformer_2", "decoder"}
    pipe = WanPipeline.from_pretrained(str(moe_dir))
    want = pipe(prompt=PROMPT, negative_prompt="blurry", guidance_scale=5.0, guidance_scale_2=2.0, **OPTS,
                generator=torch.Generator().manual_seed(3), output_type="np").frames[0]
    with FleetClient(fleet.target, timeout_s=300) as c:
        video = c.generate(PROMPT, negative_prompt="blurry", guidance_scale=5.0, guidance_scale_2=2.0, seed=3,
                           output_format="npy", **OPTS)
        frames = video.frames
        with pytest.raises(InvalidRequest) as e:  # validated at the edge, naming the field
            c.generate(PROMPT, guidance_scale_2=-1.0, output_format="npy", **OPTS)
        assert e.value.field == "guidance_scale_2"
    assert frames.shape == want.shape
    assert float(np.abs(frames - np.clip(want, 0, 1)).max()) <= 1e-3
    # 999, 937 >= 875 ran on the high-noise pool; the four later steps on the low-noise one
    assert _pool(fleet.pools["denoiser:transformer"][0].target) == (2, ["transformer"])
    assert _pool(fleet.pools["denoiser:transformer_2"][0].target) == (4, ["transformer_2"])
    for key in ("denoiser:transformer", "denoiser:transformer_2"):  # nothing left resident
        assert pool_describe(fleet.pools[key][0].target).resident_buffers == 0


def test_scheduler_takes_one_pool_set_per_expert():
    from services.scheduler.config import parse_args
    cfg = parse_args(["--port", "0", "--card", "wan2.2-t2v-a14b", "--pools", "encoder=h:1",
                      "--pools", "denoiser:transformer=h:2", "--pools", "denoiser:transformer_2=h:3,h:4",
                      "--pools", "decoder=h:5"])
    assert cfg.pools == {"encoder": ("h:1",), "denoiser:transformer": ("h:2",),
                         "denoiser:transformer_2": ("h:3", "h:4"), "decoder": ("h:5",)}
    for bad in ("encoder:transformer=h:1", "denoiser:=h:1", "denoiser:a-b=h:1"):
        with pytest.raises(InvalidRequest) as e:
            parse_args(["--port", "0", "--pools", bad])
        assert e.value.field == "pools"


def test_serve_expert_pools_needs_a_two_expert_card():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "fastvideo3.cli", "serve", "--card", "wan-tiny", "--expert-pools"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "expert_pools" in r.stderr and "one denoising expert" in r.stderr
