"""Runtime-export contract: ports, fail-closed construction, verbs, stages and lifetime."""
from __future__ import annotations

import threading

import pytest
import torch

from fastvideo3.errors import FailedPrecondition, InvalidRequest
from fastvideo3.export import (
    BucketNotPrepared,
    BufferMismatch,
    Direction,
    ExportReleased,
    GraphRunner,
    PortDeclarationError,
    PortSpec,
    RuntimeBuilder,
    Stage,
    UnknownPort,
    UpdateClass,
    VerbUnavailable,
    Verbs,
    pack_regions,
    restore,
    snapshot,
)

IN, OUT = Direction.IN, Direction.OUT
SWAP, STAGED, SETUP = UpdateClass.SWAP, UpdateClass.STAGED, UpdateClass.SETUP


class Owner:
    """Records owner-callback calls, as a producer's teardown would."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def _builder(owner=None, **graphs) -> RuntimeBuilder:
    b = RuntimeBuilder(weights_digest="sha256:feed", precision="fp32",
                       libraries={"torch": "2.13.0", "fastvideo3": "0.1.0"}, device_arch="cpu:test")
    for name, handle in (graphs or {"denoise": lambda: None}).items():
        b.add_graph(name, handle)
    b.add_buffer("latent", torch.zeros(64))
    b.set_regions(pack_regions([("latent", "float32", (64,))]))
    b.set_owner(owner)
    return b


PROMPT = PortSpec("prompt", IN, "float32", shape=(4,), update=STAGED)
VIDEO = PortSpec("video", OUT, "float32", shape=(4,), update=STAGED)
LATENT_IN = PortSpec("latent_in", IN, "float32", shape=(64,), update=SWAP, buffer="latent")


# -- fail-closed construction ----------------------------------------------------------------
@pytest.mark.timeout(60)
def test_staged_input_without_set_input_is_refused_then_retry_succeeds():
    owner = Owner()
    b = _builder(owner).add_port(PROMPT).add_port(LATENT_IN).add_stage("denoise")
    with pytest.raises(PortDeclarationError) as info:
        b.finish()
    assert info.value.field == "ports.prompt" and "set_input" in info.value.message
    assert isinstance(info.value, InvalidRequest)
    assert owner.calls == 0  # nothing was built, so nothing is torn down
    received = []
    b.set_verbs(Verbs(set_input=lambda port, value: received.append((port, value))))
    rt = b.finish()  # the same builder, corrected
    rt.set_input("prompt", "a red fox")
    assert received == [("prompt", "a red fox")]
    rt.release()
    assert owner.calls == 1
    with pytest.raises(VerbUnavailable):
        b.finish()  # one builder, one runtime


@pytest.mark.timeout(60)
def test_staged_output_without_get_output_is_refused_then_retry_succeeds():
    b = _builder().add_port(VIDEO).set_verbs(Verbs(set_input=lambda p, v: None))
    with pytest.raises(PortDeclarationError) as info:
        b.finish()
    assert info.value.field == "ports.video" and "get_output" in info.value.message
    b.set_verbs(Verbs(get_output=lambda port: torch.arange(4.0)))
    rt = b.finish()
    assert torch.equal(rt.get_output("video"), torch.arange(4.0))


@pytest.mark.timeout(60)
def test_port_declaration_checks():
    with pytest.raises(PortDeclarationError):
        PortSpec("x", IN, "float32", update=SWAP, buffer="latent")  # neither shape nor buckets
    with pytest.raises(PortDeclarationError):
        PortSpec("x", IN, "float32", shape=(4,), update=SWAP)  # SWAP without a buffer
    owner = Owner()
    for bad in (
        PortSpec("x", IN, "float32", shape=(65,), update=SWAP, buffer="latent"),  # too big
        PortSpec("x", IN, "float16", shape=(4,), update=SWAP, buffer="latent"),  # dtype
        PortSpec("x", IN, "float32", shape=(4,), update=SWAP, buffer="nope"),  # unknown buffer
    ):
        with pytest.raises(PortDeclarationError) as info:
            _builder(owner).add_port(bad).finish()
        assert info.value.field == "ports.x"
    with pytest.raises(PortDeclarationError):
        _builder(owner).add_port(LATENT_IN).add_port(LATENT_IN).finish()  # duplicate names
    with pytest.raises(PortDeclarationError):
        _builder(owner).add_stage("denoise", after=("later",)).finish()
    with pytest.raises(PortDeclarationError):
        _builder(owner).add_stage("missing_graph").finish()
    assert owner.calls == 0  # every refusal came before anything was built


# -- identity -----------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_port_schema_is_part_of_integrated_identity():
    def build(*ports, stages=("denoise",)):
        b = _builder().set_verbs(Verbs(set_input=lambda p, v: None))
        for p in ports:
            b.add_port(p)
        for s in stages:
            b.add_stage(s)
        return b.finish()

    base = build(PROMPT, LATENT_IN)
    assert build(LATENT_IN, PROMPT).fingerprint == base.fingerprint  # port order is not schema
    reshaped = PortSpec("prompt", IN, "float32", shape=(8,), update=STAGED)
    assert build(reshaped, LATENT_IN).fingerprint != base.fingerprint
    as_swap = PortSpec("prompt", IN, "float32", shape=(4,), update=SWAP, buffer="latent")
    assert build(as_swap, LATENT_IN).fingerprint != base.fingerprint
    assert build(PROMPT).fingerprint != base.fingerprint
    assert build(PROMPT, LATENT_IN, stages=()).fingerprint != base.fingerprint
    assert base.export.fingerprint == base.fingerprint


# -- verbs -----------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_swap_ports_write_the_buffer_and_stages_fire_in_order():
    fired = []
    b = _builder(encode=lambda: fired.append("encode"), denoise=lambda: fired.append("denoise"),
                 decode=lambda: fired.append("decode"))
    b.add_buffer("video", torch.zeros(4))
    b.add_port(LATENT_IN)
    b.add_port(PortSpec("video_out", OUT, "float32", shape=(2, 2), update=SWAP, buffer="video"))
    b.add_stage("encode").add_stage("denoise", after=["encode"]).add_stage("decode", after=["denoise"])
    rt = b.finish()
    latent = rt.export.buffers["latent"]
    ptr = latent.data_ptr()
    rt.set_input("latent_in", torch.arange(64.0))
    assert latent.data_ptr() == ptr and torch.equal(latent, torch.arange(64.0))
    with pytest.raises(BufferMismatch):
        rt.set_input("latent_in", torch.zeros(63))
    rt.step()
    rt.step()
    assert fired == ["encode", "denoise", "decode"] * 2
    rt.export.buffers["video"].copy_(torch.tensor([1.0, 2, 3, 4]))
    assert rt.get_output("video_out").tolist() == [[1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(UnknownPort):
        rt.set_input("nope", 1)
    with pytest.raises(VerbUnavailable):
        rt.set_input("video_out", torch.zeros(2, 2))  # an output port


@pytest.mark.timeout(60)
def test_bucketed_ports_prepare_once_per_bucket_and_step_requires_prepare():
    prepared = []
    b = _builder().set_verbs(Verbs(prepare=prepared.append))
    b.add_port(PortSpec("latent_in", IN, "float32", buckets={"small": (2, 4), "large": (4, 8)},
                        update=SWAP, buffer="latent"))
    b.add_stage("denoise")
    rt = b.finish()
    with pytest.raises(BucketNotPrepared):
        rt.step()
    with pytest.raises(BucketNotPrepared):
        rt.set_input("latent_in", torch.ones(2, 4))
    with pytest.raises(PortDeclarationError):
        rt.prepare("huge")  # not a bucket of the port
    rt.prepare("small")
    rt.set_input("latent_in", torch.ones(2, 4))
    rt.step()
    rt.prepare("large")
    rt.set_input("latent_in", torch.full((4, 8), 2.0))
    rt.prepare("small")  # already prepared: selected, not prepared again
    assert prepared == ["small", "large"] and rt.bucket == "small"
    assert rt.export.buffers["latent"][:32].eq(2.0).all()


@pytest.mark.timeout(60)
def test_setup_ports_and_prepare_are_illegal_inside_step():
    seen = {}

    def step():
        for name, call in (("setup", lambda: rt.set_input("config", 1)),
                           ("prepare", lambda: rt.prepare(None)), ("reenter", rt.step)):
            try:
                call()
            except VerbUnavailable as exc:
                seen[name] = exc.code

    b = _builder().add_port(PortSpec("config", IN, "int64", shape=(), update=SETUP))
    configured = []
    b.set_verbs(Verbs(set_input=lambda p, v: configured.append(v), step=step))
    rt = b.finish()
    rt.set_input("config", 7)  # outside a step: fine
    rt.step()
    assert configured == [7]
    assert seen == {k: "FAILED_PRECONDITION" for k in ("setup", "prepare", "reenter")}


@pytest.mark.timeout(60)
def test_graph_runner_drives_a_model_runtime():
    """The shape the denoiser will take: SWAP latents into GraphRunner static inputs."""
    runner = GraphRunner("dit", use_cuda_graphs=False)
    x_buf, out_holder = torch.zeros(16), {}

    def forward(x):
        return x * 3.0 + 1.0

    def prepare(bucket):
        n = {"a": 8, "b": 16}[bucket]
        out_holder[bucket] = runner.prepare(bucket, forward, {"x": x_buf[:n]})

    b = _builder(dit=runner)
    b.add_buffer("x", x_buf)
    b.add_port(PortSpec("x", IN, "float32", buckets={"a": (8,), "b": (16,)}, update=SWAP, buffer="x"))
    b.add_port(PortSpec("y", OUT, "float32", buckets={"a": (8,), "b": (16,)}, update=STAGED))
    b.set_verbs(Verbs(prepare=prepare, get_output=lambda port: out_holder[rt.bucket]))
    b.add_stage("dit")
    rt = b.finish()
    for bucket, n in (("a", 8), ("b", 16), ("a", 8)):
        rt.prepare(bucket)
        value = torch.randn(n)
        rt.set_input("x", value)
        rt.step()
        assert torch.allclose(rt.get_output("y"), forward(value))
    assert runner.buckets == ("a", "b")


# -- lifetime --------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_export_refcount_and_use_after_release():
    owner = Owner()
    rt = _builder(owner).set_manifest({"k": 1}).finish()
    export = rt.export
    export.retain()
    export.retain()
    assert export.refcount == 3  # the runtime's (adopted from the builder) and two consumers'
    assert export.release() is False and export.release() is False
    assert owner.calls == 0 and export.graphs["denoise"] is not None
    rt.release()  # the runtime drops the last reference on its export
    assert owner.calls == 1 and export.released and rt.released
    for use in (lambda: export.identity, lambda: export.fingerprint, lambda: export.graphs,
                lambda: export.buffers, lambda: export.regions, lambda: export.manifest,
                export.retain, export.release, rt.retain, lambda: rt.prepare()):
        with pytest.raises(ExportReleased) as info:
            use()
        assert isinstance(info.value, FailedPrecondition)
    assert owner.calls == 1


@pytest.mark.timeout(60)
def test_runtime_and_export_lifetime():
    owner = Owner()
    rt = _builder(owner).add_port(LATENT_IN).finish()
    export = rt.export
    export.retain()  # a consumer holding the export beyond the runtime
    rt.set_input("latent_in", torch.ones(64))
    rt.release()
    assert owner.calls == 0 and rt.released and export.refcount == 1
    assert torch.equal(export.buffers["latent"], torch.ones(64))  # still valid while held
    with pytest.raises(ExportReleased):
        rt.set_input("latent_in", torch.ones(64))
    export.release()
    assert owner.calls == 1 and export.released

    integrated_owner = Owner()
    integrated = _builder(integrated_owner).finish()
    integrated.retain()
    integrated.release()
    integrated.release()
    assert integrated_owner.calls == 1 and integrated.released
    with pytest.raises(ExportReleased):
        integrated.prepare()


@pytest.mark.timeout(60)
def test_release_from_many_threads_calls_owner_once():
    owner = Owner()
    export = _builder(owner).finish().export  # the runtime's reference is among the 64 dropped
    for _ in range(63):
        export.retain()
    start = threading.Barrier(8)

    def drop():
        start.wait()
        for _ in range(8):
            export.release()

    threads = [threading.Thread(target=drop) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert owner.calls == 1 and export.released


@pytest.mark.timeout(60)
def test_model_runtime_snapshot_round_trip_and_refusal():
    def build(weights):
        b = RuntimeBuilder(weights_digest=weights, precision="fp32",
                           libraries={"torch": "2.13.0"}, device_arch="cpu:test")
        b.add_graph("denoise", lambda: None).add_buffer("latent", torch.zeros(64))
        b.set_regions(pack_regions([("latent", "float32", (64,))]))
        return b.add_port(LATENT_IN).finish()

    a, other = build("sha256:a"), build("sha256:b")
    a.set_input("latent_in", torch.arange(64.0))
    snap = snapshot({"latent": a.export.buffers["latent"]}, a)
    a.set_input("latent_in", torch.zeros(64))
    restore(snap, a, into={"latent": a.export.buffers["latent"]})
    assert torch.equal(a.export.buffers["latent"], torch.arange(64.0))
    with pytest.raises(FailedPrecondition):
        restore(snap, other, into={"latent": other.export.buffers["latent"]})
    assert int(other.export.buffers["latent"].count_nonzero()) == 0
