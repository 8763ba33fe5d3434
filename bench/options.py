"""Command-line helpers the benchmarks in bench/ share. Imported as the sibling module ``options``
(bench/ is on sys.path when a bench script runs)."""
from __future__ import annotations

import argparse


def add_defaults(parser: argparse.ArgumentParser, **defaults: int | float | str) -> None:
    """One ``--name`` option per keyword (underscores become dashes), in order, parsed as the type of
    its default (int, float or str)."""
    for name, default in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
