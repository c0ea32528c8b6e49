"""Pieces the subcommands share. In: option strings (``8x128,1x16``, ``1,2``), a model
name or directory. Out: parsed values (a click ``BadParameter`` naming the option and
what was wrong otherwise), a loaded :class:`~rlx.models.SentenceEncoder`, a progress
wrapper that works without tqdm, and status lines on stderr."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

__all__ = [
    "CONTEXT",
    "PRECISIONS",
    "precision_option",
    "threads_option",
    "parse_shape",
    "ShapeType",
    "ShapeList",
    "IntList",
    "status",
    "progress",
    "load_encoder",
    "model_dir",
]

T = TypeVar("T")

#: click settings of every rlx command: -h as well as --help, 100-column help.
CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

#: ``--precision`` choices (the SentenceEncoder's).
PRECISIONS = ("f32", "bf16", "int8")


def precision_option(**kw: Any) -> Any:
    """``--precision f32|bf16|int8`` (default f32)."""
    kw.setdefault("help", "f32, bf16 (mixed precision) or int8 (quantized, calibrated on text).")
    return click.option(
        "--precision",
        type=click.Choice(PRECISIONS),
        default="f32",
        show_default=True,
        **kw,
    )


def threads_option() -> Any:
    """``--threads N``: threads of the compiled graph (default: rlx's, RLX_NUM_THREADS)."""
    return click.option(
        "--threads",
        type=click.IntRange(min=1),
        default=None,
        help="Threads of the compiled graph (default: RLX_NUM_THREADS or the CPUs).",
    )


def parse_shape(text: str, what: str = "shape") -> tuple[int, ...]:
    """``"8x128"`` -> ``(8, 128)``: positive integers joined by ``x``, one per symbolic
    dim of the graph (batch x sequence length for a model); BadParameter naming ``what``
    and the text otherwise."""
    parts = text.strip().lower().split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a shape such as 8x128 (BATCHxSEQ: positive integers joined by x)",
            param_hint=what,
        ) from None
    if any(d < 1 for d in dims):
        raise click.BadParameter(f"{text!r}: every dim must be >= 1", param_hint=what)
    return dims


class ShapeType(click.ParamType):
    """One shape such as ``8x128``."""

    name = "BxS"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        try:
            return parse_shape(str(value))
        except click.BadParameter as e:
            self.fail(e.message, param, ctx)


class ShapeList(click.ParamType):
    """A comma-separated list of ``BATCHxSEQ`` shapes."""

    name = "BxS[,BxS...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[tuple[int, ...]]:
        if isinstance(value, list):
            return value
        items = [v for v in str(value).split(",") if v.strip()]
        if not items:
            self.fail(f"{value!r} names no shape (e.g. 1x16,8x128)", param, ctx)
        try:
            return [parse_shape(v) for v in items]
        except click.BadParameter as e:
            self.fail(e.message, param, ctx)


class IntList(click.ParamType):
    """A comma-separated list of integers >= 1."""

    name = "N[,N...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[int]:
        if isinstance(value, list):
            return value
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        try:
            out = [int(v) for v in items]
        except ValueError:
            out = []
        if not out or any(n < 1 for n in out):
            self.fail(f"{value!r} is not a list of integers >= 1 (e.g. 1,2)", param, ctx)
        return out


def status(message: str) -> None:
    """A progress line on stderr (stdout stays the command's result)."""
    click.echo(message, err=True)


def progress(items: Iterable[T], total: int, desc: str) -> Iterator[T]:
    """``items`` with a tqdm bar on stderr when tqdm is installed and stderr is a
    terminal (the ``progress`` extra); plain ``items`` otherwise."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        yield from items
        return
    yield from tqdm(items, total=total, desc=desc, disable=None, leave=False)


def model_dir(model: str) -> Path:
    """The model directory for a path or a known name (:func:`rlx.models.known.resolve`)."""
    from rlx.models.known import resolve

    return resolve(model)


def load_encoder(model: str, precision: str, threads: int | None) -> Any:
    """A SentenceEncoder for ``model`` (directory or known name), with a status line
    (INT8 calibration takes a while)."""
    from rlx.models import SentenceEncoder

    path = model_dir(model)
    what = "compiling" if precision != "int8" else "quantizing (calibrating int8 on text)"
    status(f"loading {path} and {what} ...")
    t0 = time.perf_counter()
    enc = SentenceEncoder(path, precision=precision, num_threads=threads)
    status(f"ready in {time.perf_counter() - t0:.1f} s")
    return enc
