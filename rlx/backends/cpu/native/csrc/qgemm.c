/* INT8 GEMM for rlx with a fused f32 epilogue.
 *
 *   acc[m, n] = sum_k (q[m, k] - zp[m]) * B[k, n]                        (exact int32)
 *   Y[m, n]   = act((float)acc * (rs[m] * ws[n]) + bias[n]) + R[m, n]
 *
 * Activations (a_kind): int8 or uint8 with one zero point and scale (static), or f32 /
 * bf16 rows quantized here, per row, at run time (dynamic: mode 0 = s8 symmetric, scale =
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
 *      result is raw - (128 + zp) * colsum[n]. Tile MR x NR = 12 x 32 in 24 zmm. On a CPU
 *      with AMX-INT8 (and K a multiple of 64) the same sums come from tdpbusd tiles of
 *      32 x 32 (see amx_run), about twice the vpdpbusd rate.
 *   1  AVX2: vpmaddwd on int16 (s16 x s16 -> s32, pairs: KG = 2; B is packed as int16).
 *      Exact for every 8-bit operand (a pair sums to at most 2 * 255 * 128 < 2**31, where
 *      vpmaddubsw's int16 pair sum would saturate at 32767 for u8 255 x s8 -128 pairs).
 *      No shift: the result is raw - zp * colsum[n]. Tile 6 x 16 in 12 ymm.
 *   0  plain C: the VNNI data layout with scalar code (auto-vectorised by gcc).
 *
 * The epilogue runs on each MR x NR tile while it is in L1, in SIMD registers (16 lanes on
 * path 2, 8 on path 1; exp / erf by polynomials, see vexp), scalar libm on path 0.
 * Blocking: M in blocks of row tiles whose packed A stays in L2; for each NR-column panel
 * of packed B, K in slices that stay in L1 while every row tile of the block uses them. Measured on the AVX2 path (Sapphire
 * Rapids, 1024 x 384 x N): the earlier order (A tile in L1, B blocks from L2) ran N = 1536
 * at 24 GMAC/s against 64 at N = 384.
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
#if RLX_ISA == 1 || RLX_ISA == 2
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#if RLX_ISA == 1
#define MR 6
#define NR 16
#define KG 2
#define S_SHIFT 0 /* what is added to a signed activation */
typedef int16_t a_t; /* packed activation element */
typedef int16_t b_t; /* packed weight element */
#else
#define MR 12
#define NR 32
#define KG 4
#define S_SHIFT 128
typedef uint8_t a_t;
typedef int8_t b_t;
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
    return round_up(K, KG) * round_up(N, NR) * (long)sizeof(b_t);
}

/* Pack B (element [k, n] at B[k * sk + n * sn]) into Bp and fill colsum[N]. */
void rlx_qgemm_pack_b_strided(const int8_t *B, long sk, long sn, long K, long N, void *Bp_,
                              int32_t *colsum) {
    b_t *Bp = (b_t *)Bp_;
    long kp = round_up(K, KG), np_ = round_up(N, NR);
    memset(Bp, 0, (size_t)(kp * np_) * sizeof(b_t));
    for (long n = 0; n < N; ++n) {
        b_t *dst = Bp + (n / NR) * kp * NR + (n % NR) * KG;
        int32_t s = 0;
        for (long k = 0; k < K; ++k) {
            int8_t v = B[k * sk + n * sn];
            dst[(k / KG) * NR * KG + (k % KG)] = (b_t)v;
            s += v;
        }
        colsum[n] = s;
    }
}

/* Pack B [K, N] (row stride ldb). */
void rlx_qgemm_pack_b(const int8_t *B, long ldb, long K, long N, void *Bp_, int32_t *colsum) {
    rlx_qgemm_pack_b_strided(B, ldb, 1, K, N, Bp_, colsum);
}

/* ---- dynamic row quantization ------------------------------------------------------ */

/* lo = min, hi = max of x[0..K); returns 1 when the row holds NaN or +-inf. */
static int row_stats(const float *x, long K, float *lo_, float *hi_) {
    long k = 0;
    float lo = INFINITY, hi = -INFINITY, bad = 0.0f;
#if RLX_ISA == 1 || RLX_ISA == 2
    __m256 vlo = _mm256_set1_ps(INFINITY), vhi = _mm256_set1_ps(-INFINITY);
    __m256 vbad = _mm256_setzero_ps(), zero = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) {
        __m256 v = _mm256_loadu_ps(x + k);
        vlo = _mm256_min_ps(vlo, v);
        vhi = _mm256_max_ps(vhi, v);
        vbad = _mm256_add_ps(vbad, _mm256_mul_ps(v, zero)); /* inf * 0 and NaN give NaN */
    }
    float t[8];
    _mm256_storeu_ps(t, vlo);
    for (int i = 0; i < 8; ++i) lo = t[i] < lo ? t[i] : lo;
    _mm256_storeu_ps(t, vhi);
    for (int i = 0; i < 8; ++i) hi = t[i] > hi ? t[i] : hi;
    _mm256_storeu_ps(t, vbad);
    for (int i = 0; i < 8; ++i) bad += t[i];
