"""Start a local fleet: one process per role pool (and per replica) plus the scheduler, on
loopback ports; wait until every health check is SERVING; stop it all cleanly.

    with LocalFleet("wan-tiny", replicas={"denoiser": 2}) as fleet:
        print(fleet.endpoints())          # {"scheduler": "127.0.0.1:P", "denoiser": [...], ...}
        ...                               # FleetClient(fleet.target)

Each child gets ``--exit-with-parent`` (so none outlives a killed launcher) and its own session
(so a terminal's Ctrl-C reaches the launcher, which stops the scheduler first, then the pools,
each with SIGTERM and a drain; SIGKILL only after ``stop_timeout_s``). A watcher thread per
process follows its grpc.health.v1 status (``Watch``) and records every transition in
:attr:`LocalFleet.health_history`, which health tests read. Fault tests use
:meth:`LocalFleet.kill` (SIGKILL: a crash) and :meth:`LocalFleet.restart` (same arguments, same
port); ``security`` gives every process TLS / token flags (services/common/auth.py).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fastvideo3.vocab import ROLES, Role

REPO_ROOT = Path(__file__).resolve().parents[1]
POOL_ROLES = ROLES
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
WATCH_DEADLINE_S = 3600.0


class FleetError(RuntimeError):
    """A fleet process failed to start or died; the message carries the tail of its log."""


_HANDED_OUT: set[tuple[str, int]] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now and that this process has not handed out before: a fleet
    takes all its ports before its processes bind them, and the OS can offer one port twice
    in that window (two processes given one port would both fail or, with SO_REUSEPORT, share it)."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        with _HANDED_OUT_LOCK:
            if (host, port) not in _HANDED_OUT:
                _HANDED_OUT.add((host, port))
                return port
    raise FleetError(f"no free port on {host} that was not handed out already (64 tries)")


@dataclass
class FleetProcess:
    name: str  # "encoder-0", "scheduler", ...
    role: str
    port: int
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    signalled: bool = False
    history: list[tuple[float, str]] = field(default_factory=list)  # (time, status)
    serving: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def statuses(self) -> list[str]:
        """The distinct successive health states seen (e.g. NOT_SERVING, SERVING)."""
        out: list[str] = []
        for _, s in self.history:
            if not out or out[-1] != s:
                out.append(s)
        return out

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class LocalFleet:
    def __init__(self, card: str = "wan-tiny", *, replicas: dict[str, int] | None = None,
                 roles: tuple[str, ...] = POOL_ROLES, port: int | None = None, host: str = "127.0.0.1",
                 transport: str = "auto", device: str | None = None, precision: str | None = None,
                 fake: bool = False, scheduler_args: list[str] | None = None,
                 pool_args: dict[str, list[str]] | None = None, log_dir: str | Path | None = None,
                 python: str = sys.executable, stop_timeout_s: float = 30.0, security=None,
                 denoiser_experts: tuple[str, ...] = (), schedulers: int = 1, leader_lease_s: float = 2.0):
        """``security`` (services.common.auth.Security): TLS / token flags given to every process,
        and used by the launcher's own health watchers. ``denoiser_experts`` (two-expert cards):
        one set of denoiser pools per named expert (``pools["denoiser:<expert>"]``, each started with
        ``--experts <expert>``) instead of denoiser pools holding every expert. ``schedulers`` > 1
        starts that many scheduler replicas over the same pools; they elect a leader with a
        ``leader_lease_s`` lease in the state store (``scheduler_args`` must name a shared ``--state-store``)."""
        self.card, self.host = card, host
        self.replicas = {r: 1 for r in roles}
        self.replicas.update(replicas or {})
        unknown = set(self.replicas) - set(POOL_ROLES)
        if unknown:
            raise ValueError(f"unknown role {sorted(unknown)[0]!r} (roles: {', '.join(POOL_ROLES)})")
        self.port = port
        self.transport, self.device, self.precision, self.fake = transport, device, precision, fake
        self.scheduler_args = list(scheduler_args or [])
        if schedulers < 1:
            raise ValueError(f"schedulers must be >= 1, got {schedulers}")
        self.n_schedulers = schedulers
        if schedulers > 1 and "--leader-lease" not in self.scheduler_args:
            self.scheduler_args += ["--leader-lease", str(leader_lease_s)]
        self.pool_args = dict(pool_args or {})
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="fastvideo3-fleet-"))
        self.python = python
        self.stop_timeout_s = stop_timeout_s
        self.security = security
        self.denoiser_experts = tuple(denoiser_experts)
        self.pools: dict[str, list[FleetProcess]] = {}
        self.schedulers: list[FleetProcess] = []
        self.standalone: list[FleetProcess] = []  # pools no scheduler routes to (spawn_pool)
        self._channels: list[grpc.Channel] = []

    # -- processes ------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _spawn(self, fp: FleetProcess) -> FleetProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(fp.log_path, "ab") as log:
            fp.proc = subprocess.Popen(fp.argv, cwd=str(REPO_ROOT), env=self._env(), stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        threading.Thread(target=self._watch, args=(fp,), name=f"health-{fp.name}", daemon=True).start()
        return fp

    def _pool_process(self, role: str, index: int, expert: str | None = None) -> FleetProcess:
        if expert is not None:  # one expert's denoiser pool
            fp = self._pool_process(role, index)
            fp.argv += ["--experts", expert]
            fp.argv[fp.argv.index("--replica-id") + 1] = fp.name = f"{role}-{expert}-{index}"
            fp.log_path = self.log_dir / f"{fp.name}.log"
            return fp
        port = free_port(self.host)
        argv = [self.python, "-m", f"services.{role}", "--port", str(port), "--host", self.host, "--card", self.card,
                "--transport", self.transport, "--replica-id", f"{role}-{index}", "--exit-with-parent"]
        if self.device:
            argv += ["--device", self.device]
        if self.precision and role != Role.DECODER:
            argv += ["--precision", self.precision]
        if self.fake:
            argv.append("--fake")
        if self.security is not None:
            argv += self.security.argv()
        argv += self.pool_args.get(role, [])
        return FleetProcess(f"{role}-{index}", role, port, argv, self.log_dir / f"{role}-{index}.log")

    def _scheduler_process(self, port: int | None, extra: list[str], name: str) -> FleetProcess:
        port = port or free_port(self.host)
        argv = [self.python, "-m", "services.scheduler", "--port", str(port), "--host", self.host, "--card", self.card,
                "--exit-with-parent"]
        for role, procs in self.pools.items():
            argv += ["--pools", f"{role}={','.join(p.target for p in procs)}"]
        if self.transport != "auto":
            argv += ["--transport", self.transport]
        if self.security is not None:
            argv += self.security.argv()
        argv += extra
        return FleetProcess(name, "scheduler", port, argv, self.log_dir / f"{name}.log")

    def start(self, timeout_s: float = 300.0) -> "LocalFleet":
        """Spawn every pool and the scheduler, then wait until all are SERVING."""
        try:
            # the scheduler first: it listens NOT_SERVING until every pool it needs is SERVING
            self.pools = {}
            for role, n in self.replicas.items():
                if role == Role.DENOISER and self.denoiser_experts:
                    for e in self.denoiser_experts:
                        self.pools[f"denoiser:{e}"] = [self._pool_process(role, i, e) for i in range(n)]
                else:
                    self.pools[role] = [self._pool_process(role, i) for i in range(n)]
            self.schedulers.append(self._spawn(self._scheduler_process(self.port, self.scheduler_args, "scheduler")))
            for procs in self.pools.values():
                for fp in procs:
                    self._spawn(fp)
            self.wait_serving(timeout_s)
            for i in range(1, self.n_schedulers):  # standbys: they forward to the elected leader
                self.add_scheduler(self.scheduler_args, name=f"scheduler-{i}", timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def add_scheduler(self, args: list[str], name: str | None = None, timeout_s: float = 120.0,
                      port: int | None = None) -> str:
        """Start another scheduler over the same pools (e.g. with other flags); returns its target."""
        fp = self._spawn(self._scheduler_process(port, list(args), name or f"scheduler-{len(self.schedulers)}"))
        self.schedulers.append(fp)
        self.wait_serving(timeout_s, [fp])
        return fp.target

    def spawn_pool(self, role: str, args: list[str] | None = None, timeout_s: float = 120.0) -> FleetProcess:
        """Start one more pool process that no scheduler routes to (for pool-level tests)."""
        fp = self._pool_process(role, len(self.standalone))
        fp.name = f"{role}-standalone-{len(self.standalone)}"
        fp.log_path = self.log_dir / f"{fp.name}.log"
        fp.argv += list(args or [])
        self.standalone.append(self._spawn(fp))
        self.wait_serving(timeout_s, [fp])
        return fp

    def kill(self, fp: FleetProcess, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> int | None:
        """Send ``sig`` (default SIGKILL: a crash) and wait for the process to exit."""
        if fp.proc is None or fp.proc.poll() is not None:
            return fp.proc.returncode if fp.proc is not None else None
        fp.proc.send_signal(sig)
        fp.proc.wait(timeout=timeout_s)
        fp.serving.clear()
        return fp.proc.returncode

    def restart(self, fp: FleetProcess, timeout_s: float = 120.0) -> FleetProcess:
        """Start an exited process again with the same arguments (same port); wait until SERVING."""
        if fp.proc is not None and fp.proc.poll() is None:
            raise FleetError(f"{fp.name} is still running")
        fp._stop.set()  # the old watcher, if still looping
        fp._stop, fp.signalled = threading.Event(), False
        fp.serving.clear()
        self._spawn(fp)
        self.wait_serving(timeout_s, [fp])
        return fp

    def processes(self) -> list[FleetProcess]:
        return [p for procs in self.pools.values() for p in procs] + self.standalone + self.schedulers

    def process(self, name: str) -> FleetProcess:
        for p in self.processes():
            if p.name == name:
                return p
        raise KeyError(name)

    # -- health -----------------------------------------------------------------------------
    def _watch(self, fp: FleetProcess) -> None:
        # reconnect quickly: with grpc's default backoff (1 s growing to minutes) a watcher that
        # first knocks before the process listens could miss its whole NOT_SERVING phase
        options = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                   ("grpc.max_reconnect_backoff_ms", 250)]
        channel = (self.security.channel(fp.target, options=options) if self.security is not None
                   else grpc.insecure_channel(fp.target, options=options))
        self._channels.append(channel)
        stub = health_pb2_grpc.HealthStub(channel)
        backoff = 0.05
        while not fp._stop.is_set() and fp.proc is not None and fp.proc.poll() is None:
            try:
                for resp in stub.Watch(health_pb2.HealthCheckRequest(service=""), wait_for_ready=True,
                                       timeout=WATCH_DEADLINE_S):
                    status = STATUS_NAMES.get(resp.status, str(resp.status))
                    fp.history.append((time.time(), status))
                    if status == "SERVING":
                        fp.serving.set()
                backoff = 0.05
            except grpc.RpcError:
                if fp._stop.wait(backoff):  # server gone or restarting: retry until the process exits
                    break
                backoff = min(1.0, backoff * 2)
        fp.history.append((time.time(), "EXITED" if fp.proc is not None and fp.proc.poll() is not None else "STOPPED"))

    def wait_serving(self, timeout_s: float, procs: list[FleetProcess] | None = None) -> None:
        end = time.monotonic() + timeout_s
        for fp in procs or self.processes():
            while not fp.serving.wait(min(0.25, max(0.0, end - time.monotonic()))):
                if fp.proc is not None and fp.proc.poll() is not None:
                    raise FleetError(f"{fp.name} exited with status {fp.proc.returncode}:\n{fp.log_tail()}")
                if time.monotonic() >= end:
                    raise FleetError(f"{fp.name} is not SERVING after {timeout_s:.0f}s:\n{fp.log_tail()}")

    # -- info ---------------------------------------------------------------------------------
    @property
    def target(self) -> str:
        return self.schedulers[0].target

    def endpoints(self) -> dict[str, object]:
        out: dict[str, object] = {"scheduler": self.target}
        out.update({role: [p.target for p in procs] for role, procs in self.pools.items()})
        return out

    def dead(self) -> list[FleetProcess]:
        return [p for p in self.processes() if p.proc is not None and p.proc.poll() is not None]

    # -- stopping -------------------------------------------------------------------------------
    def _sigterm(self, fp: FleetProcess) -> None:
        # once only: a second SIGTERM could land while the child's interpreter is finalizing
        # (default handlers restored) and kill it mid-exit
        if fp.proc is not None and fp.proc.poll() is None and not fp.signalled:
            fp.signalled = True
            fp.proc.send_signal(signal.SIGTERM)

    def terminate(self, fp: FleetProcess, timeout_s: float | None = None) -> int | None:
        """SIGTERM one process and wait for it (SIGKILL after the timeout); returns its status."""
        if fp.proc is None:
            return None
        self._sigterm(fp)
        try:
            fp.proc.wait(timeout=timeout_s or self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            fp.proc.kill()
            fp.proc.wait(timeout=10)
        fp._stop.set()
        return fp.proc.returncode

    def stop(self) -> dict[str, int | None]:
        """Scheduler(s) first (they drain and release on the pools), then every pool in parallel."""
        codes = {fp.name: self.terminate(fp) for fp in self.schedulers}
        pools = [p for procs in self.pools.values() for p in procs] + self.standalone
        for fp in pools:
            self._sigterm(fp)
        for fp in pools:
            codes[fp.name] = self.terminate(fp)
        for ch in self._channels:
            ch.close()
        self._channels.clear()
        return codes

    def __enter__(self) -> "LocalFleet":
        return self.start() if not self.schedulers else self

    def __exit__(self, *exc) -> None:
        self.stop()
