"""The cost router: one Dynamo video model in front of several fastvideo3 fleets.

    python -m fleet.dynamo.router --fleet a=10.0.0.1:50051 --fleet b=10.0.0.2:50051 \\
        --policy cost --discovery-backend file --request-plane tcp --event-plane zmq

Why this piece exists (Dynamo 1.6.1): the frontend serves ``/v1/videos`` through a plain push
router built without a worker-load monitor. Its modes (``round-robin``, ``random``,
``least-loaded``, ``power-of-two``, ``device-aware-weighted``) see only the frontend's own count
of requests in flight per worker instance; nothing a video worker publishes reaches them, and the
load-reading machinery (KV router, ``--router-queue-policy wspt``, ``--router-policy-config``,
busy thresholds, ForwardPassMetrics) is built only for token (chat/completions) pipelines. Nor
does the frontend look inside a video request to skip workers that cannot serve it. So this
worker does what the frontend cannot: it registers the fleets' models once, and for each request
picks, among the fleets whose DeploymentCard can serve it and whose scheduler is SERVING, the one
with the soonest predicted finish under the fleet's own calibrated cost model
(``fleet/routing.py``). Dynamo's frontend still routes among router replicas (any mode).

Live state per fleet:

* health: a ``grpc.health.v1`` Watch stream on the scheduler; NOT_SERVING or a broken stream
  removes the fleet from routing at once (reconnects every 250 ms);
* load: the predicted GPU-seconds this router has placed there and not yet seen finish (shrunk
  by progress events), plus, from ``Describe`` every ``--refresh-interval`` seconds, what the
  fleet's own ledger says it owes beyond that (traffic that did not come through this router);
  the same reads are published on Dynamo's system ``/metrics`` (``fastvideo3_fleet_*``);
* cost model and pool sizes: the DeploymentCard re-read from the same ``Describe``.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, AsyncGenerator

from dynamo._core import Context
from dynamo.common.backend import DiffusionEngine, EngineConfig, WorkerConfig
from dynamo.common.protocols.video_protocol import NvVideosResponse
from dynamo.llm import exceptions as dx
from fastvideo3.client import FleetClient
from fastvideo3.errors import FastVideoError, InvalidRequest, Unavailable
from fastvideo3.vocab import EventKind
from fleet.deployment_card import card_from_description
from fleet.dynamo import health_check
from fleet.dynamo.args import DynamoWorkerArgs, build_parser
from fleet.dynamo.handlers import VideoHandler, request_id_for, to_dynamo_error, translate
from fleet.dynamo.load import FleetLoad
from fleet.routing import POLICIES, FleetRouter, FleetState

log = logging.getLogger("fastvideo3.dynamo.router")


@dataclass(frozen=True)
class RouterArgs:
    fleets: tuple[tuple[str, str], ...]  # (name, HOST:PORT)
    policy: str
    refresh_interval_s: float
    fleet_output_format: str
    aliases: bool
    worker: DynamoWorkerArgs


def parse_fleet(spec: str) -> tuple[str, str]:
    name, sep, target = spec.partition("=")
    if not sep or not name or ":" not in target:
        raise InvalidRequest(f"{spec!r} is not NAME=HOST:PORT", field="fleet", limit="NAME=HOST:PORT")
    return name, target


def parse_args(argv: list[str] | None = None) -> RouterArgs:
    p = build_parser(prog="python -m fleet.dynamo.router", scheduler=False,
                     description="Route Dynamo video requests across several fastvideo3 fleets by predicted cost.")
    p.add_argument("--fleet", action="append", default=[], metavar="NAME=HOST:PORT",
                   help="a fleet's scheduler (repeat per fleet)")
    p.add_argument("--policy", choices=POLICIES, default="cost",
                   help="cost: soonest predicted finish (default); the others are baselines")
    p.add_argument("--refresh-interval", type=float, default=2.0, dest="refresh_interval_s",
                   help="seconds between Describe reads of each fleet (card, cost model, outside load)")
    p.add_argument("--aliases", action=argparse.BooleanOptionalAction, default=True,
                   help="also answer to every fleet card's id (default); --no-aliases: only the served name")
    a = vars(p.parse_args(argv))
    fleets = tuple(parse_fleet(s) for s in a.pop("fleet"))
    if not fleets:
        raise InvalidRequest("no --fleet given", field="fleet", limit=">= 1 NAME=HOST:PORT")
    names = [n for n, _ in fleets]
    if len(set(names)) != len(names):
        raise InvalidRequest("fleet names must be unique", field="fleet", limit=", ".join(names))
    policy, refresh, fmt = a.pop("policy"), a.pop("refresh_interval_s"), a["fleet_output_format"]
    aliases = a.pop("aliases")
    if not 0.1 <= refresh <= 600:
        raise InvalidRequest(f"{refresh} is out of range", field="refresh_interval", limit="[0.1, 600] seconds")
    return RouterArgs(fleets, policy, refresh, fmt, aliases, DynamoWorkerArgs(scheduler="", **a))


class FleetLink:
    """One fleet: its client and handler, a health watch and a periodic Describe refresh."""

    def __init__(self, name: str, target: str, state: FleetState, client: FleetClient, router: FleetRouter,
                 args: RouterArgs, stop: threading.Event):
        self.name, self.target, self.state, self.client = name, target, state, client
        self.handler = VideoHandler(client)
        self.router, self.args, self.stop = router, args, stop
        self.load = FleetLoad()
        self.watch: health_check.SchedulerWatch | None = None

    def start(self) -> None:
        self.watch = health_check.SchedulerWatch(self.client.channel, self._serving_changed, name=self.name).start()
        threading.Thread(target=self._refresh, name=f"describe-{self.name}", daemon=True).start()

    def _serving_changed(self, up: bool) -> None:
        """Anything but SERVING (or a lost health stream) takes the fleet out of routing at once."""
        log.info("fleet %s is %s", self.name, "SERVING" if up else "not SERVING: routing away")
        self.router.set_serving(self.name, up)
        self.load = replace(self.load, serving=up)

    def _refresh(self) -> None:
        while not self.stop.wait(self.args.refresh_interval_s):
            try:
                desc = self.client.describe()
            except FastVideoError:
                continue  # the health watch decides about serving
            card = card_from_description(desc)
            load = FleetLoad.from_description(desc, serving=self.state.serving)
            self.load = load
            with self.router.lock:
                if card is not None:
                    self.state.set_card(card)
                self.state.set_reported(load.owed_gpu_seconds, load.requests,
                                        load.memory_free_bytes if load.memory_budget_bytes else None)


class CostRouterEngine(DiffusionEngine):
    """A Dynamo video model whose requests run on the fleet the policy picks."""

    def __init__(self, args: RouterArgs, links: dict[str, FleetLink], router: FleetRouter, stop: threading.Event):
        self.args, self.links, self.router, self.stop = args, links, router, stop
        cards = [link.state.card for link in links.values()]
        ids: list[str] = []
        for c in cards:
            ids += [m.card_id for m in c.models if m.card_id not in ids]
        first = cards[0]
        self.served_model_name = args.worker.served_model_name or first.default_model or ids[0]
        self.aliases = [i for i in ids if i != self.served_model_name] if args.aliases else []

    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple["CostRouterEngine", WorkerConfig]:
        args = parse_args(argv)
        stop = threading.Event()
        states, clients = [], {}
        try:
            for name, target in args.fleets:
                client = FleetClient(target, timeout_s=args.worker.request_timeout_s)
                clients[name] = client
                await asyncio.to_thread(health_check.wait_until_serving, client.channel,
                                        deadline_s=args.worker.wait_for_fleet_s, target=target)
                card = card_from_description(await asyncio.to_thread(client.describe))
                if card is None:
                    raise Unavailable(f"fleet {name} at {target} publishes no DeploymentCard", field="fleet")
                states.append(FleetState(name, target, card))
        except BaseException:
            for c in clients.values():
                c.close()
            raise
        router = FleetRouter(states, args.policy)
        links = {s.name: FleetLink(s.name, s.target, s, clients[s.name], router, args, stop) for s in states}
        engine = cls(args, links, router, stop)
        log.info("routing %s over fleets %s by %s", [engine.served_model_name, *engine.aliases],
                 {n: t for n, t in args.fleets}, args.policy)
        return engine, args.worker.worker_config(engine.served_model_name)

    async def start(self, worker_id: int) -> EngineConfig:
        del worker_id
        # every request streams from a fleet in a thread: size the pool for a burst, not for CPUs
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=256,
                                                                           thread_name_prefix="route"))
        for link in self.links.values():
            link.start()
        fleets = {n: {"scheduler": link.target, "deployment_card": link.state.card.model_dump(mode="json")}
                  for n, link in self.links.items()}
        return EngineConfig(model=self.served_model_name, served_model_name=self.served_model_name,
                            model_aliases=self.aliases,
                            runtime_data={"fastvideo3": {"router": {"policy": self.args.policy, "fleets": fleets}}})

    async def register_prometheus(self, metrics) -> None:
        """Every fleet's live load (as last read) joins Dynamo's system /metrics."""
        from fleet.dynamo.load import expfmt
        metrics.register_prometheus_expfmt_callback(lambda: expfmt({n: link.load for n, link in self.links.items()}))

    async def generate(self, request: dict[str, Any], context: Context) -> AsyncGenerator[dict[str, Any], None]:
        if health_check.is_probe(request):
            if not any(link.state.serving for link in self.links.values()):
                raise dx.CannotConnect("no fleet is SERVING")
            yield NvVideosResponse(id="canary", model=self.served_model_name, created=int(time.time()),
                                   data=[]).model_dump()
            return
        request_id = request_id_for(context.id() if context is not None else None)
        try:
            job = self._translate(request)
            fleet = self.router.pick(request_id, job.card_id, job.params)
        except FastVideoError as e:
            log.info("request refused: %s", e.one_line())
            raise to_dynamo_error(e) from None
        link = self.links[fleet.name]
        log.info("request %s -> fleet %s (%s)", request_id, fleet.name, self.args.policy)

        def progress(ev) -> None:
            if ev.kind == EventKind.PROGRESS and ev.data.get("phase") == "denoise":
                self.router.progress(fleet.name, request_id, int(ev.data["step"]), int(ev.data["total"]))

        try:
            response = await link.handler.run(replace(job, output_format=self.args.fleet_output_format), context,
                                              request_id=request_id, on_event=progress)
        except FastVideoError as e:
            if e.code == "UNAVAILABLE":  # the fleet went away under the request
                self.router.set_serving(fleet.name, False)
            err = to_dynamo_error(e)  # its text keeps the fleet's loss report, if any
            log.info("request %s on fleet %s failed: %s", request_id, fleet.name, err)
            raise err from None
        finally:
            self.router.done(fleet.name, request_id)
        response["fleet"] = fleet.name  # which fleet served it (extra field; clients may ignore it)
        yield response

    def _translate(self, request: dict[str, Any]):
        """Translate against a card that serves the requested model (cards agree on fields)."""
        model = request.get("model") if isinstance(request, dict) else None
        for link in self.links.values():
            card = link.state.card
            if model in [m.card_id for m in card.models] or model in (self.served_model_name, card.default_model):
                return translate(request, card, served_model_name=self.served_model_name)
        return translate(request, next(iter(self.links.values())).state.card,
                         served_model_name=self.served_model_name)

    async def abort(self, context: Context) -> None:
        for link in self.links.values():
            await link.handler.abort(context.id())

    async def health_check_payload(self) -> dict[str, Any]:
        return health_check.canary_payload(self.served_model_name)

    async def cleanup(self) -> None:
        self.stop.set()
        for link in self.links.values():
            if getattr(link, "watch", None) is not None:
                link.watch.stop()
            link.client.close()


def main(argv: list[str] | None = None) -> None:
    from dynamo.common.backend.run import run

    status = 0
    try:
        run(CostRouterEngine, argv)
    except FastVideoError as e:
        print(f"fleet.dynamo.router: error: {e.one_line()}", file=sys.stderr)
        status = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # see fleet/dynamo/main.py: no finalization under live gRPC threads


if __name__ == "__main__":
    main()
