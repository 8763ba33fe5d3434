"""Run the gateway as a child process next to a local fleet (``fastvideo3 serve --gateway-port``).

    gw = GatewayProcess(scheduler="127.0.0.1:50051", port=8000, args=["--state-store", url], log_dir=d)
    gw.start(timeout_s=60)      # spawned with --exit-with-parent; returns once /readyz answers 200
    gw.url                      # http://127.0.0.1:8000
    gw.restart()                # after it died (same port, same flags)
    gw.stop()                   # SIGTERM, SIGKILL after the timeout
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


class GatewayError(RuntimeError):
    """The gateway did not become ready; the message carries the tail of its log."""


class GatewayProcess:
    def __init__(self, scheduler: str, port: int, *, host: str = "127.0.0.1", args: list[str] | None = None,
                 log_dir: str | Path = ".", python: str = sys.executable) -> None:
        self.scheduler, self.port, self.host = scheduler, port, host
        self.args = list(args or [])
        self.log_path = Path(log_dir) / "gateway.log"
        self.python = python
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def argv(self) -> list[str]:
        return [self.python, "-m", "fleet.gateway", "--scheduler", self.scheduler, "--host", self.host,
                "--port", str(self.port), "--exit-with-parent", *self.args]

    def start(self, timeout_s: float = 60.0) -> "GatewayProcess":
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, cwd=str(REPO_ROOT), env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        last = "no answer yet"
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise GatewayError(f"the gateway exited with status {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2.0) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as e:  # 503: the body says what is not ready
                last = f"/readyz answered {e.code}: {e.read(500).decode(errors='replace')}"
            except (urllib.error.URLError, OSError) as e:
                last = f"/readyz: {e}"
            if time.monotonic() >= end:
                self.dump_stacks()
                raise GatewayError(f"the gateway is not ready after {timeout_s:.0f}s (last: {last}):\n"
                                   f"{self.log_tail(80)}")
            time.sleep(0.1)

    def dump_stacks(self, wait_s: float = 1.0) -> None:
        """Have a running gateway write every thread's stack to its log (SIGUSR1)."""
        if self.alive():
            try:
                os.kill(self.proc.pid, signal.SIGUSR1)
            except OSError:
                return
            time.sleep(wait_s)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart(self, timeout_s: float = 60.0) -> "GatewayProcess":
        if self.alive():
            raise GatewayError("the gateway is still running")
        return self.start(timeout_s)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
