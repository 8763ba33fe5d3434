"""Crash-and-resume helpers the resume tests share: schedulers that checkpoint into one in-memory
store (a "crash" drops one, the next resumes from what the store kept) and the ticks that drive
a run to a denoise step or to its end."""
from __future__ import annotations

from fastvideo3.runtime.durability.checkpointer import Checkpointer
from fastvideo3.runtime.scheduling.scheduler import TERMINAL, CoreScheduler
from fastvideo3.state import MemoryStateStore


def engine_pools(engine) -> dict:
    """The encoder, denoiser and decoder pools of an in-process engine (one worker each)."""
    return {"encoder": [engine.encoder], "denoiser": [engine.denoiser], "decoder": [engine.decoder]}


def checkpointed_schedulers(pools: dict, data, every: int, **sched_kw):
    """A factory of (CoreScheduler, Checkpointer attached to it) pairs, all checkpointing every
    ``every`` steps into the store ``data`` (a MemoryData)."""
    def scheduler():
        cp = Checkpointer(MemoryStateStore(data=data), every=every)
        sched = CoreScheduler(pools, checkpoint=cp.checkpoint, admit_hook=cp.register, recover=cp.recover,
                              **sched_kw)
        return sched, cp.attach(sched)
    return scheduler


def tick_until_step(sched, run, step: int) -> None:
    """Tick ``sched`` until ``run`` is in its denoise loop at ``step`` or later."""
    while run.driver is None or run.loop_id != "diffusion_denoise" or run.driver.state.step < step:
        sched.tick()


def tick_until_done(sched, run) -> None:
    """Tick ``sched`` until ``run`` is terminal."""
    while run.status not in TERMINAL:
        sched.tick()
