"""A training step with the cross-entropy fused (``fuse_cross_entropy`` before the backward
pass: ``softmax_cross_entropy`` and its one-pass backward op) vs spelled out
(``CompileOptions(disabled_passes=("fuse_cross_entropy",))``: log_softmax, gather_elements,
their backward ops, a scatter into zeros), both through ``rlx.train.TrainStep`` (AdamW).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/fused_loss.py \\
        [--rounds 5] [--threads 1] [--out benchmarks/results/BENCHMARKS_train.md]

Cases (seeded): ``mlp_digits`` (train.py's: 64 -> 256 -> 256 -> 10 ReLU MLP, batch 64),
``lm_head`` (a 256-wide hidden state -> 8192-class linear head, 256 rows: the loss side
of a language model's step) and ``loss_grad`` (the loss alone: ``rlx.autodiff.grad`` of
the mean cross-entropy of [256, 8192] logits wrt the logits, fused by running
``CrossEntropyFusion`` first, compiled, one ``run`` per step). Method: one process; both variants compiled, one untimed
step each, then ``--rounds`` interleaved rounds (the variant that starts alternates) of
``inner`` steps; reported: median ms per step and fused / unfused, the load average, the
CPU. With ``--out`` a paragraph is appended to that file.
"""

from __future__ import annotations

import _common  # noqa: F401  (puts the repository on sys.path; import before NumPy)

_common.reexec_without_blas_pins()

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import rlx  # noqa: E402
from rlx.ops.compose.losses import cross_entropy  # noqa: E402
from rlx.options import CompileOptions  # noqa: E402
from rlx.train import AdamW, TrainStep  # noqa: E402

CASES = {
    "mlp_digits": ((64, 256, 256, 10), 64, 100),
    "lm_head": ((256, 8192), 256, 10),
    "loss_grad": ((8192,), 256, 20),
}


def build(dims: tuple[int, ...], batch: int) -> tuple[rlx.Graph, dict, list[dict]]:
    g = rlx.Graph("fused_loss")
    x, y = g.input("x", (batch, dims[0])), g.input("y", (batch,), "i64")
    h = x
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        h = g.add(g.matmul(h, g.param(f"w{i}", (a, b))), g.param(f"b{i}", (b,)))
        if i < len(dims) - 2:
            h = g.relu(h)
    g.set_outputs([cross_entropy(g, h, y)])
    rng = np.random.default_rng(0)
    params = {
        n.op.name: (rng.standard_normal(n.shape.concrete()) * 0.05).astype(np.float32)
        for n in g.param_nodes()
    }
    data = [
        {"x": rng.standard_normal((batch, dims[0])).astype(np.float32),
         "y": rng.integers(0, dims[-1], batch)}
        for _ in range(4)
    ]  # fmt: skip
    return g, params, data


def loss_grads(c: int, batch: int, threads: int) -> tuple[dict, list[dict]]:
    """The ``loss_grad`` case: a compiled gradient graph per variant, and its feeds."""
    from rlx.autodiff.reverse import grad
    from rlx.passes.fusion_loss import CrossEntropyFusion
    from rlx.runtime.session import Session

    g = rlx.Graph("loss")
    x, y = g.input("x", (batch, c)), g.input("y", (batch,), "i64")
    g.set_outputs([cross_entropy(g, x, y)])
    off = CompileOptions(num_threads=threads, disabled_passes=("fuse_cross_entropy",))
    graphs = {"fused": grad(CrossEntropyFusion().run(g), ["x"]), "unfused": grad(g, ["x"])}
    compiled = {k: Session("cpu").compile(v, off) for k, v in graphs.items()}
    rng = np.random.default_rng(0)
    data = [
        {"x": rng.standard_normal((batch, c)).astype(np.float32), "y": rng.integers(0, c, batch)}
        for _ in range(4)
    ]
    return {k: (lambda b, cg=cg: cg.run(b)) for k, cg in compiled.items()}, data


def measure(case: str, rounds: int, threads: int) -> dict[str, float]:
    dims, batch, inner = CASES[case]
    if case == "loss_grad":
        steps, data = loss_grads(dims[0], batch, threads)
    else:
        g, params, data = build(dims, batch)
        variants = {
            "fused": CompileOptions(num_threads=threads),
            "unfused": CompileOptions(num_threads=threads, disabled_passes=("fuse_cross_entropy",)),
        }
        steps = {k: TrainStep(g, AdamW(1e-4), params, options=o).step for k, o in variants.items()}
    for s in steps.values():
        s(data[0])
    times: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(rounds):
        order = list(steps) if r % 2 == 0 else list(steps)[::-1]
        for k in order:
            t0 = time.perf_counter()
            for i in range(inner):
                steps[k](data[i % len(data)])
            times[k].append((time.perf_counter() - t0) / inner * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    rows = [(c, measure(c, args.rounds, args.threads)) for c in args.cases]
    load1 = os.getloadavg()[0]
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
         if "model name" in ln), "?",
    )  # fmt: skip
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "| case | fused ms | unfused ms | fused / unfused |",
        "|---|---|---|---|",
        *(f"| {c} | {m['fused']:.2f} | {m['unfused']:.2f} | {m['fused'] / m['unfused']:.2f} |"
          for c, m in rows),
    ]  # fmt: skip
    cmd = " ".join(["benchmarks/fused_loss.py", *sys.argv[1:]])
    text = (
        f"\n## Fused cross-entropy in the training step ({when})\n\n"
        f"`{cmd}`: {args.threads} thread(s), {args.rounds} interleaved rounds, median ms "
        f"per AdamW step (loss_grad: per gradient run); CPU {cpu}; load average {load0:.2f} -> {load1:.2f} (a shared "
        "VM: compare within this table only).\n\n" + "\n".join(lines) + "\n"
    )
    print(text)
    if args.out is not None:
        with args.out.open("a", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
