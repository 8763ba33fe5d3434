"""Runtime-export contract: identity and fingerprint, regions and snapshots, GraphRunner on CPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastvideo3.errors import DataLoss, FailedPrecondition
from fastvideo3.export import (
    BucketNotPrepared,
    BufferMismatch,
    Direction,
    FingerprintMismatch,
    GraphRunner,
    PortSpec,
    RegionLayoutError,
    RuntimeBuilder,
    RuntimeIdentity,
    Snapshot,
    SnapshotCorrupt,
    Stage,
    StateRegion,
    UpdateClass,
    VerbUnavailable,
    arena_views,
    fingerprint_hex,
    fnv1a_64,
    pack_regions,
    restore,
    snapshot,
)
from tests.helpers_export import counting

REPO_ROOT = Path(__file__).resolve().parents[2]

# Built verbatim here and in a subprocess: the fingerprint must not depend on the process.
IDENTITY_SRC = """
import torch
from fastvideo3.export import RuntimeIdentity, pack_regions
IDENT = RuntimeIdentity(
    weights_digest="sha256:0123abcd",
    precision="bf16",
    libraries={"torch": "2.13.0", "fastvideo3": "0.1.0", "triton": "3.4.0"},
    device_arch="cuda:sm_90",
    graph_names=("denoise", "cfg_combine"),
    regions=pack_regions([("latent", torch.bfloat16, (1, 16, 4, 8, 8)), ("history", "float32", (2, 16))]),
)
"""


def _identity() -> RuntimeIdentity:
    scope: dict = {}
    exec(IDENTITY_SRC, scope)
    return scope["IDENT"]


def _vary(ident: RuntimeIdentity, **changes) -> RuntimeIdentity:
    fields = dict(
        weights_digest=ident.weights_digest, precision=ident.precision,
        libraries=ident.libraries, device_arch=ident.device_arch, graph_names=ident.graph_names,
        regions=ident.regions, ports=ident.ports, stages=ident.stages,
    )
    fields.update(changes)
    return RuntimeIdentity(**fields)


# -- FNV-1a and the canonical string ---------------------------------------------------------
@pytest.mark.timeout(60)
def test_fnv1a_64_known_answers():
    assert fnv1a_64(b"") == 0xCBF29CE484222325
    assert fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64(b"foobar") == 0x85944171F73967E8
    assert fingerprint_hex(fnv1a_64(b"a")) == "af63dc4c8601ec8c"
    assert fingerprint_hex(1) == "0000000000000001"


@pytest.mark.timeout(60)
def test_canonical_string_is_frozen():
    # Golden form: changing it changes every fingerprint, so it must be a deliberate edit.
    ident = RuntimeIdentity(
        weights_digest="w=1|x",
        precision="fp8,e4m3",
        libraries={"torch": "2.13", "fastvideo3": "0.1.0"},
        device_arch="cpu:x86_64",
        graph_names=("b\\c", "a"),
        regions=(StateRegion("lat", "float32", (2, 3), 0, 24),),
        stages=(Stage("a"), Stage("b\\c", after=("a",))),
    )
    assert ident.canonical() == (
        "fastvideo3-runtime-identity/1\n"
        "weights_digest=w\\=1\\|x\n"
        "precision=fp8\\,e4m3\n"
        "device_arch=cpu:x86_64\n"
        "library=fastvideo3|0.1.0\n"
        "library=torch|2.13\n"
        "graph=a\n"
        "graph=b\\\\c\n"
        "region=lat|float32|2x3|0|24\n"
        "stage=a|\n"
        "stage=b\\\\c|a\n"
    )
    assert ident.fingerprint == fnv1a_64(ident.canonical().encode("utf-8"))
    assert ident.fingerprint_hex == fingerprint_hex(ident.fingerprint)


@pytest.mark.timeout(60)
def test_escaping_prevents_collisions():
    base = _identity()
    one = _vary(base, graph_names=("a,b",))
    two = _vary(base, graph_names=("a", "b"))
    assert one.fingerprint != two.fingerprint
    assert _vary(base, precision="a|b").fingerprint != _vary(base, precision="a\\|b").fingerprint


# -- determinism and sensitivity -------------------------------------------------------------
@pytest.mark.timeout(60)
def test_fingerprint_deterministic_in_process():
    a, b = _identity(), _identity()
    assert a is not b and a == b
    assert a.fingerprint == b.fingerprint == a.fingerprint
    assert a.canonical() == b.canonical()
    # Library mapping order and graph declaration order are not part of the identity.
    shuffled = _vary(a, libraries={"triton": "3.4.0", "torch": "2.13.0", "fastvideo3": "0.1.0"},
                     graph_names=("cfg_combine", "denoise"))
    assert shuffled.fingerprint == a.fingerprint


@pytest.mark.timeout(60)
def test_fingerprint_deterministic_across_processes():
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(REPO_ROOT))
    code = IDENTITY_SRC + "\nprint(IDENT.fingerprint_hex)\n"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=50, check=True,
    )
    assert out.stdout.strip() == _identity().fingerprint_hex


_VARIANTS = {
    "weights_digest": dict(weights_digest="sha256:0123abce"),
    "precision": dict(precision="fp8"),
    "torch_version": dict(libraries={"torch": "2.14.0", "fastvideo3": "0.1.0", "triton": "3.4.0"}),
    "triton_absent": dict(libraries={"torch": "2.13.0", "fastvideo3": "0.1.0"}),
    "our_version": dict(libraries={"torch": "2.13.0", "fastvideo3": "0.2.0", "triton": "3.4.0"}),
    "device_arch": dict(device_arch="cuda:sm_100"),
    "graph_added": dict(graph_names=("denoise", "cfg_combine", "vae")),
    "graph_renamed": dict(graph_names=("denoise", "cfg")),
    "region_offset": dict(regions=(
        StateRegion("latent", "bfloat16", (1, 16, 4, 8, 8), 0, 8192),
        StateRegion("history", "float32", (2, 16), 8704, 128),
    )),
    "region_shape": dict(regions=pack_regions([("latent", torch.bfloat16, (1, 16, 4, 8, 16)),
                                               ("history", "float32", (2, 16))])),
    "region_dtype": dict(regions=pack_regions([("latent", torch.float16, (1, 16, 4, 8, 8)),
                                               ("history", "float32", (2, 16))])),
    "region_name": dict(regions=pack_regions([("latents", torch.bfloat16, (1, 16, 4, 8, 8)),
                                              ("history", "float32", (2, 16))])),
    "region_dropped": dict(regions=pack_regions([("latent", torch.bfloat16, (1, 16, 4, 8, 8))])),
    "ports": dict(ports=(PortSpec("noise", Direction.IN, "float32", shape=(4,),
                                  update=UpdateClass.SWAP, buffer="noise"),)),
    "stages": dict(stages=(Stage("denoise"),)),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(_VARIANTS))
def test_each_identity_field_changes_fingerprint(name):
    base = _identity()
    changed = _vary(base, **_VARIANTS[name])
    assert changed.canonical() != base.canonical()
    assert changed.fingerprint != base.fingerprint


@pytest.mark.timeout(60)
def test_all_variants_are_pairwise_distinct():
    base = _identity()
    prints = {_vary(base, **v).fingerprint for v in _VARIANTS.values()} | {base.fingerprint}
    assert len(prints) == len(_VARIANTS) + 1


@pytest.mark.timeout(60)
def test_region_order_changes_fingerprint():
    a = StateRegion("latent", "float32", (4,), 0, 16)
    b = StateRegion("history", "float32", (4,), 256, 16)
    base = _identity()
    assert _vary(base, regions=(a, b)).fingerprint != _vary(base, regions=(b, a)).fingerprint
    # Same set, same offsets: only the declared order differs, and it is contractual.
    assert {a, b} == {b, a}


def _builder(manifest=None, regions=None) -> RuntimeBuilder:
    b = RuntimeBuilder(weights_digest="sha256:feed", precision="fp32",
                       libraries={"torch": "2.13.0"}, device_arch="cpu:test")
    b.add_graph("denoise", lambda: None)
    b.set_regions(regions if regions is not None else pack_regions([("latent", "float32", (2, 4))]))
    if manifest is not None:
        b.set_manifest(manifest)
    return b


@pytest.mark.timeout(60)
def test_manifest_is_not_part_of_identity():
    plain = _builder().finish().export
    rich = _builder({"model": "wan2.1-t2v", "notes": ["x"], "max_frames": 81}).finish().export
    assert rich.manifest["model"] == "wan2.1-t2v"
    assert plain.fingerprint == rich.fingerprint
    before = rich.fingerprint_hex
    rich.manifest["edited"] = True
    assert rich.fingerprint_hex == before
    snap = snapshot({"latent": torch.ones(2, 4)}, rich)
    assert restore(snap, plain)["latent"].sum().item() == 8


# -- regions ---------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_region_layout_validation():
    with pytest.raises(RegionLayoutError):
        StateRegion("x", "float32", (2,), 0, 9)  # nbytes must be numel * itemsize
    with pytest.raises(RegionLayoutError):
        _builder(regions=[StateRegion("x", "float32", (4,), 0, 16),
                          StateRegion("y", "float32", (4,), 8, 16)])  # overlap
    with pytest.raises(RegionLayoutError):
        _builder(regions=[StateRegion("x", "float32", (4,), 0, 16),
                          StateRegion("x", "float32", (4,), 64, 16)])  # duplicate
    regions = pack_regions([("a", "int8", (3,)), ("b", "float32", (2, 2))], align=64)
    assert [(r.offset, r.nbytes) for r in regions] == [(0, 3), (64, 16)]
    arena = torch.zeros(128, dtype=torch.uint8)
    views = arena_views(arena, regions)
    views["b"].fill_(1.5)
    assert views["b"].dtype == torch.float32 and views["b"].shape == (2, 2)
    assert arena[64:80].view(torch.float32).tolist() == [1.5] * 4


# -- snapshots -------------------------------------------------------------------------------
def _state_export(weights="sha256:feed"):
    regions = pack_regions([
        ("latent", torch.float32, (2, 3, 4)),
        ("history", torch.bfloat16, (5,)),
        ("step", torch.int64, ()),
        ("empty", torch.float16, (0, 7)),
    ])
    b = RuntimeBuilder(weights_digest=weights, precision="bf16",
                       libraries={"torch": "2.13.0"}, device_arch="cpu:test")
    b.add_graph("denoise", lambda: None).set_regions(regions)
    return b.finish().export


def _state():
    g = torch.Generator().manual_seed(0)
    return {
        "latent": torch.randn(2, 3, 4, generator=g),
        "history": torch.randn(5, generator=g).to(torch.bfloat16),
        "step": torch.tensor(17, dtype=torch.int64),
        "empty": torch.empty(0, 7, dtype=torch.float16),
    }


@pytest.mark.timeout(60)
def test_snapshot_round_trip_through_bytes():
    export, state = _state_export(), _state()
    snap = snapshot(state, export)
    assert snap.fingerprint == export.fingerprint and snap.regions == export.regions
    data = snap.to_bytes()
    back = Snapshot.from_bytes(data)
    assert back == snap
    restored = restore(back, export)
    assert list(restored) == ["latent", "history", "step", "empty"]
    for name, t in state.items():
        assert restored[name].dtype == t.dtype and torch.equal(restored[name], t)

    # Restoring into live tensors copies in place (same storage, new contents).
    live = {k: torch.zeros_like(v) for k, v in state.items()}
    ptr = live["latent"].data_ptr()
    out = restore(back, export, into=live)
    assert out["latent"].data_ptr() == ptr and torch.equal(live["latent"], state["latent"])
    # Positional form follows region order.
    assert snapshot(list(state.values()), export) == snap


@pytest.mark.timeout(60)
def test_restore_refuses_another_fingerprint_and_touches_nothing():
    src, other = _state_export("sha256:feed"), _state_export("sha256:beef")
    assert src.regions == other.regions and src.fingerprint != other.fingerprint
    snap = Snapshot.from_bytes(snapshot(_state(), src).to_bytes())
    live = {k: torch.zeros_like(v) for k, v in _state().items()}
    with pytest.raises(FingerprintMismatch) as info:
        restore(snap, other, into=live)
    assert isinstance(info.value, FailedPrecondition)
    assert info.value.code == "FAILED_PRECONDITION"
    assert info.value.details == {"snapshot": src.fingerprint_hex, "runtime": other.fingerprint_hex}
    assert all(int(t.count_nonzero()) == 0 for t in live.values())


@pytest.mark.timeout(60)
def test_snapshot_rejects_wrong_tensors_and_corrupt_bytes():
    export = _state_export()
    bad = _state()
    bad["latent"] = torch.zeros(2, 3, 5)
    with pytest.raises(BufferMismatch):
        snapshot(bad, export)
    with pytest.raises(BufferMismatch):
        snapshot({"latent": torch.zeros(2, 3, 4)}, export)
    data = bytearray(snapshot(_state(), export).to_bytes())
    with pytest.raises(SnapshotCorrupt):
        Snapshot.from_bytes(bytes(data[:-3]))
    data[-40] ^= 0xFF  # inside the blobs
    with pytest.raises(SnapshotCorrupt) as info:
        Snapshot.from_bytes(bytes(data))
    assert isinstance(info.value, DataLoss)
    with pytest.raises(SnapshotCorrupt):
        Snapshot.from_bytes(b"not a snapshot")


# -- GraphRunner (CPU eager fallback) ---------------------------------------------------------
def _forward(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * 2.0 + t)


def _step(runner: GraphRunner, bucket: str, inputs: dict) -> torch.Tensor:
    """What a SWAP port does: write new values into the bucket's static inputs, then replay."""
    static = runner.static_inputs(bucket)
    for k, v in inputs.items():
        static[k].copy_(v)
    return runner.replay(bucket)


