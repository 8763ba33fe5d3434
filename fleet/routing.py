"""Choosing a fleet for a request: capability filter, live load, routing policies.

Pure logic (no sockets, no threads of its own), shared by the cost router worker
(``fleet/dynamo/router.py``) and its tests.

* :func:`refusal` says why a fleet's DeploymentCard cannot serve a request (model, task, frames,
  size, steps, guidance) — such a fleet is never chosen.
* :class:`FleetState` is one fleet as the router sees it: its card, a pricer over the fleet's
  own calibrated cost model, whether it is SERVING, and the predicted GPU-seconds still owed
  by the requests in flight there (reserved and queued), per role.
* :func:`choose` applies a policy over the fleets that can serve the request and are SERVING:
  ``cost`` (the soonest predicted finish: work owed on the bottleneck role divided by its
  replicas, plus the request's own predicted time on that fleet), ``least-loaded`` (fewest
  requests in flight), ``round-robin``, ``random``.
"""
from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Iterable

from fastvideo3.errors import InvalidRequest, Unavailable
from fastvideo3.vocab import Program, Role
from fleet.deployment_card import DeploymentCard

POLICIES = ("cost", "least-loaded", "round-robin", "random")


def request_fields(card: DeploymentCard, card_id: str, params: dict[str, Any]) -> SimpleNamespace:
    """The request as pricing needs it: the client's values, else the card's defaults."""
    d = card.model(card_id).defaults
    guidance = float(params.get("guidance_scale", d.guidance_scale or 1.0))
    return SimpleNamespace(
        num_frames=int(params.get("num_frames") or d.num_frames or 1),
        height=int(params.get("height") or d.height or 32), width=int(params.get("width") or d.width or 32),
        num_inference_steps=int(params.get("num_inference_steps") or d.num_inference_steps or 1),
        guidance_scale=guidance, cfg_policy=params.get("cfg_policy") or ("none" if guidance <= 1.0 else "cfg"),
        precision=card.model(card_id).precision or "bf16", slo_class=params.get("slo_class") or "interactive")


def refusal(card: DeploymentCard, card_id: str, params: dict[str, Any], task: str = Program.T2V) -> str:
    """Why ``card`` cannot serve this request ("" when it can). Checks what the card declares."""
    ids = [m.card_id for m in card.models]
    if card_id not in ids:
        return f"model {card_id!r} is not served (serves {', '.join(ids)})"
    m = card.model(card_id)
    if m.capabilities and task not in m.capabilities:
        return f"task {task!r} is not served (capabilities {', '.join(m.capabilities)})"
    r = request_fields(card, card_id, params)
    lim = m.limits
    checks = [("num_frames", r.num_frames, lim.min_frames, lim.max_frames),
              ("height", r.height, lim.min_height, lim.max_height),
              ("width", r.width, lim.min_width, lim.max_width),
              ("num_inference_steps", r.num_inference_steps, lim.min_steps, lim.max_steps)]
    for name, value, lo, hi in checks:
        if (lo and value < lo) or (hi and value > hi):
            return f"{name}={value} is outside [{lo}, {hi or 'any'}]"
    if lim.frames_multiple and (r.num_frames - lim.frames_offset) % lim.frames_multiple:
        return f"num_frames={r.num_frames} is not {lim.frames_multiple}k+{lim.frames_offset}"
    if lim.size_multiple and (r.height % lim.size_multiple or r.width % lim.size_multiple):
        return f"size {r.width}x{r.height} is not a multiple of {lim.size_multiple}"
    if "guidance_scale" in params and lim.max_guidance_scale and r.guidance_scale > lim.max_guidance_scale:
        return f"guidance_scale={r.guidance_scale} is above {lim.max_guidance_scale}"
    return ""


def _model_card(card_id: str):
    from fastvideo3.card.registry import resolve_card
    try:
        return resolve_card(card_id)
    except Exception:  # noqa: BLE001 - a card the router cannot load is priced by count only
        return None


