"""The runtime export as a C ABI: header layout, fingerprint rules, lifetime, construction and a
native consumer (tests/native/*.c, compiled here with the system C compiler)."""
from __future__ import annotations

import ctypes
import subprocess
import threading

import pytest
import torch

from fastvideo3.export import (
    PortDeclarationError, PortSpec, RuntimeBuilder, Verbs, arena_views, cabi, pack_regions,
)
from fastvideo3.export.native import (
    STATE_BUFFER, UNPROBED_TAIL_CALLS, NativeModelRuntime, live_native_runtimes,
)
from fastvideo3.models.wan.runtime_export import DitBucket, build_dit_runtime
from tests.native.cc import Err, build, load

@pytest.fixture(scope="module")
def native_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("native")


@pytest.fixture(scope="module")
def lib(native_dir):
    return load("consumer", native_dir)


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


# ------------------------------------------------------------------------------ layout
CONSTANTS = {
    "FV3_RUNTIME_ABI_VERSION": cabi.RUNTIME_ABI_VERSION,
    "FV3_MODEL_RUNTIME_ABI_VERSION": cabi.MODEL_RUNTIME_ABI_VERSION,
    "FV3_MAX_DIMS": cabi.MAX_DIMS,
    "FV3_MODEL_RUNTIME_V1_BASE_SIZE": cabi.MODEL_RUNTIME_V1_BASE_SIZE,
    "FV3_MODEL_RUNTIME_V1_QUERY_EXTENSION_SIZE": cabi.MODEL_RUNTIME_V1_QUERY_EXTENSION_SIZE,
    "FV3_OK": cabi.OK, "FV3_ERR_INVALID_ARGUMENT": cabi.ERR_INVALID_ARGUMENT,
    "FV3_ERR_RELEASED": cabi.ERR_RELEASED, "FV3_ERR_UNKNOWN_PORT": cabi.ERR_UNKNOWN_PORT,
    "FV3_ERR_UNAVAILABLE": cabi.ERR_UNAVAILABLE, "FV3_ERR_NOT_PREPARED": cabi.ERR_NOT_PREPARED,
    "FV3_ERR_NO_EXTENSION": cabi.ERR_NO_EXTENSION, "FV3_ERR_INTERNAL": cabi.ERR_INTERNAL,
    "FV3_DEVICE_CPU": cabi.DEVICE_CPU, "FV3_DEVICE_CUDA": cabi.DEVICE_CUDA,
    "FV3_PORT_SWAP": cabi.PORT_SWAP, "FV3_PORT_STAGED": cabi.PORT_STAGED, "FV3_PORT_SETUP": cabi.PORT_SETUP,
    "FV3_PORT_IN": cabi.PORT_IN, "FV3_PORT_OUT": cabi.PORT_OUT,
    "FV3_EXTENSION_BUCKETS": cabi.EXTENSION_BUCKETS,
    "FV3_DTYPE_F32": 1, "FV3_DTYPE_F16": 2, "FV3_DTYPE_BF16": 3, "FV3_DTYPE_F64": 4,
    "FV3_DTYPE_I64": 5, "FV3_DTYPE_I32": 6, "FV3_DTYPE_U8": 7, "FV3_DTYPE_BOOL": 8,
}


