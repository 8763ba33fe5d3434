"""The gateway without a fleet: request parsing, the error table, auth, body and concurrency
limits, media expiry and list pages, against a fake scheduler stub (no processes, no sockets)."""
from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import grpc
import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx2")

from fastvideo3.client import ERROR_TRAILER, FleetClient  # noqa: E402
from fastvideo3.errors import ResourceExhausted, Unavailable  # noqa: E402
from fastvideo3.v1 import scheduler_pb2  # noqa: E402
from fleet.gateway.app import Gateway  # noqa: E402
from fleet.gateway.config import GatewayConfig  # noqa: E402
from fleet.gateway.errors import ApiError, from_fleet  # noqa: E402
from fleet.gateway.jobs import JobStore  # noqa: E402
from fleet.gateway.media import MediaStore  # noqa: E402
from fleet.gateway.params import ModelInfo, frames_for_seconds, nest_form, parse_create  # noqa: E402

MODELS = {"wan-tiny": ModelInfo(id="wan-tiny", fps=16, default_frames=33, max_frames=65)}


# -- parsing -----------------------------------------------------------------------------------
def test_seconds_become_4k_plus_1_frames_at_the_cards_fps():
    assert [frames_for_seconds(s, 16) for s in (0.25, 0.5, 1, 2, 4)] == [5, 9, 17, 33, 65]
    spec = parse_create({"prompt": "a", "seconds": "2", "size": "64x32"}, MODELS, "wan-tiny")
    assert spec.params["num_frames"] == 33 and (spec.params["width"], spec.params["height"]) == (64, 32)
    assert spec.seconds == "2" and isinstance(spec.params["seed"], int)  # a seed is always drawn here


def test_multipart_fields_nest_like_the_sdk_sends_extra_body():
    body = nest_form([("prompt", "a"), ("fastvideo3[steps]", "4"), ("fastvideo3[guidance]", "1.5"),
                      ("fastvideo3[frames]", "9")])
    spec = parse_create(body, MODELS, "wan-tiny")
    assert spec.params["num_inference_steps"] == 4 and spec.params["guidance_scale"] == 1.5
    two = nest_form([("prompt", "a"), ("fastvideo3[guidance_2]", "3")])
    assert parse_create(two, MODELS, "wan-tiny").params["guidance_scale_2"] == 3.0
    assert spec.params["num_frames"] == 9 and spec.frames_given


@pytest.mark.parametrize("body,param,status", [
    ({"prompt": "a", "size": "big"}, "size", 400),
    ({"prompt": "a", "size": 64}, "size", 400),
    ({"prompt": 5}, "prompt", 400),
    ({}, "prompt", 400),
    ({"prompt": "a", "model": "x"}, "model", 404),
    ({"prompt": "a", "seconds": "-1"}, "seconds", 400),
    ({"prompt": "a", "seconds": "5"}, "seconds", 400),           # 81 frames > the card's 65
    ({"prompt": "a", "fastvideo3": {"steps": 1.5}}, "fastvideo3.steps", 400),
    ({"prompt": "a", "fastvideo3": {"seed": -1}}, "fastvideo3.seed", 400),
    ({"prompt": "a", "fastvideo3": {"guidance": "nan"}}, "fastvideo3.guidance", 400),
    ({"prompt": "a", "fastvideo3": "steps=4"}, "fastvideo3", 400),
    ({"prompt": "a", "quality": "high"}, "quality", 400),
    ({"prompt": "a", "input_reference": b"png"}, "input_reference", 400),
])
def test_bad_bodies_name_the_param(body, param, status):
    with pytest.raises(ApiError) as e:
        parse_create(body, MODELS, "wan-tiny")
    assert (e.value.status, e.value.param) == (status, param)
    assert e.value.message.startswith(param)


def test_fleet_errors_map_to_openai_statuses():
    e = from_fleet(ResourceExhausted("queue is full (256 waiting)", field="queue", limit="256", retry_after_s=2.5))
    assert e.status == 429 and e.headers["Retry-After"] == "3" and "256" in e.message
    e = from_fleet(Unavailable("scheduler is draining"))
    assert e.status == 503 and "scheduler is draining" in e.message and e.body()["error"]["type"]


# -- the app against a fake scheduler ----------------------------------------------------------------
class FakeRpcError(grpc.RpcError):
    def __init__(self, err):
        self._err = err

    def code(self):
        return getattr(grpc.StatusCode, self._err.code)

    def details(self):
        return self._err.message

    def trailing_metadata(self):
        return [(ERROR_TRAILER, json.dumps(self._err.to_dict()))]


class FakeCall:
    def __init__(self, msgs, block: threading.Event | None = None, error=None):
        self._msgs, self._block, self._error = list(msgs), block, error

    def __iter__(self):
        return self

    def __next__(self):
        if self._error is not None:
            raise FakeRpcError(self._error)
        if self._msgs:
            return self._msgs.pop(0)
        if self._block is not None:
            self._block.wait(10)
        raise StopIteration

    def cancel(self):
        pass


