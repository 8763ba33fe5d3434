"""The argument types and parser class every ``fastvideo3`` subcommand module shares (cli.py and
the cli_*.py modules it registers import them from here, so none of them imports another's)."""
from __future__ import annotations

import argparse

EXIT_BAD_INPUT = 2
#: the help of every ``--card`` flag (the CLI's and the services', services/common/args.py)
CARD_HELP = "a card name, card file or diffusers-format directory"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, status 2
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = text.lower().split("x")
        return int(w), int(h)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must be WIDTHxHEIGHT, e.g. 832x480 (got {text!r})") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
