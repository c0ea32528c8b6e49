/* Products with 16-bit float weights read where they lie: y = x @ w^T for f32
 * activations x [m, k] (row stride ldx) and a bf16 or f16 weight w [n, k] (rows =
 * output channels, row stride ldw, typically a read-only file mapping), f32 output
 * y [m, n] (row stride ldy).
 *
 * Each weight element is widened exactly to f32 in registers (bf16: the 16 bits shifted
 * up; f16: vcvtph2ps, or the scalar conversion of lowp_cast.c), multiplied by the f32
 * activation and summed in f32: the products and sums of the exactly widened weight, so
 * the error against a float64 product is the f32 accumulation bound. No widened copy of
 * the weight exists anywhere.
 *
 * Blocking: a block of NR = 4 weight rows is read once per MR activation rows (MR = 4 on
 * AVX-512, 2 on AVX2, 4 on portable C), the MR x NR dot products accumulated in vector
 * registers over k and reduced at the end; a block's rows stay in L1 while every
 * activation row passes over them, so the weight is streamed from memory once per call.
 * Rows of w are split over `threads` OpenMP threads in contiguous ranges (multiples of
 * NR rows); a product below PAR_MIN multiply-adds runs on one thread.
 *
 * Code paths, picked per call by `level` (clamped to rlx_hl_max_level(), the best
 * one this library was compiled for):
 *   3  aarch64 NEON (csrc/lowp_neon.h): 4 lanes, 8 elements per step (USHLL for bf16,
 *      FCVTL for f16), MR = 4, scalar k tail.
 *   2  AVX-512 (F + BW + VL): 16 lanes, masked loads for the k tail.
 *   1  AVX2 + F16C + FMA: 8 lanes, scalar k tail.
 *   0  portable C: 8 partial sums per dot product (vectorised by the compiler).
 * `kind`: 0 bf16, 1 f16.
 */
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define HL_HAVE_512 1
#else
#define HL_HAVE_512 0
#endif
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define HL_HAVE_256 1
#else
#define HL_HAVE_256 0
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define HL_HAVE_NEON 1
#include "lowp_neon.h"
#else
#define HL_HAVE_NEON 0
#endif

#define HL_NR 4
#define PAR_MIN (1L << 17)
#define HL_INLINE static inline __attribute__((always_inline))
/* activation rows kept in L2 while a thread's weight rows pass over them */
#define HL_X_BYTES (192L << 10)

/* rows of x per pass over the weight: about HL_X_BYTES of them, a multiple of mr */
static inline long hl_mc(long k, long mr) {
    long rows = HL_X_BYTES / (4 * (k > 0 ? k : 1));
    rows = rows / mr * mr;
    return rows < mr ? mr : rows;
}

int rlx_hl_max_level(void) {
#if HL_HAVE_NEON
    return 3;
#elif HL_HAVE_512
    return 2;
#elif HL_HAVE_256
    return 1;
#else
    return 0;
#endif
}

int rlx_hl_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* ---- scalar widening (exact) ----------------------------------------------------- */

static inline float hl_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#include "f16_bits.h"

HL_INLINE float hl_widen(uint16_t h, int kind) {
    return hl_bits_f32(kind ? rlx_f16_bits(h) : ((uint32_t)h << 16));
}

/* ---- portable C ------------------------------------------------------------------- */

#define HL_CL 8   /* partial sums per dot product */
#define HL_CK 256 /* weight elements widened at a time */

/* y[i, j] for i < mr, j < nr of one block: each weight row's chunk is widened once into
 * wf and applied to every activation row */
