"""NIXL reports which UCX transports it selected (what a pool shows in Describe).

Runs in a child interpreter: asking UCX for its protocol report sets process-wide UCX variables,
which must not leak into other tests' agents.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fastvideo3.transport import available_backends

pytestmark = pytest.mark.skipif("nixl" not in available_backends(), reason="nixl is not installed")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r"""
import json, sys, torch
from fastvideo3.transport.testing import OwnerProcess
from services.common.transport_set import TransportSet

if __name__ == "__main__":
    pool = TransportSet("reader", ("shm",), ucx_report_dir=sys.argv[1])  # nixl reader built on demand
    owner = OwnerProcess("nixl", {"ucx_error_handling": "none"})
    try:
        x = torch.randn(1 << 16)
        ref = owner.publish("r", "x", x)
        assert torch.equal(pool.fetch(ref, deadline_s=30), x)
        nixl = pool.stats()["backends"]["nixl"]
        print(json.dumps({"ucx": nixl["ucx"], "ucx_transports": nixl["ucx_transports"]}))
    finally:
        pool.close()
        owner.stop()
"""


@pytest.mark.timeout(180)
def test_nixl_stats_name_the_ucx_transports_used(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ucx")], cwd=ROOT, capture_output=True,
                          text=True, timeout=170, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # without a GPU the bytes move over host transports (shared memory, CMA or TCP)
    assert report["ucx_transports"], report
    assert set(report["ucx_transports"]) <= {"tcp", "posix", "sysv", "cma", "self", "cuda_copy", "cuda_ipc",
                                             "rc_mlx5", "dc_mlx5", "ud_mlx5", "rc_verbs", "ud_verbs",
                                             "knem", "xpmem", "gdr_copy"}, report
    assert report["ucx"]["ucx_error_handling_mode"] == "peer"  # the reader's: NIXL's default
