"""Memory-plan benchmark: arena peak vs naive vs lower bound on transformer graphs.

    python benchmarks/memory_plan.py [--repeat 5] [--markdown benchmarks/results/BENCHMARKS_memory.md]

For each graph it prints the working-region peak chosen by the planner, the peak of each
heuristic alone, the peak without in-place reuse, the naive total (one buffer per node),
the lower bound (most bytes live at one step) and the planner's wall time (median).
A second table gives each heuristic's peak / lower bound over seeded random DAGs.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import _common  # noqa: E402, F401  (puts the repository root on sys.path)
import numpy as np

from rlx.backends.cpu.plancheck import check_plan  # noqa: E402
from rlx.backends.cpu.planner import plan_memory  # noqa: E402
from rlx.ir.lir import PlanStrategy  # noqa: E402
from rlx.ir.mir import Graph  # noqa: E402
from rlx.models import decoder, encoder  # noqa: E402
from rlx.passes.pipeline import CompilePipeline  # noqa: E402
from rlx.shape import sym  # noqa: E402


def optimized(graph: Graph) -> Graph:
    """The graph the CPU backend plans: after cleanup and fusion passes."""
    return CompilePipeline().run(graph).graph


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], Graph]
    bindings: dict[str, int]


CASES = (
    Case("MiniLM encoder (6L, h384, seq 128, batch 1)", lambda: encoder(), {}),
    Case(
        "MiniLM encoder, symbolic, bound to batch 8, seq 256",
        lambda: encoder(seq=sym("seq"), batch=sym("batch")),
        {"batch": 8, "seq": 256},
    ),
    Case("decoder (24L, h384, 6 heads, ffn 1024, seq 128)", lambda: decoder(layers=24), {}),
    Case(
        "decoder 24L, fused causal attention, 2 KV heads, seq 512",
        lambda: decoder(layers=24, seq=512, fused_attention=True, kv_heads=2),
        {},
    ),
    Case(
        "MiniLM encoder after the default CompilePipeline (fused)",
        lambda: optimized(encoder()),
        {},
    ),
    Case(
        "decoder 24L after the default CompilePipeline (fused)",
        lambda: optimized(decoder(layers=24)),
        {},
    ),
)


def mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def measure(case: Case, repeat: int) -> dict[str, str]:
    graph = case.build()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = plan_memory(graph, case.bindings)
        times.append(time.perf_counter() - t0)
    check_plan(graph, plan)
    alone = {s: plan_memory(graph, case.bindings, strategies=(s,)).peak_bytes for s in PlanStrategy}
    no_inplace = plan_memory(graph, case.bindings, inplace=False)
    return {
        "graph": case.name,
        "nodes": str(len(graph)),
        "peak MiB": mib(plan.peak_bytes),
        "naive MiB": mib(plan.naive_bytes),
        "lower bound MiB": mib(plan.lower_bound_bytes),
        "peak/LB": f"{plan.ratio:.3f}",
        "naive/peak": f"{plan.naive_bytes / plan.peak_bytes:.1f}x",
        "winner": plan.strategy.value if plan.strategy else "-",
        **{f"{s.value} MiB": mib(v) for s, v in alone.items()},
        "no in-place MiB": mib(no_inplace.peak_bytes),
        "params MiB": mib(plan.persistent_bytes),
        "plan ms": f"{1e3 * statistics.median(times):.1f}",
    }


def random_dag(rng: np.random.Generator) -> Graph:
    """A random DAG of elementwise, broadcast, reduce, matmul, reshape and transpose
    nodes over f32 [m, n] tensors with random sizes and 1-3 outputs."""
    g = Graph("random")
    m, n = (int(v) for v in rng.integers(1, 65, size=2))
    nodes = [g.input("x", (m, n))]
    for k in range(int(rng.integers(5, 60))):
        x = nodes[int(rng.integers(len(nodes)))]
        dims = g.nodes[x].shape.dims
        step = int(rng.integers(6))
        if step == 0:
            nodes.append(g.tanh(x))
        elif step == 1:
            same = [v for v in nodes if g.nodes[v].shape.dims == dims]
            nodes.append(g.add(x, same[int(rng.integers(len(same)))]))
        elif step == 2 and len(dims) == 2:
            nodes.append(g.mul(x, g.sum(x, axes=(1,), keepdims=True)))
        elif step == 3 and len(dims) == 2:
            w = g.param(f"w{k}", (dims[1], int(rng.integers(1, 129))))
            nodes.append(g.matmul(x, w))
        elif step == 4:
            nodes.append(g.reshape(x, (int(np.prod(dims)),)))
        elif len(dims) == 2:
            nodes.append(g.transpose(x, (1, 0)))
    picks = rng.choice(len(nodes), size=min(len(nodes), int(rng.integers(1, 4))), replace=False)
    g.set_outputs([nodes[int(i)] for i in picks])
    return g


def random_dag_rows(count: int, seed: int) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    ratios: dict[str, list[float]] = {s.value: [] for s in PlanStrategy}
    ratios["planner (best of three)"] = []
    for _ in range(count):
        graph = random_dag(rng)
        plan = plan_memory(graph)
        check_plan(graph, plan)
        if not plan.lower_bound_bytes:
            continue
        ratios["planner (best of three)"].append(plan.ratio)
        for s in PlanStrategy:
            ratios[s.value].append(plan_memory(graph, strategies=(s,)).ratio)
    return [
        {
            "heuristic": name,
            "graphs": str(len(v)),
            "mean peak/LB": f"{np.mean(v):.4f}",
            "worst peak/LB": f"{np.max(v):.3f}",
            "at LB": f"{100 * np.mean(np.asarray(v) <= 1.0):.0f}%",
        }
        for name, v in ratios.items()
    ]


def table(rows: Sequence[dict[str, str]]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="planner runs per graph (median)")
    ap.add_argument("--markdown", type=Path, help="also write the results to this file")
    ap.add_argument("--dags", type=int, default=400, help="random DAGs for the second table")
    args = ap.parse_args()
    rows = [measure(c, args.repeat) for c in CASES]
    text = table(rows) + f"\n\nRandom DAGs (seed 0, {args.dags} graphs):\n\n"
    text += table(random_dag_rows(args.dags, 0))
    print(text)
    if args.markdown:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        args.markdown.write_text(
            "## Memory plan\n\n"
            f"Command: `python benchmarks/memory_plan.py --markdown {args.markdown}` "
            f"({stamp}, Python {platform.python_version()}, {platform.machine()}).\n\n"
            "Working-region bytes (the reused part of the arena; params live in a separate "
            "persistent region). naive = one buffer per non-view node; lower bound = most "
            "bytes live at one schedule step (same views and in-place aliases); every plan "
            "passes `check_plan`.\n\n" + text + "\n"
        )


if __name__ == "__main__":
    main()
