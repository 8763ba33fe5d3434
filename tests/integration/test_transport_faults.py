"""The shared fault checks (transport.testing.fault_suite) against real owner processes, for
NIXL with UCX error handling "none" (shared-memory transports admitted; a dead peer must still be
noticed by the transfer failing or by the deadline, never a hang or stale data)."""
from __future__ import annotations

import pytest

from fastvideo3.transport import available_backends, make_transport
from fastvideo3.transport.testing import fault_suite

pytestmark = pytest.mark.skipif("nixl" not in available_backends(), reason="nixl is not installed")


@pytest.mark.timeout(240)
def test_nixl_without_peer_error_handling_passes_the_fault_suite():
    cfg = {"ucx_error_handling": "none"}
    reader = make_transport("nixl", owner="reader", **cfg)
    try:
        results = fault_suite("nixl", cfg, reader)
    finally:
        reader.close()
    failed = {k: v["detail"] for k, v in results.items() if not v["ok"]}
    assert not failed, failed
    assert "DataLoss" in results["checksum_mismatch"]["detail"]
    assert reader.stats()["ucx"]["ucx_error_handling_mode"] == "none"
