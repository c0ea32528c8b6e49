"""``rlx bench MODEL --shapes 1x16,8x128 --threads 1,2``: how fast rlx runs a model here,
per native target. In: a model directory or known name (or a ``.rlx`` graph file),
shapes (batch x seq), thread counts, precisions, the targets (``--isa all|avx512|avx2|
portable``: ``all``, the default, is every target this CPU runs) and the AMX setting
(``--amx on|off|both``; on a CPU without AMX every row is AMX off and the output says
"no AMX on this CPU" once), repeats.

Each (target, AMX) configuration runs in its own process (``RLX_ISA``, ``RLX_AMX`` set;
the child is ``rlx bench ... --json``), unless the one asked for is the one this process
runs. In that process: the peak of each path the rows multiply on is measured
(:mod:`rlx.cli.peak`: f32 -> FMA; int8 -> vpdpbusd on AVX-512 VNNI, vpmaddwd on AVX2,
vpmaddubsw + vpmaddwd for 7-bit weights; bf16 -> vdpbf16ps on AVX512_BF16, else FMA)
and printed as rows of their own; then one row per (precision, threads, shape): the
median and min run time in ms over ``--repeat`` timed runs (after ``--warmup`` untimed
ones), sentences/s (batch / median), GFLOP/s (the matrix-product FLOPs of the graph at
the shape, :mod:`rlx.cli.flops`, over the median) and that as % of the path's peak.
``--json`` prints one object per note (``"kind": "note"``, ``"text"``: "no AMX on this
CPU"), per peak (``"kind": "peak"``, :class:`PeakRow`) and per row (``"kind": "run"``,
:class:`Row`).

The inputs are synthetic (random token ids, no padding): the work of a dense encoder
does not depend on the values. Runs back to back in each process: for a comparison with
other runtimes use ``benchmarks/`` (each engine in its own process).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from rlx.backends.cpu.native.cpu import Target
from rlx.cli.common import CONTEXT, PRECISIONS, IntList, ShapeList, progress, status
from rlx.errors import CompileError, ConfigError

__all__ = ["command", "Row", "PeakRow", "Config", "configs", "measure", "time_runs"]


@dataclass(frozen=True)
class Row:
    """One measured configuration: the target (``isa``, ``amx``: AMX tiles allowed and
    present), the run's figures and ``peak_pct``, its GFLOP/s as % of ``peak`` (the
    :class:`~rlx.cli.peak.PeakPath` it multiplies on, ``peak_gops`` measured in the same
    process; None when there is no probe for the path)."""

    isa: str
    amx: bool
    precision: str
    threads: int
    shape: str
    batch: int
    gflop: float
    median_ms: float
    min_ms: float
    per_second: float
    gflops: float
    peak: str | None
    peak_gops: float | None
    peak_pct: float | None


@dataclass(frozen=True)
class PeakRow:
    """A peak measured for the rows of one target: ``path`` (a PeakPath value) on
    ``threads`` threads, ``gops`` 10^9 ops/s (NaN: unknown), ``how`` it was obtained."""

    isa: str
    amx: bool
    threads: int
    path: str
    gops: float
    measured: bool
    how: str


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


ISA_CHOICES = ("all", "avx512", "avx2", "portable", "neon", "dotprod", "i8mm")
AMX_CHOICES = ("on", "off", "both")
NO_AMX = "no AMX on this CPU"


@dataclass(frozen=True)
class Config:
    """One process's setting: the native target and whether AMX tiles are allowed."""

    target: Target
    amx: bool

    @property
    def env(self) -> dict[str, str]:
        """The environment a child process runs this configuration under."""
        return {"RLX_ISA": self.target.value, "RLX_AMX": "1" if self.amx else "0"}


def configs(isa: str, amx: str, flags: frozenset[str] | None = None) -> list[Config]:
    """The (target, AMX) configurations ``--isa`` and ``--amx`` ask for on a CPU with
    ``flags`` (default: this CPU): ``all`` = every target it runs, best first; AMX only
    on the AVX512 target of a CPU that has it (elsewhere every row is AMX off).
    ConfigError naming the missing CPU features for a target this CPU cannot run."""
    from rlx.backends.cpu.native import cpu

    f = cpu.cpu_flags() if flags is None else flags
    usable = cpu.runnable_targets(f)
    if isa == "all":
        targets = usable[::-1]
    else:
        t = Target(isa)
        if t not in usable:
            missing = sorted(cpu.target_spec(t, f).requires - f)
            raise ConfigError(
                f"--isa {isa}: this CPU cannot run the {t.name} target (missing "
                f"{', '.join(missing) or 'an x86-64 CPU'}); usable: "
                f"{', '.join(u.value for u in usable)} (or all)"
            )
        targets = [t]
    amx_on = cpu.has_amx(f) and amx != "off"
    amx_off = not cpu.has_amx(f) or amx != "on"
    out = []
    for t in targets:
        if t is Target.AVX512 and amx_on:
            out.append(Config(t, True))
        if amx_off or t is not Target.AVX512:
            out.append(Config(t, False))
    return out


