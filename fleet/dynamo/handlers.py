"""Dynamo video requests in, fleet requests out, and back.

* :func:`translate` turns Dynamo's ``/v1/videos`` body (``NvCreateVideoRequest``: prompt, model,
  size "WxH", seconds, nvext {num_frames, fps, num_inference_steps, guidance_scale, seed,
  negative_prompt}, unknown top-level fields under ``extra_args.media_passthrough``) into a
  :class:`VideoJob`: the card and the keyword arguments of :meth:`FleetClient.generate`. It checks
  only what the translation itself needs (formats, types, ranges of the wire fields); the
  scheduler validates every value against the card and answers with the field and its limit.
* :func:`video_response` builds the ``NvVideosResponse`` the frontend expects (``data[i]``
  carries ``output_format``, and ``b64_json`` or ``url``).
* :func:`to_dynamo_error` is the one table from the core's error codes to the exceptions
  Dynamo's frontend turns into HTTP statuses.
* :class:`VideoHandler` runs one request against the scheduler and cancels it there when Dynamo
  cancels (client disconnect, ``context`` stopped or killed, or ``abort``).
"""
from __future__ import annotations

import asyncio
import base64
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dynamo.common.protocols.video_protocol import NvCreateVideoRequest, NvVideosResponse, VideoData
from dynamo.llm import exceptions as dx
from fastvideo3.client import FleetClient, FleetVideo
from fastvideo3.errors import Cancelled, FastVideoError, InvalidRequest, NotFound
from fastvideo3.vocab import OutputFormat, Task
from fleet.deployment_card import DeploymentCard

log = logging.getLogger("fastvideo3.dynamo")

_I32 = 2**31 - 1
_SEED_MAX = 2**63 - 1
#: request fields a client may send beside Dynamo's (OpenAI ``extra_body``), and their types
PASSTHROUGH = {"num_frames": int, "num_inference_steps": int, "guidance_scale": float, "guidance_scale_2": float,
               "seed": int, "negative_prompt": str, "fps": int, "flow_shift": float, "sampler": str, "cfg_policy": str,
               "slo_class": str, "deadline_s": float}
#: the two-expert boundary belongs to the checkpoint (its model_index.json), not to a request
_UNSUPPORTED_NVEXT = ("boundary_ratio",)
_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")

#: core error code -> Dynamo exception (-> HTTP status at the frontend, measured with 1.6.1).
#: Bad requests are 400 with our one-line message (field, limit). UNAVAILABLE and
#: RESOURCE_EXHAUSTED become 503 (retry later / elsewhere). Never EngineShutdown: Dynamo
#: shuts the whole worker down on it.
DYNAMO_ERROR_BY_CODE: dict[str, type[Exception]] = {
    "INVALID_ARGUMENT": dx.InvalidArgument,       # 400
    "FAILED_PRECONDITION": dx.InvalidArgument,    # 400 (recipe / loop mismatch)
    "NOT_FOUND": dx.InvalidArgument,              # 400 (unknown model)
    "ALREADY_EXISTS": dx.InvalidArgument,         # 400 (request id taken)
    "CANCELLED": dx.Cancelled,                    # 499
    "DEADLINE_EXCEEDED": dx.ConnectionTimeout,    # 504
    "UNAVAILABLE": dx.CannotConnect,              # 503
    "RESOURCE_EXHAUSTED": dx.CannotConnect,       # 503
}


def to_dynamo_error(err: BaseException) -> Exception:
    if isinstance(err, dx.DynamoException):
        return err
    if not isinstance(err, FastVideoError):
        return dx.Unknown(f"INTERNAL: {type(err).__name__}: {err}")  # 500
    line = err.one_line()
    d = err.details
    if d.get("retryable") is not None:  # the fleet's loss report, kept in the message the client sees
        line += f" [retryable={str(d['retryable'] in (True, 'true', 'True', 1, '1')).lower()}"
        if d.get("resume_from_step") is not None:
            line += f" resume_from_step={int(d['resume_from_step'])}"
        if d.get("lost_role"):
            line += f" lost={d['lost_role']}/{d.get('lost_replica', '')}"
        line += "]"
    return DYNAMO_ERROR_BY_CODE.get(err.code, dx.Unknown)(line)


@dataclass(frozen=True)
class VideoJob:
    """One translated request: what to ask the fleet for and how to answer the client."""

    card_id: str
    model: str  # the name the client used
    prompt: str
    params: dict[str, Any] = field(default_factory=dict)  # FleetClient.generate keyword arguments
    response_format: str = "url"
    output_format: str = OutputFormat.MP4
    fps: int = 16


