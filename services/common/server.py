"""The process host every service runs in: one gRPC server with health and reflection, signal
handling, draining, an optional Prometheus text endpoint and an optional parent watch.

Lifecycle (the same for role pools and the scheduler):

    host = ServiceHost("fastvideo3.v1.RolePool", host, port); host.add(...); host.start()
        -> listening, every health service NOT_SERVING (so loading is observable)
    ... load weights / connect pools ...
    host.set_serving(True)                      -> SERVING
    host.wait_and_drain(drain_timeout_s)        -> on SIGTERM/SIGINT: NOT_SERVING at once (and it
        stays so), new work is refused with UNAVAILABLE, in-flight work finishes (bounded by the
        drain timeout), then the server stops.

Work RPCs run inside ``with host.work(context):`` so draining can wait for them.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from concurrent import futures
from typing import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fastvideo3.errors import Unavailable

log = logging.getLogger("fastvideo3.service")

MAX_MESSAGE_BYTES = 256 << 20  # inline artifacts (encoded videos) ride in replies
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]


class _LateHandlers(grpc.GenericRpcHandler):
    """Generic handlers that may be added after the server started (transport backends load late)."""

    def __init__(self) -> None:
        self.handlers: list = []

    def service(self, handler_call_details):
        for h in list(self.handlers):
            found = h.service(handler_call_details)
            if found is not None:
                return found
        return None


class ServiceHost:
    def __init__(self, services: list[str], host: str, port: int, *, max_workers: int = 16, security=None,
                 max_receive_bytes: int | None = None):
        """``security`` (services.common.auth.Security): TLS and token auth, off when None.
        ``max_receive_bytes`` lowers the largest request message accepted (a front door needs
        far less than pools, whose replies carry encoded videos)."""
        self.services = list(services)
        self.host, self.port = host, port
        self.security = security
        options = list(CHANNEL_OPTIONS)
        if max_receive_bytes:
            options = [o for o in options if o[0] != "grpc.max_receive_message_length"]
            options.append(("grpc.max_receive_message_length", int(max_receive_bytes)))
        # no SO_REUSEPORT: a second process on a taken port fails to bind instead of silently sharing
        # it (the kernel would then hand each new connection to either, e.g. a client's to a pool)
        options.append(("grpc.so_reuseport", 0))
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
                                  options=options, interceptors=security.interceptors() if security else None)
        self.health = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._late = _LateHandlers()
        self.server.add_generic_rpc_handlers((self._late,))
        self.stop_event = threading.Event()
        self._health_down = threading.Event()
        self.serving = False
        self.draining = False
        self._inflight = 0
        self._cv = threading.Condition()

    @property
    def late_handlers(self) -> list:
        """Append generic RPC handlers here to mount them on the running server."""
        return self._late.handlers

    def start(self) -> int:
        names = [*self.services, health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, self.server)
        address = f"{self.host}:{self.port}"
        try:
            bound = self.security.bind(self.server, address) if self.security else self.server.add_insecure_port(address)
        except RuntimeError:  # grpcio raises where older versions returned 0
            bound = 0
        if bound == 0:
            raise Unavailable(f"cannot listen on {self.host}:{self.port} (is it taken?)", field="port")
        self.port = bound
        self.server.start()
        self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)
        threading.Thread(target=self._on_stop, name="stopper", daemon=True).start()
        return bound

    def _on_stop(self) -> None:
        # runs off the signal handler (which only sets an event), so no lock is taken there
        self.stop_event.wait()
        with self._cv:
            self.draining = True
        self.health.enter_graceful_shutdown()  # NOT_SERVING everywhere, and it stays so
        self._health_down.set()

    def _set_all(self, status) -> None:
        for name in ("", *self.services):
            self.health.set(name, status)

    def set_serving(self, serving: bool) -> None:
        if self.draining:
            return
        self.serving = serving
        self._set_all(health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING)

    # -- work accounting ---------------------------------------------------------------
    @contextlib.contextmanager
    def work(self):
        """Count one in-flight work RPC; refuse it with Unavailable while loading or draining."""
        with self._cv:
            if self.draining:
                raise Unavailable("shutting down: not accepting new work", retry_after_s=1.0)
            if not self.serving:
                raise Unavailable("still loading: not serving yet", retry_after_s=1.0)
            self._inflight += 1
        try:
            yield
        finally:
            with self._cv:
                self._inflight -= 1
                self._cv.notify_all()

    @property
    def inflight(self) -> int:
        return self._inflight

    # -- signals and shutdown ----------------------------------------------------------
    def install_signals(self) -> None:
        """SIGTERM and SIGINT request a stop. A Python signal handler runs in the main thread
        between two bytecodes -- possibly while that thread holds ``stop_event``'s own lock inside
        ``stop_event.wait`` -- so setting the event from the handler can deadlock the process
        (it then never drains). The handler does nothing; the interpreter's C handler writes the
        signal's number to a pipe, and a thread reading the pipe sets the event."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd)
        stops = (signal.SIGTERM, signal.SIGINT)
        for sig in stops:
            signal.signal(sig, lambda *_: None)

        def relay() -> None:
            while True:
                if any(n in stops for n in os.read(read_fd, 64)):
                    self.stop_event.set()

        threading.Thread(target=relay, name="signals", daemon=True).start()
        import faulthandler
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack to the log

    def request_stop(self) -> None:
        self.stop_event.set()

    def watch_parent(self) -> None:
        """Stop when the launching process goes away (no orphans if the launcher is killed)."""
        parent = os.getppid()

        def watch() -> None:
            while not self.stop_event.wait(0.5):
                if os.getppid() != parent:
                    log.warning("launcher %d is gone; stopping", parent)
                    self.request_stop()

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()

    def wait_and_drain(self, drain_timeout_s: float, on_drain: Callable[[], None] | None = None) -> bool:
        """Block until a stop is requested, then drain and stop. Returns True if fully drained."""
        # timed waits: a signal taken by another (e.g. gRPC) thread only runs its Python handler
        # when the main thread executes bytecode, which an untimed wait would never let it do
        while not self.stop_event.wait(0.2):
            pass
        self._health_down.wait(5.0)
        log.info("draining (%d in flight)", self._inflight)
        if on_drain is not None:
            on_drain()
        with self._cv:
            drained = self._cv.wait_for(lambda: self._inflight == 0, timeout=drain_timeout_s)
        self.server.stop(grace=1.0).wait(5.0)
        log.info("stopped (%s)", "drained" if drained else "drain timed out")
        return drained


def flatten(d: dict, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested dict as ``a.b.c -> value`` (for metrics and Describe maps)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = float(v)
    return out


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
