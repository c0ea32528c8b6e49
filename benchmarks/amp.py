"""Auto mixed precision benchmark: bf16 / f16 vs f32 through ``rlx.Session`` on the CPU.

    python benchmarks/amp.py [--repeat 20] [--markdown benchmarks/results/BENCHMARKS_amp.md]

Workloads: an MLP (batch 64, 512 -> 2048 -> 2048 -> 512, gelu) and an attention
workload (a 2-layer encoder, hidden 256, 4 heads, seq 128, spelled-out attention that
the pipeline fuses). For each precision policy it compiles with the params given (and,
in a second row, frozen: ``freeze_params=True`` turns the weight casts into compile-time
constants) and reports the median and minimum latency of ``run`` (variants interleaved
round by round), the arena (working region peak and total) of the memory plan, the
number of casts in the compiled graph, and the error against the f32 reference
interpreter (max |err| / max |ref|).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _common import mlp  # noqa: E402

from rlx.errors import RlxError  # noqa: E402
from rlx.ir.mir import Graph  # noqa: E402
from rlx.models.synthetic import encoder, random_inputs, random_params  # noqa: E402
from rlx.ops.elementwise import Cast  # noqa: E402
from rlx.options import CompileOptions  # noqa: E402
from rlx.passes.pipeline import CompilePipeline  # noqa: E402
from rlx.passes.precision import PrecisionPolicy  # noqa: E402
from rlx.runtime.compiled import CompiledGraph  # noqa: E402
from rlx.runtime.session import Session  # noqa: E402

CASES: tuple[tuple[str, Callable[[], Graph]], ...] = (
    ("MLP b64 512-2048-2048-512", mlp),
    ("encoder 2L h256 seq128", lambda: encoder(layers=2, hidden=256, heads=4, ffn=1024, seq=128)),
)
POLICIES = (
    ("f32", None),
    ("bf16 (AutoMixedBf16)", PrecisionPolicy.AutoMixedBf16),
    ("f16 (AutoMixed)", PrecisionPolicy.AutoMixed),
)


def mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def compile_frozen(
    g: Graph, policy: PrecisionPolicy | None, ps: dict, notes: list[str]
) -> CompiledGraph:
    """Compile with ``freeze_params=True`` through Session; when Session rejects that,
    freeze with the pipeline and compile the frozen graph (noted in ``notes``)."""
    opts = CompileOptions(precision=policy, freeze_params=True, use_cache=False, verbose=False)
    try:
        return Session("cpu").compile(g, opts, params=ps)
    except RlxError as e:
        msg = f"Session.compile(freeze_params=True) raised: {str(e).splitlines()[0]}"
        if msg not in notes:
            notes.append(msg)
    frozen = CompilePipeline(opts, params=ps).run(g).graph
    return Session("cpu").compile(frozen, CompileOptions(use_cache=False, verbose=False))


def describe(
    cg: CompiledGraph, out: np.ndarray, ref: np.ndarray, times: list[float], compile_s: float
) -> str:
    """The table cells of one variant."""
    plan = cg.memory_plan
    casts = sum(isinstance(n.op, Cast) for n in cg.graph.nodes)
    err = float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    return (
        f"{statistics.median(times) * 1e3:.2f} | {min(times) * 1e3:.2f} | {mib(plan.peak_bytes)} | "
        f"{mib(plan.arena_bytes)} | {casts} | {err:.1e} | {compile_s * 1e3:.0f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    lines = [
        f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; python {platform.python_version()}; "
        f"{platform.machine()}; numpy {np.__version__}; {args.repeat} rounds after 3 warm-up runs, each "
        f"round runs every variant of a workload once (interleaved, so load changes hit all variants); "
        f"load average before the run {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (shared)",
        "",
        "| workload | precision | params | run ms (median) | run ms (min) | working peak MiB | arena MiB | casts | rel. err vs f32 | compile ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for name, build in CASES:
        g = build()
        ps = random_params(g)
        ins = random_inputs(g)
        ref = g.evaluate(ins, ps)[0].astype(np.float64)
        variants = []
        for pname, pol in POLICIES:
            for freeze in (False, True):
                t0 = time.perf_counter()
                if freeze:
                    cg = compile_frozen(g, pol, ps, notes)
                else:
                    opts = CompileOptions(precision=pol, use_cache=False, verbose=False)
                    cg = Session("cpu").compile(g, opts, params=ps)
                compile_s = time.perf_counter() - t0
                out = cg.run(ins)[0]
                for _ in range(2):
                    cg.run(ins)
                variants.append((pname, freeze, cg, out, compile_s, []))
        for _ in range(args.repeat):
            for v in variants:
                t = time.perf_counter()
                v[2].run(ins)
                v[5].append(time.perf_counter() - t)
        for pname, freeze, cg, out, compile_s, times in variants:
            row = describe(cg, out, ref, times, compile_s)
            lines.append(f"| {name} | {pname} | {'frozen' if freeze else 'runtime'} | {row} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines + ([""] + [f"note: {n}" for n in notes] if notes else []))
    print()
    print(text)
    if args.markdown:
        args.markdown.write_text(
            "# AMP benchmark\n\n"
            f"Command: `python benchmarks/amp.py --repeat {args.repeat} --markdown {args.markdown}`\n\n"
            + text
            + "\n"
        )


if __name__ == "__main__":
    main()
