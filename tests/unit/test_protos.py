"""The wire contracts: generated code is current, messages round-trip, the RolePool stub works.

Regenerate after editing a .proto with ``python protos/generate.py``.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from fastvideo3.v1 import common_pb2, deployment_pb2, pool_pb2, pool_pb2_grpc, scheduler_pb2, work_pb2

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "protos"


def _load_generator():
    spec = importlib.util.spec_from_file_location("fv3_protos_generate", PROTO_ROOT / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


# --- (a) generated code is current --------------------------------------------------------


@pytest.mark.timeout(60)
def test_committed_generated_code_is_current() -> None:
    problems = gen.check(PROTO_ROOT, REPO_ROOT)
    assert not problems, "stale generated protobuf code; run `python protos/generate.py`:\n" + "\n".join(problems)


@pytest.mark.timeout(60)
def test_generation_is_deterministic(tmp_path: Path) -> None:
    first = gen.generate(PROTO_ROOT, tmp_path / "a")
    second = gen.generate(PROTO_ROOT, tmp_path / "b")
    assert first == second and first
    for rel in first:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def _copy_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A throwaway repository: the protos plus the committed generated files."""
    repo = tmp_path / "repo"
    shutil.copytree(PROTO_ROOT / "fastvideo3", repo / "protos" / "fastvideo3")
    shutil.copytree(REPO_ROOT / "fastvideo3" / "v1", repo / "fastvideo3" / "v1",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return repo / "protos", repo


@pytest.mark.timeout(60)
def test_check_detects_stale_missing_and_extra(tmp_path: Path) -> None:
    proto_root, repo = _copy_tree(tmp_path)
    assert gen.check(proto_root, repo) == []

    work = proto_root / "fastvideo3" / "v1" / "work.proto"
    work.write_text(work.read_text().replace("int32 attempt = 14;", "int32 attempt = 14;\n  int32 added = 15;"))
    (repo / "fastvideo3" / "v1" / "pool_pb2.pyi").unlink()
    (repo / "fastvideo3" / "v1" / "gone_pb2.py").write_text("# left over\n")

    problems = gen.check(proto_root, repo)
    assert "stale: fastvideo3/v1/work_pb2.py" in problems
    assert "missing: fastvideo3/v1/pool_pb2.pyi" in problems
    assert "extra: fastvideo3/v1/gone_pb2.py" in problems
    # Unchanged files are not reported.
    assert not any(p.endswith("common_pb2.py") for p in problems)

    # Write mode repairs all three.
    gen.write(proto_root, repo)
    assert gen.check(proto_root, repo) == []
    assert not (repo / "fastvideo3" / "v1" / "gone_pb2.py").exists()


@pytest.mark.timeout(60)
def test_generate_reports_protoc_errors(tmp_path: Path) -> None:
    proto_root, _ = _copy_tree(tmp_path)
    (proto_root / "fastvideo3" / "v1" / "broken.proto").write_text('syntax = "proto3";\nmessage {\n')
    with pytest.raises(RuntimeError, match="protoc failed"):
        gen.generate(proto_root, tmp_path / "out")


# --- (b) round trips ----------------------------------------------------------------------


def _ref(name: str, pool: str = "denoiser") -> common_pb2.TensorRef:
    return common_pb2.TensorRef(
        owner_pool=pool, buffer_id=f"buf-{name}", dtype="bfloat16",
        shape=[1, 16, 21, 60, 104], nbytes=2 * 16 * 21 * 60 * 104, checksum="xxh64:0123456789abcdef",
        transport=common_pb2.TransportDescriptor(
            backend="nixl", address="agent-denoiser-0", descriptor=b"\x00\x01\xff", attrs={"device": "0"},
        ),
        name=name,
    )


def _roundtrip(msg):
    data = msg.SerializeToString()
    back = type(msg).FromString(data)
    assert back == msg
    assert back.SerializeToString(deterministic=True) == msg.SerializeToString(deterministic=True)
    return back


@pytest.mark.timeout(60)
def test_work_unit_and_step_result_roundtrip() -> None:
    params = {"t": 999.0, "sigma": 0.9973, "guidance_scale": 5.0, "seed": 2**63 - 1}
    unit = work_pb2.WorkUnit(
        unit_id="u-7", request_id="req-1", loop_id="denoise", kind="diffusion_step", card_id="wan2.1-t2v-1.3b",
        shape_sig=common_pb2.ShapeSignature(key="diffusion_step|81x480x832|t512|bf16|cfg2|patch=1x2x2"),
        resources=common_pb2.Resources(gpu_seconds=0.41, resident_bytes=1 << 22, peak_bytes=3 << 30),
        input_refs=[_ref("prompt_embeds", "encoder"), _ref("latents")],
        params_json=json.dumps(params).encode(), deadline_unix_ms=1_900_000_000_000,
        trace_context={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        step_index=3, attempt=1,
    )
    back = _roundtrip(unit)
    assert json.loads(back.params_json) == params  # exact, including the 64-bit int
    assert [r.name for r in back.input_refs] == ["prompt_embeds", "latents"]
    assert back.input_refs[0].transport.descriptor == b"\x00\x01\xff"

    failed = work_pb2.StepResult(
        unit_id="u-7", request_id="req-1", ok=False,
        error=common_pb2.Error(code=common_pb2.Error.ABORTED, message="non-finite latents", step=3,
                               request_id="req-1", details={"first_nan": "block.12"}),
        output_refs=[_ref("latents")], metrics={"latent_norm": float("inf")}, flags=["nan"],
        measured_seconds=0.38, payload_json=b'{"x":1}', inline_data=b"\x00" * 8, replica_id="denoiser-0",
    )
    back = _roundtrip(failed)
    assert back.error.HasField("step") and not back.error.HasField("retry_after_s")


@pytest.mark.timeout(60)
def test_error_codes_mirror_core_errors() -> None:
    from fastvideo3 import errors  # imported here so the other contract tests do not depend on it

    core_codes = {cls.code for cls in errors._BY_CODE.values()}
    wire_codes = set(common_pb2.Error.Code.keys()) - {"UNSPECIFIED"}
    assert wire_codes == core_codes
    for code in wire_codes:  # names are gRPC status names too
        assert grpc.StatusCode[code].name == code

    core = errors.ResourceExhausted("queue full", field="queue", limit="64", retry_after_s=2.5, step=0)
    info = errors.ErrorInfo.of(core)
    wire = common_pb2.Error(code=common_pb2.Error.Code.Value(info.code), message=info.message,
                            field=info.field or "", limit=info.limit or "",
                            retry_after_s=info.retry_after_s, step=info.step)
    back = common_pb2.Error.FromString(wire.SerializeToString())
    rebuilt = errors.from_code(common_pb2.Error.Code.Name(back.code), back.message, field=back.field,
                               limit=back.limit, retry_after_s=back.retry_after_s, step=back.step)
    assert isinstance(rebuilt, errors.ResourceExhausted)
    assert rebuilt.one_line() == core.one_line()


@pytest.mark.timeout(60)
def test_generate_request_optional_fields() -> None:
    full = scheduler_pb2.GenerateRequest(
        request_id="req-1", model="wan2.1-t2v-1.3b", prompt="a cat surfing", negative_prompt="",
        num_frames=81, height=480, width=832, num_inference_steps=50, guidance_scale=5.0,
        seed=2**64 - 1, flow_shift=3.0, sampler="unipc", fps=16, output_format="mp4", slo_class="interactive",
        deadline_s=120.0, reward_scorers=["aesthetic", "clip"], previews=True, capture_behavior=True,
        metadata={"user": "u1"},
    )
    back = _roundtrip(full)
    # Explicitly-set empty negative prompt is distinguishable from "use the card default".
    assert back.HasField("negative_prompt") and back.negative_prompt == ""
    assert back.seed == 2**64 - 1

    minimal = _roundtrip(scheduler_pb2.GenerateRequest(prompt="a cat"))
    for name in ("negative_prompt", "num_frames", "height", "width", "num_inference_steps",
                 "guidance_scale", "seed", "flow_shift", "sampler", "fps", "deadline_s"):
        assert not minimal.HasField(name), name


@pytest.mark.timeout(60)
def test_generate_event_stream_roundtrip() -> None:
    state = scheduler_pb2.RequestStatus
    events = [
        scheduler_pb2.GenerateEvent(accepted=scheduler_pb2.Accepted(
            card_id="tiny", program="t2v", seed=42, num_inference_steps=4, predicted_gpu_seconds=1.5,
            resolved_params_json=b'{"num_frames": 9}')),
        scheduler_pb2.GenerateEvent(queued=scheduler_pb2.Queued(position=2, estimated_wait_s=3.0)),
        scheduler_pb2.GenerateEvent(progress=scheduler_pb2.Progress(
            step=1, total=4, phase="denoise", elapsed_s=0.2, metrics={"latent_norm": 1.0})),
        scheduler_pb2.GenerateEvent(preview=scheduler_pb2.Preview(step=1, mime_type="image/png", data=b"png")),
        scheduler_pb2.GenerateEvent(artifact=scheduler_pb2.Artifact(
            name="video.mp4", mime_type="video/mp4", chunk_index=0, last=False, data=b"a" * 10,
            total_bytes=20, sidecar_json=b'{"seed": 42}')),
        scheduler_pb2.GenerateEvent(artifact=scheduler_pb2.Artifact(
            name="video.mp4", mime_type="video/mp4", chunk_index=1, last=True, data=b"b" * 10,
            checksum="sha256:00")),
        scheduler_pb2.GenerateEvent(error=scheduler_pb2.ErrorEvent(error=common_pb2.Error(
            code=common_pb2.Error.CANCELLED, message="cancelled by client"))),
        scheduler_pb2.GenerateEvent(finished=scheduler_pb2.Finished(
            state=state.CANCELLED, timings={"total": 2.0}, rewards={"aesthetic": 5.5}, gpu_seconds=1.2)),
    ]
    kinds = []
    for seq, event in enumerate(events):
        event.request_id, event.seq, event.time_unix_ms = "req-1", seq, 1_700_000_000_000 + seq
        back = _roundtrip(event)
        kinds.append(back.WhichOneof("event"))
        assert back.seq == seq
    assert kinds == ["accepted", "queued", "progress", "preview", "artifact", "artifact", "error", "finished"]
    assert state.State.Name(events[-1].finished.state) == "CANCELLED"

    status = _roundtrip(scheduler_pb2.RequestStatus(
        request_id="req-1", state=state.FAILED, card_id="tiny", phase="denoise", step=3, total=4,
        error=common_pb2.Error(code=common_pb2.Error.ABORTED, message="nan"), last_seq=7))
    assert status.state == state.FAILED


def _deployment_card() -> deployment_pb2.DeploymentCard:
    return deployment_pb2.DeploymentCard(
        engine_id="fastvideo3/test", version="0.1.0", schema_version="1", default_model="tiny",
        models=[deployment_pb2.ModelCardSummary(
            card_id="tiny", family="tiny", capabilities=["t2v"], recipe="base-4step", precision="float32",
            runtime_fingerprint="fnv1a64:00112233445566ff",
            limits=deployment_pb2.RequestLimits(
                min_frames=1, max_frames=17, frames_multiple=4, frames_offset=1, min_height=16, max_height=64,
                min_width=16, max_width=64, size_multiple=16, min_steps=1, max_steps=8,
                min_guidance_scale=1.0, max_guidance_scale=10.0, max_prompt_tokens=32,
                samplers=["euler"], output_formats=["mp4", "npy"]),
            defaults=deployment_pb2.RequestDefaults(
                num_frames=9, height=32, width=32, num_inference_steps=4, guidance_scale=3.0,
                flow_shift=1.0, sampler="euler", fps=8),
        )],
        capability_matrix=[deployment_pb2.CapabilityCell(card_id="tiny", capability="t2v", level="supported")],
        role_pools=[deployment_pb2.RolePoolSpec(
            role="denoiser", replicas=2, card_ids=["tiny"], kinds=["diffusion_step"], max_batch_units=8,
            transport_backends=["shm", "grpc"], parallel_plan="single",
            device=deployment_pb2.DeviceNeeds(gpus=1, gpu_memory_bytes=80 << 30, host_memory_bytes=16 << 30,
                                              accelerator="cuda"))],
        programs=[deployment_pb2.ProgramSpec(
            name="t2v", loops=["text_encode", "diffusion_denoise", "vae_decode"], card_ids=["tiny"])],
        parallel_plans=[deployment_pb2.ParallelPlan(name="single", role="denoiser", degrees={"tp": 1}, gpus=1)],
        cost_model=deployment_pb2.CostModelSpec(version="3", unit="gpu_seconds",
                                                cost_model_json=b'{"diffusion_step": {"a": 1e-9}}'),
        health=deployment_pb2.HealthSchema(protocol="grpc.health.v1", services=["", "fastvideo3.v1.RolePool"],
                                           check_interval_s=2.0, unhealthy_after_s=10.0,
                                           metrics={"units_executed": "units run since start"}),
        slo_classes=[deployment_pb2.SloClass(
            name="interactive", priority=10, target_queue_s=1.0, target_latency_p50_s=20.0,
            target_latency_p95_s=60.0, gpu_seconds_budget=120.0, max_concurrent_requests=4)],
        transfer_endpoints=[deployment_pb2.RoleEndpoints(role="denoiser", endpoints=[
            common_pb2.TransferEndpoint(backend="grpc", address="127.0.0.1:50052", replica_id="denoiser-0")])],
        created_unix_ms=1_700_000_000_000, labels={"env": "test"},
    )


@pytest.mark.timeout(60)
def test_deployment_card_roundtrip() -> None:
    card = _deployment_card()
    back = _roundtrip(card)
    assert back.models[0].limits.frames_multiple == 4
    assert back.parallel_plans[0].degrees["tp"] == 1
    described = _roundtrip(scheduler_pb2.SchedulerDescription(
        card=card, queued_requests=1, running_requests=2, budget_gpu_seconds=100.0,
        load=scheduler_pb2.LoadReport(admission=True, admission_reserved_gpu_seconds=12.5),
        pools=[scheduler_pb2.PoolStatus(role="denoiser", replica_id="denoiser-0", address="127.0.0.1:1",
                                        healthy=True, in_flight_units=3)]))
    assert described.card == card


# --- (c) the RolePool stub over a real loopback gRPC server -------------------------------


class _EchoPool(pool_pb2_grpc.RolePoolServicer):
    """Trivial pool: doubles a number from params_json; a unit of unknown kind fails alone."""

    def Describe(self, request, context):
        return pool_pb2.PoolDescription(
            role="denoiser", card_ids=["tiny"], replica_id="denoiser-0", runtime_fingerprint="fnv1a64:0",
            kinds=["diffusion_step"], transport_backends=["grpc"], counters={"units_executed": 0.0})

    def Execute(self, request, context):
        results = []
        for unit in request.units:
            result = work_pb2.StepResult(unit_id=unit.unit_id, request_id=unit.request_id,
                                         replica_id="denoiser-0")
            if unit.kind != "diffusion_step":
                result.error.CopyFrom(common_pb2.Error(
                    code=common_pb2.Error.INVALID_ARGUMENT, message="unsupported kind", field="kind",
                    limit="diffusion_step", request_id=unit.request_id))
            else:
                x = json.loads(unit.params_json)["x"]
                result.ok = True
                result.metrics["y"] = 2.0 * x
                result.output_refs.add(owner_pool="denoiser", buffer_id=f"{unit.unit_id}-out", name="latents")
            results.append(result)
        return pool_pb2.ExecuteResponse(results=results, batch_id=request.batch_id, replica_id="denoiser-0")

    def Release(self, request, context):
        context.abort(grpc.StatusCode.NOT_FOUND, f"unknown request {request.request_id}")


@pytest.fixture
def pool_stub():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pool_pb2_grpc.add_RolePoolServicer_to_server(_EchoPool(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    server.start()
    # Loopback only: never route through a proxy configured in the environment.
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.enable_http_proxy", 0)])
    try:
        grpc.channel_ready_future(channel).result(timeout=20)
        yield pool_pb2_grpc.RolePoolStub(channel)
    finally:
        channel.close()
        server.stop(grace=None).wait(timeout=10)


@pytest.mark.timeout(60)
def test_role_pool_over_grpc(pool_stub) -> None:
    desc = pool_stub.Describe(pool_pb2.DescribePoolRequest(), timeout=10)
    assert desc.role == "denoiser" and list(desc.card_ids) == ["tiny"]

    units = [
        work_pb2.WorkUnit(unit_id=f"u{i}", request_id=f"req-{i}", loop_id="denoise", kind="diffusion_step",
                          params_json=json.dumps({"x": i}).encode())
        for i in range(3)
    ]
    units.append(work_pb2.WorkUnit(unit_id="u-bad", request_id="req-bad", kind="vae_tile"))
    response = pool_stub.Execute(pool_pb2.ExecuteRequest(units=units, batch_id="b1"), timeout=10)

    assert response.batch_id == "b1"
    assert [r.unit_id for r in response.results] == ["u0", "u1", "u2", "u-bad"]
    assert [r.metrics["y"] for r in response.results[:3]] == [0.0, 2.0, 4.0]
    assert all(r.ok for r in response.results[:3])
    bad = response.results[3]
    assert not bad.ok and common_pb2.Error.Code.Name(bad.error.code) == "INVALID_ARGUMENT"
    assert bad.error.field == "kind"

    with pytest.raises(grpc.RpcError) as info:
        pool_stub.Release(pool_pb2.ReleaseRequest(request_id="nope"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND

    # Methods the servicer does not override answer UNIMPLEMENTED, not a hang.
    with pytest.raises(grpc.RpcError) as info:
        pool_stub.Snapshot(pool_pb2.SnapshotRequest(request_id="req-0"), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
