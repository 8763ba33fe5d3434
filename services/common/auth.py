"""Optional transport security for every service: TLS (mutual when a CA is given) and a bearer
token. Both are off by default (a loopback fleet); a cluster turns them on with

    --tls-cert server.pem --tls-key server.key [--tls-ca ca.pem] [--auth-token-file token]

Rules:

* **TLS.** With ``--tls-cert/--tls-key`` a service listens on TLS only: a plaintext client
  fails its handshake. With ``--tls-ca`` it also requires a client certificate signed by that
  CA (mutual TLS), and its own outgoing calls (scheduler -> pools, pool -> pool transfers)
  verify peers against that CA and present the same certificate.
* **Token.** With ``--auth-token-file`` every RPC except ``grpc.health.v1.Health`` (probes must
  work unauthenticated) needs ``authorization: Bearer <token>``; anything else is refused with
  ``UNAUTHENTICATED`` before a handler runs. The comparison is constant-time. Outgoing calls
  carry the same token.

One :class:`Security` object per process holds the settings; services build their server
credentials, interceptors and client channels from it.
"""
from __future__ import annotations

import argparse
import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import grpc

from fastvideo3.rpc import AUTH_HEADER, make_channel
from fastvideo3.errors import InvalidRequest

HEALTH_PREFIX = "/grpc.health.v1.Health/"


@dataclass(frozen=True)
class Security:
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    auth_token_file: str | None = None

    def __post_init__(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise InvalidRequest("give both or neither", field="tls_cert/tls_key")
        if self.tls_ca and not self.tls_cert:
            raise InvalidRequest("a CA without a certificate: mutual TLS needs --tls-cert/--tls-key",
                                 field="tls_ca")
        for name in ("tls_cert", "tls_key", "tls_ca", "auth_token_file"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise InvalidRequest(f"no such file: {path}", field=name)
        if self.auth_token_file and not self.token:
            raise InvalidRequest("the token file is empty", field="auth_token_file")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def token(self) -> str | None:
        if not self.auth_token_file:
            return None
        return Path(self.auth_token_file).read_text().strip() or None

    @property
    def enabled(self) -> bool:
        return self.tls or bool(self.auth_token_file)

    def _read(self, path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    # -- server side ---------------------------------------------------------------------
    def server_credentials(self) -> grpc.ServerCredentials:
        pair = [(self._read(self.tls_key), self._read(self.tls_cert))]
        ca = self._read(self.tls_ca)
        return grpc.ssl_server_credentials(pair, root_certificates=ca, require_client_auth=ca is not None)

    def interceptors(self) -> list[grpc.ServerInterceptor]:
        token = self.token
        return [TokenAuth(token)] if token else []

    def bind(self, server: grpc.Server, address: str) -> int:
        """Add the listening port (TLS or plaintext); returns the bound port (0 on failure)."""
        if self.tls:
            return server.add_secure_port(address, self.server_credentials())
        return server.add_insecure_port(address)

    # -- client side ---------------------------------------------------------------------
    def channel(self, target: str, options: Sequence | None = None) -> grpc.Channel:
        """A channel to another service of the fleet, with this process's TLS and token."""
        if self.tls:
            return make_channel(target, options, root_certificates=self._read(self.tls_ca or self.tls_cert),
                                private_key=self._read(self.tls_key) if self.tls_ca else None,
                                certificate_chain=self._read(self.tls_cert) if self.tls_ca else None,
                                token=self.token)
        return make_channel(target, options, token=self.token)

    def argv(self) -> list[str]:
        """The flags that give a child process these settings."""
        out: list[str] = []
        for flag, value in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key), ("--tls-ca", self.tls_ca),
                            ("--auth-token-file", self.auth_token_file)):
            if value:
                out += [flag, str(value)]
        return out

    def install(self) -> None:
        """Make this process's pool-to-pool transfer channels use these settings."""
        if self.enabled:
            from fastvideo3.transport import grpc_bytes
            grpc_bytes.set_channel_factory(self.channel)


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (off by default)")
    g.add_argument("--tls-cert", default=None, help="PEM certificate: serve TLS only")
    g.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    g.add_argument("--tls-ca", default=None, help="PEM CA: require client certificates it signed (mutual TLS)")
    g.add_argument("--auth-token-file", default=None, help="file holding the bearer token every RPC but health needs")


def from_args(a: argparse.Namespace | dict) -> Security:
    d = a if isinstance(a, dict) else vars(a)
    return Security(d.get("tls_cert"), d.get("tls_key"), d.get("tls_ca"), d.get("auth_token_file"))


class TokenAuth(grpc.ServerInterceptor):
    """Refuses every RPC but health without the right bearer token (UNAUTHENTICATED)."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method or ""
        if method.startswith(HEALTH_PREFIX):
            return continuation(handler_call_details)
        got = dict(handler_call_details.invocation_metadata or ()).get(AUTH_HEADER, "")
        if hmac.compare_digest(str(got).encode(), self._expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        return _deny(handler, "missing or invalid bearer token") if handler is not None else None


def _deny(handler, message: str):
    def refuse(request, context):
        from fastvideo3.errors import Unauthenticated
        from services.common.errors import abort
        abort(context, Unauthenticated(message, field="authorization"))

    kw = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **kw)
    return grpc.unary_unary_rpc_method_handler(refuse, **kw)
