"""Dispatch overhead of the CPU runtime, written to benchmarks/results/BENCHMARKS_dispatch.md.

Measures:

1. per-kernel dispatch: a 100-node chain of elementwise ops on tiny tensors ([4] f32),
   compiled without fusion so every node is its own kernel: the bare schedule loop
   (``for f in schedule: f()``) per kernel, and a whole ``run()`` (input checks, copies,
   BLAS-thread check, outputs);
2. the cost of a new symbolic shape: the first ``run()`` at a binding never seen (plan +
   arena + schedule build) vs a repeated binding;
3. the two ways to apply ``num_threads``: a ``threadpool_limits`` context per run vs the
   cached ``ensure_blas_threads`` the runtime uses;
4. the cost of the per-CompiledGraph lock that makes ``run`` thread-safe: ``run()`` vs
   the same run without the lock (``_run``) on one thread;
5. the native schedule (``CompileOptions.native_schedule``): ``run()`` with runs of
   consecutive native kernels as one C call vs every kernel called from Python, on a
   chain of 50 layer norms and the MiniLM-sized encoder at 1 x 16;
6. the per-call cost of a 1-op graph (``y = x + 0.5`` on f32[4]) at one thread against
   its peers in the same process, rounds interleaved: rlx ``run`` (a repeated feed
   signature: the checked-feed cache), ``run`` with a new dict and array each call,
   ``run_trusted``, ONNX Runtime ``InferenceSession.run`` (one ``Add`` node) and torch
   eager (tensor in / tensor out, and NumPy in / NumPy out as rlx and ORT are).

Usage: ``python benchmarks/dispatch.py [--out benchmarks/results/BENCHMARKS_dispatch.md]``. When
OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE are set, the script re-executes itself without them
(they are read when OpenBLAS loads and would pin a kernel that is not the machine's), and
records the BLAS kernel threadpoolctl reports.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

from _common import RESULTS, best_time, chain, reexec_without_blas_pins, removed_blas_pins

reexec_without_blas_pins()  # must happen before NumPy loads OpenBLAS

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from rlx.backends.cpu import threads  # noqa: E402
from rlx.ir.mir import Graph  # noqa: E402
from rlx.options import CompileOptions  # noqa: E402
from rlx.runtime.session import Session  # noqa: E402


def timeit(fn, repeat: int = 7, number: int = 2000) -> float:  # noqa: ANN001
    """Seconds per call: the best of ``repeat`` rounds of ``number`` calls."""
    return best_time(fn, repeat, number)


def bench_dispatch() -> dict[str, float]:
    g = chain(100)
    raw = CompileOptions(optimize=False, fuse=False, use_cache=False)
    cg = Session("cpu").compile(g, raw)
    ex = cg._executor_any()
    sched = ex.schedule
    x = {"x": np.ones(4, np.float32)}
    cg.run(x)

    def loop() -> None:
        for f in sched:
            f()

    t_loop = timeit(loop)
    t_run = timeit(lambda: cg.run(x))
    t_prof = timeit(lambda: cg.run(x, profile=True), number=500)
    one = Session("cpu").compile(chain(2), raw)
    t_one = timeit(lambda: one.run(x))
    fused = Session("cpu").compile(g, CompileOptions(use_cache=False))
    t_fused = timeit(lambda: fused.run(x))
    t_one_nolock = timeit(lambda: one._run(x, False))
    return {
        "one_kernel_run_nolock_us": t_one_nolock * 1e6,
        "kernels": len(sched),
        "loop_us": t_loop * 1e6,
        "per_kernel_us": t_loop * 1e6 / len(sched),
        "run_us": t_run * 1e6,
        "one_kernel_run_us": t_one * 1e6,
        "profile_run_us": t_prof * 1e6,
        "fused_kernels": len(fused._executor_any().schedule),
        "fused_run_us": t_fused * 1e6,
    }


def bench_new_shape() -> dict[str, float]:
    out: dict[str, float] = {}
    for n_nodes in (20, 100):
        g = chain(n_nodes, ("batch", 64), name=f"sym{n_nodes}")
        cg = Session("cpu").compile(
            g, CompileOptions(optimize=False, fuse=False, use_cache=False, max_shape_plans=4096)
        )
        firsts, repeats = [], []
        for b in range(2, 202):
            x = {"x": np.ones((b, 64), np.float32)}
            t0 = time.perf_counter()
            cg.run(x)
            t1 = time.perf_counter()
            cg.run(x)
            t2 = time.perf_counter()
            firsts.append(t1 - t0)
            repeats.append(t2 - t1)
        out[f"new_shape_{n_nodes}_us"] = statistics.median(firsts) * 1e6
        out[f"same_shape_{n_nodes}_us"] = statistics.median(repeats) * 1e6
        plan_t = timeit(
            lambda g=g: __import__("rlx.backends.cpu.planner", fromlist=["x"]).plan_memory(
                g, {"batch": 7}
            ),
            number=50,
        )
        out[f"plan_only_{n_nodes}_us"] = plan_t * 1e6
    return out


def ln_chain(n: int = 50) -> Graph:
    """``n`` layer norms over f32[4, 64] (every other one on ``y + x``): one native row
    kernel each, nothing to fuse."""
    g = Graph("ln_chain")
    x = g.input("x", (4, 64))
    gamma, beta = g.param("g", (64,)), g.param("b", (64,))
    y = x
    for i in range(n):
        y = g.layer_norm(g.add(y, x) if i % 2 else y, gamma, beta, 1e-5)
    g.set_outputs([y])
    return g


def bench_native_schedule(rounds: int = 30) -> dict[str, float]:
    """``run()`` with the native schedule (consecutive native kernels as one C call) vs
    every kernel called from Python, rounds interleaved: the layer-norm chain and the
    MiniLM-sized encoder at 1 x 16 (fused attention)."""
    from rlx.backends.cpu.native.schedule import Segment
    from rlx.models import encoder, random_params

    enc = encoder(seq=16, batch=1, fused_attention=True)
    cases = {
        "ln_chain": (
            ln_chain(),
            {"g": np.ones(64, np.float32), "b": np.zeros(64, np.float32)},
            {"x": np.random.default_rng(0).random((4, 64), np.float32)},
            200,
        ),
        "encoder_1x16": (enc, random_params(enc), {"x": np.ones((1, 16, 384), np.float32)}, 20),
    }
    out: dict[str, float] = {}
    for name, (g, ps, x, number) in cases.items():
        cgs = {
            on: Session("cpu").compile(
                g, CompileOptions(use_cache=False, native_schedule=on, num_threads=1), params=ps
            )
            for on in (False, True)
        }
        for cg in cgs.values():
            cg.run(x)
        ex = cgs[True]._executor_any()
        out[f"{name}_kernels"] = len(ex.schedule)
        out[f"{name}_in_c"] = sum(len(f.kernels) for f in ex.fast if isinstance(f, Segment))
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for on, cg in cgs.items():
                t0 = time.perf_counter()
                for _ in range(number):
                    cg.run(x)
                times[on].append((time.perf_counter() - t0) / number)
        for on, key in ((False, "python"), (True, "native")):
            out[f"{name}_{key}_us"] = statistics.median(times[on]) * 1e6
            out[f"{name}_{key}_min_us"] = min(times[on]) * 1e6
    return out


def bench_one_op_peers(rounds: int = 200, number: int = 500) -> dict[str, float]:
    """Seconds per call of ``y = x + 0.5`` on f32[4] at one thread: rlx, ORT, torch eager
    (each the best of ``rounds`` interleaved rounds of ``number`` calls; a peer that is
    not installed is left out)."""
    raw = CompileOptions(optimize=False, fuse=False, use_cache=False, num_threads=1)
    one = Session("cpu").compile(chain(2), raw)
    x = np.ones(4, np.float32)
    feed = {"x": x}
    one.run(feed)
    fns: dict[str, object] = {
        "rlx run": lambda: one.run(feed),
        "rlx run, new dict + array each call": lambda: one.run({"x": x.copy()}),
        "rlx run_trusted": lambda: one.run_trusted(feed, {}),
    }
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            [helper.make_node("Add", ["x", "c"], ["y"])],
            "one_op",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
            [helper.make_tensor("c", TensorProto.FLOAT, [], [0.5])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        fns["ORT InferenceSession.run"] = lambda: sess.run(None, feed)
    except ImportError:
        pass
    try:
        import torch

        torch.set_num_threads(1)
        t = torch.from_numpy(x)
        fns["torch eager (tensor in / out)"] = lambda: t + 0.5
        fns["torch eager (NumPy in / out)"] = lambda: (torch.from_numpy(x) + 0.5).numpy()
    except ImportError:
        pass
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()  # type: ignore[operator]
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], timeit(fn, repeat=1, number=number))  # type: ignore[arg-type]
    return best


def bench_threads() -> dict[str, float]:
    n = threads.blas_info()[0]["num_threads"] if threads.blas_info() else 1

    def ctx() -> None:
        with threadpool_limits(limits=n, user_api="blas"):
            pass

    threads.ensure_blas_threads(n)
    return {
        "threadpool_limits_us": timeit(ctx, number=50) * 1e6,
        "ensure_blas_threads_us": timeit(lambda: threads.ensure_blas_threads(n)) * 1e6,
        "errstate_us": timeit(lambda: np.errstate(all="ignore").__enter__()) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(RESULTS / "BENCHMARKS_dispatch.md"))
    args = ap.parse_args()
    load = os.getloadavg()[0]
    d = bench_dispatch()
    s = bench_new_shape()
    t = bench_threads()
    ns = bench_native_schedule()
    peers = bench_one_op_peers()
    blas = threads.blas_info()
    unset = ",".join(removed_blas_pins())
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# CPU runtime dispatch benchmark",
        "",
        f"Command: `python benchmarks/dispatch.py` ({now}); numpy {np.__version__}, "
        f"python {sys.version.split()[0]}, {os.cpu_count()} logical CPUs, load average {load:.1f} "
        "at the start (a machine shared with other jobs: per-call figures are the best of 7 "
        "rounds, new-shape figures medians over 200 shapes).",
        "BLAS: "
        + "; ".join(
            f"{b['internal_api']} {b['version']} kernel {b.get('architecture')} threads {b['num_threads']}"
            for b in blas
        ),
        f"Environment: {'unset ' + unset + ' before loading NumPy' if unset else 'OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE were not set'}.",
        "",
        "## Per-kernel dispatch (100-node elementwise chain, f32[4], no fusion)",
        "",
        "| measure | value |",
        "|---|---|",
        f"| kernels in the schedule | {d['kernels']} |",
        f"| bare schedule loop | {d['loop_us']:.1f} us ({d['per_kernel_us']:.2f} us per kernel) |",
        f"| `run()` total | {d['run_us']:.1f} us |",
        f"| `run()` of a 1-kernel graph (the fixed per-run cost) | {d['one_kernel_run_us']:.1f} us |",
        f"| `run()` of the 1-kernel graph without the thread-safety lock | {d['one_kernel_run_nolock_us']:.1f} us (lock: {d['one_kernel_run_us'] - d['one_kernel_run_nolock_us']:.2f} us per run) |",
        f"| `run(profile=True)` | {d['profile_run_us']:.1f} us |",
        f"| default options (fusion on): kernels / `run()` | {d['fused_kernels']} / {d['fused_run_us']:.1f} us |",
        "",
        "## Cost of a new symbolic shape (chain on f32[batch, 64], batch 2..201)",
        "",
        "| nodes | first run at a new binding | repeated binding | plan_memory alone |",
        "|---|---|---|---|",
    ]
    for n in (20, 100):
        lines.append(
            f"| {n} | {s[f'new_shape_{n}_us']:.0f} us | {s[f'same_shape_{n}_us']:.0f} us | {s[f'plan_only_{n}_us']:.0f} us |"
        )
    lines += [
        "",
        "## Native schedule (consecutive native kernels as one C call; 30 interleaved rounds)",
        "",
        "| graph | kernels / run in C | every kernel from Python: median (min) | native schedule: median (min) |",
        "|---|---|---|---|",
        *(
            f"| {c} | {ns[c + '_kernels']:.0f} / {ns[c + '_in_c']:.0f} | "
            f"{ns[c + '_python_us']:.1f} ({ns[c + '_python_min_us']:.1f}) us | "
            f"{ns[c + '_native_us']:.1f} ({ns[c + '_native_min_us']:.1f}) us |"
            for c in ("ln_chain", "encoder_1x16")
        ),
        "",
        "## Per-call cost of a 1-op graph against its peers (`y = x + 0.5`, f32[4], 1 thread)",
        "",
        "Best of 200 interleaved rounds of 500 calls each (short rounds: on a shared machine some run undisturbed), same process.",
        "",
        "| engine | us per call | / ORT |",
        "|---|---:|---:|",
        *(
            f"| {name} | {sec * 1e6:.2f} | "
            + (
                f"{sec / peers['ORT InferenceSession.run']:.2f}"
                if "ORT InferenceSession.run" in peers
                else "-"
            )
            + " |"
            for name, sec in peers.items()
        ),
        "",
        "## Applying num_threads",
        "",
        "| way | cost per run |",
        "|---|---|",
        f"| `threadpool_limits(...)` context around each run | {t['threadpool_limits_us']:.1f} us |",
        f"| `ensure_blas_threads` (set once, re-set on change: what `run` does) | {t['ensure_blas_threads_us']:.2f} us |",
        f"| `np.errstate(all='ignore')` per run (for comparison) | {t['errstate_us']:.2f} us |",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