class FakeStub:
    def __init__(self):
        self.error = None
        self.block: threading.Event | None = None
        self.requests = []
        self.script: list[FakeCall] = []  # calls to answer in order, before the default one

    def Generate(self, msg, timeout=None):  # noqa: N802 - gRPC naming
        self.requests.append(msg)
        if self.script:
            return self.script.pop(0)
        accepted = scheduler_pb2.GenerateEvent(request_id=msg.request_id, seq=0, accepted=scheduler_pb2.Accepted(
            card_id="wan-tiny", seed=msg.seed, num_inference_steps=2, resolved_params_json=b'{"num_frames": 9}'))
        return FakeCall([accepted], block=self.block, error=self.error)


class FakeFleet(FleetClient):
    def __init__(self):  # no channel: FleetClient.request builds messages, the stub is fake
        self.stub = FakeStub()
        self.rpc_timeout_s = 1.0

    def describe(self):
        return {"card": {"default_model": "wan-tiny", "models": [
            {"card_id": "wan-tiny", "limits": {"max_frames": 65}, "defaults": {"fps": 16, "num_frames": 33}}]}}

    def cancel(self, request_id, reason=""):
        return True


def _gateway(tmp_path, **kw) -> Gateway:
    cfg = GatewayConfig(media_dir=str(tmp_path / "media"), accept_timeout_s=5.0, **kw)
    return Gateway(cfg, client=FakeFleet())


async def _client(gw: Gateway):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gw.app), base_url="http://gw")


