"""The service edge: core <-> wire converters round-trip, and the one error-mapping table
(typed error -> gRPC status + trailer -> the same typed error on the client)."""
from __future__ import annotations

import dataclasses
from concurrent import futures

import grpc
import pytest

from fastvideo3 import errors as E
from fastvideo3.client import error_from_rpc
from fastvideo3.errors import ErrorInfo
from fastvideo3.loop.protocol import Resources, StepResult
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.transport.ref import TensorRef
from fastvideo3.v1 import common_pb2, pool_pb2, pool_pb2_grpc
from services.common import convert
from services.common.errors import STATUS_BY_CODE, abort, status_of

pytestmark = pytest.mark.timeout(60)

REF = TensorRef(owner="encoder-0", buffer_id="r1/prompt_embeds#3", dtype="float32", shape=(1, 64, 32), nbytes=8192,
                checksum="xxh64:00ff", backend="shm", descriptor={"segment": "fv3-x-1", "generation": 7})


def test_tensor_ref_round_trips_exactly_with_int_descriptor_values():
    name, back = convert.ref_from_wire(convert.ref_to_wire("prompt_embeds", REF))
    assert name == "prompt_embeds" and back == REF
    assert isinstance(back.descriptor["generation"], int)
    grpc_ref = dataclasses.replace(REF, backend="grpc", descriptor={"address": "127.0.0.1:5"})
    wire = convert.ref_to_wire("latents", grpc_ref)
    assert wire.transport.address == "127.0.0.1:5" and convert.ref_from_wire(wire)[1] == grpc_ref


@pytest.mark.parametrize("step,total", [(3, 8), (None, None), (0, 1)])
def test_work_unit_round_trips(step, total):
    unit = WorkUnit(unit_id="u7", request_id="r1", loop_id="diffusion_denoise", kind="diffusion_step", role="denoiser",
                    card_id="wan-tiny", shape_sig="diffusion_step|wan-tiny|16x3x8x8|fp32|batched",
                    params={"step": 3, "timestep": 999.0001220703125, "sigmas": [1.0, 0.5, 0.1 + 0.2, 0.0],
                            "final": False, "nested": {"a": [1, 2]}},
                    inputs={"prompt_embeds": REF}, resources=Resources(0.25, 1024, 4096),
                    deadline_unix=1_900_000_000.123, step=step, total=total, trace={"traceparent": "00-abc"})
    wire = convert.unit_to_wire(unit, output_transport="grpc")
    assert wire.output_transport == "grpc" and wire.shape_sig.key == unit.shape_sig
    back = convert.unit_from_wire(work_roundtrip(wire))
    assert back.deadline_unix == pytest.approx(unit.deadline_unix, abs=1e-3)
    back.deadline_unix = unit.deadline_unix
    assert back == unit  # params floats round-trip exactly through JSON


def work_roundtrip(msg):
    return type(msg).FromString(msg.SerializeToString())


def test_step_result_round_trips_with_inline_bytes_and_error():
    ok = StepResult("u1", "r1", outputs={"latents": REF}, metrics={"latent_norm": 3.25},
                    payload={"frames_shape": [9, 64, 64, 3]}, measured_seconds=0.5, inline=b"\x00mp4-bytes")
    assert convert.result_from_wire(work_roundtrip(convert.result_to_wire(ok, "denoiser-0"))) == ok
    info = ErrorInfo("ABORTED", "latents became non-finite", field="latents", limit="finite", step=4,
                     retry_after_s=None, details={"k": "v"})
    bad = StepResult("u2", "r2", ok=False, error=info)
    assert convert.result_from_wire(work_roundtrip(convert.result_to_wire(bad))) == bad


def test_error_info_round_trips_for_every_code():
    for code in STATUS_BY_CODE:
        info = ErrorInfo(code, "m", field="f", limit="l", step=0, retry_after_s=1.5, details={"a": "b"})
        assert convert.error_from_wire(convert.error_to_wire(info)) == info
    none = ErrorInfo("INTERNAL", "m")
    assert convert.error_from_wire(convert.error_to_wire(none)) == none


def test_the_table_maps_every_core_error_class_to_its_status():
    classes = [E.InvalidRequest, E.FailedPrecondition, E.RecipeMismatch, E.CardError, E.NotFound, E.ResourceExhausted,
               E.Cancelled, E.Unavailable, E.DataLoss, E.DeadlineExceeded, E.NumericFault, E.Internal, E.Unauthenticated]
    for cls in classes:
        assert status_of(cls("x")) == grpc.StatusCode[cls.code], cls
        assert common_pb2.Error.Code.Value(cls.code) > 0
    assert status_of(ValueError("not typed")) == grpc.StatusCode.INTERNAL
    assert set(STATUS_BY_CODE) == set(common_pb2.Error.Code.keys()) - {"UNSPECIFIED"}


class _Failing(pool_pb2_grpc.RolePoolServicer):
    def __init__(self, exc):
        self.exc = exc

    def Describe(self, request, context):  # noqa: N802
        abort(context, self.exc)


@pytest.mark.parametrize("exc", [
    E.InvalidRequest("99 is out of range", field="num_frames", limit="[1, 65]"),
    E.ResourceExhausted("queue is full", field="queue", limit="256", retry_after_s=2.0),
    E.RecipeMismatch("assumes 4 steps", field="num_inference_steps", limit="4"),
    E.NumericFault("nan", step=3),
    RuntimeError("a bug"),
])
def test_a_typed_error_crosses_grpc_and_comes_back_typed(exc):
    server = grpc.server(futures.ThreadPoolExecutor(2))
    pool_pb2_grpc.add_RolePoolServicer_to_server(_Failing(exc), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.RpcError) as err:
                pool_pb2_grpc.RolePoolStub(ch).Describe(pool_pb2.DescribePoolRequest(), timeout=5)
    finally:
        server.stop(None)
    assert err.value.code() == status_of(exc)
    back = error_from_rpc(err.value)
    if isinstance(exc, E.FastVideoError):
        assert type(back).code == exc.code and back.field == exc.field and back.limit == exc.limit
        assert back.retry_after_s == exc.retry_after_s and back.step == exc.step
        assert (exc.field or exc.message) in err.value.details()
    else:
        assert isinstance(back, E.Internal) and "a bug" in back.message
