"""The flags every service declares, declared once: where it listens, which card it serves, how it
drains, its telemetry, its lifetime, and its security (services/common/auth.py). The pool mains
(services/common/pool.py) and the scheduler (services/scheduler/config.py) call
:func:`add_service_args` and add their own flags after it; the denoiser's warm-phase flag
(``--graph-buckets``) is declared here as well.
"""
from __future__ import annotations

import argparse

from fastvideo3.cli_args import CARD_HELP
from services.common.auth import add_args as add_security_args


def add_service_args(p: argparse.ArgumentParser, *, port_required: bool = False, host: str | None = None,
                     card: str | None = None, drain_timeout_s: float | None = None,
                     log_level: str | None = None) -> None:
    """Declare the shared flags on ``p``. The defaults differ per service: a pool needs its port and
    serves ``wan-tiny`` unless told; the scheduler leaves them unset so a ``--config`` file fills them."""
    p.add_argument("--port", type=int, required=port_required, default=None, help="gRPC port (0 = any free port)")
    p.add_argument("--host", default=host, help="address to listen on")
    p.add_argument("--card", default=card, help=CARD_HELP)
    p.add_argument("--drain-timeout", type=float, default=drain_timeout_s, dest="drain_timeout_s",
                   help="seconds a stopping service waits for its in-flight work")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus text on this port")
    p.add_argument("--trace-file", default=None, help="append spans as JSON lines to this file")
    p.add_argument("--otlp-endpoint", default=None, help="export spans over OTLP (host:4317)")
    p.add_argument("--exit-with-parent", action="store_true", help="stop when the launching process exits")
    p.add_argument("--log-level", default=log_level)
    add_security_args(p)


#: the warm-phase modes over the card's shape buckets: ``--graph-buckets`` (the denoiser's CUDA graphs)
#: and ``--decode-warm`` (the decoder's cuDNN tuning), each the card's buckets or none
GRAPH_BUCKET_MODES = ("off", "card")


def add_graph_bucket_args(p: argparse.ArgumentParser) -> None:
    """The denoiser's warm-phase flag (services/common/pool.py; fastvideo3/runtime/pool/dit_executor.py)."""
    p.add_argument("--graph-buckets", default="card", choices=GRAPH_BUCKET_MODES,
                   help="card: capture the card's shape buckets as CUDA graphs at warm-up (on CUDA); off: none")
