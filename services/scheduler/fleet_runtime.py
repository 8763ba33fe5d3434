"""FleetRuntime: the core scheduler driven by a background tick thread, plus per-request streams.

* ``submit`` queues a request and returns a stream (a queue of core events, copied);
* the tick thread runs :meth:`CoreScheduler.tick` whenever there is work: each tick plans one
  step for every running request, batches compatible units across requests, places them on
  replicas and folds the results back; it sleeps on an event when idle (woken by submit/cancel);
* a request that reached a terminal state is freed on the replicas that ran its units right
  after its tick: a replica with a batch in flight gets the id on its next Execute (or by Release
  after ``release_after_s`` without one), an idle replica — and every replica, for a cancelled
  request — by a Release call, off the tick thread. Only then — after its end was written to
  the state store, or deferred — does its stream get the ``finished`` event: a client that saw
  ``finished`` finds nothing of its request left in any idle pool. Artifact bytes are dropped
  from the retained record once copied into the stream;
* ``cancel`` takes effect at the request's next step boundary;
* old finished requests are forgotten beyond ``retain_finished``;
* with a :class:`~fastvideo3.runtime.durability.checkpointer.Checkpointer`, requests are registered in the
  state store before they queue, checkpointed at step boundaries, moved off lost replicas, and
  ended in the store when they finish. A request a restarted scheduler resumed runs without a
  client until one **re-attaches**: a Generate with the same request id (and the same
  parameters) gets an ``accepted`` event and then the request's remaining events — or, if it
  already ended, its result (artifact and ``finished``), kept until then. A **detached**
  request (``ctx.detached``, from GenerateRequest.detached) is treated the same way when its
  client goes away: it keeps running, unowned, until a client re-attaches or cancels it.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

from fastvideo3.errors import AlreadyExists, ErrorInfo, FastVideoError, NotFound, Unavailable
from fastvideo3.loop.context import RequestContext
from fastvideo3.runtime.scheduling.cohorts import batch_cap
from fastvideo3.runtime.scheduling.executor import Executor
from fastvideo3.runtime.scheduling.scheduler import TERMINAL, CoreScheduler, Event, RequestRun
from fastvideo3.vocab import EventKind, LoopId, OutputFormat, RunStatus

log = logging.getLogger("fastvideo3.scheduler")


class Stream:
    """One Generate call's view of its request: the events, and whether the client is still there."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.events: "queue.Queue[Event]" = queue.Queue()
        self.closed = False


