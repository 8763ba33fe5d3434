"""A ``fastvideo3 serve --gateway-port P --state-store redis://...`` fleet for the gateway tests.

``serve_stack(redis_url, log_dir)`` starts the real CLI as a subprocess (scheduler, encoder,
denoiser, decoder and the gateway, with a real redis-server as the state store), reads the
targets it prints, and stops it (SIGTERM, then SIGKILL) afterwards. ``ServeStack.gateway_pid()``
asks the gateway itself (``/healthz``), so a test can SIGKILL it and watch ``serve`` bring it back.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
import urllib.request
from pathlib import Path

from fleet.launcher import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 100.0  # each of the (at most two) starts; the fleet is up in seconds
SERVE_START_TIMEOUT_S = 80  # serve's own limit per process, so its error (with the log) comes first


class ServeStack:
    def __init__(self, proc: subprocess.Popen, log_dir: Path, gateway_port: int):
        self.proc, self.log_dir, self.gateway_port = proc, log_dir, gateway_port
        self.url = f"http://127.0.0.1:{gateway_port}"
        self.targets: dict[str, str] = {}
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(ValueError, OSError):  # the pipe closed under it (_stop)
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                m = re.match(r"\s+(scheduler|encoder|denoiser|decoder)\s+(\S+)", line)
                if m:
                    self.targets[m.group(1)] = m.group(2).rstrip(",")
                if line.startswith("Ctrl-C stops the fleet"):
                    self.ready.set()

    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def health(self, timeout_s: float = 2.0) -> dict | None:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=timeout_s) as r:
                return json.loads(r.read())
        except OSError:
            return None

    def gateway_pid(self) -> int:
        h = self.health()
        assert h is not None, "the gateway does not answer /healthz"
        return int(h["pid"])

    def gateway_log(self, n: int = 40) -> str:
        try:
            return "\n".join((self.log_dir / "gateway.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _descendants(pid: int) -> list[int]:
    """Pids of ``pid``'s children and their children (read from /proc; empty elsewhere)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _diagnose(proc: subprocess.Popen, log_dir: Path) -> str:
    """Every fleet process's thread stacks (SIGUSR1 writes them to its log) and its log's tail."""
    for pid in _descendants(proc.pid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGUSR1)
    time.sleep(1.5)
    parts = []
    for log in sorted(log_dir.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-120:]
        parts.append(f"----- {log.name} -----\n" + "\n".join(lines))
    return "\n".join(parts)


def _start(redis_url: str, log_dir: Path, extra: tuple[str, ...]) -> ServeStack:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", ""))
                                                      if p), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "fastvideo3.cli", "serve", "--card", "wan-tiny", "--no-reward",
            "--log-dir", str(log_dir), "--gateway-port", str(port), "--state-store", redis_url,
            "--start-timeout", str(SERVE_START_TIMEOUT_S), *extra]
    proc = subprocess.Popen(argv, cwd=str(REPO_ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    return ServeStack(proc, log_dir, port)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    if proc.stdout is not None:
        with contextlib.suppress(OSError):
            proc.stdout.close()


def _wait_started(stack: ServeStack, timeout_s: float) -> str | None:
    """None once serve says the fleet is up; else what went wrong, with every process's stacks."""
    end = time.monotonic() + timeout_s
    while not stack.ready.wait(0.2):
        if stack.proc.poll() is not None or time.monotonic() > end:
            return (f"serve did not start (status {stack.proc.poll()}):\n{stack.output()}\n"
                    f"{_diagnose(stack.proc, stack.log_dir)}")
    return None


@contextlib.contextmanager
def serve_stack(redis_url: str, log_dir: Path, *extra: str):
    """The fleet, started once more (in a fresh log folder) if the first start fails; the first
    failure is reported as a warning with every process's stacks and logs, never hidden."""
    stack = _start(redis_url, log_dir, extra)
    failure = _wait_started(stack, START_TIMEOUT_S)
    if failure is not None:
        _stop(stack.proc)
        warnings.warn(f"the gateway fleet's first start failed; starting it again:\n{failure}", stacklevel=2)
        print(failure)
        retry_dir = log_dir.with_name(log_dir.name + "-retry")
        retry_dir.mkdir(exist_ok=True)
        stack = _start(redis_url, retry_dir, extra)
        failure = _wait_started(stack, START_TIMEOUT_S)
    try:
        if failure is not None:
            raise AssertionError(failure)
        yield stack
    except BaseException:
        print(f"----- serve output -----\n{stack.output()}\n----- gateway log -----\n{stack.gateway_log()}")
        raise
    finally:
        _stop(stack.proc)
