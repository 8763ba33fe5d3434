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
import urllib.request
from pathlib import Path

from fleet.launcher import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240.0


class ServeStack:
    def __init__(self, proc: subprocess.Popen, log_dir: Path, gateway_port: int):
        self.proc, self.log_dir, self.gateway_port = proc, log_dir, gateway_port
        self.url = f"http://127.0.0.1:{gateway_port}"
        self.targets: dict[str, str] = {}
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
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


@contextlib.contextmanager
def serve_stack(redis_url: str, log_dir: Path, *extra: str):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", ""))
                                                      if p), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "fastvideo3.cli", "serve", "--card", "wan-tiny", "--no-reward",
            "--log-dir", str(log_dir), "--gateway-port", str(port), "--state-store", redis_url, *extra]
    proc = subprocess.Popen(argv, cwd=str(REPO_ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    stack = ServeStack(proc, log_dir, port)
    try:
        end = time.monotonic() + START_TIMEOUT_S
        while not stack.ready.wait(0.2):
            if proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"serve did not start (status {proc.poll()}):\n{stack.output()}")
        yield stack
    except BaseException:
        print(f"----- serve output -----\n{stack.output()}\n----- gateway log -----\n{stack.gateway_log()}")
        raise
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
