/* INT8 GEMM for rlx with a fused f32 epilogue.
 *
 *   acc[m, n] = sum_k (q[m, k] - zp[m]) * B[k, n]                        (exact int32)
 *   Y[m, n]   = act((float)acc * (rs[m] * ws[n]) + bias[n]) + R[m, n]
 *
 * Activations (a_kind): int8 or uint8 with one zero point and scale (static); f32 / bf16
 * rows quantized here with that one scale and zero point (mode 2: to int8, 3: to uint8, as
 * the quantize op); or f32 / bf16 rows quantized per row at run time (dynamic: mode 0 = s8
 * symmetric, scale =
 * max|x| / 127; mode 1 = u8 asymmetric, scale = (max(0, max x) - min(0, min x)) / 255,
 * zp = clip(rint(-min / scale), 0, 255)); q = clip(rint(x / scale) + zp, qmin, qmax), a
 * zero row takes scale 1, a row with NaN / inf scale NaN (NaN outputs). Every step is the
 * f32 operation of rlx.ops.qmatmul.dynamic_quantize_rows, so q is bit for bit the same.
 *
 * B: int8, packed once by rlx_qgemm_pack_b into NR-column panels of KG-deep k groups:
 *      Bp[panel][k / KG][NR][KG]   (KG consecutive k of one column side by side)
 *    plus colsum[n] = sum_k B[k, n] (the zero-point / shift correction).
 *
 * Three paths, chosen at compile time by RLX_ISA (the loader picks the best one the selected
 * build target holds; a path the target's -march flags lack is a compile error):
 *
 *   2  AVX-512 VNNI: vpdpbusd (u8 x s8 -> s32, groups of KG = 4). Signed activations are
 *      shifted to u8 by adding 128, so the raw sum is sum_k (q + 128) * b and the exact
 *      result is raw - (128 + zp) * colsum[n]. Tile MR x NR = 12 x 32 in 24 zmm (8-, 4- and
 *      2-row variants for a last row tile that short: M = 16 runs 12 + 4). On a CPU
 *      with AMX-INT8 (and K a multiple of 64) the same sums come from tdpbusd tiles of
 *      32 x 32 (see amx_run), about twice the vpdpbusd rate.
 *   1  AVX2: two exact micro-kernels, tile 6 x 16, chosen per weight by
 *      rlx_qgemm_pack_b (which records the choice in a 64-byte trailer after the panels):
 *      a) 7-bit weights (every B in [-64, 64]): the VNNI layout (KG = 4, u8 activations
 *         shifted as on path 2, s8 B) and vpmaddubsw (u8 x s8, adjacent pairs summed to
 *         s16) + vpmaddwd by ones (s16 pairs to s32) + vpaddd: 32 multiply-adds per
 *         vpmaddwd, half the bytes of b). Exact: a pair sums to at most
 *         2 * 255 * 64 = 32640 < 32767, so vpmaddubsw never saturates (MLAS's U8S8
 *         kernel with reduce_range weights, ONNX Runtime's quantize_dynamic(reduce_range)).
 *      b) any other 8-bit weights: B packed as s16 k pairs (Bp[panel][k / 2][NR][2]),
 *         activations as s16 pairs (the same shifted values), vpmaddwd on s16 pairs:
 *         exact for every operand (a pair sums to at most 2 * 255 * 128 < 2**31); 16
 *         multiply-adds per vpmaddwd. The packed size is that of b for both (K rounded
 *         to 4). (vpmaddubsw on full 8-bit weights would saturate at 32767 for u8 255 x
 *         s8 -128 pairs: nothing on AVX2 multiplies them faster exactly.)
 *      Both have 4- and 2-row variants for a last row tile that short (M = 16: 6 + 6 + 4
 *      rows, no work on zero rows).
 *   0  plain C: the VNNI data layout with scalar code (auto-vectorised by gcc).
 *   3, 4, 5  aarch64 NEON (SMULL + SADALP), SDOT and SMMLA: see qgemm_neon.h (activations
 *      packed as signed bytes there, S_SHIFT 0 and U_SHIFT -128; SMMLA packs KG = 8).
 *
 * Prologue: each row of A is quantized (dynamic: its scale from one pass over the row,
 * then the quantization) or shifted (static s8) straight into its place in the packed
 * tile, with no row buffer, copy or memset; no separate quantize pass over A.
 * The epilogue runs on each MR x NR tile right after its last K slice, while it is in L1,
 * in SIMD registers (16 lanes on path 2, 8 on path 1; exp / erf by polynomials, see vexp;
 * a full panel's column sums, scales and bias loaded once per tile), scalar libm on path
 * 0.
 * Source: this file (types, packing, row quantization), qgemm_kernels.c (the
 * micro-kernels), qgemm_epilogue.c (the epilogue) and qgemm_run.c (AMX, entry points),
 * joined in that order by native/qgemm.py into one translation unit.
 *
 * Blocking: M in blocks of row tiles whose packed A stays in L2; for each NR-column panel
 * of packed B, K in slices that stay in L1 while every row tile of the block uses them.
 * Measured on the AVX2 path (Sapphire Rapids, 1024 x 384 x N): the earlier order (A tile
 * in L1, B blocks from L2) ran N = 1536 at 24 GMAC/s against 64 at N = 384.
 * Threads (OpenMP, num_threads from the caller): the row tiles are quantized / packed in
 * parallel, then the tiles of each N block are shared out.
 */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#ifndef RLX_ISA
