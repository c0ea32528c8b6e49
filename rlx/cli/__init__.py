"""The ``rlx`` command (click): one subcommand per module of this package, thin over the API.

In: a command line (``rlx [--debug] <command> ...``, ``python -m rlx <command> ...``, or
``main(["info"])`` in-process). Out: text on stdout and an exit status: 0 on success; 2
for a bad command line (unknown command or option, a bad value such as ``--shape 8by128``
or ``--precision fp8``); 1 when rlx raised an error (a missing model directory, a model
that is not installed, a file that cannot be read). Every error is one line on stderr,
``rlx: error: ...``, with no traceback unless ``--debug`` is given.

Subcommands: ``info``, ``cache info|clear``, ``embed``, ``rerank``, ``generate``, ``serve``,
``inspect``, ``bench``, ``run`` (see each ``rlx <command> --help``). A subcommand is a module ``rlx/cli/<name>.py`` defining a
click command ``command``; to add one, write the module and list its name in
:data:`COMMANDS`. Modules import the heavy parts of rlx inside their functions, so
``rlx --help`` stays fast.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Sequence

import click

from rlx.cli.common import CONTEXT
from rlx.errors import RlxError

__all__ = ["COMMANDS", "cli", "main"]

#: Subcommand modules, in the order ``rlx --help`` lists them.
COMMANDS: tuple[str, ...] = (
    "embed",
    "rerank",
    "generate",
    "convert",
    "serve",
    "inspect",
    "bench",
    "run",
    "info",
    "cache",
)


# click >= 8.2 raises this for a group called without its subcommand
_NO_ARGS: type[BaseException] | tuple[()] = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _State:
    """What the group callback learned, for :func:`main`'s error handler."""

    debug = False


class _Group(click.Group):
    """Loads subcommand modules on first use (``rlx info`` does not import ``bench``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        return importlib.import_module(f"rlx.cli.{name}").command


def _version() -> str:
    import rlx

    return rlx.__version__


@click.group(cls=_Group, context_settings=CONTEXT, invoke_without_command=True)
@click.option("--debug", is_flag=True, help="Show the full traceback of an error.")
@click.option("--version", is_flag=True, help="Print the rlx version and exit.")
@click.pass_context
def cli(ctx: click.Context, debug: bool, version: bool) -> None:
    """rlx: a machine-learning compiler and runtime for the CPU.

    Embed text with a Hugging Face encoder, inspect a model's compiled graph, benchmark
    it, and look at the environment and the native kernel cache.
    """
    _State.debug = debug
    if version:
        click.echo(f"rlx {_version()}")
        ctx.exit(0)
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help(), err=True)
        ctx.exit(2)


def _usage_hint(e: click.UsageError) -> str:
    ctx = e.ctx
    if ctx is None or ctx.command is cli:
        return " (see 'rlx --help')"
    return f" (see '{ctx.command_path} --help')"


def _fail(message: str) -> None:
    lines = message.strip().splitlines() or ["(no message)"]
    click.echo(f"rlx: error: {lines[0]}", err=True)
    for line in lines[1:]:  # an rlx message that carries detail (a gcc log) keeps it
        click.echo(f"  {line}", err=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    _State.debug = False
    try:
        rv = cli.main(args=args, prog_name="rlx", standalone_mode=False)
    except click.UsageError as e:
        if isinstance(e, _NO_ARGS) and e.ctx is not None:  # "rlx cache": its help, exit 2
            click.echo(e.ctx.get_help(), err=True)
            return 2
        if _State.debug:
            traceback.print_exc()
        _fail(e.format_message() + _usage_hint(e))
        return 2
    except click.ClickException as e:  # BadParameter outside parsing, FileError
        if _State.debug:
            traceback.print_exc()
        _fail(e.format_message())
        return e.exit_code
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except click.Abort:
        click.echo("rlx: aborted", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("rlx: interrupted", err=True)
        return 130
    except (RlxError, OSError) as e:
        if _State.debug:
            traceback.print_exc()
        _fail(str(e) if isinstance(e, RlxError) else f"{type(e).__name__}: {e}")
        return 1
    except Exception as e:  # a bug in rlx: still one line, the traceback on --debug
        if _State.debug:
            traceback.print_exc()
        _fail(
            f"unexpected {type(e).__name__}: {e} (rerun with 'rlx --debug ...' for the traceback)"
        )
        return 1
    return int(rv or 0)
