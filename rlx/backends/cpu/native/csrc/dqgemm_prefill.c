/* Prefill GEMM on GGUF-packed weights (rlx's dqprefill library):
 * Y[M, N] = X[M, K] @ dequant(W)[N, K]^T for M > 16 (a prompt), reading the packed bytes.
 *
 * The product is computed transposed, Y^T = W X^T, by a register-blocked f32 micro-kernel
 * of the packed SGEMM's design (csrc/sgemm.c): MW weight rows x NT tokens of
 * accumulators (AVX-512: 14 x 32, 28 zmm; AVX2 + FMA: 6 x 16, 12 ymm; portable: 6 x 8 of
 * 4-float SSE2 vectors, mul + add), one weight value broadcast per row and k step, the
 * tokens in the vector lanes. So the weight never needs a transposed copy:
 *   - X is packed once per call into token panels Xt[p][k][NT] (NT tokens per panel, the
 *     last one zero-padded), in parallel;
 *   - a thread takes a block of MW weight rows (OpenMP, dynamic over the N / MW blocks:
 *     both cores busy at 2 threads) and, per K block of at most KCW weights, decodes the
 *     MW rows' blocks straight into a row-major f32 panel wbuf[MW][KCS] (contiguous per
 *     row, so the decoders vectorize; row stride KCS a compile-time constant, so the
 *     kernel addresses all rows from one pointer);
 *   - the kernel runs over every token panel, accumulating the MW x NT tile over the K
 *     blocks in a per-thread buffer, which is written transposed into Y at the end.
 * Every weight is decoded once per call (its cost is spread over the M tokens) with the
 * exact arithmetic of ggml-quants.c / rlx.formats.gguf (so the decoded values are those of
 * gguf.quants bit for bit); products and sums are f32 (the f32 accumulation bound).
 *
 * Weights: the GGUF block layouts (codes: Q4_0 10, Q4_1 11, Q5_0 12, Q5_1 13, Q8_0 14,
 * Q2_K 20, Q3_K 21, Q4_K 22, Q5_K 23, Q6_K 24, Q8_K 25), plain or row-interleaved in groups
 * of R rows (csrc/dq_layout.h: row n's blocks from dq_row_start(), dq_block_stride() apart).
 *
 * The integer path (int8 activations, rlx_dqp_gemm_q8) is dqgemm_prefill_q8.c,
 * concatenated after this file.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "dq_layout.h"

#if defined(__AVX512F__)
#define VL 16
#define MW 14
#define DQP_LEVEL 2
#elif defined(__AVX2__) && defined(__FMA__)
#define VL 8
#define MW 6
#define DQP_LEVEL 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define DQ_NEON_PART 4
#include "dqgemm_neon.h"
#undef DQ_NEON_PART
#else
#define VL 4
#define MW 6
#define DQP_LEVEL 0
#endif
#define NT (2 * VL) /* tokens per panel */
#define KCW 512     /* weights per K block (a multiple of 256) */
#define KCS (KCW + 16) /* row stride of the decoded panel (off the 4 KB L1 set stride) */

typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vfu __attribute__((vector_size(VL * 4), aligned(4)));

enum {
    P_Q4_0 = 10, P_Q4_1 = 11, P_Q5_0 = 12, P_Q5_1 = 13, P_Q8_0 = 14,
    P_Q2_K = 20, P_Q3_K = 21, P_Q4_K = 22, P_Q5_K = 23, P_Q6_K = 24, P_Q8_K = 25
};

/* ---- exact block decoders ------------------------------------------------------------ */
static inline float p_f32_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* IEEE half (little-endian bytes) -> f32, exact */
static inline float p_h2f(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (e == 31) return p_f32_bits(sign | 0x7F800000u | (m << 13));
    return p_f32_bits(sign | ((e + 112) << 23) | (m << 13));
}

/* the block size (weights) and bytes per block of a code; 0 for an unknown code */
static long p_qk(int code) { return code >= 20 ? 256 : code >= 10 && code <= 14 ? 32 : 0; }
static long p_bb(int code) {
    static const long b[] = {18, 20, 22, 24, 34};
    static const long k[] = {84, 110, 144, 176, 210, 292};
    if (code >= 10 && code <= 14) return b[code - 10];
    if (code >= 20 && code <= 25) return k[code - 20];
    return 0;
}

/* K-quant 6-bit scale j and min of Q4_K / Q5_K */
static inline void p_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Decode the block at p (scheme code) into out[0 .. qk): the arithmetic of
 * rlx.formats.gguf, in the same order (bit-exact values). */