#define RLX_ISA 0
#endif
#if RLX_ISA == 2 && !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__))
#error "RLX_ISA=2 (VNNI512) needs the AVX512 target with VNNI (-mavx512vnni)"
#endif
#if RLX_ISA == 1 && !defined(__AVX2__)
#error "RLX_ISA=1 (AVX2) needs the AVX2 or AVX512 target"
#endif
#if RLX_ISA >= 3 && !(defined(__aarch64__) && defined(__ARM_NEON))
#error "RLX_ISA=3..5 (NEON, SDOT, SMMLA) need an aarch64 target"
#endif
#if RLX_ISA == 1 || RLX_ISA == 2
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#if RLX_ISA == 1
#define MR 6
#define NR 16
#define KG 4
#define S_SHIFT 128 /* what is added to a signed activation */
#define B_TRAILER 64 /* bytes after the panels: byte 0 = 1 when every weight is 7-bit */
typedef uint8_t a_t; /* packed activation element (kernel b packs them as int16_t) */
typedef int8_t b_t;  /* packed weight element */
#elif RLX_ISA >= 3 && defined(__aarch64__) && defined(__ARM_NEON)
#include "qgemm_neon.h"
#else
#define MR 12
#define NR 32
#define KG 4
#define S_SHIFT 128
typedef uint8_t a_t;
typedef int8_t b_t;
#endif
#ifndef U_SHIFT
#define U_SHIFT 0 /* what is added to an unsigned activation */
#endif
#ifndef B_TRAILER
#define B_TRAILER 0
#endif
#define A_BLOCK_BYTES (256L * 1024L) /* packed A per M block: kept in L2 */
#define KC_BYTES (16L * 1024L)       /* packed B slice per K block: kept in L1 */

enum { A_S8 = 0, A_U8 = 1, A_F32 = 2, A_BF16 = 3 };
enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2, ACT_GELU_TANH = 3, ACT_SILU = 4 };

static inline long round_up(long v, long m) { return (v + m - 1) / m * m; }

int rlx_qgemm_isa(void) { return RLX_ISA; }
int rlx_qgemm_mr(void) { return MR; }
int rlx_qgemm_nr(void) { return NR; }

int rlx_qgemm_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* Bytes needed for the packed form of a K x N weight. */
long rlx_qgemm_packed_size(long K, long N) {
#if RLX_ISA == 1
    return round_up(K, KG) * round_up(N, NR) * (long)sizeof(int16_t) + B_TRAILER;
#else
    return round_up(K, KG) * round_up(N, NR) * (long)sizeof(b_t);
#endif
}

