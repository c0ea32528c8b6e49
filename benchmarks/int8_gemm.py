"""INT8 GEMM (rlx native kernel) vs F32 GEMM (NumPy -> OpenBLAS sgemm), in one run.

    .venv/bin/python benchmarks/int8_gemm.py [--sizes 256 512 1024 2048] [--threads 1 2]
                                             [--reps 7] [--out benchmarks/results/BENCHMARKS_int8.md]

Square M = K = N problems. F32: ``a @ b`` with BLAS limited to the thread count by
threadpoolctl. INT8: ``rlx.backends.cpu.native`` GEMM of int8 activations x packed int8
weights with the f32 epilogue (per-column scale), i.e. what a QMatMul node runs; the
weight is packed once beforehand (as at compile time), activation packing is timed.
"int8 + quantize" adds the f32 -> int8 quantization of the activations (what a graph's
quantize node costs in front of the GEMM).
Each entry is the best of ``--reps`` runs after one warm-up (the machine may be shared:
the best run is the one least disturbed by other processes, for both kernels alike). ``ratio`` = f32 time /
int8 time (> 1: int8 is faster).

OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE change which sgemm kernel OpenBLAS picks; when set,
the script unsets them, re-executes itself (OpenBLAS reads them at load time) and records
both the removed values and the BLAS kernel threadpoolctl reports.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import shlex
import sys
import time
from pathlib import Path

from _common import RESULTS, best_time, reexec_without_blas_pins, removed_blas_pins

reexec_without_blas_pins()

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

from rlx.backends.cpu import native  # noqa: E402
from rlx.info import cpu_model  # noqa: E402


def _best_time(fn, reps: int) -> float:  # noqa: ANN001
    return best_time(fn, reps, warmup=True)


def _blas_desc() -> str:
    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return (
        "; ".join(
            f"{i.get('internal_api')} {i.get('version')} kernel={i.get('architecture')} "
            f"threading={i.get('threading_layer')}"
            for i in libs
        )
        or "no BLAS found by threadpoolctl"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=str(RESULTS / "BENCHMARKS_int8.md"))
    ap.add_argument(
        "--isa",
        choices=["auto"] + [i.name.lower() for i in native.Isa],
        default="auto",
        help="int8 GEMM path (auto: the best this CPU has)",
    )
    args = ap.parse_args()

    lib = native.qgemm_lib(None if args.isa == "auto" else native.Isa[args.isa.upper()])
    rng = np.random.default_rng(0)
    rows = []
    for n in args.sizes:
        a8 = rng.integers(-128, 128, (n, n), dtype=np.int8)
        w8 = rng.integers(-128, 128, (n, n), dtype=np.int8)
        af = rng.standard_normal((n, n)).astype(np.float32)
        wf = rng.standard_normal((n, n)).astype(np.float32)
        packed = lib.pack(w8)
        scale = np.full(n, 1e-3, np.float32)
        y8 = np.empty((n, n), np.float32)
        yf = np.empty((n, n), np.float32)
        check = np.empty((n, n), np.int32)
        a8q = np.empty((n, n), np.int8)
        lib.gemm(a8, packed, n, out_i32=check, num_threads=1)
        ok = np.array_equal(check, a8.astype(np.int64) @ w8.astype(np.int64)) if n <= 1024 else None
        for th in args.threads:
            # int8 first, then a pause so idle OpenBLAS threads stop spinning before the
            # next int8 measurement (they busy-wait for a while after each sgemm)
            time.sleep(0.3)
            ti = _best_time(
                lambda: lib.gemm(a8, packed, n, out_f32=y8, scale=scale, num_threads=th),  # noqa: B023
                args.reps,
            )
            tq = _best_time(
                lambda: (  # noqa: B023
                    lib.quantize(af, 0.05, 0, a8q),  # noqa: B023
                    lib.gemm(a8q, packed, n, out_f32=y8, scale=scale, num_threads=th),  # noqa: B023
                ),
                args.reps,
            )
            with threadpool_limits(th, user_api="blas"):
                tf = _best_time(lambda: np.matmul(af, wf, out=yf), args.reps)  # noqa: B023
            flops = 2.0 * n**3
            rows.append((n, th, tf, ti, tq, flops / tf / 1e9, flops / ti / 1e9, tf / ti, ok))
            print(
                f"n={n:5d} threads={th}  f32 {flops / tf / 1e9:7.1f} GFLOP/s  "
                f"int8 {flops / ti / 1e9:7.1f} GOP/s  ratio {tf / ti:5.2f}x",
                flush=True,
            )

    target = [r for r in rows if r[0] >= 512]
    worst = min((r[7] for r in target), default=float("nan"))
    cmd = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    removed = ";".join(f"{k}={v}" for k, v in removed_blas_pins().items())
    lines = [
        "# INT8 GEMM vs F32 GEMM",
        "",
        f"- command: `{cmd}`",
        f"- date: {_dt.datetime.now(_dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}",
        f"- int8 path: {lib.isa.name} (OpenMP: {lib.openmp}), {native.gcc_version()}",
        f"- f32 path: numpy {np.__version__} matmul -> {_blas_desc()}",
        f"- BLAS env removed before loading BLAS: {removed or 'none were set'}",
        f"- timing: best of {args.reps} runs after a warm-up; ratio = f32 time / int8 time",
        f"- load average when the run ended: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs",
        "",
        "| M=K=N | threads | f32 ms | int8 ms | f32 GFLOP/s | int8 GOP/s | ratio | int8 + quantize ms | ratio incl. quantize | int8 exact |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for n, th, tf, ti, tq, gf, gi, ratio, ok in rows:
        exact = "n/a" if ok is None else ("yes" if ok else "NO")
        lines.append(
            f"| {n} | {th} | {tf * 1e3:.2f} | {ti * 1e3:.2f} | {gf:.1f} | {gi:.1f} | {ratio:.2f}x "
            f"| {tq * 1e3:.2f} | {tf / tq:.2f}x | {exact} |"
        )
    lines += [
        "",
        f"Target: int8 >= 1.5x faster than f32 at 512 and above. Worst ratio at >= 512: "
        f"{worst:.2f}x ({'met' if worst >= 1.5 else 'NOT met'}).",
        "",
        "Exactness is checked against a NumPy int64 matmul (sizes <= 1024).",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
