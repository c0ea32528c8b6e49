"""ONNX files in the command line. In: a path ending in ``.onnx``. Out: the
:class:`~rlx.cli.target.Target` that ``rlx inspect`` and ``rlx bench`` work on (the
imported graph and its params, symbols in the order the inputs first use them), and the
``rlx run`` command (``run.py`` registers it), which runs an ONNX (or ``.rlx``) file on
inputs read from ``.npy`` files."""

from __future__ import annotations

from pathlib import Path

import click

from rlx.cli.common import CONTEXT, threads_option
from rlx.cli.target import Target
from rlx.errors import InputError

__all__ = ["onnx_target", "command"]


class OnnxTarget(Target):
    """A Target made from an ONNX file (its description names the opset)."""

    opsets: dict[str, int] = {}

    @property
    def description(self) -> str:
        ops = ", ".join(f"{k or 'ai.onnx'} {v}" for k, v in self.opsets.items())
        return f"ONNX file {self.name} (opsets {ops}; {len(self.graph)} nodes)"


def onnx_target(path: Path) -> Target:
    """Import ``path`` with ``rlx.onnx.load`` as a Target."""
    from rlx.frontends.onnx import load

    m = load(path)
    t = OnnxTarget(path.name, m.graph, m.params)
    t.opsets = dict(m.opsets)
    return t


def _parse_inputs(specs: tuple[str, ...]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for s in specs:
        name, sep, file = s.partition("=")
        if not sep or not name or not file:
            raise click.BadParameter(f"{s!r}: expected NAME=FILE.npy", param_hint="--input")
        out[name] = Path(file)
    return out


@click.command(
    "run",
    context_settings=CONTEXT,
    short_help="Run an ONNX (or .rlx) file on inputs from .npy files.",
)
@click.argument("model", type=click.Path(dir_okay=False))
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="NAME=FILE.npy",
    help="A graph input and the .npy file holding it (repeat for each input).",
)
@click.option(
    "--save",
    type=click.Path(file_okay=False),
    default=None,
    help="Write each output to DIR/<output name>.npy.",
)
@threads_option()
def command(model: str, inputs: tuple[str, ...], save: str | None, threads: int | None) -> int:
    """Import MODEL (.onnx, or a .rlx graph file), compile it for the CPU and run it once
    on the given inputs; print each output's name, shape, dtype and first values.

    \b
    Example:
      rlx run model.onnx --input x=x.npy --input mask=mask.npy --save out/
    """
    import numpy as np

    from rlx.cli.target import open_target

    target = open_target(model)
    files = _parse_inputs(inputs)
    need = {n.op.name: n.shape for n in target.graph.input_nodes()}  # type: ignore[attr-defined]
    unknown = sorted(set(files) - set(need))
    if unknown:
        raise InputError(
            f"--input names {unknown} are not inputs of {model}; it takes {sorted(need)}"
        )
    missing = sorted(set(need) - set(files))
    if missing:
        listed = ", ".join(f"{k}: {need[k]}" for k in missing)
        raise InputError(f"missing --input for {listed}")
    feeds = {}
    for name, f in files.items():
        if not f.is_file():
            raise InputError(f"--input {name}={f}: no such file")
        try:
            feeds[name] = np.load(f, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise InputError(f"--input {name}={f}: not a .npy array file ({e})") from None
    compiled = target.compile("f32", threads, {})
    outs = compiled.run(feeds)
    names = _output_names(model, len(outs))
    click.echo(f"== {target.description} ==")
    for name, y in zip(names, outs, strict=True):
        flat = np.asarray(y).reshape(-1)
        head = np.array2string(flat[:6], precision=5, separator=", ")
        more = " ..." if flat.size > 6 else ""
        click.echo(f"{name}: {y.dtype}{list(y.shape)} {head}{more}")
        if save is not None:
            Path(save).mkdir(parents=True, exist_ok=True)
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
            np.save(Path(save) / f"{safe}.npy", y)
    return 0


def _output_names(model: str, n: int) -> list[str]:
    if model.endswith(".onnx"):
        from rlx.frontends.onnx import read_model

        m, _ = read_model(model)
        return [o.name for o in m.graph.output]
    return [f"output{i}" for i in range(n)]