/* 1 when the packed weight takes the 7-bit kernel (path 1 only: every weight in
 * [-64, 64]), else 0. */
int rlx_qgemm_packed_narrow(const void *Bp, long K, long N) {
#if B_TRAILER
    return ((const uint8_t *)Bp)[rlx_qgemm_packed_size(K, N) - B_TRAILER];
#else
    (void)Bp, (void)K, (void)N;
    return 0;
#endif
}

/* Pack B (element [k, n] at B[k * sk + n * sn]) into Bp and fill colsum[N]. */
void rlx_qgemm_pack_b_strided(const int8_t *B, long sk, long sn, long K, long N, void *Bp_,
                              int32_t *colsum) {
    b_t *Bp = (b_t *)Bp_;
    long kp = round_up(K, KG);
    memset(Bp_, 0, (size_t)rlx_qgemm_packed_size(K, N));
    int narrow = 1;
#if RLX_ISA == 1
    for (long k = 0; k < K && narrow; ++k)
        for (long n = 0; n < N; ++n) {
            int8_t v = B[k * sk + n * sn];
            narrow &= v >= -64 && v <= 64;
        }
    ((uint8_t *)Bp_)[rlx_qgemm_packed_size(K, N) - B_TRAILER] = (uint8_t)narrow;
#endif
    for (long n = 0; n < N; ++n) {
        b_t *dst = Bp + (n / NR) * kp * NR + (n % NR) * KG;
        int16_t *dw = (int16_t *)Bp_ + (n / NR) * kp * NR + (n % NR) * 2;
        int32_t s = 0;
        for (long k = 0; k < K; ++k) {
            int8_t v = B[k * sk + n * sn];
            if (narrow)
                dst[(k / KG) * NR * KG + (k % KG)] = (b_t)v;
            else /* path 1 kernel b: s16 k pairs */
                dw[(k / 2) * NR * 2 + (k % 2)] = v;
            s += v;
        }
        colsum[n] = s;
    }
}

/* Pack B [K, N] (row stride ldb). */
void rlx_qgemm_pack_b(const int8_t *B, long ldb, long K, long N, void *Bp_, int32_t *colsum) {
    rlx_qgemm_pack_b_strided(B, ldb, 1, K, N, Bp_, colsum);
}

/* ---- activation rows: quantization and packing ------------------------------------- */
/* A packed row is a sequence of 4-byte groups (KG = 4 consecutive k); group g of a row
 * goes to out + g * qs bytes (qs = 4: contiguous; MR * KG: the row's place in a packed
 * tile, so a row is quantized straight into the tile, with no copy and no memset). */

static inline int32_t load4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline void put4(a_t *out, long g, long qs, uint32_t v) { memcpy(out + g * qs, &v, 4); }

/* The KG bytes at src, each XOR flip, as group g of a packed row (put4 when KG = 4) */
static inline void put_group(a_t *out, long g, long qs, const uint8_t *src, uint32_t flip) {
    for (int j = 0; j < KG; j += 4) {
        uint32_t v = (uint32_t)load4(src + j) ^ flip;
        memcpy(out + g * qs + j, &v, 4);
    }
}

/* Group g of a packed row set to zeros */
static inline void zero_group(a_t *out, long g, long qs) {
#if KG == 4
    put4(out, g, qs, 0);
#else
    memset(out + g * qs, 0, KG);
#endif
}

#if RLX_ISA == 0
/* lo = min, hi = max of x[0..K); returns 1 when the row holds NaN or +-inf. */
static int row_stats(const float *x, long K, float *lo_, float *hi_) {
    float lo = INFINITY, hi = -INFINITY, bad = 0.0f;
    for (long k = 0; k < K; ++k) {
        float v = x[k];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        bad += v * 0.0f;
    }
    if (K == 0) lo = hi = 0.0f;
    *lo_ = lo;
    *hi_ = hi;
    return bad != 0.0f;
}
#endif