class FleetRuntime:
    def __init__(self, executors: dict[str, list[Executor]], *, batching: bool = True, max_batch: int = 16,
                 max_running: int = 64, max_queued: int = 256, retain_finished: int = 1000,
                 pricer=None, admission=None, telemetry=None, checkpointer=None, batch_bucket: int | None = None,
                 pipeline_depth: int = 2, split_min_units: int = 8, release_after_s: float = 1.0,
                 cohort_rows: str | int = "auto"):
        """``pipeline_depth``: batches a denoiser replica holds at once (2: double-buffered dispatch,
        see fastvideo3.runtime.scheduling.dispatcher). ``split_min_units``: a denoise round this large for an
        idle denoiser replica is cut in two halves that then alternate, so the replica always has
        the next batch waiting (off in batch-invariant mode, where every half would be padded to
        the bucket, and without batching). A checkpoint's snapshot of a request in one half waits
        for the other half's step on the replica: the replica stays busy meanwhile.
        ``cohort_rows``: ``auto`` caps a denoise batch at the fewest rows the replica's timed graph
        buckets run as cheaply per row as the best (cohorts, fastvideo3.runtime.scheduling.cohorts),
        a number caps it at that many rows, ``off`` leaves ``max_batch`` alone. Off in
        batch-invariant mode (every batch is padded to the bucket there) and without batching."""
        replicas = sum(len(v) for v in executors.values())
        cp = checkpointer
        split = 0 if (batch_bucket or not batching) else split_min_units
        cap = None if (batch_bucket or not batching) else batch_cap(cohort_rows, split_min_units=split)
        self._core = CoreScheduler(executors, max_batch=max_batch if batching else 1, max_running=max_running,
                                   max_queued=max_queued, on_event=self._on_event, parallel_dispatch=True,
                                   pipelined=True, wake=self._wake_up, pipeline_depth=pipeline_depth,
                                   split_min_units=split, release_after_s=release_after_s,
                                   dispatch_workers=max(4, replicas * max(1, pipeline_depth) + 2),
                                   pricer=pricer, admission=admission,
                                   telemetry=telemetry, checkpoint=cp.checkpoint if cp else None,
                                   admit_hook=cp.register if cp else None, recover=cp.recover if cp else None,
                                   checkpoint_step=cp.checkpoint_step if cp else None, snapshots=cp,
                                   batch_cap=cap)
        self.card_of = None  # card id -> ModelCard, for requests read back from the store
        self.checkpointer = cp.attach(self._core) if cp else None
        self.batching = batching
        self.batch_bucket = batch_bucket  # batch-invariant mode: units per denoise forward (None = off)
        self.retain_finished = retain_finished
        self.streams: dict[str, Stream] = {}
        self._finished: deque[str] = deque()
        self._ended: dict[str, float] = {}  # ended request -> when it ended (unix seconds)
        # with a state store, an ended request is known for its TTL there, and no longer here either
        store_cfg = getattr(getattr(cp, "store", None), "config", None)
        self.ended_ttl_s: float | None = getattr(store_cfg, "ttl_after_end_s", None)
        self._to_release: list[tuple[str, Event, Stream | None]] = []  # terminal requests, held-back finished events
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.tick_errors = 0
        self._thread = threading.Thread(target=self._loop, name="tick", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _wake_up(self) -> None:  # a batch came back: plan the next round now
        self._wake.set()

    # -- requests ---------------------------------------------------------------------------
    def submit(self, request, card, *, program: tuple[str, ...], ctx: RequestContext, trace_parent=None) -> Stream:
        """Queue a request, or — when its id is taken — apply the id rules (docs/reliability.md):
        the same parameters re-attach to a live request, replay an ended one's result, or run a
        request that failed with a retryable error again (from its checkpoint); other parameters
        are refused with ALREADY_EXISTS naming ``request_id``."""
        rid = request.request_id
        ctx = RequestContext.of(ctx)
        if self.batch_bucket:  # the denoise loop pins it into the request's state (a resume keeps it)
            ctx.batch_bucket = self.batch_bucket
        existing = self.lookup(rid)
        if existing is not None and not (existing.status == RunStatus.CANCELLED):
            if existing.request != request:
                what = "a live" if existing.status not in TERMINAL else f"a retained ({existing.status})"
                raise AlreadyExists(f"request id {rid!r} is taken by {what} request with other parameters",
                                    field="request_id", request_id=rid)
            if existing.status not in TERMINAL:
                if not existing.resumed:
                    raise AlreadyExists(f"request {rid!r} is running and a client is attached to it",
                                        field="request_id", request_id=rid)
                return self._reattach(existing, request, detached=ctx.detached)
            retry = existing.status == RunStatus.FAILED and existing.error is not None and \
                existing.error.details.get("retryable") in (True, "true", "True")
            if retry and self.checkpointer is not None:
                return self._retry(request, card, program, ctx)
            if not retry:  # its result, replayed to this client
                if existing.status == RunStatus.SUCCEEDED:
                    self._load_media(existing)
                return self._reattach(existing, request, detached=ctx.detached)
            # retryable, no store to resume from: it runs again from the start (below)
        stream = Stream(request.request_id)
        with self._lock:
            previous = self.streams.get(request.request_id)
            self.streams[request.request_id] = stream
        try:
            self._core.submit(request, card, program=program, ctx=ctx, trace_parent=trace_parent)
        except BaseException:
            with self._lock:
                if previous is not None:
                    self.streams[request.request_id] = previous
                else:
                    self.streams.pop(request.request_id, None)
            raise
        self._wake.set()
        return stream

    def _retry(self, request, card, program, ctx) -> Stream:
        """Run a retained, retryably failed request again under its id (from its checkpoint)."""
        stream = Stream(request.request_id)
        with self._core.lock:
            run = self.checkpointer.revive(request, card, program, ctx)
            with self._lock:
                self.streams[request.request_id] = stream
            run.resumed = False
            run.ctx.detached = ctx.detached
            stream.events.put(Event(run.request_id, 0, EventKind.ACCEPTED, {"model": card.model_id, "resumed": True}))
        self._wake.set()
        return stream

    def lookup(self, request_id: str) -> RequestRun | None:
        """The request with this id: in memory, or — ended within the store's TTL, e.g. before a
        restart — rebuilt read-only from the store (and retained like any ended request)."""
        run = self._core.get(request_id)
        if run is not None and run.status in TERMINAL and self.ended_ttl_s is not None and \
                time.time() - self._ended.get(request_id, time.time()) > self.ended_ttl_s:
            self._core.forget(request_id)  # its keys expired in the store: the id is unknown now
            self._ended.pop(request_id, None)
            run = None
        if run is not None or self.checkpointer is None:
            return run
        try:
            kept = self.checkpointer.ended(request_id)
        except FastVideoError as e:
            log.warning("cannot read %s from the state store: %s", request_id, e.one_line())
            return None
        if kept is None:
            return None
        run = ended_run(request_id, kept, self.card_of)
        if run is None:
            return None
        retained = self._core.retain(run)
        if retained is not run:  # raced with a submit
            return retained
        with self._lock:
            self._finished.append(request_id)
            self._ended[request_id] = float(kept["info"].get("ended") or time.time())
        return run

    def _load_media(self, run: RequestRun) -> None:
        """Put a SUCCEEDED request's video back into its artifact event (bytes are not kept in
        memory after delivery; the store keeps them for its TTL)."""
        ev = next((e for e in run.events if e.kind == EventKind.ARTIFACT), None)
        if ev is None or (ev.data.get("artifacts") or {}).get(LoopId.VAE_DECODE):
            return
        data = None
        if self.checkpointer is not None:
            fmt = run.ctx.encode or OutputFormat.MP4
            try:
                data = self.checkpointer.store.media(run.request_id, f"video.{fmt}")
            except FastVideoError as e:
                raise Unavailable(f"the video of {run.request_id!r} cannot be read back: {e.message}",
                                  field="state_store", retry_after_s=1.0) from None
        if data is None:
            raise NotFound(f"request {run.request_id!r} succeeded but its video is no longer kept",
                           field="request_id")
        ev.data = {**ev.data, "artifacts": {LoopId.VAE_DECODE: data}}

    def _reattach(self, run: RequestRun, request, detached: bool = False) -> Stream:
        """A client takes over a request the scheduler resumed after a restart (see module doc)."""
        if run.request != request:
            raise AlreadyExists("a request with this id has other parameters", field="request_id",
                                request_id=run.request_id)
        stream = Stream(run.request_id)
        with self._core.lock:  # no event of the run is emitted while the stream is wired in
            with self._lock:
                old = self.streams.get(run.request_id)
                if old is not None and not old.closed:
                    raise AlreadyExists("a client is already attached to this request", field="request_id",
                                        request_id=run.request_id)
                self.streams[run.request_id] = stream
            run.resumed = False  # the client owns it now: a disconnect cancels it, as for any stream
            run.ctx.detached = detached  # ... unless this client detached it again
            stream.events.put(Event(run.request_id, 0, EventKind.ACCEPTED,
                                    {"model": run.card.model_id, "resumed": True}))
            if run.status in TERMINAL:  # it ended before anyone re-attached: replay its result
                for ev in run.events:
                    if ev.kind in (EventKind.ARTIFACT, EventKind.ERROR, EventKind.FINISHED):
                        stream.events.put(Event(ev.request_id, ev.seq, ev.kind, dict(ev.data)))
        log.info("client re-attached to resumed request %s (%s)", run.request_id, run.status)
        return stream

    def cancel(self, request_id: str) -> bool:
        ok = self._core.cancel(request_id)
        self._wake.set()
        return ok

    def disconnect(self, stream: Stream) -> None:
        """The stream's client went away: cancel its request unless it already ended."""
        stream.closed = True
        with self._lock:
            current = self.streams.get(stream.request_id) is stream
        if current:
            run = self._core.get(stream.request_id)
            if run is not None and run.status not in TERMINAL and run.ctx.detached:
                run.resumed = True  # runs on, unowned, until a client re-attaches (see module doc)
                log.info("client of detached %s disconnected: it runs on", stream.request_id)
            elif run is not None and run.status not in TERMINAL and self.cancel(stream.request_id):
                log.info("client of %s disconnected: cancelled", stream.request_id)

    def close_stream(self, stream: Stream) -> None:
        stream.closed = True
        with self._lock:
            if self.streams.get(stream.request_id) is stream:
                del self.streams[stream.request_id]

    def get(self, request_id: str) -> RequestRun | None:
        return self._core.get(request_id)

    # -- the tick thread --------------------------------------------------------------------
    def _on_event(self, ev: Event) -> None:  # called with the scheduler lock held: stay quick
        copy = Event(ev.request_id, ev.seq, ev.kind, dict(ev.data))
        with self._lock:
            stream = self.streams.get(ev.request_id)
            if ev.kind == EventKind.FINISHED:  # delivered after the release, see _after_tick
                self._to_release.append((ev.request_id, copy, stream))
                return
        if stream is not None and not stream.closed:
            stream.events.put(copy)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self._core.tick()
            except Exception:  # noqa: BLE001 - a bug in one tick must not stop the fleet
                self.tick_errors += 1
                log.exception("scheduler tick failed")
                worked = False
            self._after_tick()
            self._core.flush_releases()  # ended ids no Execute carried in time: by Release
            if self.checkpointer is not None and self.checkpointer.pending_ends:
                self.checkpointer.flush()  # ends deferred by a state-store outage
            if not worked:
                self._wake.wait(0.05 if self._core.active() else 1.0)
                self._wake.clear()

    def _after_tick(self) -> None:
        with self._lock:
            done, self._to_release = self._to_release, []
        for rid, finished, stream in done:
            run = self._core.get(rid)
            # the replicas that ran it free it (off this thread); then artifact index + end (or
            # delete) in the state store; then the client's finished (with a writer thread, the
            # store writes are off the release threads too: a slow store holds up no step)
            self._core.release_ended(rid, then=lambda r=run, i=rid, f=finished, s=stream: self._freed(i, r, f, s))

    def _freed(self, rid: str, run: RequestRun | None, finished: Event, stream: Stream | None) -> None:
        """The ended request's replicas freed it: its end goes to the store, then to its client."""
        if self.checkpointer is not None and run is not None:
            self.checkpointer.finish(run, then=lambda: self._deliver(rid, run, finished, stream))
        else:
            self._deliver(rid, run, finished, stream)

    def _deliver(self, rid: str, run: RequestRun | None, finished: Event, stream: Stream | None) -> None:
        """A terminal request's ``finished`` to its client; the retained record loses its bytes."""
        if stream is not None and not stream.closed:
            stream.events.put(finished)
        if run is not None and run.resumed and (stream is None or stream.closed):
            pass  # no client yet: keep its result for the one that re-attaches
        elif run is not None:
            run.artifacts = {}
            for ev in run.events:  # the stream got its own copy; drop bytes from the record
                if ev.kind == EventKind.ARTIFACT:
                    ev.data = {k: v for k, v in ev.data.items() if k != "artifacts"}
        with self._lock:
            self._finished.append(rid)
            self._ended[rid] = time.time()
            old = [self._finished.popleft() for _ in range(max(0, len(self._finished) - self.retain_finished))]
            for gone in old:
                self._ended.pop(gone, None)
        for gone in old:  # the oldest ended requests: read back from the store from now on
            self._core.forget(gone)

    def hand_over(self, timeout_s: float = 30.0) -> list[str]:
        """Stop stepping without ending anything (a leader leaving: another replica adopts the
        requests from their checkpoints, still in flight in the store). Waits for the batches in
        flight to come back, so no step of this replica lands after the adopter restored a
        snapshot; then every open stream ends with a retryable UNAVAILABLE telling its client to
        re-attach. Returns the ids left in flight."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
        end = time.monotonic() + timeout_s
        while self._core.in_flight() and time.monotonic() < end:
            time.sleep(0.05)  # the dispatch threads apply their results and free the replicas
        self._after_tick()  # requests that ended meanwhile: their ends reach the store and clients
        self._core.flush_releases_now()
        self._core.drain(max(0.0, end - time.monotonic()))
        if self.checkpointer is not None:
            self.checkpointer.flush(wait=True)  # every queued checkpoint and end written first
        left = [r.request_id for r in self._core.active()]
        with self._lock:
            streams = list(self.streams.values())
        for stream in streams:
            stream.events.put(Event(stream.request_id, -1, EventKind.MOVED, {}))
        return left

    def stop(self, cancel_active: bool = True, timeout_s: float = 10.0) -> None:
        if cancel_active:  # cancelled at their next step boundary by the still-running tick thread
            active = self._core.active()
            for run in active:
                self.cancel(run.request_id)
            end = time.monotonic() + timeout_s
            for run in active:
                run.done_event.wait(max(0.0, end - time.monotonic()))
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30.0)
        self._after_tick()
        self._core.flush_releases_now()
        self._core.drain(timeout_s)
        if cancel_active:  # the cancelled ones are terminal now (or the tick thread was stuck)
            for run in list(self._core.runs.values()):
                self._core.release(run.request_id)
        if self.checkpointer is not None:
            self.checkpointer.flush(wait=True)
            self.checkpointer.store.close()
        self._core.close()

    # -- what services read ---------------------------------------------------------------
    @property
    def pricer(self):
        """The scheduler's Pricer (None: pricing off)."""
        return self._core.pricer

    @property
    def admission(self):
        """The scheduler's AdmissionController (None: admission off)."""
        return self._core.admission

    @property
    def telemetry(self):
        """The scheduler's SchedulerTelemetry (its tracing and metrics)."""
        return self._core.telemetry

    def active(self) -> list[RequestRun]:
        """Requests not yet terminal."""
        return self._core.active()

    def in_flight_units(self, replica) -> int:
        """Units of this scheduler running on ``replica`` now."""
        return int(self._core.inflight.get(id(replica), 0))

    def recent_batch_sizes(self, n: int = 64) -> list[int]:
        """Sizes of the last ``n`` denoise batches."""
        return list(self._core.batch_sizes)[-n:]

    def counters(self) -> dict[str, float]:
        c = dict(self._core.counters)
        c.update({f"dispatch.{k}": v for k, v in self._core.dispatcher.counters.items()})
        c["dispatch.pending_releases"] = self._core.dispatcher.pending_releases()
        c["tick_errors"] = self.tick_errors
        # the cohort cap (units) the latest denoise batches were cut at; 0: none applied
        c["cohort_cap_units"] = max(self._core.planner.cohort_caps.values(), default=0)
        c["streams_open"] = len(self.streams)
        c["queued_requests"] = sum(r.status == RunStatus.QUEUED for r in self._core.runs.values())
        c["running_requests"] = sum(r.status == RunStatus.RUNNING for r in self._core.runs.values())
        if self.checkpointer is not None:
            c.update({f"state.{k}": v for k, v in self.checkpointer.counters.items()})
            c["state.pending_ends"] = len(self.checkpointer.pending_ends)
        return c


def ended_run(request_id: str, kept: dict, card_of) -> RequestRun | None:
    """A read-only RequestRun of a request that ended under another scheduler (or before a
    restart), from what the store kept: its events are its result (artifact or error) and
    ``finished``."""
    from fastvideo3.request.schema import ResolvedRequest
    meta, info = kept["meta"], kept["info"]
    card = card_of(meta.get("card_id")) if card_of is not None else None
    if card is None or "request" not in meta:
        return None
    try:
        ctx = RequestContext.from_dict(meta.get("ctx"))
    except FastVideoError as e:  # an unreadable context costs the replay its format and scores, not the lookup
        log.warning("request %s: stored context not readable: %s", request_id, e.one_line())
        ctx = RequestContext()
    run = RequestRun(request=ResolvedRequest.from_dict(meta["request"]), card=card,
                     program=tuple(meta.get("program") or ()), ctx=ctx,
                     created=float(meta.get("created") or time.time()))
    run.status, run.started = kept["status"], info.get("started")
    run.loop_index = len(run.program)
    run.phase_seconds = dict(info.get("phase_seconds") or {})
    run.events.append(Event(request_id, 0, EventKind.PROGRESS, {"phase": "done", "step": int(info.get("step", 0)),
                                                        "total": int(info.get("total", 0))}))
    if run.status == RunStatus.SUCCEEDED:
        run.artifacts = dict(kept["media"])
        run.events.append(Event(request_id, 1, EventKind.ARTIFACT, {"outputs": {}, "phase_seconds": run.phase_seconds,
                                                            "artifacts": dict(kept["media"])}))
    elif info.get("error"):
        e = info["error"]
        run.error = ErrorInfo(e["code"], e["message"], e.get("field"), e.get("limit"), e.get("step"),
                              e.get("retry_after_s"), dict(e.get("details") or {}))
        run.events.append(Event(request_id, 1, EventKind.ERROR, {"error": run.error}))
    run.events.append(Event(request_id, 2, EventKind.FINISHED, {"status": run.status}))
    run.done_event.set()
    return run
