"""``rlx cache info|clear``: the native kernel cache (``native.cache_info()`` /
``native.clear_cache()``). In: the action. Out: the cache's directory, library count,
size, bound and target (``info``), or how many libraries were removed (``clear``)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: Any) -> None:
    """Add the ``cache`` subcommand (with ``info`` and ``clear``) to ``sub``."""
    p = sub.add_parser(
        "cache",
        help="the native kernel cache: info, clear",
        description="Inspect or empty the cache of compiled native kernels.",
    )
    actions = p.add_subparsers(dest="action", metavar="<action>", required=True)
    i = actions.add_parser("info", help="directory, library count, size, size bound, target")
    i.add_argument("--json", action="store_true", help="print as JSON")
    i.set_defaults(func=info)
    c = actions.add_parser("clear", help="delete every cached library (rebuilt when needed)")
    c.set_defaults(func=clear)


def info(args: argparse.Namespace) -> int:
    """Print the cache summary; returns 0."""
    from rlx.backends.cpu import native

    ci = native.cache_info()
    fields = {
        "dir": str(ci.dir),
        "libraries": ci.libraries,
        "bytes": ci.bytes,
        "max_bytes": ci.max_bytes,
        "target": ci.target,
        "description": ci.description,
    }
    if args.json:
        print(json.dumps(fields, indent=2))
    else:
        print(f"native cache {ci.dir}")
        print(f"  {ci.libraries} libraries, {ci.bytes} bytes (pruned above {ci.max_bytes})")
        print(f"  target {ci.target}: {ci.description}")
    return 0


def clear(args: argparse.Namespace) -> int:
    """Empty the cache; prints and returns 0."""
    from rlx.backends.cpu import native

    root = native.cache_info().dir
    n = native.clear_cache()
    print(f"removed {n} libraries from {root}")
    return 0
