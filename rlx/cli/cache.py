"""``rlx cache info|clear``: the native kernel cache (``native.cache_info()`` /
``native.clear_cache()``). In: the action. Out: the cache's directory, library count,
size, bound and target (``info``), or how many libraries were removed (``clear``)."""

from __future__ import annotations

import json

import click

from rlx.cli.common import CONTEXT

__all__ = ["command"]


@click.group("cache", context_settings=CONTEXT, invoke_without_command=True)
@click.pass_context
def command(ctx: click.Context) -> None:
    """The native kernel cache: info, clear."""
    if ctx.invoked_subcommand is None:  # an action is required: the help, exit 2
        click.echo(ctx.get_help(), err=True)
        ctx.exit(2)


@command.command("info", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def info(as_json: bool) -> int:
    """Directory, library count, size, size bound, target."""
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
    if as_json:
        click.echo(json.dumps(fields, indent=2))
    else:
        click.echo(f"native cache {ci.dir}")
        click.echo(f"  {ci.libraries} libraries, {ci.bytes} bytes (pruned above {ci.max_bytes})")
        click.echo(f"  target {ci.target}: {ci.description}")
    return 0


@command.command("clear", context_settings=CONTEXT)
def clear() -> int:
    """Delete every cached library (rebuilt when needed)."""
    from rlx.backends.cpu import native

    root = native.cache_info().dir
    n = native.clear_cache()
    click.echo(f"removed {n} libraries from {root}")
    return 0
