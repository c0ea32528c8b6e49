"""Native row kernels (engines/rows.py) vs the NumPy kernels they supersede, written to
benchmarks/results/BENCHMARKS_rows.md.

Measures, in one run:

1. each op's kernel closure alone (the factory called as the executor calls it, on
   arrays of the op's dims): NumPy kernel (``KernelCtx.native=False``) vs native, with 1
   and 2 threads, at transformer sizes: layer_norm / rms_norm / fused residual norms /
   softmax / log_softmax on [128,384], [128,1536], [2048,384], softmax and log_softmax
   on [12,128,128], and fused_matmul_bias_act (gelu) on [32,1024]x[1024,4096] and
   [128,384]x[384,1536]; and the matmul alone vs the native bias + activation pass alone;
2. end to end through ``rlx.Session``: the MLP ``gelu(x[32,1024] @ w1 + b1) @ w2 + b2``
   the MiniLM-sized encoder (``rlx.models.synthetic.encoder()``) and the Llama-shaped
   decoder (``decoder()``: rms_norm, SwiGLU, spelled-out causal attention), with
   ``CompileOptions(native=False)`` vs ``native=True``, 1 and 2 threads, and the
   encoder's profiled time per op kind for both;
3. the largest difference between native and NumPy outputs.

Times are the best of several rounds (the slower rounds measure the other jobs on a
shared machine). Usage: ``python benchmarks/rows.py [--out benchmarks/results/BENCHMARKS_rows.md] [--quick]``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np  # noqa: E402
from _common import RESULTS, best_time  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import rlx  # noqa: E402
from rlx.backends.cpu import native  # noqa: E402
from rlx.backends.cpu.codegen.elementwise import C_TYPES  # noqa: E402
from rlx.backends.cpu.codegen.rows import RowKind, RowSpec  # noqa: E402
from rlx.backends.cpu.engines.rows import row_kernel  # noqa: E402
from rlx.backends.cpu.kernels import KERNELS, KernelCtx, ScratchPool, load_kernels  # noqa: E402
from rlx.dtype import DType  # noqa: E402
from rlx.models import synthetic  # noqa: E402
from rlx.ops.elementwise import UnaryKind  # noqa: E402
from rlx.options import CompileOptions  # noqa: E402
from rlx.runtime.session import Session  # noqa: E402

ROWS = [(128, 384), (128, 1536), (2048, 384)]


def timeit(fn: Callable[[], object], repeat: int, number: int) -> float:
    """Seconds per call: best of ``repeat`` rounds of ``number`` calls, after a warm-up."""
    return best_time(fn, repeat, number, warmup=True)


def op_graph(name: str, dims: tuple[int, ...]) -> tuple[rlx.Graph, list[np.ndarray]]:
    """A one-op graph of ``name`` over ``dims`` and random inputs for it."""
    rng = np.random.default_rng(0)
    g = rlx.Graph(name)
    n = dims[-1]

    def arr(*d: int) -> np.ndarray:
        return rng.standard_normal(d).astype(np.float32)

    if name in ("softmax", "log_softmax"):
        x = g.input("x", dims)
        y = g.softmax(x) if name == "softmax" else g.log_softmax(x)
        arrays = [arr(*dims)]
    elif name in ("layer_norm", "rms_norm"):
        x, ga, b = g.input("x", dims), g.input("g", (n,)), g.input("b", (n,))
        y = g.layer_norm(x, ga, b) if name == "layer_norm" else g.rms_norm(x, ga)
        arrays = [arr(*dims), arr(n), arr(n)] if name == "layer_norm" else [arr(*dims), arr(n)]
    elif name.startswith("residual"):
        x, r, ga, b = (
            g.input(s, d) for s, d in (("x", dims), ("r", dims), ("g", (n,)), ("b", (n,)))
        )
        if name == "residual_layer_norm":
            y = g.fused_residual_layer_norm(x, r, ga, b)
            arrays = [arr(*dims), arr(*dims), arr(n), arr(n)]
        else:
            y = g.fused_residual_rms_norm(x, r, ga)
            arrays = [arr(*dims), arr(*dims), arr(n)]
    elif name == "fused_swiglu":  # dims = (M, K, N)
        m, k, n = dims
        x, wg, wu = g.input("x", (m, k)), g.input("wg", (k, n)), g.input("wu", (k, n))
        y = g.fused_swiglu(x, wg, wu)
        arrays = [arr(m, k), arr(k, n) / 32, arr(k, n) / 32]
    else:  # fused_matmul_bias_act: dims = (M, K, N)
        m, k, n = dims
        x, w, b = g.input("x", (m, k)), g.input("w", (k, n)), g.input("b", (n,))
        y = g.fused_matmul_bias_act(x, w, b, UnaryKind.GELU)
        arrays = [arr(m, k), arr(k, n) / 32, arr(n)]
    g.set_outputs([y])
    return g, arrays


def kernel_time(
    name: str, dims: tuple[int, ...], native_on: bool, threads: int, quick: bool
) -> tuple[float, np.ndarray, str]:
    """Seconds per call of the op's kernel closure, its output and its kind."""
    g, arrays = op_graph(name, dims)
    node = g.nodes[g.outputs[0]]
    out = np.empty(node.shape.concrete({}), np.float32)
    ctx = KernelCtx(node, g, {}, {}, {}, ScratchPool(), num_threads=threads, native=native_on)
    fn = KERNELS[type(node.op)](node, arrays, out, ctx)
    assert fn is not None
    size = out.size * (dims[1] if name.startswith("fused_") else 1)
    number = max(3, min(400, int(2e7 // max(size, 1)))) // (4 if quick else 1) or 1
    with threadpool_limits(limits=threads, user_api="blas"):
        t = timeit(fn, 3 if quick else 7, number)
    fn()
    return t, out.copy(), ctx.kind.value


def mlp() -> rlx.Graph:
    g = rlx.Graph("mlp")
    x = g.input("x", (32, 1024))
    h = g.gelu(g.linear(x, g.param("w1", (1024, 4096)), g.param("b1", (4096,))))
    g.set_outputs([g.linear(h, g.param("w2", (4096, 1024)), g.param("b2", (1024,)))])
    return g


def e2e(
    g: rlx.Graph, native_on: bool, threads: int, quick: bool
) -> tuple[float, np.ndarray, dict[str, float], str]:
    """Best run() time, the output, profiled seconds per op and the fused ops' kinds."""
    params = synthetic.random_params(g, seed=0)
    inputs = synthetic.random_inputs(g, seed=1)
    opts = CompileOptions(native=native_on, num_threads=threads, use_cache=False)
    cg = Session("cpu").compile(g, opts, params=params)
    t = timeit(lambda: cg.run(inputs), 3 if quick else 7, 3 if quick else 10)
    out = cg.run(inputs)[0]
    cg.run(inputs, profile=True)
    per_op: dict[str, float] = defaultdict(float)
    kinds: dict[str, set[str]] = defaultdict(set)
    for k in cg.report().kernels:
        if k.seconds is not None:
            per_op[k.op] += k.seconds
        kinds[k.op].add(k.kind.value)
    desc = ", ".join(f"{op}: {'/'.join(sorted(v))}" for op, v in sorted(kinds.items()))
    return t, out, dict(per_op), desc


GRAPHS: tuple[tuple[str, Callable[[], rlx.Graph]], ...] = (
    ("MLP 32x1024x4096x1024", mlp),
    ("encoder() 6x384, seq 128", synthetic.encoder),
    ("decoder() 24x384, seq 128", synthetic.decoder),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(RESULTS / "BENCHMARKS_rows.md"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not native.available():
        raise SystemExit("gcc is not installed: no native kernels to measure")
    load_kernels()
    load0 = os.getloadavg()
    started = datetime.datetime.now(datetime.UTC)
    lines: list[str] = []
    w = lines.append

    cases: list[tuple[str, tuple[int, ...]]] = []
    for name in ("layer_norm", "rms_norm", "residual_layer_norm", "residual_rms_norm"):
        cases += [(name, d) for d in ROWS]
    for name in ("softmax", "log_softmax"):
        cases += [(name, d) for d in ROWS] + [(name, (12, 128, 128))]
    cases += [
        ("fused_matmul_bias_act", (32, 1024, 4096)),
        ("fused_matmul_bias_act", (128, 384, 1536)),
        ("fused_swiglu", (128, 384, 1024)),
    ]

    w("## 1. Kernels alone (us per call, best of rounds)\n")
    w(
        "| op | dims | NumPy 1t | native 1t | speed-up 1t | NumPy 2t | native 2t | speed-up 2t | max abs diff |"
    )
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, dims in cases:
        row = []
        diff = 0.0
        for threads in (1, 2):
            tn, on, kn = kernel_time(name, dims, False, threads, args.quick)
            tc, oc, kc = kernel_time(name, dims, True, threads, args.quick)
            assert kc == "native", (name, kc)
            diff = max(diff, float(np.max(np.abs(on.astype(np.float64) - oc))))
            row += [f"{tn * 1e6:.1f}", f"{tc * 1e6:.1f}", f"{tn / tc:.2f}x"]
        label = "x".join(map(str, dims))
        if name.startswith("fused_"):
            label = f"[{dims[0]},{dims[1]}]x[{dims[1]},{dims[2]}]"
            label += ", gelu" if name == "fused_matmul_bias_act" else ", silu gate"
        w(f"| {name} | {label} | " + " | ".join(row) + f" | {diff:.2g} |")
        print(lines[-1], flush=True)

    w("\n### The matmul epilogue alone (1 thread, us per call)\n")
    w("| product | sgemm alone | native bias + gelu pass | native bias + gelu_tanh pass |")
    w("|---|---:|---:|---:|")
    for m, k, n in ((32, 1024, 4096), (128, 384, 1536)):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((m, k)).astype(np.float32)
        wt = rng.standard_normal((k, n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        y = np.empty((m, n), np.float32)
        reps, num = (3, 5) if args.quick else (7, 20)
        with threadpool_limits(limits=1, user_api="blas"):
            t_mm = timeit(lambda x=x, wt=wt, y=y: np.matmul(x, wt, out=y), reps, num)
        g, _ = op_graph("fused_matmul_bias_act", (m, k, n))
        node = g.nodes[g.outputs[0]]
        epi = []
        for act in (UnaryKind.GELU, UnaryKind.GELU_TANH):
            ctx = KernelCtx(node, g, {}, {}, {}, ScratchPool(), num_threads=1)
            spec = RowSpec(RowKind.BIAS_ACT, C_TYPES[DType.F32], beta=True, act=act)
            epi.append(timeit(row_kernel(spec, [y], [bias], 0.0, ctx), reps, num * 5))
        w(f"| [{m},{k}]x[{k},{n}] | {t_mm * 1e6:.1f} | {epi[0] * 1e6:.1f} | {epi[1] * 1e6:.1f} |")
        print(lines[-1], flush=True)

    w("\n## 2. End to end through rlx.Session (ms per run(), best of rounds)\n")
    w("| graph | threads | native=False | native=True | speed-up | max abs diff |")
    w("|---|---:|---:|---:|---:|---:|")
    profiles: dict[tuple[str, int, bool], dict[str, float]] = {}
    kinds: dict[tuple[str, bool], str] = {}
    for gname, make in GRAPHS:
        for threads in (1, 2):
            res = {}
            for native_on in (False, True):
                res[native_on] = e2e(make(), native_on, threads, args.quick)
                profiles[(gname, threads, native_on)] = res[native_on][2]
                kinds[(gname, native_on)] = res[native_on][3]
            t0, o0 = res[False][:2]
            t1, o1 = res[True][:2]
            diff = float(np.max(np.abs(o0.astype(np.float64) - o1)))
            w(
                f"| {gname} | {threads} | {t0 * 1e3:.2f} | {t1 * 1e3:.2f} | {t0 / t1:.2f}x | {diff:.2g} |"
            )
            print(lines[-1], flush=True)

    w("\n## 3. Profiled time per op, 1 thread (ms per run, summed over the op's nodes)\n")
    for gname, _ in GRAPHS:
        p0, p1 = profiles[(gname, 1, False)], profiles[(gname, 1, True)]
        w(f"**{gname}**\n")
        w("| op | native=False | native=True |")
        w("|---|---:|---:|")
        for op in sorted(set(p0) | set(p1), key=lambda o: -p0.get(o, 0.0)):
            w(f"| {op} | {p0.get(op, 0.0) * 1e3:.3f} | {p1.get(op, 0.0) * 1e3:.3f} |")
        w(f"| total | {sum(p0.values()) * 1e3:.3f} | {sum(p1.values()) * 1e3:.3f} |\n")
        w(f"Kernel kinds, native=False: {kinds[(gname, False)]}\n")
        w(f"Kernel kinds, native=True: {kinds[(gname, True)]}\n")

    load1 = os.getloadavg()
    head = [
        "# Native row kernels: benchmarks\n",
        f"Command: `.venv/bin/python benchmarks/rows.py{' --quick' if args.quick else ''}`  ",
        f"Date: {started:%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
        f"{os.cpu_count()} CPUs, {native.gcc_version()}, NumPy {np.__version__}  ",
        f"Load average (1/5/15 min) at start {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, "
        f"at end {load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f}.\n",
        "Caveat: the machine (2 cores) is shared with other jobs while this runs, so the "
        "2-thread figures in particular depend on whether the second core was free; "
        "every figure is the best of several rounds.\n",
        "`native=False` runs every NumPy kernel (it also turns off the native elementwise "
        "regions and the native low-precision kernels); `native=True` is the default.\n",
    ]
    Path(args.out).write_text("\n".join(head + lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
