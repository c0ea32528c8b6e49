"""The ``rlx`` command: one subcommand per module of this package, thin over the API.

In: a command line (``rlx <command> ...``, ``python -m rlx <command> ...``, or
``main(["info"])`` in-process). Out: text on stdout and an exit status (0 on success, 1
when rlx raised an error, which is printed to stderr as ``rlx: error: ...``; 2 for a bad
command line, as argparse does).

A subcommand is a module ``rlx/cli/<name>.py`` with ``register(subparsers)``: it adds its
parser and sets ``func(args) -> int`` as the parser's default. To add one (``inspect``,
``bench``, ``run``, ``embed``, ...), write the module and list its name in
:data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from rlx.errors import RlxError

__all__ = ["COMMANDS", "build_parser", "main"]

#: Subcommand modules, in the order ``rlx --help`` lists them.
COMMANDS: tuple[str, ...] = ("info", "cache")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand of :data:`COMMANDS` registered."""
    import rlx

    parser = argparse.ArgumentParser(
        prog="rlx", description="rlx: a machine-learning compiler and runtime for the CPU."
    )
    parser.add_argument("--version", action="version", version=f"rlx {rlx.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name in COMMANDS:
        importlib.import_module(f"rlx.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr if args.command is None else sys.stdout)
        return 2
    try:
        return int(args.func(args))
    except RlxError as e:
        print(f"rlx: error: {e}", file=sys.stderr)
        return 1
