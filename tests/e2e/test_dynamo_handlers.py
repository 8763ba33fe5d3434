"""The Dynamo worker's request translation, responses, error table and cancellation, without
processes: a fake FleetClient and a fake Dynamo context (the real ones run in test_dynamo_e2e)."""
from __future__ import annotations

import asyncio
import base64
import threading

import pytest

pytest.importorskip("dynamo.common.backend", reason="needs the dynamo extra (ai-dynamo)")

from dynamo.common.protocols.video_protocol import NvVideosResponse  # noqa: E402
from dynamo.llm import ModelInput  # noqa: E402
from dynamo.llm import exceptions as dx  # noqa: E402
from fastvideo3.client import FleetVideo  # noqa: E402
from fastvideo3.errors import Cancelled, Internal, InvalidRequest, NotFound, ResourceExhausted  # noqa: E402
from fleet.deployment_card import card_for_model  # noqa: E402
from fleet.dynamo.args import parse_args  # noqa: E402
from fleet.dynamo.handlers import (  # noqa: E402
    VideoHandler, VideoJob, frames_for_seconds, to_dynamo_error, translate, video_response,
)
from fleet.dynamo.health_check import canary_payload, canary_request, is_probe  # noqa: E402

pytestmark = pytest.mark.timeout(60)
CARD = card_for_model("wan-tiny")


def _translate(**body):
    return translate({"model": "wan-tiny", "prompt": "a cat", **body}, CARD, served_model_name="videos")


def test_translate_maps_dynamo_fields_to_fleet_parameters():
    job = _translate(size="64x32", seconds=2, response_format="b64_json", user="u1",
                     nvext={"num_inference_steps": 3, "guidance_scale": 4, "seed": 11, "negative_prompt": "blur"})
    assert job.card_id == "wan-tiny" and job.prompt == "a cat" and job.response_format == "b64_json"
    assert job.params == {"width": 64, "height": 32, "num_frames": 33, "num_inference_steps": 3,
                          "guidance_scale": 4.0, "seed": 11, "negative_prompt": "blur", "metadata": {"user": "u1"}}
    assert frames_for_seconds(5, 16) == 81 and frames_for_seconds(1, 24) == 25
    # nvext.num_frames wins over seconds; extra_body fields arrive under media_passthrough
    job = _translate(seconds=4, nvext={"num_frames": 9},
                     extra_args={"media_passthrough": {"sampler": "euler", "slo_class": "batch", "fps": 8}})
    assert job.params["num_frames"] == 9 and job.params["sampler"] == "euler" and job.fps == 8
    # Wan2.2's low-noise guidance passes through under diffusers' name (the fleet checks it against the card)
    assert _translate(nvext={"guidance_scale_2": 3.0}).params == {"guidance_scale_2": 3.0}
    assert _translate().params == {} and _translate().response_format == "url"  # card defaults apply
    assert translate({"model": "videos", "prompt": "x"}, CARD, served_model_name="videos").card_id == "wan-tiny"


@pytest.mark.parametrize("body, field", [
    ({"size": "64by32"}, "size"),
    ({"size": "0x32"}, "size.width"),
    ({"seconds": 0}, "seconds"),
    ({"nvext": {"seed": -1}}, "seed"),
    ({"nvext": {"num_frames": 2**40}}, "num_frames"),
    ({"nvext": {"boundary_ratio": 0.5}}, "nvext.boundary_ratio"),
    ({"input_reference": "data:image/png;base64,AA=="}, "input_reference"),
    ({"output_format": "webm"}, "output_format"),
    ({"extra_args": {"media_passthrough": {"num_frame": 9}}}, "num_frame"),
    ({"extra_args": {"media_passthrough": {"num_frames": True}}}, "num_frames"),
    ({"extra_args": {"media_passthrough": {"sampler": 3}}}, "sampler"),
    ({"prompt": None}, "prompt"),
])
def test_translate_refuses_bad_fields_by_name(body, field):
    with pytest.raises(InvalidRequest) as e:
        _translate(**body)
    assert e.value.field == field
    assert isinstance(to_dynamo_error(e.value), dx.InvalidArgument)


def test_unknown_model_is_not_found():
    with pytest.raises(NotFound) as e:
        translate({"model": "sora", "prompt": "x"}, CARD, served_model_name="videos")
    assert e.value.field == "model" and "wan-tiny" in e.value.limit


def test_error_table():
    bad = InvalidRequest("8 is not of the form 4k+1", field="num_frames", limit="4k+1 in [1, 65]")
    err = to_dynamo_error(bad)
    assert isinstance(err, dx.InvalidArgument)
    assert "num_frames: 8 is not of the form 4k+1 (allowed: 4k+1 in [1, 65])" in str(err)
    assert isinstance(to_dynamo_error(ResourceExhausted("queue full", retry_after_s=2.0)), dx.CannotConnect)
    assert isinstance(to_dynamo_error(Cancelled("gone")), dx.Cancelled)
    assert isinstance(to_dynamo_error(Internal("bug")), dx.Unknown)
    assert isinstance(to_dynamo_error(KeyError("x")), dx.Unknown)


def _video(data: bytes = b"\x00\x00\x00\x20ftypisom") -> FleetVideo:
    return FleetVideo(request_id="r", name="video.mp4", mime_type="video/mp4", data=data, sidecar={})


