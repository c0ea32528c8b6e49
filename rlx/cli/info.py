"""``rlx info``: the environment summary (:func:`rlx.info`). In: ``--json``. Out: the
summary as text (or JSON) on stdout."""

from __future__ import annotations

import json

import click

from rlx.cli.common import CONTEXT

__all__ = ["command"]


@click.command(
    "info",
    context_settings=CONTEXT,
    short_help="Versions, BLAS, CPU flags, native target, settings.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def command(as_json: bool) -> int:
    """Environment summary: versions, BLAS, CPU flags, native target and why, cache,
    RLX_* settings, threads (rlx.info())."""
    from rlx.info import info

    summary = info()
    click.echo(json.dumps(summary.as_dict(), indent=2) if as_json else str(summary))
    return 0