@dataclass
class FleetState:
    """One fleet as the router sees it. Mutated under the owning router's lock."""

    name: str
    target: str
    card: DeploymentCard
    serving: bool = True
    replicas: dict[str, int] = field(default_factory=dict)  # role -> replicas (from the card)
    owed: dict[str, dict[str, float]] = field(default_factory=dict)  # request -> role -> GPU-s left
    external: dict[str, float] = field(default_factory=dict)  # role -> GPU-s owed to others' requests
    memory_free_bytes: int | None = None  # the admission's unreserved memory budget, as last reported
    dispatched: int = 0
    _pricer: Any = None
    _cards: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.set_card(self.card)

    def set_card(self, card: DeploymentCard) -> None:
        """Adopt a (re-)published card: its cost model as calibrated now, and its pool sizes."""
        from fastvideo3.runtime.economy.pricing import Pricer
        self.card = card
        self.replicas = {p.role: max(1, int(p.replicas)) for p in card.role_pools}
        self._pricer = Pricer(card.cost_model.load()) if card.cost_model is not None else None

    @property
    def in_flight(self) -> int:
        return len(self.owed)

    def predict(self, card_id: str, params: dict[str, Any]) -> dict[str, float] | None:
        """Predicted GPU-seconds per role of the request on this fleet (None: cannot price)."""
        if self._pricer is None:
            return None
        if card_id not in self._cards:
            self._cards[card_id] = _model_card(card_id)
        mc = self._cards[card_id]
        if mc is None:
            return None
        from fastvideo3.runtime.scheduling.scheduler import PROGRAM_T2V
        from fastvideo3.telemetry.scaling import request_role_seconds
        req = request_fields(self.card, card_id, params)
        try:
            cost = request_role_seconds(self._pricer, mc, req)
            cost["_memory_bytes"] = float(self._pricer.reservation(mc, req, PROGRAM_T2V).memory_bytes)
        except Exception:  # noqa: BLE001 - an unpriceable request falls back to counting
            return None
        return cost

    def backlog_s(self) -> dict[str, float]:
        """GPU-seconds owed per role by everything in flight (ours and, estimated, others')."""
        out: dict[str, float] = {}
        for roles in self.owed.values():
            for role, s in roles.items():
                if not role.startswith("_"):  # bookkeeping entries, not roles
                    out[role] = out.get(role, 0.0) + s
        for role, s in self.external.items():
            out[role] = out.get(role, 0.0) + s
        return out

    def set_reported(self, owed: dict[str, float], requests: int, memory_free_bytes: int | None = None) -> None:
        """The fleet's own ledger (from Describe): what it owes beyond this router's requests
        is outside load. Only counted when the fleet runs requests this router did not send."""
        self.memory_free_bytes = memory_free_bytes
        ours = {}
        for roles in self.owed.values():
            for role, s in roles.items():
                if not role.startswith("_"):
                    ours[role] = ours.get(role, 0.0) + s
        if requests <= len(self.owed):
            self.external = {}
            return
        self.external = {r: max(0.0, s - ours.get(r, 0.0)) for r, s in owed.items()}

    def finish_estimate_s(self, cost: dict[str, float]) -> float:
        """Seconds until a new request of ``cost`` would finish here: on each role, the work
        owed spread over its replicas plus the request's own time; the slowest role decides.
        A request whose memory (resident + peak) exceeds the fleet's free memory budget waits in
        admission for work in flight to finish: the drain time is added once more."""
        backlog = self.backlog_s()
        worst, drain = 0.0, 0.0
        for role in {r for r in (set(cost) | set(backlog)) if not r.startswith("_")}:
            reps = self.replicas.get(role, 1)
            drain = max(drain, backlog.get(role, 0.0) / reps)
            worst = max(worst, backlog.get(role, 0.0) / reps + cost.get(role, 0.0))
        need = cost.get("_memory_bytes", 0.0)
        if self.memory_free_bytes is not None and need > self.memory_free_bytes:
            worst += drain
        return worst


