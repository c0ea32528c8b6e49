"""int8 (dynamic and static) and bf16 GEMMs against rlx's f32 sgemm on the MiniLM shapes,
under each build target (``RLX_ISA``), with the physical peaks measured in the same run.

    .venv/bin/python benchmarks/lowp_shapes.py [--targets avx2 avx512] [--threads 1]
        [--reps 15] [--int8-out benchmarks/results/BENCHMARKS_int8.md]
        [--bf16-out benchmarks/results/BENCHMARKS_lowp.md]

Each target runs in its own process (``RLX_ISA=<target>``, the libraries built for it):
peaks from ``rlx.backends.cpu.native.peak`` (f32 FMA; int8: vpdpbusd zmm with VNNI,
vpmaddwd ymm on AVX2; bf16: vdpbf16ps zmm where the target has AVX512_BF16), then per shape
M x K x N (all-MiniLM-L6-v2's projections at 16, 128 and 1024 tokens, and 1024^3), the
best of ``--reps`` calls after a warm-up of:

* f32: rlx sgemm, weight packed beforehand (``SgemmLib``);
* int8 dynamic: f32 activations quantized per row in the GEMM prologue (s8), int8 weight
  packed beforehand, f32 epilogue (``QGemmLib.bind(mode=0)``); with 8-bit weights
  ([-127, 127]) and with 7-bit weights ([-64, 64], the range the AVX2 vpmaddubsw kernel
  takes exactly);
* int8 static: int8 activations (``a_kind`` int8) with the same epilogue;
* bf16: the kernel a compiled bf16 matmul with a constant weight runs
  (``engines.lowp_gemm.lowp_matmul``: vdpbf16ps / AMX, or f32 weight panels on rlx sgemm
  without avx512_bf16), and, without avx512_bf16, the path it replaces (native widening
  of both operands, NumPy / OpenBLAS sgemm, native rounding).

GOP/s counts a multiply-add as 2 ops; "% peak" is against the peak of the instruction the
kernel multiplies with (bf16 without a bf16 instruction: the FMA peak); "vs f32" is f32
time / kernel time (> 1: faster than f32). Exactness of the int8 results against a NumPy
int64 product of the same quantized operands is checked once per shape.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from _common import RESULTS, best_time

SHAPES = (
    (16, 384, 384),
    (16, 384, 1536),
    (16, 1536, 384),
    (128, 384, 1536),
    (1024, 384, 1536),
    (1024, 1536, 384),
    (1024, 1024, 1024),
)


def _child(threads: int, reps: int) -> dict:
    import ml_dtypes
    import numpy as np

    from rlx.backends.cpu import native
    from rlx.backends.cpu.dispatch import KernelCtx, ScratchPool
    from rlx.backends.cpu.engines import lowp_gemm as klg
    from rlx.backends.cpu.engines import lowp_lib as kl
    from rlx.backends.cpu.native.sgemm import sgemm_lib

    bf16 = np.dtype(ml_dtypes.bfloat16)
    before = _peaks(threads)
    q = native.qgemm_lib()
    sg = sgemm_lib()
    lowp = kl.lowp_lib()
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
        out = np.empty((m, n), np.float32)
        packed_f = sg.pack_b(w)
        args = sg.gemm_args(a, packed_f, out)
        f32 = best_time(lambda: sg.lib.rlx_sgemm(*args, threads), reps, warmup=True)  # noqa: B023
        ws = np.full(n, 1e-3, np.float32)
        times = {}
        exact = True
        for label, lim in (("8", 127), ("7", 64)):
            w8 = rng.integers(-lim, lim + 1, (k, n), dtype=np.int8)
            pw = q.pack(w8)
            acc = np.empty((m, n), np.int32)
            dyn = q.bind(a, n, mode=0, w_scales=ws, out_f32=out, num_threads=threads)
            times[f"dyn{label}"] = best_time(lambda: dyn(pw), reps, warmup=True)  # noqa: B023
            a8 = rng.integers(-128, 128, (m, k), dtype=np.int8)
            st = q.bind(a8, n, a_scale=0.05, w_scales=ws, out_f32=out, num_threads=threads)
            times[f"st{label}"] = best_time(lambda: st(pw), reps, warmup=True)  # noqa: B023
            q.bind(a8, n, a_zero_point=3, out_i32=acc, num_threads=threads)(pw)
            exact &= bool(np.array_equal(acc, (a8.astype(np.int64) - 3) @ w8.astype(np.int64)))
            qa, _, _ = q.quantize_rows(a)
            q.bind(a, n, mode=0, out_i32=acc, num_threads=threads)(pw)
            exact &= bool(np.array_equal(acc, qa.astype(np.int64) @ w8.astype(np.int64)))
        ab, wb = a.astype(bf16), w.astype(bf16)
        ob = np.empty((m, n), bf16)
        ctx = KernelCtx(None, None, {}, {}, {}, ScratchPool(), num_threads=threads)  # type: ignore[arg-type]
        kern = klg.lowp_matmul(None, ab, wb, ob, ctx, b_constant=True)  # type: ignore[arg-type]
        assert kern is not None
        tb = best_time(kern, reps, warmup=True)
        told = None
        if kl.gemm_path(bf16, lowp) is kl.GemmPath.CONVERT:
            told = best_time(_old_convert(lowp, ab, wb, ob, threads), reps, warmup=True)
        rows.append(
            {"shape": [m, k, n], "f32": f32, "bf16": tb, "bf16_old": told, "exact": exact} | times
        )
    # the best of the peaks measured before and after the GEMMs (a busy machine only
    # lowers a measurement)
    fma, p8, p16w, p16 = (
        max(x, y, key=lambda p: getattr(p, "gflops", 0.0) or getattr(p, "gops", 0.0))
        for x, y in zip(before, _peaks(threads), strict=True)
    )
    return {
        "target": native.target_description(),
        "int8_isa": q.isa.name,
        "sgemm": sg.label,
        "bf16_note": " ".join(ctx.notes),
        "fma": fma.gflops,
        "int8_peak": p8.gops,
        "int8_instr": p8.instruction,
        "int16_peak": p16w.gops,
        "int16_instr": p16w.instruction,
        "bf16_peak": p16.gops,
        "bf16_instr": p16.instruction,
        "rows": rows,
    }


def _old_convert(lowp, ab, wb, ob, threads):  # noqa: ANN001, ANN202
    """The bf16 path CPUs without avx512_bf16 took before the f32 panels: native widening
    of the activations, NumPy / OpenBLAS f32 matmul against the widened weight, native
    rounding."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    a32 = np.empty(ab.shape, np.float32)
    w32 = wb.astype(np.float32)
    o32 = np.empty(ob.shape, np.float32)

    def old() -> None:
        lowp.cast(ab, a32, threads)
        with threadpool_limits(threads, user_api="blas"):
            np.matmul(a32, w32, out=o32)
        lowp.cast(o32, ob, threads)

    return old


