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


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layer", LAYERS)
def test_a_view_pins_its_slab_until_the_last_tensor_sharing_it_is_gone(layer):
    import gc

    device = _device(layer)
    owner = OwnerProcess("cuda_ipc", {"layer": layer})
    reader = make_transport("cuda_ipc", owner="reader", layer=layer)
    try:
        a = torch.randn(4096)
        ref_a = owner.publish("a", "x", a, device)
        view = reader.fetch(ref_a, deadline_s=20)  # zero-copy, pinned
        part = view[10:20]  # a derived view keeps the pin too
        del view
        gc.collect()
        assert reader.stats()["live_pins"] == 1
        owner.call("release", "a")
        ref_b = owner.publish("b", "x", torch.randn(4096), device)  # same size class
        assert ref_b.descriptor["epoch"] != ref_a.descriptor["epoch"]  # the pinned slab was not reused
        assert owner.call("stats")["slabs_created"] == 2
        assert torch.equal(part.cpu(), a[10:20])  # the view still shows what was published
        with pytest.raises(NotFound):  # but the released ref can no longer be fetched
            reader.fetch(ref_a, deadline_s=20)
        owner.call("release", "b")
        ref_c = owner.publish("c", "x", torch.randn(4096), device)
        assert ref_c.descriptor["epoch"] == ref_b.descriptor["epoch"]  # b's slab was free to reuse
        del part
        gc.collect()
        assert reader.stats()["live_pins"] == 0
        ref_d = owner.publish("d", "x", torch.randn(4096), device)  # the unpinned slab serves again
        assert ref_d.descriptor["epoch"] == ref_a.descriptor["epoch"]
        assert owner.call("stats")["slabs_created"] == 2
        owner.call("release", "c")
        owner.call("release", "d")
    finally:
        reader.close()
        owner.stop()
