"""``fastvideo3 deployment-card``: print a fleet's DeploymentCard.

    fastvideo3 deployment-card --target HOST:PORT      # a running fleet (Scheduler.Describe)
    fastvideo3 deployment-card --config fleet.yaml     # a fleet config, before it runs
    fastvideo3 deployment-card --card wan-tiny         # one replica per role serving one card
    fastvideo3 deployment-card --schema                # the card's JSON schema
    ... [--format json|yaml]

The implementation lives in ``fleet.deployment_card`` and is imported lazily.
"""
from __future__ import annotations

import json
import sys

from fastvideo3.errors import FailedPrecondition, InvalidRequest

COMMAND = "deployment-card"


def add_commands(sub) -> None:
    p = sub.add_parser(COMMAND, help="print the DeploymentCard of a running fleet, a fleet config or a card")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--target", help="HOST:PORT of a running fleet's scheduler")
    src.add_argument("--config", help="a fleet config (fleet.yaml)")
    src.add_argument("--card", help="a card name, card file or diffusers directory (one replica per role)")
    src.add_argument("--schema", action="store_true", help="print the DeploymentCard JSON schema")
    p.add_argument("--format", choices=("json", "yaml"), default="json")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for --target")


def run(args) -> int:
    if args.cmd != COMMAND:
        raise SystemExit(f"unknown command {args.cmd}")
    from fleet import deployment_card as dc

    if args.schema:
        data = dc.DeploymentCard.model_json_schema()
    else:
        if args.target:
            card = describe_target(args.target, timeout_s=args.timeout)
        elif args.config:
            card = dc.card_from_fleet_config(args.config)
        elif args.card:
            card = dc.card_for_model(args.card)
        else:
            raise InvalidRequest("name what to describe", field="source", limit="--target, --config, --card or --schema")
        data = card.model_dump(mode="json")
    if args.format == "json":
        print(json.dumps(data, indent=2))
    else:
        import yaml
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    return 0


def describe_target(target: str, *, timeout_s: float = 10.0):
    """The DeploymentCard a running scheduler serves from Describe."""
    from fastvideo3.client import FleetClient
    from fleet.deployment_card import card_from_description

    with FleetClient(target, rpc_timeout_s=timeout_s) as client:
        card = card_from_description(client.describe())
    if card is None:
        raise FailedPrecondition(f"the scheduler at {target} published no DeploymentCard", field="target")
    return card