def _peaks(threads: int) -> tuple:
    """(FMA, int8, int16, bf16) peak measurements, each the best of 60 short tries."""
    from rlx.backends.cpu.native.peak import PeakKind, measure_lowp_peak, measure_peak

    kinds = (PeakKind.INT8, PeakKind.INT16, PeakKind.BF16)
    return (
        measure_peak(threads, seconds=0.3, tries=60),
        *(measure_lowp_peak(k, threads, seconds=0.3, tries=60) for k in kinds),
    )


def _pct(gops: float, peak: float) -> str:
    return f"{100 * gops / peak:.0f} %" if peak > 0 else "n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", nargs="+", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--int8-out", default=str(RESULTS / "BENCHMARKS_int8.md"))
    ap.add_argument("--bf16-out", default=str(RESULTS / "BENCHMARKS_lowp.md"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.threads, args.reps)))
        return 0
    from rlx.backends.cpu import native
    from rlx.info import cpu_model

    targets = args.targets or [
        t.value for t in native.runnable_targets() if t is not native.Target.PORTABLE
    ]
    runs = []
    for t in targets:
        env = dict(os.environ, RLX_ISA=t)
        cmd = [sys.executable, __file__, "--child", "--threads", str(args.threads)]
        cmd += ["--reps", str(args.reps)]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        runs.append((t, json.loads(res.stdout.strip().splitlines()[-1])))
        print(f"{t}: done", flush=True)
    cmd = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    head = [
        f"- command: `{cmd}`",
        f"- date: {_dt.datetime.now(_dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()} "
        f"{platform.release()}",
        f"- threads: {args.threads}; timing: best of {args.reps} calls after a warm-up",
        f"- load average when the run ended: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}"
        f" (1 / 5 / 15 min), {os.cpu_count()} CPUs shared with other jobs",
        "",
    ]
    i8 = ["## INT8 GEMMs on the MiniLM shapes, per build target", "", *head]
    b16 = ["## bf16 GEMM on the MiniLM shapes, per build target", "", *head]
    for t, r in runs:
        fma, p8, p16 = r["fma"], r["int8_peak"], r["bf16_peak"]
        avx2 = r["int8_isa"] == "AVX2"  # 8-bit weights: the vpmaddwd kernel
        peak_of = {"8": r["int16_peak"] if avx2 else p8, "7": p8}
        i8 += [
            f"### RLX_ISA={t}: {r['target']}",
            "",
            f"Peaks (same run, best of before and after): f32 FMA {fma:.1f} GFLOP/s; int8 "
            f"{r['int8_instr']} {p8:.1f} GOP/s ({p8 / fma:.2f}x the FMA peak)"
            + (
                f"; {r['int16_instr']} {r['int16_peak']:.1f} GOP/s ({r['int16_peak'] / fma:.2f}x)"
                if avx2
                else ""
            )
            + f". int8 path {r['int8_isa']}"
            + (
                " (7-bit weights: vpmaddubsw + vpmaddwd kernel, % of that peak; 8-bit: "
                "vpmaddwd kernel, % of the vpmaddwd peak)"
                if avx2
                else ""
            )
            + f"; f32: {r['sgemm']}.",
            "",
            "| M x K x N | f32 GFLOP/s (% FMA) | dynamic, 8-bit w: GOP/s (% int8 peak, vs f32) "
            "| dynamic, 7-bit w | static, 8-bit w | static, 7-bit w | exact |",
            "|---|---:|---:|---:|---:|---:|:---:|",
        ]
        b16 += [
            f"### RLX_ISA={t}: {r['target']}",
            "",
            f"Peaks (same run): f32 FMA {fma:.1f} GFLOP/s; bf16 "
            + (f"{r['bf16_instr']} {p16:.1f} GFLOP/s" if p16 > 0 else "none (no AVX512_BF16)")
            + f". bf16 kernel: {r['bf16_note']}.",
            "",
            "| M x K x N | f32 GFLOP/s (% FMA) | bf16 GFLOP/s (% peak) | bf16 vs f32 "
            "| before: widen + OpenBLAS, vs f32 |",
            "|---|---:|---:|---:|---:|",
        ]
        for row in r["rows"]:
            m, k, n = row["shape"]
            ops = 2.0 * m * k * n
            gf = ops / row["f32"] / 1e9
            cells = []
            for key in ("dyn8", "dyn7", "st8", "st7"):
                g = ops / row[key] / 1e9
                pk = peak_of[key[-1]]
                cells.append(f"{g:.1f} ({_pct(g, pk)}, {row['f32'] / row[key]:.2f}x)")
            i8.append(
                f"| {m}x{k}x{n} | {gf:.1f} ({_pct(gf, fma)}) | {' | '.join(cells)} "
                f"| {'yes' if row['exact'] else 'NO'} |"
            )
            gb = ops / row["bf16"] / 1e9
            old = f"{row['f32'] / row['bf16_old']:.2f}x" if row["bf16_old"] is not None else "n/a"
            b16.append(
                f"| {m}x{k}x{n} | {gf:.1f} ({_pct(gf, fma)}) | {gb:.1f} "
                f"({_pct(gb, p16 if p16 > 0 else fma)}) | {row['f32'] / row['bf16']:.2f}x | {old} |"
            )
        i8.append("")
        b16.append("")
    i8 += [
        "Kernels: on AVX2 the int8 GEMM takes a weight whose values all lie in [-64, 64] "
        "(7-bit, as ONNX Runtime's quantize_dynamic(reduce_range=True)) on vpmaddubsw + "
        "vpmaddwd (u8 x s8, a pair sum at most 2 * 255 * 64 = 32640: no saturation), any other "
        "8-bit weight on vpmaddwd over s16 k pairs; both exact (the `exact` column: int32 "
        "against NumPy int64 on the same quantized operands). rlx.quantize writes 7-bit "
        "weights by default where the int8 GEMM is the AVX2 one (reduce_range=None: auto; "
        "True / False force it; docs/bench.md), 8-bit ones elsewhere. Shapes of a few tens of microseconds and the "
        "1024-row shape (tens of milliseconds per call) are the most sensitive to the "
        "machine's load: compare ratios within one row.",
        "",
    ]
    b16 += [
        "Without avx512_bf16 a bf16 matmul whose weight does not change between runs widens "
        "that weight to f32 and packs it into rlx sgemm panels once (compile time, or once "
        "per param change); each run widens the activations, runs the f32 sgemm into f32 "
        "scratch and rounds it natively: the f32 product plus the widening of the "
        "activations and the rounding of the result (callgrind at 16x384x384: 784k "
        "instructions per product against 765k for f32). The `before` column is the path it replaces (both operands widened per "
        "run, NumPy / OpenBLAS matmul, rounding pass).",
        "",
    ]
    for path, lines in ((args.int8_out, i8), (args.bf16_out, b16)):
        p = Path(path)
        text = p.read_text() if p.exists() else ""
        marker = lines[0]
        if marker in text:
            text = text[: text.index(marker)].rstrip() + "\n"
        p.write_text(text.rstrip() + "\n\n" + "\n".join(lines))
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
