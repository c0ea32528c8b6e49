"""The machine's f32 FMA peak. In: a thread count. Out: :class:`Peak`: GFLOP/s, measured
with a short FMA loop built by rlx's native build (``native.build``, the selected
target's flags), and the paper estimate beside it.

Measured: each thread runs ``CHAINS`` independent FMA accumulator chains on the widest
vectors the native target has (AVX-512: 16 f32 lanes, AVX2 + FMA: 8, portable C: a scalar
multiply and add); a multiply-add counts 2 FLOPs. The loop is timed for about 20 ms a
try, best of ten tries (a busy machine only lowers a try, so the best is the closest to
the peak; on a machine shared with other jobs it can still read low). OpenMP spreads it over the
threads when gcc supports it (otherwise one thread, and the peak is scaled by the thread
count, which the result says).

Estimated: cores x GHz x FLOPs/cycle, with the clock from /proc/cpuinfo's ``cpu MHz``
(the current clock: turbo and AVX-512 down-clocking make the real one differ) and
FLOPs/cycle from the target assuming two FMA units: AVX-512 2 x 16 x 2 = 64, AVX2
2 x 8 x 2 = 32, portable (SSE2 mul + add, two units) 2 x 4 x 2 = 16.
"""

from __future__ import annotations

import ctypes
import functools
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Peak", "fma_peak", "estimated_peak", "cpu_mhz", "flops_per_cycle", "SOURCE"]

CHAINS = 12

SOURCE = r"""
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif
#define CHAINS @CHAINS@

int rlx_peak_lanes(void) {
#if defined(__AVX512F__)
    return 16;
#elif defined(__FMA__)
    return 8;
#else
    return 1;
#endif
}

/* Each thread runs `iters` rounds of CHAINS independent FMAs; returns a checksum (so
   nothing is optimised away) and the number of threads that ran in *used. */
double rlx_peak_run(int64_t iters, int nthreads, int *used) {
    double total = 0.0;
    int n = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(+ : total)
#endif
    {
#ifdef _OPENMP
#pragma omp single
        n = omp_get_num_threads();
#endif
#if defined(__AVX512F__)
        __m512 acc[CHAINS];
        const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_set1_ps(1.0f + j);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
        for (int j = 0; j < CHAINS; j++) total += _mm512_reduce_add_ps(acc[j]);
#elif defined(__FMA__)
        __m256 acc[CHAINS];
        const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm256_set1_ps(1.0f + j);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < CHAINS; j++) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
        float lanes[8];
        for (int j = 0; j < CHAINS; j++) {
            _mm256_storeu_ps(lanes, acc[j]);
            for (int l = 0; l < 8; l++) total += lanes[l];
        }
#else
        float acc[CHAINS];
        const float a = 0.999999f, b = 1e-7f;
        for (int j = 0; j < CHAINS; j++) acc[j] = 1.0f + j;
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < CHAINS; j++) acc[j] = acc[j] * a + b;
        for (int j = 0; j < CHAINS; j++) total += acc[j];
#endif
    }
    *used = n;
    return total;
}
""".replace("@CHAINS@", str(CHAINS))

#: FLOPs per cycle per core by native target, assuming two FMA units.
_PER_CYCLE = {"avx512": 64, "avx2": 32, "portable": 16}


@dataclass(frozen=True)
class Peak:
    """``gflops`` for ``threads`` threads; ``how`` says how it was obtained."""

    gflops: float
    threads: int
    measured: bool
    how: str


def cpu_mhz(cpuinfo: Path = Path("/proc/cpuinfo")) -> float | None:
    """The first ``cpu MHz`` value of /proc/cpuinfo (None when absent)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def flops_per_cycle(target: str) -> int:
    """f32 FLOPs per cycle per core for a native target name, two FMA units assumed."""
    return _PER_CYCLE.get(target, 16)


def _target() -> str:
    from rlx.backends.cpu import native

    try:
        return native.selected_target().value
    except Exception:  # an invalid RLX_ISA: the estimate falls back to portable
        return "portable"


def estimated_peak(threads: int) -> Peak | None:
    """cores x GHz x FLOPs/cycle (see the module docstring); None without a clock."""
    mhz = cpu_mhz()
    if mhz is None:
        return None
    target = _target()
    per = flops_per_cycle(target)
    g = threads * mhz / 1e3 * per
    how = (
        f"estimate: {threads} core(s) x {mhz / 1e3:.2f} GHz (/proc/cpuinfo) x {per} "
        f"FLOP/cycle ({target}, 2 FMA units assumed)"
    )
    return Peak(g, threads, False, how)


@functools.cache
def _lib() -> ctypes.CDLL:
    from rlx.backends.cpu import native

    lib = native.load(native.build(SOURCE, native.selected_target(), name="fma_peak"))
    lib.rlx_peak_run.restype = ctypes.c_double
    lib.rlx_peak_run.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.rlx_peak_lanes.restype = ctypes.c_int
    return lib


@functools.cache
def fma_peak(threads: int, tries: int = 10, seconds: float = 0.02) -> Peak:
    """The measured f32 FMA peak on ``threads`` threads (best of ``tries`` runs of about
    ``seconds``); the estimate when no native build is possible (no gcc)."""
    from rlx.backends.cpu import native
    from rlx.errors import CompileError

    if not native.available():
        est = estimated_peak(threads)
        if est is None:
            return Peak(float("nan"), threads, False, "unknown (no gcc to measure, no cpu MHz)")
        return est
    try:
        lib = _lib()
    except CompileError as e:
        est = estimated_peak(threads)
        why = f"measuring failed ({str(e).splitlines()[0]})"
        if est is None:
            return Peak(float("nan"), threads, False, why)
        return Peak(est.gflops, threads, False, f"{est.how}; {why}")
    lanes = lib.rlx_peak_lanes()
    used = ctypes.c_int(0)
    iters = 10_000
    while True:  # calibrate: about `seconds` per try
        t0 = time.perf_counter()
        lib.rlx_peak_run(iters, threads, ctypes.byref(used))
        dt = time.perf_counter() - t0
        if dt >= seconds / 4 or iters >= 1 << 34:
            break
        iters *= 4
    iters = max(1, int(iters * seconds / max(dt, 1e-6)))
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        lib.rlx_peak_run(iters, threads, ctypes.byref(used))
        best = min(best, time.perf_counter() - t0)
    ran = max(1, used.value)
    per_iter = CHAINS * lanes * 2
    g = ran * iters * per_iter / best / 1e9 * (threads / ran)
    vec = {16: "AVX-512 FMA", 8: "AVX2 FMA", 1: "scalar mul+add"}.get(lanes, f"{lanes} lanes")
    how = (
        f"measured: {CHAINS} independent {vec} chains per thread on {ran} thread(s), "
        f"best of {tries} x {best * 1e3:.0f} ms"
    )
    if ran != threads:
        how += f", scaled to {threads} threads (no OpenMP)"
    return Peak(g, threads, True, how)