#endif
    for (; k < K; ++k) {
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

/* Scale and zero point of one row (mode 0: s8, 1: u8); returns the scale (NaN: bad row). */
static float row_params(const float *x, long K, int mode, int32_t *zp) {
    float lo, hi, scale;
    int bad = row_stats(x, K, &lo, &hi);
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

/* out[k] = clip(rint(x[k] / scale) + zp, qmin, qmax) + shift as a_t (k < K). */
static void quantize_row(const float *x, long K, float scale, int32_t zp, int32_t qmin,
                         int32_t qmax, int32_t shift, a_t *out) {
    long k = 0;
#if RLX_ISA == 1 || RLX_ISA == 2
    const __m256 vs = _mm256_set1_ps(scale), vz = _mm256_set1_ps((float)zp);
    const __m256 vlo = _mm256_set1_ps((float)qmin), vhi = _mm256_set1_ps((float)qmax);
    const __m256 vsh = _mm256_set1_ps((float)shift);
    for (; k + 8 <= K; k += 8) {
        __m256 t = _mm256_div_ps(_mm256_loadu_ps(x + k), vs);
        t = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        t = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(t, vz), vlo), vhi);
        __m256i v = _mm256_cvtps_epi32(_mm256_add_ps(t, vsh));
        __m128i l = _mm256_castsi256_si128(v), h = _mm256_extracti128_si256(v, 1);
#if RLX_ISA == 1
        _mm_storeu_si128((__m128i *)(out + k), _mm_packs_epi32(l, h));
#else
        __m128i w = _mm_packus_epi32(l, h);
        _mm_storel_epi64((__m128i *)(out + k), _mm_packus_epi16(w, w));
#endif
    }
#endif
    for (; k < K; ++k) {
        float t = nearbyintf(x[k] / scale) + (float)zp;
        t = t < (float)qmin ? (float)qmin : t > (float)qmax ? (float)qmax : t;
        out[k] = (a_t)((int32_t)t + shift);
    }
}

static void bf16_row(const uint16_t *x, long K, float *out) {
    for (long k = 0; k < K; ++k) {
        uint32_t u = (uint32_t)x[k] << 16;
        memcpy(out + k, &u, 4);
    }
}

/* Row m of A as packed activations dst[0..K) (shifted / quantized), with its scale *rs and
 * correction *corr (raw - corr * colsum is the exact result). Returns 0 when the row is
 * not finite (dst untouched, scale NaN: the caller leaves the row 0, its outputs NaN). */
static int prepare_row(int a_kind, const void *A, long lda, long K, long m, int32_t a_zp,
                       float a_scale, int mode, a_t *dst, float *fbuf, float *rs,
                       int32_t *corr) {
    if (a_kind == A_S8 || a_kind == A_U8) {
        int32_t shift = a_kind == A_S8 ? S_SHIFT : 0;
        if (a_kind == A_S8) {
            const int8_t *src = (const int8_t *)A + m * lda;
            for (long k = 0; k < K; ++k) dst[k] = (a_t)((int32_t)src[k] + shift);
        } else {
            const uint8_t *src = (const uint8_t *)A + m * lda;
            for (long k = 0; k < K; ++k) dst[k] = (a_t)src[k];
        }
        *rs = a_scale;
        *corr = shift + a_zp;
        return 1;
    }
    const float *x;
    if (a_kind == A_F32) {
        x = (const float *)A + m * lda;
    } else {
        bf16_row((const uint16_t *)A + m * lda, K, fbuf);
        x = fbuf;
    }
    int32_t zp;
    float scale = row_params(x, K, mode, &zp);
    int32_t shift = mode == 0 ? S_SHIFT : 0;
    *rs = scale;
    *corr = shift;
    if (isnan(scale)) return 0;
    if (mode == 0)
        quantize_row(x, K, scale, 0, -128, 127, shift, dst);
    else
        quantize_row(x, K, scale, zp, 0, 255, 0, dst);
    *corr = shift + zp;
    return 1;
}

/* Rows m0 .. m0+MR of A into the packed tile Ap[k / KG][MR][KG], with rs[r] and corr[r]. */
static void prepare_tile(int a_kind, const void *A, long lda, long M, long K, long m0,
                         int32_t a_zp, float a_scale, int mode, a_t *Ap, float *rs,
                         int32_t *corr, float *fbuf, a_t *qbuf) {
    long kp = round_up(K, KG);
    memset(Ap, 0, (size_t)(kp * MR) * sizeof(a_t));
    for (long r = 0; r < MR; ++r) {
        long m = m0 + r;
        rs[r] = 0.0f;
        corr[r] = 0;
        if (m >= M) continue;
        if (!prepare_row(a_kind, A, lda, K, m, a_zp, a_scale, mode, qbuf, fbuf, rs + r, corr + r))
            continue;
        for (long g = 0; g < kp / KG; ++g) {
            long k0 = g * KG, cnt = K - k0 < KG ? K - k0 : KG;
            memcpy(Ap + g * MR * KG + r * KG, qbuf + k0, (size_t)cnt * sizeof(a_t));
        }
    }
}

static inline int32_t load4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- microkernels: ct[MR][NR] += raw sums over kg groups of KG k -------------------- */

#if RLX_ISA == 2
#define ROW(r)                                                  \
    do {                                                        \
        __m512i a = _mm512_set1_epi32(load4(ap + 4 * (r)));     \
        c##r##0 = _mm512_dpbusd_epi32(c##r##0, a, b0);          \
        c##r##1 = _mm512_dpbusd_epi32(c##r##1, a, b1);          \
    } while (0)