static void p_decode(int code, const uint8_t *p, float *restrict out) {
    switch (code) {
    case P_Q4_0: {
        const float d = p_h2f(p);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)((int)(p[2 + j] & 15) - 8);
            out[j + 16] = d * (float)((int)(p[2 + j] >> 4) - 8);
        }
        break;
    }
    case P_Q4_1: {
        const float d = p_h2f(p), m = p_h2f(p + 2);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)(p[4 + j] & 15) + m;
            out[j + 16] = d * (float)(p[4 + j] >> 4) + m;
        }
        break;
    }
    case P_Q5_0:
    case P_Q5_1: {
        const int one = code == P_Q5_1;
        const float d = p_h2f(p), m = one ? p_h2f(p + 2) : 0.0f;
        const uint8_t *qhp = p + 2 + 2 * one, *qs = qhp + 4;
        uint32_t qh;
        memcpy(&qh, qhp, 4);
        int v[32];
        for (int j = 0; j < 16; j++) {
            v[j] = (qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
            v[j + 16] = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        }
        if (one)
            for (int j = 0; j < 32; j++) out[j] = d * (float)v[j] + m;
        else
            for (int j = 0; j < 32; j++) out[j] = d * (float)(v[j] - 16);
        break;
    }
    case P_Q8_0: {
        const float d = p_h2f(p);
        const int8_t *qs = (const int8_t *)(p + 2);
        for (int j = 0; j < 32; j++) out[j] = (float)qs[j] * d;
        break;
    }
    case P_Q2_K: {
        const uint8_t *sc = p, *qs = p + 16;
        const float d = p_h2f(p + 80), dmin = p_h2f(p + 82);
        for (int h = 0; h < 2; h++)
            for (int sh = 0; sh < 4; sh++)
                for (int half16 = 0; half16 < 2; half16++) {
                    const int is = h * 8 + sh * 2 + half16;
                    const float dl = d * (float)(sc[is] & 15), ml = dmin * (float)(sc[is] >> 4);
                    const uint8_t *q = qs + h * 32 + half16 * 16;
                    float *o = out + h * 128 + sh * 32 + half16 * 16;
                    for (int l = 0; l < 16; l++) o[l] = dl * (float)((q[l] >> (2 * sh)) & 3) - ml;
                }
        break;
    }
    case P_Q3_K: {
        const uint8_t *hm = p, *qs = p + 32, *sc = p + 96;
        const float d = p_h2f(p + 108);
        int scl[16];
        for (int i = 0; i < 16; i++) {
            int lo = i < 8 ? (sc[i] & 15) : (sc[i - 8] >> 4);
            int hi = (sc[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
            scl[i] = (lo | (hi << 4)) - 32;
        }
        for (int h = 0; h < 2; h++)
            for (int sh = 0; sh < 4; sh++)
                for (int half16 = 0; half16 < 2; half16++) {
                    const int is = h * 8 + sh * 2 + half16, bit = h * 4 + sh;
                    const float dl = d * (float)scl[is];
                    const uint8_t *q = qs + h * 32 + half16 * 16, *hq = hm + half16 * 16;
                    float *o = out + h * 128 + sh * 32 + half16 * 16;
                    for (int l = 0; l < 16; l++) {
                        int v = ((q[l] >> (2 * sh)) & 3) - (((hq[l] >> bit) & 1) ? 0 : 4);
                        o[l] = dl * (float)v;
                    }
                }
        break;
    }
    case P_Q4_K:
    case P_Q5_K: {
        const int five = code == P_Q5_K;
        const float d = p_h2f(p), dmin = p_h2f(p + 2);
        const uint8_t *q = p + 4, *qh = p + 16, *ql = p + 16 + 32 * five;
        for (int j = 0; j < 8; j++) {
            int scj, mj;
            p_scale_min_k4(j, q, &scj, &mj);
            const float d1 = d * (float)scj, m1 = dmin * (float)mj;
            const uint8_t *c = ql + (j >> 1) * 32;
            const int shift = (j & 1) * 4;
            float *o = out + j * 32;
            if (five)
                for (int l = 0; l < 32; l++)
                    o[l] = d1 * (float)(((c[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4)) - m1;
            else
                for (int l = 0; l < 32; l++) o[l] = d1 * (float)((c[l] >> shift) & 15) - m1;
        }
        break;
    }
    case P_Q6_K: {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = p_h2f(p + 208);
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++)
                for (int half16 = 0; half16 < 2; half16++) {
                    const float dl = d * (float)sc[h * 8 + g * 2 + half16];
                    const uint8_t *lq = ql + h * 64 + (g & 1) * 32 + half16 * 16;
                    const uint8_t *hq = qh + h * 32 + half16 * 16;
                    const int lsh = (g >> 1) * 4, hsh = 2 * g;
                    float *o = out + h * 128 + g * 32 + half16 * 16;
                    for (int l = 0; l < 16; l++) {
                        int v = (((lq[l] >> lsh) & 15) | (((hq[l] >> hsh) & 3) << 4)) - 32;
                        o[l] = dl * (float)v;
                    }
                }
        break;
    }
    case P_Q8_K: {
        float d;
        memcpy(&d, p, 4);
        const int8_t *qs = (const int8_t *)(p + 4);
        for (int j = 0; j < 256; j++) out[j] = d * (float)qs[j];
        break;
    }
    default:
        break;
    }
}

/* ---- the packed weight ------------------------------------------------------------- */
typedef struct {
    int code, r;     /* scheme code; rows interleaved per group (1: plain) */
    long qk, bb, nb; /* weights and bytes per block, blocks per row */
    long n;          /* rows */
    const uint8_t *w;
} pw_t;

/* blocks [b0, b0 + nblk) of row n into out (qk floats each) */
static inline void p_decode_row(const pw_t *s, long n, long b0, long nblk, float *out) {
    const uint8_t *row = dq_row_start(s->w, n, s->n, s->nb, s->bb, s->r);
    const int64_t st = dq_block_stride(n, s->n, s->bb, s->r);
    for (long b = 0; b < nblk; b++) p_decode(s->code, row + (b0 + b) * st, out + b * s->qk);
}

/* ---- scratch ------------------------------------------------------------------------ */
static void *p_alloc(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

/* X [M, K] (row stride ldx) into token panels xt[p][k][NT], tokens past M zero */
static void p_pack_x(const float *x, long ldx, long M, long K, float *xt, int threads) {
    const long np = (M + NT - 1) / NT;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (long p = 0; p < np; p++) {
        float *d = xt + p * K * NT;
        const long h = M - p * NT < NT ? M - p * NT : NT;
        for (long k0 = 0; k0 < K; k0 += 64) {
            const long kl = K - k0 < 64 ? K - k0 : 64;
            for (long i = 0; i < NT; i++) {
                if (i < h) {
                    const float *s = x + (p * NT + i) * ldx + k0;
                    for (long k = 0; k < kl; k++) d[(k0 + k) * NT + i] = s[k];
                } else {
                    for (long k = 0; k < kl; k++) d[(k0 + k) * NT + i] = 0.0f;
                }
            }
        }
    }
}

/* ---- micro-kernel: c[MW][NT] (+)= wbuf[MW][kc] (row stride KCS) x xt[kc][NT] ------------- */
/* NV vectors of tokens (1: a last panel of at most VL tokens). Only this function
 * contracts a * b + c into FMAs (the library is built with -ffp-contract=off). */
#define PFX 8 /* k steps of X prefetched ahead */
#define UKERNEL(NAME, NV)                                                                  \
    __attribute__((optimize("fp-contract=fast"))) static void NAME(                        \
        long kc, const float *restrict w, const float *restrict b, float *restrict c,      \
        int accum) {                                                                       \
        vf acc[MW][NV];                                                                    \
        _Pragma("GCC unroll 16") for (int i = 0; i < MW; i++)                              \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) acc[i][v] =               \
                accum ? *(const vf *)(c + i * NT + v * VL) : (vf){0};                      \
        _Pragma("GCC unroll 2") for (long q = 0; q < kc; q++) {                            \
            vf bv[NV];                                                                     \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) bv[v] =                   \
                *(const vf *)(b + q * NT + v * VL);                                        \
            __builtin_prefetch(b + (q + PFX) * NT, 0, 3);                                  \
            _Pragma("GCC unroll 16") for (int i = 0; i < MW; i++) {                        \
                const float a = w[i * KCS + q];                                            \
                _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) acc[i][v] =           \
                    a * bv[v] + acc[i][v];                                                 \
            }                                                                              \
        }                                                                                  \
        _Pragma("GCC unroll 16") for (int i = 0; i < MW; i++)                              \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)                           \
                *(vf *)(c + i * NT + v * VL) = acc[i][v];                                  \
    }
