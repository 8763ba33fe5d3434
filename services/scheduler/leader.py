"""Scheduler high availability: one leader among N scheduler replicas over one state store.

Every replica connects to the same pools and the same store. A lease in the store
(``ns:lease:scheduler``, taken with SET-if-free and a TTL, renewed every third of it) names the
leader as ``ID@HOST:PORT``:

* the **leader** admits, steps and checkpoints requests, like a lone scheduler;
* a **standby** admits nothing (so N replicas never over-admit a pool: there is one admission
  budget, the leader's) and forwards every Generate, Cancel and GetRequest to the leader — a
  client may call any replica;
* when the leader dies its lease expires; the first standby to take it adopts every request
  the store lists in flight, from its checkpoint (``Checkpointer.resume``), and serves them:
  clients re-attach (same id, same parameters) to any replica;
* a leader stopped with SIGTERM hands over: it stops stepping, waits for its batches in flight,
  releases the lease and tells its clients to re-attach (``FleetRuntime.hand_over``);
* a leader that finds the lease held by another replica (it was paused past its TTL, or the
  store lost it and another took it first) exits at once: the new leader owns its requests.
  While the store cannot be reached nobody can take the lease, so the leader keeps running.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from fastvideo3.errors import FastVideoError

log = logging.getLogger("fastvideo3.scheduler.leader")

LEASE = "scheduler"


class Leadership:
    def __init__(self, store, me: str, address: str, ttl_s: float, *, on_elected: Callable[[], None],
                 on_deposed: Callable[[str], None] | None = None):
        self.store = store
        self.owner = f"{me}@{address}"
        self.ttl_s = ttl_s
        self.on_elected = on_elected
        self.on_deposed = on_deposed or _exit_deposed
        self.is_leader = False
        self.holder = ""  # the leader as last seen ("ID@HOST:PORT"), "" when none
        self.elected = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="leader-lease", daemon=True)

    @property
    def address(self) -> str:
        """This replica's own address, as the lease names it."""
        return self.owner.rsplit("@", 1)[-1]

    @property
    def leader_address(self) -> str:
        return self.holder.rsplit("@", 1)[-1] if self.holder else ""

    def start(self) -> None:
        self.step()
        self._thread.start()

    def step(self) -> None:
        """One attempt to take or renew the lease."""
        try:
            holder = self.store.acquire_lease(LEASE, self.owner, self.ttl_s)
        except FastVideoError as e:  # nobody can take it while the store is down: keep the role
            log.warning("leader lease not renewed (%s); keeping the %s role", e.one_line(),
                        "leader" if self.is_leader else "standby")
            return
        self.holder = holder
        if holder == self.owner and not self.is_leader:
            log.info("%s is now the scheduler leader", self.owner)
            self.on_elected()
            self.is_leader = True
            self.elected.set()
        elif holder != self.owner and self.is_leader:
            self.is_leader = False
            self.on_deposed(holder)

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self.step()

    def stop(self) -> None:
        self._stop.set()
        if self.is_leader:
            try:
                self.store.release_lease(LEASE, self.owner)  # a standby takes over without waiting the TTL
            except FastVideoError:
                pass


def _exit_deposed(holder: str) -> None:
    log.error("the leader lease is held by %s: this replica stops (its requests continue there)", holder)
    os._exit(3)
