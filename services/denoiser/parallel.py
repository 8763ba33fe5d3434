"""A denoiser replica of N ranks: ``python -m services.denoiser --nproc N --plan PLAN ...``.

This process is rank 0: it serves the RolePool contract exactly as a one-rank replica does
(services/common/pool.py) with a :class:`~fastvideo3.parallel.spmd.LeaderExecutor`, and starts
ranks 1..N-1 as child processes (``python -m services.denoiser.rank``), one per device (CUDA
device ``i`` for rank ``i``, or the CPU). The ranks join one ``torch.distributed`` group (NCCL on
CUDA, gloo on CPUs) through a store on rank 0. A rank that exits, or a group that breaks, stops
the whole replica: rank 0 answers its batch as lost, stops serving and exits non-zero, and the
other ranks exit when the group goes (or when rank 0 does).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

from fastvideo3.vocab import Role

log = logging.getLogger("fastvideo3.pool")

RANK_EXIT_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class ParallelArgs:
    nproc: int
    plan: str
    dist_timeout_s: float = 60.0
    no_pad: bool = False


def split_args(argv: list[str]) -> tuple[ParallelArgs | None, list[str]]:
    """The launcher's own flags, and the rest for the pool. None where the replica is one rank."""
    p = argparse.ArgumentParser(prog="python -m services.denoiser", add_help=False,
                                description="multi-rank replica flags (the pool flags follow)")
    p.add_argument("--nproc", type=int, default=1, help="ranks (one per device) in this replica")
    p.add_argument("--plan", default=None, help="parallel plan: single, ulysses2, ring2, ulysses2xring2, cfg2, ...")
    p.add_argument("--dist-timeout", type=float, default=60.0, dest="dist_timeout_s",
                   help="deadline of one collective (a rank silent this long breaks the replica)")
    p.add_argument("--no-pad", action="store_true", help="refuse shapes that do not divide instead of padding")
    ns, rest = p.parse_known_args(argv)
    if "-h" in argv or "--help" in argv:
        print(p.format_help())
    if ns.nproc == 1 and ns.plan in (None, "single"):
        return None, rest
    from fastvideo3.errors import InvalidRequest
    from fastvideo3.parallel.plan import ParallelPlan
    try:
        if ns.nproc < 1:
            raise InvalidRequest(f"--nproc {ns.nproc}", field="nproc", limit="at least 1")
        if not 1.0 <= ns.dist_timeout_s <= 3600.0:
            raise InvalidRequest(f"--dist-timeout {ns.dist_timeout_s}", field="dist_timeout", limit="1..3600 s")
        plan = ParallelPlan.parse(ns.plan or "single", pad=not ns.no_pad)
        plan.check_world(ns.nproc)
    except InvalidRequest as e:
        print(f"error: {e.one_line()}", file=sys.stderr)
        sys.exit(2)
    return ParallelArgs(ns.nproc, plan.spec, ns.dist_timeout_s, ns.no_pad), rest


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class _Replica:
    """Rank 0's view of the group: the children it started and the leader executor."""

    def __init__(self, par: ParallelArgs):
        self.par = par
        self.children: list[subprocess.Popen] = []
        self.leader = None
        self.broken = threading.Event()
        self.stopping = threading.Event()

    def build(self, cfg, card, transport):
        from fastvideo3.parallel.mesh import init_mesh
        from fastvideo3.parallel.plan import ParallelPlan
        from fastvideo3.parallel.spmd import LeaderExecutor, rank_device
        plan = ParallelPlan.parse(self.par.plan, pad=not self.par.no_pad)
        master = f"127.0.0.1:{_free_port('127.0.0.1')}"
        for rank in range(1, plan.world):
            argv = [sys.executable, "-m", "services.denoiser.rank", "--rank", str(rank), "--world", str(plan.world),
                    "--master", master, "--plan", self.par.plan, "--card", cfg.card,
                    "--dist-timeout", str(self.par.dist_timeout_s), "--log-level", cfg.log_level]
            argv += ["--device", rank_device(cfg.device, rank)]
            argv += ["--precision", cfg.precision] if cfg.precision else []
            argv += ["--no-pad"] if self.par.no_pad else []
            argv += ["--no-batching"] if cfg.no_batching else []
            self.children.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL))
        device = rank_device(cfg.device, 0)
        try:
            mesh = init_mesh(plan, 0, plan.world, master, device, timeout_s=self.par.dist_timeout_s)
        except BaseException:
            self.kill_children()
            raise
        self.leader = LeaderExecutor(card, transport, mesh, device, cfg.precision, batching=not cfg.no_batching,
                                     on_broken=self._on_broken)
        self.leader.rank_pids = [os.getpid(), *(c.pid for c in self.children)]
        threading.Thread(target=self._watch_children, name="rank-watch", daemon=True).start()
        return self.leader

    def _watch_children(self) -> None:
        while not self.stopping.wait(0.2):
            for rank, c in enumerate(self.children, start=1):
                code = c.poll()
                if code is not None:
                    self.leader.mark_broken(f"rank {rank} (pid {c.pid}) exited with {code}")
                    return

    def _on_broken(self, why: str) -> None:
        self.broken.set()
        os.kill(os.getpid(), signal.SIGTERM)  # the service drains its in-flight RPCs and stops
        # a call stuck in a collective with a dead peer ends by the group timeout; never wait past it
        if not self.stopping.wait(self.par.dist_timeout_s + RANK_EXIT_TIMEOUT_S):
            log.error("parallel replica did not stop after it broke; exiting")
            self.kill_children()
            exit_now(1)

    def kill_children(self) -> None:
        for c in self.children:
            if c.poll() is None:
                c.kill()
        for c in self.children:
            try:
                c.wait(timeout=RANK_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error("rank pid %d did not exit", c.pid)

    def shutdown(self) -> None:
        self.stopping.set()
        if self.leader is not None and not self.broken.is_set():
            self.leader.stop()
            for c in self.children:
                try:
                    c.wait(timeout=RANK_EXIT_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass
        self.kill_children()


def exit_now(code: int) -> None:
    """Exit without interpreter teardown: a process group whose peers are gone can block the
    collector's finalisation of its communicators."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_parallel(par: ParallelArgs, argv: list[str]) -> int:
    from services.common.pool import run_pool
    replica = _Replica(par)
    try:
        # a multi-rank forward keeps no graphs: its Describe says so (graph_capture)
        code = run_pool(Role.DENOISER, replica.build, argv, warm=lambda cfg, ex: ex.warm_graphs(cfg.graph_buckets))
    finally:
        replica.shutdown()
    return 1 if replica.broken.is_set() else code