#define STORE(r)                                                    \
    do {                                                            \
        _mm512_storeu_si512((void *)(ct + (r) * NR), c##r##0);      \
        _mm512_storeu_si512((void *)(ct + (r) * NR + 16), c##r##1); \
    } while (0)

#define LOAD(r)                                                               \
    __m512i c##r##0 = _mm512_loadu_si512((const void *)(ct + (r) * NR)),      \
            c##r##1 = _mm512_loadu_si512((const void *)(ct + (r) * NR + 16))

static void ukernel(long kg, const a_t *ap, const b_t *bp, int32_t *ct) {
    LOAD(0); LOAD(1); LOAD(2); LOAD(3); LOAD(4); LOAD(5);
    LOAD(6); LOAD(7); LOAD(8); LOAD(9); LOAD(10); LOAD(11);
    for (long k = 0; k < kg; ++k) {
        __m512i b0 = _mm512_loadu_si512((const void *)bp);
        __m512i b1 = _mm512_loadu_si512((const void *)(bp + 64));
        ROW(0); ROW(1); ROW(2); ROW(3); ROW(4); ROW(5);
        ROW(6); ROW(7); ROW(8); ROW(9); ROW(10); ROW(11);
        ap += KG * MR;
        bp += KG * NR;
    }
    STORE(0); STORE(1); STORE(2); STORE(3); STORE(4); STORE(5);
    STORE(6); STORE(7); STORE(8); STORE(9); STORE(10); STORE(11);
}
#elif RLX_ISA == 1
#define ROW(r)                                                                  \
    do {                                                                        \
        __m256i a = _mm256_set1_epi32(load4(ap + 2 * (r)));                     \
        c##r##0 = _mm256_add_epi32(c##r##0, _mm256_madd_epi16(a, b0));          \
        c##r##1 = _mm256_add_epi32(c##r##1, _mm256_madd_epi16(a, b1));          \
    } while (0)
#define STORE(r)                                                         \
    do {                                                                 \
        _mm256_storeu_si256((__m256i *)(ct + (r) * NR), c##r##0);        \
        _mm256_storeu_si256((__m256i *)(ct + (r) * NR + 8), c##r##1);    \
    } while (0)

#define LOAD(r)                                                               \
    __m256i c##r##0 = _mm256_loadu_si256((const __m256i *)(ct + (r) * NR)),   \
            c##r##1 = _mm256_loadu_si256((const __m256i *)(ct + (r) * NR + 8))

static void ukernel(long kg, const a_t *ap, const b_t *bp, int32_t *ct) {
    LOAD(0); LOAD(1); LOAD(2); LOAD(3); LOAD(4); LOAD(5);
    for (long k = 0; k < kg; ++k) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)bp);
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(bp + 16));
        ROW(0); ROW(1); ROW(2); ROW(3); ROW(4); ROW(5);
        ap += KG * MR;
        bp += KG * NR;
    }
    STORE(0); STORE(1); STORE(2); STORE(3); STORE(4); STORE(5);
}
#else
static void ukernel(long kg, const a_t *ap, const b_t *bp, int32_t *ct) {
    int32_t acc[MR][NR];
    memcpy(acc, ct, sizeof(acc));
    for (long k = 0; k < kg; ++k) {
        for (int r = 0; r < MR; ++r) {
            const int32_t a0 = ap[4 * r], a1 = ap[4 * r + 1], a2 = ap[4 * r + 2], a3 = ap[4 * r + 3];
            for (int c = 0; c < NR; ++c) {
                const b_t *b = bp + 4 * c;
                acc[r][c] += a0 * b[0] + a1 * b[1] + a2 * b[2] + a3 * b[3];
            }
        }
        ap += KG * MR;
        bp += KG * NR;
    }
    memcpy(ct, acc, sizeof(acc));
}
#endif

/* ---- the epilogue ------------------------------------------------------------------ */

#if RLX_ISA == 2
#define VL 16
typedef __m512 vf;
typedef __m512i vi;
#define VLOADI(p) _mm512_loadu_si512((const void *)(p))
#define VSTOREI(p, v) _mm512_storeu_si512((void *)(p), v)
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VSET(x) _mm512_set1_ps(x)
#define VSETI(x) _mm512_set1_epi32(x)
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VDIV _mm512_div_ps
#define VMAX _mm512_max_ps
#define VMIN _mm512_min_ps
#define VFMA _mm512_fmadd_ps
#define VFNMA _mm512_fnmadd_ps
#define VABS(x) _mm512_abs_ps(x)
#define VROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VCVTI(x) _mm512_cvtepi32_ps(x)
#define VTOI(x) _mm512_cvtps_epi32(x)
#define VASF(x) _mm512_castsi512_ps(x)
#define VIADD _mm512_add_epi32
#define VISUB _mm512_sub_epi32
#define VIMUL _mm512_mullo_epi32
#define VISLL(x, s) _mm512_slli_epi32(x, s)
#define VSIGN_OF(x, s) /* |x| with the sign of s */ \
    _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(x), \
        _mm512_castps_si512(s), _mm512_set1_epi32(0x7fffffff), 0xe4))