UKERNEL(p_ukernel2, 2)
UKERNEL(p_ukernel1, 1)

/* ---- the f32 driver ----------------------------------------------------------------- */
static int p_gemm_f32(const pw_t *s, long M, long N, long K, const float *xt, float *y,
                      long ldy, int threads) {
    const long np = (M + NT - 1) / NT, nblocks = (N + MW - 1) / MW;
    const long last_w = M - (np - 1) * NT; /* tokens in the last panel */
    const long bpk = KCW / s->qk;          /* blocks per K block */
    int fail = 0;
    if (threads > nblocks) threads = (int)nblocks;
#pragma omp parallel num_threads(threads) reduction(| : fail)
    {
        float *wbuf = (float *)p_alloc((size_t)MW * KCS * 4);
        float *tile = (float *)p_alloc((size_t)np * MW * NT * 4);
        if (!wbuf || !tile) fail = 1;
        else memset(wbuf, 0, (size_t)MW * KCS * 4);
#pragma omp for schedule(dynamic, 1)
        for (long blk = 0; blk < nblocks; blk++) {
            if (!wbuf || !tile) continue;
            const long n0 = blk * MW, mw = N - n0 < MW ? N - n0 : MW;
            for (long b0 = 0; b0 < s->nb; b0 += bpk) {
                const long nblk = s->nb - b0 < bpk ? s->nb - b0 : bpk, kc = nblk * s->qk;
                for (long i = 0; i < mw; i++) p_decode_row(s, n0 + i, b0, nblk, wbuf + i * KCS);
                if (mw < MW && b0 == 0)
                    for (long i = mw; i < MW; i++) memset(wbuf + i * KCS, 0, KCS * 4);
                const float *xk = xt + b0 * s->qk * NT;
                for (long p = 0; p < np; p++) {
                    float *c = tile + p * MW * NT;
                    if (p == np - 1 && last_w <= VL)
                        p_ukernel1(kc, wbuf, xk + p * K * NT, c, b0 != 0);
                    else
                        p_ukernel2(kc, wbuf, xk + p * K * NT, c, b0 != 0);
                }
            }
            for (long m = 0; m < M; m++) {
                const float *t = tile + (m / NT) * MW * NT + m % NT;
                float *yr = y + m * ldy + n0;
                for (long i = 0; i < mw; i++) yr[i] = t[i * NT];
            }
        }
        free(wbuf);
        free(tile);
    }
    return fail;
}