def current_config() -> Config:
    """The configuration this process runs (``RLX_ISA``, ``RLX_AMX`` and the CPU)."""
    from rlx.backends.cpu.native import cpu

    return Config(cpu.selected_target(), cpu.amx_enabled())


@click.command(
    "bench",
    context_settings=CONTEXT,
    short_help="Time a model per ISA: ms, GFLOP/s, % of the peak of each path.",
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
    "--isa",
    type=click.Choice(ISA_CHOICES),
    default="all",
    show_default=True,
    help="Native targets to measure, each in its own process (RLX_ISA): all = every "
    "target this CPU runs.",
)
@click.option(
    "--amx",
    type=click.Choice(AMX_CHOICES),
    default="both",
    show_default=True,
    help="AMX tiles on, off (RLX_AMX=0) or both rows, on a CPU that has them.",
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
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object per peak and per row instead."
)
def command(
    model: str,
    shapes: list[tuple[int, ...]],
    threads: list[int],
    precision: list[str],
    isa: str,
    amx: str,
    repeat: int,
    warmup: int,
    as_json: bool,
) -> int:
    """Time MODEL (a model directory, a known name such as all-MiniLM-L6-v2, or a
    FILE.rlx) at each shape, thread count and precision, on each native target (--isa)
    and AMX setting (--amx), each in its own process; every row also gives its % of the
    peak of the instruction its precision multiplies with on that target, measured in
    the same process.

    \b
    Example:
      rlx bench all-MiniLM-L6-v2 --shapes 1x16,8x128 --threads 1,2 --precision f32,int8
      rlx bench all-MiniLM-L6-v2 --isa avx2 --precision int8 --json
    """
    from rlx import config
    from rlx.backends.cpu.native import cpu
    from rlx.cli.target import open_target

    todo = configs(isa, amx)
    target = open_target(model)
    binds = [target.bind(s) for s in shapes]  # every shape checked before any compile
    cap = config.available_cpus()
    used = sorted({min(t, cap) for t in threads})
    if len(used) < len(set(threads)) or max(threads) > cap:
        status(f"note: this process may use {cap} CPU(s); thread counts above are clamped")
    notes = [] if cpu.has_amx() else [NO_AMX]
    if todo == [current_config()]:
        peaks, rows = measure(target, shapes, binds, used, precision, repeat, warmup)
    else:
        peaks, rows = [], []
        for c in todo:
            p, r = _child(c, model, shapes, used, precision, repeat, warmup)
            peaks += p
            rows += r
    if as_json:
        for n in notes:
            click.echo(json.dumps({"kind": "note", "text": n}))
        for pk in peaks:
            click.echo(json.dumps({"kind": "peak", **_no_nan(asdict(pk))}))
        for row in rows:
            click.echo(json.dumps({"kind": "run", **_no_nan(asdict(row))}))
        return 0
    click.echo(f"rlx bench: {target.description}")
    for n in notes:
        click.echo(n)
    if target.quant_note and "int8" in precision:
        click.echo(target.quant_note)
    _table(peaks, rows, repeat, warmup, "sent/s" if target.model is not None else "batch-rows/s")
    return 0


def measure(
    target: Any,
    shapes: list[tuple[int, ...]],
    binds: list[dict[str, int]],
    used: list[int],
    precision: list[str],
    repeat: int,
    warmup: int,
) -> tuple[list[PeakRow], list[Row]]:
    """Time ``target`` (an ``open_target`` result) in this process at each precision,
    thread count and shape, and measure the peak of each path the rows ran on."""
    from rlx.backends.cpu.native import cpu
    from rlx.cli.flops import matmul_flops
    from rlx.cli.peak import PeakPath, estimated_peak, path_for, path_peak

    conf = current_config()
    spec = cpu.target_spec(conf.target)
    isa, amx = conf.target.value, conf.amx
    flops = [matmul_flops(target.graph, b).total for b in binds]
    rows: list[Row] = []
    runs = [(p, t, i) for p in precision for t in used for i in range(len(binds))]
    compiled, key = None, None
    for p, t, i in progress(runs, len(runs), f"bench {isa}"):
        if key != (p, t):
            status(
                f"compiling {p} on {t} thread(s) ({spec.label}, AMX {'on' if amx else 'off'}) ..."
            )
            compiled, key = target.compile(p, t, binds[i]), (p, t)
        inputs = target.inputs(binds[i])
        secs = time_runs(lambda c=compiled, x=inputs: c.run(x), repeat, warmup)
        med, best = statistics.median(secs), min(secs)
        seven = p == "int8" and getattr(target.quantized(binds[i]), "weight_bits", 8) == 7
        path = path_for(p, spec, seven)
        peak = None if path is None else path_peak(path, t)
        g = flops[i] / med / 1e9
        ok = peak is not None and peak.gflops == peak.gflops
        rows.append(
            Row(
                isa, amx, p, t, "x".join(map(str, shapes[i])), shapes[i][0], flops[i] / 1e9,
                med * 1e3, best * 1e3, shapes[i][0] / med, g,
                None if path is None else path.value,
                peak.gflops if ok else None,  # type: ignore[union-attr]
                100.0 * g / peak.gflops if ok else None,  # type: ignore[union-attr]
            )
        )  # fmt: skip
    peaks = []
    for name in dict.fromkeys(r.peak for r in rows if r.peak is not None):
        for t in used:
            pk = path_peak(PeakPath(name), t)
            how = pk.how
            est = estimated_peak(t) if name == PeakPath.FMA.value else None
            if est is not None and pk.measured:
                how += f"; paper {est.gflops:.1f} GFLOP/s ({est.how})"
            peaks.append(PeakRow(isa, amx, t, name, pk.gflops, pk.measured, how))
    return peaks, rows


