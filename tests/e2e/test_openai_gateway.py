"""The official ``openai`` SDK, unmodified, against ``fastvideo3 serve --gateway-port``.

One real fleet for the module (``serve`` with a real redis-server as the state store, see
conftest.py): create_and_poll -> completed; download_content -> an H.264 mp4 with the frames and
size asked for; retrieve / list (cursor pages) / delete (a running job ends CANCELLED in the fleet
and its buffers are freed); bad inputs -> 400/404 in OpenAI's error shape naming ``param``; and a
gateway SIGKILLed mid-job comes back (``serve`` restarts it) with the job retrievable and completing.
"""
from __future__ import annotations

import io
import os
import signal
import time
import warnings

import httpx2 as httpx
import pytest

openai = pytest.importorskip("openai")

from fastvideo3.client import FleetClient  # noqa: E402
from fastvideo3.media import probe_video  # noqa: E402
from tests.fleet_fixture import pool_describe, wait_until  # noqa: E402

pytestmark = [pytest.mark.timeout(360), pytest.mark.filterwarnings("ignore::DeprecationWarning")]
warnings.filterwarnings("ignore", category=DeprecationWarning)  # the SDK marks its video methods deprecated
MODEL = "wan-tiny"
SMALL = {"fastvideo3": {"steps": 2, "seed": 7}}
JOB_DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def client(gateway_stack):
    with openai.OpenAI(base_url=gateway_stack.url + "/v1", api_key="unused-locally", max_retries=0,
                       timeout=60.0) as c:
        yield c


def wait_status(client, video_id: str, statuses: tuple[str, ...], timeout_s: float = JOB_DEADLINE_S, pred=None):
    def check():
        v = client.videos.retrieve(video_id)
        return v if v.status in statuses and (pred is None or pred(v)) else None
    return wait_until(check, timeout_s, f"{video_id} to reach {statuses}", interval_s=0.1)


def test_create_and_poll_then_download_h264(client, gateway_stack, tmp_path):
    video = client.videos.create_and_poll(model=MODEL, prompt="a red circle moving left", seconds="1",
                                          size="64x32", extra_body={"fastvideo3": {"steps": 3, "seed": 5}},
                                          poll_interval_ms=100)
    assert video.status == "completed", video
    assert (video.progress, video.model, video.size, video.seconds) == (100, MODEL, "64x32", "1")
    assert video.completed_at >= video.created_at > 0 and video.expires_at > video.completed_at
    assert video.error is None

    out = tmp_path / "v.mp4"
    client.videos.download_content(video.id).write_to_file(out)
    info = probe_video(out)
    # 1 s at the card's 16 fps -> the 4k+1 frame count 17
    assert (info["codec"], info["frames"], info["width"], info["height"]) == ("h264", 17, 64, 32), info

    data = out.read_bytes()
    r = httpx.get(f"{gateway_stack.url}/v1/videos/{video.id}/content", headers={"Range": "bytes=10-109"})
    assert r.status_code == 206 and r.content == data[10:110], (r.status_code, r.headers)
    assert r.headers["content-range"] == f"bytes 10-109/{len(data)}"

    from PIL import Image
    thumb = client.videos.download_content(video.id, variant="thumbnail").read()
    sheet = client.videos.download_content(video.id, variant="spritesheet").read()
    assert Image.open(io.BytesIO(thumb)).format == "WEBP" and Image.open(io.BytesIO(thumb)).size == (64, 32)
    assert Image.open(io.BytesIO(sheet)).format == "JPEG" and Image.open(io.BytesIO(sheet)).size == (64 * 8, 32)


def test_retrieve_and_list_pages(client):
    ids = [client.videos.create(model=MODEL, prompt=f"a blue square {i}", size="32x32",
                                extra_body={"fastvideo3": {"steps": 1, "frames": 5, "seed": i}}).id for i in range(3)]
    for vid in ids:
        v = wait_status(client, vid, ("completed",))
        assert v.id == vid and v.size == "32x32" and v.prompt.startswith("a blue square")

    first = client.videos.list(limit=2)  # newest first
    assert len(first.data) == 2 and first.has_more is True
    assert [v.id for v in first.data] == [ids[2], ids[1]]
    assert first.last_id == ids[1]
    second = first.get_next_page()
    assert second.data[0].id == ids[0]
    listed = [v.id for v in client.videos.list(limit=2)]  # the SDK follows `after` across pages
    assert listed[:3] == [ids[2], ids[1], ids[0]]
    oldest_first = [v.id for v in client.videos.list(limit=100, order="asc")]
    assert oldest_first.index(ids[0]) < oldest_first.index(ids[1]) < oldest_first.index(ids[2])


