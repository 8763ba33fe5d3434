"""End to end through NVIDIA Dynamo: an OpenAI-style HTTP client -> Dynamo's frontend
(``/v1/videos``) -> our Dynamo worker (``python -m fleet.dynamo``) -> a real local fleet on the
tiny model (scheduler + encoder, denoiser, decoder pools, separate processes).

One machine, no etcd or NATS: file discovery in a temporary directory, TCP request plane, ZMQ
event plane, everything on loopback. Readiness is polled with deadlines; teardown is SIGTERM
(Dynamo workers stop on SIGTERM, not SIGINT) and checks that no process of ours is left.
"""
from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("dynamo.frontend", reason="needs the dynamo extra (ai-dynamo)")

from fastvideo3.client import FleetClient  # noqa: E402
from fastvideo3.media import probe_video  # noqa: E402
from fleet.deployment_card import parse_card  # noqa: E402
from tests.fleet_fixture import dump_logs, fleet_fixture, running, wait_until  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "wan-tiny"
SMALL = {"num_frames": 9, "num_inference_steps": 2, "seed": 7}

fleet = fleet_fixture(scope="module", card=MODEL, roles=("encoder", "denoiser", "decoder"))


def _free_port(below: int = 65536) -> int:
    """A free loopback port. Dynamo 1.6.1 parses DYN_SYSTEM_PORT as an i16: it must be < 32768."""
    for _ in range(200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 0 if below == 65536 else random.randrange(20000, below)))
            except OSError:  # taken
                continue
            port = s.getsockname()[1]
        if port < below:
            return port
    raise AssertionError(f"no free port below {below}")


