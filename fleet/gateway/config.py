"""The gateway's one config object, from flags.

    python -m fleet.gateway --scheduler 127.0.0.1:50051 [--port 8000] [--host 127.0.0.1]
        [--state-store memory://|redis://host:port/db] [--state-namespace fastvideo3-gateway]
        [--media-dir DIR] [--media-ttl 3600] [--api-keys-file FILE] [--max-body-bytes N]
        [--max-jobs-per-key N] [--accept-timeout S] [--job-timeout S]
        [--tls-cert ... --auth-token-file ...]     (how to reach a secured scheduler)
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fastvideo3.errors import InvalidRequest


@dataclass(frozen=True)
class GatewayConfig:
    scheduler: str = "127.0.0.1:50051"
    host: str = "127.0.0.1"
    port: int = 8000
    state_store: str = "memory://"          # redis://... makes jobs survive a gateway restart
    state_namespace: str = "fastvideo3-gateway"
    state_timeout_s: float = 2.0
    media_dir: str = ""                     # empty: a temporary directory
    media_ttl_s: float = 3600.0             # videos (and job records) expire this long after they end
    api_keys_file: str | None = None        # one key per line; absent = no auth (local use)
    max_body_bytes: int = 4 << 20           # largest create request accepted
    max_jobs_per_key: int = 8               # running jobs per API key (per gateway replica)
    accept_timeout_s: float = 60.0          # how long a create waits for the fleet to accept
    job_timeout_s: float = 3600.0           # whole-job deadline of the fleet call
    models_ttl_s: float = 10.0              # how long the fleet's card list is cached
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    auth_token_file: str | None = None      # the scheduler's token (not an API key)
    exit_with_parent: bool = False
    log_level: str = "INFO"

    def api_keys(self) -> list[str]:
        if not self.api_keys_file:
            return []
        try:
            text = Path(self.api_keys_file).read_text()
        except OSError as e:
            raise InvalidRequest(f"cannot read the API keys file: {e}", field="api_keys_file") from None
        keys = [ln.strip() for ln in text.splitlines()]
        keys = [k for k in keys if k and not k.startswith("#")]
        if not keys:
            raise InvalidRequest("the API keys file has no key", field="api_keys_file")
        return keys

    def media_root(self) -> str:
        return self.media_dir or tempfile.mkdtemp(prefix="fastvideo3-media-")


def parse_args(argv: list[str] | None = None) -> GatewayConfig:
    p = argparse.ArgumentParser(prog="python -m fleet.gateway",
                                description="OpenAI Videos API and playground in front of a fastvideo3 fleet")
    p.add_argument("--scheduler", required=True, help="the scheduler's HOST:PORT")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--state-store", default="memory://", help="memory:// or redis://host:port/db")
    p.add_argument("--state-namespace", default="fastvideo3-gateway")
    p.add_argument("--state-timeout", type=float, default=2.0, dest="state_timeout_s")
    p.add_argument("--media-dir", default="", help="where videos are kept (default: a temporary directory)")
    p.add_argument("--media-ttl", type=float, default=3600.0, dest="media_ttl_s",
                   help="seconds a finished job and its media stay available")
    p.add_argument("--api-keys-file", default=None, help="bearer keys, one a line (default: no auth)")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20)
    p.add_argument("--max-jobs-per-key", type=int, default=8)
    p.add_argument("--accept-timeout", type=float, default=60.0, dest="accept_timeout_s")
    p.add_argument("--job-timeout", type=float, default=3600.0, dest="job_timeout_s")
    from services.common.auth import add_args
    add_args(p)
    p.add_argument("--exit-with-parent", action="store_true")
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    cfg = GatewayConfig(**{k: v for k, v in vars(a).items()})
    check(cfg)
    return cfg


def check(cfg: GatewayConfig) -> None:
    host, _, port = cfg.scheduler.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidRequest(f"bad scheduler address {cfg.scheduler!r}", field="scheduler", limit="HOST:PORT")
    if not 0 <= cfg.port <= 65535:
        raise InvalidRequest(f"{cfg.port} is out of range", field="port", limit="[0, 65535]")
    for name in ("media_ttl_s", "accept_timeout_s", "job_timeout_s", "state_timeout_s"):
        if not getattr(cfg, name) > 0:
            raise InvalidRequest(f"must be > 0, got {getattr(cfg, name)}", field=name, limit="> 0")
    if cfg.max_body_bytes < 1024:
        raise InvalidRequest(f"{cfg.max_body_bytes} is too small", field="max_body_bytes", limit=">= 1024")
    if cfg.max_jobs_per_key < 1:
        raise InvalidRequest(f"must be >= 1, got {cfg.max_jobs_per_key}", field="max_jobs_per_key", limit=">= 1")
    cfg.api_keys()  # fails now on an unreadable or empty keys file
