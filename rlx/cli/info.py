"""``rlx info``: the environment summary (:func:`rlx.info`). In: ``--json``. Out: the
summary as text (or JSON) on stdout."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: Any) -> None:
    """Add the ``info`` subcommand to ``sub`` (argparse subparsers)."""
    p = sub.add_parser(
        "info",
        help="environment summary: versions, BLAS, CPU flags, native target, cache, settings",
        description="Print what rlx runs on and which paths it takes (rlx.info()).",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the summary; returns 0."""
    from rlx.info import info

    summary = info()
    print(json.dumps(summary.as_dict(), indent=2) if args.json else summary)
    return 0