def test_ctypes_mirror_matches_the_compiled_header(native_dir):
    """Every field's offset and size, every struct's size and every constant, as the C compiler
    sees them, equal the ctypes mirror the producer fills."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "fastvideo3/runtime.h"', "int main(void) {"]
    want: dict[str, tuple[int, ...]] = {}
    for cname, struct in cabi.STRUCTS.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
        want[cname] = (ctypes.sizeof(struct),)
        for fname, _ in struct._fields_:
            key = f"{cname}.{fname}"
            lines.append(f'printf("{key} %zu %zu\\n", offsetof({cname}, {fname}), sizeof((({cname} *)0)->{fname}));')
            f = getattr(struct, fname)
            want[key] = (f.offset, f.size)
    for name, value in CONSTANTS.items():
        lines.append(f'printf("{name} %lld\\n", (long long)({name}));')
        want[name] = (value,)
    lines += ["return 0;", "}"]
    src = native_dir / "probe.c"
    src.write_text("\n".join(lines) + "\n")
    exe = build(src, native_dir / "probe", shared=False)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True).stdout
    got = {k: tuple(int(x) for x in v) for k, *v in (line.split() for line in out.splitlines())}
    assert got == want
    # the dtype codes the producer writes are the header's
    assert {cabi.DTYPE_CODES[d] for d in (torch.float32, torch.bfloat16, torch.uint8)} == {1, 3, 7}


# ------------------------------------------------------------------------------ a small runtime
def _toy_runtime(*, weights="w1", regions_order=("a", "b"), manifest=None, owner=None, staged=False,
                 verbs=None):
    regions = pack_regions([(n, torch.float32, (4,)) for n in regions_order])
    arena = torch.zeros(512, dtype=torch.uint8)
    b = RuntimeBuilder(weights_digest=weights, precision="fp32", libraries={"torch": "x"}, device_arch="cpu:test")
    b.add_buffer("x", torch.zeros(4)).add_buffer("y", torch.zeros(4)).add_buffer(STATE_BUFFER, arena)
    views = arena_views(arena, regions)
    bufs = b._buffers

    def fire():  # y = x * 2 + a; a += 1
        bufs["y"].copy_(bufs["x"] * 2 + views["a"])
        views["a"].add_(1.0)

    b.add_graph("g", fire).set_regions(regions)
    b.add_stage("g")
    b.add_port(PortSpec("x", "in", torch.float32, shape=(4,), update="swap", buffer="x"))
    b.add_port(PortSpec("y", "out", torch.float32, shape=(4,), update="swap", buffer="y"))
    if staged:
        b.add_port(PortSpec("prompt", "in", torch.float32, shape=(2,), update="staged"))
    b.set_verbs(verbs or Verbs()).set_manifest(manifest or {"note": "one"}).set_owner(owner)
    return b


def _export_fields(nat: NativeModelRuntime):
    exp = nat.struct.exp.contents
    return exp.fingerprint, exp.identity.decode(), exp.manifest_json.decode()


def test_fingerprint_determinism_sensitivity_and_manifest_insensitivity(lib):
    def fields(**kw):
        nat = NativeModelRuntime(_toy_runtime(**kw).finish())
        try:
            return _export_fields(nat)
        finally:
            nat.release()

    base = fields()
    assert fields() == base  # deterministic
    fp, identity, _ = base
    assert lib.fv3c_fnv1a64(identity.encode()) == fp  # one hashing rule, checkable natively
    assert fields(weights="w2")[0] != fp  # identity-sensitive
    assert fields(regions_order=("b", "a"))[0] != fp  # region order is contractual
    fp2, identity2, manifest2 = fields(manifest={"note": "two", "extra": [1, 2]})
    assert (fp2, identity2) == (fp, identity) and manifest2 != base[2]  # manifest is not identity


def test_retain_release_lifetime_from_another_thread(lib):
    calls, freed = [], threading.Event()
    before = live_native_runtimes()
    rt = _toy_runtime(owner=lambda: (calls.append(threading.get_ident()), freed.set())).finish()
    nat = NativeModelRuntime(rt)
    rt.release()  # the native face holds the runtime; the builder's reference is gone
    err, fp, fnv, ptr = Err(), ctypes.c_uint64(), ctypes.c_uint64(), nat.ptr
    assert lib.fv3c_adopt(ptr, ctypes.byref(fp), ctypes.byref(fnv), *err.args) == 0, str(err)
    assert nat.refcount == 2 and fp.value == fnv.value
    nat.release()  # the producer's reference
    assert nat.refcount == 1 and not calls and not rt.released
    assert lib.fv3c_release_on_thread(ptr, *err.args) == 0, str(err)
    assert freed.wait(30) and len(calls) == 1 and rt.released
    assert calls[0] != threading.get_ident()  # the owner ran on the C thread, under the GIL
    assert live_native_runtimes() == before
    # after the final release every callback answers RELEASED, from any thread
    assert lib.fv3c_release(ptr, *err.args) == cabi.ERR_RELEASED

    # many threads retaining and releasing: the owner runs once, at the very end
    calls.clear()
    rt = _toy_runtime(owner=lambda: calls.append(1)).finish()
    nat = NativeModelRuntime(rt)
    rt.release()
    ptr = nat.ptr
    threads = [threading.Thread(target=lambda: [(nat.retain(), lib.fv3c_release(ptr, *Err().args))
                                                for _ in range(50)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert nat.refcount == 1 and not calls
    nat.release()
    assert calls == [1]


def test_staged_promise_is_fail_closed_and_retry_works(lib):
    freed = []
    builder = _toy_runtime(staged=True, owner=lambda: freed.append(1))
    with pytest.raises(PortDeclarationError) as exc:
        builder.finish()  # integrated build: STAGED input without set_input
    assert exc.value.field == "ports.prompt"
    got = []
    builder.set_verbs(Verbs(set_input=lambda port, value: got.append((port, value.tolist()))))
    rt = builder.finish()  # the refused finish left the builder usable
    nat = NativeModelRuntime(rt)
    rt.release()
    data = torch.tensor([1.5, -2.0])
    err = Err()
    assert lib.fv3c_write_swap(nat.ptr, b"prompt", b"", _ptr(data), 8, *err.args) == cabi.ERR_INVALID_ARGUMENT
    assert nat.struct.verbs.set_input(nat.struct.ctx, b"prompt", data.data_ptr(), 8) == cabi.OK
    assert got == [("prompt", [1.5, -2.0])]

    staged = [p for p in nat.struct.ports[:nat.struct.num_ports] if p.name == b"prompt"]
    assert len(staged) == 1 and staged[0].update == cabi.PORT_STAGED  # the promise, natively
    nat.release()
    assert freed == [1]


# ------------------------------------------------------------------------------ the denoiser's model
@pytest.fixture(scope="module")
def tiny_dit():
    pytest.importorskip("pydantic")  # the card layer
    from fastvideo3.models.wan.cards import wan_tiny
    from fastvideo3.runtime.pool.executors import DenoiserExecutor
    from fastvideo3.transport import make_transport
    card = wan_tiny()
    ex = DenoiserExecutor(card, make_transport("inproc", owner="cabi"), "cpu", fast=True)
    shape = (ex.dit.cfg.in_channels, 2, 8, 8)
    ex.prepare_graphs([(1, shape)])  # the pool's own warm phase: declares and records the bucket
    return ex, DitBucket(1, shape, card.max_text_tokens)


def _seed_state(rt, seed: int) -> bytes:
    """Put a random latent and fixed inputs into the runtime; returns the arena's bytes."""
    g = torch.Generator().manual_seed(seed)
    arena = rt.export.buffers[STATE_BUFFER]
    views = arena_views(arena, rt.regions)
    views["latent"].copy_(torch.randn(views["latent"].shape, generator=g))
    views["history.has_previous"].zero_()
    text = torch.randn(rt.ports["text"].shape_for(rt.bucket), generator=g)
    rt.set_input("text", text.to(rt.export.buffers["text"].dtype))
    rt.set_input("dt", torch.full(rt.ports["dt"].shape_for(rt.bucket), -0.25))
    return arena.numpy().tobytes()


