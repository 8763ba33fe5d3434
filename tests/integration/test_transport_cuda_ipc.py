"""The cuda_ipc backend across real processes: its fault checks, its mapping cache.

Without a GPU the backend runs on its host device layer (slabs in host shared memory behind the
same generation table, liveness lock, mapping cache and checks); with a GPU the same checks also
run on the CUDA layer. The GPU benchmark (bench/transport.py --device cuda) runs them too.
"""
from __future__ import annotations

import pytest
import torch

from fastvideo3.errors import NotFound
from fastvideo3.transport import make_transport
from fastvideo3.transport.testing import OwnerProcess, fault_suite

LAYERS = ["host"] + (["cuda"] if torch.cuda.is_available() else [])


def _device(layer: str) -> str:
    return "cuda" if layer == "cuda" else "cpu"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layer", LAYERS)
def test_fault_suite(layer):
    reader = make_transport("cuda_ipc", owner="reader", layer=layer)
    try:
        results = fault_suite("cuda_ipc", {"layer": layer}, reader, device=_device(layer))
    finally:
        reader.close()
    failed = {k: v["detail"] for k, v in results.items() if not v["ok"]}
    assert not failed, failed
    assert set(results) == {"round_trip", "stale_buffer", "reused_slab", "checksum_mismatch", "deadline",
                            "hung_owner", "dead_owner"}
    assert "DataLoss" in results["checksum_mismatch"]["detail"]
    assert "Unavailable" in results["dead_owner"]["detail"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layer", LAYERS)
def test_mapping_is_opened_once_per_slab_and_dropped_with_it(layer):
    device = _device(layer)
    # max_cached_bytes=0: a released slab is destroyed at once, so the next buffer gets a new one
    owner = OwnerProcess("cuda_ipc", {"layer": layer, "max_cached_bytes": 0})
    reader = make_transport("cuda_ipc", owner="reader", layer=layer)
    try:
        a = owner.publish("keep", "a", torch.randn(1000), device)  # holds slab 1 for the whole test
        for i in range(3):
            x = torch.randn(1000)
            assert torch.equal(reader.fetch(a, deadline_s=20).cpu(), reader.fetch(a, deadline_s=20).cpu())
            ref = owner.publish(f"r{i}", "x", x, device)
            assert torch.equal(reader.fetch(ref, deadline_s=20, copy=True).cpu(), x)
            owner.call("release", f"r{i}")
            with pytest.raises(NotFound):  # its slab was destroyed: the mapping goes too
                reader.fetch(ref, deadline_s=20)
        stats = reader.stats()
        assert stats["maps_opened"] == 1 + 3  # slab of "a" once, then one per destroyed slab
        assert stats["maps_dropped"] == 3 and stats["mapped_slabs"] == 1
    finally:
        reader.close()
        owner.stop()
