"""OpenAI's error shape, and the one table from the core's error codes to HTTP statuses.

Every error the gateway answers is ``{"error": {"message", "type", "param", "code"}}``:
``param`` names the request field in the API's own terms (``size``, ``seconds``,
``fastvideo3.steps``), the message carries the fleet's limit, and ``code`` is the core's
error code in lower case (``invalid_argument``, ``resource_exhausted``, ...).
"""
from __future__ import annotations

import math
from typing import Any

from starlette.responses import JSONResponse

from fastvideo3.errors import FastVideoError

#: (HTTP status, OpenAI error type) -> the core error codes answered with it
_ANSWERS: tuple[tuple[tuple[int, str], tuple[str, ...]], ...] = (
    ((400, "invalid_request_error"), ("INVALID_ARGUMENT", "FAILED_PRECONDITION")),
    ((404, "invalid_request_error"), ("NOT_FOUND",)),
    ((401, "authentication_error"), ("UNAUTHENTICATED",)),
    ((403, "permission_error"), ("PERMISSION_DENIED",)),
    ((429, "rate_limit_error"), ("RESOURCE_EXHAUSTED",)),
    ((409, "invalid_request_error"), ("ALREADY_EXISTS",)),
    ((499, "cancelled"), ("CANCELLED",)),
    ((504, "timeout_error"), ("DEADLINE_EXCEEDED",)),
    ((503, "service_unavailable"), ("UNAVAILABLE",)),
    ((500, "server_error"), ("DATA_LOSS", "ABORTED", "INTERNAL")),
)
#: core error code -> (HTTP status, OpenAI error type)
HTTP_BY_CODE: dict[str, tuple[int, str]] = {code: answer for answer, codes in _ANSWERS for code in codes}

#: the fleet's (diffusers-named) fields -> the API parameter a client sent
PARAM_BY_FIELD: dict[str, str] = {
    "model": "model", "prompt": "prompt", "height": "size", "width": "size", "size": "size",
    "num_frames": "seconds", "num_inference_steps": "fastvideo3.steps", "guidance_scale": "fastvideo3.guidance",
    "seed": "fastvideo3.seed", "negative_prompt": "fastvideo3.negative_prompt", "sampler": "fastvideo3.sampler",
    "flow_shift": "fastvideo3.flow_shift", "cfg_policy": "fastvideo3.cfg_policy", "fps": "fastvideo3.fps",
    "guidance_scale_2": "fastvideo3.guidance_2", "image": "input_reference",
}


class ApiError(Exception):
    """An HTTP error in OpenAI's shape, raised anywhere in a handler."""

    def __init__(self, status: int, message: str, *, param: str | None = None, type_: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        if param and not message.startswith(param):
            message = f"{param}: {message}"
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")
        self.code = code or {400: "invalid_argument", 404: "not_found"}.get(status)
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def param_for(field: str | None, frames_given: bool = False) -> str | None:
    """The API parameter behind a fleet field (``num_frames`` is ``fastvideo3.frames`` when the
    client set frames directly, else ``seconds``)."""
    if not field:
        return None
    if field == "num_frames" and frames_given:
        return "fastvideo3.frames"
    return PARAM_BY_FIELD.get(field, field)


def from_fleet(err: FastVideoError, *, frames_given: bool = False) -> ApiError:
    """A typed fleet error as an ApiError: status by code, the field as ``param``, the limit in
    the message, Retry-After on RESOURCE_EXHAUSTED; UNAVAILABLE keeps the fleet's reason."""
    status, kind = HTTP_BY_CODE.get(err.code, (500, "server_error"))
    param = param_for(err.field, frames_given)
    msg = err.message
    if err.field:
        msg = f"{param}: {msg}" if param == err.field else f"{param} ({err.field}): {msg}"
    if err.limit:
        msg += f" (allowed: {err.limit})"
    headers = {}
    if err.code == "RESOURCE_EXHAUSTED":
        retry = err.retry_after_s if err.retry_after_s and err.retry_after_s > 0 else 1.0
        headers["Retry-After"] = str(max(1, math.ceil(retry)))
        msg += f" (retry after {retry:.1f}s)"
    return ApiError(status, msg, param=param, type_=kind, code=err.code.lower(), headers=headers)


def job_error(err: FastVideoError | dict[str, Any], frames_given: bool = False) -> dict[str, Any]:
    """The ``error`` object of a failed job (OpenAI's VideoCreateError: code, message, param, type)."""
    if isinstance(err, dict):
        from fastvideo3.client import loss_details
        code = str(err.get("code") or "INTERNAL")
        e = FastVideoError(str(err.get("message") or code), field=err.get("field"), limit=err.get("limit"),
                           details=loss_details(err))
        e.code = code
        err = e
    api = from_fleet(err, frames_given=frames_given)
    out = {"code": api.code or "internal", "message": api.message, "param": api.param, "type": api.type}
    out.update(loss_fields(err.details))
    return out


def loss_fields(details: dict[str, Any]) -> dict[str, Any]:
    """The fleet's loss report as extra fields of an error object: ``retryable`` (the same request
    sent again can succeed), ``resume_from_step`` and ``lost`` (role, replica, step reached,
    whether a checkpoint exists)."""
    def flag(v) -> bool:
        return v in (True, "true", "True", 1, "1")
    out: dict[str, Any] = {}
    if details.get("retryable") is not None:
        out["retryable"] = flag(details["retryable"])
    if details.get("resume_from_step") is not None:
        out["resume_from_step"] = int(details["resume_from_step"])
    if details.get("lost_role"):
        out["lost"] = {"role": details["lost_role"], "replica": details.get("lost_replica", ""),
                       "step_reached": int(details.get("step_reached") or 0),
                       "checkpoint": flag(details.get("checkpoint", False))}
    return out
