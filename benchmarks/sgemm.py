"""f32 GEMM: rlx's packed sgemm against NumPy (OpenBLAS) and PyTorch (MKL), in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/sgemm.py \\
        [--threads 1 2] [--rounds 5] [--inner 5] [--peer-python /tmp/rlx/peers/bin/python] \\
        [--shapes 1024x1024x1024 ...] [--out benchmarks/results/BENCHMARKS_sgemm.md]
    ... benchmarks/sgemm.py --encoder [--encoder-shapes 1x16 8x128 32x128] [--threads 1 2]
    ... benchmarks/sgemm.py --skinny [1 4 8 16 32 64 128] [--cold] --engines rlx rlx-avx2 numpy

Shapes are M x N x K: 1024 and 2048 square and the MiniLM encoder's 1024x384x384,
1024x1536x384 and 1024x384x1536 by default. Engines, each in its own long-lived worker
process per thread count (OMP/MKL/OpenBLAS thread variables set to it): ``rlx`` (the
selected target, AVX-512 here), ``rlx-avx2`` (RLX_ISA=avx2: the AVX2 + FMA micro-kernel),
``numpy`` (``np.matmul(a, b, out=c)``: OpenBLAS) and ``torch`` (``torch.mm(a, b, out=c)``
in ``--peer-python``: MKL). rlx's weight is packed once beforehand (as the compiled graph
does in its param prologue); the activations are packed inside the timed call. Rounds
are interleaved: each round visits every (shape, engine) once, in an order rotating with
the round; a visit is one untimed call and ``--inner`` timed calls. Reported: GFLOP/s of
the median call over all rounds (and of the best call), and % of the FMA peak measured by
``rlx.backends.cpu.native.peak`` in the same run (on the selected target for rlx, numpy
and torch; on AVX2 for rlx-avx2), before and after the rounds, the higher kept.

``--skinny``: the three MiniLM weight shapes (N x K = 384x384, 1536x384, 384x1536) at M =
1 ... 128 rows (the 1x16 forward is 36 products of M = 16). ``--cold``: each call uses
the next of a pool of distinct weights totalling twice the L3, so they stream from DRAM
as in that forward (42.5 MB of f32 weights); without it one weight per shape stays hot.

``--encoder``: the MiniLM-sized encoder of rlx.models.synthetic (6 layers, hidden 384,
ffn 1536) at each batch x seq, compiled once per shape in two worker processes per thread
count, RLX_SGEMM=blas (every f32 matmul on OpenBLAS, as before rlx's sgemm) and auto (the
recorded per-shape-class choice), rounds interleaved; ms per run.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time

WORKER = "--worker"


def _worker(engine: str, threads: int) -> None:
    """Serve ``{"shape": [m, n, k], "inner": i}`` lines with ``{"times": [...]}``."""
    import numpy as np

    rng = np.random.default_rng(0)
    cache: dict = {}
    weights: dict = {}
    if engine.startswith("encoder"):
        _encoder_worker(threads)
        return
    if engine == "torch":
        import torch

        torch.set_num_threads(threads)
    elif engine.startswith("rlx"):
        from rlx.backends.cpu.native.sgemm import sgemm_lib

        lib = sgemm_lib()
    print(json.dumps({"ready": engine}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        m, n, k = req["shape"]
        pool = int(req.get("pool", 1))  # distinct weights cycled through (cold: from DRAM)
        if (m, n, k, pool) not in cache:
            a = rng.standard_normal((m, k), dtype=np.float32)
            if (n, k, pool) not in weights:  # shared by every M (a pool of 2x the L3)
                bs = [rng.standard_normal((k, n), dtype=np.float32) for _ in range(pool)]
                weights[(n, k, pool)] = (
                    bs if engine in ("torch", "numpy") else ([lib.pack_b(b) for b in bs])
                )
                del bs
            c = np.empty((m, n), np.float32)
            fns = []
            for b in weights[(n, k, pool)]:
                if engine == "torch":
                    ta, tb, tc = (torch.from_numpy(x) for x in (a, b, c))
                    fn = lambda ta=ta, tb=tb, tc=tc: torch.mm(ta, tb, out=tc)  # noqa: E731
                elif engine == "numpy":
                    fn = lambda a=a, b=b, c=c: np.matmul(a, b, out=c)  # noqa: E731
                else:
                    p = b  # packed already
                    # the arguments converted to their ctypes once, as the compiled graph
                    # binds them (engines/sgemm.py _bound): a call of a small product is
                    # then the GEMM, not ctypes converting 16 arguments
                    f = lib.lib.rlx_sgemm
                    args = (*lib.gemm_args(a, p, c), threads)
                    conv = [None if v is None else t(v) for t, v in zip(f.argtypes, args)]
                    fn = functools.partial(f, *conv)
                    fn.keep = (a, p, c)  # type: ignore[attr-defined]  # conv holds pointers
                fns.append(fn)
            turn = [0]

            def cycle(fns=fns, turn=turn):
                turn[0] = (turn[0] + 1) % len(fns)
                fns[turn[0]]()

            cache[(m, n, k, pool)] = cycle
        fn = cache[(m, n, k, pool)]
        fn()
        times = []
        for _ in range(req["inner"]):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        print(json.dumps({"times": times}), flush=True)


def _encoder_worker(threads: int) -> None:
    """Serve ``{"shape": [batch, seq], "inner": i}`` lines: the MiniLM-sized encoder of
    rlx.models.synthetic at that shape (compiled at its first request)."""
    import rlx
    from rlx.models import synthetic

    compiled: dict = {}
    print(json.dumps({"ready": "encoder"}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        b, s = req["shape"][:2]
        if (b, s) not in compiled:
            g = synthetic.encoder(batch=b, seq=s)
            cg = rlx.Session("cpu").compile(
                g, rlx.CompileOptions(num_threads=threads), params=synthetic.random_params(g)
            )
            compiled[(b, s)] = (cg, synthetic.random_inputs(g))
        cg, feeds = compiled[(b, s)]
        cg.run(feeds)
        times = []
        for _ in range(req["inner"]):
            t0 = time.perf_counter()
            cg.run(feeds)
            times.append(time.perf_counter() - t0)
        print(json.dumps({"times": times}), flush=True)


if __name__ == "__main__" and WORKER in sys.argv:
    i = sys.argv.index(WORKER)
    _worker(sys.argv[i + 1], int(sys.argv[i + 2]))
    sys.exit(0)

import argparse  # noqa: E402
import datetime as _dt  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
from pathlib import Path  # noqa: E402

from _common import reexec_without_blas_pins, removed_blas_pins  # noqa: E402

reexec_without_blas_pins()

from threadpoolctl import threadpool_info  # noqa: E402

from rlx.backends.cpu.native import cpu  # noqa: E402
from rlx.backends.cpu.native.peak import measure_peak  # noqa: E402
from rlx.backends.cpu.native.sgemm import cache_sizes  # noqa: E402
from rlx.info import cpu_model  # noqa: E402

HERE = Path(__file__).resolve()
DEFAULT_SHAPES = [
    "1024x1024x1024",
    "2048x2048x2048",
    "1024x384x384",
    "1024x1536x384",
    "1024x384x1536",
]


class Worker:
    def __init__(self, engine: str, threads: int, python: str):
        env = dict(os.environ)
        for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[v] = str(threads)
        env["RLX_NUM_THREADS"] = str(threads)
        if engine == "rlx-avx2":
            env["RLX_ISA"] = "avx2"
        if engine.startswith("encoder"):  # encoder-blas / encoder-rlx: f32 matmuls on each
            env["RLX_SGEMM"] = "blas" if engine.endswith("blas") else "auto"
        env["PYTHONPATH"] = str(HERE.parents[1])
        self.p = subprocess.Popen(
            [python, str(HERE), WORKER, engine, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        json.loads(self.p.stdout.readline())  # type: ignore[union-attr]

    def run(self, shape: tuple[int, int, int], inner: int, pool: int = 1) -> list[float]:
        req = {"shape": shape, "inner": inner, "pool": pool}
        self.p.stdin.write(json.dumps(req) + "\n")  # type: ignore[union-attr]
        self.p.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self.p.stdout.readline())["times"]  # type: ignore[union-attr]

    def close(self) -> None:
        self.p.stdin.close()  # type: ignore[union-attr]
        self.p.wait()


def _load() -> str:
    """The 1-minute load average (the machine may be shared)."""
    return f"{os.getloadavg()[0]:.1f}"


def _blas_desc(blas: list[dict]) -> str:
    return "; ".join(
        f"{b.get('internal_api')} {b.get('version')} {b.get('architecture')}" for b in blas
    )


def _peaks(threads: list[int], targets: list[cpu.Target]) -> dict[tuple[int, cpu.Target], float]:
    return {
        (t, tg): measure_peak(t, tg, seconds=1.0, tries=50).gflops
        for t in threads
        for tg in targets
    }


def encoder_main(args: argparse.Namespace) -> None:
    """The MiniLM-sized encoder with its f32 matmuls on BLAS vs on rlx's sgemm (auto)."""
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.encoder_shapes]
    engines = ["encoder-blas", "encoder-rlx"]
    load0 = _load()
    workers = {(e, t): Worker(e, t, sys.executable) for t in args.threads for e in engines}
    times: dict[tuple, list[float]] = {}
    for r in range(args.rounds):
        for t in args.threads:
            for s in shapes:
                for e in engines[r % 2 :] + engines[: r % 2]:
                    times.setdefault((s, e, t), []).extend(workers[(e, t)].run(s, args.inner))
    for w in workers.values():
        w.close()
    lines = [
        f"## MiniLM-sized encoder (rlx.models.synthetic): BLAS vs rlx sgemm, {_dt.date.today()}",
        "",
        "Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python "
        f"benchmarks/sgemm.py {' '.join(sys.argv[1:])}`",
        "",
        f"CPU: {cpu_model()}, {cpu.target_description()}; rounds {args.rounds} x inner "
        f"{args.inner}; ms per run, median (min); RLX_SGEMM=blas vs auto; load average "
        f"before / after: {load0} / {_load()}.",
        "",
        "| batch x seq | threads | BLAS | rlx sgemm | rlx / BLAS |",
        "|---|---|---|---|---|",
    ]
    for t in args.threads:
        for s in shapes:
            med = {e: 1e3 * statistics.median(times[(s, e, t)]) for e in engines}
            low = {e: 1e3 * min(times[(s, e, t)]) for e in engines}
            cells = " | ".join(f"{med[e]:.2f} ({low[e]:.2f})" for e in engines)
            ratio = med["encoder-rlx"] / med["encoder-blas"]
            lines.append(f"| {s[0]}x{s[1]} | {t} | {cells} | {ratio:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    ap.add_argument("--engines", nargs="+", default=["rlx", "rlx-avx2", "numpy", "torch"])
    ap.add_argument("--peer-python", default="/tmp/rlx/peers/bin/python")
    ap.add_argument("--out", default=None)
    ap.add_argument("--encoder", action="store_true", help="the encoder instead of GEMMs")
    ap.add_argument("--encoder-shapes", nargs="+", default=["1x16", "8x128", "32x128"])
    ap.add_argument(
        "--skinny",
        type=int,
        nargs="*",
        default=None,
        help="the MiniLM shapes (NxK 384x384, 1536x384, 384x1536) at these M (default "
        "1 4 8 16 32 64 128) instead of --shapes",
    )
    ap.add_argument(
        "--cold",
        action="store_true",
        help="cycle each call through distinct weights totalling twice the L3 (they "
        "stream from DRAM, as in a forward whose weights exceed the L3)",
    )
    args = ap.parse_args()
    if args.encoder:
        encoder_main(args)
        return
    if args.skinny is not None:
        ms = args.skinny or [1, 4, 8, 16, 32, 64, 128]
        args.shapes = [f"{m}x{nk}" for nk in ("384x384", "1536x384", "384x1536") for m in ms]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    l3 = cache_sizes()[2]
    pools = {s: -(-2 * l3 // (4 * s[1] * s[2])) if args.cold else 1 for s in shapes}
    best_t = cpu.selected_target()
    if "rlx-avx2" in args.engines and cpu.Target.AVX2 not in cpu.runnable_targets():
        args.engines.remove("rlx-avx2")  # no AVX2 target here (aarch64)
        print("rlx-avx2: no AVX2 target on this CPU; row left out", file=sys.stderr)
    targets = [best_t] + ([cpu.Target.AVX2] if "rlx-avx2" in args.engines else [])
    load0 = _load()
    peak0 = _peaks(args.threads, targets)
    workers = {}
    for t in args.threads:
        for e in args.engines:
            py = args.peer_python if e == "torch" else sys.executable
            workers[(e, t)] = Worker(e, t, py)
    times: dict[tuple, list[float]] = {}
    visits = [(s, e, t) for t in args.threads for s in shapes for e in args.engines]
    for r in range(args.rounds):
        rot = r % len(args.engines)
        order = sorted(
            visits, key=lambda v: (v[2], v[0], (args.engines.index(v[1]) + rot) % len(args.engines))
        )
        for s, e, t in order:
            times.setdefault((s, e, t), []).extend(workers[(e, t)].run(s, args.inner, pools[s]))
    for w in workers.values():
        w.close()
    peak1 = _peaks(args.threads, targets)
    peak = {k: max(peak0[k], peak1[k]) for k in peak0}
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    lines = [
        f"## f32 GEMM: rlx sgemm vs OpenBLAS (NumPy) vs MKL (PyTorch), {_dt.date.today()}",
        "",
        "Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/sgemm.py "
        + " ".join(sys.argv[1:])
        + "`",
        "",
        f"CPU: {cpu_model()} ({platform.machine()}), {cpu.target_description()}; "
        f"flags: {' '.join(sorted(f for f in cpu.cpu_flags() if f.startswith(('avx', 'fma', 'amx'))))}",
        f"NumPy BLAS: {_blas_desc(blas)}; removed pins: {removed_blas_pins() or 'none'}",
        "FMA peak (GFLOP/s, best of before/after): "
        + ", ".join(f"{tg.value} x{t}: {v:.1f}" for (t, tg), v in sorted(peak.items(), key=str)),
        f"Rounds {args.rounds} x inner {args.inner}; GFLOP/s of the median call (best call in "
        f"brackets). Load average before / after: {load0} / {_load()}. Weights: "
        + (
            f"cold (each call the next of distinct weights totalling 2x the L3 of {l3 >> 20} MB)"
            if args.cold
            else "hot (one weight per shape)"
        )
        + ".",
        "",
        "| M x N x K | threads | "
        + " | ".join(args.engines)
        + " | rlx / best peer | rlx % peak | rlx-avx2 % AVX2 peak |",
        "|---|---|" + "---|" * len(args.engines) + "---|---|---|",
    ]
    for t in args.threads:
        for s in shapes:
            flops = 2.0 * s[0] * s[1] * s[2]
            med = {e: flops / statistics.median(times[(s, e, t)]) / 1e9 for e in args.engines}
            top = {e: flops / min(times[(s, e, t)]) / 1e9 for e in args.engines}
            peers = [med[e] for e in ("numpy", "torch") if e in med]
            ratio = med["rlx"] / max(peers) if peers and "rlx" in med else float("nan")
            pct = 100 * med.get("rlx", float("nan")) / peak[(t, best_t)]
            pct2 = (
                f"{100 * med['rlx-avx2'] / peak[(t, cpu.Target.AVX2)]:.0f} %"
                if "rlx-avx2" in med
                else "-"
            )
            cells = " | ".join(f"{med[e]:.1f} ({top[e]:.1f})" for e in args.engines)
            lines.append(
                f"| {'x'.join(map(str, s))} | {t} | {cells} | {ratio:.2f} | {pct:.0f} % | {pct2} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
