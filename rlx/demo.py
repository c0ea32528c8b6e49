"""The main demo: a MiniLM-sized encoder through every stage of rlx.

Builds the graph (symbolic batch and seq), verifies and prints it, evaluates it with the
reference interpreter, compiles it for the CPU (passes, fusion, memory plan), runs two
different sequence lengths on one compiled graph, checks both against the reference,
then quantizes it to INT8 and reports the error. Run with ``python -m rlx.demo``.
"""

from __future__ import annotations

import time

import numpy as np

import rlx
from rlx.models.synthetic import encoder, random_inputs, random_params


def main() -> None:
    g = rlx.Graph("probe")
    batch, seq = g.sym("batch"), g.sym("seq")
    graph = encoder(layers=2, hidden=384, heads=12, ffn=1536, seq=seq, batch=batch)
    graph.verify()
    lines = graph.inspect().splitlines()
    print(f"== MIR graph {graph.name!r}: {len(graph)} nodes (first 14 lines) ==")
    print("\n".join(lines[:14]))
    params = random_params(graph, seed=0)

    print("\n== compile for the CPU ==")
    t0 = time.perf_counter()
    compiled = rlx.Session("cpu").compile(graph, params=params)
    print(f"compiled in {(time.perf_counter() - t0) * 1e3:.0f} ms")
    report = compiled.report()
    print(report.fusion_report)
    kinds = ", ".join(f"{n} {k.value}" for k, n in report.kind_counts().items())
    print(f"{len(report.kernels)} kernels in the schedule: {kinds}")

    for b, s in ((1, 128), (2, 48)):
        inputs = random_inputs(graph, {"batch": b, "seq": s}, seed=1)
        t0 = time.perf_counter()
        (out,) = compiled.run(inputs)
        dt = (time.perf_counter() - t0) * 1e3
        (ref,) = graph.evaluate(inputs, params)
        err = float(np.abs(out - ref).max())
        print(
            f"batch={b} seq={s}: out {out.shape}, run {dt:.1f} ms, max |compiled - reference| = {err:.2e}"
        )
        print("  " + str(compiled.memory_plan).splitlines()[0])

    print("\n== INT8 post-training quantization ==")
    calib = [random_inputs(graph, {"batch": 1, "seq": 64}, seed=i) for i in range(4)]
    q = rlx.quantize(graph, calib, params=params, method="minmax", rank_layers=False)
    print(q.report)


if __name__ == "__main__":
    main()