@pytest.mark.timeout(60)
def test_graph_runner_prepare_then_replay_matches_direct_call():
    runner = GraphRunner("dit", use_cuda_graphs=False)
    x, t = torch.randn(2, 8), torch.full((2, 1), 0.5)
    out = runner.prepare("480p", _forward, {"x": x.clone(), "t": t.clone()})
    assert torch.allclose(out, _forward(x, t))
    assert "480p" in runner and not runner.is_captured("480p")
    stepped = _step(runner, "480p", {"x": x, "t": t})
    assert torch.equal(stepped, _forward(x, t))


@pytest.mark.timeout(60)
def test_graph_runner_replay_of_unprepared_bucket_raises():
    runner = GraphRunner("dit")
    runner.prepare("480p", _forward, {"x": torch.zeros(1, 4), "t": torch.zeros(1, 1)})
    with pytest.raises(BucketNotPrepared) as info:
        runner.replay("720p")
    assert "prepare" in info.value.message and info.value.code == "FAILED_PRECONDITION"
    with pytest.raises(BucketNotPrepared):
        runner.static_inputs("720p")
    assert runner.buckets == ("480p",)  # the miss captured nothing


@pytest.mark.timeout(60)
def test_graph_runner_replay_uses_new_input_contents():
    fn, calls = counting(_forward)

    runner = GraphRunner("dit", use_cuda_graphs=False)
    static = {"x": torch.zeros(3, 4), "t": torch.zeros(3, 1)}
    first = runner.prepare("b", fn, static)
    assert runner.static_inputs("b")["x"] is static["x"]  # kept by reference, never rebound
    results = []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x, t = torch.randn(3, 4, generator=g), torch.randn(3, 1, generator=g)
        out = _step(runner, "b", {"x": x, "t": t})
        assert out is first  # static outputs: same tensor, new contents
        assert torch.equal(out, _forward(x, t))
        results.append(out.clone())
    assert not torch.equal(results[0], results[1])
    # Writing a static input directly (a SWAP port) and replaying also sees the new contents.
    static["x"].fill_(1.0)
    static["t"].fill_(0.0)
    assert torch.equal(runner.replay("b"), _forward(torch.ones(3, 4), torch.zeros(3, 1)))
    assert len(calls) == 1 + 3 + 1


@pytest.mark.timeout(60)
def test_graph_runner_refuses_capture_inside_step_and_handles_structures():
    runner = GraphRunner("dit")
    refused = []

    def nested(x):
        if runner.buckets:  # replaying (the bucket exists), not the first prepare
            with pytest.raises(VerbUnavailable):
                runner.prepare("other", _forward, {"x": x, "t": x})
            refused.append(True)
        return {"y": x + 1, "pair": (x * 2, None)}

    out = runner.prepare("b", nested, {"x": torch.zeros(2)})
    _step(runner, "b", {"x": torch.ones(2)})
    assert refused == [True] and runner.buckets == ("b",)
    assert torch.equal(out["y"], torch.full((2,), 2.0))
    assert torch.equal(out["pair"][0], torch.full((2,), 2.0)) and out["pair"][1] is None
    runner.release()
    assert runner.buckets == ()
