"""Low-precision CPU kernels benchmark: native bf16 GEMM vs f32 sgemm, and AMP workloads.

    python benchmarks/lowp.py [--repeat 10] [--threads 2] [--gemm-threads 1,2]
                              [--markdown benchmarks/results/BENCHMARKS_lowp.md]

Part 0, casts f32 <-> bf16 / f16 on 16 Mi elements: native vs NumPy / ml_dtypes.

Part 1, GEMM (square M = K = N in 256..2048): f32 ``np.matmul`` (OpenBLAS sgemm) against
the native bf16 GEMM of ``rlx/backends/cpu/engines/lowp_gemm.py`` with its weight packed
beforehand (``vdpbf16ps`` where the CPU has avx512_bf16, AMX tiles where it has
amx_bf16), the same including the weight packing, and the widening path CPUs without
avx512_bf16 use (native bf16 -> f32 of both operands, sgemm, native rounding), at each
of ``--gemm-threads``. Minimum over
``--repeat`` calls after one warm-up.

Part 2, end to end through ``rlx.Session``: the AMP benchmark's MLP (batch 64,
512-2048-2048-512, gelu) and 2-layer encoder (hidden 256, seq 128) under
``PrecisionPolicy.AlwaysF32`` (precision=None) and ``AutoMixedBf16``, params given at run
time or frozen, in two modes: ``fused`` (the default fusion: bf16 FusedMatMulBiasAct
nodes run ``engines.lowp_gemm.lowp_fused_matmul`` through ``kernels/fused.py``) and ``fuse=False``
(plain matmul nodes run by ``kernels/linalg.py`` / ``engines.lowp_lib``; the bf16 bias and gelu
nodes by the elementwise kernels). Variants are interleaved round by round; median and
minimum latency.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
from _common import best_time, mlp  # noqa: E402

from rlx.backends.cpu import (
    native,  # noqa: E402
    threads,  # noqa: E402
)
from rlx.backends.cpu.engines import lowp_lib as kl  # noqa: E402
from rlx.ir.mir import Graph  # noqa: E402
from rlx.models.synthetic import encoder, random_inputs, random_params  # noqa: E402
from rlx.options import CompileOptions  # noqa: E402
from rlx.passes.precision import PrecisionPolicy  # noqa: E402
from rlx.runtime.session import Session  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)


CASES: tuple[tuple[str, Callable[[], Graph]], ...] = (
    ("MLP b64 512-2048-2048-512", mlp),
    ("encoder 2L h256 seq128", lambda: encoder(layers=2, hidden=256, heads=4, ffn=1024, seq=128)),
)


def best(fn: Callable[[], object], repeat: int) -> float:
    """Seconds: the fastest of ``repeat`` single calls after a warm-up."""
    return best_time(fn, repeat, warmup=True)


def cast_rows(repeat: int, thread_counts: list[int]) -> list[str]:
    """Native conversions vs NumPy / ml_dtypes conversion loops (``np.copyto``) on 16 Mi
    elements (GB/s of bytes read + written)."""
    lib = kl.lowp_lib()
    n = 1 << 24
    x32 = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    rows = [
        "| conversion | NumPy cast (copyto) GB/s | "
        + " | ".join(f"native {t} thr. GB/s" for t in thread_counts)
        + " |",
        "|---|---|" + "---|" * len(thread_counts),
    ]
    for dt in (BF16, np.dtype(np.float16)):
        x16 = x32.astype(dt)
        for src, dst in ((x32, np.empty(n, dt)), (x16, np.empty(n, np.float32))):
            nbytes = src.nbytes + dst.nbytes
            t_np = best(lambda src=src, dst=dst: np.copyto(dst, src, casting="unsafe"), repeat)
            cells = [
                f"{nbytes / best(lambda src=src, dst=dst, t=t: lib.cast(src, dst, t), repeat) / 1e9:.1f}"
                for t in thread_counts
            ]
            rows.append(
                f"| {src.dtype.name} -> {dst.dtype.name} | {nbytes / t_np / 1e9:.1f} | "
                + " | ".join(cells)
                + " |"
            )
            print(rows[-1], flush=True)
    return rows


def gemm_row(lib: kl.LowpLib, s: int, dp: bool, repeat: int, nthreads: int) -> str:
    """One table row: square size ``s``."""
    rng = np.random.default_rng(s)
    a = rng.standard_normal((s, s)).astype(BF16)
    b = rng.standard_normal((s, s)).astype(BF16)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    o32 = np.empty((s, s), np.float32)
    o16 = np.empty((s, s), BF16)
    packed = np.empty(lib.packed_size(s, s), np.uint16)
    lib.pack_b(b, packed, nthreads)
    wa, wb, wo = (np.empty((s, s), np.float32) for _ in range(3))

    def widen() -> None:
        lib.cast(a, wa, nthreads)
        lib.cast(b, wb, nthreads)
        np.matmul(wa, wb, out=wo)
        lib.cast(wo, o16, nthreads)

    def with_pack() -> None:
        lib.pack_b(b, packed, nthreads)
        lib.gemm(a, packed, o16, nthreads)

    nan = float("nan")
    t32 = best(lambda: np.matmul(a32, b32, out=o32), repeat)
    t16 = best(lambda: lib.gemm(a, packed, o16, nthreads), repeat) if dp else nan
    tp = best(with_pack, repeat) if dp else nan
    tw = best(widen, repeat)
    fl = 2.0 * s**3
    return (
        f"| {s} | {t32 * 1e3:.2f} | {t16 * 1e3:.2f} | {tp * 1e3:.2f} | {tw * 1e3:.2f} | "
        f"{fl / t32 / 1e9:.0f} | {fl / t16 / 1e9:.0f} | {t32 / t16:.2f} | {t32 / tw:.2f} |"
    )


def gemm_rows(repeat: int, thread_counts: list[int]) -> list[str]:
    lib = kl.lowp_lib()
    dp = lib.has_dpbf16 and "avx512_bf16" in native.cpu_flags()
    rows = [
        "| threads | M=K=N | f32 sgemm ms | bf16 GEMM ms (packed) | bf16 incl. packing ms | bf16 widen+sgemm ms | f32 GFLOP/s | bf16 GFLOP/s | f32/bf16 time | f32/widen time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for nthreads in thread_counts:
        threads.ensure_blas_threads(nthreads, force=True)
        for s in (256, 512, 1024, 2048):
            rows.append(f"| {nthreads} " + gemm_row(lib, s, dp, repeat, nthreads))
            print(rows[-1], flush=True)
    return rows


MODES = (("fused", True), ("fuse=False", False))


def session_rows(repeat: int, nthreads: int) -> list[str]:
    rows = [
        "| workload | fusion | params | f32 ms (median / min) | bf16 ms (median / min) | f32/bf16 (min) | bf16 rel. err vs f32 ref | bf16 matmul kernels |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, build in CASES:
        g = build()
        ps = random_params(g)
        ins = random_inputs(g)
        ref = g.evaluate(ins, ps)[0].astype(np.float64)
        for mode, fuse in MODES:
            for freeze in (False, True):
                variants = []
                for pol in (None, PrecisionPolicy.AutoMixedBf16):
                    opts = CompileOptions(
                        precision=pol, freeze_params=freeze, fuse=fuse, num_threads=nthreads,
                        use_cache=False, verbose=False,
                    )  # fmt: skip
                    cg = Session("cpu").compile(g, opts, params=ps)
                    out = cg.run(ins)[0]
                    cg.run(ins)
                    variants.append((cg, out, []))
                for _ in range(repeat):
                    for cg, _, times in variants:
                        t = time.perf_counter()
                        cg.run(ins)
                        times.append(time.perf_counter() - t)
                (c32, _, t32), (c16, o16, t16) = variants
                err = float(np.max(np.abs(o16.astype(np.float64) - ref)) / np.max(np.abs(ref)))
                mm = sorted(
                    {
                        f"{e.op}:{e.kind.value}"
                        for e in c16.report().kernels
                        if "matmul" in e.op or e.op in ("dot_general", "attention")
                    }
                )
                rows.append(
                    f"| {name} | {mode} | {'frozen' if freeze else 'runtime'} | "
                    f"{statistics.median(t32) * 1e3:.2f} / {min(t32) * 1e3:.2f} | "
                    f"{statistics.median(t16) * 1e3:.2f} / {min(t16) * 1e3:.2f} | "
                    f"{min(t32) / min(t16):.2f} | {err:.1e} | {', '.join(mm)} |"
                )
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--gemm-threads", default="1,2", help="comma-separated thread counts for the GEMM table"
    )
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    lib = kl.lowp_lib()
    head = (
        f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; python {platform.python_version()}; "
        f"{platform.machine()}; numpy {np.__version__}; {native.gcc_version()}; threads {args.threads}; "
        f"avx512_bf16 {'avx512_bf16' in native.cpu_flags()}; library: SIMD level {lib.max_level.name}, "
        f"vdpbf16ps {lib.has_dpbf16}, AMX tiles {lib.has_amx}, OpenMP {lib.openmp}; load average before the run "
        f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (shared with other jobs)"
    )
    print(head)
    tcounts = [int(t) for t in args.gemm_threads.split(",")]
    lines = [head, "", "## Casts", ""] + cast_rows(args.repeat, tcounts)
    lines += ["", "## GEMM", ""] + gemm_rows(args.repeat, tcounts)
    lines += ["", "## End to end (Session)", ""] + session_rows(args.repeat, args.threads)
    text = "\n".join(lines)
    if args.markdown:
        args.markdown.write_text(
            "# Low-precision kernels benchmark (measured)\n\n"
            f"Command: `python benchmarks/lowp.py --repeat {args.repeat} --threads {args.threads} "
            f"--gemm-threads {args.gemm_threads} "
            f"--markdown {args.markdown}`\n\n" + text + "\n"
        )


if __name__ == "__main__":
    main()
