"""One tree's rlx training step on a loaded machine: process CPU time per step, graph sizes.

    PYTHONPATH=<tree> .venv/bin/python benchmarks/train_ab.py <tree> <case> <steps>

Builds ``benchmarks/train.py``'s case through ``<tree>/benchmarks/_train_worker.rlx_setup``
(1 thread), runs 3 warm steps and ``<steps>`` timed ones, and prints one JSON line: the
median and minimum wall and process-CPU ms per step (on a shared VM the CPU time is the
readable one), the planned peak and arena bytes, the node counts of the step graph and of
the compiled graph, and the counts of the ops the backward pass is built from. Run it for
two trees in alternation (A/B) to compare them.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter

KEYS = ("relu_backward", "activation_backward", "layer_norm_backward",
        "layer_norm_backward_gamma", "unary", "binary", "compare", "where", "cast", "reduce",
        "elementwise_region")  # fmt: skip


def main() -> None:
    tree, case, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.path.insert(0, f"{tree}/benchmarks")
    import _train_worker as w

    ts, feeds = w.rlx_setup(case, 1)
    for k in range(3):
        ts.step(feeds[k % len(feeds)])
    wall, cpu = [], []
    for k in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        ts.step(feeds[k % len(feeds)])
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    step_ops = Counter(n.op.mnemonic for n in ts.step_graph.nodes)
    cg = ts.compiled
    ops = Counter(n.op.mnemonic for n in cg.graph.nodes)
    print(json.dumps({
        "case": case,
        "median_ms": statistics.median(wall) * 1e3,
        "min_ms": min(wall) * 1e3,
        "cpu_median_ms": statistics.median(cpu) * 1e3,
        "cpu_min_ms": min(cpu) * 1e3,
        "peak_bytes": cg.memory_plan.peak_bytes,
        "arena_bytes": cg.memory_plan.arena_bytes,
        "step_nodes": len(ts.step_graph.nodes),
        "compiled_nodes": len(cg.graph.nodes),
        "step_ops": {k: step_ops[k] for k in KEYS if step_ops[k]},
        "compiled_ops": {k: ops[k] for k in KEYS if ops[k]},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