/* ---- entry points ------------------------------------------------------------------- */
static int p_check(int code, long qk, long bb, long M, long N, long K, int r, int threads) {
    if (p_qk(code) == 0 || qk != p_qk(code) || bb != p_bb(code)) return 2;
    if (M < 0 || N < 0 || K < 0 || K % qk || threads < 1 || (r != 1 && r != 4 && r != 8))
        return 2;
    return 0;
}

/* Y[M, N] (row stride ldy) = X[M, K] (row stride ldx) @ dequant(W)^T, f32 products; W of
 * scheme `code` (qk weights, bb bytes per block), r rows interleaved (1, 4 or 8).
 * Returns 0, 1 when a scratch buffer could not be allocated, 2 on bad arguments. */
int rlx_dqp_gemm(int code, long qk, long bb, int r, long M, long N, long K, const float *x,
                 long ldx, const uint8_t *w, float *y, long ldy, int threads) {
    if (p_check(code, qk, bb, M, N, K, r, threads)) return 2;
    if (M == 0 || N == 0) return 0;
    if (K == 0) {
        for (long m = 0; m < M; m++) memset(y + m * ldy, 0, (size_t)N * 4);
        return 0;
    }
    pw_t s = {code, r, qk, bb, K / qk, N, w};
    const long np = (M + NT - 1) / NT;
    float *xt = (float *)p_alloc((size_t)np * NT * K * 4);
    if (!xt) return 1;
    p_pack_x(x, ldx, M, K, xt, threads);
    int rc = p_gemm_f32(&s, M, N, K, xt, y, ldy, threads);
    free(xt);
    return rc;
}

/* Decode rows [n0, n0 + rows) of W into out [rows, K] (tests). 0, or 2 on bad arguments. */
int rlx_dqp_decode(int code, long qk, long bb, int r, long N, long K, const uint8_t *w, long n0,
                   long rows, float *out) {
    if (p_check(code, qk, bb, 1, N, K, r, 1) || n0 < 0 || n0 + rows > N) return 2;
    pw_t s = {code, r, qk, bb, K / qk, N, w};
    for (long i = 0; i < rows; i++) p_decode_row(&s, n0 + i, 0, s.nb, out + i * K);
    return 0;
}

int rlx_dqp_level(void) { return DQP_LEVEL; }
int rlx_dqp_mw(void) { return MW; }
int rlx_dqp_nt(void) { return NT; }
int rlx_dqp_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
