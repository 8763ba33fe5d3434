"""Fleet-side commands of the ``fastvideo3`` CLI (serve, client, deployment-card, slo).

They are registered here so the core CLI stays small; each imports its implementation lazily.
"""
from __future__ import annotations


def add_commands(sub) -> None:
    """Register fleet commands on the CLI's subparsers (filled in as the fleet lands)."""


def run(args) -> int:
    raise SystemExit(f"unknown command {args.cmd}")
