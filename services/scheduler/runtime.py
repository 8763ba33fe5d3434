"""FleetRuntime: the core scheduler driven by a background tick thread, plus per-request streams.

* ``submit`` queues a request and returns a stream (a queue of core events, copied);
* the tick thread runs :meth:`CoreScheduler.tick` whenever there is work: each tick plans one
  step for every running request, batches compatible units across requests, places them on
  replicas and folds the results back; it sleeps on an event when idle (woken by submit/cancel);
* a request that reached a terminal state is released on every pool replica right after its
  tick, and only then does its stream get the ``finished`` event: a client that saw
  ``finished`` finds nothing of its request left in any pool. Artifact bytes are dropped from
  the retained record once copied into the stream;
* ``cancel`` takes effect at the request's next step boundary;
* old finished requests are forgotten beyond ``retain_finished``;
* with a :class:`~fastvideo3.runtime.checkpointer.Checkpointer`, requests are registered in the
  state store before they queue, checkpointed at step boundaries, moved off lost replicas, and
  ended in the store when they finish. A request a restarted scheduler resumed runs without a
  client until one **re-attaches**: a Generate with the same request id (and the same
  parameters) gets an ``accepted`` event and then the request's remaining events — or, if it
  already ended, its result (artifact and ``finished``), kept until then. A **detached**
  request (``ctx["detached"]``, from GenerateRequest.detached) is treated the same way when its
  client goes away: it keeps running, unowned, until a client re-attaches or cancels it.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

from fastvideo3.errors import InvalidRequest
from fastvideo3.runtime.scheduler import TERMINAL, CoreScheduler, Event, RequestRun

log = logging.getLogger("fastvideo3.scheduler")


class Stream:
    """One Generate call's view of its request: the events, and whether the client is still there."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.events: "queue.Queue[Event]" = queue.Queue()
        self.closed = False


