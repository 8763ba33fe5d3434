"""The device fsum64 (one Triton kernel, optionally fused with the copy) gives the host digest.

On a CPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, in a child process
started by test_device_checksum_interpreter.py); on a GPU the same test runs the compiled kernel.
"""
from __future__ import annotations

import os

import pytest
import torch

# Triton runs here on a GPU, or on a CPU under its interpreter; the interpreter is chosen by an
# environment variable read when kernels are built, so on a CPU this file runs in a child process
# with it set (test_device_checksum_interpreter.py) and the variable never leaks into other tests.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not (INTERPRET or torch.cuda.is_available()),
                                reason="needs a GPU, or the Triton interpreter: on a CPU "
                                       "test_device_checksum_interpreter.py runs this file in a child process")

pytest.importorskip("triton")

from fastvideo3.transport import checksum, device_checksum  # noqa: E402

DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
SIZES = [0, 1, 3, 4, 5, 7, 64, 4096 + 3, device_checksum.BLOCK_WORDS * 4,
         device_checksum.BLOCK_WORDS * 4 * 3 + 6, 100_003]


def _bytes(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    data[: min(n, 16)] = 0xFF  # all-ones words: the unsigned, wrap-around path
    return data


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", SIZES)
def test_device_digest_equals_host_digest(n):
    assert device_checksum.available(DEVICE)
    data = _bytes(n, n)
    host = checksum.fsum64_torch(data)
    assert device_checksum.fsum64(data.to(DEVICE)) == host


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [0, 5, device_checksum.BLOCK_WORDS * 4 + 1, 50_001])
def test_fused_copy_copies_and_sums(n):
    src = _bytes(n, 7 + n).to(DEVICE)
    dst = torch.zeros_like(src)
    assert device_checksum.copy_and_fsum64(dst, src) == checksum.fsum64_torch(src.cpu())
    assert torch.equal(dst, src)


@pytest.mark.timeout(120)
def test_digest_sees_a_single_flipped_bit_and_a_swap():
    data = _bytes(8192, 3).to(DEVICE)
    base = device_checksum.fsum64(data)
    flipped = data.clone()
    flipped[5000] ^= 1
    assert device_checksum.fsum64(flipped) != base
    swapped = data.clone()
    swapped[0:4], swapped[4:8] = data[4:8].clone(), data[0:4].clone()  # same words, other order
    if not torch.equal(swapped, data):
        assert device_checksum.fsum64(swapped) != base


@pytest.mark.timeout(120)
def test_misaligned_views_fall_back_without_copying():
    data = _bytes(1001, 9).to(DEVICE)
    view = data[1:]  # not 4-byte aligned: the kernel declines, the torch path answers
    assert device_checksum.fsum64(view) is None
    assert device_checksum.copy_and_fsum64(torch.zeros_like(view), view) is None
    assert checksum.compute(view, "fsum64") == "fsum64:" + checksum.fsum64_torch(view.cpu())


@pytest.mark.timeout(120)
def test_large_grids_reduce_on_the_device_to_the_same_digest(monkeypatch):
    data = _bytes(device_checksum.BLOCK_WORDS * 4 * 5 + 2, 11)
    host = checksum.fsum64_torch(data)
    monkeypatch.setattr(device_checksum, "_HOST_REDUCE_MAX_PROGRAMS", 1)  # 6 programs: device path
    assert device_checksum.fsum64(data.to(DEVICE)) == host


class _FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on a CPU: capture records the launch, replay runs it."""

    def __init__(self):
        self.launch = None

    def replay(self):
        self.launch()


@pytest.mark.timeout(120)
def test_repeated_keys_run_from_a_captured_graph_and_failures_fall_back(monkeypatch):
    import contextlib

    real_run = device_checksum._run_kernel
    captures = []

    @contextlib.contextmanager
    def fake_graph(graph, capture_error_mode="global"):
        assert capture_error_mode == "thread_local"
        def record(*args):
            graph.launch = lambda: real_run(*args)
        monkeypatch.setattr(device_checksum, "_run_kernel", record)
        try:
            yield
        finally:
            monkeypatch.setattr(device_checksum, "_run_kernel", real_run)
            captures.append(graph)

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: type("S", (), {"synchronize": lambda s: None})())
    cache = device_checksum._GraphCache()
    src = _bytes(device_checksum.BLOCK_WORDS * 4 * 3, 5)
    dst = torch.zeros_like(src)
    want = checksum.fsum64_torch(src)
    n4, grid = src.numel(), 3
    assert cache.run(src, dst, n4, grid, b"") is None  # first sighting: plain launch
    for _ in range(3):  # then captured once (and checked against a plain launch), replayed after
        dst.zero_()
        assert cache.run(src, dst, n4, grid, b"") == want and torch.equal(dst, src)
    assert (cache.captures, cache.replays, len(captures), cache.checked) == (1, 3, 1, True)
    other = _bytes(4096, 6)  # another key: its own entry
    assert cache.run(other, None, 4096, 1, b"") is None
    assert cache.run(other, None, 4096, 1, b"") == checksum.fsum64_torch(other)

    def broken(self):
        raise RuntimeError("graph launch failed")

    monkeypatch.setattr(_FakeGraph, "replay", broken)
    assert cache.run(src, dst, n4, grid, b"") is None and not cache.enabled  # off for good
    assert device_checksum.copy_and_fsum64(torch.zeros_like(src), src) == want  # plain path still answers


@pytest.mark.timeout(120)
@pytest.mark.parametrize("settings", [{"variant": "block"}, {"variant": "loop", "block": 256, "programs_per_sm": 1},
                                      {"variant": "atomic", "block": 256}, {"variant": "atomic", "pinned": False},
                                      {"variant": "loop", "block": 2048, "pinned": False}])
def test_every_kernel_setting_gives_the_host_digest(settings):
    saved = device_checksum.CONFIG
    try:
        device_checksum.configure(**settings)
        for n in (5, 256 * 4 * 7 + 3, device_checksum.BLOCK_WORDS * 4 * 2 + 1):
            data = _bytes(n, n)
            dst = torch.zeros(n, dtype=torch.uint8, device=DEVICE)
            assert device_checksum.fsum64(data.to(DEVICE)) == checksum.fsum64_torch(data)
            assert device_checksum.copy_and_fsum64(dst, data.to(DEVICE)) == checksum.fsum64_torch(data)
            assert torch.equal(dst.cpu(), data)
    finally:
        device_checksum.CONFIG = saved


def test_unknown_kernel_variant_is_refused():
    with pytest.raises(ValueError, match="one of atomic, loop, block"):
        device_checksum.KernelConfig(variant="fast")
