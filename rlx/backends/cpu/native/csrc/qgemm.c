/* INT8 GEMM for rlx: C[M,N] = (A[M,K] - a_zp) @ B[K,N], exact int32 accumulation.
 *
 * A: int8 row-major (activations, per-tensor zero point a_zp).
 * B: int8, packed once by rlx_qgemm_pack_b into NR-column panels of KG-deep k groups:
 *      Bp[panel][k / KG][NR][KG]   (KG consecutive k of one column side by side)
 *    plus colsum[n] = sum_k B[k, n].
 *
 * Three paths, chosen at compile time by RLX_ISA (the loader picks the best one the selected
 * build target holds; a path the target's -march flags lack is a compile error):
 *
 *   2  AVX-512 VNNI: vpdpbusd (u8 x s8 -> s32, groups of KG = 4). A is shifted to u8 by
 *      adding 128 (xor 0x80), so the raw sum is sum_k (a + 128) * b and the exact result
 *      is raw - (128 + a_zp) * colsum[n]. Tile MR x NR = 12 x 32 in 24 zmm accumulators.
 *   1  AVX2: vpmaddwd on int16 (s16 x s16 -> s32, pairs: KG = 2; B is packed as int16).
 *      No shift: the result is raw - a_zp * colsum[n]. Tile 6 x 16 in 12 ymm.
 *   0  plain C: the VNNI data layout with scalar code (auto-vectorised by gcc).
 *
 * Blocking: register blocking in the microkernel (one MR x NR tile over the whole K: the
 * A micro-panel MR x K stays in L1); cache blocking over N (blocks of packed B sized to
 * stay in L2 while every row tile of A passes over them); the tiles of a block are
 * distributed over OpenMP threads. A is packed (shifted, K padded to KG, rows padded to
 * MR) once per call, in parallel.
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
#define A_SHIFT 0
typedef int16_t a_t; /* packed activation element */
typedef int16_t b_t; /* packed weight element */
#else
#define MR 12
#define NR 32
#define KG 4
#define A_SHIFT 128
typedef uint8_t a_t;
typedef int8_t b_t;
#endif
#define L2_BYTES (512L * 1024L) /* B block budget: half a 1 MiB L2 */

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

/* Pack B [K, N] (row stride ldb) into Bp and fill colsum[N]. */
void rlx_qgemm_pack_b(const int8_t *B, long ldb, long K, long N, void *Bp_, int32_t *colsum) {
    b_t *Bp = (b_t *)Bp_;
    long kp = round_up(K, KG), np_ = round_up(N, NR);
    long panels = np_ / NR;
    memset(Bp, 0, (size_t)(kp * np_) * sizeof(b_t));
    for (long n = 0; n < N; ++n) colsum[n] = 0;
    for (long p = 0; p < panels; ++p) {
        b_t *dst = Bp + p * kp * NR;
        for (long k = 0; k < K; ++k) {
            const int8_t *src = B + k * ldb;
            for (long c = 0; c < NR; ++c) {
                long n = p * NR + c;
                if (n < N) {
                    dst[(k / KG) * NR * KG + c * KG + (k % KG)] = (b_t)src[n];
                    colsum[n] += src[n];
                }
            }
        }
    }
}

/* Pack MR rows of A starting at row m0 (shifted by A_SHIFT): Ap[k / KG][MR][KG]. */
static void pack_a(const int8_t *A, long lda, long M, long K, long m0, a_t *Ap) {
    long kp = round_up(K, KG);
    memset(Ap, 0, (size_t)(kp * MR) * sizeof(a_t));
    for (long r = 0; r < MR; ++r) {
        long m = m0 + r;
        if (m >= M) break;
        const int8_t *src = A + m * lda;
        for (long k = 0; k < K; ++k)
            Ap[(k / KG) * MR * KG + r * KG + (k % KG)] = (a_t)((int32_t)src[k] + A_SHIFT);
    }
}

static inline int32_t load4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

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

/* ct[MR][NR] = raw u8 x s8 sums over kg groups of four k. */
static void ukernel(long kg, const a_t *ap, const b_t *bp, int32_t *ct) {
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
            c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00,
            c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00, c90 = c00,
            c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
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

/* ct[MR][NR] = raw s16 x s16 sums over kg pairs of k. */
static void ukernel(long kg, const a_t *ap, const b_t *bp, int32_t *ct) {
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
            c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
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
    memset(acc, 0, sizeof(acc));
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

/* C (int32, optional) and/or Y (f32, optional) = (A - a_zp) @ B.
 * Y[m, n] = (float)acc * scale[n] + (bias ? bias[n] : 0). Returns 0, or -1 when out of
 * memory. */
int rlx_qgemm(long M, long N, long K, const int8_t *A, long lda, int32_t a_zp,
              const void *Bp_, const int32_t *colsum, int32_t *C, float *Y, long ldc,
              const float *scale, const float *bias, int nthreads) {
    const b_t *Bp = (const b_t *)Bp_;
    long kp = round_up(K, KG), kg = kp / KG;
    long mb = (M + MR - 1) / MR, nb = (N + NR - 1) / NR;
    if (M <= 0 || N <= 0) return 0;
    size_t ap_bytes = (size_t)round_up(mb * kp * MR * (long)sizeof(a_t), 64);
    a_t *Ap = (a_t *)aligned_alloc(64, ap_bytes ? ap_bytes : 64);
    if (!Ap) return -1;
    const int64_t corr_base = A_SHIFT + (int64_t)a_zp;
    if (nthreads < 1) nthreads = 1;
    /* below ~32M multiply-adds (256^3 is 16.8M) waking a second thread costs more than
     * it saves: measured on a 2-core Zen 4, 256^3 took 0.17 ms on 1 thread, 0.20 ms on 2 */
    if ((double)M * (double)N * (double)K < 3.2e7) nthreads = 1;

#pragma omp parallel for schedule(static) num_threads(nthreads) if (mb > 1 && nthreads > 1)
    for (long i = 0; i < mb; ++i) pack_a(A, lda, M, K, i * MR, Ap + i * kp * MR);

    /* cache blocking: N is walked in blocks of nbc panels whose packed B (K x nbc*NR
     * bytes) fits in L2 (L2_BYTES), so every row tile of A reuses it from L2 */
    long nbc = kp > 0 ? L2_BYTES / (kp * NR * (long)sizeof(b_t)) : nb;
    if (nbc < 1) nbc = 1;
    for (long j0 = 0; j0 < nb; j0 += nbc) {
        long j1 = j0 + nbc < nb ? j0 + nbc : nb;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthreads) if (mb * (j1 - j0) > 1 && nthreads > 1)
        for (long i = 0; i < mb; ++i) {
            for (long j = j0; j < j1; ++j) {
                int32_t ct[MR * NR] __attribute__((aligned(64)));
                ukernel(kg, Ap + i * kp * MR, Bp + j * kp * NR, ct);
                long mr = M - i * MR < MR ? M - i * MR : MR;
                long nr = N - j * NR < NR ? N - j * NR : NR;
                for (long r = 0; r < mr; ++r) {
                    long m = i * MR + r;
                    for (long c = 0; c < nr; ++c) {
                        long n = j * NR + c;
                        int32_t v = (int32_t)((int64_t)ct[r * NR + c] - corr_base * colsum[n]);
                        if (C) C[m * ldc + n] = v;
                        if (Y) {
                            float y = (float)v * scale[n];
                            if (bias) y += bias[n];
                            Y[m * ldc + n] = y;
                        }
                    }
                }
            }
        }
    }
    free(Ap);
    return 0;
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
