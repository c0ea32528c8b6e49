/* aarch64 NEON micro-kernels of the packed SGEMM (included by sgemm.c's ISA chain on
 * __aarch64__ with __ARM_NEON; the driver, packing and epilogue stay sgemm.c's).
 *
 * MR = 8 rows x NR = 12 columns (BLIS's armv8a blocking): 24 accumulators of 4 floats
 * (q registers), B as 3 vectors per k, A as 2 vectors per k whose lanes feed
 * FMLA-by-element (vfmaq_laneq_f32, `fmla v.4s, vb.4s, va.s[i]`): per k step 5 q-register
 * loads and 24 FMLAs, 29 of the 32 vector registers live. FMLA is fused (one rounding),
 * whatever -ffp-contract says.
 * The same entry points as the x86 kernels:
 *   ukernel (8 rows), ukernel4 / ukernel2 (the last micro-panel of a row block when it has
 *   at most 4 / 2 rows; ukernel_for picks; pack_a zero-fills the rows up to that count),
 *   each with the accumulate flag (c += tile) and the B prefetch (bnext: into L2 PFD k
 *   steps ahead, the last PFD steps prefetching the block the next panel reads; NULL:
 *   16 steps ahead into L1);
 *   ukernel1p / ukernel2p: 1-2 rows x NP = 4 panels (48 columns: 12 / 24 accumulators)
 *   for blocks of at most 2 rows, into a tile.
 * Every output element is one chain of FMAs over k from zero, in k order, in each kernel,
 * then + C when accumulating: a row's bits do not depend on M.
 */
#include <arm_neon.h>

#define MR 8
#define NR 12
#define RLX_SGEMM_LEVEL 3
#define RLX_SGEMM_UKERNELS 1 /* sgemm.c's generic micro-kernels are not built */

#ifndef PF_BYTES
#define PF_BYTES 12288
#endif
#define PFD (PF_BYTES / (NR * 4)) /* 256 k steps of 48 bytes */
#ifndef PFH
#define PFH 2
#endif

/* row i (lane l of the A vector av) of the accumulators += A[i, k] * B[k, 0..12) */
#define SG_ROW(i, av, l)                                                                   \
    if (R > i) {                                                                           \
        acc[i][0] = vfmaq_laneq_f32(acc[i][0], b0, av, l);                                 \
        acc[i][1] = vfmaq_laneq_f32(acc[i][1], b1, av, l);                                 \
        acc[i][2] = vfmaq_laneq_f32(acc[i][2], b2, av, l);                                 \
    }

/* one k step: B's 12 floats and A's (up to) 8, R rows of FMLAs; pf: the B prefetch address
 * (locality h: 2 into L2, 3 into L1) */
#define SG_STEP(pf, h)                                                                     \
    {                                                                                      \
        const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8); \
        const float32x4_t a0 = vld1q_f32(a);                                               \
        __builtin_prefetch((pf), 0, h);                                                    \
        if (h == 3) __builtin_prefetch(a + 16 * MR, 0, 3);                                 \
        SG_ROW(0, a0, 0)                                                                   \
        SG_ROW(1, a0, 1)                                                                   \
        SG_ROW(2, a0, 2)                                                                   \
        SG_ROW(3, a0, 3)                                                                   \
        if (R > 4) {                                                                       \
            const float32x4_t a1 = vld1q_f32(a + 4);                                       \
            SG_ROW(4, a1, 0)                                                               \
            SG_ROW(5, a1, 1)                                                               \
            SG_ROW(6, a1, 2)                                                               \
            SG_ROW(7, a1, 3)                                                               \
        }                                                                                  \
        a += MR;                                                                           \
        b += NR;                                                                           \
    }

