"""Jobs against the fleet: one thread per running job follows its Generate stream.

A job is submitted **detached** under its own id (the fleet's request id): if this gateway goes
away, the scheduler keeps running the request, and a restarted gateway re-attaches to it by
sending the same request again (:meth:`JobRunner.resume`): it gets the events still to come, or
the kept result. Every state change is written to the :class:`JobStore`, so any gateway replica
answers GET from the store, never from a thread's memory.

Progress (0-100) comes from the scheduler's step events: encode 0-5, denoise 5-90, decode 90-98,
reward 98-99; 100 only once the video is stored.
"""
from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from typing import Any

import grpc

from fastvideo3.client import FleetClient, _event
from fastvideo3.rpc import error_from_rpc
from fastvideo3.errors import FastVideoError, Internal, InvalidRequest, ResourceExhausted, Unavailable
from fastvideo3.vocab import EventKind, OutputFormat, Phase, RunStatus
from fleet.gateway.errors import job_error
from fleet.gateway.jobs import JobStore, now_ms
from fleet.gateway.media import MediaStore
from fleet.gateway.params import VideoSpec

log = logging.getLogger("fastvideo3.gateway")

PHASE_SPAN = {Phase.ENCODE: (0, 5), Phase.DENOISE: (5, 90), Phase.DECODE: (90, 98), Phase.REWARD: (98, 99)}
WRITE_EVERY_S = 0.2       # at most this often a progress-only change is written to the store
REATTACH_WINDOW_S = 60.0  # how long a re-attach retries (old stream still closing, scheduler restarting)
MAX_REATTACHES = 5        # lost streams a job survives (e.g. scheduler restarts) before it fails


def progress_of(phase: str, step: int, total: int) -> int:
    lo, hi = PHASE_SPAN.get(phase, (0, 99))
    frac = min(1.0, step / total) if total > 0 else 0.0
    return int(lo + (hi - lo) * frac)


