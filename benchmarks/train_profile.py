"""Where an rlx training step spends its time: the slowest kernels of a profiled step.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/train_profile.py \\
        [--case mlp_large|mlp_digits|minilm] [--threads 2] [--top 25] [--steps 3]

Builds the case of ``benchmarks/train.py`` (``_train_worker.rlx_setup``), runs ``--steps``
warm steps, then one profiled step (``CompiledGraph.run(profile=True)``), and prints the
wall time of a step, the total kernel time, the time per op kind and the ``--top`` slowest
kernels with their node labels (``compiled.report()``).
"""

from __future__ import annotations

import _common  # noqa: F401  (puts the repository on sys.path; import before NumPy)

_common.reexec_without_blas_pins()

import argparse  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402

import _train_worker as w  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="mlp_large", choices=["mlp_digits", "mlp_large", "minilm"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    ts, feeds = w.rlx_setup(a.case, a.threads)
    for k in range(a.steps):
        ts.step(feeds[k % len(feeds)])
    t0 = time.perf_counter()
    ts.step(feeds[0])
    wall = time.perf_counter() - t0
    from rlx.train.step import LR_INPUT

    cg = ts.compiled
    cg.run({**feeds[0], LR_INPUT: np.float64(ts.lr())}, profile=True)
    rep = cg.report()
    recs = [k for k in rep.kernels if k.seconds is not None]
    total = rep.total_seconds
    print(f"{a.case}, {a.threads} threads: step wall {wall * 1e3:.1f} ms, profiled kernel "
          f"total {total * 1e3:.1f} ms over {len(recs)} kernels")  # fmt: skip
    by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for k in recs:
        key = f"{k.op} ({k.kind.value})"
        by_op[key][0] += k.seconds or 0.0
        by_op[key][1] += 1
    print("\ntime by op (kernel kind):")
    for key, (s, n) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:20]:
        print(f"  {s * 1e3:9.2f} ms  {100 * s / total:5.1f} %  x{n:<5d} {key}")
    print(f"\nslowest {a.top} kernels:")
    for k in sorted(recs, key=lambda k: -(k.seconds or 0.0))[: a.top]:
        dims = "[" + ",".join(map(str, k.dims)) + "]"
        what = ", ".join(k.fused) if k.fused else k.label
        print(
            f"  {k.seconds * 1e3:8.2f} ms  #{k.node:<6d} {k.op:<24} {dims:<18} {k.kind.value:<9} {what[:70]}"
        )


if __name__ == "__main__":
    main()
