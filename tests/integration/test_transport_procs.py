"""Transport backends across real processes: an owner process publishes, this process fetches.

The owner runs in a ``spawn``ed process driven over a Pipe (fastvideo3.transport.testing's
OwnerProcess: every wait is a pipe poll with a timeout, never a sleep). Hung peers are made
real with SIGSTOP; dead ones with SIGKILL.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
import torch

from fastvideo3.errors import DataLoss, DeadlineExceeded, NotFound, Unavailable
from fastvideo3.transport import TensorRef, available_backends, make_transport
from fastvideo3.transport.testing import OwnerProcess

CROSS_PROCESS = [b for b in ("shm", "grpc", "nixl") if b in available_backends()]
OWNER_CFG = {"shm": {}, "grpc": {"listen": "127.0.0.1:0"}, "nixl": {}}
READY_TIMEOUT_S = 45.0  # spawning + importing torch on a busy 2-core host

TENSORS = {
    "f32_2d": torch.randn(5, 7),
    "f32_4d": torch.randn(2, 3, 4, 5),
    "bf16": torch.randn(33, 9).to(torch.bfloat16),
    "i64": torch.arange(-50, 50, dtype=torch.int64).reshape(4, 25),
    "scalar": torch.tensor(3.25),
    "empty": torch.empty(0, 4),
    "f32_1mib_plus": torch.randn(262_145),  # crosses the 1 MiB gRPC chunk boundary
}


@contextlib.contextmanager
def _owner_and_reader(backend: str):
    """A spawned owner process of ``backend`` and a reader transport in this process."""
    owner = OwnerProcess(backend, OWNER_CFG[backend], ready_timeout_s=READY_TIMEOUT_S)
    reader = make_transport(backend, owner="reader")
    try:
        yield owner, reader
    finally:
        reader.close()
        owner.stop()


@pytest.fixture(scope="module", params=CROSS_PROCESS)
def shared(request):
    """(owner process, reader transport) shared by this module's non-destructive tests: one
    spawn per backend keeps the suite fast on a small, busy host."""
    with _owner_and_reader(request.param) as pair:
        yield pair


@pytest.fixture(params=CROSS_PROCESS)
def fresh(request):
    """A private (owner, reader) for tests that stop, kill or close the owner."""
    with _owner_and_reader(request.param) as pair:
        yield pair


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["view", "copy", "out"])
def test_fetch_equals_published(shared, mode):
    owner, reader = shared
    before = reader.stats()["fetches"]
    for name, tensor in TENSORS.items():
        ref = owner.publish("req-1", name, tensor)
        assert ref.shape == tuple(tensor.shape) and ref.nbytes == tensor.numel() * tensor.element_size()
        out = torch.empty_like(tensor) if mode == "out" else None
        got = reader.fetch(ref, deadline_s=20, copy=mode == "copy", out=out)
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got, tensor), name
        assert out is None or got is out
    assert reader.stats()["fetches"] - before == len(TENSORS)
    owner.call("release", "req-1")


@pytest.mark.timeout(60)
def test_corruption_is_data_loss(shared):
    owner, reader = shared
    before = reader.stats()
    ref = owner.publish("req-c", "latent", torch.randn(64, 64))
    owner.call("corrupt", ref.to_dict())
    with pytest.raises(DataLoss):
        reader.fetch(ref, deadline_s=20)
    stats = reader.stats()
    assert stats["checksum_failures"] - before["checksum_failures"] == 1
    assert stats["fetches"] == before["fetches"]
    owner.call("release", "req-c")


@pytest.mark.timeout(60)
def test_release_counts_and_forgets(shared):
    owner, reader = shared
    base = owner.call("stats")
    assert base["resident_buffers"] == 0  # earlier tests released what they published
    refs = [owner.publish("req-a", f"t{i}", torch.randn(1000 * (i + 1))) for i in range(3)]
    refs += [owner.publish("req-b", "t", torch.randn(10))]
    stats = owner.call("stats")
    assert stats["buffers_created"] - base["buffers_created"] == 4 and stats["resident_buffers"] == 4
    assert owner.call("release", "req-a") == 3
    assert owner.call("release", "req-a") == 0  # idempotent
    assert torch.equal(reader.fetch(refs[3], deadline_s=20), reader.fetch(refs[3], deadline_s=20))
    with pytest.raises((NotFound, Unavailable)):
        reader.fetch(refs[0], deadline_s=20)
    assert owner.call("release", "req-b") == 1
    stats = owner.call("stats")
    assert stats["buffers_created"] == stats["buffers_released"]
    assert stats["resident_buffers"] == 0 and stats["resident_bytes"] == 0
    # a slab is reused for the next request: no new slab for a buffer that fits
    before = owner.call("stats")["slabs_created"]
    owner.publish("req-d", "t", torch.randn(1000))
    assert owner.call("stats")["slabs_created"] == before
    owner.call("release", "req-d")


@pytest.mark.timeout(60)
def test_owner_close_releases_everything(fresh):
    owner, reader = fresh
    ref = owner.publish("req-x", "t", torch.randn(4096))
    stats = owner.call("close")
    assert stats["buffers_created"] == stats["buffers_released"] == 1
    assert stats["resident_bytes"] == 0 and stats["slab_bytes"] == 0
    with pytest.raises((NotFound, Unavailable, DeadlineExceeded)):
        reader.fetch(ref, deadline_s=3)


@pytest.mark.timeout(60)
def test_hung_owner_hits_deadline(fresh):
    owner, reader = fresh
    tensor = torch.randn(1 << 20)
    ref = owner.publish("req-h", "t", tensor)
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        if reader.backend == "shm":
            # shm reads never involve the owner: a hung owner cannot stall them.
            assert torch.equal(reader.fetch(ref, deadline_s=1.5, copy=True), tensor)
            return
        with pytest.raises((DeadlineExceeded, Unavailable)):
            reader.fetch(ref, deadline_s=1.5)
        assert time.monotonic() - start < 1.5 + 2.0
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    assert reader.stats()["fetch_errors"] == 1


@pytest.mark.timeout(60)
def test_dead_owner_is_unavailable(fresh):
    owner, reader = fresh
    ref = owner.publish("req-k", "t", torch.randn(1 << 16))
    if reader.backend == "shm":
        # A killed owner's segments outlive it until its resource tracker unlinks them; a
        # segment that is gone is what the reader sees afterwards.
        ref = TensorRef.from_dict({**ref.to_dict(), "descriptor": {"segment": "fv3-gone-0", "generation": 1}})
    os.kill(owner.pid, signal.SIGKILL)
    owner.proc.join(10)
    start = time.monotonic()
    with pytest.raises((Unavailable, DeadlineExceeded)):
        reader.fetch(ref, deadline_s=3)
    assert time.monotonic() - start < 3 + 2.0