#elif RLX_ISA == 1
#define VL 8
typedef __m256 vf;
typedef __m256i vi;
#define VLOADI(p) _mm256_loadu_si256((const __m256i *)(p))
#define VSTOREI(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VSET(x) _mm256_set1_ps(x)
#define VSETI(x) _mm256_set1_epi32(x)
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VDIV _mm256_div_ps
#define VMAX _mm256_max_ps
#define VMIN _mm256_min_ps
#define VFMA _mm256_fmadd_ps
#define VFNMA _mm256_fnmadd_ps
#define VABS(x) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x)
#define VROUND(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VCVTI(x) _mm256_cvtepi32_ps(x)
#define VTOI(x) _mm256_cvtps_epi32(x)
#define VASF(x) _mm256_castsi256_ps(x)
#define VIADD _mm256_add_epi32
#define VISUB _mm256_sub_epi32
#define VIMUL _mm256_mullo_epi32
#define VISLL(x, s) _mm256_slli_epi32(x, s)
#define VSIGN_OF(x, s) \
    _mm256_or_ps(VABS(x), _mm256_and_ps(_mm256_set1_ps(-0.0f), s))
#endif

#ifdef VL
/* exp(x) (Cephes expf: range reduction by ln 2, degree-5 polynomial; ~1 ulp), with x
 * clamped to [-80, 88]: exp(-80) = 1.8e-35 stands for smaller values, so no result (nor
 * a product of one in the callers) is subnormal, which would cost a microcode assist per
 * lane (measured: an erf-GELU epilogue took 6x the GEMM's time); callers only add it to 1
 * or multiply it by bounded values. */
static inline vf vexp(vf x) {
    x = VMIN(VMAX(x, VSET(-80.0f)), VSET(88.0f));
    vf fx = VROUND(VMUL(x, VSET(1.44269504088896341f)));
    vf r = VFNMA(fx, VSET(0.693359375f), x);
    r = VFNMA(fx, VSET(-2.12194440e-4f), r);
    vf p = VSET(1.9875691500e-4f);
    p = VFMA(p, r, VSET(1.3981999507e-3f));
    p = VFMA(p, r, VSET(8.3334519073e-3f));
    p = VFMA(p, r, VSET(4.1665795894e-2f));
    p = VFMA(p, r, VSET(1.6666665459e-1f));
    p = VFMA(p, r, VSET(5.0000001201e-1f));
    p = VFMA(p, VMUL(r, r), VADD(r, VSET(1.0f)));
    vi e = VISLL(VIADD(VTOI(fx), VSETI(127)), 23);
    return VMUL(p, VASF(e));
}

/* erf(z) by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), odd extension; NaN stays NaN
 * through the caller's product with z. */
static inline vf verf(vf z) {
    vf a = VMIN(VABS(z), VSET(5.0f)); /* erf(5) is 1 in f32 */
    vf t = VDIV(VSET(1.0f), VFMA(a, VSET(0.3275911f), VSET(1.0f)));
    vf p = VSET(1.061405429f);
    p = VFMA(p, t, VSET(-1.453152027f));
    p = VFMA(p, t, VSET(1.421413741f));
    p = VFMA(p, t, VSET(-0.284496736f));
    p = VFMA(p, t, VSET(0.254829592f));
    p = VMUL(p, t);
    vf e = VSUB(VSET(1.0f), VMUL(p, vexp(VMUL(VSUB(VSET(0.0f), a), a))));
    return VSIGN_OF(e, z);
}

static inline vf vact(vf y, int act) {
    switch (act) {
    case ACT_RELU:
        return VMAX(VSET(0.0f), y); /* NaN in y stays NaN (max returns its 2nd operand) */
    case ACT_GELU:
        return VMUL(VMUL(VSET(0.5f), y), VADD(VSET(1.0f), verf(VMUL(y, VSET(0.70710678118654752f)))));
    case ACT_GELU_TANH: {
        /* 0.5 y (1 + tanh(u)) == y / (1 + exp(-2u)), u = sqrt(2/pi) (y + 0.044715 y^3) */
        vf u = VMUL(VSET(0.7978845608028654f), VFMA(VMUL(VMUL(y, y), y), VSET(0.044715f), y));
        return VDIV(y, VADD(VSET(1.0f), vexp(VMUL(VSET(-2.0f), u))));
    }
    case ACT_SILU:
        return VDIV(y, VADD(VSET(1.0f), vexp(VSUB(VSET(0.0f), y))));
    default:
        return y;
    }
}
#endif

static inline float sact(float y, int act) {
    switch (act) {
    case ACT_RELU:
        return y < 0.0f ? 0.0f : y;
    case ACT_GELU:
        return 0.5f * y * (1.0f + erff(y * 0.70710678118654752f));
    case ACT_GELU_TANH: {
        float u = 0.7978845608028654f * (y + 0.044715f * y * y * y);
        return 0.5f * y * (1.0f + tanhf(u));
    }
    case ACT_SILU:
        return y / (1.0f + expf(-y));
    default:
        return y;
    }
}

typedef struct {
    const int32_t *colsum;
    const float *ws, *bias, *res;
    long ldr;
    float *Y;
    long ldy;
    int32_t *C;
    long ldc;
    int act;
} epi_t;

