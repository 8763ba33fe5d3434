"""What both ends of our gRPC contracts share: how a typed error rides on a failed RPC (the
``fv3-error-bin`` trailer) and comes back as the same exception, how a channel carries TLS
and a bearer token, and a message as plain data (:func:`plain`). The client (fastvideo3/client.py) and the servers (services/common/errors.py,
services/common/auth.py, the scheduler's pool stubs) import it; neither imports the other.
"""
from __future__ import annotations

import json
from typing import Any

import grpc

from fastvideo3.errors import ErrorInfo, FastVideoError, from_code

ERROR_TRAILER = "fv3-error-bin"  # binary trailer carrying the typed error as JSON


def error_from_rpc(err: grpc.RpcError) -> FastVideoError:
    """The typed error behind a failed RPC (status name == the core's error code)."""
    code = err.code().name if hasattr(err, "code") and err.code() is not None else "INTERNAL"
    for key, value in (err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") else ():
        if key == ERROR_TRAILER:
            try:
                d = json.loads(value)
                return ErrorInfo(d["code"], d["message"], d.get("field"), d.get("limit"), d.get("step"),
                                 d.get("retry_after_s"), d.get("details") or {}).to_exception()
            except (ValueError, KeyError, TypeError):
                break
    details = err.details() if hasattr(err, "details") else str(err)
    return from_code(code, details or code)


AUTH_HEADER = "authorization"


class TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                       grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call of a channel."""

    def __init__(self, token: str):
        self._header = (AUTH_HEADER, f"Bearer {token}")

    def _with_token(self, details):
        metadata = [*(details.metadata or ()), self._header]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else _Details(details, metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base, metadata):
        self.method, self.timeout, self.credentials = base.method, base.timeout, base.credentials
        self.wait_for_ready, self.compression = base.wait_for_ready, base.compression
        self.metadata = metadata


def make_channel(target: str, options=None, *, root_certificates: bytes | None = None,
                 private_key: bytes | None = None, certificate_chain: bytes | None = None,
                 token: str | None = None) -> grpc.Channel:
    """A channel to ``target``: TLS when ``root_certificates`` is given (with a client certificate
    when ``private_key``/``certificate_chain`` are), plaintext otherwise; ``token`` is sent as a
    bearer token on every call."""
    options = list(options or [])
    if root_certificates is not None:
        creds = grpc.ssl_channel_credentials(root_certificates=root_certificates, private_key=private_key,
                                             certificate_chain=certificate_chain)
        channel = grpc.secure_channel(target, creds, options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    return grpc.intercept_channel(channel, TokenInterceptor(token)) if token else channel


__all__ = ["AUTH_HEADER", "ERROR_TRAILER", "TokenInterceptor", "error_from_rpc", "make_channel"]


def plain(msg, skip: frozenset[tuple[str, str]] = frozenset()) -> dict[str, Any]:
    """Every field of a message as plain Python data: scalars with their defaults (ints stay
    ints, unlike proto JSON), lists, dicts, nested messages when set. ``skip`` names
    ``(message name, field)`` pairs to leave out."""
    out: dict[str, Any] = {}
    name = msg.DESCRIPTOR.name
    for f in msg.DESCRIPTOR.fields:
        if (name, f.name) in skip:
            continue
        v, sub = getattr(msg, f.name), f.message_type
        if sub is not None and sub.GetOptions().map_entry:
            nested = sub.fields_by_name["value"].message_type is not None
            out[f.name] = {k: plain(x, skip) if nested else x for k, x in v.items()}
        elif f.is_repeated:
            out[f.name] = [plain(x, skip) if sub is not None else x for x in v]
        elif sub is not None:
            if msg.HasField(f.name):
                out[f.name] = plain(v, skip)
        else:
            out[f.name] = v
    return out