class Proc:
    """A child in its own session (so its whole group can be checked for leftovers)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path):
        self.name, self.log = name, log
        with open(log, "wb") as fh:
            self.p = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.p.poll() is None

    def tail(self, n: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-n:]
        return f"----- {self.name} -----\n" + "\n".join(text)

    def stop(self, timeout_s: float = 20.0) -> int:
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(timeout=10)
            raise AssertionError(f"{self.name} ignored SIGTERM for {timeout_s:.0f}s\n{self.tail()}")

    def group_gone(self) -> bool:
        try:
            os.killpg(self.p.pid, 0)
        except ProcessLookupError:
            return True
        return False


class Stack:
    def __init__(self, fleet, frontend: Proc, worker: Proc, http_port: int, system_port: int, kv_dir: Path,
                 media_dir: Path):
        self.fleet, self.frontend, self.worker = fleet, frontend, worker
        self.base = f"http://127.0.0.1:{http_port}"
        self.http_port, self.system_port = http_port, system_port
        self.kv_dir, self.media_dir = kv_dir, media_dir

    def logs(self) -> str:
        return "\n".join(p.tail() for p in (self.frontend, self.worker))

    def get_json(self, url: str, timeout_s: float = 5.0):
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return json.loads(r.read())

    def post_video(self, body: dict, timeout_s: float = 120.0) -> tuple[int, dict]:
        req = urllib.request.Request(f"{self.base}/v1/videos", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def counters(self) -> dict[str, float]:
        with FleetClient(self.fleet.target) as c:
            return c.describe()["counters"]


def _models(stack: Stack) -> list[str]:
    try:
        return [m["id"] for m in stack.get_json(f"{stack.base}/v1/models")["data"]]
    except (OSError, ValueError):
        return []


@pytest.fixture(scope="module")
def stack(fleet, tmp_path_factory):
    with dynamo_stack(fleet, tmp_path_factory.mktemp("dynamo")) as s:
        yield s


@contextlib.contextmanager
def dynamo_stack(fleet, tmp: Path):
    """Dynamo's frontend and our worker in front of ``fleet``; ready once the frontend lists the
    model. Stopped with SIGTERM afterwards, checking that no process of theirs is left."""
    kv_dir, media_dir = tmp / "kv", tmp / "media"
    http_port, system_port = _free_port(), _free_port(below=32768)
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
        "DYN_FILE_KV": str(kv_dir),
        "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1", "DYN_SYSTEM_HOST": "127.0.0.1",
        "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": "0",
    })
    plane = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
    frontend = Proc("frontend", [sys.executable, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                                 "--http-port", str(http_port), *plane], env, tmp / "frontend.log")
    worker_env = dict(env, DYN_SYSTEM_PORT=str(system_port), DYN_HEALTH_CHECK_ENABLED="true",
                      DYN_CANARY_WAIT_TIME="1")
    worker = Proc("worker", [sys.executable, "-m", "fleet.dynamo", "--scheduler", fleet.target, *plane,
                             "--media-dir", str(media_dir), "--wait-for-fleet", "60"], worker_env, tmp / "worker.log")
    s = Stack(fleet, frontend, worker, http_port, system_port, kv_dir, media_dir)
    try:
        def ready():
            for p in (frontend, worker):
                if not p.alive():
                    raise AssertionError(f"{p.name} exited with {p.p.returncode}\n{s.logs()}")
            return MODEL in _models(s)
        t0 = time.monotonic()
        wait_until(ready, 120, f"{MODEL} in the frontend's /v1/models", interval_s=0.25)
        print(f"Dynamo stack ready in {time.monotonic() - t0:.1f}s")
        yield s
    except BaseException:
        print(s.logs())
        dump_logs(fleet)
        raise
    finally:
        t0 = time.monotonic()
        codes = {p.name: p.stop() for p in (worker, frontend)}
        print(f"Dynamo stack stopped in {time.monotonic() - t0:.1f}s: {codes}")
        left = [p.name for p in (worker, frontend) if not p.group_gone()]
        assert not left, f"processes left behind in the session of {left}"
        assert codes == {"worker": 0, "frontend": 0}, s.logs()


@pytest.mark.timeout(300)
def test_worker_registers_a_video_model_with_the_deployment_card(stack):
    assert MODEL in _models(stack)
    entries = [json.loads(p.read_text()) for p in (stack.kv_dir / "v1" / "mdc").iterdir()]
    card_json = next(e["card_json"] for e in entries if e["card_json"]["display_name"] == MODEL)
    assert card_json["model_type"] == "Videos" and card_json["model_input"] == "Text"
    meta = card_json["runtime_config"]["runtime_data"]["fastvideo3"]
    assert meta["scheduler"] == stack.fleet.target
    published = parse_card(meta["deployment_card"])
    from fastvideo3.cli_deploy import describe_target
    live = describe_target(stack.fleet.target)
    # the scheduler's own card, unchanged — except the cost model, which keeps calibrating after
    # the worker published it (Dynamo records metadata once, at registration)
    assert published.model_copy(update={"cost_model": None}) == live.model_copy(update={"cost_model": None})
    assert published.cost_model is not None and live.cost_model is not None
    assert published.default_model == MODEL


@pytest.mark.timeout(300)
def test_generate_returns_a_playable_h264_video(stack, tmp_path):
    t0 = time.monotonic()
    status, body = stack.post_video({"model": MODEL, "prompt": "a red circle moving left", "size": "32x32",
                                     "response_format": "b64_json", "nvext": SMALL})
    elapsed = time.monotonic() - t0
    assert status == 200, body
    assert body["object"] == "video" and body["status"] == "completed" and body["model"] == MODEL
    item = body["data"][0]
    assert item["output_format"] == "mp4" and item["fps"] == 16
    path = tmp_path / "out.mp4"
    path.write_bytes(base64.b64decode(item["b64_json"]))
    info = probe_video(path)
    assert (info["codec"], info["frames"], info["width"], info["height"]) == ("h264", 9, 32, 32), info
    print(f"9 frames 32x32, 2 steps through Dynamo: {elapsed:.2f}s")


@pytest.mark.timeout(300)
def test_url_response_points_at_a_stored_video(stack):
    status, body = stack.post_video({"model": MODEL, "prompt": "a blue square", "size": "64x32", "seconds": 1,
                                     "response_format": "url",
                                     "nvext": {"num_frames": 5, "num_inference_steps": 1}})
    assert status == 200, body
    url = body["data"][0]["url"]
    assert url.startswith("file://")
    path = Path(urllib.request.url2pathname(url[len("file://"):]))
    assert path.is_relative_to(stack.media_dir)
    info = probe_video(path)
    assert (info["frames"], info["width"], info["height"]) == (5, 64, 32)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("body, field, limit", [
    ({"nvext": {"num_frames": 8}}, "num_frames", "4k+1"),
    ({"prompt": ""}, "prompt", "1..2000 characters"),
    ({"size": "40x32"}, "width", "multiple of 32"),
    ({"size": "big"}, "size", "WIDTHxHEIGHT"),
    ({"nvext": {"num_inference_steps": 0}}, "num_inference_steps", "[1, 1000]"),
    ({"output_format": "gif"}, "output_format", "mp4"),
])
def test_bad_requests_are_4xx_with_field_and_limit(stack, body, field, limit):
    before = stack.counters()
    status, reply = stack.post_video({"model": MODEL, "prompt": "x", "size": "32x32", **body})
    assert 400 <= status < 500, reply
    assert f"{field}:" in reply["message"] and limit in reply["message"], reply
    assert stack.counters()["admitted"] == before["admitted"]  # nothing was admitted for it


@pytest.mark.timeout(300)
def test_client_disconnect_cancels_the_request_on_the_fleet(stack):
    before = stack.counters()
    conn = http.client.HTTPConnection("127.0.0.1", stack.http_port, timeout=120)
    body = json.dumps({"model": MODEL, "prompt": "a long one", "size": "64x64",
                       "nvext": {"num_frames": 17, "num_inference_steps": 1000}})
    outcome: dict = {}

    def post():
        try:
            conn.request("POST", "/v1/videos", body=body, headers={"Content-Type": "application/json"})
            outcome["status"] = conn.getresponse().status
        except OSError as e:  # the test closes the socket under it
            outcome["error"] = e

    t = threading.Thread(target=post, daemon=True)
    t.start()
    wait_until(lambda: stack.counters()["diffusion_step.units"] > before["diffusion_step.units"] + 2, 60,
               "the request to be denoising on the fleet")
    conn.sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-denoise
    conn.close()
    t0 = time.monotonic()
    after = wait_until(lambda: (c := stack.counters())["cancelled"] > before["cancelled"]
                       and c["running_requests"] == 0 and c, 30, "the fleet to cancel the request")
    print(f"cancelled on the fleet {time.monotonic() - t0:.2f}s after the disconnect")
    units = after["diffusion_step.units"]
    assert units < before["diffusion_step.units"] + 1000
    time.sleep(0.5)  # a window for stray work to show: nothing more is issued after the cancel
    assert stack.counters()["diffusion_step.units"] == units
    t.join(10)
    assert "status" not in outcome


@pytest.mark.timeout(300)
def test_health_canary_follows_the_fleet(stack):
    """Last on the module's fleet: it stops the fleet's scheduler."""
    health = f"http://127.0.0.1:{stack.system_port}/health"
    wait_until(lambda: stack.get_json(health).get("status") == "ready", 30, "the worker's /health to be ready")

    def not_ready():
        try:
            return stack.get_json(health).get("status") != "ready"
        except urllib.error.HTTPError as e:  # 503 with a body once not ready
            return e.code >= 500
    t0 = time.monotonic()
    stack.fleet.terminate(stack.fleet.schedulers[0])  # returns once it has drained and exited
    wait_until(not_ready, 30, "the canary to mark the worker not ready")
    print(f"worker /health not ready {time.monotonic() - t0:.2f}s after the scheduler stopped")
    status, reply = stack.post_video({"model": MODEL, "prompt": "x", "size": "32x32", "nvext": SMALL})
    assert status == 503, reply


@pytest.fixture
def lone_denoiser_stack(tmp_path_factory):
    """A fleet of its own with ONE denoiser (no-op pools, 0.05 s a step, so a long request is
    surely in flight when it dies) and a Dynamo stack in front of it: the loss test kills that
    denoiser, which must not touch the module's fleet."""
    from fleet.launcher import LocalFleet
    lone = LocalFleet(MODEL, fake=True, roles=("encoder", "denoiser", "decoder"),
                      log_dir=tmp_path_factory.mktemp("loss-fleet-logs"),
                      scheduler_args=["--health-interval", "0.5", "--health-timeout", "0.5"],
                      pool_args={"denoiser": ["--fake-step-seconds", "0.05"]})
    with running(lone) as f, dynamo_stack(f, tmp_path_factory.mktemp("dynamo-loss")) as s:
        yield s


