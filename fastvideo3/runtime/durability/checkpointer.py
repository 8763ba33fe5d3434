"""Durable requests: checkpoints to the StateStore, recovery from a lost replica, resume.

One :class:`Checkpointer` serves one :class:`~fastvideo3.runtime.scheduling.scheduler.CoreScheduler`
through the scheduler's hooks:

* ``register`` (admission): the request is put in the store *before* it is queued; a store
  that cannot be reached refuses the request with ``UNAVAILABLE`` at once (for ``retry_s``
  after a failure it is not even tried: admissions fail fast instead of queueing on a timeout).
* ``checkpoint`` (after each applied result): every ``every`` denoise steps, and at the end of
  each other loop, the request's :class:`~fastvideo3.runtime.durability.resume.RunRecord` is written —
  for the denoise loop together with a snapshot of the pool-resident regions taken at that same
  step boundary (no other step of the request is in flight then). The latest record is also
  kept in memory: it is what a lost replica's requests resume from. While the store is down,
  writes are skipped (the request keeps running; its durability is degraded, never its result).
* ``recover`` (a failed result): a request whose pool was lost (the dispatch failed with
  ``UNAVAILABLE``, or the replica answered that it no longer holds the request's region) is
  moved to a healthy replica: its snapshot is restored there and its loop rewinds to the
  snapshot's step; without a snapshot the current loop starts again (loops are deterministic).
  At most ``max_recoveries`` times per request; otherwise it fails with ``UNAVAILABLE``.
* ``finish`` (terminal): the artifact index is recorded and the request ended in the store
  (its keys then expire after the store's ``ttl_after_end_s``); a cancelled request's keys are
  deleted at once. Ends that fail while the store is down are retried by ``flush``, so after
  an outage no request stays in flight in the store.
* ``resume`` (scheduler start): every request the store lists in flight is rebuilt from its
  latest record, its snapshot restored onto a replica, and adopted by the scheduler.

With ``start_writer`` (the scheduler service) checkpoint and end writes run on a background
thread (:mod:`fastvideo3.runtime.durability.store_writer`), so a slow or frozen store never holds up a step.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any, Callable

from fastvideo3.errors import ErrorInfo, FastVideoError, Unavailable
from fastvideo3.loop.context import RequestContext
from fastvideo3.runtime.scheduling.executor import Executor, Monitored, Resumable, fingerprint_of, is_healthy
from fastvideo3.runtime.durability.resume import RunRecord, rebuild_run, record_of, request_meta
from fastvideo3.vocab import EventKind, LoopId, OutputFormat, Role, RunStatus

log = logging.getLogger("fastvideo3.checkpointer")

DENOISE = LoopId.DIFFUSION_DENOISE
SNAPSHOT_ROLES = {DENOISE: Role.DENOISER}  # loops whose pool keeps resident state between steps


def _healthy(ex: Any) -> bool:
    return is_healthy(ex)


class Checkpointer:
    def __init__(self, store, *, every: int = 1, retry_s: float = 1.0, max_recoveries: int = 3,
                 media_max_bytes: int = 64 << 20, replica_wait_s: float = 30.0):
        self.store = store
        # a single-step loop (decode, encode, reward) whose last replica was lost waits this long
        # for one to serve again, then runs again there (its inputs live elsewhere)
        self.replica_wait_s = float(replica_wait_s)
        self.media_max_bytes = int(media_max_bytes)  # finished outputs up to this size are kept in the store
        self.every = max(0, int(every))
        self.retry_s = retry_s
        self.max_recoveries = max_recoveries
        self.sched = None
        self.latest: dict[str, RunRecord] = {}  # request -> its latest record (with snapshot)
        self.before_final: dict[str, RunRecord] = {}  # request -> its snapshot taken before the last step
        self.recoveries: dict[str, int] = {}
        # request -> terminal status not yet written (REFUSED: an admission whose write may have landed)
        self.pending_ends: dict[str, str] = {}
        self._end_infos: dict[str, dict] = {}  # request -> what end_request records with its status
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self.writer = None  # a StoreWriter (start_writer): the step path's store writes, off it
        #: snapshots taken by the (pipelined) scheduler outside its lock: take_snapshots / run_snapshot
        self.defer_snapshots = False
        self._deferred: list = []
        self.counters: dict[str, float] = {
            "checkpoints": 0, "snapshots": 0, "snapshot_bytes": 0, "checkpoint_skipped_store_down": 0,
            "checkpoint_errors": 0, "store_errors": 0, "recovered": 0, "recovery_failed": 0, "resumed": 0,
            "resume_failed": 0, "ends_deferred": 0, "media_stored": 0, "revived": 0, "parked": 0, "inputs_remade": 0,
        }

    def attach(self, sched) -> "Checkpointer":
        self.sched = sched
        return self

    def start_writer(self) -> "Checkpointer":
        """Write checkpoints and ends from a background thread (the scheduler service; see
        :mod:`fastvideo3.runtime.durability.store_writer`): a slow or hung store holds up no step."""
        if self.writer is None:
            from fastvideo3.runtime.durability.store_writer import StoreWriter
            self.writer = StoreWriter(self).start()
        return self

    @property
    def executors(self) -> dict[str, list[Executor]]:
        return self.sched.executors if self.sched is not None else {}

    # -- the store, with fail-fast while it is down -------------------------------------------
    def _store_down(self) -> bool:
        return time.monotonic() < self._down_until

    def _store_failed(self, exc: Exception) -> None:
        self.counters["store_errors"] += 1
        self._down_until = time.monotonic() + self.retry_s
        log.warning("state store unavailable: %s", exc)

    def register(self, run) -> None:
        """Put ``run`` in the store before it is queued; raise Unavailable if the store is down."""
        if self._store_down():
            raise Unavailable(f"state store at {self.store.address} is unavailable: not admitting requests",
                              retry_after_s=self.retry_s, field="state_store")
        try:
            self.store.put_request(run.request_id, request_meta(run))
        except Unavailable as e:
            self._store_failed(e)
            # a write that timed out here may still reach a store that was only slow: delete it
            # once the store answers, so no refused request is ever left in flight there
            with self._lock:
                self.pending_ends[run.request_id] = "REFUSED"
            raise Unavailable(f"state store unavailable: {e.message}", retry_after_s=self.retry_s,
                              field="state_store") from None
        with self._lock:
            self.pending_ends.pop(run.request_id, None)  # registered now: an older cleanup must not touch it

    def checkpoint_step(self, run) -> int | None:
        """The denoise step the request's latest record lets it continue from (None: no record)."""
        rec = self.latest.get(run.request_id)
        if rec is None:
            return None
        if rec.loop_id == DENOISE:
            return rec.step
        if DENOISE in run.program and rec.loop_index > run.program.index(DENOISE):
            return int(run.request.num_inference_steps)
        return 0

    # -- checkpoints ------------------------------------------------------------------------
    def checkpoint(self, run) -> None:
        """Called after each applied result (scheduler lock held). With ``defer_snapshots`` a
        snapshot is not taken here: the request is held and the scheduler takes it off its lock."""
        d = run.driver
        if self.every <= 0 or d is None:
            return
        loop = run.loop_id
        snapshot, role, fingerprint = b"", "", ""
        if loop == DENOISE and not d.state.done:
            # always right before the final step too: a denoiser lost with the final latents (after
            # the last step, before decoding ends) costs one step and the decode, never the request
            if d.state.step % self.every and d.state.step != d.state.num_steps - 1:
                return
            role = self._denoise_pools(run)
            if self.defer_snapshots:  # taken by the scheduler off its lock (see take_snapshots)
                run.snapshotting = True
                self._deferred.append((run, role))
                return
            snapshot, fingerprint = self._snapshot(run, role)
            if not snapshot:
                return  # keep the previous record rather than one that cannot be resumed exactly
        elif loop == DENOISE:
            prev = self.latest.get(run.request_id)
            if prev is not None and prev.snapshot and prev.loop_id == DENOISE:
                self.before_final[run.request_id] = prev
        self._record(run, snapshot, role, fingerprint)

    # -- snapshots off the scheduler's lock (the pipelined scheduler) ------------------------
    def take_snapshots(self) -> list:
        """Snapshots the last applied results asked for (scheduler lock held). Each request stays
        held (``snapshotting``: no unit is planned for it) until :meth:`finish_snapshot`."""
        jobs, self._deferred = self._deferred, []
        return jobs

    def run_snapshot(self, job) -> tuple[bytes, str]:
        """Take one snapshot (no lock held: the request is held at its step boundary)."""
        run, role = job
        return self._snapshot(run, role)

    def finish_snapshot(self, job, taken: tuple[bytes, str] | None) -> None:
        """Record the checkpoint of a snapshot taken (scheduler lock held); the request goes on."""
        run, role = job
        run.snapshotting = False
        if taken is not None and taken[0] and run.driver is not None and run.status == RunStatus.RUNNING:
            self._record(run, taken[0], role, taken[1])

    def _record(self, run, snapshot: bytes, role: str, fingerprint: str) -> None:
        record = record_of(run, snapshot=snapshot, snapshot_role=role, snapshot_fingerprint=fingerprint)
        self.latest[run.request_id] = record
        self.counters["checkpoints"] += 1
        if self.writer is not None:
            self.writer.checkpoint(record)
        else:
            self._write(record)

    def _denoise_pools(self, run) -> str:
        """The pools holding the request's latent: ``denoiser``, or — where each expert of a
        two-expert card has its own pools — ``denoiser:<expert of the step just run>``."""
        base, st = SNAPSHOT_ROLES[DENOISE], run.driver.state
        if getattr(st, "experts", None) and st.step > 0:
            from fastvideo3.loop.denoise import DenoiseLoop
            key = f"{base}:{DenoiseLoop().expert(st, st.step - 1)}"
            if key in self.executors:
                return key
        return base

    def _snapshot(self, run, role: str) -> tuple[bytes, str]:
        idx = run.placement.get(role)
        replicas = self.executors.get(role) or []
        if idx is None or idx >= len(replicas) or not isinstance(replicas[idx], Resumable):
            return b"", ""
        ex = replicas[idx]
        try:
            blob = ex.snapshot(run.request_id)
        except FastVideoError as e:
            with self._count_lock:
                self.counters["checkpoint_errors"] += 1
            log.warning("snapshot of %s on %s failed: %s", run.request_id, role, e.one_line())
            return b"", ""
        with self._count_lock:  # a batch's snapshots run on several threads at once
            self.counters["snapshots"] += 1
            self.counters["snapshot_bytes"] += len(blob)
        return blob, fingerprint_of(ex)

    def _write(self, record: RunRecord) -> None:
        if self._store_down():
            self.counters["checkpoint_skipped_store_down"] += 1
            return
        try:
            self.store.checkpoint(record.request_id, record.step, record.to_bytes())
        except Unavailable as e:
            self._store_failed(e)
        except FastVideoError as e:
            self.counters["checkpoint_errors"] += 1
            log.warning("checkpoint of %s refused: %s", record.request_id, e.one_line())

    # -- recovery from a lost replica ---------------------------------------------------------
    def recover(self, run, unit, res) -> bool:
        """Move ``run`` off a lost replica; True if it continues (scheduler lock held)."""
        err: ErrorInfo | None = res.error
        if err is None or err.code != "UNAVAILABLE":
            return False
        lost_pool = bool(err.details.get("dispatch_failed"))
        lost_region = bool(err.details.get("lost_region"))
        if not (lost_pool or lost_region):
            if err.field == "owner":  # the replica holding this unit's input is gone: make it again
                return self._remake_input(run, unit, err)
            return False  # e.g. a transfer from a peer failed: that is the request's failure
        rid, role = run.request_id, self.sched.pool_key(unit)
        replicas = self.executors.get(role) or []
        failed = run.placement.get(role)
        if lost_pool and failed is not None and failed < len(replicas) and isinstance(replicas[failed], Monitored):
            replicas[failed].healthy = False  # the health monitor turns it back on once it serves
        if self.recoveries.get(rid, 0) >= self.max_recoveries:
            self.counters["recovery_failed"] += 1
            return False
        order = [i for i in range(len(replicas)) if _healthy(replicas[i])]
        if lost_pool:  # somewhere else first
            order.sort(key=lambda i: (i == failed, self.sched.inflight.get(id(replicas[i]), 0)))
        if not order and lost_pool and role not in SNAPSHOT_ROLES.values() and self.replica_wait_s > 0 \
                and replicas:
            # nothing of the request lives on this role's replicas: wait for one to come back
            # (a restarted decoder re-decodes the final latents, still held by the denoiser)
            self.sched.park(run, role, self.replica_wait_s, self.sched.lost(run, unit, err))
            self.recoveries[rid] = self.recoveries.get(rid, 0) + 1
            self.counters["parked"] += 1
            log.warning("request %s waits up to %.0fs for a %s replica (%s)", rid, self.replica_wait_s, role,
                        err.message)
            self.sched.emit(run, EventKind.RESUMED, {"role": role, "replica": -1, "step": run.progress()[0],
                                              "reason": err.message, "waiting": True})
            return True
        if not order:
            self.counters["recovery_failed"] += 1
            return False
        rec = self.latest.get(rid)
        usable = (rec is not None and rec.snapshot and rec.snapshot_role == role
                  and rec.loop_index == run.loop_index and rec.loop_id == run.loop_id)
        target = self._restore_somewhere(rid, rec, replicas, order) if usable else None
        if target is None:  # no snapshot (or no replica took it): start the loop again
            target = order[0]
            try:
                replicas[target].release(rid)  # a stale region there would refuse step 0
            except FastVideoError:
                pass
            run.driver = None
            from_step = 0
        else:
            self._rewind(run, rec)
            from_step = rec.step
        run.placement[role] = target
        self.recoveries[rid] = self.recoveries.get(rid, 0) + 1
        self.counters["recovered"] += 1
        log.warning("request %s resumes on %s replica %d from step %d (%s)", rid, role, target, from_step,
                    err.message)
        self.sched.emit(run, EventKind.RESUMED, {"role": role, "replica": target, "step": from_step,
                                          "reason": err.message})
        return True

    def _remake_input(self, run, unit, err: ErrorInfo) -> bool:
        """The replica that held the unit's input died: produce the input again at the cheapest
        point. Final latents lost before decoding: the denoise loop goes back to its snapshot
        taken before the last step (on a healthy denoiser), runs that step, and decoding starts
        over. Encoder output lost mid-denoise: the prompt is encoded again, then denoising
        continues from the latest snapshot with the new embeddings."""
        rid, program = run.request_id, run.program
        if self.recoveries.get(rid, 0) >= self.max_recoveries or DENOISE not in program:
            return False
        den = program.index(DENOISE)
        denoisers = self.executors.get(Role.DENOISER) or []
        if run.loop_index > den:  # the final latents were lost with their denoiser
            lost = run.placement.get(Role.DENOISER)
            order = sorted((i for i in range(len(denoisers)) if _healthy(denoisers[i])), key=lambda i: i == lost)
            if not order:
                return False
            rec = self.before_final.get(rid)
            target = self._restore_somewhere(rid, rec, denoisers, order) if rec is not None else None
            run.loop_index = den
            for loop_id in program[den:]:
                run.ctx.payloads.pop(loop_id, None)
            if target is None:  # no snapshot: the denoise loop runs again (deterministic)
                self._release_role(rid, Role.DENOISER)
                run.driver, target, from_step = None, order[0], 0
            else:
                self._rewind(run, rec)
                from_step = rec.step
            run.placement[Role.DENOISER] = target
            what = "final latents"
        elif run.loop_index == den and LoopId.TEXT_ENCODE in program[:den]:  # the encoder output was lost
            rec = self.latest.get(rid)
            run.loop_index, run.driver = program.index(LoopId.TEXT_ENCODE), None
            run.placement.pop(Role.ENCODER, None)
            if rec is not None and rec.snapshot and rec.loop_id == DENOISE:
                run.continue_loop = (DENOISE, lambda r, fresh: self._continue_denoise(r, rec, fresh))
                from_step = rec.step
            else:
                self._release_role(rid, Role.DENOISER)
                run.placement.pop(Role.DENOISER, None)
                from_step = 0
            what = "encoder output"
        else:
            return False
        self.recoveries[rid] = self.recoveries.get(rid, 0) + 1
        self.counters["inputs_remade"] += 1
        log.warning("request %s lost its %s (%s): made again, denoising from step %d", rid, what, err.message,
                    from_step)
        self.sched.emit(run, EventKind.RESUMED,
                         {"role": unit.role, "step": from_step, "reason": err.message, "remade": what})
        return True

    def _continue_denoise(self, run, rec: RunRecord, fresh):
        """The denoise loop, started after its embeddings were encoded again: it goes on from
        ``rec``'s snapshot (restored on a healthy denoiser) with the new embeddings."""
        from fastvideo3.loop import LOOPS, STATES, LoopDriver
        denoisers = self.executors.get(Role.DENOISER) or []
        want = run.placement.get(Role.DENOISER)
        order = sorted((i for i in range(len(denoisers)) if _healthy(denoisers[i])), key=lambda i: i != want)
        target = self._restore_somewhere(run.request_id, rec, denoisers, order)
        if target is None:
            self._release_role(run.request_id, Role.DENOISER)
            run.placement.pop(Role.DENOISER, None)
            return fresh
        run.placement[Role.DENOISER] = target
        state = STATES[DENOISE].from_json(rec.loop_state).model_copy(update={"embeds": fresh.state.embeds})
        return LoopDriver(LOOPS[DENOISE](), state)

    def _release_role(self, rid: str, role: str) -> None:
        for ex in self.executors.get(role) or []:
            try:
                ex.release(rid)
            except FastVideoError:
                pass

    def _restore_somewhere(self, rid: str, rec: RunRecord, replicas: list, order: list[int]) -> int | None:
        for i in order:
            ex = replicas[i]
            if not isinstance(ex, Resumable):
                continue
            try:
                ex.restore(rid, rec.snapshot)
                return i
            except FastVideoError as e:
                log.warning("restore of %s on replica %d refused: %s", rid, i, e.one_line())
        return None

    @staticmethod
    def _rewind(run, rec: RunRecord) -> None:
        from fastvideo3.loop import LOOPS, STATES, LoopDriver
        run.driver = LoopDriver(LOOPS[rec.loop_id](), STATES[rec.loop_id].from_json(rec.loop_state))

    # -- terminal -----------------------------------------------------------------------------
    def finish(self, run, then: Callable[[], None] | None = None) -> None:
        """Record the artifact index and end the request in the store (outside the scheduler
        lock), then call ``then`` — with a writer, on its thread, after the request's earlier
        writes."""
        if self.writer is not None:
            self.writer.finish(run, then)
            return
        try:
            self._finish(run)
        finally:
            if then is not None:
                then()

    def _finish(self, run) -> None:
        rid, status = run.request_id, run.status
        if status not in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED):
            return  # the id was already reused by a newer request: that one owns the store record
        with self._lock:
            self.latest.pop(rid, None)
            self.before_final.pop(rid, None)
            self.recoveries.pop(rid, None)
        if status == RunStatus.SUCCEEDED and not self._store_down():
            fmt = run.ctx.encode or OutputFormat.MP4
            for loop_id, data in (run.artifacts or {}).items():
                meta = {"name": f"video.{fmt}", "loop": loop_id, "bytes": len(data),
                        "checksum": "sha256:" + hashlib.sha256(data).hexdigest()}
                try:  # the video itself first: the store says SUCCEEDED only once it holds the video
                    if len(data) <= self.media_max_bytes and self.store.put_media(rid, meta["name"], data):
                        meta["stored"] = True
                        self.counters["media_stored"] += 1
                    self.store.put_artifact(rid, meta["name"], meta)
                except Unavailable as e:
                    self._store_failed(e)
                    break
                except FastVideoError:
                    break
        with self._lock:
            self._end_infos[rid] = end_info(run)
        self._end(rid, status)

    def _end(self, rid: str, status: str) -> bool:
        if not self._store_down():
            try:
                if status in ("CANCELLED", "REFUSED"):  # nothing of it remains; its id is free
                    self.store.delete_request(rid)
                else:
                    self.store.end_request(rid, status, self._end_infos.get(rid))
                with self._lock:
                    self.pending_ends.pop(rid, None)
                    self._end_infos.pop(rid, None)
                return True
            except Unavailable as e:
                self._store_failed(e)
        with self._lock:
            if rid not in self.pending_ends:
                self.counters["ends_deferred"] += 1
            self.pending_ends[rid] = status
        return False

    def flush(self, wait: bool = False) -> int:
        """Retry ends deferred by a store outage; returns how many are still pending. With a
        writer, the writer retries them; ``wait`` first waits for every queued write, then
        retries here."""
        if self.writer is not None:
            if not wait:
                return len(self.pending_ends)
            self.writer.drain()
        return self._flush_now()

    def _flush_now(self) -> int:
        with self._lock:
            pending = dict(self.pending_ends)
        if pending and not self._store_down():
            for rid, status in pending.items():
                if not self._end(rid, status):
                    break
        return len(self.pending_ends)

    def forget(self, run) -> None:
        """The request was registered but not queued (e.g. the queue was full): drop it."""
        try:
            self.store.delete_request(run.request_id)
        except FastVideoError:
            pass

    # -- ended requests, read back ------------------------------------------------------------
    def ended(self, rid: str) -> dict | None:
        """An ended request as the store keeps it (within its TTL): ``meta`` (as registered),
        ``status``, ``info`` (error, progress, timings) and ``media`` (name -> bytes); None if the
        store does not know it as ended. Raises Unavailable when the store cannot be reached."""
        status = self.store.status(rid)
        if status is None or status == "INFLIGHT":
            return None
        meta = self.store.get_request(rid) or {}
        media = {}
        for name, art in self.store.artifacts(rid).items():
            if art.get("stored"):
                data = self.store.media(rid, name)
                if data is not None:
                    media[art.get("loop") or LoopId.VAE_DECODE] = data
        return {"meta": meta, "status": status, "info": self.store.end_info(rid) or {}, "media": media}

    def revive(self, request, card, program, ctx):
        """Run a request that failed with a retryable error again, under its id: it is registered
        anew and continues from the checkpoint it left (its ``resume_from_step``) or starts over.
        Returns the adopted RequestRun (scheduler lock held by the caller)."""
        from fastvideo3.runtime.scheduling.scheduler import RequestRun
        rid = request.request_id
        ck = None
        try:
            ck = self.store.load_checkpoint(rid)
        except Unavailable as e:
            self._store_failed(e)
        fresh = RequestRun(request=request, card=card, program=tuple(program), ctx=RequestContext.of(ctx))
        self.register(fresh)  # replaces the ended record (and its checkpoint): write it back below
        run, rec = fresh, None
        if ck is not None:
            try:
                rec = RunRecord.from_bytes(ck.loop_state)
                run = rebuild_run(rec, card)
                run.ctx.merge_options(fresh.ctx)
                self._resume_resident(run, rec)
                self.latest[rid] = rec
                self._write(rec)
            except FastVideoError as e:
                log.warning("checkpoint of %s not usable, starting over: %s", rid, e.one_line())
                run, rec = fresh, None
        if rec is None:
            self.sched.release(rid)
        run.resumed = True
        self.sched.adopt(run)
        self.counters["revived"] += 1
        log.info("request %s runs again from %s", rid, f"step {rec.step}" if rec is not None else "the start")
        return run

    # -- resume after a scheduler restart -----------------------------------------------------
    def resume(self, card) -> list[str]:
        """Adopt every request the store lists in flight; returns their ids. Call before ticking."""
        from fastvideo3.request.schema import ResolvedRequest
        from fastvideo3.runtime.scheduling.scheduler import RequestRun
        adopted = []
        for rid in self.store.list_inflight():
            try:
                meta = self.store.get_request(rid) or {}
                ck = self.store.load_checkpoint(rid)
                if meta.get("card_id") != card.model_id:
                    raise Unavailable(f"request is for card {meta.get('card_id')!r}, not {card.model_id!r}")
                if ck is None:  # admitted but never checkpointed: start it again, from nothing
                    run = RequestRun(request=ResolvedRequest.from_dict(meta["request"]), card=card,
                                     program=tuple(meta["program"]), ctx=RequestContext.from_dict(meta.get("ctx")),
                                     created=float(meta.get("created") or time.time()))
                    self.sched.release(rid)
                else:
                    rec = RunRecord.from_bytes(ck.loop_state)
                    run = rebuild_run(rec, card)
                    self._resume_resident(run, rec)
            except Exception as e:  # noqa: BLE001 - one bad record must not stop the others
                self.counters["resume_failed"] += 1
                log.error("cannot resume %s: %s", rid, e)
                self._end(rid, RunStatus.FAILED)
                continue
            run.resumed = True
            self.sched.adopt(run)
            self.counters["resumed"] += 1
            adopted.append(rid)
            log.info("resumed %s at loop %s step %d", rid, run.loop_id, run.progress()[0])
        return adopted

    def _resume_resident(self, run, rec: RunRecord) -> None:
        """Put the pools back at the record's step boundary (they may have gone further, or died)."""
        if DENOISE not in run.program or run.loop_index > run.program.index(DENOISE):
            return
        at_denoise = run.loop_id == DENOISE and run.driver is not None
        if at_denoise and run.driver.state.done:
            return  # the final latents are published on the denoiser: decoding reads them there
        mid_denoise = at_denoise
        if mid_denoise and rec.snapshot:
            role = rec.snapshot_role or SNAPSHOT_ROLES[DENOISE]
            replicas = self.executors.get(role) or []
            want = run.placement.get(role)
            order = [i for i in range(len(replicas)) if _healthy(replicas[i])]
            order.sort(key=lambda i: i != want)
            target = self._restore_somewhere(run.request_id, rec, replicas, order)
            if target is not None:
                run.placement[role] = target
                self.latest[run.request_id] = rec
                return
        # no exact state to go back to: the denoise loop starts over (deterministic from the seed)
        for key in [k for k in self.executors if k.partition(":")[0] == Role.DENOISER]:  # and denoiser:EXPERT
            for ex in self.executors[key]:
                try:
                    ex.release(run.request_id)
                except FastVideoError:
                    pass
            run.placement.pop(key, None)
        if mid_denoise:
            run.driver = None


def end_info(run) -> dict:
    """What the store records with a request's terminal status: its error, progress and timings
    (read back by a scheduler that did not run it, for GetRequest and re-attach)."""
    err = run.error
    step, total = run.progress()
    last = next((e for e in reversed(run.events) if e.kind == EventKind.PROGRESS), None)
    if last is not None:
        step, total = int(last.data.get("step", 0)), int(last.data.get("total", 0))
    out = {"step": step, "total": total, "phase_seconds": dict(run.phase_seconds), "started": run.started,
           "ended": time.time()}
    if err is not None:
        import json
        details = {}
        for k, v in err.details.items():
            try:
                json.dumps(v)
                details[k] = v
            except (TypeError, ValueError):
                details[k] = str(v)
        out["error"] = {"code": err.code, "message": err.message, "field": err.field, "limit": err.limit,
                        "step": err.step, "retry_after_s": err.retry_after_s, "details": details}
    return out