#if RLX_ISA == 2
/* row_stats for path 2 in one pass of 16 lanes (the tail through a masked load: its zero
 * lanes change neither max |x| nor the u8 range, which always holds 0). mode 0 needs only
 * max |x|: the largest of the sign-cleared bit patterns, an integer max (a pattern at or
 * above that of +inf is an inf or a NaN); mode 1 takes min and max as well. */
static int row_stats16(const float *x, long K, int mode, float *lo_, float *hi_) {
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    __m512i amax = _mm512_setzero_si512();
    __m512 vlo = _mm512_setzero_ps(), vhi = _mm512_setzero_ps();
    for (long k = 0; k < K; k += 16) {
        __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + k);
        amax = _mm512_max_epu32(amax, _mm512_and_si512(_mm512_castps_si512(v), absmask));
        if (mode) {
            vlo = _mm512_min_ps(vlo, v);
            vhi = _mm512_max_ps(vhi, v);
        }
    }
    uint32_t bits = (uint32_t)_mm512_reduce_max_epu32(amax);
    if (mode) {
        *lo_ = _mm512_reduce_min_ps(vlo);
        *hi_ = _mm512_reduce_max_ps(vhi);
    } else {
        float a;
        memcpy(&a, &bits, 4);
        *lo_ = -a;
        *hi_ = a;
    }
    return bits >= 0x7f800000u;
}

/* quantize_row for a dynamic row (finite, |x / scale| <= 255: mode 0 s8 shifted by 128,
 * mode 1 u8 with zero point zp) on path 2: cvtps2dq rounds half to even as rint does, the
 * saturating narrowings clip, so q is the same integer with less work per lane. */
static void quantize_row_dyn(const float *x, long K, float scale, int32_t zp, int mode,
                             a_t *out, long qs) {
    const __m512 vs = _mm512_set1_ps(scale);
    const __m512i vz = _mm512_set1_epi32(zp), zero = _mm512_setzero_si512();
    const __m128i flip = _mm_set1_epi8((char)0x80);
    for (long k = 0; k < K; k += 16) {
        long n = K - k < 16 ? K - k : 16;
        __mmask16 m = n == 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
        __m512i v = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_maskz_loadu_ps(m, x + k), vs));
        __m128i b = mode == 0
                        ? _mm_xor_si128(_mm512_cvtsepi32_epi8(v), flip)
                        : _mm512_cvtusepi32_epi8(_mm512_max_epi32(_mm512_add_epi32(v, vz), zero));
        b = _mm_maskz_mov_epi8(m, b); /* the last group's padding stays 0 */
        put4(out, k / 4, qs, (uint32_t)_mm_cvtsi128_si32(b));
        if (n > 4) put4(out, k / 4 + 1, qs, (uint32_t)_mm_extract_epi32(b, 1));
        if (n > 8) put4(out, k / 4 + 2, qs, (uint32_t)_mm_extract_epi32(b, 2));
        if (n > 12) put4(out, k / 4 + 3, qs, (uint32_t)_mm_extract_epi32(b, 3));
    }
}
#elif RLX_ISA == 1
/* The same two functions on 8 lanes (path 1), the tail in scalar code. */
static int row_stats16(const float *x, long K, int mode, float *lo_, float *hi_) {
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    __m256i amax = _mm256_setzero_si256();
    __m256 vlo = _mm256_setzero_ps(), vhi = _mm256_setzero_ps();
    long k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 v = _mm256_loadu_ps(x + k);
        amax = _mm256_max_epu32(amax, _mm256_and_si256(_mm256_castps_si256(v), absmask));
        if (mode) {
            vlo = _mm256_min_ps(vlo, v);
            vhi = _mm256_max_ps(vhi, v);
        }
    }
    uint32_t t[8], bits = 0;
    float lo = 0.0f, hi = 0.0f, f[8];
    _mm256_storeu_si256((__m256i *)t, amax);
    _mm256_storeu_ps(f, vlo);
    for (int i = 0; i < 8; ++i) bits = t[i] > bits ? t[i] : bits, lo = f[i] < lo ? f[i] : lo;
    _mm256_storeu_ps(f, vhi);
    for (int i = 0; i < 8; ++i) hi = f[i] > hi ? f[i] : hi;
    for (; k < K; ++k) {
        uint32_t u;
        memcpy(&u, x + k, 4);
        u &= 0x7fffffffu;
        bits = u > bits ? u : bits;
        lo = x[k] < lo ? x[k] : lo;
        hi = x[k] > hi ? x[k] : hi;
    }
    if (!mode) {
        float a;
        memcpy(&a, &bits, 4);
        lo = -a, hi = a;
    }
    *lo_ = lo;
    *hi_ = hi;
    return bits >= 0x7f800000u;
}