def test_c_consumer_round_trip_matches_python_on_the_tiny_card(lib, tiny_dit):
    ex, bucket = tiny_dit
    rt = ex.runtime
    rt.prepare(bucket.key)
    state0 = _seed_state(rt, 0)
    t = torch.tensor([700.0])
    # the Python path: SWAP input through the verb, one step, read the output
    rt.set_input("timestep", t)
    rt.step()
    want = rt.get_output("noise_pred").clone()
    py_state = rt.export.buffers[STATE_BUFFER].clone()
    # the C path from the same state
    rt.export.buffers[STATE_BUFFER].copy_(torch.frombuffer(bytearray(state0), dtype=torch.uint8))
    rt.set_input("timestep", torch.tensor([0.0]))  # C must overwrite it
    nat = NativeModelRuntime(rt)
    n = want.numel() * want.element_size()
    outs = [ctypes.create_string_buffer(n) for _ in range(3)]
    fp, err = ctypes.c_uint64(), Err()
    rc = lib.fv3c_round_trip(nat.ptr, bucket.key.encode(), b"timestep", _ptr(t), 4, b"noise_pred",
                             *outs, n, ctypes.byref(fp), *err.args)
    assert rc == 0, str(err)
    assert fp.value == rt.fingerprint == ex.identity.fingerprint
    got = [torch.frombuffer(bytearray(o.raw), dtype=want.dtype).view(want.shape) for o in outs]
    assert torch.equal(got[0], want)  # same bytes as the Python path
    assert not torch.equal(got[1], got[0])  # the state moved between steps
    assert torch.equal(got[2], got[1])  # restore brought the regions back exactly
    assert nat.refcount == 1  # the consumer released what it retained
    nat.release()
    assert not rt.released and py_state.numel() > 0


