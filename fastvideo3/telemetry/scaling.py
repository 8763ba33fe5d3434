"""Scaling signals: how many replicas of each role a fleet needs at the current arrival rate.

For each role pool (``encoder``, ``denoiser``, ``decoder``, ``reward``)::

    replicas_needed = arrivals_per_second x predicted GPU-seconds per request on that role
                      / target_utilization / GPUs per replica

Arrivals and their predicted per-role GPU-seconds (the calibrated cost model's price of the whole
request: one encoder chunk, ``steps`` denoise steps, one decode, one reward batch) are summed over
a sliding window. The target utilization leaves headroom for bursts and for queueing: at 0.7 a
pool runs at most ~70% busy on average, which keeps M/M/c queueing delay small against the
service time. The signals are exported as Prometheus gauges (``fastvideo3_scaling_*``, see
docs/metrics.md) for an autoscaler (HPA on external metrics or KEDA) to act on.

Pure logic with an injected clock; thread-safe.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from fastvideo3.errors import InvalidRequest
from fastvideo3.vocab import KIND_OF_ROLE, LoopId, ROLES, Role

#: the WorkUnit kind each role pool runs
ROLE_KINDS = dict(KIND_OF_ROLE)
_LOOP_ROLES = {LoopId.TEXT_ENCODE: Role.ENCODER, LoopId.DIFFUSION_DENOISE: Role.DENOISER,
               LoopId.VAE_DECODE: Role.DECODER, LoopId.REWARD_SCORE: Role.REWARD}


def request_role_seconds(pricer: Any, card: Any, request: Any,
                         program: tuple[str, ...] = (LoopId.TEXT_ENCODE, LoopId.DIFFUSION_DENOISE, LoopId.VAE_DECODE),
                         ) -> dict[str, float]:
    """Predicted GPU-seconds a whole request costs on each role it visits.

    ``pricer`` is a :class:`~fastvideo3.runtime.economy.pricing.Pricer` (its calibrated cost model),
    ``card`` the ModelCard, ``request`` anything with the resolved request's fields
    (``num_frames``, ``height``, ``width``, ``num_inference_steps``, ``cfg_policy``,
    ``precision``). The denoiser pays one ``diffusion_step`` per inference step.
    """
    prompts = 1 if getattr(request, "cfg_policy", "cfg") == "none" else 2
    out: dict[str, float] = {}
    for loop in program:
        role = _LOOP_ROLES.get(loop)
        if role is None:
            continue
        kind = ROLE_KINDS[role]
        pred = pricer.predict(kind, f"route|{kind}", card, request, prompts=prompts)
        reps = max(1, int(request.num_inference_steps)) if role == Role.DENOISER else 1
        out[role] = out.get(role, 0.0) + pred.gpu_seconds * reps
    return out


def replicas_needed(arrivals_per_s: float, gpu_seconds_per_request: float, target_utilization: float,
                    gpus_per_replica: int = 1) -> float:
    """The formula, on its own (fractional; an autoscaler rounds up)."""
    if not 0 < target_utilization <= 1:
        raise InvalidRequest(f"{target_utilization} is out of range", field="target_utilization", limit="(0, 1]")
    if gpus_per_replica < 1:
        raise InvalidRequest(f"{gpus_per_replica} is out of range", field="gpus_per_replica", limit=">= 1")
    return max(0.0, arrivals_per_s) * max(0.0, gpu_seconds_per_request) / target_utilization / gpus_per_replica


@dataclass(frozen=True)
class RoleSignal:
    role: str
    arrivals_per_s: float
    gpu_seconds_per_request: float  # mean over the window's arrivals
    demand_gpu_seconds_per_s: float  # arrivals x GPU-seconds: the busy GPUs the load keeps
    replicas_needed: float  # demand / target utilization / GPUs per replica (fractional)
    replicas_needed_ceil: int
    replicas_current: int


class ScalingSignals:
    """Sliding-window arrival meter priced per role; ``snapshot()`` is what the metrics export."""

    def __init__(self, *, target_utilization: float = 0.7, window_s: float = 60.0,
                 roles: tuple[str, ...] = ROLES, gpus_per_replica: Mapping[str, int] | None = None,
                 min_replicas: int = 1, clock: Callable[[], float] = time.monotonic):
        if not 0 < target_utilization <= 1:
            raise InvalidRequest(f"{target_utilization} is out of range", field="target_utilization",
                                 limit="(0, 1]")
        if not (math.isfinite(window_s) and 1.0 <= window_s <= 3600.0):
            raise InvalidRequest(f"{window_s} is out of range", field="window_s", limit="[1, 3600] seconds")
        if min_replicas < 0:
            raise InvalidRequest(f"{min_replicas} is out of range", field="min_replicas", limit=">= 0")
        unknown = sorted(set(roles) - set(ROLES))
        if unknown:
            raise InvalidRequest(f"unknown role {unknown[0]!r}", field="roles", limit=", ".join(ROLES))
        self.target_utilization, self.window_s, self.roles = target_utilization, window_s, tuple(roles)
        self.gpus_per_replica = {r: max(1, int((gpus_per_replica or {}).get(r, 1))) for r in self.roles}
        self.min_replicas = min_replicas
        self._clock = clock
        self._started = clock()
        self._arrivals: deque[tuple[float, dict[str, float]]] = deque()
        self._current: dict[str, int] = {}
        self._lock = threading.Lock()

    def observe(self, role_seconds: Mapping[str, float]) -> None:
        """One accepted request and its predicted GPU-seconds per role."""
        now = self._clock()
        clean = {r: float(s) for r, s in role_seconds.items()
                 if r in self.roles and math.isfinite(float(s)) and s >= 0}
        with self._lock:
            self._arrivals.append((now, clean))
            self._trim(now)

    def set_current(self, role: str, replicas: int) -> None:
        """How many replicas the role has now (exported beside the need, for dashboards)."""
        with self._lock:
            self._current[role] = int(replicas)

    def snapshot(self) -> dict[str, RoleSignal]:
        now = self._clock()
        with self._lock:
            self._trim(now)
            arrivals = list(self._arrivals)
            current = dict(self._current)
        # a fresh process has seen less than one window: divide by what it has seen (>= 1 s)
        span = max(1.0, min(self.window_s, now - self._started))
        rate = len(arrivals) / span
        out: dict[str, RoleSignal] = {}
        for role in self.roles:
            total = sum(r.get(role, 0.0) for _, r in arrivals)
            per_req = total / len(arrivals) if arrivals else 0.0
            demand = total / span
            need = replicas_needed(rate, per_req, self.target_utilization, self.gpus_per_replica[role])
            ceil = max(self.min_replicas, math.ceil(need - 1e-9)) if need > 0 else self.min_replicas
            out[role] = RoleSignal(role, rate, per_req, demand, need, ceil, current.get(role, 0))
        return out

    def values(self) -> dict[str, float]:
        """Flat ``role.name -> number`` form (for Describe and plain-dict exports)."""
        out: dict[str, float] = {"target_utilization": self.target_utilization, "window_s": self.window_s}
        for role, s in self.snapshot().items():
            out[f"{role}.arrivals_per_s"] = s.arrivals_per_s
            out[f"{role}.gpu_seconds_per_request"] = s.gpu_seconds_per_request
            out[f"{role}.demand_gpu_seconds_per_s"] = s.demand_gpu_seconds_per_s
            out[f"{role}.replicas_needed"] = s.replicas_needed
            out[f"{role}.replicas_needed_ceil"] = float(s.replicas_needed_ceil)
            out[f"{role}.replicas_current"] = float(s.replicas_current)
        return out

    def families(self, fleet: str = "") -> list[Any]:
        """Prometheus metric families (``fastvideo3_scaling_*``, label ``role`` and ``fleet``)."""
        from prometheus_client.core import GaugeMetricFamily

        snap = self.snapshot()
        specs = [
            ("replicas_needed", "Replicas the role needs at the current arrival rate: arrivals x predicted "
             "GPU-seconds per request / target utilization / GPUs per replica (fractional).",
             lambda s: s.replicas_needed),
            ("replicas_needed_ceil", "replicas_needed rounded up, at least the configured minimum.",
             lambda s: float(s.replicas_needed_ceil)),
            ("replicas_current", "Replicas the role has now (as the scheduler sees them).",
             lambda s: float(s.replicas_current)),
            ("arrivals_per_second", "Accepted requests per second over the window.", lambda s: s.arrivals_per_s),
            ("gpu_seconds_per_request", "Mean predicted GPU-seconds one request costs on the role.",
             lambda s: s.gpu_seconds_per_request),
            ("demand_gpu_seconds_per_second", "Predicted GPU-seconds per second the arrivals bring to the role.",
             lambda s: s.demand_gpu_seconds_per_s),
        ]
        fams = []
        for name, doc, get in specs:
            g = GaugeMetricFamily("fastvideo3_scaling_" + name, doc, labels=["fleet", "role"])
            for role, s in snap.items():
                g.add_metric([fleet, role], get(s))
            fams.append(g)
        t = GaugeMetricFamily("fastvideo3_scaling_target_utilization",
                              "The utilization the replica counts aim for.", labels=["fleet"])
        t.add_metric([fleet], self.target_utilization)
        fams.append(t)
        return fams

    def _trim(self, now: float) -> None:
        cut = now - self.window_s
        while self._arrivals and self._arrivals[0][0] < cut:
            self._arrivals.popleft()


class WorkLedger:
    """Predicted GPU-seconds still owed, per role, by the requests a scheduler has accepted.

    ``add`` at acceptance (the request's whole predicted cost per role), ``progress`` as denoise
    steps finish (the denoiser's share shrinks in proportion; encoding is then done), ``remove``
    when the request ends. ``owed()`` is the fleet's live load in the one currency: what a
    router compares across fleets and what the load gauges export. Thread-safe.
    """

    def __init__(self) -> None:
        self._owed: dict[str, dict[str, float]] = {}
        self._full: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, request_id: str, role_seconds: Mapping[str, float]) -> None:
        with self._lock:
            self._owed[request_id] = {r: float(s) for r, s in role_seconds.items()}
            self._full[request_id] = float(role_seconds.get(Role.DENOISER, 0.0))

    def progress(self, request_id: str, step: int, total: int) -> None:
        with self._lock:
            owed = self._owed.get(request_id)
            if owed is None or total <= 0:
                return
            owed[Role.DENOISER] = self._full[request_id] * max(0.0, 1.0 - step / total)
            owed[Role.ENCODER] = 0.0

    def remove(self, request_id: str) -> None:
        with self._lock:
            self._owed.pop(request_id, None)
            self._full.pop(request_id, None)

    def owed(self) -> dict[str, float]:
        with self._lock:
            out: dict[str, float] = {}
            for roles in self._owed.values():
                for role, s in roles.items():
                    out[role] = out.get(role, 0.0) + s
            return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._owed)

    def families(self, fleet: str = "") -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        g = GaugeMetricFamily("fastvideo3_load_owed_gpu_seconds",
                              "Predicted GPU-seconds still owed per role by accepted, unfinished requests.",
                              labels=["fleet", "role"])
        for role, s in sorted(self.owed().items()):
            g.add_metric([fleet, role], s)
        n = GaugeMetricFamily("fastvideo3_load_requests", "Accepted, unfinished requests.", labels=["fleet"])
        n.add_metric([fleet], float(len(self)))
        return [g, n]
