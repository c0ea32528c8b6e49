/* Vector layer of the fused attention kernel (csrc/attention.c, which the loader appends
 * to this file): the SIMD width and operations of the build target, the element type of
 * q / k / v / out and its row conversions, exp, tanh and an in-register W x W transpose.
 *
 * Paths: AVX-512 (16 lanes) or AVX2+FMA (8 lanes) intrinsics when the build target
 * defines __AVX512F__ / __AVX2__, NEON (4 lanes, csrc/attention_neon.h) on aarch64,
 * else GCC vector extensions of 4 lanes (plain C); RLX_ATT_ISA says which (2 / 1 / 3 /
 * 0).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__)
#include <immintrin.h>
#define RLX_ATT_ISA 2
#define W 16
typedef __m512 vf;
typedef __m512i vi;
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, x) _mm512_storeu_ps((p), (x))
#define VSET1(x) _mm512_set1_ps(x)
#define VZERO() _mm512_setzero_ps()
#define VADD(a, b) _mm512_add_ps((a), (b))
#define VSUB(a, b) _mm512_sub_ps((a), (b))
#define VMUL(a, b) _mm512_mul_ps((a), (b))
#define VDIV(a, b) _mm512_div_ps((a), (b))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VMAX(a, b) _mm512_max_ps((a), (b))
#define VMIN(a, b) _mm512_min_ps((a), (b))
/* lanes where a < b (ordered) take y, the others x */
#define VSEL_LT(a, b, x, y) _mm512_mask_blend_ps(_mm512_cmp_ps_mask((a), (b), _CMP_LT_OQ), (x), (y))
#define VSEL_EQ(a, b, x, y) _mm512_mask_blend_ps(_mm512_cmp_ps_mask((a), (b), _CMP_EQ_OQ), (x), (y))
#define VROUND(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2I(n) /* 2^n for integral float n in [-126, 127] */ \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define QK_J 6 /* keys per QK register tile (x R row vectors) */
#define PV_D 6 /* output columns per PV register tile */
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RLX_ATT_ISA 1
#define W 8
typedef __m256 vf;
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, x) _mm256_storeu_ps((p), (x))
#define VSET1(x) _mm256_set1_ps(x)
#define VZERO() _mm256_setzero_ps()
#define VADD(a, b) _mm256_add_ps((a), (b))
#define VSUB(a, b) _mm256_sub_ps((a), (b))
#define VMUL(a, b) _mm256_mul_ps((a), (b))
#define VDIV(a, b) _mm256_div_ps((a), (b))
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VMAX(a, b) _mm256_max_ps((a), (b))
#define VMIN(a, b) _mm256_min_ps((a), (b))
#define VSEL_LT(a, b, x, y) _mm256_blendv_ps((x), (y), _mm256_cmp_ps((a), (b), _CMP_LT_OQ))
#define VSEL_EQ(a, b, x, y) _mm256_blendv_ps((x), (y), _mm256_cmp_ps((a), (b), _CMP_EQ_OQ))
#define VROUND(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2I(n) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define QK_J 3
#define PV_D 3
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include "attention_neon.h"
#else
#define RLX_ATT_ISA 0
#define W 4
typedef float vf __attribute__((vector_size(16)));
typedef int32_t vi32 __attribute__((vector_size(16)));
static inline vf vload(const float *p) { vf x; memcpy(&x, p, sizeof x); return x; }
static inline void vstore(float *p, vf x) { memcpy(p, &x, sizeof x); }
static inline vf vsel(vi32 m, vf x, vf y) { return (vf)(((vi32)y & m) | ((vi32)x & ~m)); }
static inline vf vround(vf x) { /* to nearest even, exact for |x| < 2^22 */
    const vf magic = {12582912.0f, 12582912.0f, 12582912.0f, 12582912.0f};
    return (x + magic) - magic;
}
static inline vf vpow2i(vf n) {
    vi32 e = (__builtin_convertvector(n, vi32) + 127) << 23;
    return (vf)e;
}
#define VLOAD(p) vload(p)
#define VSTORE(p, x) vstore((p), (x))
#define VSET1(x) ((vf){0, 0, 0, 0} + (x))
#define VZERO() ((vf){0, 0, 0, 0})
#define VADD(a, b) ((a) + (b))
#define VSUB(a, b) ((a) - (b))
#define VMUL(a, b) ((a) * (b))
#define VDIV(a, b) ((a) / (b))
#define VFMA(a, b, c) ((a) * (b) + (c))
/* max / min as x86's: the second operand when either is NaN */
#define VMAX(a, b) vsel((a) > (b), (b), (a))
#define VMIN(a, b) vsel((a) < (b), (b), (a))
#define VSEL_LT(a, b, x, y) vsel((a) < (b), (x), (y))
#define VSEL_EQ(a, b, x, y) vsel((a) == (b), (x), (y))
#define VROUND(x) vround(x)
#define VPOW2I(n) vpow2i(n)
#define QK_J 2
#define PV_D 2
#endif