class FleetRouter:
    """Fleets plus a policy. Thread-safe: ``pick`` reserves the request's predicted cost on the
    chosen fleet at once, so concurrent picks see each other; ``progress`` and ``done`` settle it."""

    def __init__(self, fleets: Iterable[FleetState], policy: str = "cost", *, seed: int | None = None):
        if policy not in POLICIES:
            raise InvalidRequest(f"unknown routing policy {policy!r}", field="policy", limit=", ".join(POLICIES))
        self.fleets = {f.name: f for f in fleets}
        if not self.fleets:
            raise InvalidRequest("no fleets to route to", field="fleet", limit=">= 1")
        self.policy = policy
        self._rr = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    @property
    def lock(self) -> threading.Lock:
        """Held while changing a fleet's card or reported load from outside (a refresher)."""
        return self._lock

    def pick(self, request_id: str, card_id: str, params: dict[str, Any], task: str = Program.T2V) -> FleetState:
        """Choose a fleet for the request and reserve its predicted cost there.

        Raises InvalidRequest when no fleet's card can serve it (naming why, per fleet) and
        Unavailable when the ones that could are all not SERVING."""
        with self._lock:
            able, why = [], {}
            for f in self.fleets.values():
                reason = refusal(f.card, card_id, params, task)
                if reason:
                    why[f.name] = reason
                else:
                    able.append(f)
            if not able:
                detail = "; ".join(f"{n}: {r}" for n, r in sorted(why.items()))
                raise InvalidRequest(f"no fleet can serve this request ({detail})", field="request",
                                     limit="a fleet's card limits")
            live = [f for f in able if f.serving]
            if not live:
                raise Unavailable("every fleet that can serve this request is not SERVING", field="fleet",
                                  retry_after_s=5.0)
            costs = {f.name: f.predict(card_id, params) for f in live}
            chosen = self._choose(live, costs)
            cost = costs[chosen.name] or {Role.DENOISER: 0.0}
            chosen.owed[request_id] = {r: s for r, s in cost.items() if not r.startswith("_")}
            chosen.dispatched += 1
            return chosen

    def _choose(self, live: list[FleetState], costs: dict[str, dict[str, float] | None]) -> FleetState:
        if self.policy == "random":
            return self._rng.choice(live)
        if self.policy == "round-robin":
            self._rr += 1
            return live[(self._rr - 1) % len(live)]
        if self.policy == "least-loaded" or any(c is None for c in costs.values()):
            return min(live, key=lambda f: (f.in_flight, f.dispatched))
        return min(live, key=lambda f: (f.finish_estimate_s(costs[f.name]), f.in_flight))

    def progress(self, fleet: str, request_id: str, done_steps: int, total_steps: int) -> None:
        """A denoise step finished: what the request still owes shrinks in proportion."""
        with self._lock:
            roles = self.fleets[fleet].owed.get(request_id)
            if roles is None or total_steps <= 0:
                return
            entry = roles.setdefault("_denoise_total", roles.get(Role.DENOISER, 0.0))
            roles[Role.DENOISER] = entry * max(0.0, 1.0 - done_steps / total_steps)
            roles[Role.ENCODER] = 0.0  # denoising has started: the prompt is encoded

    def done(self, fleet: str, request_id: str) -> None:
        with self._lock:
            self.fleets[fleet].owed.pop(request_id, None)

    def set_serving(self, fleet: str, serving: bool) -> None:
        with self._lock:
            self.fleets[fleet].serving = serving

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per fleet: serving, in flight, GPU-seconds owed per role (for logs, metrics, tests)."""
        with self._lock:
            return {n: {"serving": f.serving, "in_flight": f.in_flight, "dispatched": f.dispatched,
                        "backlog_s": {r: round(s, 6) for r, s in f.backlog_s().items()
                                      if not r.startswith("_") and math.isfinite(s)}}
                    for n, f in self.fleets.items()}
