"""Flags of ``python -m fleet.dynamo`` and the one typed config built from them.

Dynamo's own flags keep Dynamo's names and environment fallbacks (``DYN_NAMESPACE``,
``DYN_DISCOVERY_BACKEND``, ``DYN_REQUEST_PLANE``, ``DYN_RESPONSE_PLANE``, ``DYN_EVENT_PLANE``,
``DYN_HEALTH_CHECK_PAYLOAD``), so the worker and ``python -m dynamo.frontend`` agree when both
read one environment. This module is the only place the worker reads the environment.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from dynamo.common.backend import WorkerConfig
from dynamo.common.backend.health_check import parse_health_check_payload_cli
from dynamo.llm import ModelInput

from fastvideo3.vocab import OutputFormat


@dataclass(frozen=True)
class DynamoWorkerArgs:
    scheduler: str
    namespace: str = "dynamo"
    component: str = "fastvideo3"
    endpoint: str = "generate"
    served_model_name: str | None = None
    discovery_backend: str = "etcd"
    request_plane: str = "tcp"
    response_plane: str = "tcp"
    event_plane: str | None = None
    fleet_config: str | None = None
    card: str | None = None
    wait_for_fleet_s: float = 120.0
    request_timeout_s: float = 3600.0
    media_dir: str | None = None
    media_url_base: str | None = None
    canary: str = "health"
    health_check_payload: str | None = None
    load_refresh_s: float = 2.0
    leave_after_s: float | None = None
    fleet_output_format: str = OutputFormat.MP4

    def worker_config(self, model_name: str) -> WorkerConfig:
        """Dynamo's WorkerConfig: a raw (text-in, JSON-out) model on the videos surface."""
        return WorkerConfig(
            namespace=self.namespace, component=self.component, endpoint=self.endpoint,
            model_name=model_name, served_model_name=self.served_model_name or model_name,
            model_input=ModelInput.Text,  # the frontend forwards the request body as it is
            endpoint_types="videos",  # registers ModelType.Videos: the frontend serves /v1/videos
            discovery_backend=self.discovery_backend, request_plane=self.request_plane,
            response_plane=self.response_plane, event_plane=self.event_plane,
            enable_kv_routing=False,  # diffusion has no KV cache to route on
            health_check_payload=parse_health_check_payload_cli(self.health_check_payload),
        )


def build_parser(*, prog: str = "python -m fleet.dynamo", scheduler: bool = True,
                 description: str = "Register a fastvideo3 fleet with NVIDIA Dynamo as a video model.",
                 ) -> argparse.ArgumentParser:
    """The worker's flags; ``scheduler=False`` leaves out ``--scheduler`` (the cost router
    names its fleets with ``--fleet`` instead)."""
    env = os.environ.get
    p = argparse.ArgumentParser(prog=prog, description=description)
    if scheduler:
        p.add_argument("--scheduler", required=True, help="HOST:PORT of the fleet's scheduler")
    p.add_argument("--namespace", default=env("DYN_NAMESPACE", "dynamo"))
    p.add_argument("--component", default="fastvideo3")
    p.add_argument("--endpoint", default="generate")
    p.add_argument("--served-model-name", default=None,
                   help="name clients use (default: the fleet's default card); the other cards are aliases")
    p.add_argument("--discovery-backend", default=env("DYN_DISCOVERY_BACKEND", "etcd"),
                   choices=["kubernetes", "etcd", "file", "mem"])
    p.add_argument("--request-plane", default=env("DYN_REQUEST_PLANE", "tcp"), choices=["tcp", "nats"])
    p.add_argument("--response-plane", default=env("DYN_RESPONSE_PLANE", "tcp"), choices=["tcp", "quic"])
    p.add_argument("--event-plane", default=env("DYN_EVENT_PLANE") or None, choices=["nats", "zmq"])
    p.add_argument("--fleet-config", default=None,
                   help="fleet.yaml to describe the fleet when its scheduler publishes no DeploymentCard")
    p.add_argument("--card", default=None, help="as --fleet-config, for a one-card fleet")
    p.add_argument("--wait-for-fleet", type=float, default=120.0, dest="wait_for_fleet_s",
                   help="seconds to wait for the scheduler to be SERVING before registering")
    p.add_argument("--request-timeout", type=float, default=3600.0, dest="request_timeout_s")
    p.add_argument("--media-dir", default=None,
                   help="write videos here for response_format=url (default: answer url requests with data: URLs)")
    p.add_argument("--media-url-base", default=None, help="public URL of --media-dir (default: file:// URLs)")
    p.add_argument("--canary", choices=["health", "generate"], default="health",
                   help="what the idle-endpoint canary checks (see fleet/dynamo/health_check.py)")
    p.add_argument("--health-check-payload", default=env("DYN_HEALTH_CHECK_PAYLOAD"),
                   help="override the canary payload (JSON or @file)")
    p.add_argument("--load-refresh", type=float, default=2.0, dest="load_refresh_s",
                   help="seconds between reads of the fleet's live load (published on Dynamo's /metrics)")
    p.add_argument("--fleet-output-format", choices=(OutputFormat.MP4, OutputFormat.NPY), default=OutputFormat.MP4,
                   help="what to ask the fleet for (npy: fleets on no-op executors, in tests)")
    p.add_argument("--leave-after", type=float, default=None, dest="leave_after_s",
                   help="seconds the scheduler may be not SERVING before the worker shuts down gracefully, "
                        "leaving Dynamo's discovery (default: stay, fail requests fast, canary not ready)")
    return p


def parse_args(argv: list[str] | None = None) -> DynamoWorkerArgs:
    p = build_parser()
    a = p.parse_args(argv)
    if not 0.1 <= a.load_refresh_s <= 600:
        p.error(f"--load-refresh: {a.load_refresh_s} is outside [0.1, 600] seconds")
    if a.leave_after_s is not None and not 0 <= a.leave_after_s <= 3600:
        p.error(f"--leave-after: {a.leave_after_s} is outside [0, 3600] seconds")
    return DynamoWorkerArgs(**{k: v for k, v in vars(a).items()})
