"""The worker's health canary: what Dynamo sends through ``generate`` when the endpoint is idle,
and what the worker does with it.

Dynamo's runtime (``DYN_HEALTH_CHECK_ENABLED=true``) sends :func:`canary_payload` through the
engine's ``generate`` after ``DYN_CANARY_WAIT_TIME`` seconds of idleness; a failed canary turns
the worker's ``/health`` (on ``DYN_SYSTEM_PORT``) NOT ready, so the frontend and Kubernetes stop
routing to a worker whose fleet is down. Two depths:

* ``health`` (default): the scheduler's ``grpc.health.v1`` status for ``""`` must be SERVING
  (the scheduler is SERVING only while every role its programs need has a SERVING replica);
* ``generate``: a minimal real request (smallest valid frames, size and steps of the default
  card) must finish — exercises every pool and the data plane, at the cost of a little work.
"""
from __future__ import annotations

import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dynamo.common.backend.health_check import build_raw_health_check_payload, is_probe
from fastvideo3.errors import Unavailable
from fleet.deployment_card import ModelCardSummary

CANARY_PROMPT = "fastvideo3 health canary"

__all__ = ["CANARY_PROMPT", "canary_payload", "canary_request", "is_probe", "scheduler_serving",
           "wait_until_serving"]


def canary_payload(model: str) -> dict[str, Any]:
    """The request body Dynamo's canary sends (marked as a probe; operator overrides apply)."""
    return build_raw_health_check_payload({"prompt": CANARY_PROMPT, "model": model, "response_format": "b64_json"})


def canary_request(model: ModelCardSummary) -> dict[str, Any]:
    """FleetClient keyword arguments of the smallest valid request for ``model``."""
    lim = model.limits
    step = lim.frames_multiple or 1
    frames = lim.frames_offset or 1
    while frames < (lim.min_frames or 1):
        frames += step
    mult = lim.size_multiple or 16
    height = max(lim.min_height, mult)
    width = max(lim.min_width, mult)
    steps = lim.min_steps or 1
    # guidance 1.0: no classifier-free guidance, one DiT call per step
    return dict(num_frames=frames, height=height, width=width, num_inference_steps=steps, seed=0,
                guidance_scale=1.0, slo_class="batch")


def scheduler_serving(channel: grpc.Channel, *, service: str = "", timeout_s: float = 2.0) -> bool:
    """True when the scheduler reports SERVING for ``service`` ("" = the whole process)."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.RpcError:
        return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def wait_until_serving(channel: grpc.Channel, *, deadline_s: float, target: str) -> None:
    """Block until the scheduler is SERVING; raise Unavailable after ``deadline_s`` seconds."""
    end = time.monotonic() + deadline_s
    while True:
        if scheduler_serving(channel, timeout_s=min(2.0, max(0.1, end - time.monotonic()))):
            return
        if time.monotonic() >= end:
            raise Unavailable(f"the scheduler at {target} is not SERVING after {deadline_s:.0f}s",
                              field="scheduler", retry_after_s=5.0)
        time.sleep(0.2)  # polling a health endpoint: there is no event to wait on across processes