static void quantize_row_dyn(const float *x, long K, float scale, int32_t zp, int mode,
                             a_t *out, long qs) {
    const __m256 vs = _mm256_set1_ps(scale);
    const __m128i vz = _mm_set1_epi32(zp), flip = _mm_set1_epi8((char)0x80);
    long k = 0;
    if (K % KG) put4(out, K / KG, qs, 0);
    for (; k + 8 <= K; k += 8) {
        __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + k), vs));
        __m128i l = _mm256_castsi256_si128(v), h = _mm256_extracti128_si256(v, 1), b;
        if (mode == 0) {
            b = _mm_xor_si128(_mm_packs_epi16(_mm_packs_epi32(l, h), l), flip);
        } else {
            __m128i w = _mm_packus_epi32(_mm_add_epi32(l, vz), _mm_add_epi32(h, vz));
            b = _mm_packus_epi16(w, w);
        }
        put4(out, k / 4, qs, (uint32_t)_mm_cvtsi128_si32(b));
        put4(out, k / 4 + 1, qs, (uint32_t)_mm_extract_epi32(b, 1));
    }
    for (; k < K; ++k) {
        float t = nearbyintf(x[k] / scale) + (float)zp;
        t = mode == 0 ? (t < -128.0f ? -128.0f : t > 127.0f ? 127.0f : t) + 128.0f
                      : (t < 0.0f ? 0.0f : t > 255.0f ? 255.0f : t);
        out[(k / KG) * qs + k % KG] = (a_t)(int32_t)t;
    }
}
#endif

/* Scale and zero point of one row (mode 0: s8, 1: u8); returns the scale (NaN: bad row). */
static float row_params(const float *x, long K, int mode, int32_t *zp) {
    float lo, hi, scale;
#if RLX_ISA >= 1
    int bad = row_stats16(x, K, mode, &lo, &hi);
#else
    int bad = row_stats(x, K, &lo, &hi);
#endif
    *zp = 0;
    if (mode == 0) {
        float amax = -lo > hi ? -lo : hi;
        scale = amax / 127.0f;
    } else {
        lo = lo < 0.0f ? lo : 0.0f;
        hi = hi > 0.0f ? hi : 0.0f;
        scale = (hi - lo) / 255.0f;
    }
    if (bad || !isfinite(scale)) return NAN;
    if (scale == 0.0f) scale = 1.0f;
    if (mode == 1) {
        float z = nearbyintf(-lo / scale);
        *zp = z < 0.0f ? 0 : z > 255.0f ? 255 : (int32_t)z;
    }
    return scale;
}

/* The packed row (groups qs bytes apart, the last group zero-padded) of
 * clip(rint(x[k] / scale) + zp, qmin, qmax) + shift (k < K); NaN gives zp, +-inf saturate
 * (as rlx.ops.quant.quantize_array). The division is the f32 one of the reference, so
 * every q is bit for bit NumPy's. */
