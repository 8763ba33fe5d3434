"""Core scheduler events -> the Generate stream's wire events.

One core event becomes one wire event, except ``artifact``: the encoded file the decoder pool
returned inline is sent as ``Artifact`` chunks of at most :data:`CHUNK_BYTES`, the provenance
sidecar on chunk 0 and the file's checksum on the last chunk. ``seq`` is renumbered per stream
so it increases by one per wire event.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Iterator

from fastvideo3.errors import ErrorInfo
from fastvideo3.v1 import scheduler_pb2
from fastvideo3.vocab import EventKind, LoopId, OutputFormat, Phase, Program, RunStatus
from services.common.convert import error_to_wire

CHUNK_BYTES = 1 << 20
PHASES = {LoopId.TEXT_ENCODE: Phase.ENCODE, LoopId.DIFFUSION_DENOISE: Phase.DENOISE, LoopId.VAE_DECODE: Phase.DECODE,
          LoopId.REWARD_SCORE: Phase.REWARD, Phase.DENOISE: Phase.DENOISE}
MIME = {OutputFormat.MP4: "video/mp4", OutputFormat.NPY: "application/x-npy"}
STATE = scheduler_pb2.RequestStatus.State


def program_name(program: tuple[str, ...]) -> str:
    return Program.T2V_REWARD if LoopId.REWARD_SCORE in program else Program.T2V


def phase_timings(run) -> dict[str, float]:
    out = {PHASES.get(k, k): round(v, 6) for k, v in run.phase_seconds.items()}
    if run.started is not None:
        out["queue"] = round(run.started - run.created, 6)
    out["total"] = round(time.time() - run.created, 6)
    return out


def rewards_of(run) -> dict[str, float]:
    return dict(run.ctx.payloads.get(LoopId.REWARD_SCORE, {}).get("scores", {}))


class WireStream:
    """Turns one request's core events into wire events (stateful: seq and start time)."""

    def __init__(self, run, sidecar_fn):
        self.run = run
        self.sidecar_fn = sidecar_fn  # (run, event data) -> provenance dict
        self.seq = 0
        self.t0 = time.time()

    def _msg(self, **body) -> scheduler_pb2.GenerateEvent:
        msg = scheduler_pb2.GenerateEvent(request_id=self.run.request_id, seq=self.seq,
                                          time_unix_ms=int(time.time() * 1000), **body)
        self.seq += 1
        return msg

    def convert(self, ev) -> Iterator[scheduler_pb2.GenerateEvent]:
        run, d = self.run, ev.data
        r = run.request
        if ev.kind == EventKind.ACCEPTED:
            yield self._msg(accepted=scheduler_pb2.Accepted(
                card_id=run.card.model_id, program=program_name(run.program), seed=r.seed,
                num_inference_steps=r.num_inference_steps, resolved_params_json=json.dumps(
                    {k: v for k, v in r.to_dict().items() if k != "image" or v is None}).encode()))  # image: by digest
        elif ev.kind == EventKind.QUEUED:
            yield self._msg(queued=scheduler_pb2.Queued(position=int(d.get("position", 0))))
        elif ev.kind == EventKind.PROGRESS:
            yield self._msg(progress=scheduler_pb2.Progress(
                step=int(d.get("step", 0)), total=int(d.get("total", 0)),
                phase=PHASES.get(d.get("phase"), d.get("phase", "")),
                elapsed_s=time.time() - self.t0))
        elif ev.kind == EventKind.ARTIFACT:
            yield from self._artifact(d)
        elif ev.kind == EventKind.ERROR:
            info: ErrorInfo = d["error"]
            yield self._msg(error=scheduler_pb2.ErrorEvent(error=error_to_wire(info, run.request_id)))
        elif ev.kind == EventKind.FINISHED:
            yield self._msg(finished=scheduler_pb2.Finished(
                state=STATE.Value(d.get("status", RunStatus.FAILED)), timings=phase_timings(run),
                rewards=rewards_of(run)))

    def _artifact(self, d: dict[str, Any]) -> Iterator[scheduler_pb2.GenerateEvent]:
        fmt = self.run.ctx.encode or OutputFormat.MP4
        data = (d.get("artifacts") or {}).get(LoopId.VAE_DECODE, b"")
        name, mime = f"video.{fmt}", MIME.get(fmt, "application/octet-stream")
        sidecar = json.dumps(self.sidecar_fn(self.run, d), sort_keys=True).encode()
        checksum = "sha256:" + hashlib.sha256(data).hexdigest()
        n = max(1, -(-len(data) // CHUNK_BYTES))
        for i in range(n):
            last = i == n - 1
            yield self._msg(artifact=scheduler_pb2.Artifact(
                name=name, mime_type=mime, chunk_index=i, last=last, data=data[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES],
                total_bytes=len(data), checksum=checksum if last else "", sidecar_json=sidecar if i == 0 else b""))
