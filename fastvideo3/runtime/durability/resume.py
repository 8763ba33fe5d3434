"""Serialize a :class:`~fastvideo3.runtime.scheduling.scheduler.RequestRun` to bytes, and rebuild it.

A checkpoint is everything a scheduler needs to continue a request it did not start: the
resolved request, the card id, the program (loop sequence), the loop index, the current
LoopState as JSON, the context (TensorRefs and small payloads: never tensors), the replica
placement, timing, and — for the denoise loop — a snapshot of the pool-resident regions taken at
the same step boundary (see :mod:`fastvideo3.runtime.pool.resident`). The LoopState and the snapshot
travel in one blob, so a reader never pairs one step's state with another step's latent.

Wire form: ``MAGIC``, a little-endian u32 header length, the UTF-8 JSON header, then the
snapshot bytes (possibly none). The header's ``snapshot_bytes`` and ``snapshot_sha256`` check
the tail. The context is :meth:`RequestContext.to_dict`'s form since version 2; a version-1
record (the context's flat form) is still read.
"""
from __future__ import annotations

import hashlib
import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from fastvideo3.errors import DataLoss, FailedPrecondition, FastVideoError
from fastvideo3.loop.context import RequestContext
from fastvideo3.request.schema import ResolvedRequest
from fastvideo3.vocab import LoopId, RunStatus

MAGIC = b"FV3RUN\x00\x01"
VERSION = 2
#: versions this reader accepts: 1 differs only in the context's form (RequestContext.from_dict reads both)
READABLE_VERSIONS = (1, 2)
_LEN = struct.Struct("<I")


@dataclass
class RunRecord:
    """The serializable part of a RequestRun (plus the resident snapshot that goes with it)."""

    request: dict[str, Any]
    card_id: str
    program: list[str]
    loop_index: int
    loop_id: str | None
    loop_state: str | None  # LoopState JSON of the current loop, None between loops
    ctx: dict[str, Any]  # RequestContext.to_dict()
    placement: dict[str, int]
    created: float
    started: float | None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    #: snapshot of the current loop's pool-resident regions (denoise only), its role and fingerprint
    snapshot: bytes = b""
    snapshot_role: str = ""
    snapshot_fingerprint: str = ""
    written: float = field(default_factory=time.time)

    @property
    def request_id(self) -> str:
        return self.request["request_id"]

    @property
    def step(self) -> int:
        """The step boundary this record was taken at (denoise step, else 0)."""
        if self.loop_state is None:
            return 0
        return int(json.loads(self.loop_state).get("step", 0) or 0)

    # -- bytes ---------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        head = {k: v for k, v in self.__dict__.items() if k != "snapshot"}
        head.update(version=VERSION, snapshot_bytes=len(self.snapshot),
                    snapshot_sha256=hashlib.sha256(self.snapshot).hexdigest() if self.snapshot else "")
        text = json.dumps(head, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")
        return b"".join([MAGIC, _LEN.pack(len(text)), text, self.snapshot])

    @classmethod
    def from_bytes(cls, data: bytes) -> "RunRecord":
        data = bytes(data)
        start = len(MAGIC) + _LEN.size
        if len(data) < start or data[: len(MAGIC)] != MAGIC:
            raise DataLoss("not a fastvideo3 run checkpoint (bad magic)", field="checkpoint")
        (n,) = _LEN.unpack(data[len(MAGIC):start])
        try:
            head = json.loads(data[start:start + n].decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise DataLoss(f"bad checkpoint header: {exc}", field="checkpoint") from None
        if head.pop("version", None) not in READABLE_VERSIONS:
            raise FailedPrecondition("checkpoint written by another format version", field="checkpoint",
                                     limit=", ".join(map(str, READABLE_VERSIONS)))
        size, digest = head.pop("snapshot_bytes", 0), head.pop("snapshot_sha256", "")
        snap = data[start + n:]
        if len(snap) != size or (snap and hashlib.sha256(snap).hexdigest() != digest):
            raise DataLoss("checkpoint snapshot is truncated or corrupt", field="checkpoint.snapshot")
        try:
            return cls(snapshot=snap, **head)
        except TypeError as exc:
            raise DataLoss(f"bad checkpoint header: {exc}", field="checkpoint") from None


def record_of(run, *, snapshot: bytes = b"", snapshot_role: str = "", snapshot_fingerprint: str = "") -> RunRecord:
    """The record of ``run`` as it stands now (call at a step boundary)."""
    driver = run.driver
    return RunRecord(
        request=run.request.to_dict(), card_id=run.card.model_id, program=list(run.program),
        loop_index=run.loop_index, loop_id=run.loop_id if driver is not None else None,
        loop_state=driver.state.to_json() if driver is not None else None, ctx=run.ctx.to_dict(),
        placement=dict(run.placement), created=run.created, started=run.started,
        phase_seconds=dict(run.phase_seconds), snapshot=snapshot, snapshot_role=snapshot_role,
        snapshot_fingerprint=snapshot_fingerprint,
    )


def request_meta(run) -> dict[str, Any]:
    """The metadata registered with the StateStore when a request is admitted."""
    return {"request": run.request.to_dict(), "card_id": run.card.model_id, "program": list(run.program),
            "ctx": run.ctx.to_dict(),
            "created": run.created}


def rebuild_run(record: RunRecord, card, *, rewind_decode: bool = True):
    """A RequestRun continuing from ``record`` (its driver holds the checkpointed LoopState).

    The decode loop is always run again (its encoded file travels inline and is not
    checkpointed), so a request checkpointed during or after decoding rewinds to its start.
    """
    from fastvideo3.loop import LOOPS, STATES, LoopDriver
    from fastvideo3.runtime.scheduling.scheduler import RequestRun
    if record.card_id != card.model_id:
        raise FailedPrecondition(f"checkpoint is for card {record.card_id!r}", field="card_id", limit=card.model_id)
    request = ResolvedRequest.from_dict(record.request)
    try:
        ctx = RequestContext.from_dict(record.ctx)
    except FastVideoError as e:
        raise DataLoss(f"bad checkpoint context: {e.message}", field=f"checkpoint.{e.field or 'ctx'}") from None
    run = RequestRun(request=request, card=card, program=tuple(record.program), ctx=ctx,
                     created=record.created, started=record.started, placement=dict(record.placement),
                     phase_seconds=dict(record.phase_seconds))
    run.status = RunStatus.RUNNING if record.started is not None else RunStatus.QUEUED
    run.loop_index = record.loop_index
    if record.loop_id is not None and record.loop_state is not None:
        if record.loop_id != run.loop_id:
            raise DataLoss(f"checkpoint names loop {record.loop_id!r} at index {record.loop_index}",
                           field="checkpoint.loop_id")
        state = STATES[record.loop_id].from_json(record.loop_state)
        run.driver = LoopDriver(LOOPS[record.loop_id](), state)
    if rewind_decode and LoopId.VAE_DECODE in run.program:
        at = run.program.index(LoopId.VAE_DECODE)
        if run.loop_index >= at:
            run.loop_index, run.driver = at, None
            run.ctx.payloads.pop(LoopId.VAE_DECODE, None)
    return run
