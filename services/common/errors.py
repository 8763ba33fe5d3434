"""The one table from the core's typed errors to gRPC status codes, and how services use it.

A typed error aborts an RPC with the mapped status, its one-line message (field, limit, retry
hint) as the status details, and the full error as JSON in the ``fv3-error-bin`` trailer, which
:func:`fastvideo3.rpc.error_from_rpc` turns back into the same typed error on the other side.
Anything that is not a :class:`~fastvideo3.errors.FastVideoError` is ``INTERNAL``.
"""
from __future__ import annotations

import json

import grpc

from fastvideo3.rpc import ERROR_TRAILER, error_from_rpc
from fastvideo3.errors import ErrorInfo, FastVideoError

#: core error code -> gRPC status. The only mapping in the project (the codes are the status names).
STATUS_BY_CODE: dict[str, grpc.StatusCode] = {
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,        # bad request: names the field and limit
    "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION,  # recipe / loop / config mismatch
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,                      # unknown card, request or buffer
    "RESOURCE_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,    # queue full / no budget (+ retry hint)
    "ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,            # request id taken (other parameters)
    "CANCELLED": grpc.StatusCode.CANCELLED,                      # cancelled by the client
    "UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,                  # pool lost, loading or draining
    "DATA_LOSS": grpc.StatusCode.DATA_LOSS,                      # transfer checksum mismatch
    "DEADLINE_EXCEEDED": grpc.StatusCode.DEADLINE_EXCEEDED,      # request or transfer deadline passed
    "ABORTED": grpc.StatusCode.ABORTED,                          # request-fatal numeric fault
    "INTERNAL": grpc.StatusCode.INTERNAL,                        # a bug
    "UNAUTHENTICATED": grpc.StatusCode.UNAUTHENTICATED,          # token auth on, no valid token
}

__all__ = ["STATUS_BY_CODE", "abort", "error_from_rpc", "status_of", "trailer_of"]


def status_of(exc: BaseException | ErrorInfo) -> grpc.StatusCode:
    code = exc.code if isinstance(exc, (FastVideoError, ErrorInfo)) else "INTERNAL"
    return STATUS_BY_CODE.get(code, grpc.StatusCode.INTERNAL)


def trailer_of(info: ErrorInfo) -> tuple[tuple[str, bytes], ...]:
    body = {"code": info.code, "message": info.message, "field": info.field, "limit": info.limit,
            "step": info.step, "retry_after_s": info.retry_after_s,
            "details": {str(k): v if isinstance(v, (str, bool, int, float)) else str(v)
                        for k, v in info.details.items()}}
    return ((ERROR_TRAILER, json.dumps(body).encode("utf-8")),)


def abort(context: grpc.ServicerContext, exc: BaseException | ErrorInfo):
    """End the RPC with the mapped status; never returns (``context.abort`` raises)."""
    info = exc if isinstance(exc, ErrorInfo) else ErrorInfo.of(exc)
    context.set_trailing_metadata(trailer_of(info))
    head = f"{info.field}: " if info.field else ""
    tail = f" (allowed: {info.limit})" if info.limit else ""
    retry = f" (retry after {info.retry_after_s:.1f}s)" if info.retry_after_s else ""
    context.abort(status_of(info), f"{head}{info.message}{tail}{retry}")
