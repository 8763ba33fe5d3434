"""A real Redis server for tests, started and stopped by the test that needs it.

``RedisServer()`` is a context manager yielding a running server with a ``url``. It uses a
Docker container (testcontainers) when a Docker engine answers, and otherwise a
``redis-server`` process on a free loopback port with persistence off, in a temporary
directory. ``RedisServer(kind="process")`` always gives the process form, whose ``stop()`` and
``start()`` take the server down and bring it back on the same port (for outage tests).

``redis_url`` is a session-scoped pytest fixture built on it; wire it into a conftest with
``from tests.redis_server import redis_url``. Tests sharing it keep apart by namespace.
``redis_process_fixture(scope)`` makes a fixture of a server process of its own (one a test may
stop or freeze).
Tests never use a Redis that was already running on the machine.
"""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Literal

import pytest

from fastvideo3.errors import Unavailable


def wait_for_ping(url: str, deadline_s: float) -> None:
    """fastvideo3.state.redis_store's, imported when a server starts: a session that starts none
    (e.g. GPU-only tests on an image without the redis package) does not need redis-py."""
    from fastvideo3.state.redis_store import wait_for_ping as ping
    ping(url, deadline_s=deadline_s)

Kind = Literal["auto", "process", "docker"]

START_DEADLINE_S = 15.0
STOP_DEADLINE_S = 5.0
INSTALL_HINT = (
    "no redis-server binary on PATH and no Docker engine reachable; install one "
    "(e.g. `apt-get install -y redis-server`) to run the Redis tests"
)


def docker_available(timeout_s: float = 3.0) -> bool:
    """True if a Docker engine answers ``docker info`` within ``timeout_s``."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        done = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s, check=False,
        )
    except (subprocess.TimeoutExpired, OSError):
        return False
    return done.returncode == 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisProcess:
    """A ``redis-server`` child process on 127.0.0.1, no persistence, stoppable and restartable."""

    def __init__(self, binary: str | None = None, port: int | None = None) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise RuntimeError(INSTALL_HINT)
        self.binary = found
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="fastvideo3-redis-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the server (again, on the same port) and return once it answers PING."""
        if self.running:
            return
        log = self._dir / "redis.log"
        self._proc = subprocess.Popen(
            [
                self.binary, "--port", str(self.port), "--bind", self.host,
                "--save", "", "--appendonly", "no", "--dir", str(self._dir),
                "--logfile", str(log), "--daemonize", "no",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            self._wait_ready(log)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, log: Path) -> None:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(
                    f"redis-server on port {self.port} exited with {self._proc.returncode}:\n{tail}"
                )
            try:
                wait_for_ping(self.url, deadline_s=0.2)
                return
            except Unavailable:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"redis-server on port {self.port} did not answer PING within {START_DEADLINE_S}s"
                    ) from None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and wait until the process is gone."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_DEADLINE_S)

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): it keeps its port but answers nothing, like a hung server."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo ``pause`` (SIGCONT)."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.resume()  # a frozen process cannot act on SIGTERM
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


class RedisDocker:
    """A Redis container (testcontainers). It has no stop/start: outage tests use a process."""

    def __init__(self, image: str = "redis:7-alpine") -> None:
        try:
            from testcontainers.community.redis import RedisContainer  # testcontainers >= 4.14
        except ImportError:  # older layout
            from testcontainers.redis import RedisContainer
        self._container = RedisContainer(image)
        self.host = ""
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> None:
        self._container.start()
        self.host = self._container.get_container_host_ip()
        self.port = int(self._container.get_exposed_port(6379))
        wait_for_ping(self.url, deadline_s=START_DEADLINE_S)

    def close(self) -> None:
        self._container.stop()


class RedisServer:
    """Context manager for a fresh Redis server.

    ``kind="auto"`` prefers a container when a Docker engine answers, else a process;
    ``"process"`` and ``"docker"`` force one form.
    """

    def __init__(self, kind: Kind = "auto") -> None:
        self.kind = kind
        self.server: RedisProcess | RedisDocker | None = None

    def __enter__(self) -> RedisProcess | RedisDocker:
        use_docker = self.kind == "docker" or (self.kind == "auto" and docker_available())
        attempts = 1 if use_docker else 3  # a free port can be taken before the server binds it
        for attempt in range(attempts):
            server: RedisProcess | RedisDocker = RedisDocker() if use_docker else RedisProcess()
            try:
                server.start()
            except Exception:
                server.close()
                if attempt + 1 == attempts:
                    raise
                continue
            self.server = server
            return server
        raise AssertionError("unreachable")

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a Redis server started for this test session (see ``RedisServer``)."""
    with RedisServer() as server:
        yield server.url


def redis_process_fixture(scope: str = "function"):
    """A pytest fixture of ``scope`` yielding a ``RedisServer(kind="process")`` of its own."""

    @pytest.fixture(scope=scope)
    def _server() -> Iterator[RedisProcess]:
        with RedisServer(kind="process") as server:
            yield server

    return _server
