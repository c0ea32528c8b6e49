"""Compile-time benchmark: graphs of about 1,000 nodes through every pass.

    python benchmarks/compile_time.py [--repeat 5] [--markdown benchmarks/results/BENCHMARKS_compile.md]

For each graph and precision it runs ``CompilePipeline`` (verification once at the end,
as ``Session.compile`` does by default, and after every pass, as tests do) ``--repeat``
times and reports the median total and the median time of each pass. The target is a
1,000-node graph through all passes in under one second.
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

import _common  # noqa: E402, F401  (puts the repository root on sys.path)

from rlx.ir.mir import Graph  # noqa: E402
from rlx.models.synthetic import decoder, encoder  # noqa: E402
from rlx.options import CompileOptions, VerifyMode  # noqa: E402
from rlx.passes.pipeline import CompilePipeline  # noqa: E402
from rlx.passes.precision import PrecisionPolicy  # noqa: E402

CASES: tuple[tuple[str, Callable[[], Graph]], ...] = (
    (
        "decoder 27L (GQA, rope, SwiGLU)",
        lambda: decoder(layers=27, hidden=64, heads=4, ffn=128, seq=16, kv_heads=2),
    ),
    (
        "encoder 22L (bias linears, gelu)",
        lambda: encoder(layers=22, hidden=64, heads=4, ffn=128, seq=16),
    ),
)
PRECISIONS = (("f32", None), ("bf16 AMP", PrecisionPolicy.AutoMixedBf16))
VERIFY = (("end", VerifyMode.END), ("each pass", VerifyMode.EACH_PASS))


def measure(
    graph: Graph, options: CompileOptions, repeat: int
) -> tuple[float, dict[str, float], int]:
    """(median total seconds, median seconds per pass name, nodes after)."""
    totals: list[float] = []
    per: dict[str, list[float]] = {}
    nodes = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = CompilePipeline(options).run(graph)
        totals.append(time.perf_counter() - t0)
        acc: dict[str, float] = {}
        for r in res.records:
            acc[r.name] = acc.get(r.name, 0.0) + r.seconds
        for k, v in acc.items():
            per.setdefault(k, []).append(v)
        nodes = len(res.graph)
    return statistics.median(totals), {k: statistics.median(v) for k, v in per.items()}, nodes


def measure_session(graph: Graph, options: CompileOptions, repeat: int) -> float:
    """Median seconds of a whole ``Session("cpu").compile`` (passes, memory plan, kernel
    schedule), with params given at compile time and the compile cache off."""
    from rlx.models.synthetic import random_params
    from rlx.runtime.session import Session

    params = random_params(graph)
    totals: list[float] = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        Session("cpu").compile(graph, options, params=params)
        totals.append(time.perf_counter() - t0)
    return statistics.median(totals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--markdown", type=Path, default=None, help="also write the tables here")
    args = ap.parse_args()
    lines = [
        f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; python {platform.python_version()}; "
        f"{platform.machine()}; median of {args.repeat} runs; load average before the run "
        f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (shared with other jobs)",
        "",
        "| graph | nodes in -> out | precision | verify | total ms | under 1 s |",
        "|---|---|---|---|---|---|",
    ]
    detail: list[str] = []
    for name, build in CASES:
        g = build()
        for pname, pol in PRECISIONS:
            for vname, vmode in VERIFY:
                opts = CompileOptions(precision=pol, verify=vmode, verbose=False)
                total, per, nodes = measure(g, opts, args.repeat)
                ok = "yes" if total < 1.0 else "NO"
                lines.append(
                    f"| {name} | {len(g)} -> {nodes} | {pname} | {vname} | {total * 1e3:.1f} | {ok} |"
                )
                if vmode is VerifyMode.END:
                    slow = sorted(per.items(), key=lambda kv: -kv[1])
                    detail.append(
                        f"| {name} | {pname} | "
                        + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in slow)
                        + " |"
                    )
    lines += [
        "",
        'Whole `Session("cpu").compile` (passes + memory plan + kernel schedule), f32, '
        "verify at end, compile cache off; native on is measured with gcc's build cache "
        "already warm (a cold native build is a one-time cost per kernel source):",
        "",
        "| graph | nodes | native kernels | total ms | under 1 s |",
        "|---|---|---|---|---|",
    ]
    for name, build in CASES:
        g = build()
        for native in (False, True):
            opts = CompileOptions(verbose=False, use_cache=False, native=native)
            measure_session(g, opts, 1)  # warm gcc's build cache
            total = measure_session(g, opts, args.repeat)
            ok = "yes" if total < 1.0 else "NO"
            lines.append(
                f"| {name} | {len(g)} | {'on' if native else 'off'} | {total * 1e3:.1f} | {ok} |"
            )
    lines += [
        "",
        "Per pass (verify at end), ms, slowest first:",
        "",
        "| graph | precision | passes |",
        "|---|---|---|",
        *detail,
    ]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(
            "# Compile-time benchmark\n\n"
            f"Command: `python benchmarks/compile_time.py --repeat {args.repeat} --markdown {args.markdown}`\n\n"
            + text
            + "\n"
        )


if __name__ == "__main__":
    main()