/* element type of q, k, v and out (RLX_ATT_DT, defined by the loader): 0 f32, 1 bf16,
 * 2 f16 (F16C on the AVX2 and AVX-512 targets, FCVT on aarch64). Arithmetic is f32 throughout; bf16/f16
 * keys and values are widened one block at a time into the workspace, the output is
 * rounded to nearest even once. */
#ifndef RLX_ATT_DT
#define RLX_ATT_DT 0
#endif
#if RLX_ATT_DT == 0
typedef float elt;
static inline float ld(const elt *p) { return *p; }
static inline void st1(elt *p, float x) { *p = x; }
#elif RLX_ATT_DT == 1
typedef uint16_t elt;
static inline float ld(const elt *p) {
    uint32_t u = (uint32_t)*p << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline void st1(elt *p, float x) { /* to nearest even; NaN stays a quiet NaN */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    *p = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}
#elif RLX_ATT_DT == 2 && defined(__F16C__)
#include <immintrin.h>
typedef uint16_t elt;
static inline float ld(const elt *p) { return _cvtsh_ss(*p); }
static inline void st1(elt *p, float x) { *p = _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT); }
#elif RLX_ATT_DT == 2 && RLX_ATT_ISA == 3
typedef uint16_t elt;
static inline float ld(const elt *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}
static inline void st1(elt *p, float x) {
    __fp16 h = (__fp16)x;
    memcpy(p, &h, 2);
}
#else
#error "RLX_ATT_DT: f16 needs F16C (the AVX2 or AVX-512 target) or aarch64"
#endif

/* n elements widened to f32 / rounded from f32 (loops gcc vectorises; F16C for f16) */
static inline void load_row(float *dst, const elt *src, long n) {
    long i = 0;
#if RLX_ATT_ISA == 3 && RLX_ATT_DT == 1
    att_neon_widen_bf16(dst, src, n);
    return;
#elif RLX_ATT_ISA == 3 && RLX_ATT_DT == 2
    att_neon_widen_f16(dst, src, n);
    return;
#elif RLX_ATT_DT == 2
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = ld(src + i);
}

static inline void store_row(elt *dst, const float *src, long n) {
    long i = 0;
#if RLX_ATT_ISA == 3 && RLX_ATT_DT == 1
    att_neon_round_bf16(dst, src, n);
    return;
#elif RLX_ATT_ISA == 3 && RLX_ATT_DT == 2
    att_neon_round_f16(dst, src, n);
    return;
#elif RLX_ATT_DT == 2
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) st1(dst + i, src[i]);
}

/* exp(x) for x <= 0 or NaN (the softmax's arguments: a score minus its row's max, so
 * never positive): Cody-Waite reduction by ln 2 (fused), a degree-6 polynomial (about 1
 * ulp), NaN stays NaN, 0 below -87 (-inf included). Nothing below -87 is computed: a
 * result under FLT_MIN (a denormal, or an underflow to 0) costs a microcode assist of
 * ~100 cycles per instruction, measured as a 2x slower kernel when a quarter of the keys
 * were hidden; the exact values there (< 1.7e-38) are below what a softmax row keeps. */