def test_responses_carry_the_fields_the_frontend_needs(tmp_path):
    job = VideoJob(card_id="wan-tiny", model="wan-tiny", prompt="x", response_format="b64_json", fps=16)
    body = video_response(job, _video(), request_id="dyn-1", elapsed_s=1.25)
    parsed = NvVideosResponse.model_validate(body)
    assert parsed.data[0].output_format == "mp4" and base64.b64decode(parsed.data[0].b64_json) == _video().data
    assert parsed.status == "completed" and parsed.object == "video" and parsed.inference_time_s == 1.25
    url_job = VideoJob(card_id="wan-tiny", model="wan-tiny", prompt="x", response_format="url")
    body = video_response(url_job, _video(), request_id="dyn-2", elapsed_s=1.0, media_dir=str(tmp_path),
                          media_url_base="https://cdn.example/media/")
    assert body["data"][0]["url"] == "https://cdn.example/media/videos/dyn-2.mp4"
    assert (tmp_path / "videos" / "dyn-2.mp4").read_bytes() == _video().data
    body = video_response(url_job, _video(), request_id="dyn-3", elapsed_s=1.0)
    assert body["data"][0]["url"].startswith("data:video/mp4;base64,")


class FakeClient:
    """Blocks in generate until cancelled (or released), like a long request on a fleet."""

    def __init__(self):
        self.cancelled: list[str] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def generate(self, prompt, *, on_event=None, request_id=None, **kw):
        self.started.set()
        while not self.release.wait(0.01):
            on_event(None)  # a progress event; raises once the handler has stopped the request
            if request_id in self.cancelled:
                raise Cancelled("cancelled", request_id=request_id)
        return _video()

    def cancel(self, request_id, reason=""):
        self.cancelled.append(request_id)
        return True


class FakeContext:
    def __init__(self, loop):
        self.gone = loop.create_future()

    def id(self):
        return "ctx-1"

    def async_killed_or_stopped(self):
        return self.gone


async def _start_tiny_job(client):
    """A handler over ``client`` running a tiny job until the client has it: (handler, ctx, job, task)."""
    handler = VideoHandler(client)
    ctx = FakeContext(asyncio.get_running_loop())
    job = VideoJob(card_id="wan-tiny", model="wan-tiny", prompt="x", response_format="b64_json")
    task = asyncio.ensure_future(handler.run(job, ctx))
    await asyncio.to_thread(client.started.wait, 5)
    return handler, ctx, job, task


async def test_client_disconnect_cancels_on_the_fleet():
    client = FakeClient()
    handler, ctx, _, task = await _start_tiny_job(client)
    assert handler.in_flight == 1
    ctx.gone.set_result(True)  # Dynamo: the HTTP client went away
    with pytest.raises(Cancelled):
        await asyncio.wait_for(task, 5)
    assert client.cancelled == ["dyn-ctx-1"] and handler.in_flight == 0


async def test_abort_cancels_once_and_completion_needs_no_cancel():
    client = FakeClient()
    handler, _, job, task = await _start_tiny_job(client)
    await handler.abort("ctx-1")
    await handler.abort("ctx-1")
    with pytest.raises(Cancelled):
        await asyncio.wait_for(task, 5)
    assert client.cancelled == ["dyn-ctx-1"]
    client2 = FakeClient()
    client2.release.set()
    body = await VideoHandler(client2).run(job, FakeContext(asyncio.get_running_loop()))
    assert body["status"] == "completed" and client2.cancelled == []


def test_canary_and_worker_config():
    payload = canary_payload("wan-tiny")
    assert is_probe(payload) and payload["model"] == "wan-tiny"
    lim = CARD.model().limits  # the smallest valid request the card allows
    side = max(lim.min_height, lim.size_multiple)
    assert canary_request(CARD.model()) == dict(num_frames=1, height=side, width=max(lim.min_width, lim.size_multiple),
                                                 num_inference_steps=1, seed=0, guidance_scale=1.0, slo_class="batch")
    args = parse_args(["--scheduler", "127.0.0.1:1", "--discovery-backend", "file", "--event-plane", "zmq"])
    cfg = args.worker_config("wan-tiny")
    assert cfg.endpoint_types == "videos" and cfg.model_input == ModelInput.Text
    assert (cfg.discovery_backend, cfg.request_plane, cfg.event_plane) == ("file", "tcp", "zmq")
    assert cfg.enable_kv_routing is False and cfg.served_model_name == "wan-tiny"


def test_error_keeps_the_fleets_loss_report():
    from fastvideo3.errors import AlreadyExists, Unavailable, loss_report
    lost = Unavailable("denoiser replica denoiser-0 was lost", field="role", details=loss_report(
        retryable=True, resume_from_step=6, role="denoiser", replica="denoiser-0", step_reached=7, checkpoint=True))
    err = to_dynamo_error(lost)
    assert isinstance(err, dx.CannotConnect)
    assert "[retryable=true resume_from_step=6 lost=denoiser/denoiser-0]" in str(err)
    assert isinstance(to_dynamo_error(AlreadyExists("taken", field="request_id")), dx.InvalidArgument)


def test_input_reference_reaches_an_image_to_video_card():
    card = card_for_model("wan2.1-i2v-tiny")
    ref = "data:image/png;base64,iVBORw0KGgo="
    job = translate({"model": "wan2.1-i2v-tiny", "prompt": "a cat", "input_reference": ref}, card)
    assert job.params["image"] == ref  # the scheduler decodes and checks it
    with pytest.raises(InvalidRequest) as e:  # a text-to-video card still refuses it
        _translate(input_reference=ref)
    assert e.value.field == "input_reference"