def test_delete_running_job_cancels_it_in_the_fleet(client, gateway_stack):
    video = client.videos.create(model=MODEL, prompt="a long one", size="64x64",
                                 extra_body={"fastvideo3": {"steps": 1000, "frames": 17, "seed": 1}})
    wait_status(client, video.id, ("in_progress",), pred=lambda v: v.fastvideo3["phase"] == "denoise")
    deleted = client.videos.delete(video.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (video.id, True, "video.deleted")

    with FleetClient(gateway_stack.targets["scheduler"]) as fleet:
        status = wait_until(lambda: (s := fleet.get(video.id))["state"] in ("CANCELLED",) and s, 60.0,
                            "the fleet to cancel the request")
    assert status["step"] < 1000
    denoiser = gateway_stack.targets["denoiser"]
    wait_until(lambda: pool_describe(denoiser).resident_buffers == 0, 30.0, "the denoiser to free the request")
    with pytest.raises(openai.NotFoundError) as e:
        client.videos.retrieve(video.id)
    assert e.value.body["param"] == "video_id"


BAD = [
    ({"size": "64"}, 400, "size"),
    ({"size": "40x32"}, 400, "size"),                              # the card's multiple of 32
    ({"model": "no-such-card"}, 404, "model"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": "x" * (1 << 20)}, 400, "prompt"),                   # 1 MB
    ({"extra_body": {"fastvideo3": {"steps": 0}}}, 400, "fastvideo3.steps"),
    ({"extra_body": {"fastvideo3": {"steps": 100000}}}, 400, "fastvideo3.steps"),
    ({"extra_body": {"fastvideo3": {"steps": "many"}}}, 400, "fastvideo3.steps"),
    ({"extra_body": {"fastvideo3": {"seed": "x"}}}, 400, "fastvideo3.seed"),
    ({"extra_body": {"fastvideo3": {"frames": 8}}}, 400, "fastvideo3.frames"),  # not 4k+1
    ({"extra_body": {"fastvideo3": {"colour": "red"}}}, 400, "fastvideo3.colour"),
    ({"seconds": "abc"}, 400, "seconds"),
    ({"seconds": "100"}, 400, "seconds"),
]


@pytest.mark.parametrize("change,status,param", BAD, ids=[p for _, _, p in BAD])
def test_bad_input_names_the_param(client, change, status, param):
    kw = {"model": MODEL, "prompt": "a cat", "seconds": "1", "size": "32x32", "extra_body": SMALL}
    kw.update(change)
    with pytest.raises(openai.APIStatusError) as e:
        client.videos.create(**kw)
    err = e.value
    assert err.status_code == status, err.body
    assert set(err.body) == {"message", "type", "param", "code"}, err.body   # the SDK unwraps {"error": ...}
    assert err.body["param"] == param and err.body["message"].startswith(param), err.body
    assert err.body["type"] == "invalid_request_error"


def test_limits_are_in_the_message_and_json_types_are_checked(client, gateway_stack):
    with pytest.raises(openai.BadRequestError) as e:
        client.videos.create(model=MODEL, prompt="a cat", size="32x32", extra_body={"fastvideo3": {"steps": 0}})
    assert "[1, 1000]" in e.value.body["message"]
    r = httpx.post(f"{gateway_stack.url}/v1/videos", json={"model": MODEL, "prompt": 123, "size": "32x32"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    r = httpx.post(f"{gateway_stack.url}/v1/videos", json={"model": MODEL, "prompt": "a cat", "seconds": [1]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seconds", r.text
    # after all the refusals, a good request works
    video = client.videos.create_and_poll(model=MODEL, prompt="a green dot", size="32x32", seconds="0.5",
                                          extra_body=SMALL, poll_interval_ms=100)
    assert video.status == "completed" and video.fastvideo3["frames"] == 9


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].fastvideo3["fps"] == 16


def test_gateway_sigkill_mid_job_then_restart_completes(client, gateway_stack, tmp_path):
    video = client.videos.create(model=MODEL, prompt="survives a restart", size="64x64",
                                 extra_body={"fastvideo3": {"steps": 120, "frames": 17, "seed": 11}})
    wait_status(client, video.id, ("in_progress",), pred=lambda v: v.fastvideo3["phase"] == "denoise")
    with FleetClient(gateway_stack.targets["scheduler"]) as fleet:
        assert fleet.get(video.id)["state"] == "RUNNING"  # killed mid-job
        old = gateway_stack.gateway_pid()
        os.kill(old, signal.SIGKILL)
        # serve notices and starts a new gateway on the same port
        wait_until(lambda: (h := gateway_stack.health()) and h["pid"] != old, 90.0, "serve to restart the gateway")
        again = client.videos.retrieve(video.id)
        assert again.id == video.id and again.status in ("queued", "in_progress", "completed"), again
        done = wait_status(client, video.id, ("completed", "failed"))
        assert done.status == "completed", done.error
        assert fleet.get(video.id)["state"] == "SUCCEEDED"  # one request, never cancelled by the kill
    out = tmp_path / "after-restart.mp4"
    client.videos.download_content(video.id).write_to_file(out)
    info = probe_video(out)
    assert (info["codec"], info["frames"], info["width"], info["height"]) == ("h264", 17, 64, 64), info
    assert "re-attaching to 1 job(s)" in gateway_stack.gateway_log(200)