static void quantize_row(const float *x, long K, float scale, int32_t zp, int32_t qmin,
                         int32_t qmax, int32_t shift, a_t *out, long qs) {
    long k = 0;
    if (K % KG) zero_group(out, K / KG, qs);
#if RLX_ISA == 2
    {
        const __m512 vs = _mm512_set1_ps(scale), vz = _mm512_set1_ps((float)zp);
        const __m512 vlo = _mm512_set1_ps((float)qmin), vhi = _mm512_set1_ps((float)qmax);
        const __m512 vsh = _mm512_set1_ps((float)shift);
        for (; k + 16 <= K; k += 16) {
            __m512 t = _mm512_div_ps(_mm512_loadu_ps(x + k), vs);
            t = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            t = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(t, t, _CMP_ORD_Q), t); /* NaN: zp */
            t = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(t, vz), vlo), vhi);
            __m128i b = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_add_ps(t, vsh)));
            put4(out, k / 4, qs, (uint32_t)_mm_cvtsi128_si32(b));
            put4(out, k / 4 + 1, qs, (uint32_t)_mm_extract_epi32(b, 1));
            put4(out, k / 4 + 2, qs, (uint32_t)_mm_extract_epi32(b, 2));
            put4(out, k / 4 + 3, qs, (uint32_t)_mm_extract_epi32(b, 3));
        }
    }
#endif
#if RLX_ISA == 1 || RLX_ISA == 2
    const __m256 vs = _mm256_set1_ps(scale), vz = _mm256_set1_ps((float)zp);
    const __m256 vlo = _mm256_set1_ps((float)qmin), vhi = _mm256_set1_ps((float)qmax);
    const __m256 vsh = _mm256_set1_ps((float)shift);
    for (; k + 8 <= K; k += 8) {
        __m256 t = _mm256_div_ps(_mm256_loadu_ps(x + k), vs);
        t = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        t = _mm256_and_ps(t, _mm256_cmp_ps(t, t, _CMP_ORD_Q)); /* NaN -> 0: q = zp */
        t = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(t, vz), vlo), vhi);
        __m256i v = _mm256_cvtps_epi32(_mm256_add_ps(t, vsh));
        __m128i l = _mm256_castsi256_si128(v), h = _mm256_extracti128_si256(v, 1);
        __m128i w = _mm_packus_epi32(l, h);
        __m128i b = _mm_packus_epi16(w, w);
        put4(out, k / 4, qs, (uint32_t)_mm_cvtsi128_si32(b));
        put4(out, k / 4 + 1, qs, (uint32_t)_mm_extract_epi32(b, 1));
    }
#endif
#if RLX_ISA >= 3
    {
        const float32x4_t vs = vdupq_n_f32(scale), vz = vdupq_n_f32((float)zp);
        const float32x4_t vlo = vdupq_n_f32((float)qmin), vhi = vdupq_n_f32((float)qmax);
        const float32x4_t vsh = vdupq_n_f32((float)shift);
        for (; k + 8 <= K; k += 8) qn_put8(out, k, qs, qn_quantize8(x + k, vs, vz, vlo, vhi, vsh));
    }
#endif
    for (; k < K; ++k) {
        float t = nearbyintf(x[k] / scale);
        t = (t == t ? t : 0.0f) + (float)zp; /* NaN -> zp; +-inf saturate below */
        t = t < (float)qmin ? (float)qmin : t > (float)qmax ? (float)qmax : t;
        out[(k / KG) * qs + k % KG] = (a_t)((int32_t)t + shift);
    }
}

static void bf16_row(const uint16_t *x, long K, float *out) {
    for (long k = 0; k < K; ++k) {
        uint32_t u = (uint32_t)x[k] << 16;
        memcpy(out + k, &u, 4);
    }
}

/* Row m of A as a packed row at dst (groups qs bytes apart: shifted / quantized), with its
 * scale *rs and correction *corr (raw - corr * colsum is the exact result). Returns 0 when
 * the row is not finite (dst untouched, scale NaN: the caller zeroes the row, its outputs
 * NaN). */
