"""``python -m fleet.gateway --scheduler HOST:PORT [--port 8000] ...`` (flags: config.py)."""
from __future__ import annotations

import logging
import os
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
    logging.basicConfig(level=cfg.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from fleet.gateway.app import Gateway
    gateway = Gateway(cfg)
    server = uvicorn.Server(uvicorn.Config(gateway.app, host=cfg.host, port=cfg.port, log_level="warning",
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
    server.run()
    gateway.jobs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