static inline vf vexp(vf x) {
    const vf lo = VSET1(-87.0f);
    vf xc = VMAX(lo, x); /* NaN in x stays (second operand) */
    vf n = VROUND(VMUL(xc, VSET1(1.44269504088896341f)));
    vf r = VFMA(n, VSET1(-0.693359375f), xc);
    r = VFMA(n, VSET1(2.12194440e-4f), r);
    vf p = VSET1(1.9875691500e-4f);
    p = VFMA(p, r, VSET1(1.3981999507e-3f));
    p = VFMA(p, r, VSET1(8.3334519073e-3f));
    p = VFMA(p, r, VSET1(4.1665795894e-2f));
    p = VFMA(p, r, VSET1(1.6666665459e-1f));
    p = VFMA(p, r, VSET1(5.0000001201e-1f));
    p = VFMA(p, VMUL(r, r), VADD(r, VSET1(1.0f)));
#if RLX_ATT_ISA == 2
    /* p * 2^n where x is not below lo (NaN included), 0 elsewhere */
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), p, n);
#else
    return VSEL_LT(x, lo, VMUL(p, VPOW2I(n)), VZERO());
#endif
}

/* tanh(x) (the soft-capping of attention scores): Cephes' odd polynomial below |x| =
 * 0.625, (1 - t) / (1 + t) with t = exp(-2|x|) (vexp's domain) above, the sign put back;
 * a few ulp; +-1 beyond |x| = 43.5 (t is 0), NaN stays NaN. */
static inline vf vtanh(vf x) {
    const vf zero = VZERO(), one = VSET1(1.0f);
    vf ax = VMAX(x, VSUB(zero, x));
    vf z = VMUL(x, x);
    vf p = VSET1(-5.70498872745e-3f);
    p = VFMA(p, z, VSET1(2.06390887954e-2f));
    p = VFMA(p, z, VSET1(-5.37397155531e-2f));
    p = VFMA(p, z, VSET1(1.33314422036e-1f));
    p = VFMA(p, z, VSET1(-3.33332819422e-1f));
    vf small = VFMA(VMUL(p, z), x, x);
    vf t = vexp(VMUL(ax, VSET1(-2.0f)));
    vf big = VDIV(VSUB(one, t), VADD(one, t));
    big = VSEL_LT(x, zero, big, VSUB(zero, big));
    return VSEL_LT(ax, VSET1(0.625f), big, small);
}

/* In-register transpose of a W x W block (r[i] = row i -> r[i] = column i). */
#if RLX_ATT_ISA == 2
static inline void transpose_w(vf *r) {
    vf t[16], u[16], v[16];
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    /* u[4g + c], 128-bit lane L: column 4L + c of rows 4g..4g+3 */
    for (int g = 0; g < 4; g++) {
        u[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
        u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        v[c] = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        v[4 + c] = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
        v[8 + c] = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        v[12 + c] = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_f32x4(v[c], v[8 + c], 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(v[4 + c], v[12 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(v[c], v[8 + c], 0xDD);
        r[12 + c] = _mm512_shuffle_f32x4(v[4 + c], v[12 + c], 0xDD);
    }
}
#elif RLX_ATT_ISA == 1
static inline void transpose_w(vf *r) {
    vf t[8], u[8];
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int g = 0; g < 2; g++) {
        u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
        u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}
#elif RLX_ATT_ISA == 3
static inline void transpose_w(vf *r) { att_neon_transpose4(r); }
#else
static inline void transpose_w(vf *r) {
    float m[W][W];
    for (int i = 0; i < W; i++) VSTORE(m[i], r[i]);
    for (int i = 0; i < W; i++) {
        float c[W];
        for (int j = 0; j < W; j++) c[j] = m[j][i];
        r[i] = VLOAD(c);
    }
}
#endif