def _check_int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidRequest(f"must be an integer in range, got {value!r}", field=name, limit=f"[{lo}, {hi}]")
    return value


def _typed(name: str, value: Any, kind: type) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int:
        return _check_int(name, value, 0, _SEED_MAX if name == "seed" else _I32)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidRequest(f"must be a {kind.__name__}, got {value!r}", field=name)
    return value


def parse_size(size: str) -> tuple[int, int]:
    """``"WxH"`` -> (width, height)."""
    try:
        w, h = size.lower().split("x")
        width, height = int(w), int(h)
    except (ValueError, AttributeError):
        raise InvalidRequest(f"{size!r} is not WIDTHxHEIGHT", field="size", limit="WIDTHxHEIGHT, e.g. 832x480") from None
    for name, v in (("size.width", width), ("size.height", height)):
        _check_int(name, v, 1, _I32)
    return width, height


def frames_for_seconds(seconds: int, fps: int) -> int:
    """Wan-style clip length: the 4k+1 frame count closest below ``seconds * fps + 1``."""
    return 4 * ((seconds * fps) // 4) + 1


def translate(body: dict[str, Any], card: DeploymentCard, *, served_model_name: str = "") -> VideoJob:
    """A Dynamo video request -> VideoJob. Raises InvalidRequest / NotFound naming the field."""
    try:
        req = NvCreateVideoRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        raise InvalidRequest(err["msg"], field=".".join(str(x) for x in err["loc"]) or "request") from None
    ids = [m.card_id for m in card.models]
    if req.model in ids:
        card_id = req.model
    elif req.model in (served_model_name, card.default_model):
        card_id = card.default_model or ids[0]
    else:
        raise NotFound(f"unknown model {req.model!r}", field="model", limit=", ".join([served_model_name, *ids]))
    summary = card.model(card_id)
    if req.input_reference and Task.IMAGE_TO_VIDEO not in summary.capabilities:
        raise InvalidRequest("image-to-video is not served by this model", field="input_reference",
                             limit=", ".join(summary.capabilities))
    out_fmt = (req.output_format or OutputFormat.MP4).lower()
    if out_fmt != OutputFormat.MP4:
        raise InvalidRequest(f"unsupported output_format {req.output_format!r}", field="output_format",
                             limit=OutputFormat.MP4)
    extra = dict((req.extra_args or {}).get("media_passthrough") or {})
    unknown = sorted(set(extra) - set(PASSTHROUGH))
    if unknown:
        raise InvalidRequest(f"unknown request field {unknown[0]!r}", field=unknown[0],
                             limit=", ".join(["prompt", "model", "size", "seconds", "response_format",
                                              "output_format", "nvext", *PASSTHROUGH]))
    params = {k: _typed(k, v, PASSTHROUGH[k]) for k, v in extra.items() if v is not None}
    nv = req.nvext
    if nv is not None:
        for name in _UNSUPPORTED_NVEXT:
            if getattr(nv, name) is not None:
                raise InvalidRequest("not supported by this model", field=f"nvext.{name}")
        for name in ("num_frames", "fps", "num_inference_steps", "guidance_scale", "guidance_scale_2", "seed",
                     "negative_prompt"):
            value = getattr(nv, name)
            if value is not None:
                params[name] = _typed(name, value, PASSTHROUGH[name])
    if req.size:
        params["width"], params["height"] = parse_size(req.size)
    fps = params.get("fps") or summary.defaults.fps or 16
    if req.seconds is not None and "num_frames" not in params:
        seconds = _check_int("seconds", req.seconds, 1, 3600)
        params["num_frames"] = frames_for_seconds(seconds, fps)
    if req.user:
        params["metadata"] = {"user": req.user}
    if req.input_reference:  # an image-to-video card's first frame: base64, a data URL or an http(s) URL
        params["image"] = str(req.input_reference)
    return VideoJob(card_id=card_id, model=req.model, prompt=req.prompt, params=params,
                    response_format=req.response_format or "url", output_format=out_fmt, fps=fps)


def video_response(job: VideoJob, video: FleetVideo, *, request_id: str, elapsed_s: float,
                   media_dir: str | None = None, media_url_base: str | None = None) -> dict[str, Any]:
    """The ``NvVideosResponse`` body for a finished video."""
    if job.response_format == "b64_json":
        item = VideoData(output_format=job.output_format, b64_json=base64.b64encode(video.data).decode("ascii"),
                         fps=job.fps)
    else:
        item = VideoData(output_format=job.output_format, url=store_video(
            video.data, f"{request_id}.{job.output_format}", media_dir, media_url_base), fps=job.fps)
    return NvVideosResponse(id=request_id, model=job.model, status="completed", progress=100,
                            created=int(time.time()), data=[item], inference_time_s=round(elapsed_s, 4)).model_dump()


def store_video(data: bytes, name: str, media_dir: str | None, media_url_base: str | None) -> str:
    """Where a ``url`` response points: a file under ``media_dir`` or, without one, a data: URL."""
    if not media_dir:
        return "data:video/mp4;base64," + base64.b64encode(data).decode("ascii")
    dest = Path(media_dir) / "videos" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.partial")
    tmp.write_bytes(data)
    tmp.replace(dest)
    if media_url_base:
        return f"{media_url_base.rstrip('/')}/videos/{name}"
    return dest.resolve().as_uri()


def request_id_for(context_id: str | None) -> str:
    """Our request id: Dynamo's context id when it is a valid one (so logs line up)."""
    if context_id and len(context_id) <= 120 and set(context_id) <= _ID_CHARS:
        return f"dyn-{context_id}"
    return f"dyn-{uuid.uuid4().hex}"


@dataclass
class _Flight:
    request_id: str
    stop: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False


class VideoHandler:
    """Runs requests on the fleet. ``FleetClient`` is blocking: each request streams its events
    in a worker thread, while the event loop watches Dynamo's context for cancellation."""

    def __init__(self, client: FleetClient, *, media_dir: str | None = None, media_url_base: str | None = None):
        self.client = client
        self.media_dir, self.media_url_base = media_dir, media_url_base
        self._flights: dict[str, _Flight] = {}

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    async def run(self, job: VideoJob, context: Any, *, request_id: str | None = None,
                  on_event: Any = None) -> dict[str, Any]:
        """Generate ``job`` and return the response body; typed errors propagate. ``on_event``
        (called in the streaming thread) sees every fleet event, e.g. progress for routing."""
        key = context.id() if context is not None else None
        flight = _Flight(request_id or request_id_for(key))
        if key is not None:
            self._flights[key] = flight
        t0 = time.monotonic()

        def watch_event(ev) -> None:  # runs in the streaming thread; raising closes the stream
            if flight.stop.is_set():
                raise Cancelled("cancelled by the client", request_id=flight.request_id)
            if on_event is not None:
                on_event(ev)

        call = asyncio.ensure_future(asyncio.to_thread(
            self.client.generate, job.prompt, on_event=watch_event, request_id=flight.request_id,
            model=job.card_id, output_format=job.output_format, **job.params))
        # the streaming thread may outlive this coroutine after a cancel; its outcome is then moot
        call.add_done_callback(lambda f: f.cancelled() or f.exception())
        watch = asyncio.ensure_future(context.async_killed_or_stopped()) if context is not None else None
        try:
            done, _ = await asyncio.wait({call} | ({watch} if watch else set()), return_when=asyncio.FIRST_COMPLETED)
            if call not in done:  # the client went away first
                await self.cancel(flight, "client disconnected")
                raise Cancelled("cancelled by the client", request_id=flight.request_id)
            video = call.result()
        except asyncio.CancelledError:  # Dynamo dropped the stream: cancel without waiting
            flight.stop.set()
            if not flight.cancelled:
                flight.cancelled = True
                asyncio.get_running_loop().run_in_executor(None, self._cancel_quietly, flight.request_id, "dropped")
            raise
        finally:
            if watch is not None:
                watch.cancel()
            if key is not None:
                self._flights.pop(key, None)
        log.info("request %s done in %.2fs (%d bytes)", flight.request_id, time.monotonic() - t0, len(video.data))
        return video_response(job, video, request_id=flight.request_id, elapsed_s=time.monotonic() - t0,
                              media_dir=self.media_dir, media_url_base=self.media_url_base)

    async def abort(self, context_id: str) -> None:
        """Dynamo's abort hook: cancel the request of ``context_id`` on the fleet, if any."""
        flight = self._flights.get(context_id)
        if flight is not None:
            await self.cancel(flight, "aborted by Dynamo")

    async def cancel(self, flight: _Flight, reason: str) -> None:
        flight.stop.set()
        if flight.cancelled:
            return
        flight.cancelled = True
        log.info("cancelling %s: %s", flight.request_id, reason)
        await asyncio.to_thread(self._cancel_quietly, flight.request_id, reason)

    def _cancel_quietly(self, request_id: str, reason: str) -> None:
        try:
            self.client.cancel(request_id, reason)
        except FastVideoError as e:  # already finished, or the fleet is gone: nothing to cancel
            log.info("cancel %s: %s", request_id, e.one_line())