#: what Dynamo 1.6.1's frontend answers for every 5xx, whatever the worker raised (measured with
#: CannotConnect, Disconnected, StreamIncomplete, HttpError(503) and HttpError(502), Unknown):
#: only 4xx replies keep the worker's message
GENERIC_5XX = ("Service temporarily unavailable", "Bad gateway", "Internal server error")


@pytest.mark.timeout(300)
def test_lost_last_denoiser_fails_the_request_with_503_and_the_loss_report(lone_denoiser_stack):
    """Last in the module, on a fleet of its own: the fleet's only denoiser is SIGKILLed while a
    /v1/videos request is denoising. The client gets a 503 (retry later) within seconds, and the
    error the worker raised for it carries the fleet's loss report: the lost role and replica, that
    the request is retryable and the step it would resume from. Dynamo 1.6.1's frontend replaces
    the text of every 5xx with a generic one, so the report is checked in the worker's log, and
    in the client's message only if the frontend passes one on."""
    stack = lone_denoiser_stack
    denoiser = stack.fleet.pools["denoiser"][0]
    before = stack.counters()
    outcome: dict = {}

    def post():
        outcome["reply"] = stack.post_video({"model": MODEL, "prompt": "lost mid-denoise", "size": "32x32",
                                             "nvext": {"num_frames": 9, "num_inference_steps": 1000, "seed": 3}},
                                            timeout_s=60)

    t = threading.Thread(target=post, daemon=True)
    t.start()
    steps = lambda: stack.counters().get("diffusion_step.units", 0)  # noqa: E731  (absent until a step ran)
    start = steps()
    wait_until(lambda: steps() >= start + 3, 30, "the request to be denoising on the fleet")
    t_kill = time.monotonic()
    stack.fleet.kill(denoiser)  # SIGKILL: a crash, nothing is drained
    t.join(45)
    assert not t.is_alive(), f"no reply {time.monotonic() - t_kill:.0f}s after the kill\n{stack.logs()}"
    status, reply = outcome["reply"]
    print(f"client answered {time.monotonic() - t_kill:.2f}s after the kill: {status} {reply}")
    assert status == 503, reply
    report = f"lost=denoiser/{denoiser.name}]"

    def worker_line():
        lines = [ln for ln in stack.worker.log.read_text(errors="replace").splitlines()
                 if "request refused or failed:" in ln and report in ln]
        return lines[-1] if lines else None
    line = wait_until(worker_line, 10, "the worker's log line for the lost request")
    print(f"worker: {line}")
    assert f"UNAVAILABLE: role: denoiser replica {denoiser.name} was lost at denoise step" in line, line
    assert "[retryable=true resume_from_step=" in line and "Stream removed" not in line, line
    message = reply.get("message", "")
    if message not in GENERIC_5XX:  # a frontend that passes the worker's text on carries the report
        assert f"denoiser replica {denoiser.name}" in message and report in message, reply
        assert "retryable=true" in message and "resume_from_step=" in message, reply
    assert stack.counters().get("failed", 0) == before.get("failed", 0) + 1