/* cnt (<= NR) columns n0.. of row m: ct -> C and / or Y. */
static void epilogue_row(const epi_t *e, const int32_t *ct, long m, long n0, long cnt,
                         float rs, int32_t corr) {
    long c = 0;
#ifdef VL
    if (e->Y && !e->C) {
        const vf vrs = VSET(rs);
        const vi vcorr = VSETI(corr);
        for (; c < cnt; c += VL) {
            long w = cnt - c < VL ? cnt - c : VL;
            int32_t cs[VL];
            float ws[VL], b[VL], r[VL], out[VL];
            const int32_t *pcs = e->colsum + n0 + c;
            const float *pws = e->ws + n0 + c, *pb = e->bias ? e->bias + n0 + c : NULL;
            const float *pr = e->res ? e->res + m * e->ldr + n0 + c : NULL;
            float *py = e->Y + m * e->ldy + n0 + c;
            if (w < VL) { /* a ragged edge: through zero-padded copies */
                memset(cs, 0, sizeof(cs));
                memset(ws, 0, sizeof(ws));
                memset(b, 0, sizeof(b));
                memset(r, 0, sizeof(r));
                memcpy(cs, pcs, (size_t)w * 4);
                memcpy(ws, pws, (size_t)w * 4);
                if (pb) memcpy(b, pb, (size_t)w * 4);
                if (pr) memcpy(r, pr, (size_t)w * 4);
                pcs = cs, pws = ws, pb = pb ? b : NULL, pr = pr ? r : NULL;
            }
            vi v = VISUB(VLOADI(ct + c), VIMUL(vcorr, VLOADI(pcs)));
            vf y = VMUL(VCVTI(v), VMUL(vrs, VLOAD(pws)));
            if (pb) y = VADD(y, VLOAD(pb));
            y = vact(y, e->act);
            if (pr) y = VADD(y, VLOAD(pr));
            if (w < VL) {
                VSTORE(out, y);
                memcpy(py, out, (size_t)w * 4);
            } else {
                VSTORE(py, y);
            }
        }
        return;
    }
    if (e->C && !e->Y) { /* int32 accumulators only */
        const vi vcorr = VSETI(corr);
        for (; c + VL <= cnt; c += VL)
            VSTOREI(e->C + m * e->ldc + n0 + c,
                    VISUB(VLOADI(ct + c), VIMUL(vcorr, VLOADI(e->colsum + n0 + c))));
    }
#endif
    for (; c < cnt; ++c) {
        long n = n0 + c;
        int32_t v = (int32_t)((uint32_t)ct[c] - (uint32_t)corr * (uint32_t)e->colsum[n]);
        if (e->C) e->C[m * e->ldc + n] = v;
        if (e->Y) {
            float y = (float)v * (rs * e->ws[n]);
            if (e->bias) y += e->bias[n];
            y = sact(y, e->act);
            if (e->res) y += e->res[m * e->ldr + n];
            e->Y[m * e->ldy + n] = y;
        }
    }
}

/* ---- AMX-INT8 (path 2 on a CPU with amx_int8 whose kernel grants the tile state) --------
 * tdpbusd multiplies a 16-row x 64-byte tile of u8 activations (rows straight from a
 * row-major buffer) by a tile of 16 k-quads x 16 columns of s8 weights: in the VNNI packed
 * layout a panel's k-quads are 128 bytes apart and its two 16-column halves 64 bytes apart,
 * so the packed B is read as it is. 32 rows x 32 columns keep 4 int32 accumulator tiles
 * over the whole K; they are stored to a per-thread buffer and go through the same
 * epilogue. Taken when K is a multiple of 64 (rlx_qgemm_has_amx() says whether the CPU and
 * kernel allow it; flag bit 0 of rlx_qgemm_run turns it off). Integer sums are exact
 * either way, so results equal the VNNI path's bit for bit. */
#if RLX_ISA == 2 && defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define RLX_AMX_BUILD 1
static int amx_state = -1; /* -1 unknown, 0 no, 1 yes */

static int amx_ok(void) {
    int s = __atomic_load_n(&amx_state, __ATOMIC_ACQUIRE);
    if (s >= 0) return s;
    unsigned ea, eb, ec, ed;
    int ok = 0;
    /* CPUID.7.0:EDX bit 24 AMX-TILE, bit 25 AMX-INT8 */
    if (__get_cpuid_count(7, 0, &ea, &eb, &ec, &ed) && (ed & (1u << 24)) && (ed & (1u << 25)))
        ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    __atomic_store_n(&amx_state, ok, __ATOMIC_RELEASE);
    return ok;
}