def test_old_consumer_works_against_an_appended_tail_and_the_tail_is_probed(lib, native_dir):
    old = load("old_consumer", native_dir)
    fwd = lambda x, t, text: x * 0.5 + t.view(-1, 1, 1, 1, 1)  # noqa: E731
    bucket = DitBucket(2, (2, 1, 2, 2), 3)
    rt = build_dit_runtime(fwd, weights_digest="w", precision="fp32", dtype=torch.float32, text_dim=4,
                           buckets=[bucket, DitBucket(1, (2, 1, 2, 2), 3)])
    rt.prepare(bucket.key)
    state0 = _seed_state(rt, 1)
    t = torch.tensor([3.0, 4.0])
    rt.set_input("timestep", t)
    rt.step()
    want = rt.get_output("noise_pred").clone()
    rt.export.buffers[STATE_BUFFER].copy_(torch.frombuffer(bytearray(state0), dtype=torch.uint8))
    err = Err()
    for with_tails in (True, False):
        nat = NativeModelRuntime(rt, with_tails=with_tails)
        assert nat.struct.struct_size == (cabi.MODEL_RUNTIME_V1_QUERY_EXTENSION_SIZE if with_tails
                                          else cabi.MODEL_RUNTIME_V1_BASE_SIZE)
        calls = UNPROBED_TAIL_CALLS[0]
        count = lib.fv3c_bucket_count(nat.ptr, *err.args)
        assert count == (2 if with_tails else -2), str(err)  # read only when the size covers it
        assert UNPROBED_TAIL_CALLS[0] == calls
        out = torch.empty_like(want)
        rt.export.buffers[STATE_BUFFER].copy_(torch.frombuffer(bytearray(state0), dtype=torch.uint8))
        rc = old.fv3old_step(nat.ptr, bucket.key.encode(), b"timestep", _ptr(t), 8, b"noise_pred",
                             _ptr(out), out.numel() * 4, *err.args)
        assert rc == 0, str(err)
        assert torch.equal(out, want) and nat.refcount == 1
        nat.release()
    rt.release()


def test_the_denoiser_pool_gets_its_model_through_the_runtime(tiny_dit):
    from fastvideo3.errors import FailedPrecondition
    ex, bucket = tiny_dit
    rt = ex.runtime
    d = ex.describe()["runtime_export"]
    assert d["fingerprint"] == rt.fingerprint_hex == ex.identity.fingerprint_hex
    assert d["stages"] == ["load", "dit", "update"] and d["graphs"] == ["dit", "load", "update"]
    assert d["regions"] == ["latent", "history.model_output", "history.has_previous"]
    assert bucket.key in [f"r{g['batch']}.{g['signature']}" for g in ex.describe()["graph_buckets"]]
    # a prepared bucket runs through the runtime's SWAP ports and its "dit" stage
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, *bucket.latent_shape, generator=g)
    text = torch.randn(1, bucket.text_len, ex.dit.cfg.text_dim, generator=g)
    t = torch.tensor([500.0])
    got = ex._dit(x, t, text)
    latents = rt.export.buffers["latents"].view(-1)[: x.numel()].view(x.shape)
    assert torch.equal(rt.get_output("noise_pred"), got) and torch.equal(latents, x)
    assert torch.equal(got, ex._forward(x, t, text))  # the same function as the eager path
    # re-planning buckets changes the fingerprint, so it is refused while a request is resident
    ex.regions["held"] = object()
    try:
        with pytest.raises(FailedPrecondition):
            ex.prepare_graphs([(2, bucket.latent_shape)])
    finally:
        ex.regions.pop("held")
    assert ex.runtime is rt