async def test_bearer_auth_when_keys_are_configured(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# comment\nsk-one\nsk-two\n")
    gw = _gateway(tmp_path, api_keys_file=str(keys))
    async with await _client(gw) as c:
        r = await c.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer sk-nope"})).status_code == 401
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer sk-two"})).status_code == 200
        assert (await c.get("/healthz")).status_code == 200 and (await c.get("/")).status_code == 200
        r = await c.post("/v1/videos", json={"prompt": "a"}, headers={"Authorization": "Bearer sk-one"})
        assert r.status_code == 200, r.text
        vid = r.json()["id"]
        other = await c.get(f"/v1/videos/{vid}", headers={"Authorization": "Bearer sk-two"})
        assert other.status_code == 404  # one key never sees another's jobs


async def test_resource_exhausted_is_429_with_retry_after_and_leaves_no_job(tmp_path):
    gw = _gateway(tmp_path)
    gw.client.stub.error = ResourceExhausted("queue is full (256 waiting)", field="queue", limit="256",
                                             retry_after_s=4.2)
    async with await _client(gw) as c:
        r = await c.post("/v1/videos", json={"prompt": "a"})
        assert r.status_code == 429 and r.headers["retry-after"] == "5", r.text
        assert r.json()["error"]["type"] == "rate_limit_error" and "256" in r.json()["error"]["message"]
        assert (await c.get("/v1/videos")).json()["data"] == []


async def test_unavailable_fleet_is_503_with_its_reason(tmp_path):
    gw = _gateway(tmp_path)
    gw.client.stub.error = Unavailable("the scheduler is draining (SIGTERM)")
    async with await _client(gw) as c:
        r = await c.post("/v1/videos", json={"prompt": "a"})
        assert r.status_code == 503 and "draining" in r.json()["error"]["message"], r.text


async def test_body_size_and_per_key_concurrency_limits(tmp_path):
    gw = _gateway(tmp_path, max_body_bytes=2048, max_jobs_per_key=1)
    gw.client.stub.block = threading.Event()  # jobs stay running
    try:
        async with await _client(gw) as c:
            r = await c.post("/v1/videos", json={"prompt": "x" * 4096})
            assert r.status_code == 413 and "2048" in r.json()["error"]["message"]
            assert (await c.post("/v1/videos", json={"prompt": "first"})).status_code == 200
            r = await c.post("/v1/videos", json={"prompt": "second"})
            assert r.status_code == 429 and r.headers["retry-after"] == "1" and "1 at once" in r.text
    finally:
        gw.client.stub.block.set()


async def test_a_lost_stream_is_reattached_and_the_job_completes(tmp_path):
    import hashlib
    gw = _gateway(tmp_path)
    video = b"an mp4 in all but name"

    def ev(seq, **kw):
        return scheduler_pb2.GenerateEvent(request_id="x", seq=seq, **kw)
    accepted = ev(0, accepted=scheduler_pb2.Accepted(card_id="wan-tiny", seed=1, num_inference_steps=4,
                                                        resolved_params_json=b'{"num_frames": 9}'))
    progress = ev(1, progress=scheduler_pb2.Progress(phase="denoise", step=2, total=4))

    class Broken(FakeCall):  # accepted and one step, then the scheduler goes away
        def __next__(self):
            if self._msgs:
                return self._msgs.pop(0)
            raise FakeRpcError(Unavailable("scheduler restarting"))

    gw.client.stub.script = [
        Broken([accepted, progress]),
        FakeCall([ev(0, accepted=scheduler_pb2.Accepted(card_id="wan-tiny")),
                  ev(5, artifact=scheduler_pb2.Artifact(name="video.mp4", mime_type="video/mp4", chunk_index=0,
                                                        last=True, data=video,
                                                        checksum="sha256:" + hashlib.sha256(video).hexdigest())),
                  ev(6, finished=scheduler_pb2.Finished(state=scheduler_pb2.RequestStatus.SUCCEEDED))]),
    ]
    async with await _client(gw) as c:
        vid = (await c.post("/v1/videos", json={"prompt": "a"})).json()["id"]
        deadline = time.monotonic() + 30
        while (job := (await c.get(f"/v1/videos/{vid}")).json())["status"] not in ("completed", "failed"):
            assert time.monotonic() < deadline, job
            await asyncio.sleep(0.05)
        assert job["status"] == "completed" and job["progress"] == 100, job
        assert (await c.get(f"/v1/videos/{vid}/content")).content == video
    second = gw.client.stub.requests[1]
    assert second.request_id == vid and second.detached and second.seed == gw.client.stub.requests[0].seed


def test_a_job_another_gateway_follows_is_left_to_it(tmp_path):
    from fastvideo3.errors import InvalidRequest
    gw = _gateway(tmp_path)
    refused = InvalidRequest("a client is already attached to this request", field="request_id")
    gw.client.stub.script = [FakeCall([], error=refused) for _ in range(100)]
    spec = parse_create({"prompt": "a"}, MODELS, "wan-tiny")
    job = {"id": "video_elsewhere", "owner": "", "status": "in_progress", "progress": 40, "created_at_ms": 1,
           "spec": spec.public()}
    gw.jobs.create(job)
    assert gw.runner.resume(window_s=0.3) == ["video_elsewhere"]
    from tests.fleet_fixture import wait_until
    wait_until(lambda: not gw.runner.active(), 10.0, "the re-attach to give up")
    assert gw.jobs.get("video_elsewhere")["status"] == "in_progress"  # not failed: someone else follows it
    assert gw.jobs.inflight() == ["video_elsewhere"] and len(gw.client.stub.requests) >= 2  # it retried


# -- stores ------------------------------------------------------------------------------------
def test_media_expires_after_its_ttl(tmp_path):
    media = MediaStore(tmp_path, ttl_s=60)
    (tmp_path / "video_old").mkdir()
    (tmp_path / "video_new").mkdir()
    old = time.time() - 120
    os.utime(tmp_path / "video_old", (old, old))
    assert media.sweep() == ["video_old"] and (tmp_path / "video_new").is_dir()


def test_job_pages_follow_creation_order():
    jobs = JobStore(None)
    for i in range(5):
        jobs.create({"id": f"video_{i}", "created_at_ms": 1000 + i, "status": "queued"})
    page, more = jobs.page(after=None, limit=2, descending=True, visible=lambda j: True)
    assert [j["id"] for j in page] == ["video_4", "video_3"] and more
    page, more = jobs.page(after="video_3", limit=5, descending=True, visible=lambda j: True)
    assert [j["id"] for j in page] == ["video_2", "video_1", "video_0"] and not more
    assert jobs.page(after="nope", limit=2, descending=True, visible=lambda j: True) is None
    jobs.delete("video_2")
    page, _ = jobs.page(after=None, limit=10, descending=False, visible=lambda j: True)
    assert [j["id"] for j in page] == ["video_0", "video_1", "video_3", "video_4"]


def test_input_reference_goes_to_an_image_to_video_card_as_base64():
    import base64
    from fleet.gateway.params import ModelInfo
    models = {"i2v": ModelInfo(id="i2v", image_to_video=True), **MODELS}
    spec = parse_create({"prompt": "a", "model": "i2v", "input_reference": b"\x89PNG..."}, models, "wan-tiny")
    assert base64.b64decode(spec.params["image"]) == b"\x89PNG..."
    assert spec.from_public(spec.public()).params["image"] == spec.params["image"]  # the record is JSON
    url = parse_create({"prompt": "a", "model": "i2v", "input_reference": "https://x/y.png"}, models, "wan-tiny")
    assert url.params["image"] == "https://x/y.png"
    with pytest.raises(ApiError) as e:  # a text-to-video card still refuses it
        parse_create({"prompt": "a", "input_reference": b"png"}, models, "wan-tiny")
    assert e.value.param == "input_reference"
