"""The C prelude of generated elementwise and row code. In: nothing. Out: the text every
generated translation unit starts with (:data:`PRELUDE`: includes and the ``static
inline`` helpers the renderers call: bf16 conversions and rounding, f64 constants, the
branch-free sigmoid / softplus / softmax exp, integer powers) and, for
``CModule(vector_math=True)``, the declarations of glibc libmvec's SIMD math
(:func:`vector_math_decls` over :data:`VECTOR_MATH`).

The text is part of every native library's cache key (``native.build`` hashes the whole
source): changing a byte of it rebuilds every cached region.
"""

from __future__ import annotations

import ctypes
import functools
import platform

__all__ = ["PRELUDE", "VECTOR_MATH", "simd_math", "vector_math_decls"]

# The sigmoid / softplus helpers are branch-free: gcc turns ``x >= 0 ? 1 / (1 + e) : e /
# (1 + e)`` (and ``(x >= 0 ? 1 : e) / (1 + e)``) into a division in each arm, which it
# cannot if-convert under -ftrapping-math, so a loop calling them ran scalar with a
# mispredicted branch per element (silu over [128,1536] f32, one thread: 1.75 ms, 85 us
# vectorised). The select is done on the bits (``rlx_self`` / ``rlx_sel``), which gcc
# leaves alone; results are those of the stable form (the reference's). softplus needs
# no NaN test: a NaN gives NaN through log1p(exp(-|x|)). ``rlx_expneg`` is the row
# softmax's exp(x - max) (codegen.rows): libmvec computes lanes outside its fast range
# (x < -87.3 for f32: masked -inf scores) with scalar calls, which made a causal
# attention's native softmax no faster than NumPy's; below -87 (f32) / -708 (f64) it
# returns 0, where exp would give at most 1.7e-38 / 3.3e-308 (subnormals included).
#
# ``rlx_f64_to_bf16`` rounds an f64 once to the nearest bf16 (ties to even). Going through
# ``(float)d`` would round twice: f32 rounds 13.90625 + 2**-30 onto the bf16 tie 13.90625,
# which then goes to the even 13.875 where 13.9375 is nearest. So it rounds to odd into
# f32 instead (truncate toward zero, set the last bit when inexact; NaN keeps NaN, a value
# beyond the f32 range becomes FLT_MAX, which rounds to inf): f32 keeps 16 more bits than
# bf16 at every exponent, subnormals included, so the final round to nearest even sees
# every tie and sticky bit of the f64. f64 -> f16 needs nothing: gcc converts a double to
# ``_Float16`` directly (vcvtsd2sh, or libgcc's __truncdfhf2), rounding once. ``rlx_f64``
# reads an f64 constant from its int64 slot (``c[k]``, see render_region).
#
# ``rlx_u64_to_bf16`` / ``rlx_i64_to_bf16`` round an integer once the same way: ``(float)i``
# would round above 2**24 (16842753 becomes the bf16 tie 16842752, then the even 16777216
# where 16908288 is nearest). They keep the top 24 bits of |i| and OR the dropped bits
# into the last (round to odd, exact in f32), so the one round to nearest even sees them.
# Integers of up to 16 bits are exact in f32 and need no helper; int -> f16 needs none
# either: f32 rounds only integers beyond 2**24, far above f16's overflow threshold 65520,
# so they become inf whichever way gcc converts.
#
# gcc 12.2 miscompiles the SLP-vectorised tail of a fully unrolled loop that rounds f64
# through f32 ((double)(float)x becomes a plain copy of x: the last 4 of 60 elements of
# tests/cpu/engines/test_region.py's f64 round trip); loop vectorisation is unaffected, so the
# generated code turns SLP off.
PRELUDE = r"""#pragma GCC optimize("no-tree-slp-vectorize")
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static inline float rlx_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t rlx_f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float rlx_round_bf16(float f) { return rlx_bf16_to_f32(rlx_f32_to_bf16(f)); }
static inline uint16_t rlx_f64_to_bf16(double d) {
    const double a = fabs(d);
    const float f = (float)a;
    uint32_t u; memcpy(&u, &f, 4);
    u -= (uint32_t)((double)f > a);
    u |= (uint32_t)((double)f != a);
    u |= (uint32_t)(signbit(d) != 0) << 31;
    float r; memcpy(&r, &u, 4);
    return rlx_f32_to_bf16(r);
}
static inline uint16_t rlx_u64_to_bf16(uint64_t m) {
    const int k = (m >> 24) ? 40 - __builtin_clzll(m) : 0;
    const uint64_t keep = (m >> k) | (uint64_t)((m & ((1ull << k) - 1u)) != 0);
    return rlx_f32_to_bf16((float)keep * (float)(1ull << k));
}
static inline uint16_t rlx_i64_to_bf16(int64_t v) {
    const uint64_t m = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    return (uint16_t)(rlx_u64_to_bf16(m) | (v < 0 ? 0x8000u : 0u));
}
static inline double rlx_f64(long bits) { double d; memcpy(&d, &bits, 8); return d; }
static inline float rlx_self(bool c, float a, float b) {
    uint32_t ua, ub, m = -(uint32_t)c; float r;
    memcpy(&ua, &a, 4); memcpy(&ub, &b, 4); ua = (ua & m) | (ub & ~m); memcpy(&r, &ua, 4);
    return r;
}
static inline double rlx_sel(bool c, double a, double b) {
    uint64_t ua, ub, m = -(uint64_t)c; double r;
    memcpy(&ua, &a, 8); memcpy(&ub, &b, 8); ua = (ua & m) | (ub & ~m); memcpy(&r, &ua, 8);
    return r;
}
static inline float rlx_sigmoidf(float x) {
    const float e = expf(-fabsf(x)); return rlx_self(x >= 0, 1.0f, e) / (1.0f + e);
}
static inline double rlx_sigmoid(double x) {
    const double e = exp(-fabs(x)); return rlx_sel(x >= 0, 1.0, e) / (1.0 + e);
}
static inline float rlx_softplusf(float x) {
    return rlx_self(x > 0, x, 0.0f) + log1pf(expf(-fabsf(x)));
}
static inline double rlx_softplus(double x) {
    return rlx_sel(x > 0, x, 0.0) + log1p(exp(-fabs(x)));
}
static inline float rlx_expnegf(float d) {
    const bool under = d < -87.0f;
    return rlx_self(under, 0.0f, expf(rlx_self(under, -87.0f, d)));
}
static inline double rlx_expneg(double d) {
    const bool under = d < -708.0;
    return rlx_sel(under, 0.0, exp(rlx_sel(under, -708.0, d)));
}
static inline int64_t rlx_ipow(int64_t a, int64_t b) {
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    uint64_t r = 1, x = (uint64_t)a;
    while (b) { if (b & 1) r *= x; x *= x; b >>= 1; }
    return (int64_t)r;
}
static inline uint64_t rlx_upow(uint64_t a, uint64_t b) {
    uint64_t r = 1;
    while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
    return r;
}
"""

