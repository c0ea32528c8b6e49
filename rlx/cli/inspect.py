"""``rlx inspect MODEL|FILE.rlx``: what rlx makes of a model. In: a model directory or known
name, or a graph file; a shape (``--shape 8x128``), a precision and a thread count. Out on
stdout: the MIR graph as built (a jaxpr-like listing, one line per node), its
matrix-product FLOPs at the shape, then the compile report of one run at that shape: the
passes, the fusion report, the memory plan (arena size against the liveness lower bound)
and the kernel schedule. INT8 adds the quantization accuracy report. ``--html FILE`` also
writes the compiled graph as one self-contained HTML page (``compiled.to_html``)."""

from __future__ import annotations

import click

from rlx.cli.common import CONTEXT, ShapeType, precision_option, status, threads_option

__all__ = ["command"]


@click.command(
    "inspect",
    context_settings=CONTEXT,
    short_help="MIR graph, FLOPs, fusion report and memory plan.",
)
@click.argument("model")
@click.option(
    "--shape",
    type=ShapeType(),
    metavar="BxS",
    default=None,
    help="Bind the symbolic dims, e.g. 8x128 (batch x seq) [default: 1x128 for a model, "
    "the smallest shape for a graph file].",
)
@precision_option()
@threads_option()
@click.option("--graph/--no-graph", "show_graph", default=True, help="Print the MIR listing.")
@click.option(
    "--optimized",
    is_flag=True,
    help="Also print the optimized graph with each node's arena slot.",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    metavar="FILE.html",
    help="Also write the compiled graph as one self-contained HTML page (fusion groups, "
    "precision, memory plan timeline).",
)
def command(
    model: str,
    shape: tuple[int, ...] | None,
    precision: str,
    threads: int | None,
    show_graph: bool,
    optimized: bool,
    html_path: str | None = None,
) -> int:
    """Show the MIR graph, the fusion report and the memory plan of MODEL (a model
    directory, a known name such as all-MiniLM-L6-v2, or a FILE.rlx saved by rlx.save).

    \b
    Examples:
      rlx inspect all-MiniLM-L6-v2 --shape 8x128
      rlx inspect model.rlx --shape 4x64 --precision bf16 --no-graph
      rlx inspect all-MiniLM-L6-v2 --no-graph --html minilm.html
    """
    from rlx.cli.flops import matmul_flops
    from rlx.cli.target import open_target

    target = open_target(model)
    if shape is None and target.model is not None:
        shape = (1, 128)
    bindings = target.bind(shape) if shape is not None else None
    click.echo(f"== {target.description} ==")
    if show_graph:
        click.echo(target.graph.inspect())
    if bindings is not None:
        flops = matmul_flops(target.graph, bindings)
        click.echo(f"\n== matrix-product FLOPs at {_fmt(bindings)} ==\n{flops}")
    status(f"compiling at {precision} ...")
    compiled = target.compile(precision, threads, bindings or {})
    if bindings is not None:
        compiled.run(target.inputs(bindings))
    report = compiled.report()  # of the run at the shape, or of the smallest shape
    plans = compiled.shape_plans
    where = _fmt(bindings if bindings is not None else (plans[-1] if plans else {}))
    if bindings is None:
        where = f"the smallest shape {where}"
    click.echo(f"\n== compile report ({precision}, {compiled.num_threads} thread(s), {where}) ==")
    if target.quant_note:
        click.echo(target.quant_note)
    click.echo(str(report))
    if optimized:
        click.echo(f"\n== optimized graph ({len(compiled.graph)} nodes) ==")
        click.echo(compiled.inspect())
    if precision == "int8":
        click.echo("\n== int8 accuracy ==")
        click.echo(str(target.quantized(bindings or {}).report))
    if html_path is not None:
        compiled.to_html(html_path)
        click.echo(f"\nwrote {html_path}")
    return 0


def _fmt(bindings: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in bindings.items()) or "(static shapes)"
