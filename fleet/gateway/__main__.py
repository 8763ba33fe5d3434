"""``python -m fleet.gateway --scheduler HOST:PORT [--port 8000] ...`` (flags: config.py)."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

from fastvideo3.errors import FastVideoError


def main(argv: list[str] | None = None) -> int:
    from fleet.gateway.config import parse_args
    try:
        cfg = parse_args(argv)
    except FastVideoError as e:
        print(f"fastvideo3-gateway: error: {e.one_line()}", file=sys.stderr)
        return 2
    # a stop asked for while starting (before uvicorn listens for signals) is kept, not fatal
    stopping = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, frame: stopping.set())
    logging.basicConfig(level=cfg.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import faulthandler
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack to the log
    import uvicorn

    from fleet.gateway.app import Gateway
    gateway = Gateway(cfg)
    class _Server(uvicorn.Server):
        # SIGTERM / SIGINT drain and exit 0 like every fleet process (uvicorn would re-raise the
        # signal after its shutdown, so an orchestrator would see the process killed)
        @contextlib.contextmanager
        def capture_signals(self):
            def stop(signum, frame):
                stopping.set()
                self.should_exit = True
            previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    server = _Server(uvicorn.Config(gateway.app, host=cfg.host, port=cfg.port, log_level="warning",
                                           access_log=False, lifespan="on"))
    if cfg.exit_with_parent:
        parent = os.getppid()

        def watch() -> None:
            while not server.should_exit:
                if os.getppid() != parent:
                    logging.getLogger("fastvideo3.gateway").warning("launcher %d is gone; stopping", parent)
                    server.should_exit = True
                threading.Event().wait(0.5)
        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    logging.getLogger("fastvideo3.gateway").info("gateway on http://%s:%d -> scheduler %s (state %s, media %s)",
                                                 cfg.host, cfg.port, cfg.scheduler, gateway.jobs.address,
                                                 gateway.media.root)
    if not stopping.is_set():
        server.run()
    gateway.jobs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
