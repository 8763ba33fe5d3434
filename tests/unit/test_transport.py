"""Transport plane, in one process: TensorRef, checksums, slabs, backend choice, and each
backend's owner/reader contract (cross-process behavior lives in tests/integration)."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import torch

from fastvideo3.errors import (
    DataLoss, DeadlineExceeded, FailedPrecondition, InvalidRequest, NotFound, Unavailable,
)
from fastvideo3.transport import (
    TensorRef, Transport, TransportCaps, available_backends, choose_backend, local_caps,
    make_transport, register_backend,
)
from fastvideo3.transport import checksum
from fastvideo3.transport.inproc import InprocHub, InprocTransport
from fastvideo3.transport.slab import SlabPool, size_class
from fastvideo3.transport.testing import corrupt

pytestmark = pytest.mark.timeout(60)

SAMPLES = [
    torch.randn(3, 4),
    torch.randn(2, 3, 5).to(torch.bfloat16),
    torch.arange(-7, 8, dtype=torch.int64),
    torch.tensor(1.5),
    torch.empty(0, 3),
    torch.tensor([True, False, True]),
]


def _ref(**over):
    base = dict(owner="enc", buffer_id="r/x#0", dtype="float32", shape=(2, 3), nbytes=24,
                checksum="crc32:00000000", backend="shm", descriptor={"segment": "s", "generation": 1})
    base.update(over)
    return TensorRef(**base)


# ----------------------------------------------------------------------------- TensorRef

def test_ref_roundtrips_through_json():
    ref = _ref().validate()
    back = TensorRef.from_dict(json.loads(json.dumps(ref.to_dict())))
    assert back == ref and hash(back) == hash(ref)


@pytest.mark.parametrize(("over", "field"), [
    ({"nbytes": 20}, "nbytes"),
    ({"shape": (2, -3), "nbytes": 0}, "shape"),
    ({"dtype": "float13"}, "dtype"),
    ({"owner": ""}, "owner"),
    ({"checksum": "nocolon"}, "checksum"),
    ({"descriptor": {"k": 1.5}}, "descriptor"),
    ({"shape": (2, 3.0)}, "shape"),
])
def test_ref_validation_names_the_field(over, field):
    with pytest.raises(InvalidRequest) as err:
        _ref(**over).validate()
    assert err.value.field == field


def test_ref_from_dict_names_missing_field():
    data = _ref().to_dict()
    del data["dtype"]
    with pytest.raises(InvalidRequest) as err:
        TensorRef.from_dict(data)
    assert err.value.field == "dtype"


def test_ref_zero_d_and_empty_sizes():
    assert _ref(shape=(), nbytes=4).validate().numel == 1
    assert _ref(shape=(0, 5), nbytes=0, dtype="bfloat16").validate().numel == 0


# ----------------------------------------------------------------------------- checksums

@pytest.mark.parametrize("algo", ["crc32", "fsum64"] + (["xxh3_64"] if checksum._xxhash else []))
def test_checksum_detects_one_flipped_bit(algo):
    t = torch.randn(1001)
    digest = checksum.compute(t, algo)
    assert digest.startswith(algo + ":") and digest == checksum.compute(t.clone(), algo)
    u = t.clone()
    u.view(torch.uint8)[4001] ^= 1
    with pytest.raises(DataLoss):
        checksum.verify(u, digest)


def test_fsum64_matches_its_definition():
    data = bytes(range(1, 11))  # 10 bytes: two words and a 2-byte tail
    words = [int.from_bytes(data[i:i + 4].ljust(4, b"\0"), "little") for i in range(0, 10, 4)]
    s1 = sum(words) % 2**64
    s2 = sum((i + 1) * w for i, w in enumerate(words)) % 2**64
    got = checksum.compute(torch.tensor(list(data), dtype=torch.uint8), "fsum64")
    assert got == f"fsum64:{s1:016x}{s2:016x}"


def test_checksum_auto_and_unknown():
    assert checksum.pick_algorithm("auto", torch.device("cpu")) == checksum.host_algorithm()
    assert checksum.pick_algorithm("auto", torch.device("cuda", 0)) == "fsum64"
    with pytest.raises(FailedPrecondition):
        checksum.pick_algorithm("md5", torch.device("cpu"))


# ----------------------------------------------------------------------------- slabs

def test_size_classes_waste_at_most_a_quarter():
    for n in [1, 65_536, 65_537, 1_000_000, 3 << 20, (64 << 20) + 1]:
        cap = size_class(n)
        assert cap >= n and (n < 65_536 or cap <= n * 1.25 + 4096)


def test_slab_pool_reuses_and_evicts():
    made, destroyed = [], []
    pool = SlabPool(lambda cap: made.append(cap) or bytearray(cap), destroyed.append,
                    max_cached_bytes=5 << 20)
    a = pool.acquire(1 << 20)
    pool.give_back(a)
    b = pool.acquire((1 << 20) - 100)
    assert b is a and len(made) == 1
    c = pool.acquire(2 << 20)
    pool.give_back(b)
    pool.give_back(c)  # 3 MiB free, under the limit: nothing evicted
    assert not destroyed
    d = pool.acquire(4 << 20)
    pool.give_back(d)  # now 7 MiB free: the oldest go first, until under the limit
    assert len(destroyed) == 2 and pool.stats()["slab_bytes_free"] == 4 << 20
    assert pool.acquire(4 << 20) is d
    pool.give_back(d)
    pool.clear()
    assert pool.stats()["slab_bytes"] == 0 and pool.created == pool.destroyed


# ----------------------------------------------------------------------------- choosing

def _caps(backends, host="h1", proc="p1"):
    return TransportCaps(tuple(backends), host, proc)


def test_choose_backend_preference_order():
    everything = ("inproc", "shm", "grpc", "nixl")
    assert choose_backend(_caps(everything), _caps(everything)) == "inproc"
    # one host, host tensors: shared memory; across hosts: NIXL; else gRPC
    assert choose_backend(_caps(everything), _caps(everything, proc="p2")) == "shm"
    assert choose_backend(_caps(everything), _caps(everything, host="h2", proc="p2")) == "nixl"
    assert choose_backend(_caps(("shm", "grpc")), _caps(everything, proc="p2")) == "shm"
    assert choose_backend(_caps(everything), _caps(("shm", "grpc"), host="h2", proc="p2")) == "grpc"
    assert choose_backend(_caps(everything), _caps(everything, proc="p2"), order=("nixl", "shm")) == "nixl"


def test_choose_backend_cuda_ipc_needs_gpus_on_one_host():
    gpu = ("inproc", "cuda_ipc", "shm", "grpc", "nixl")
    cpu = ("inproc", "shm", "grpc", "nixl")
    assert choose_backend(_caps(gpu), _caps(gpu, proc="p2")) == "cuda_ipc"
    assert choose_backend(_caps(gpu), _caps(gpu, host="h2", proc="p2")) == "nixl"  # other host
    assert choose_backend(_caps(gpu), _caps(cpu, proc="p2")) == "shm"  # a CPU peer offers no cuda_ipc
    with pytest.raises(FailedPrecondition):
        choose_backend(_caps(gpu), _caps(gpu, host="h2", proc="p2"), preferred="cuda_ipc")


def test_choose_backend_override_and_failures():
    everything = ("inproc", "shm", "grpc", "nixl")
    far = _caps(everything, host="h2", proc="p2")
    assert choose_backend(_caps(everything), far, preferred="grpc") == "grpc"
    with pytest.raises(FailedPrecondition) as err:
        choose_backend(_caps(everything), far, preferred="shm")  # other host: never silently swapped
    assert err.value.field == "transport.preferred"
    with pytest.raises(InvalidRequest):
        choose_backend(_caps(everything), far, preferred="carrier-pigeon")
    with pytest.raises(FailedPrecondition):
        choose_backend(_caps(("shm",)), _caps(("grpc",), proc="p2"))


def test_local_caps_roundtrip_and_same_process():
    caps = local_caps()
    assert set(caps.backends) == set(available_backends())
    assert TransportCaps.from_dict(json.loads(json.dumps(caps.to_dict()))) == caps
    assert choose_backend(caps, local_caps()) == "inproc"
    with pytest.raises(InvalidRequest):
        local_caps(["telepathy"])


def test_make_transport_registry():
    with pytest.raises(InvalidRequest) as err:
        make_transport("telepathy", owner="x")
    assert err.value.field == "transport.backend"
    register_backend("fake-inproc", InprocTransport)
    t = make_transport("fake-inproc", owner="x")
    assert isinstance(t, Transport)
    t.close()


# ----------------------------------------------------------------------------- backends

def _backends():
    names = ["inproc", "shm", "grpc"]
    return names + (["nixl"] if "nixl" in available_backends() else [])


@pytest.fixture(params=_backends())
def pair(request):
    """(owner, reader) of one backend, in this process."""
    name = request.param
    if name == "inproc":
        hub = InprocHub()
        owner, reader = InprocTransport("owner", hub=hub), InprocTransport("reader", hub=hub)
    elif name == "grpc":
        owner = make_transport("grpc", owner="owner", listen="127.0.0.1:0")
        reader = make_transport("grpc", owner="reader")
    else:
        owner, reader = make_transport(name, owner="owner"), make_transport(name, owner="reader")
    yield owner, reader
    owner.close()
    reader.close()


@pytest.mark.parametrize("copy", [False, True])
def test_backend_roundtrip(pair, copy):
    owner, reader = pair
    for i, tensor in enumerate(SAMPLES):
        ref = owner.publish("req", f"t{i}", tensor)
        assert ref.backend == owner.backend and ref.validate() is ref
        got = reader.fetch(TensorRef.from_dict(ref.to_dict()), deadline_s=10, copy=copy)
        assert got.dtype == tensor.dtype and got.shape == tensor.shape and torch.equal(got, tensor)
    assert owner.release("req") == len(SAMPLES)
    stats = owner.stats()
    assert stats["buffers_created"] == stats["buffers_released"] == len(SAMPLES)
    assert stats["resident_buffers"] == 0 and stats["resident_bytes"] == 0


def test_backend_fetch_into_out(pair):
    owner, reader = pair
    for i, tensor in enumerate(SAMPLES):
        ref = owner.publish("req", f"t{i}", tensor)
        out = torch.empty_like(tensor)
        got = reader.fetch(ref, deadline_s=10, out=out)
        assert got is out and torch.equal(out, tensor)
    ref = owner.publish("req", "bad", torch.randn(4, 4))
    for bad in (torch.empty(16), torch.empty(4, 4, dtype=torch.float64), torch.empty(4, 8)[:, :4]):
        with pytest.raises(InvalidRequest) as err:
            reader.fetch(ref, deadline_s=10, out=bad)
        assert err.value.field == "out"
    owner.release("req")


def test_backend_corruption_is_data_loss(pair):
    owner, reader = pair
    ref = owner.publish("req", "x", torch.randn(100))
    corrupt(owner, ref, index=17)
    with pytest.raises(DataLoss):
        reader.fetch(ref, deadline_s=10)
    assert reader.stats()["checksum_failures"] == 1


def test_backend_released_ref(pair):
    owner, reader = pair
    keep = owner.publish("req", "keep", torch.ones(8))
    ref = owner.publish("req", "gone", torch.ones(8))
    assert owner.release_ref(ref) and not owner.release_ref(ref)
    with pytest.raises((NotFound, Unavailable)):
        reader.fetch(ref, deadline_s=10)
    assert torch.equal(reader.fetch(keep, deadline_s=10), torch.ones(8))
    owner.release("req")
    assert owner.stats()["resident_buffers"] == 0


def test_backend_rejects_bad_deadline_and_foreign_refs(pair):
    owner, reader = pair
    ref = owner.publish("req", "x", torch.ones(2))
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(DeadlineExceeded):
            reader.fetch(ref, deadline_s=bad)
    other = "shm" if owner.backend != "shm" else "grpc"
    with pytest.raises(InvalidRequest):
        reader.fetch(TensorRef.from_dict({**ref.to_dict(), "backend": other}), deadline_s=1)


def test_inproc_is_zero_copy_and_hub_scoped():
    hub = InprocHub()
    owner, reader = InprocTransport("enc", hub=hub), InprocTransport("den", hub=hub)
    t = torch.randn(16)
    ref = owner.publish("r", "e", t)
    assert reader.fetch(ref, deadline_s=1).data_ptr() == t.data_ptr()
    assert reader.fetch(ref, deadline_s=1, copy=True).data_ptr() != t.data_ptr()
    with pytest.raises(Unavailable):
        InprocTransport("x").fetch(ref, deadline_s=1)  # another hub
    with pytest.raises(Unavailable):
        InprocTransport("enc", hub=hub)  # owner names are unique on a hub
    owner.close()
    with pytest.raises(Unavailable):
        reader.fetch(ref, deadline_s=1)
    assert owner.stats()["buffers_released"] == 1


def test_shm_view_is_copy_on_write():
    owner, reader = make_transport("shm", owner="enc"), make_transport("shm", owner="den")
    ref = owner.publish("r", "x", torch.zeros(1000))
    view = reader.fetch(ref, deadline_s=5)
    view += 1  # the reader's pages only
    assert torch.equal(reader.fetch(ref, deadline_s=5), torch.zeros(1000))
    owner.close()
    reader.close()
    assert float(view.sum()) == 1000.0  # the mapping outlives the owner's segment


def test_grpc_unreachable_is_unavailable_fast():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    reader = make_transport("grpc", owner="den")
    ref = _ref(backend="grpc", descriptor={"address": f"127.0.0.1:{port}"}, checksum="none:")
    start = time.monotonic()
    with pytest.raises((Unavailable, DeadlineExceeded)):
        reader.fetch(ref, deadline_s=5)
    assert time.monotonic() - start < 5 + 1
    reader.close()


def test_grpc_silent_peer_hits_deadline():
    # A socket that accepts TCP connections (backlog) but never speaks HTTP/2.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        reader = make_transport("grpc", owner="den")
        ref = _ref(backend="grpc", descriptor={"address": "127.0.0.1:%d" % silent.getsockname()[1]})
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            reader.fetch(ref, deadline_s=1.0)
        assert 0.9 < time.monotonic() - start < 3.0
        reader.close()


def test_grpc_mounts_on_an_aio_server():
    import grpc

    owner = make_transport("grpc", owner="enc", advertise="pending")
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box = {}

    async def serve():
        server = grpc.aio.server()
        owner.add_to_server(server)
        box["port"] = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        box["stop"] = asyncio.Event()
        started.set()
        await box["stop"].wait()
        await server.stop(None)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    owner.address = f"127.0.0.1:{box['port']}"
    reader = make_transport("grpc", owner="den")
    t = torch.randn(300_000)  # > 1 chunk
    ref = owner.publish("r", "x", t)
    assert torch.equal(reader.fetch(ref, deadline_s=10), t)
    with pytest.raises(NotFound):
        reader.fetch(TensorRef.from_dict({**ref.to_dict(), "buffer_id": "r/none#9"}), deadline_s=10)
    loop.call_soon_threadsafe(box["stop"].set)
    thread.join(10)
    owner.close()
    reader.close()
    assert owner.stats()["served"] == 1


@pytest.mark.skipif("nixl" not in available_backends(), reason="nixl not installed")
def test_nixl_without_inline_metadata_needs_add_peer():
    owner = make_transport("nixl", owner="enc", inline_metadata=False)
    reader = make_transport("nixl", owner="den", recv="slab")
    ref = owner.publish("r", "x", torch.randn(5000))
    assert "md" not in ref.descriptor
    with pytest.raises(Unavailable):
        reader.fetch(ref, deadline_s=5)
    reader.add_peer(owner.agent_metadata())  # what a pool's Describe reply carries
    assert torch.equal(reader.fetch(ref, deadline_s=5), owner._resident_bytes(ref).view(torch.float32))
    owner.close()
    reader.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["inproc", "shm", "grpc"] + (["nixl"] if "nixl" in available_backends() else []))
def test_cuda_tensors_roundtrip(backend):
    dev = torch.device("cuda", 0)
    cfg = {"listen": "127.0.0.1:0"} if backend == "grpc" else {}
    hub = InprocHub() if backend == "inproc" else None
    extra = {"hub": hub} if hub else {}
    owner = make_transport(backend, owner="enc", **cfg, **extra)
    reader = make_transport(backend, owner="den", device=dev, **extra)
    for tensor in (torch.randn(3, 1000, device=dev).to(torch.bfloat16), torch.arange(7, device=dev),
                   torch.tensor(2.5, device=dev), torch.empty(0, 2, device=dev)):
        ref = owner.publish("r", "x", tensor)
        # computed where the owner's copy lives: on the device, or in a host staging slab
        staged_on_host = backend in ("shm", "grpc")
        assert ref.checksum.startswith(checksum.host_algorithm() if staged_on_host else "fsum64")
        got = reader.fetch(ref, deadline_s=30)
        assert got.device.type == "cuda" and torch.equal(got, tensor)
        out = torch.empty_like(tensor)
        assert reader.fetch(ref, deadline_s=30, out=out) is out and torch.equal(out, tensor)
    big = torch.randn(1 << 20, device=dev)
    ref = owner.publish("r", "big", big)
    assert checksum.compute(big, "fsum64") == checksum.compute(big.cpu(), "fsum64")
    corrupt(owner, ref, index=5)
    with pytest.raises(DataLoss):
        reader.fetch(ref, deadline_s=30)
    owner.release("r")
    assert owner.stats()["resident_bytes"] == 0
    owner.close()
    reader.close()
