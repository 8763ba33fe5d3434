"""The synthetic Wan2.2 A14B-layout MoE checkpoint (two experts, boundary 0.875) and the small
request the MoE tests run against it, in-process and through the fleet."""
from __future__ import annotations

import pytest

OPTS = dict(num_frames=9, height=32, width=48, num_inference_steps=6)
PROMPT = "a red circle moving left on a white background"


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from fastvideo3.testing.synthetic_layouts import build_wan22_moe_dir
    return build_wan22_moe_dir(tmp_path_factory.mktemp("moe") / "wan22", seed=2, boundary_ratio=0.875)