def _child(
    conf: Config,
    model: str,
    shapes: list[tuple[int, ...]],
    used: list[int],
    precision: list[str],
    repeat: int,
    warmup: int,
) -> tuple[list[PeakRow], list[Row]]:
    """Run one configuration in a child process (``rlx bench ... --json`` under
    ``conf.env``); its progress goes to this stderr, its rows come back."""
    import rlx

    status(f"{conf.target.value}, AMX {'on' if conf.amx else 'off'}: own process ...")
    args = [
        "bench", model, "--shapes", ",".join("x".join(map(str, s)) for s in shapes),
        "--threads", ",".join(map(str, used)), "--precision", ",".join(precision),
        "--isa", conf.target.value, "--amx", "on" if conf.amx else "off",
        "--repeat", str(repeat), "--warmup", str(warmup), "--json",
    ]  # fmt: skip
    root = str(Path(rlx.__file__).resolve().parents[1])  # this rlx, not another install
    env = {**os.environ, **conf.env}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    code = "import sys; from rlx.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, text=True
    )
    if done.returncode != 0:
        raise CompileError(
            f"rlx bench: the {conf.target.value} run (RLX_ISA={conf.env['RLX_ISA']} "
            f"RLX_AMX={conf.env['RLX_AMX']}) failed with exit status {done.returncode}; "
            "its messages are above"
        )
    peaks, rows = [], []
    for line in done.stdout.splitlines():
        d = json.loads(line)
        kind = d.pop("kind")
        if kind == "peak":
            d["gops"] = float("nan") if d["gops"] is None else d["gops"]
            peaks.append(PeakRow(**d))
        elif kind == "run":
            rows.append(Row(**d))
    return peaks, rows


def _no_nan(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with NaN floats as None (JSON null: strict JSON has no NaN)."""
    return {k: None if isinstance(v, float) and v != v else v for k, v in d.items()}


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or x != x else format(x, spec)


def _table(peaks: list[PeakRow], rows: list[Row], repeat: int, warmup: int, unit: str) -> None:
    """The human-readable output: the peaks, then the rows."""
    click.echo("peaks (measured in the same process as the rows; GOP/s, a multiply-add = 2):")
    click.echo(f"{'isa':<8} {'amx':<3} {'threads':>7} {'path':<16} {'GOP/s':>8}  how")
    for p in peaks:
        click.echo(
            f"{p.isa:<8} {'on' if p.amx else 'off':<3} {p.threads:>7} {p.path:<16} "
            f"{_fmt(p.gops, '.1f'):>8}  {p.how}"
        )
    click.echo(
        f"median of {repeat} runs after {warmup} warm-up; GFLOP = matrix products "
        f"(2*M*N*K per matmul, 4*B*H*Sq*Skv*D per attention); % peak = GFLOP/s over the "
        "peak of the path the precision multiplies on"
    )
    click.echo(
        f"{'isa':<8} {'amx':<3} {'precision':<9} {'threads':>7} {'shape':>9} {'GFLOP':>7} "
        f"{'ms':>9} {'min ms':>9} {unit:>10} {'GFLOP/s':>8} {'peak':<16} {'% peak':>7}"
    )
    for r in rows:
        click.echo(
            f"{r.isa:<8} {'on' if r.amx else 'off':<3} {r.precision:<9} {r.threads:>7} "
            f"{r.shape:>9} {r.gflop:>7.3f} {r.median_ms:>9.2f} {r.min_ms:>9.2f} "
            f"{r.per_second:>10.1f} {r.gflops:>8.1f} {r.peak or '-':<16} "
            f"{_fmt(r.peak_pct, '.1f'):>6}%"
        )
