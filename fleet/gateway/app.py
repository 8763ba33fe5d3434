"""The HTTP side: OpenAI's Videos API, /v1/models, health, and the playground page.

    POST   /v1/videos                       create (multipart or JSON) -> a video job (queued)
    GET    /v1/videos/{id}                  the job: status, progress 0-100, timestamps, error
    GET    /v1/videos?after=&limit=&order=  cursor page: data, has_more, first_id, last_id
    DELETE /v1/videos/{id}                  cancel in the fleet, delete record and media
    GET    /v1/videos/{id}/content?variant=video|thumbnail|spritesheet   (range requests)
    GET    /v1/models                       the fleet's cards (with their limits and defaults)
    GET    /healthz, /readyz                liveness; readiness = scheduler and state store answer
    GET    /                                the playground (static HTML/JS using this API)

A job's record (JSON in the state store): ``id`` (= the fleet's request id), ``owner`` (a hash of
the API key), ``status``, ``progress``, ``created_at_ms``, ``completed_at_ms``, ``expires_at_ms``,
``error``, ``phase``, ``spec`` (the validated request, see :class:`~fleet.gateway.params.VideoSpec`),
``fleet`` (seed, steps, frames the fleet resolved), ``media`` (bytes per variant).
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from fastvideo3.client import FleetClient
from fastvideo3.errors import FastVideoError
from fastvideo3.vocab import Task
from fleet.gateway.config import GatewayConfig
from fleet.gateway.errors import ApiError, from_fleet
from fleet.gateway.jobs import JobStore, now_us
from fleet.gateway.media import VARIANTS, MediaStore
from fleet.gateway.params import ModelInfo, nest_form, parse_create
from fleet.gateway.runner import JobRunner

log = logging.getLogger("fastvideo3.gateway")
STATIC = Path(__file__).resolve().parent / "static"
OPEN_PATHS = ("/", "/healthz", "/readyz", "/favicon.ico")
MAX_LIST_LIMIT = 100
POLL_AFTER_MS = "500"  # the SDK's poll helper reads this header
RESCAN_S = 30.0        # how often unfinished jobs that no thread here follows are picked up


def openai_video(job: dict[str, Any]) -> dict[str, Any]:
    """A job record as OpenAI's ``Video`` object (plus our ``fastvideo3`` extension)."""
    spec = job["spec"]
    sec = lambda ms: None if ms is None else int(ms // 1000)  # noqa: E731
    return {
        "id": job["id"], "object": "video", "model": spec["model"], "status": job["status"],
        "progress": int(job["progress"]), "created_at": sec(job["created_at_ms"]),
        "completed_at": sec(job.get("completed_at_ms")), "expires_at": sec(job.get("expires_at_ms")),
        "error": job.get("error"), "prompt": spec["prompt"], "seconds": spec["seconds"], "size": spec["size"],
        "remixed_from_video_id": None,
        "fastvideo3": {"request_id": job["id"], "phase": job.get("phase"), "params": spec["params"],
                       **(job.get("fleet") or {})},
    }


class Gateway:
    """Holds the fleet client, the stores and the runner; builds the Starlette app."""

    def __init__(self, cfg: GatewayConfig, client: FleetClient | None = None) -> None:
        self.cfg = cfg
        self.client = client or _fleet_client(cfg)
        self.jobs = JobStore(cfg.state_store, namespace=cfg.state_namespace, ttl_s=cfg.media_ttl_s,
                             timeout_s=cfg.state_timeout_s)
        self.media = MediaStore(cfg.media_root(), cfg.media_ttl_s)
        self.runner = JobRunner(self.client, self.jobs, self.media, accept_timeout_s=cfg.accept_timeout_s,
                                job_timeout_s=cfg.job_timeout_s)
        self._keys = {hashlib.sha256(k.encode()).hexdigest()[:16]: k for k in cfg.api_keys()}
        self._models: tuple[float, dict[str, ModelInfo], str] | None = None
        self._models_lock = threading.Lock()
        self._stop = threading.Event()
        self.app = Starlette(routes=[
            Route("/", self.playground), Route("/healthz", self.healthz), Route("/readyz", self.readyz),
            Route("/v1/models", self.list_models), Route("/v1/videos", self.create, methods=["POST"]),
            Route("/v1/videos", self.list_videos, methods=["GET"]),
            Route("/v1/videos/{video_id}", self.retrieve, methods=["GET"]),
            Route("/v1/videos/{video_id}", self.delete, methods=["DELETE"]),
            Route("/v1/videos/{video_id}/content", self.content, methods=["GET", "HEAD"]),
        ], exception_handlers={ApiError: lambda req, exc: exc.response(), 404: _not_found, 405: _not_allowed},
            lifespan=self._lifespan)

    # -- lifecycle ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        await run_in_threadpool(self.start)
        try:
            yield
        finally:
            self._stop.set()

    def start(self) -> None:
        """Re-attach to unfinished jobs and start the media sweep (the app's startup)."""
        try:
            self.runner.resume()
        except FastVideoError as e:  # the store is down: serve anyway, retry on the next start
            log.error("cannot list unfinished jobs: %s", e.one_line())
        threading.Thread(target=self._sweeper, name="media-sweep", daemon=True).start()

    def _sweeper(self) -> None:
        """Expire media; pick up jobs no gateway follows any more (another replica died)."""
        interval = max(1.0, min(RESCAN_S, self.cfg.media_ttl_s / 4))
        last_scan = time.monotonic()
        while not self._stop.wait(interval):
            for job_id in self.media.sweep():
                log.info("media of %s expired", job_id)
            if time.monotonic() - last_scan >= RESCAN_S:
                last_scan = time.monotonic()
                try:
                    self.runner.resume(window_s=2.0)
                except FastVideoError as e:
                    log.warning("cannot list unfinished jobs: %s", e.one_line())

    # -- helpers ------------------------------------------------------------------------------
    def owner(self, request: Request) -> str:
        """The caller's key id ("" when auth is off); 401 in OpenAI's shape otherwise."""
        if not self._keys:
            return ""
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token:
            for key_id, key in self._keys.items():
                if hmac.compare_digest(token.strip().encode(), key.encode()):
                    return key_id
        raise ApiError(401, "Incorrect or missing API key: send Authorization: Bearer <key>", param=None,
                       type_="invalid_request_error", code="invalid_api_key")

    def models(self, refresh: bool = False) -> tuple[dict[str, ModelInfo], str]:
        with self._models_lock:
            if not refresh and self._models and time.monotonic() - self._models[0] < self.cfg.models_ttl_s:
                return self._models[1], self._models[2]
            try:
                desc = self.client.describe()
            except FastVideoError as e:
                raise from_fleet(e) from None
            card = desc.get("card") or {}
            out = {}
            for m in card.get("models") or []:
                lim, dft = m.get("limits") or {}, m.get("defaults") or {}
                out[m["card_id"]] = ModelInfo(
                    id=m["card_id"], fps=int(dft.get("fps") or 16), default_frames=int(dft.get("num_frames") or 33),
                    default_width=int(dft.get("width") or 128), default_height=int(dft.get("height") or 128),
                    max_frames=int(lim.get("max_frames") or 0), frames_multiple=int(lim.get("frames_multiple") or 4),
                    frames_offset=int(lim.get("frames_offset") or 1), min_steps=int(lim.get("min_steps") or 1),
                    max_steps=int(lim.get("max_steps") or 0),
                    created=int(card.get("created_unix_ms") or 0) // 1000,
                    image_to_video=Task.IMAGE_TO_VIDEO in (m.get("capabilities") or []))
            default = card.get("default_model") or (next(iter(out)) if out else "")
            self._models = (time.monotonic(), out, default)
            self._raw_models = card.get("models") or []
            return out, default

    def job_for(self, video_id: str, owner: str) -> dict[str, Any]:
        job = self.jobs.get(video_id) if _plausible_id(video_id) else None
        if job is None or (self._keys and job.get("owner") != owner):
            raise ApiError(404, f"no video with id {video_id[:80]!r} (or it expired)", param="video_id",
                           code="not_found")
        return job

    async def read_body(self, request: Request) -> dict[str, Any]:
        limit = self.cfg.max_body_bytes
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            raise ApiError(413, f"the request body has {length} bytes (allowed: <= {limit} bytes)", param=None,
                           code="request_too_large")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise ApiError(413, f"the request body exceeds {limit} bytes (allowed: <= {limit} bytes)",
                               param=None, code="request_too_large")
        request._body = bytes(data)  # starlette parses the form from the cached body
        ctype = request.headers.get("content-type", "")
        if ctype.startswith("multipart/form-data") or ctype.startswith("application/x-www-form-urlencoded"):
            try:
                form = await request.form(max_files=1, max_fields=64, max_part_size=limit)
            except Exception as e:  # noqa: BLE001 - python-multipart's errors vary
                raise ApiError(400, f"cannot parse the form: {e}", param=None) from None
            items = []
            for key, value in form.multi_items():
                if hasattr(value, "read"):  # an uploaded file (input_reference)
                    value = await value.read()
                items.append((key, value))
            return nest_form(items)
        if not data:
            raise ApiError(400, "the request has no body", param=None)
        try:
            body = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the body is not valid JSON: {e}", param=None) from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object", param=None)
        return body

    # -- routes -------------------------------------------------------------------------------
    async def playground(self, request: Request) -> Response:
        return HTMLResponse((STATIC / "index.html").read_text())

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "pid": os.getpid(), "running_jobs": len(self.runner.active())})

    async def readyz(self, request: Request) -> Response:
        try:
            await run_in_threadpool(self.jobs.ping)
            await run_in_threadpool(self.models, True)
        except ApiError as e:
            return JSONResponse({"status": "not ready", "reason": e.message}, status_code=503)
        except FastVideoError as e:
            return JSONResponse({"status": "not ready", "reason": e.one_line()}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def list_models(self, request: Request) -> Response:
        self.owner(request)
        models, default = await run_in_threadpool(self.models)
        raw = {m["card_id"]: m for m in getattr(self, "_raw_models", [])}
        data = [{"id": m.id, "object": "model", "created": m.created, "owned_by": "fastvideo3",
                 "fastvideo3": {"default": m.id == default, "fps": m.fps, **{k: raw.get(m.id, {}).get(k)
                                for k in ("limits", "defaults", "capabilities", "recipe")}}}
                for m in models.values()]
        return JSONResponse({"object": "list", "data": data})

    async def create(self, request: Request) -> Response:
        owner = self.owner(request)
        body = await self.read_body(request)
        models, default = await run_in_threadpool(self.models)
        spec = parse_create(body, models, default)
        created_us = now_us()
        job = {"id": "video_" + secrets.token_hex(12), "owner": owner, "status": "queued", "progress": 0,
               "created_at_ms": created_us // 1000, "created_at_us": created_us, "completed_at_ms": None,
               "expires_at_ms": None, "error": None,
               "phase": None, "spec": spec.public(), "fleet": None, "media": None}
        try:
            job = await run_in_threadpool(self.runner.submit, job, self.cfg.max_jobs_per_key)
        except FastVideoError as e:
            raise from_fleet(e, frames_given=spec.frames_given) from None
        return JSONResponse(openai_video(job), headers={"openai-poll-after-ms": POLL_AFTER_MS})

    async def retrieve(self, request: Request) -> Response:
        owner = self.owner(request)
        job = await run_in_threadpool(self._get, request.path_params["video_id"], owner)
        return JSONResponse(openai_video(job), headers={"openai-poll-after-ms": POLL_AFTER_MS})

    def _get(self, video_id: str, owner: str) -> dict[str, Any]:
        try:
            return self.job_for(video_id, owner)
        except FastVideoError as e:
            raise from_fleet(e) from None

    async def list_videos(self, request: Request) -> Response:
        owner = self.owner(request)
        q = request.query_params
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, f"unknown order {order[:20]!r} (allowed: asc, desc)", param="order")
        try:
            limit = int(q.get("limit", "20"))
        except ValueError:
            raise ApiError(400, "must be an integer (allowed: 1..100)", param="limit") from None
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise ApiError(400, f"{limit} is out of range (allowed: 1..{MAX_LIST_LIMIT})", param="limit")
        after = q.get("after") or None
        visible = (lambda j: j.get("owner") == owner) if self._keys else (lambda j: True)

        def page():
            try:
                return self.jobs.page(after=after, limit=limit, descending=order == "desc", visible=visible)
            except FastVideoError as e:
                raise from_fleet(e) from None
        result = await run_in_threadpool(page)
        if result is None:
            raise ApiError(400, f"no video with id {after[:80]!r} to list after", param="after")
        jobs, more = result
        data = [openai_video(j) for j in jobs]
        return JSONResponse({"object": "list", "data": data, "has_more": more,
                             "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None})

    async def delete(self, request: Request) -> Response:
        owner = self.owner(request)
        video_id = request.path_params["video_id"]

        def run() -> None:
            job = self.job_for(video_id, owner)
            try:
                if job["status"] not in ("completed", "failed"):
                    self.runner.cancel(video_id)
                self.jobs.delete(video_id)
            except FastVideoError as e:
                raise from_fleet(e) from None
            self.media.delete(video_id)
        await run_in_threadpool(run)
        return JSONResponse({"id": video_id, "object": "video.deleted", "deleted": True})

    async def content(self, request: Request) -> Response:
        owner = self.owner(request)
        variant = request.query_params.get("variant", "video")
        if variant not in VARIANTS:
            raise ApiError(400, f"unknown variant {variant[:20]!r} (allowed: {', '.join(VARIANTS)})",
                           param="variant")
        video_id = request.path_params["video_id"]
        job = await run_in_threadpool(self._get, video_id, owner)
        if job["status"] != "completed":
            raise ApiError(404 if job["status"] == "failed" else 409,
                           f"the video is {job['status']}; content exists once it is completed", param="video_id",
                           code="video_not_ready")
        path = self.media.path(video_id, variant)
        if path is None:
            raise ApiError(404, f"the {variant} of {video_id} is gone (expired or never made)", param="variant",
                           code="not_found")
        return FileResponse(path, media_type=VARIANTS[variant][1], filename=f"{video_id}-{path.name}",
                            content_disposition_type="inline")


def _plausible_id(video_id: str) -> bool:
    return 0 < len(video_id) <= 128 and all(c.isalnum() or c in "-_.:" for c in video_id)


async def _not_found(request: Request, exc: Exception) -> Response:
    return ApiError(404, f"no route {request.url.path[:100]}", param=None, code="not_found").response()


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return ApiError(405, f"{request.method} is not allowed on {request.url.path[:100]}", param=None,
                    code="method_not_allowed").response()


def _fleet_client(cfg: GatewayConfig) -> FleetClient:
    from services.common.auth import from_args
    sec = from_args(cfg.__dict__)
    kw: dict[str, Any] = {"token": sec.token, "timeout_s": cfg.job_timeout_s}
    if sec.tls:
        kw["root_certificates"] = Path(cfg.tls_ca or cfg.tls_cert).read_bytes()
        if cfg.tls_ca:
            kw["private_key"], kw["certificate_chain"] = Path(cfg.tls_key).read_bytes(), Path(cfg.tls_cert).read_bytes()
    return FleetClient(cfg.scheduler, **kw)