HL_INLINE void hl_block_c(const float *x, long ldx, int mr, const uint16_t *w, long ldw,
                          int nr, long k, int kind, float *y, long ldy) {
    float acc[4][HL_NR][HL_CL];
    union {
        float f[HL_NR][HL_CK];
        uint32_t u[HL_NR][HL_CK];
    } wf;
    memset(acc, 0, sizeof acc);
    for (long k0 = 0; k0 < k; k0 += HL_CK) {
        long kc = k - k0 < HL_CK ? k - k0 : HL_CK;
        for (int j = 0; j < nr; j++) {
            const uint16_t *wr = w + j * ldw + k0;
            uint32_t *wb = wf.u[j];
            if (kind)
                for (long t = 0; t < kc; t++) wb[t] = rlx_f16_bits(wr[t]);
            else
                for (long t = 0; t < kc; t++) wb[t] = (uint32_t)wr[t] << 16;
            for (long t = kc; t < (kc + HL_CL - 1) / HL_CL * HL_CL; t++) wf.f[j][t] = 0.0f;
        }
        long kv = (kc + HL_CL - 1) / HL_CL * HL_CL;
        for (int i = 0; i < mr; i++) {
            const float *xr = x + i * ldx + k0;
            float xs[HL_CK];
            for (long t = 0; t < kc; t++) xs[t] = xr[t];
            for (long t = kc; t < kv; t++) xs[t] = 0.0f;
            for (int j = 0; j < nr; j++) {
                float a[HL_CL];
                const float *wj = wf.f[j];
                for (int l = 0; l < HL_CL; l++) a[l] = acc[i][j][l];
                for (long t = 0; t < kv; t += HL_CL)
                    for (int l = 0; l < HL_CL; l++) a[l] += xs[t + l] * wj[t + l];
                for (int l = 0; l < HL_CL; l++) acc[i][j][l] = a[l];
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float s = 0.0f;
            for (int l = 0; l < HL_CL; l++) s += acc[i][j][l];
            y[i * ldy + j] = s;
        }
}

static void hl_rows_c(const float *x, long m, long ldx, const uint16_t *w, long n0, long n1,
                      long k, long ldw, int kind, float *y, long ldy) {
    long mc = hl_mc(k, 4);
    for (long i0 = 0; i0 < m; i0 += mc) {
        long i1 = m - i0 < mc ? m : i0 + mc;
        for (long j = n0; j < n1; j += HL_NR) {
            int nr = n1 - j < HL_NR ? (int)(n1 - j) : HL_NR;
            for (long i = i0; i < i1; i += 4) {
                int mr = i1 - i < 4 ? (int)(i1 - i) : 4;
                hl_block_c(x + i * ldx, ldx, mr, w + j * ldw, ldw, nr, k, kind, y + i * ldy + j,
                           ldy);
            }
        }
    }
}

#define HL_ROWS(NAME, BLOCK, MRMAX)                                                          \
    static void NAME(const float *x, long m, long ldx, const uint16_t *w, long n0, long n1,  \
                     long k, long ldw, int kind, float *y, long ldy) {                       \
        long mc = hl_mc(k, MRMAX);                                                           \
        for (long i0 = 0; i0 < m; i0 += mc) {                                                \
        long i1 = m - i0 < mc ? m : i0 + mc;                                                 \
        for (long j = n0; j < n1; j += HL_NR) {                                              \
            const uint16_t *wj = w + j * ldw;                                                \
            float *yj = y + j;                                                               \
            if (n1 - j >= HL_NR) {                                                           \
                long i = i0;                                                                 \
                for (; i + MRMAX <= i1; i += MRMAX) {                                        \
                    if (kind) BLOCK(x + i * ldx, ldx, MRMAX, wj, ldw, HL_NR, k, 1, yj + i * ldy, ldy); \
                    else BLOCK(x + i * ldx, ldx, MRMAX, wj, ldw, HL_NR, k, 0, yj + i * ldy, ldy); \
                }                                                                            \
                for (; i < i1; i++) {                                                        \
                    if (kind) BLOCK(x + i * ldx, ldx, 1, wj, ldw, HL_NR, k, 1, yj + i * ldy, ldy); \
                    else BLOCK(x + i * ldx, ldx, 1, wj, ldw, HL_NR, k, 0, yj + i * ldy, ldy); \
                }                                                                            \
            } else {                                                                         \
                for (long jj = 0; jj < n1 - j; jj++)                                         \
                    for (long i = i0; i < i1; i++) {                                         \
                        if (kind) BLOCK(x + i * ldx, ldx, 1, wj + jj * ldw, ldw, 1, k, 1, yj + i * ldy + jj, ldy); \
                        else BLOCK(x + i * ldx, ldx, 1, wj + jj * ldw, ldw, 1, k, 0, yj + i * ldy + jj, ldy); \
                    }                                                                        \
            }                                                                                \
        }                                                                                    \
        }                                                                                    \
    }

/* ---- AVX2 + F16C ------------------------------------------------------------------- */
#if HL_HAVE_256

HL_INLINE __m256 hl_load8(const uint16_t *p, int kind) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (kind) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

HL_INLINE float hl_sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* MR x NR dot products (MR <= 2, NR <= 4: compile-time after inlining) */
HL_INLINE void hl_block_256(const float *x, long ldx, int MR, const uint16_t *w, long ldw,
                            int NR, long k, int kind, float *y, long ldy) {
    __m256 acc[2][HL_NR];
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
    long t = 0;
    for (; t + 8 <= k; t += 8) {
        __m256 wv[HL_NR];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) wv[j] = hl_load8(w + j * ldw + t, kind);
#pragma GCC unroll 2
        for (int i = 0; i < MR; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * ldx + t);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            float s = hl_sum8(acc[i][j]);
            for (long u = t; u < k; u++) s += x[i * ldx + u] * hl_widen(w[j * ldw + u], kind);
            y[i * ldy + j] = s;
        }
}

HL_ROWS(hl_rows_256, hl_block_256, 2)
#endif

/* ---- AVX-512 ------------------------------------------------------------------------ */
#if HL_HAVE_512

HL_INLINE __m512 hl_load16(const uint16_t *p, int kind) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (kind) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

HL_INLINE __m512 hl_load16_tail(const uint16_t *p, __mmask16 mk, int kind) {
    __m256i h = _mm256_maskz_loadu_epi16(mk, p);
    if (kind) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* MR x NR dot products (MR <= 4, NR <= 4: compile-time after inlining) */
HL_INLINE void hl_block_512(const float *x, long ldx, int MR, const uint16_t *w, long ldw,
                            int NR, long k, int kind, float *y, long ldy) {
    __m512 acc[4][HL_NR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
    long t = 0;
    for (; t + 16 <= k; t += 16) {
        __m512 wv[HL_NR];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) wv[j] = hl_load16(w + j * ldw + t, kind);
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            __m512 xv = _mm512_loadu_ps(x + i * ldx + t);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (t < k) {
        __mmask16 mk = (__mmask16)((1u << (k - t)) - 1u);
        __m512 wv[HL_NR];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) wv[j] = hl_load16_tail(w + j * ldw + t, mk, kind);
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            __m512 xv = _mm512_maskz_loadu_ps(mk, x + i * ldx + t);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
}

HL_ROWS(hl_rows_512, hl_block_512, 4)
#endif

/* ---- aarch64 NEON ------------------------------------------------------------------ */
#if HL_HAVE_NEON

/* MR x NR dot products (MR <= 4, NR <= 4: compile-time after inlining): 16 accumulators,
 * 8 widened weight vectors and 2 activation vectors of the 32 registers */
HL_INLINE void hl_block_neon(const float *x, long ldx, int MR, const uint16_t *w, long ldw,
                             int NR, long k, int kind, float *y, long ldy) {
    float32x4_t acc[4][HL_NR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[i][j] = vdupq_n_f32(0.0f);
    long t = 0;
    for (; t + 8 <= k; t += 8) {
        float32x4_t wl[HL_NR], wh[HL_NR];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) lowp_neon_widen8(w + j * ldw + t, kind, &wl[j], &wh[j]);
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            float32x4_t xl = vld1q_f32(x + i * ldx + t), xh = vld1q_f32(x + i * ldx + t + 4);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++)
                acc[i][j] = vfmaq_f32(vfmaq_f32(acc[i][j], xl, wl[j]), xh, wh[j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            float s = vaddvq_f32(acc[i][j]);
            for (long u = t; u < k; u++) s += x[i * ldx + u] * hl_widen(w[j * ldw + u], kind);
            y[i * ldy + j] = s;
        }
}

HL_ROWS(hl_rows_neon, hl_block_neon, 4)
#endif

/* ---- entry point --------------------------------------------------------------------- */

typedef void (*hl_rows_fn)(const float *, long, long, const uint16_t *, long, long, long, long,
                           int, float *, long);

/* y[m, n] = x[m, k] @ w[n, k]^T (module comment). */
void rlx_half_linear(const float *x, long m, long ldx, const void *w, long n, long k, long ldw,
                     int kind, float *y, long ldy, int threads, int level) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        for (long i = 0; i < m; i++)
            for (long j = 0; j < n; j++) y[i * ldy + j] = 0.0f;
        return;
    }
    hl_rows_fn rows = hl_rows_c;
    int top = rlx_hl_max_level();
    if (level > top) level = top;
#if HL_HAVE_NEON
    if (level >= 3) rows = hl_rows_neon;
#endif
#if HL_HAVE_512
    if (level >= 2) rows = hl_rows_512;
#endif
#if HL_HAVE_256
    if (level == 1) rows = hl_rows_256;
#endif
    const uint16_t *wh = (const uint16_t *)w;
    long blocks = (n + HL_NR - 1) / HL_NR;
    long work = m * n * k;
    int nt = threads < 1 ? 1 : threads;
    if (work < PAR_MIN) nt = 1;
    if (nt > blocks) nt = (int)blocks;
    if (nt <= 1) {
        rows(x, m, ldx, wh, 0, n, k, ldw, kind, y, ldy);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), tn = omp_get_num_threads();
        long b0 = blocks * t / tn, b1 = blocks * (t + 1) / tn;
        long n0 = b0 * HL_NR, n1 = b1 * HL_NR < n ? b1 * HL_NR : n;
        if (n0 < n1) rows(x, m, ldx, wh, n0, n1, k, ldw, kind, y, ldy);
    }
#else
    rows(x, m, ldx, wh, 0, n, k, ldw, kind, y, ldy);
#endif
}
