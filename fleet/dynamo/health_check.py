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

import threading
import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dynamo.common.backend.health_check import build_raw_health_check_payload, is_probe
from fastvideo3.errors import Unavailable
from fleet.deployment_card import ModelCardSummary

CANARY_PROMPT = "fastvideo3 health canary"

__all__ = ["CANARY_PROMPT", "SchedulerWatch", "canary_payload", "canary_request", "is_probe",
           "scheduler_serving", "wait_until_serving"]


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


class SchedulerWatch:
    """Follows a scheduler's ``grpc.health.v1`` Watch stream in a thread and calls
    ``on_change(serving)`` whenever SERVING turns on or off. A broken stream counts as not
    serving; it reconnects every ``retry_s``. ``serving`` is the last status seen."""

    def __init__(self, channel: grpc.Channel, on_change, *, name: str = "scheduler", retry_s: float = 0.25):
        self.channel, self.on_change, self.name, self.retry_s = channel, on_change, name, retry_s
        self.serving = True  # callers start it after wait_until_serving
        self._stop = threading.Event()
        self._call = None

    def start(self) -> "SchedulerWatch":
        threading.Thread(target=self._run, name=f"health-watch-{self.name}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()

    def _set(self, up: bool) -> None:
        if up != self.serving:
            self.serving = up
            self.on_change(up)

    def _run(self) -> None:
        stub = health_pb2_grpc.HealthStub(self.channel)
        while not self._stop.is_set():
            try:
                self._call = stub.Watch(health_pb2.HealthCheckRequest(service=""))
                for resp in self._call:
                    self._set(resp.status == health_pb2.HealthCheckResponse.SERVING)
            except grpc.RpcError:
                pass
            if self._stop.is_set():
                return
            self._set(False)
            self._stop.wait(self.retry_s)
