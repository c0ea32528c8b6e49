"""Softmax / log-softmax backward: rlx's SoftmaxBackward / LogSoftmaxBackward kernels
(native C row kernel, and the NumPy kernel with native off) vs the same formula spelled
with primitive ops and compiled with fusion, vs PyTorch's own backward kernels
(``aten._softmax_backward_data`` / ``aten._log_softmax_backward_data``).

Each engine runs in its own process; rounds are interleaved (engine A, B, C, D, then
again); a figure is the best round's seconds per call (best of 50 calls per round).
Ratios are taken within this one run. Records the CPU flags, the native target and
the BLAS kernel (threadpoolctl).

Usage: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/softmax_backward.py
[--rounds 3] [--threads 1]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

SHAPES = [(128, 384), (1536, 128), (2048, 384), (512, 4096)]
# kernel closures alone (as the executor calls them) vs torch's kernel; then whole
# compiled graphs through run() (inputs copied in, output out): the op vs primitive ops
ENGINES = ["rlx-native", "rlx-numpy", "torch", "run-op", "run-primitive"]
OPS = ["softmax", "log_softmax"]


def _best(fn, number: int = 50) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def _inputs(shape: tuple[int, int], log: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    e = np.exp(x - x.max(-1, keepdims=True))
    y = e / e.sum(-1, keepdims=True)
    return rng.standard_normal(shape).astype(np.float32), (np.log(y) if log else y)


def _graph(op: str, shape: tuple[int, int], primitive: bool):
    import rlx

    g = rlx.Graph(op)
    d, y = g.input("d", shape), g.input("y", shape)
    if primitive and op == "softmax":
        out = g.mul(y, g.sub(d, g.sum(g.mul(d, y), -1, keepdims=True)))
    elif primitive:
        out = g.sub(d, g.mul(g.exp(y), g.sum(d, -1, keepdims=True)))
    else:
        out = (g.softmax_backward if op == "softmax" else g.log_softmax_backward)(d, y, -1)
    g.set_outputs([out])
    return g


def _rlx_fn(engine: str, op: str, shape: tuple[int, int], threads: int):
    import rlx
    from rlx.backends.cpu.kernels import KERNELS, KernelCtx, ScratchPool, load_kernels
    from rlx.options import CompileOptions

    dv, yv = _inputs(shape, op == "log_softmax")
    g = _graph(op, shape, engine == "run-primitive")
    if engine.startswith("run-"):
        cg = rlx.Session("cpu").compile(g, CompileOptions(num_threads=threads))
        return lambda: cg.run({"d": dv, "y": yv})
    load_kernels()
    node = g.nodes[g.outputs[0]]
    out = np.empty(shape, np.float32)
    native = engine == "rlx-native"
    ctx = KernelCtx(node, g, {}, {}, {}, ScratchPool(), num_threads=threads, native=native)
    fn = KERNELS[type(node.op)](node, [dv, yv], out, ctx)
    assert ctx.kind.value == ("native" if native else "numpy"), ctx.notes
    return fn


def _torch_fn(op: str, shape: tuple[int, int], threads: int):
    import torch

    torch.set_num_threads(threads)
    dv, yv = (torch.from_numpy(a) for a in _inputs(shape, op == "log_softmax"))
    f = (
        torch.ops.aten._softmax_backward_data
        if op == "softmax"
        else torch.ops.aten._log_softmax_backward_data
    )
    return lambda: f(dv, yv, -1, torch.float32)


def worker(engine: str, threads: int) -> None:
    out = {}
    for op in OPS:
        for shape in SHAPES:
            fn = _torch_fn(op, shape, threads) if engine == "torch" else None
            fn = fn or _rlx_fn(engine, op, shape, threads)
            out[f"{op} {shape[0]}x{shape[1]}"] = _best(fn)
    print(json.dumps(out))


def _env() -> dict[str, object]:
    from threadpoolctl import threadpool_info

    import rlx
    from rlx.backends.cpu.native import cpu

    rlx.Graph("warm")
    flags = sorted(f for f in cpu.cpu_flags() if f.startswith(("avx", "fma", "amx")))
    blas = [(i.get("internal_api"), i.get("architecture")) for i in threadpool_info()]
    return {"cpu flags": flags, "target": cpu.target_description(), "blas": blas}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--worker", choices=ENGINES)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.threads)
        return
    best: dict[str, dict[str, float]] = {e: {} for e in ENGINES}
    for _ in range(a.rounds):
        for e in ENGINES:
            cmd = [sys.executable, __file__, "--worker", e, "--threads", str(a.threads)]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)
            for k, v in res.items():
                best[e][k] = min(best[e].get(k, float("inf")), v)
    print(json.dumps(_env()))
    print(f"threads {a.threads}, best of {a.rounds} interleaved rounds, us per call")
    print(f"{'case':24s}" + "".join(f"{e:>14s}" for e in ENGINES) + "  native/torch")
    for k in best[ENGINES[0]]:
        row = "".join(f"{best[e][k] * 1e6:14.1f}" for e in ENGINES)
        print(f"{k:24s}{row}  {best['rlx-native'][k] / best['torch'][k]:11.2f}x")


if __name__ == "__main__":
    main()
