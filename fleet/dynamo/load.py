"""A fleet's live load, read from its scheduler's ``Describe``, and its Prometheus form.

The scheduler keeps a ledger of the predicted GPU-seconds its accepted requests still owe per
role (priced by its calibrated cost model, shrunk as denoise steps finish) and reports it with
the admission's reserved GPU-seconds and free memory budget (``SchedulerDescription.load``, under
``description.load`` in ``FleetClient.describe()``).
:class:`FleetLoad` is that report; the Dynamo worker publishes it on Dynamo's system ``/metrics``
(``fastvideo3_fleet_*``, label ``fleet``) and the cost router compares fleets with it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class FleetLoad:
    serving: bool = True
    owed_gpu_seconds: dict[str, float] = field(default_factory=dict)  # per role
    requests: int = 0  # accepted, unfinished
    replicas: dict[str, int] = field(default_factory=dict)  # healthy replicas per role
    admission_reserved_gpu_seconds: float = 0.0
    admission_waiting: int = 0
    memory_budget_bytes: int = 0
    memory_free_bytes: int = 0

    @classmethod
    def from_description(cls, described: Mapping[str, Any], *, serving: bool = True) -> "FleetLoad":
        """From ``FleetClient.describe()`` output (a scheduler without a load report gives zeros)."""
        load = (described.get("description") or {}).get("load") or {}

        def num(v: Any) -> float:
            try:
                x = float(v)
            except (TypeError, ValueError):
                return 0.0
            return x if math.isfinite(x) else 0.0

        return cls(serving=serving,
                   owed_gpu_seconds={r: num(s) for r, s in (load.get("owed_gpu_seconds") or {}).items()},
                   requests=int(num(load.get("requests", described.get("running_requests", 0)))),
                   replicas={r: int(num(n)) for r, n in (load.get("replicas") or {}).items()},
                   admission_reserved_gpu_seconds=num(load.get("admission_reserved_gpu_seconds")),
                   admission_waiting=int(num(load.get("admission_waiting"))),
                   memory_budget_bytes=int(num(load.get("memory_budget_bytes"))),
                   memory_free_bytes=int(num(load.get("memory_free_bytes"))))

    def seconds_to_drain(self) -> float:
        """Seconds the owed work keeps the busiest role busy (owed / healthy replicas)."""
        worst = 0.0
        for role, s in self.owed_gpu_seconds.items():
            worst = max(worst, s / max(1, self.replicas.get(role, 1)))
        return worst

    def expfmt(self, fleet: str) -> str:
        """Prometheus text exposition (appended to Dynamo's system /metrics by the worker)."""
        return expfmt({fleet: self})


def expfmt(loads: Mapping[str, FleetLoad]) -> str:
    """Prometheus text exposition of several fleets' loads (one family each, label ``fleet``)."""
    lines: list[str] = []

    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    def gauge(name: str, doc: str, get) -> None:
        lines.append(f"# HELP fastvideo3_fleet_{name} {doc}")
        lines.append(f"# TYPE fastvideo3_fleet_{name} gauge")
        for fleet, load in sorted(loads.items()):
            for labels, value in get(load):
                lines.append(f'fastvideo3_fleet_{name}{{fleet="{esc(fleet)}"{labels}}} {value:.9g}')

    gauge("serving", "1 while the fleet's scheduler is SERVING.", lambda x: [("", 1.0 if x.serving else 0.0)])
    gauge("owed_gpu_seconds", "Predicted GPU-seconds its accepted requests still owe, per role.",
          lambda x: [(f',role="{r}"', s) for r, s in sorted(x.owed_gpu_seconds.items())])
    gauge("seconds_to_drain", "Owed GPU-seconds over healthy replicas, busiest role.",
          lambda x: [("", x.seconds_to_drain())])
    gauge("requests", "Accepted, unfinished requests.", lambda x: [("", float(x.requests))])
    gauge("admission_reserved_gpu_seconds", "GPU-seconds the admission controller holds reserved.",
          lambda x: [("", x.admission_reserved_gpu_seconds)])
    gauge("admission_waiting", "Requests waiting in admission.", lambda x: [("", float(x.admission_waiting))])
    gauge("memory_free_bytes", "Admission memory budget not reserved.", lambda x: [("", float(x.memory_free_bytes))])
    return "\n".join(lines) + "\n"