# libm functions that glibc's libmvec also provides as SIMD variants (AVX-512/AVX2/SSE,
# at most 4 ulp): declared ``simd`` so gcc vectorises loops calling them
VECTOR_MATH = ("exp", "log", "log1p", "tanh", "erf", "sin", "cos", "pow")


def _advsimd_names(f: str) -> tuple[str, ...]:
    """The AdvSIMD libmvec symbols gcc calls for ``simd`` ``f`` / ``f``f on aarch64 (the
    vector function ABI: 2 x f64, 2 x f32 and 4 x f32 lanes)."""
    v = "vv" if f == "pow" else "v"
    return (f"_ZGVnN2{v}_{f}", f"_ZGVnN2{v}_{f}f", f"_ZGVnN4{v}_{f}f")


@functools.cache
def simd_math() -> tuple[str, ...]:
    """The :data:`VECTOR_MATH` functions whose SIMD variants glibc's libmvec provides
    here, with libmvec loaded ``RTLD_GLOBAL`` (``native.build`` links no extra library,
    so generated code finds them this way). x86-64: all of them when libmvec loads.
    aarch64: those whose AdvSIMD variants it exports (glibc >= 2.38 has exp, log, sin,
    cos; 2.40 all eight); the others stay scalar libm calls. Elsewhere: none."""
    machine = platform.machine()
    if machine not in ("x86_64", "aarch64"):
        return ()
    try:
        lib = ctypes.CDLL("libmvec.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return ()
    if machine == "x86_64":
        return VECTOR_MATH
    return tuple(f for f in VECTOR_MATH if all(hasattr(lib, n) for n in _advsimd_names(f)))


def vector_math_decls(functions: tuple[str, ...] | None = None) -> str:
    """Declarations marking ``functions`` (default: :func:`simd_math`, which on x86-64
    is all of :data:`VECTOR_MATH`) as having SIMD variants, f32 and f64."""
    lines = ['#define RLX_SIMD __attribute__((__simd__("notinbranch")))']
    for f in simd_math() if functions is None else functions:
        arity = 2 if f == "pow" else 1
        for t, suffix in (("float", "f"), ("double", "")):
            params = ", ".join([t] * arity)
            lines.append(f"RLX_SIMD {t} {f}{suffix}({params});")
    return "\n".join(lines) + "\n"