struct amx_cfg {
    uint8_t palette, start_row, pad[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

__attribute__((target("amx-tile"), noinline)) static void amx_config(int on) {
    if (!on) {
        _tile_release();
        return;
    }
    struct amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    __asm__ volatile("" : : "r"(&cfg) : "memory"); /* keep the stores to cfg */
    _tile_loadconfig(&cfg);
}

/* tiles: 0, 1 A (rows 0..15, 16..31); 2, 3 B (columns 0..15, 16..31); 4..7 C.
 * ct[32][32] = raw sums of rows (16 or 32) of a (row stride lda bytes) over kq quads. */
__attribute__((target("amx-tile,amx-int8"), noinline)) static void amx_block(
    long rows, long kq, const uint8_t *a, long lda, const int8_t *bpan, int32_t *ct) {
    _tile_zero(4);
    _tile_zero(5);
    if (rows == 32) {
        _tile_zero(6);
        _tile_zero(7);
        for (long q = 0; q < kq; q += 16) {
            _tile_loadd(2, bpan + q * NR * 4, 128);
            _tile_loadd(3, bpan + q * NR * 4 + 64, 128);
            _tile_loadd(0, a + 4 * q, lda);
            _tile_dpbusd(4, 0, 2);
            _tile_dpbusd(5, 0, 3);
            _tile_loadd(1, a + 16 * lda + 4 * q, lda);
            _tile_dpbusd(6, 1, 2);
            _tile_dpbusd(7, 1, 3);
        }
        _tile_stored(6, ct + 16 * 32, 128);
        _tile_stored(7, ct + 16 * 32 + 16, 128);
    } else {
        for (long q = 0; q < kq; q += 16) {
            _tile_loadd(2, bpan + q * NR * 4, 128);
            _tile_loadd(3, bpan + q * NR * 4 + 64, 128);
            _tile_loadd(0, a + 4 * q, lda);
            _tile_dpbusd(4, 0, 2);
            _tile_dpbusd(5, 0, 3);
        }
    }
    _tile_stored(4, ct, 128);
    _tile_stored(5, ct + 16, 128);
}

static int amx_run(long M, long N, long K, int a_kind, const void *A, long lda, int32_t a_zp,
                   float a_scale, int mode, const b_t *Bp, const epi_t *e, float *rs,
                   int32_t *corr, int nthreads) {
    long m32 = round_up(M, 32), nb = (N + NR - 1) / NR;
    uint8_t *Ar = (uint8_t *)aligned_alloc(64, (size_t)(m32 * K) + 64);
    if (!Ar) return -1;
    long mcb = A_BLOCK_BYTES / (32 * K); /* 32-row blocks per M block (A kept in L2) */
    if (mcb < 1) mcb = 1;
    int oom = 0;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        float *fbuf = (float *)malloc((size_t)(K + 16) * sizeof(float));
        int32_t *ct = (int32_t *)aligned_alloc(64, 32 * 32 * sizeof(int32_t));
        if (!fbuf || !ct) {
#pragma omp atomic write
            oom = 1;
        }
#pragma omp barrier
        if (!oom) {
#pragma omp for schedule(static)
            for (long m = 0; m < m32; ++m) {
                uint8_t *dst = Ar + m * K;
                rs[m] = 0.0f;
                corr[m] = 0;
                if (m >= M || !prepare_row(a_kind, A, lda, K, m, a_zp, a_scale, mode, dst, fbuf,
                                           rs + m, corr + m))
                    memset(dst, 0, (size_t)K);
            }
            amx_config(1);
            long blocks = m32 / 32;
            for (long b0 = 0; b0 < blocks; b0 += mcb) {
                long b1 = b0 + mcb < blocks ? b0 + mcb : blocks;
#pragma omp for schedule(static)
                for (long j = 0; j < nb; ++j) {
                    long nr = N - j * NR < NR ? N - j * NR : NR;
                    for (long bi = b0; bi < b1; ++bi) {
                        long i0 = bi * 32, rows = M - i0 > 16 ? 32 : 16;
                        amx_block(rows, K / 4, Ar + i0 * K, K, Bp + j * K * NR, ct);
                        long mr = M - i0 < 32 ? M - i0 : 32;
                        for (long r = 0; r < mr; ++r)
                            epilogue_row(e, ct + r * 32, i0 + r, j * NR, nr, rs[i0 + r],
                                         corr[i0 + r]);
                    }
                }
            }
            amx_config(0);
        }
        free(fbuf);
        free(ct);
    }
    free(Ar);
    return oom ? -1 : 0;
}
#else
#define RLX_AMX_BUILD 0
#endif

int rlx_qgemm_has_amx(void) {
#if RLX_AMX_BUILD
    return amx_ok();
#else
    return 0;
#endif
}

/* The whole operation (see the header). A: int8 / uint8 (a_kind 0 / 1, zero point a_zp,
 * scale a_scale) or f32 / bf16 rows (2 / 3, quantized per row by mode). Outputs: Y (f32,
 * optional) and / or C (int32 acc, optional); row_scale / row_zp (optional, [M]) receive
 * each row's activation scale and zero point. ws: [N] weight scales (needed for Y).
 * flags: bit 0 set = never AMX. Returns 0, or -1 when out of memory. */
int rlx_qgemm_run(long M, long N, long K, int a_kind, const void *A, long lda, int32_t a_zp,
                  float a_scale, int mode, const void *Bp_, const int32_t *colsum,
                  const float *ws, const float *bias, int act, const float *res, long ldr,
                  float *Y, long ldy, int32_t *C, long ldc, float *row_scale, int32_t *row_zp,
                  int nthreads, int flags) {
    const b_t *Bp = (const b_t *)Bp_;
    long kp = round_up(K, KG), kg = kp / KG;
    long mb = (M + MR - 1) / MR, nb = (N + NR - 1) / NR;
    if (M <= 0 || N <= 0) return 0;
    size_t ap_bytes = (size_t)round_up(mb * kp * MR * (long)sizeof(a_t), 64);
    a_t *Ap = (a_t *)aligned_alloc(64, ap_bytes ? ap_bytes : 64);
    float *rs = (float *)malloc((size_t)(mb * MR) * sizeof(float));
    int32_t *corr = (int32_t *)malloc((size_t)(mb * MR) * sizeof(int32_t));
    if (!Ap || !rs || !corr) {
        free(Ap), free(rs), free(corr);
        return -1;
    }
    if (nthreads < 1) nthreads = 1;
    /* below ~32M multiply-adds (256^3 is 16.8M) waking a second thread costs more than
     * it saves: measured on a 2-core Zen 4, 256^3 took 0.17 ms on 1 thread, 0.20 ms on 2 */
    if ((double)M * (double)N * (double)K < 3.2e7) nthreads = 1;
    epi_t e = {colsum, ws, bias, res, ldr, Y, ldy, C, ldc, act};
#if RLX_AMX_BUILD
    if (!(flags & 1) && K > 0 && K % 64 == 0 && amx_ok()) {
        free(Ap);
        float *rs2 = (float *)malloc((size_t)round_up(M, 32) * sizeof(float));
        int32_t *corr2 = (int32_t *)malloc((size_t)round_up(M, 32) * sizeof(int32_t));
        int rc = rs2 && corr2 ? amx_run(M, N, K, a_kind, A, lda, a_zp, a_scale, mode, Bp, &e,
                                        rs2, corr2, nthreads)
                              : -1;
        if (rc == 0) {
            int unsigned_a = a_kind == A_U8 || (a_kind >= A_F32 && mode == 1);
            for (long m = 0; m < M; ++m) {
                if (row_scale) row_scale[m] = rs2[m];
                if (row_zp) row_zp[m] = corr2[m] - (unsigned_a ? 0 : S_SHIFT);
            }
        }
        free(rs2), free(corr2), free(rs), free(corr);
        return rc;
    }
#else
    (void)flags;
#endif
    /* cache blocking: M in blocks of mcb row tiles whose packed A (mcb * MR x K) stays in
     * L2 (A_BLOCK_BYTES); for each NR-column panel of B, K in slices of kcg groups whose
     * B slice (KC_BYTES) stays in L1 while every row tile of the block uses it, the tiles'
     * int32 sums kept in a small per-thread buffer; threads share out the panels */
    long mcb = kp > 0 ? A_BLOCK_BYTES / (kp * MR * (long)sizeof(a_t)) : mb;
    if (mcb < 1) mcb = 1;
    if (mcb > mb) mcb = mb;
    long kcg = KC_BYTES / (NR * KG * (long)sizeof(b_t));
    int oom = 0;

#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        float *fbuf = (float *)malloc((size_t)(K + 16) * sizeof(float));
        a_t *qbuf = (a_t *)malloc((size_t)(kp + 64) * sizeof(a_t));
        int32_t *acc = (int32_t *)aligned_alloc(64, (size_t)(mcb * MR * NR) * sizeof(int32_t));
        if (!fbuf || !qbuf || !acc) {
#pragma omp atomic write
            oom = 1;
        }
#pragma omp barrier
        if (!oom) {
#pragma omp for schedule(static)
            for (long i = 0; i < mb; ++i)
                prepare_tile(a_kind, A, lda, M, K, i * MR, a_zp, a_scale, mode,
                             Ap + i * kp * MR, rs + i * MR, corr + i * MR, fbuf, qbuf);
            for (long i0 = 0; i0 < mb; i0 += mcb) {
                long i1 = i0 + mcb < mb ? i0 + mcb : mb;
#pragma omp for schedule(static)
                for (long j = 0; j < nb; ++j) {
                    memset(acc, 0, (size_t)((i1 - i0) * MR * NR) * sizeof(int32_t));
                    for (long g0 = 0; g0 < kg; g0 += kcg) {
                        long g1 = g0 + kcg < kg ? g0 + kcg : kg;
                        for (long i = i0; i < i1; ++i)
                            ukernel(g1 - g0, Ap + i * kp * MR + g0 * MR * KG,
                                    Bp + j * kp * NR + g0 * NR * KG, acc + (i - i0) * MR * NR);
                    }
                    long nr = N - j * NR < NR ? N - j * NR : NR;
                    for (long i = i0; i < i1; ++i) {
                        long mr = M - i * MR < MR ? M - i * MR : MR;
                        for (long r = 0; r < mr; ++r)
                            epilogue_row(&e, acc + (i - i0) * MR * NR + r * NR, i * MR + r,
                                         j * NR, nr, rs[i * MR + r], corr[i * MR + r]);
                    }
                }
            }
        }
        free(fbuf);
        free(qbuf);
        free(acc);
    }
    if (!oom) {
        int unsigned_a = a_kind == A_U8 || (a_kind >= A_F32 && mode == 1);
        for (long m = 0; m < M; ++m) {
            if (row_scale) row_scale[m] = rs[m];
            if (row_zp) row_zp[m] = corr[m] - (unsigned_a ? 0 : S_SHIFT);
        }
    }
    free(Ap);
    free(rs);
    free(corr);
    return oom ? -1 : 0;
}

