"""``fastvideo3 slo report SPANS.jsonl [SPANS.jsonl ...] [--format table|json]``.

Reads the JSON-lines span files that services write with ``--trace-file`` and prints latency
percentiles per phase and per SLO class (see :mod:`fastvideo3.telemetry.slo`). Bad input (a
missing file, a malformed line, no spans) is an InvalidRequest naming the file and line: exit
status 2 through the main CLI. Registered by the fleet commands (``cli_fleet``); also runs
alone as ``python -m fastvideo3.cli_slo report ...``.
"""
from __future__ import annotations

import argparse
import json
import sys

from fastvideo3.errors import FastVideoError


def add_commands(sub) -> None:
    """Add ``slo report`` to the CLI's subparsers."""
    slo = sub.add_parser("slo", help="service-level reports from exported spans")
    slo_sub = slo.add_subparsers(dest="slo_cmd", required=True, parser_class=type(slo))
    rep = slo_sub.add_parser("report", help="p50/p95/p99 per phase and SLO class from span files")
    rep.add_argument("spans", nargs="+", help="JSON-lines span files (written with --trace-file)")
    rep.add_argument("--format", choices=("table", "json"), default="table")


def run(args) -> int:
    """Run a parsed ``slo`` command. Raises FastVideoError on bad input (the CLI maps it)."""
    from fastvideo3.telemetry.slo import report_from_files

    if args.slo_cmd != "report":  # pragma: no cover - argparse allows nothing else
        raise SystemExit(f"unknown slo command {args.slo_cmd}")
    report = report_from_files(args.spans)
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.table())
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -m fastvideo3.cli_slo report FILE``."""
    parser = argparse.ArgumentParser(prog="fastvideo3")
    add_commands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    try:
        return run(args)
    except FastVideoError as e:
        print(f"fastvideo3: error: {e.one_line()}", file=sys.stderr)
        return 2 if e.code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND") else 1


if __name__ == "__main__":
    sys.exit(main())
