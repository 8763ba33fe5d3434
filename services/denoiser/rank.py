"""One non-zero rank of a parallel denoiser replica (started by services/denoiser/parallel.py).

It joins rank 0's group, loads the same card, and runs what rank 0 broadcasts until told to
stop, until the group breaks, or until rank 0 (its parent) is gone.
"""
from __future__ import annotations

import argparse
import logging
import os
import threading
import time


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                logging.getLogger("fastvideo3.parallel").error("rank 0 (pid %d) is gone; exiting", parent)
                os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    from fastvideo3.cli_args import CARD_HELP
    p = argparse.ArgumentParser(prog="python -m services.denoiser.rank")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master", required=True, help="host:port of rank 0's store")
    p.add_argument("--plan", required=True)
    p.add_argument("--card", default="wan-tiny", help=CARD_HELP)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default=None)
    p.add_argument("--dist-timeout", type=float, default=60.0)
    p.add_argument("--no-pad", action="store_true")
    p.add_argument("--no-batching", action="store_true")
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    from services.common.server import setup_logging
    setup_logging(a.log_level)
    _watch_parent(os.getppid())
    from fastvideo3.card.registry import resolve_card
    from fastvideo3.parallel.executor import ParallelDenoiserExecutor
    from fastvideo3.parallel.mesh import init_mesh
    from fastvideo3.parallel.plan import ParallelPlan
    from fastvideo3.parallel.spmd import serve_worker
    plan = ParallelPlan.parse(a.plan, pad=not a.no_pad)
    mesh = init_mesh(plan, a.rank, a.world, a.master, a.device, timeout_s=a.dist_timeout)
    executor = ParallelDenoiserExecutor(resolve_card(a.card), None, mesh, a.device, a.precision,
                                        batching=not a.no_batching)
    print(f"denoiser rank {a.rank}/{a.world} ({plan.spec}) on {a.device} ready", flush=True)
    return serve_worker(executor)


if __name__ == "__main__":
    from services.denoiser.parallel import exit_now
    exit_now(main())