/* Rows of x (f32, [M, K], row stride ldx) quantized as the dynamic path does (mode 0: s8,
 * 1: u8), without any shift: out (int8 / uint8, row stride ldo), scales[m], zps[m]. A row
 * holding NaN / inf gets q = 0 and scale NaN. Returns 0, or -1 when out of memory. */
int rlx_qgemm_quantize_rows(const float *x, long M, long K, long ldx, int mode, void *out,
                            long ldo, float *scales, int32_t *zps) {
    a_t *tmp = (a_t *)malloc((size_t)(K + 16) * sizeof(a_t));
    if (!tmp) return -1;
    for (long m = 0; m < M; ++m) {
        const float *row = x + m * ldx;
        int32_t zp;
        float scale = row_params(row, K, mode, &zp);
        scales[m] = scale;
        zps[m] = zp;
        if (isnan(scale)) {
            for (long k = 0; k < K; ++k) tmp[k] = 0;
        } else if (mode == 0) { /* shifted as the packed activations are (a_t may be u8) */
            quantize_row(row, K, scale, 0, -128, 127, S_SHIFT, tmp);
        } else {
            quantize_row(row, K, scale, zp, 0, 255, 0, tmp);
        }
        if (mode == 0)
            for (long k = 0; k < K; ++k)
                ((int8_t *)out)[m * ldo + k] = isnan(scale) ? 0 : (int8_t)(tmp[k] - S_SHIFT);
        else
            for (long k = 0; k < K; ++k) ((uint8_t *)out)[m * ldo + k] = (uint8_t)tmp[k];
    }
    free(tmp);
    return 0;
}