static int prepare_row(int a_kind, const void *A, long lda, long K, long m, int32_t a_zp,
                       float a_scale, int mode, a_t *dst, long qs, float *fbuf, float *rs,
                       int32_t *corr) {
    if (a_kind == A_S8 || a_kind == A_U8) {
        /* a shift of +-128 is the byte with its top bit flipped */
        const uint32_t flip = a_kind == A_S8 ? (S_SHIFT ? 0x80808080u : 0u)
                                             : (U_SHIFT ? 0x80808080u : 0u);
        const uint8_t *src = (const uint8_t *)A + m * lda;
        long g = 0;
        for (; g < K / KG; ++g) put_group(dst, g, qs, src + g * KG, flip);
        if (K % KG) {
            uint8_t t[KG] = {0};
            for (long k = g * KG; k < K; ++k) t[k - g * KG] = (uint8_t)(src[k] ^ (flip & 0xff));
            put_group(dst, g, qs, t, 0);
        }
        *rs = a_scale;
        *corr = (a_kind == A_S8 ? S_SHIFT : U_SHIFT) + a_zp;
        return 1;
    }
    const float *x;
    if (a_kind == A_F32) {
        x = (const float *)A + m * lda;
    } else {
        bf16_row((const uint16_t *)A + m * lda, K, fbuf);
        x = fbuf;
    }
    if (mode >= 2) { /* static per-tensor: 2 = int8, 3 = uint8, scale a_scale, zp a_zp */
        int32_t shift = mode == 2 ? S_SHIFT : U_SHIFT;
        quantize_row(x, K, a_scale, a_zp, mode == 2 ? -128 : 0, mode == 2 ? 127 : 255, shift,
                     dst, qs);
        *rs = a_scale;
        *corr = shift + a_zp;
        return 1;
    }
    int32_t zp;
    float scale = row_params(x, K, mode, &zp);
    int32_t shift = mode == 0 ? S_SHIFT : U_SHIFT;
    *rs = scale;
    *corr = shift;
    if (isnan(scale)) return 0;
#if RLX_ISA >= 1
    quantize_row_dyn(x, K, scale, zp, mode, dst, qs);
#else
    if (mode == 0)
        quantize_row(x, K, scale, 0, -128, 127, shift, dst, qs);
    else
        quantize_row(x, K, scale, zp, 0, 255, U_SHIFT, dst, qs);
#endif
    *corr = shift + zp;
    return 1;
}

/* Rows m0 .. m0+MR of A into the packed tile Ap[k / KG][MR][KG] (a_t), or when wide (path
 * 1's kernel for 8-bit weights) Ap[k / 2][MR][2] (int16_t), with rs[r] and corr[r]; rows
 * past M and rows that are not finite are zeros. */
static void prepare_tile(int a_kind, const void *A, long lda, long M, long K, long m0,
                         int32_t a_zp, float a_scale, int mode, void *Ap_, int wide, float *rs,
                         int32_t *corr, float *fbuf, a_t *qbuf) {
    long kp = round_up(K, KG);
    a_t *Ap = (a_t *)Ap_;
    int16_t *Aw = (int16_t *)Ap_;
    if (wide) memset(Ap_, 0, (size_t)(kp * MR) * sizeof(int16_t));
    for (long r = 0; r < MR; ++r) {
        long m = m0 + r;
        rs[r] = 0.0f;
        corr[r] = 0;
        a_t *dst = wide ? qbuf : Ap + r * KG;
        long qs = wide ? KG : MR * KG;
        if (m >= M ||
            !prepare_row(a_kind, A, lda, K, m, a_zp, a_scale, mode, dst, qs, fbuf, rs + r,
                         corr + r)) {
            if (!wide)
                for (long g = 0; g < kp / KG; ++g) zero_group(dst, g, qs);
            continue;
        }
        if (wide) /* s16 k pairs: Aw[k / 2][MR][2] */
            for (long k = 0; k < K; ++k) Aw[(k / 2) * MR * 2 + r * 2 + k % 2] = qbuf[k];
    }
}
