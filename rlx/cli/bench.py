"""``rlx bench MODEL --shapes 1x16,8x128 --threads 1,2``: how fast rlx runs a model here.
In: a model directory or known name (or a ``.rlx`` graph file), shapes (batch x seq),
thread counts, precisions, repeats. Out: one row per (precision, threads, shape): the
median and min run time in ms over ``--repeat`` timed runs (after ``--warmup`` untimed
ones), sentences/s (batch / median), GFLOP/s (the matrix-product FLOPs of the graph at
the shape, :mod:`rlx.cli.flops`, over the median) and that as % of the machine's f32 FMA
peak for the thread count (:mod:`rlx.cli.peak`: measured with an FMA loop, the estimate
printed beside it). bf16 and int8 rows use the same FLOP count and the same f32 peak,
so they can pass 100%.

The inputs are synthetic (random token ids, no padding): the work of a dense encoder
does not depend on the values. One process, runs back to back: for a comparison with
other runtimes use ``benchmarks/`` (each engine in its own process).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass

import click

from rlx.cli.common import CONTEXT, PRECISIONS, IntList, ShapeList, progress, status

__all__ = ["command", "Row", "time_runs"]


@dataclass(frozen=True)
class Row:
    """One measured configuration."""

    precision: str
    threads: int
    shape: str
    batch: int
    gflop: float
    median_ms: float
    min_ms: float
    per_second: float
    gflops: float
    peak_pct: float


class PrecisionList(click.ParamType):
    """A comma-separated list of precisions."""

    name = "P[,P...]"

    def convert(self, value: object, param: object, ctx: object) -> list[str]:
        if isinstance(value, list):
            return value
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        bad = [v for v in items if v not in PRECISIONS]
        if not items or bad:
            self.fail(
                f"{value!r}: {bad or 'empty'}; choose from {', '.join(PRECISIONS)}",
                param,  # type: ignore[arg-type]
                ctx,  # type: ignore[arg-type]
            )
        return items


def time_runs(fn: object, repeat: int, warmup: int) -> list[float]:
    """Seconds of ``repeat`` calls of ``fn()`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()  # type: ignore[operator]
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return out


@click.command(
    "bench",
    context_settings=CONTEXT,
    short_help="Time a model: ms, sentences/s, GFLOP/s, % of the FMA peak.",
)
@click.argument("model")
@click.option(
    "--shapes",
    type=ShapeList(),
    metavar="BxS[,BxS...]",
    default="1x16,8x128",
    show_default=True,
    help="Shapes to run, batch x seq, comma-separated.",
)
@click.option(
    "--threads",
    type=IntList(),
    default="1",
    show_default=True,
    help="Thread counts, comma-separated (one compile each).",
)
@click.option(
    "--precision",
    type=PrecisionList(),
    default="f32",
    show_default=True,
    help="Precisions, comma-separated: f32, bf16, int8.",
)
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Timed runs per row (the median is reported).",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Untimed runs before them.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per row instead.")
def command(
    model: str,
    shapes: list[tuple[int, ...]],
    threads: list[int],
    precision: list[str],
    repeat: int,
    warmup: int,
    as_json: bool,
) -> int:
    """Time MODEL (a model directory, a known name such as all-MiniLM-L6-v2, or a
    FILE.rlx) at each shape, thread count and precision.

    \b
    Example:
      rlx bench all-MiniLM-L6-v2 --shapes 1x16,8x128 --threads 1,2 --precision f32,int8
    """
    from rlx import config
    from rlx.cli.flops import matmul_flops
    from rlx.cli.peak import estimated_peak, fma_peak
    from rlx.cli.target import open_target

    target = open_target(model)
    binds = [target.bind(s) for s in shapes]  # every shape checked before any compile
    cap = config.available_cpus()
    used = sorted({min(t, cap) for t in threads})
    if len(used) < len(set(threads)) or max(threads) > cap:
        status(f"note: this process may use {cap} CPU(s); thread counts above are clamped")
    status(f"measuring the f32 FMA peak on {', '.join(map(str, used))} thread(s) ...")
    peaks = {t: fma_peak(t) for t in used}
    flops = [matmul_flops(target.graph, b).total for b in binds]
    unit = "sent/s" if target.model is not None else "batch-rows/s"
    rows: list[Row] = []
    configs = [(p, t, i) for p in precision for t in used for i in range(len(binds))]
    compiled = None
    key = None
    for p, t, i in progress(configs, len(configs), "bench"):
        if key != (p, t):
            status(f"compiling {p} on {t} thread(s) ...")
            compiled, key = target.compile(p, t, binds[i]), (p, t)
        inputs = target.inputs(binds[i])
        secs = time_runs(lambda c=compiled, x=inputs: c.run(x), repeat, warmup)
        med, best = statistics.median(secs), min(secs)
        batch = shapes[i][0]
        g = flops[i] / med / 1e9
        rows.append(
            Row(
                p,
                t,
                "x".join(map(str, shapes[i])),
                batch,
                flops[i] / 1e9,
                med * 1e3,
                best * 1e3,
                batch / med,
                g,
                100.0 * g / peaks[t].gflops,
            )
        )
    if as_json:
        for r in rows:
            click.echo(json.dumps(asdict(r)))
        return 0
    click.echo(f"rlx bench: {target.description}")
    if target.quant_note and "int8" in precision:
        click.echo(target.quant_note)
    for t in used:
        est = estimated_peak(t)
        line = f"f32 FMA peak, {t} thread(s): {peaks[t].gflops:.1f} GFLOP/s ({peaks[t].how})"
        if est is not None and peaks[t].measured:
            line += f"; paper {est.gflops:.1f} GFLOP/s ({est.how})"
        click.echo(line)
    click.echo(
        f"median of {repeat} runs after {warmup} warm-up; GFLOP = matrix products "
        f"(2*M*N*K per matmul, 4*B*H*Sq*Skv*D per attention)"
    )
    head = (
        f"{'precision':<9} {'threads':>7} {'shape':>9} {'GFLOP':>7} {'ms':>9} {'min ms':>9} "
        f"{unit:>10} {'GFLOP/s':>8} {'% peak':>7}"
    )
    click.echo(head)
    for r in rows:
        click.echo(
            f"{r.precision:<9} {r.threads:>7} {r.shape:>9} {r.gflop:>7.3f} {r.median_ms:>9.2f} "
            f"{r.min_ms:>9.2f} {r.per_second:>10.1f} {r.gflops:>8.1f} {r.peak_pct:>6.1f}%"
        )
    return 0