class JobRunner:
    def __init__(self, client: FleetClient, jobs: JobStore, media: MediaStore, *, accept_timeout_s: float = 60.0,
                 job_timeout_s: float = 3600.0) -> None:
        self.client, self.jobs, self.media = client, jobs, media
        self.accept_timeout_s, self.job_timeout_s = accept_timeout_s, job_timeout_s
        self._lock = threading.Lock()
        self._active: dict[str, str] = {}     # job id -> owner key id
        self._calls: dict[str, Any] = {}      # job id -> the live gRPC call
        self._deleted: set[str] = set()

    # -- bookkeeping ----------------------------------------------------------------------
    def active(self) -> list[str]:
        with self._lock:
            return list(self._active)

    def _message(self, job_id: str, spec: VideoSpec):
        return self.client.request(spec.prompt, model=spec.model, request_id=job_id, output_format=OutputFormat.MP4,
                                   detached=True, **spec.params)

    # -- submit / resume --------------------------------------------------------------------
    def submit(self, job: dict[str, Any], max_per_owner: int | None = None) -> dict[str, Any]:
        """Start ``job`` (already validated); blocks until the fleet accepted it. Raises the fleet's
        typed error if it refused (nothing is left behind then), or ResourceExhausted when its
        owner already runs ``max_per_owner`` jobs here (checked and reserved atomically)."""
        spec = VideoSpec.from_public(job["spec"])
        owner = job.get("owner", "")
        with self._lock:
            if max_per_owner is not None and sum(o == owner for o in self._active.values()) >= max_per_owner:
                raise ResourceExhausted("too many running jobs for this key; retry when one finishes",
                                        limit=f"{max_per_owner} at once", retry_after_s=1.0)
            self._active[job["id"]] = owner  # reserved: counts against the owner from now on
        try:
            self.jobs.create(job)
        except BaseException:
            with self._lock:
                self._active.pop(job["id"], None)
            raise
        first: queue.Queue = queue.Queue(maxsize=1)
        self._start(job, spec, first, window_s=0.0)
        try:
            outcome = first.get(timeout=self.accept_timeout_s + 5.0)
        except queue.Empty:
            outcome = Unavailable(f"the fleet did not answer within {self.accept_timeout_s:.0f}s")
            self.cancel(job["id"])
        if isinstance(outcome, BaseException):
            self.jobs.delete(job["id"])
            raise outcome
        return self.jobs.get(job["id"]) or job

    def resume(self, window_s: float = REATTACH_WINDOW_S) -> list[str]:
        """Re-attach to every unfinished job no thread here follows; returns their ids. A job
        another gateway replica follows is refused by the scheduler (a client is attached) for
        ``window_s`` and then left to that replica."""
        ids = []
        for job_id in self.jobs.inflight():
            job = self.jobs.get(job_id)
            if job is None or job_id in self._active:
                continue
            self._start(job, VideoSpec.from_public(job["spec"]), None, window_s=window_s)
            ids.append(job_id)
        if ids:
            log.info("re-attaching to %d job(s): %s", len(ids), ", ".join(ids))
        return ids

    def _start(self, job, spec, first, window_s: float) -> None:
        with self._lock:
            self._active[job["id"]] = job.get("owner", "")
        threading.Thread(target=self._run, args=(dict(job), spec, first, window_s), name=f"job-{job['id']}",
                         daemon=True).start()

    def cancel(self, job_id: str) -> bool:
        """Cancel the job in the fleet (the stream then ends CANCELLED); False if it had ended."""
        with self._lock:
            if job_id in self._active:  # its thread stops writing (and forgets the mark when it ends)
                self._deleted.add(job_id)
        try:
            return self.client.cancel(job_id, reason="deleted through the Videos API")
        except FastVideoError as e:
            if e.code == "NOT_FOUND":
                return False
            raise

    # -- one job ------------------------------------------------------------------------------
    def _run(self, job: dict[str, Any], spec: VideoSpec, first: queue.Queue | None, window_s: float) -> None:
        """Follow one job to its end. ``window_s`` > 0: a re-attach, retried that long."""
        job_id = job["id"]
        handoff = _Handoff(first)
        try:
            lost = 0
            while True:
                try:
                    self._follow(job, spec, handoff, window_s)
                    break
                except Unavailable as e:  # the stream broke (scheduler restart, network): re-attach
                    if handoff.waiting or self._is_deleted(job_id) or lost >= MAX_REATTACHES:
                        raise
                    lost, window_s = lost + 1, REATTACH_WINDOW_S
                    log.warning("lost the fleet's stream of %s (%s); re-attaching", job_id, e.one_line())
        except Exception as e:  # noqa: BLE001 - a job thread never dies silently
            err = e if isinstance(e, FastVideoError) else Internal(f"{type(e).__name__}: {e}")
            if window_s > 0 and isinstance(err, InvalidRequest) and err.field == "request_id":
                log.info("job %s: another client follows it in the fleet (%s)", job_id, err.one_line())
            elif handoff.waiting:
                handoff.give(err)
            elif not self._is_deleted(job_id):
                log.warning("job %s failed: %s", job_id, err.one_line())
                self._end(job, "failed", error=job_error(err, spec.frames_given))
        finally:
            with self._lock:
                self._active.pop(job_id, None)
                self._calls.pop(job_id, None)
                self._deleted.discard(job_id)
            handoff.give(Internal("the job ended before the fleet accepted it"))  # no-op once given

    def _is_deleted(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._deleted

    def _open(self, job_id: str, spec: VideoSpec, window_s: float):
        """The Generate call; a re-attach retries for ``window_s`` while the scheduler still holds
        the old stream or is restarting."""
        end = time.monotonic() + window_s
        while True:
            call = self.client.stub.Generate(self._message(job_id, spec), timeout=self.job_timeout_s)
            with self._lock:
                self._calls[job_id] = call
            try:
                return call, next(iter(call))
            except grpc.RpcError as rpc:
                err = error_from_rpc(rpc)
                retry = ((isinstance(err, InvalidRequest) and err.field == "request_id")  # old stream closing
                         or isinstance(err, Unavailable))  # scheduler restarting
                if window_s > 0 and retry and time.monotonic() < end and not self._is_deleted(job_id):
                    time.sleep(0.25)
                    continue
                raise err from None

    def _follow(self, job: dict[str, Any], spec: VideoSpec, handoff: "_Handoff", window_s: float) -> None:
        job_id = job["id"]
        call, msg = self._open(job_id, spec, window_s)
        chunks: list[bytes] = []
        checksum = ""
        error: dict[str, Any] | None = None
        last_write = 0.0
        try:
            for msg in _chain(msg, call):
                ev = _event(msg)
                handoff.give("accepted")
                if self._is_deleted(job_id):
                    continue  # drain to the end: the cancel lands at the next step boundary
                changed = False
                if ev.kind == EventKind.ACCEPTED and not job.get("fleet") and ev.data.get("resolved"):
                    job["fleet"] = {"seed": ev.data["seed"], "steps": ev.data["num_inference_steps"],
                                    "frames": ev.data["resolved"].get("num_frames")}
                    changed = True
                elif ev.kind == EventKind.PROGRESS:
                    p = progress_of(ev.data["phase"], ev.data["step"], ev.data["total"])
                    status = "in_progress"
                    changed = job["status"] != status or (p > job["progress"] and
                                                          time.monotonic() - last_write >= WRITE_EVERY_S)
                    job.update(status=status, progress=max(job["progress"], p), phase=ev.data["phase"])
                elif ev.kind == EventKind.ARTIFACT and ev.data["name"].endswith(".mp4"):
                    if ev.data["chunk_index"] == 0:
                        chunks = []
                    chunks.append(ev.data["data"])
                    checksum = ev.data["checksum"] if ev.data["last"] else checksum
                elif ev.kind == EventKind.ERROR:
                    error = ev.data
                elif ev.kind == EventKind.FINISHED:
                    self._finished(job, spec, ev.data["state"], chunks, checksum, error)
                    return
                if changed:
                    last_write = time.monotonic()
                    if not self.jobs.update(job):
                        return  # deleted meanwhile
        except grpc.RpcError as rpc:
            raise error_from_rpc(rpc) from None
        finally:
            call.cancel()  # no-op after a complete stream
        if not self._is_deleted(job_id):
            raise Internal("the fleet's stream ended without a result")

    def _finished(self, job, spec, state: str, chunks: list[bytes], checksum: str, error) -> None:
        job_id = job["id"]
        if self._is_deleted(job_id):
            return
        if state != RunStatus.SUCCEEDED:
            err = error or {"code": state, "message": f"the request ended {state}"}
            self._end(job, "failed", error=job_error(err, spec.frames_given))
            return
        data = b"".join(chunks)
        if not data:
            self._end(job, "failed", error=job_error(Internal("the fleet returned no video")))
            return
        if checksum and checksum != "sha256:" + hashlib.sha256(data).hexdigest():
            self._end(job, "failed", error=job_error({"code": "DATA_LOSS", "message": "video checksum mismatch"}))
            return
        sizes = self.media.put(job_id, data)
        if self._is_deleted(job_id):  # deleted while the file was written
            self.media.delete(job_id)
            return
        job["media"] = sizes
        self._end(job, "completed")

    def _end(self, job: dict[str, Any], status: str, error: dict[str, Any] | None = None) -> None:
        t = now_ms()
        job.update(status=status, completed_at_ms=t, error=error,
                   expires_at_ms=t + int(self.media.ttl_s * 1000))
        if status == "completed":
            job["progress"] = 100
        try:
            self.jobs.finish(job)
        except FastVideoError as e:
            log.error("cannot record the end of job %s: %s", job["id"], e.one_line())


class _Handoff:
    """Tells a waiting ``submit`` once how the fleet answered: "accepted" or the error."""

    def __init__(self, box: queue.Queue | None) -> None:
        self._box = box
        self.waiting = box is not None

    def give(self, outcome: Any) -> None:
        if self.waiting:
            self.waiting = False
            self._box.put(outcome)


def _chain(first, rest):
    yield first
    yield from rest
