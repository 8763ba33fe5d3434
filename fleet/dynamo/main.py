"""The fastvideo3 Dynamo worker: a ``DiffusionEngine`` in front of a fleet's scheduler.

    python -m fleet.dynamo --scheduler 127.0.0.1:50051 --discovery-backend file \\
        --request-plane tcp --event-plane zmq

Lifecycle (Dynamo's ``dynamo.common.backend`` contract; Dynamo's ``Worker`` owns registration,
serving, signals and shutdown — workers stop on SIGTERM):

1. ``from_args``: parse flags, connect to the scheduler, wait until it is SERVING, and read the
   fleet's DeploymentCard from ``Describe`` (or build it from ``--fleet-config`` / ``--card``
   when the scheduler publishes none). The default card becomes the served model name; the
   other cards are its aliases, so a request's ``model`` picks the card.
2. ``start``: registration metadata. ``runtime_data["fastvideo3"]`` carries the DeploymentCard
   (cost model included), so routers and planners read what the scheduler admits with.
3. ``generate``: translate the video request, run it on the fleet, answer ``NvVideosResponse``;
   canary probes check the fleet instead (see ``health_check.py``).
4. ``abort`` / context cancelled: the request is cancelled on the fleet.
5. Routing signals (see the README): the scheduler's health is followed from ``start`` on —
   while it is not SERVING requests fail fast with ``CannotConnect`` and, with
   ``--leave-after``, the worker leaves discovery by shutting down gracefully; the fleet's live
   load (``fleet/dynamo/load.py``) joins Dynamo's system ``/metrics`` (``register_prometheus``).
   Dynamo 1.6.1 gives raw engines no endpoint handle (``on_endpoint_ready`` is not called for
   them), so the worker cannot unregister and stay up.
6. ``cleanup``: stop watching, close the channel.

The live card (cost model as calibrated now) is ``fastvideo3 deployment-card --target HOST:PORT``
(Dynamo 1.6.1 does not route engine controls to raw engines).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from typing import Any, AsyncGenerator

from dynamo._core import Context
from dynamo.common.backend import DiffusionEngine, EngineConfig, WorkerConfig
from dynamo.common.protocols.video_protocol import NvVideosResponse
from dynamo.llm import exceptions as dx
from fastvideo3.client import FleetClient
from fastvideo3.errors import FailedPrecondition, FastVideoError
from fleet.deployment_card import DeploymentCard, card_for_model, card_from_description, card_from_fleet_config
from fleet.dynamo import health_check
from fleet.dynamo.args import DynamoWorkerArgs, parse_args
from fleet.dynamo.handlers import VideoHandler, VideoJob, to_dynamo_error, translate
from fleet.dynamo.load import FleetLoad

log = logging.getLogger("fastvideo3.dynamo")

RUNTIME_DATA_KEY = "fastvideo3"


def describe_fleet(client: FleetClient, args: DynamoWorkerArgs) -> DeploymentCard:
    """The fleet's DeploymentCard: the scheduler's own, else one built from the flags."""
    card = None
    try:
        card = card_from_description(client.describe())
    except FastVideoError as e:
        if not (args.fleet_config or args.card):
            raise
        log.warning("Describe failed (%s); describing the fleet from flags", e.one_line())
    if card is None and args.fleet_config:
        card = card_from_fleet_config(args.fleet_config)
    if card is None and args.card:
        card = card_for_model(args.card)
    if card is None:
        raise FailedPrecondition(f"the scheduler at {args.scheduler} publishes no DeploymentCard",
                                 field="scheduler", limit="pass --fleet-config or --card")
    return card


class FastVideoEngine(DiffusionEngine):
    """Serves a fastvideo3 fleet's cards on Dynamo's ``/v1/videos``."""

    def __init__(self, args: DynamoWorkerArgs, client: FleetClient, card: DeploymentCard):
        self.args = args
        self.client: FleetClient | None = client
        self.card = card
        self.served_model_name = args.served_model_name or card.default_model or card.models[0].card_id
        self.handler = VideoHandler(client, media_dir=args.media_dir, media_url_base=args.media_url_base)
        self.load = FleetLoad()
        self._watch: health_check.SchedulerWatch | None = None
        self._stop = threading.Event()

    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple["FastVideoEngine", WorkerConfig]:
        args = parse_args(argv)
        client = FleetClient(args.scheduler, timeout_s=args.request_timeout_s)
        try:
            await asyncio.to_thread(health_check.wait_until_serving, client.channel,
                                    deadline_s=args.wait_for_fleet_s, target=args.scheduler)
            card = await asyncio.to_thread(describe_fleet, client, args)
        except BaseException:
            client.close()
            raise
        engine = cls(args, client, card)
        log.info("fleet %s at %s serves %s", card.engine_id, args.scheduler, [m.card_id for m in card.models])
        return engine, args.worker_config(engine.served_model_name)

    async def start(self, worker_id: int) -> EngineConfig:
        del worker_id  # one fleet per worker; nothing per-instance to key
        self._start_following()
        aliases = [m.card_id for m in self.card.models if m.card_id != self.served_model_name]
        return EngineConfig(model=self.served_model_name, served_model_name=self.served_model_name,
                            model_aliases=aliases, runtime_data=self.runtime_data())

    def runtime_data(self) -> dict[str, Any]:
        return {RUNTIME_DATA_KEY: {"scheduler": self.args.scheduler,
                                   "served_model_name": self.served_model_name,
                                   "deployment_card": self.card.model_dump(mode="json")}}

    # -- requests --------------------------------------------------------------------------
    async def generate(self, request: dict[str, Any], context: Context) -> AsyncGenerator[dict[str, Any], None]:
        if health_check.is_probe(request):
            yield await self._canary(context)
            return
        if self._watch is not None and not self._watch.serving:  # fail fast: Dynamo routes away
            raise dx.CannotConnect(f"the fleet's scheduler at {self.args.scheduler} is not SERVING")
        try:
            job = translate(request, self.card, served_model_name=self.served_model_name)
            if self.args.fleet_output_format != job.output_format:
                job = replace(job, output_format=self.args.fleet_output_format)
            response = await self.handler.run(job, context)
        except FastVideoError as e:
            err = to_dynamo_error(e)  # its text keeps the fleet's loss report, if any
            log.info("request refused or failed: %s", err)
            raise err from None
        yield response

    async def abort(self, context: Context) -> None:
        await self.handler.abort(context.id())

    # -- routing: health and live load, the way Dynamo reads them -----------------------------
    async def register_prometheus(self, metrics) -> None:
        """Dynamo hands raw engines its metrics registry here: the fleet's live load joins the
        worker's system ``/metrics`` (``fastvideo3_fleet_*``)."""
        metrics.register_prometheus_expfmt_callback(lambda: self.load.expfmt(self.card.engine_id))

    def _start_following(self) -> None:
        """Watch the scheduler's health and read its load in the background (from ``start``)."""
        if self.client is None:
            return
        self._watch = health_check.SchedulerWatch(self.client.channel, self._serving_changed,
                                                  name="scheduler").start()
        threading.Thread(target=self._refresh_load, name="fleet-load", daemon=True).start()

    def _serving_changed(self, up: bool) -> None:
        """While the scheduler is not SERVING, requests fail fast with CannotConnect (Dynamo's
        router then takes this instance out of rotation); after ``--leave-after`` seconds of it
        the worker shuts down gracefully, which unregisters it from discovery."""
        log.info("fleet scheduler %s is %s", self.args.scheduler, "SERVING" if up else "not SERVING")
        self.load = replace(self.load, serving=up)
        if up or self.args.leave_after_s is None:
            return

        def leave_if_still_down() -> None:
            if self._stop.wait(self.args.leave_after_s) or (self._watch is not None and self._watch.serving):
                return
            log.warning("fleet scheduler not SERVING for %.1fs: leaving discovery (graceful shutdown)",
                        self.args.leave_after_s)
            os.kill(os.getpid(), signal.SIGTERM)  # Dynamo's shutdown: unregister, drain, cleanup

        threading.Thread(target=leave_if_still_down, name="leave-after", daemon=True).start()

    def _refresh_load(self) -> None:
        while not self._stop.wait(self.args.load_refresh_s):
            client = self.client
            if client is None:
                return
            serving = self._watch.serving if self._watch is not None else True
            try:
                self.load = FleetLoad.from_description(client.describe(), serving=serving)
            except FastVideoError:
                self.load = replace(self.load, serving=False)

    async def health_check_payload(self) -> dict[str, Any]:
        return health_check.canary_payload(self.served_model_name)

    async def _canary(self, context: Context) -> dict[str, Any]:
        if self.client is None:
            raise dx.CannotConnect("worker is shutting down")
        if self.args.canary == "generate":
            summary = self.card.model()
            job = VideoJob(card_id=summary.card_id, model=self.served_model_name, prompt=health_check.CANARY_PROMPT,
                           params=health_check.canary_request(summary), response_format="b64_json")
            try:
                await self.handler.run(job, context)
            except FastVideoError as e:
                raise dx.CannotConnect(f"canary generation failed: {e.one_line()}") from None
        elif not await asyncio.to_thread(health_check.scheduler_serving, self.client.channel):
            raise dx.CannotConnect(f"the fleet's scheduler at {self.args.scheduler} is not SERVING")
        return NvVideosResponse(id="canary", model=self.served_model_name, created=int(time.time()),
                                data=[]).model_dump()

    async def cleanup(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        client, self.client = self.client, None
        if client is not None:
            client.close()


def main(argv: list[str] | None = None) -> None:
    from dynamo.common.backend.run import run

    status = 0
    try:
        run(FastVideoEngine, argv)  # returns after Dynamo's graceful shutdown: drained, cleaned up
    except FastVideoError as e:  # the fleet is unreachable or undescribed: one line, not a traceback
        print(f"fleet.dynamo: error: {e.one_line()}", file=sys.stderr)
        status = 1
    # Leave without interpreter finalization: a gRPC thread still unwinding a call to a dead
    # scheduler would otherwise be torn down mid-C++ frame ("exception not rethrown", SIGABRT).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