/* Batched product of two float operands, both quantized per row at run time:
 * Y[b] = f32((qa - za) @ qbt^T) * (sa[m] * (sb[n] * alpha)) for b < nb, where a[b] is
 * [M, K] (a_kind f32 / bf16, batch stride sab, row stride lda, rows quantized by a_mode)
 * and bt[b] is [N, K] f32 (batch stride sbb, row stride ldb; its rows are b's columns,
 * quantized s8). Batches run in parallel (each GEMM on one thread). Returns 0 or -1. */
int rlx_qbatch_run(long nb, long M, long N, long K, int a_kind, const void *A, long sab,
                   long lda, int a_mode, const float *Bt, long sbb, long ldb, float alpha,
                   float *Y, long syb, long ldy, int nthreads) {
    long es = a_kind == A_BF16 ? 2 : 4;
    int failed = 0;
    if (nthreads < 1) nthreads = 1;
    if (nb < 2 || (double)nb * M * N * K < 4e6) nthreads = 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        int8_t *qb = (int8_t *)malloc((size_t)(N * K) + 64);
        float *sb = (float *)malloc((size_t)N * sizeof(float));
        int32_t *zb = (int32_t *)malloc((size_t)N * sizeof(int32_t));
        int32_t *colsum = (int32_t *)malloc((size_t)N * sizeof(int32_t));
        void *bp = aligned_alloc(64, (size_t)round_up(rlx_qgemm_packed_size(K, N), 64) + 64);
        int ok = qb && sb && zb && colsum && bp;
#pragma omp for schedule(dynamic, 1)
        for (long b = 0; b < nb; ++b) {
            if (!ok || rlx_qgemm_quantize_rows(Bt + b * sbb, N, K, ldb, 0, qb, K, sb, zb) != 0) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            for (long n = 0; n < N; ++n) sb[n] = sb[n] * alpha;
            rlx_qgemm_pack_b_strided(qb, 1, K, K, N, bp, colsum);
            if (rlx_qgemm_run(M, N, K, a_kind, (const char *)A + b * sab * es, lda, 0, 1.0f,
                              a_mode, bp, colsum, sb, NULL, ACT_NONE, NULL, 0, Y + b * syb, ldy,
                              NULL, 0, NULL, NULL, 1, 0) != 0) {
#pragma omp atomic write
                failed = 1;
            }
        }
        free(qb), free(sb), free(zb), free(colsum), free(bp);
    }
    return failed ? -1 : 0;
}

/* C (int32, optional) and/or Y (f32, optional) = (A - a_zp) @ B for int8 A.
 * Y[m, n] = (float)acc * scale[n] + (bias ? bias[n] : 0). Returns 0, or -1 when out of
 * memory. */
int rlx_qgemm(long M, long N, long K, const int8_t *A, long lda, int32_t a_zp,
              const void *Bp_, const int32_t *colsum, int32_t *C, float *Y, long ldc,
              const float *scale, const float *bias, int nthreads) {
    return rlx_qgemm_run(M, N, K, A_S8, A, lda, a_zp, 1.0f, 0, Bp_, colsum, scale, bias,
                         ACT_NONE, NULL, 0, Y, ldc, C, ldc, NULL, NULL, nthreads, 0);
}

/* Per-tensor affine quantization of f32 to 8 bits (int8 or uint8 by [qmin, qmax]):
 * out = clamp(round_half_even(x / scale) + zp, qmin, qmax); NaN maps to zp. The division
 * and rounding match NumPy's np.rint(x / scale) in f32 exactly. */
void rlx_quantize_f32_q8(const float *x, long n, float scale, int32_t zp, int32_t qmin,
                         int32_t qmax, uint8_t *out) {
    const float fz = (float)zp, lo = (float)qmin, hi = (float)qmax;
    for (long i = 0; i < n; ++i) {
        /* round half to even without a libm call (vectorises): adding 2^23 to |v| < 2^23
         * leaves no fraction bits, so the FPU's default rounding mode does the work */
        const float v = x[i] / scale, a = fabsf(v);
        float r = a < 8388608.0f ? copysignf((a + 8388608.0f) - 8388608.0f, v) : v;
        r = r == r ? r + fz : fz; /* NaN -> zero point */
        r = r < lo ? lo : r;       /* plain compares: fminf/fmaxf would be libm calls */
        r = r > hi ? hi : r;
        out[i] = (uint8_t)(int32_t)r;
    }
}