class FleetRuntime:
    def __init__(self, executors: dict[str, list[Any]], *, batching: bool = True, max_batch: int = 16,
                 max_running: int = 64, max_queued: int = 256, retain_finished: int = 1000,
                 pricer=None, admission=None, telemetry=None, checkpointer=None):
        replicas = sum(len(v) for v in executors.values())
        cp = checkpointer
        self.sched = CoreScheduler(executors, max_batch=max_batch if batching else 1, max_running=max_running,
                                   max_queued=max_queued, on_event=self._on_event, parallel_dispatch=True,
                                   pipelined=True, wake=self._wake_up,
                                   dispatch_workers=max(4, replicas), pricer=pricer, admission=admission,
                                   telemetry=telemetry, checkpoint=cp.checkpoint if cp else None,
                                   admit_hook=cp.register if cp else None, recover=cp.recover if cp else None)
        self.checkpointer = cp.attach(self.sched) if cp else None
        self.batching = batching
        self.retain_finished = retain_finished
        self.streams: dict[str, Stream] = {}
        self._finished: deque[str] = deque()
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
    def submit(self, request, card, *, program: tuple[str, ...], ctx: dict, trace_parent=None) -> Stream:
        resumed = self.sched.get(request.request_id)
        if resumed is not None and resumed.resumed:
            return self._reattach(resumed, request, detached=bool(ctx.get("detached")))
        stream = Stream(request.request_id)
        with self._lock:
            previous = self.streams.get(request.request_id)
            self.streams[request.request_id] = stream
        try:
            self.sched.submit(request, card, program=program, ctx=ctx, trace_parent=trace_parent)
        except BaseException:
            with self._lock:
                if previous is not None:
                    self.streams[request.request_id] = previous
                else:
                    self.streams.pop(request.request_id, None)
            raise
        self._wake.set()
        return stream

    def _reattach(self, run: RequestRun, request, detached: bool = False) -> Stream:
        """A client takes over a request the scheduler resumed after a restart (see module doc)."""
        if run.request != request:
            raise InvalidRequest("a resumed request with this id has other parameters", field="request_id")
        stream = Stream(run.request_id)
        with self.sched._lock:  # no event of the run is emitted while the stream is wired in
            with self._lock:
                old = self.streams.get(run.request_id)
                if old is not None and not old.closed:
                    raise InvalidRequest("a client is already attached to this request", field="request_id")
                self.streams[run.request_id] = stream
            run.resumed = False  # the client owns it now: a disconnect cancels it, as for any stream
            run.ctx["detached"] = detached  # ... unless this client detached it again
            stream.events.put(Event(run.request_id, 0, "accepted", {"model": run.card.model_id, "resumed": True}))
            if run.status in TERMINAL:  # it ended before anyone re-attached: replay its result
                for ev in run.events:
                    if ev.kind in ("artifact", "error", "finished"):
                        stream.events.put(Event(ev.request_id, ev.seq, ev.kind, dict(ev.data)))
        log.info("client re-attached to resumed request %s (%s)", run.request_id, run.status)
        return stream

    def cancel(self, request_id: str) -> bool:
        ok = self.sched.cancel(request_id)
        self._wake.set()
        return ok

    def disconnect(self, stream: Stream) -> None:
        """The stream's client went away: cancel its request unless it already ended."""
        stream.closed = True
        with self._lock:
            current = self.streams.get(stream.request_id) is stream
        if current:
            run = self.sched.get(stream.request_id)
            if run is not None and run.status not in TERMINAL and run.ctx.get("detached"):
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
        return self.sched.get(request_id)

    # -- the tick thread --------------------------------------------------------------------
    def _on_event(self, ev: Event) -> None:  # called with the scheduler lock held: stay quick
        copy = Event(ev.request_id, ev.seq, ev.kind, dict(ev.data))
        with self._lock:
            stream = self.streams.get(ev.request_id)
            if ev.kind == "finished":  # delivered after the release, see _after_tick
                self._to_release.append((ev.request_id, copy, stream))
                return
        if stream is not None and not stream.closed:
            stream.events.put(copy)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self.sched.tick()
            except Exception:  # noqa: BLE001 - a bug in one tick must not stop the fleet
                self.tick_errors += 1
                log.exception("scheduler tick failed")
                worked = False
            self._after_tick()
            if self.checkpointer is not None and self.checkpointer.pending_ends:
                self.checkpointer.flush()  # ends deferred by a state-store outage
            if not worked:
                self._wake.wait(0.05 if self.sched.active() else 1.0)
                self._wake.clear()

    def _after_tick(self) -> None:
        with self._lock:
            done, self._to_release = self._to_release, []
        for rid, finished, stream in done:
            self.sched.release(rid)  # every replica of every role frees the request
            run = self.sched.get(rid)
            if self.checkpointer is not None and run is not None:
                self.checkpointer.finish(run)  # artifact index + end (or delete) in the state store
            if stream is not None and not stream.closed:
                stream.events.put(finished)
            if run is not None and run.resumed and (stream is None or stream.closed):
                pass  # no client yet: keep its result for the one that re-attaches
            elif run is not None:
                run.artifacts = {}
                for ev in run.events:  # the stream got its own copy; drop bytes from the record
                    if ev.kind == "artifact":
                        ev.data = {k: v for k, v in ev.data.items() if k != "artifacts"}
            self._finished.append(rid)
        while len(self._finished) > self.retain_finished:
            self.sched.forget(self._finished.popleft())

    def stop(self, cancel_active: bool = True, timeout_s: float = 10.0) -> None:
        if cancel_active:  # cancelled at their next step boundary by the still-running tick thread
            active = self.sched.active()
            for run in active:
                self.cancel(run.request_id)
            end = time.monotonic() + timeout_s
            for run in active:
                run.done_event.wait(max(0.0, end - time.monotonic()))
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30.0)
        if cancel_active:  # the cancelled ones are terminal now (or the tick thread was stuck)
            for run in list(self.sched.runs.values()):
                self.sched.release(run.request_id)
        if self.checkpointer is not None:
            self.checkpointer.flush()
            self.checkpointer.store.close()
        self.sched.close()

    def counters(self) -> dict[str, float]:
        c = dict(self.sched.counters)
        c["tick_errors"] = self.tick_errors
        c["streams_open"] = len(self.streams)
        c["queued_requests"] = sum(r.status == "QUEUED" for r in self.sched.runs.values())
        c["running_requests"] = sum(r.status == "RUNNING" for r in self.sched.runs.values())
        if self.checkpointer is not None:
            c.update({f"state.{k}": v for k, v in self.checkpointer.counters.items()})
            c["state.pending_ends"] = len(self.checkpointer.pending_ends)
        return c
