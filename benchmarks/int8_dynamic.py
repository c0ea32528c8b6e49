"""Dynamic INT8 linear layers (encoder shapes): rlx ``dynamic_qmatmul`` vs rlx f32 vs ONNX
Runtime's DynamicQuantizeMatMul and MatMulInteger, each engine in its own process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/int8_dynamic.py \\
        [--rounds 3] [--reps 15] [--threads 1 2] [--peer-python /tmp/rlx/peers/bin/python] \\
        [--out benchmarks/results/BENCHMARKS_int8_dynamic.md]

Problem: ``y = x @ W + b`` with ``x`` f32 ``[M, K]``, M = 1024 rows (8 sentences x 128
tokens), (K, N) in {(384, 384), (384, 1536), (1536, 384)} (all-MiniLM-L6-v2's attention
and MLP projections). Engines:

* ``rlx int8 dyn``: a compiled graph ``dynamic_qmatmul(x, W_q, w_scales, bias)`` (u8
  per-row activations, per-channel int8 weights packed at compile time), at the native ISA
  (AVX-512 VNNI here) and with ``RLX_ISA=avx2`` (the AVX2 vpmaddwd path).
* ``rlx int8 dyn (vnni, no amx)``: the same fused kernel called directly with AMX tiles
  off (vpdpbusd), where the CPU has AMX-INT8.
* ``rlx int8 gemm``: the native GEMM alone on pre-quantized u8 activations, int32 out (what
  MatMulInteger computes).
* ``rlx f32``: a compiled graph ``linear(x, W, b)`` (auto and ``RLX_ISA=avx2``; with
  ``RLX_ISA=avx2`` OpenBLAS still runs its AVX-512 kernels when the matmul takes BLAS, so
  ``(avx2, BLAS Haswell)`` also sets ``OPENBLAS_CORETYPE=Haswell`` in that worker only: the
  f32 an AVX2-only machine runs).
* ``ORT DQMatMul``: onnxruntime's com.microsoft DynamicQuantizeMatMul (u8 activations,
  per-column int8 weights, bias), one node; ``ORT MatMulInteger``: u8 x s8 -> int32.

Each (engine, threads) pair runs in a fresh process that times every shape (best of
``--reps`` after a warm-up); rounds are interleaved (engine order rotates), the figure is the
median over rounds of each process's best, ratios are taken within this one run. The
machine is shared (see the load average recorded).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from _common import RESULTS, best_time, reexec_without_blas_pins, removed_blas_pins

if "--worker" not in sys.argv:  # a worker keeps the BLAS pin its engine was given
    reexec_without_blas_pins()

SHAPES = [(1024, 384, 384), (1024, 384, 1536), (1024, 1536, 384)]
ENGINES = {
    "rlx int8 dyn": ("rlx_dyn", None),
    "rlx int8 dyn (vnni, no amx)": ("rlx_dyn_vnni", None),
    "rlx int8 dyn (avx2)": ("rlx_dyn", "avx2"),
    "rlx int8 gemm": ("rlx_gemm", None),
    "rlx int8 gemm (avx2)": ("rlx_gemm", "avx2"),
    "rlx f32": ("rlx_f32", None),
    "rlx f32 (avx2)": ("rlx_f32", "avx2"),
    "rlx f32 (avx2, BLAS Haswell)": ("rlx_f32", "avx2+haswell"),
    "ORT DQMatMul": ("ort_dq", None),
    "ORT MatMulInteger": ("ort_mmi", None),
}


def _data(m: int, k: int, n: int):  # noqa: ANN202
    import numpy as np

    rng = np.random.default_rng(k * 7 + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    ws = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    wq = np.clip(np.rint(w / ws), -128, 127).astype(np.int8)
    return x, w, b, wq, ws


def _worker(kind: str, threads: int, reps: int) -> dict[str, float]:
    import numpy as np

    out: dict[str, float] = {}
    for m, k, n in SHAPES:
        x, w, b, wq, ws = _data(m, k, n)
        fn = _engine(kind, threads, x, w, b, wq, ws)
        out[f"{m}x{k}x{n}"] = best_time(fn, reps, warmup=True)
    if kind.startswith("rlx"):
        from rlx.backends.cpu import native

        out["isa"] = native.qgemm_lib().isa.name  # type: ignore[assignment]
        out["blas"] = _blas()  # type: ignore[assignment]
    np.seterr(all="ignore")
    return out


def _engine(kind, threads, x, w, b, wq, ws):  # noqa: ANN001, ANN202
    import numpy as np

    m, k = x.shape
    n = w.shape[1]
    if kind in ("rlx_dyn", "rlx_f32"):
        import rlx
        from rlx.options import CompileOptions

        g = rlx.Graph(kind)
        xi = g.input("x", (m, k))
        bi = g.param("b", (n,))
        if kind == "rlx_dyn":
            y = g.dynamic_qmatmul(xi, g.constant(wq), ws, bias=bi, mode="u8")
            params = {"b": b}
        else:
            y = g.linear(xi, g.param("w", (k, n)), bi)
            params = {"w": w, "b": b}
        g.set_outputs([y])
        opts = CompileOptions(use_cache=False, num_threads=threads)
        c = rlx.Session("cpu").compile(g, opts, params=params)
        feeds = {"x": x}
        got = c.run(feeds)[0]
        err = float(np.abs(got - (x @ w + b)).max() / np.abs(x @ w + b).max())
        assert err < 0.05, f"{kind}: relative error {err}"
        return lambda: c.run(feeds)
    if kind == "rlx_dyn_vnni":  # the kernel alone with AMX off (the VNNI vpdpbusd path)
        from rlx.backends.cpu import native

        lib = native.qgemm_lib()
        packed = lib.pack(wq)
        y = np.empty((m, n), np.float32)
        return lambda: lib.run(
            x, packed, n, mode=1, w_scales=ws, bias=b, out_f32=y, num_threads=threads, amx=False
        )
    if kind == "rlx_gemm":
        from rlx.backends.cpu import native

        lib = native.qgemm_lib()
        a = np.random.default_rng(1).integers(0, 256, (m, k), dtype=np.uint8)
        packed = lib.pack(wq)
        c32 = np.empty((m, n), np.int32)
        return lambda: lib.run(a, packed, n, a_zero_point=128, out_i32=c32, num_threads=threads)
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    if kind == "ort_dq":
        node = helper.make_node(
            "DynamicQuantizeMatMul", ["x", "wq", "ws", "wz", "b"], ["y"], domain="com.microsoft"
        )
        inits = [
            numpy_helper.from_array(wq, "wq"),
            numpy_helper.from_array(ws, "ws"),
            numpy_helper.from_array(np.zeros(n, np.int8), "wz"),
            numpy_helper.from_array(b, "b"),
        ]
        xin = helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])
        yout = helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])
        feeds = {"x": x}
    else:
        node = helper.make_node("MatMulInteger", ["a", "wq", "az"], ["y"])
        inits = [
            numpy_helper.from_array(wq, "wq"),
            numpy_helper.from_array(np.array(128, np.uint8), "az"),
        ]
        xin = helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])
        yout = helper.make_tensor_value_info("y", TensorProto.INT32, [m, n])
        feeds = {"a": np.random.default_rng(1).integers(0, 256, (m, k), dtype=np.uint8)}
    graph = helper.make_graph([node], "g", [xin], [yout], inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(
        onnx._serialize(model) if hasattr(onnx, "_serialize") else model.SerializeToString(),
        so,
        providers=["CPUExecutionProvider"],
    )
    if kind == "ort_dq":
        got = sess.run(None, feeds)[0]
        err = float(np.abs(got - (x @ w + b)).max() / np.abs(x @ w + b).max())
        assert err < 0.05, f"ORT DynamicQuantizeMatMul: relative error {err}"
    return lambda: sess.run(None, feeds)


def _blas() -> str:
    from threadpoolctl import threadpool_info

    info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(
        f"{i['internal_api']} {i.get('version')} ({i.get('architecture')})" for i in info
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--peer-python", default="/tmp/rlx/peers/bin/python")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES))
    ap.add_argument("--out", default=str(RESULTS / "BENCHMARKS_int8_dynamic.md"))
    ap.add_argument(
        "--worker", nargs=3, metavar=("KIND", "THREADS", "REPS"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.worker:
        kind, th, reps = args.worker
        print(json.dumps(_worker(kind, int(th), int(reps))))
        return 0

    here = Path(__file__).resolve()
    results: dict[tuple[str, int], list[dict]] = {}
    names = [e for e in args.engines if e in ENGINES]
    from rlx.backends.cpu.native import cpu

    if cpu.Target.AVX2 not in cpu.runnable_targets():  # aarch64: no (avx2) rows
        names = [e for e in names if "avx2" not in e and "vnni" not in e]
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            kind, isa = ENGINES[name]
            py = args.peer_python if kind.startswith("ort") else sys.executable
            env = {k: v for k, v in os.environ.items() if k != "RLX_ISA"}
            if isa:
                env["RLX_ISA"] = isa.split("+")[0]
            if isa and isa.endswith("+haswell"):  # an AVX2 machine's OpenBLAS kernels
                env["OPENBLAS_CORETYPE"] = "Haswell"
            for th in args.threads:
                env["OMP_NUM_THREADS"] = str(th)
                cmd = [py, str(here), "--worker", kind, str(th), str(args.reps)]
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                if p.returncode != 0:
                    print(f"{name} t={th}: failed\n{p.stderr[-2000:]}", file=sys.stderr)
                    continue
                res = json.loads(p.stdout.strip().splitlines()[-1])
                results.setdefault((name, th), []).append(res)
                print(f"round {r} {name:22s} t={th} " + " ".join(
                    f"{s}={v * 1e3:.2f}ms" for s, v in res.items() if s not in ("isa", "blas")
                ), flush=True)  # fmt: skip

    import numpy as np

    def med(name: str, th: int, shape: str) -> float:
        runs = results.get((name, th), [])
        return float(np.median([r[shape] for r in runs])) if runs else float("nan")

    def best(name: str, th: int, shape: str) -> float:
        runs = results.get((name, th), [])
        return float(min(r[shape] for r in runs)) if runs else float("nan")

    from rlx.info import cpu_model

    shapes = [f"{m}x{k}x{n}" for m, k, n in SHAPES]
    isas = {n: results[(n, args.threads[0])][0].get("isa", "") for n, _ in results}
    blas = {n: results[(n, args.threads[0])][0].get("blas", "") for n, _ in results}
    lines = [
        "# Dynamic INT8 linear layers: rlx vs ONNX Runtime",
        "",
        f"- command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE {Path(sys.executable).name} "
        f"benchmarks/int8_dynamic.py {' '.join(sys.argv[1:])}`",
        f"- date: {_dt.datetime.now(_dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()}",
        f"- BLAS: {_blas()}; env removed: {removed_blas_pins() or 'none set'}",
        f"- rlx int8 paths: {isas}",
        f"- BLAS in each rlx worker: {blas}",
        f"- median over {args.rounds} interleaved rounds of each process's best of {args.reps}",
        f"- load average at the end: {os.getloadavg()[0]:.2f}",
        "",
        "| engine | threads | " + " | ".join(f"{s} ms" for s in shapes) + " |",
        "|---|---:|" + "---:|" * len(shapes),
    ]
    for name in names:
        for th in args.threads:
            lines.append(
                f"| {name} | {th} | "
                + " | ".join(f"{med(name, th, s) * 1e3:.2f}" for s in shapes)
                + " |"
            )
    lines += ["", "Best over the rounds (the least disturbed process; same layout):", ""]
    lines.append("| engine | threads | " + " | ".join(f"{s} ms" for s in shapes) + " |")
    lines.append("|---|---:|" + "---:|" * len(shapes))
    for name in names:
        for th in args.threads:
            cells = " | ".join(f"{best(name, th, s) * 1e3:.2f}" for s in shapes)
            lines.append(f"| {name} | {th} | {cells} |")
    lines += ["", "Ratios of the medians (time / time, same run):", ""]
    pairs = [
        ("rlx int8 dyn", "rlx f32"),
        ("rlx int8 dyn (vnni, no amx)", "rlx f32"),
        ("rlx int8 dyn (avx2)", "rlx f32 (avx2)"),
        ("rlx int8 dyn (avx2)", "rlx f32 (avx2, BLAS Haswell)"),
        ("rlx int8 dyn", "ORT DQMatMul"),
        ("rlx int8 dyn (avx2)", "ORT DQMatMul"),
        ("rlx int8 gemm", "ORT MatMulInteger"),
    ]
    lines.append("| ratio | threads | " + " | ".join(shapes) + " |")
    lines.append("|---|---:|" + "---:|" * len(shapes))
    for a, b in pairs:
        for th in args.threads:
            vals = [med(a, th, s) / med(b, th, s) for s in shapes]
            lines.append(f"| {a} / {b} | {th} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