/* c[R x NR] (row stride ldc) = (accum ? c : 0) + a_panel @ b_panel over kc steps */
static inline __attribute__((always_inline)) void neon_ukernel(const int R, long kc,
                                                               const float *restrict a,
                                                               const float *restrict b,
                                                               float *restrict c, long ldc,
                                                               int accum, const float *bnext) {
    float32x4_t acc[8][3];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        acc[i][0] = acc[i][1] = acc[i][2] = vdupq_n_f32(0.0f);
        __builtin_prefetch(c + i * ldc, 1, 3);
        __builtin_prefetch(c + i * ldc + NR - 1, 1, 3);
    }
    if (bnext) { /* the first row panel on a B block: B into L2 ahead, then bnext */
        const long kpf = kc > PFD ? kc - PFD : 0;
        long q = 0;
#pragma GCC unroll 2
        for (; q < kpf; q++) SG_STEP(b + PFD * NR, PFH)
        const float *pn = bnext;
#pragma GCC unroll 2
        for (; q < kc; q++) {
            SG_STEP(pn, PFH)
            pn += NR;
        }
    } else {
#pragma GCC unroll 2
        for (long q = 0; q < kc; q++) SG_STEP(b + 16 * NR, 3)
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        float *r = c + i * ldc;
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++) {
            float32x4_t v = acc[i][j];
            if (accum) v = vaddq_f32(v, vld1q_f32(r + 4 * j));
            vst1q_f32(r + 4 * j, v);
        }
    }
}

static void ukernel(long kc, const float *restrict a, const float *restrict b, float *restrict c,
                    long ldc, int accum, const float *bnext) {
    neon_ukernel(8, kc, a, b, c, ldc, accum, bnext);
}
static void ukernel4(long kc, const float *restrict a, const float *restrict b,
                     float *restrict c, long ldc, int accum, const float *bnext) {
    neon_ukernel(4, kc, a, b, c, ldc, accum, bnext);
}
static void ukernel2(long kc, const float *restrict a, const float *restrict b,
                     float *restrict c, long ldc, int accum, const float *bnext) {
    neon_ukernel(2, kc, a, b, c, ldc, accum, bnext);
}

typedef void (*ukernel_fn)(long, const float *restrict, const float *restrict, float *restrict,
                           long, int, const float *);

/* the kernel for a micro-panel of h <= MR rows (it may compute a few zero rows past h) */
static ukernel_fn ukernel_for(long h) {
    if (h <= 2) return ukernel2;
    if (h <= 4) return ukernel4;
    return ukernel;
}

/* R (1 or 2) rows x NP = 4 panels of NR columns (B panels bstride floats apart) into
 * tile[R][NP * NR], from zero: 12 R accumulator chains instead of 3 R on one panel */
#define NP 4
static inline __attribute__((always_inline)) void neon_ukernel_p(const int R, long kc,
                                                                 const float *restrict a,
                                                                 const float *restrict b,
                                                                 long bstride,
                                                                 float *restrict tile) {
    float32x4_t acc[2][3 * NP];
#pragma GCC unroll 2
    for (int i = 0; i < R; i++)
#pragma GCC unroll 12
        for (int p = 0; p < 3 * NP; p++) acc[i][p] = vdupq_n_f32(0.0f);
    for (long q = 0; q < kc; q++) {
        const float32x4_t av = vld1q_f32(a);
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const float *bq = b + p * bstride;
            const float32x4_t b0 = vld1q_f32(bq), b1 = vld1q_f32(bq + 4),
                              b2 = vld1q_f32(bq + 8);
            __builtin_prefetch(bq + PFD * NR, 0, PFH);
            acc[0][3 * p] = vfmaq_laneq_f32(acc[0][3 * p], b0, av, 0);
            acc[0][3 * p + 1] = vfmaq_laneq_f32(acc[0][3 * p + 1], b1, av, 0);
            acc[0][3 * p + 2] = vfmaq_laneq_f32(acc[0][3 * p + 2], b2, av, 0);
            if (R > 1) {
                acc[1][3 * p] = vfmaq_laneq_f32(acc[1][3 * p], b0, av, 1);
                acc[1][3 * p + 1] = vfmaq_laneq_f32(acc[1][3 * p + 1], b1, av, 1);
                acc[1][3 * p + 2] = vfmaq_laneq_f32(acc[1][3 * p + 2], b2, av, 1);
            }
        }
        a += MR;
        b += NR;
    }
#pragma GCC unroll 2
    for (int i = 0; i < R; i++)
#pragma GCC unroll 12
        for (int p = 0; p < 3 * NP; p++) vst1q_f32(tile + i * NP * NR + 4 * p, acc[i][p]);
}

static void ukernel1p(long kc, const float *restrict a, const float *restrict b, long bstride,
                      float *restrict tile) {
    neon_ukernel_p(1, kc, a, b, bstride, tile);
}
static void ukernel2p(long kc, const float *restrict a, const float *restrict b, long bstride,
                      float *restrict tile) {
    neon_ukernel_p(2, kc, a, b, bstride, tile);
}
