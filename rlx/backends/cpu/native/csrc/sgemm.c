/* Packed f32 GEMM for rlx: C[M,N] = epilogue(A[M,K] @ B[K,N]), Goto/BLIS style.
 *
 * Compiled after the codegen prelude (native/sgemm.py prepends it: rlx_f32_to_bf16,
 * rlx_sigmoidf and, when glibc's libmvec is loaded, the SIMD declarations of erf/tanh/exp
 * so the epilogue loops vectorise).
 *
 * Micro-kernel, chosen by the build target's macros (native/cpu.py Target), written with
 * GCC vector extensions (gcc emits vfmadd231ps; no immintrin.h, whose parsing was half of
 * the build time):
 *   AVX-512  MR = 14 rows x NR = 32 columns: 28 zmm accumulators, 2 zmm of B, A[i, k]
 *            broadcast from memory (vbroadcastss);
 *   AVX2+FMA MR = 6 x NR = 16: 12 ymm accumulators, 2 ymm of B, 1 broadcast;
 *   portable MR = 6 x NR = 8: 12 accumulators of 4 floats (SSE2 mul + add on x86-64);
 *   aarch64 NEON MR = 8 x NR = 12 (sgemm_neon.h: FMLA by element, 24 q accumulators).
 *   The last micro-panel of a row block, when it has fewer than MR rows, runs a kernel of
 *   2, 4 or 8 rows (the smallest that covers it) instead of all MR: skinny products (M =
 *   16 tokens: 14 + 2 rows on AVX-512) no longer pay for MR rows of zeros. A block of 1
 *   or 2 rows (M <= 2) runs 4 column panels at once (8 or 16 accumulator chains).
 *   The first row panel on each B block prefetches B into L2 ahead of use (and the next
 *   panel's block at its end): skinny products are bound by streaming the weights.
 * B: packed by rlx_sgemm_pack_b (from any strides) into panels of NR columns, panel p
 *    holding B[k, p*NR .. p*NR+NR) for k = 0..K-1 contiguously (NR floats per k; the last
 *    panel zero-padded). Weights are packed once (param prologue); activations per call.
 * A: packed per (row block, K block) into micro-panels of MR rows (MR floats per k, rows
 *    past M zero), in a per-thread buffer kept between calls.
 * Blocking: K in equal blocks of at most KC (the B micro-panel KC x NR and an A
 *    micro-panel stream from L2: measured faster than a KC-in-L1 block, which makes
 *    more passes over C), MC rows so the A block (MC x KC) takes half of L2, NC columns
 *    per B block; rlx_sgemm_set_blocking gets them from the CPU's cache sizes
 *    (sgemm.py reads sysfs).
 * Epilogue, applied to each tile on its last K block while it is in L1:
 *    out = act(alpha * acc + bias[j]) + res[i, j], stored f32 or rounded once to bf16
 *    (round to nearest even, as ml_dtypes). act: 0 none, 1 relu, 2 gelu (erf), 3
 *    gelu_tanh, 4 silu, 5 tanh: the formulas of codegen/elementwise.py, with erf and tanh
 *    as f32 rational functions (erf_f32, tanh_f32: a few eps from the f64 ones).
 *    A bf16 output takes the whole K in one block (no f32 partial sums in the output).
 * Threads: the M x N output is split into a tm x tn grid of rectangles (rows first; the
 *    columns when M has too few micro-panels), one per OpenMP thread; products under
 *    2^20 multiply-adds run on one thread (waking a team costs more).
 */
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define MR 14
#define NR 32
#define RLX_SGEMM_LEVEL 2
#elif defined(__AVX2__) && defined(__FMA__)
#define MR 6
#define NR 16
#define RLX_SGEMM_LEVEL 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include "sgemm_neon.h"
#else
#define MR 6
#define NR 8
#define RLX_SGEMM_LEVEL 0
#endif

static long g_kc = 1024, g_l2 = 1L << 20, g_nc = 4096;

int rlx_sgemm_level(void) { return RLX_SGEMM_LEVEL; }
int rlx_sgemm_mr(void) { return MR; }
int rlx_sgemm_nr(void) { return NR; }
int rlx_sgemm_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* kc: the largest K block (K is split into equal blocks of at most kc); l2: the bytes
 * the A block (MC x KC) may take; nc: the columns of a B block */
void rlx_sgemm_set_blocking(long kc, long l2, long nc) {
    if (kc >= 16) g_kc = kc;
    if (l2 >= 4096) g_l2 = l2;
    if (nc >= NR) g_nc = (nc / NR) * NR;
}

long rlx_sgemm_packed_size(long k, long n) { return ((n + NR - 1) / NR) * NR * (k > 0 ? k : 0); }

/* ---- packing ------------------------------------------------------------------------ */

static void pack_b_panels(const float *b, long rsb, long csb, long k, long n, float *out,
                          long p0, long p1) {
    for (long p = p0; p < p1; p++) {
        long j0 = p * NR, w = n - j0 < NR ? n - j0 : NR;
        float *d = out + p * k * NR;
        if (csb == 1 && w == NR) {
            for (long q = 0; q < k; q++) memcpy(d + q * NR, b + q * rsb + j0, NR * sizeof(float));
        } else if (rsb == 1) {  /* transposed source: walk each column along k */
            for (long j = 0; j < NR; j++) {
                if (j < w) {
                    const float *s = b + (j0 + j) * csb;
                    for (long q = 0; q < k; q++) d[q * NR + j] = s[q];
                } else {
                    for (long q = 0; q < k; q++) d[q * NR + j] = 0.0f;
                }
            }
        } else {
            for (long q = 0; q < k; q++)
                for (long j = 0; j < NR; j++)
                    d[q * NR + j] = j < w ? b[q * rsb + (j0 + j) * csb] : 0.0f;
        }
    }
}

void rlx_sgemm_pack_b(const float *b, long rsb, long csb, long k, long n, float *out, int threads) {
    long np = (n + NR - 1) / NR;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && k * n >= (1L << 16))
    for (long p = 0; p < np; p++) pack_b_panels(b, rsb, csb, k, n, out, p, p + 1);
}

static void pack_a(const float *a, long rsa, long csa, long mc, long kc, float *out) {
    for (long i0 = 0; i0 < mc; i0 += MR) {
        long h = mc - i0 < MR ? mc - i0 : MR;
        float *d = out + i0 * kc;
        if (h == MR && csa == 1) {
            const float *r[MR];
            for (int i = 0; i < MR; i++) r[i] = a + (i0 + i) * rsa;
            for (long q = 0; q < kc; q++)
                for (int i = 0; i < MR; i++) d[q * MR + i] = r[i][q];
        } else { /* a short panel: its h rows, then zeros up to the rows its kernel reads */
            const long hr = h <= 2 ? 2 : h <= 4 ? 4 : (MR > 8 && h <= 8) ? 8 : MR; /* ukernel_for */
            for (long i = 0; i < h; i++) {
                const float *s = a + (i0 + i) * rsa;
                if (csa == 1)
                    for (long q = 0; q < kc; q++) d[q * MR + i] = s[q];
                else
                    for (long q = 0; q < kc; q++) d[q * MR + i] = s[q * csa];
            }
            for (long i = h; i < hr; i++)
                for (long q = 0; q < kc; q++) d[q * MR + i] = 0.0f;
        }
    }
}

/* ---- micro-kernels: c[MR x NR] (row stride ldc) = (accum ? c : 0) + a_panel @ b_panel ---- */

#ifndef RLX_SGEMM_UKERNELS /* aarch64: sgemm_neon.h's */

/* GCC vector extensions (no immintrin.h: parsing it was half of this library's build
 * time); this function alone contracts a * b + c into FMAs (where the target has them). */
#define VL (NR / 2)
typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vfu __attribute__((vector_size(VL * 4), aligned(4))); /* unaligned access */

/* UKERNEL(name, R): the micro-kernel on the first R rows of an MR-row A micro-panel (R
 * accumulator rows, A read at stride MR). ukernel is R = MR; the shorter ones serve the
 * last micro-panel of a block when fewer than MR rows remain (M = 16 on AVX-512: 14 + 2
 * rows, where the MR-row kernel on the 2-row panel did 12 rows of zero work, nearly
 * doubling the multiply-adds of the whole product). Each is its own function so that
 * this one alone contracts a * b + c into FMAs (where the target has them). */
/* B prefetch: PFD k steps (12 KB of packed B) ahead into L2 (prefetcht1). At 1x16 the
 * weights stream from DRAM (42.5 MB for MiniLM, more than the L3); measured on Zen 4 (36
 * GEMMs of M = 16, distinct weights, sum of per-call minima): 6.5 ms without, 4.7 ms at
 * 3 KB into L1, 4.2-4.6 ms at 6-24 KB into L2 (AVX-512); AVX2 5.8 -> 4.2 ms at 12 KB. */
#ifndef PF_BYTES
#define PF_BYTES 12288
#endif
#define PFD (PF_BYTES / (NR * 4))
#define UKSTEP(R, PF, H)                                                                   \
    {                                                                                      \
        const vf b0 = *(const vfu *)b, b1 = *(const vfu *)(b + VL);                        \
        __builtin_prefetch((PF), 0, H);                                                    \
        if (NR * 4 > 64 && H != 3) __builtin_prefetch((PF) + VL, 0, H);                    \
        if (H == 3) __builtin_prefetch(a + 16 * MR, 0, 3);                                 \
        _Pragma("GCC unroll 16") for (int i = 0; i < R; i++) {                             \
            const float x = a[i]; /* broadcast by the vector operations */                 \
            c0[i] = x * b0 + c0[i];                                                        \
            c1[i] = x * b1 + c1[i];                                                        \
        }                                                                                  \
        a += MR;                                                                           \
        b += NR;                                                                           \
    }
#ifndef PFH
#define PFH 2
#endif
#define UKERNEL(NAME, R)                                                                   \
    __attribute__((optimize("fp-contract=fast"))) static void NAME(                        \
        long kc, const float *restrict a, const float *restrict b, float *restrict c,      \
        long ldc, int accum, const float *bnext) {                                         \
        vf c0[R], c1[R];                                                                   \
        _Pragma("GCC unroll 16") for (int i = 0; i < R; i++) {                             \
            c0[i] = c1[i] = (vf){0};                                                       \
            __builtin_prefetch(c + i * ldc, 1, 3);                                         \
            __builtin_prefetch(c + i * ldc + NR - 1, 1, 3);                                \
        }                                                                                  \
        /* bnext (the first row panel on a B block, which brings it from memory): B is    \
         * prefetched into L2 PFD k steps ahead, both cache lines of a step's NR floats   \
         * (on AVX-512), and the last PFD steps prefetch the start of bnext, the block    \
         * the next panel reads. NULL (B is in L2 already): 16 steps ahead into L1. */   \
        if (bnext) {                                                                       \
            const long kpf = kc > PFD ? kc - PFD : 0;                                      \
            long q = 0;                                                                    \
            _Pragma("GCC unroll 2") for (; q < kpf; q++) UKSTEP(R, b + PFD * NR, PFH)      \
            const float *pn = bnext;                                                       \
            _Pragma("GCC unroll 2") for (; q < kc; q++) {                                  \
                UKSTEP(R, pn, PFH)                                                         \
                pn += NR;                                                                  \
            }                                                                              \
        } else {                                                                           \
            _Pragma("GCC unroll 2") for (long q = 0; q < kc; q++) UKSTEP(R, b + 16 * NR, 3) \
        }                                                                                  \
        _Pragma("GCC unroll 16") for (int i = 0; i < R; i++) {                             \
            vfu *r = (vfu *)(c + i * ldc);                                                 \
            if (accum) {                                                                   \
                c0[i] += r[0];                                                             \
                c1[i] += *(vfu *)(c + i * ldc + VL);                                       \
            }                                                                              \
            r[0] = c0[i];                                                                  \
            *(vfu *)(c + i * ldc + VL) = c1[i];                                            \
        }                                                                                  \
    }

UKERNEL(ukernel, MR)
UKERNEL(ukernel2, 2)
UKERNEL(ukernel4, 4)
#if MR > 8
UKERNEL(ukernel8, 8)
#endif

typedef void (*ukernel_fn)(long, const float *restrict, const float *restrict, float *restrict,
                           long, int, const float *);

/* the kernel for a micro-panel of h <= MR rows (it may compute a few zero rows past h) */
static ukernel_fn ukernel_for(long h) {
    if (h <= 2) return ukernel2;
    if (h <= 4) return ukernel4;
#if MR > 8
    if (h <= 8) return ukernel8;
#endif
    return ukernel;
}


/* UKERNEL_P(name, R): R (1 or 2) rows x NP = 4 panels of NR columns (B panels bstride
 * floats apart) into tile[R][NP * NR], from zero. For a block of at most 2 rows (M <= 2):
 * the 2-row kernel on one panel has 4 accumulator chains (2 on 1 real row) and waits on
 * the FMA latency; here 8 R chains. Each output element is the same chain of FMAs over k
 * as in the one-panel kernels, so a row keeps its bits whatever M. */
#define NP 4
#define UKERNEL_P(NAME, R)                                                                 \
    __attribute__((optimize("fp-contract=fast"))) static void NAME(                        \
        long kc, const float *restrict a, const float *restrict b, long bstride,           \
        float *restrict tile) {                                                            \
        vf acc[R][2 * NP];                                                                 \
        _Pragma("GCC unroll 16") for (int i = 0; i < R; i++)                               \
            _Pragma("GCC unroll 16") for (int p = 0; p < 2 * NP; p++) acc[i][p] = (vf){0}; \
        for (long q = 0; q < kc; q++) {                                                    \
            _Pragma("GCC unroll 4") for (int p = 0; p < NP; p++) {                         \
                const float *bq = b + p * bstride;                                         \
                const vf b0 = *(const vfu *)bq, b1 = *(const vfu *)(bq + VL);              \
                __builtin_prefetch(bq + PFD * NR, 0, PFH);                                 \
                if (NR * 4 > 64) __builtin_prefetch(bq + PFD * NR + VL, 0, PFH);           \
                _Pragma("GCC unroll 2") for (int i = 0; i < R; i++) {                      \
                    const float x = a[i];                                                  \
                    acc[i][2 * p] = x * b0 + acc[i][2 * p];                                \
                    acc[i][2 * p + 1] = x * b1 + acc[i][2 * p + 1];                        \
                }                                                                          \
            }                                                                              \
            a += MR;                                                                       \
            b += NR;                                                                       \
        }                                                                                  \
        _Pragma("GCC unroll 16") for (int i = 0; i < R; i++)                               \
            _Pragma("GCC unroll 16") for (int p = 0; p < 2 * NP; p++)                      \
                *(vfu *)(tile + i * NP * NR + p * VL) = acc[i][p];                         \
    }
UKERNEL_P(ukernel1p, 1)
UKERNEL_P(ukernel2p, 2)

/* UKERNEL_D(name, R, NV): R rows x NV vectors (NV = 2: a whole NR panel; 1: its first VL
 * columns) reading A in place (rows lda floats apart, unit column stride) instead of a
 * packed micro-panel, into c (row stride ldc), from zero. The small-product path (one K
 * block, a few column panels: the 64 x 64 x 64 layers of a tiny MLP) where packing A cost
 * as much as a fifth of the product, and NV = 1 serves a last panel of at most VL columns
 * (N = 10: the NR-wide kernel did 3.2 times the work). Each output element is the same
 * chain of FMAs over k as in the packed kernels (from zero, k in order), so a row keeps
 * its bits whichever path computes it. */
#define UKERNEL_D(NAME, R, NV)                                                             \
    __attribute__((optimize("fp-contract=fast"))) static void NAME(                        \
        long kc, const float *restrict a, long lda, const float *restrict b,              \
        float *restrict c, long ldc) {                                                     \
        vf c0[R], c1[R];                                                                   \
        _Pragma("GCC unroll 16") for (int i = 0; i < R; i++) c0[i] = c1[i] = (vf){0};     \
        for (long q = 0; q < kc; q++) {                                                    \
            const vf b0 = *(const vfu *)b;                                                 \
            const vf b1 = NV > 1 ? *(const vfu *)(b + VL) : (vf){0};                       \
            _Pragma("GCC unroll 16") for (int i = 0; i < R; i++) {                         \
                const float x = a[i * lda];                                                \
                c0[i] = x * b0 + c0[i];                                                    \
                if (NV > 1) c1[i] = x * b1 + c1[i];                                        \
            }                                                                              \
            a += 1;                                                                        \
            b += NR;                                                                       \
        }                                                                                  \
        _Pragma("GCC unroll 16") for (int i = 0; i < R; i++) {                             \
            *(vfu *)(c + i * ldc) = c0[i];                                                 \
            if (NV > 1) *(vfu *)(c + i * ldc + VL) = c1[i];                                \
        }                                                                                  \
    }
/* rows per direct kernel: 8 x 2 zmm accumulators on AVX-512; 6 x 2 where there are 16
 * vector registers (AVX2: 12 accumulators, 2 of B, 1 broadcast) */
#if MR > 8
#define RD 8
UKERNEL_D(ukd8w, 8, 2)
UKERNEL_D(ukd8h, 8, 1)
#else
#define RD 6
UKERNEL_D(ukd8w, 6, 2)
UKERNEL_D(ukd8h, 6, 1)
#endif
UKERNEL_D(ukd4w, 4, 2)
UKERNEL_D(ukd4h, 4, 1)
UKERNEL_D(ukd2w, 2, 2)
UKERNEL_D(ukd2h, 2, 1)
UKERNEL_D(ukd1w, 1, 2)
UKERNEL_D(ukd1h, 1, 1)
#define RLX_SGEMM_DIRECT 1
typedef void (*ukd_fn)(long, const float *restrict, long, const float *restrict, float *restrict,
                       long);
#endif /* RLX_SGEMM_UKERNELS */

/* ---- epilogue ----------------------------------------------------------------------- */

typedef struct {
    void *c;           /* output (f32 or bf16 bits) */
    long ldc;          /* output row stride, elements */
    int c_bf16;
    const float *bias; /* [N] or NULL */
    const float *res;  /* residual [M, N] f32 or NULL */
    long ldr;
    float alpha;
    int act;
} epi_t;

/* erf and tanh in f32 as rational functions (the odd / even minimax pairs Eigen uses):
 * at most 3.6 / 2.9 f32 eps from the f64 functions over the whole line, NaN kept (the
 * clamps compare, they do not call fminf), and inlined into the `omp simd` loops below
 * (no libm call per element: erf in f64 took 2 ns an element, the whole 64 x 64 x 32
 * product 4 us). Horner steps are fused multiply-adds where the target has them. */
/* The epilogue functions (to epi_rows) are compiled without -ftrapping-math: with it, gcc
 * does not if-convert the clamps on AVX2 (no masked vectors) and the activation loops stayed
 * scalar (12 us for the 64 x 64 tanh of the ONNX MLP against 1.2 us vectorised). The values
 * are the same: the flag only lets gcc assume no code observes the FP exception flags. */
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define EPI_FMA(a, b, c) __builtin_fmaf(a, b, c)
#else
#define EPI_FMA(a, b, c) ((a) * (b) + (c))
#endif
static inline float erf_f32(float x) {
    x = x < -4.0f ? -4.0f : x > 4.0f ? 4.0f : x;
    const float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = EPI_FMA(p, x2, 2.77068142495902e-08f);
    p = EPI_FMA(p, x2, -2.10102402082508e-06f);
    p = EPI_FMA(p, x2, -5.69250639462346e-05f);
    p = EPI_FMA(p, x2, -7.34990630326855e-04f);
    p = EPI_FMA(p, x2, -2.95459980854025e-03f);
    p = EPI_FMA(p, x2, -1.60960333262415e-02f);
    float q = -1.45660718464996e-05f;
    q = EPI_FMA(q, x2, -2.13374055278905e-04f);
    q = EPI_FMA(q, x2, -1.68282697438203e-03f);
    q = EPI_FMA(q, x2, -7.37332916720468e-03f);
    q = EPI_FMA(q, x2, -1.42647390514189e-02f);
    return x * p / q;
}

static inline float tanh_f32(float x) {
    const float c = 7.90531110763549805f;
    const float y = x < -c ? -c : x > c ? c : x, x2 = y * y;
    float p = -2.76076847742355e-16f;
    p = EPI_FMA(p, x2, 2.00018790482477e-13f);
    p = EPI_FMA(p, x2, -8.60467152213735e-11f);
    p = EPI_FMA(p, x2, 5.12229709037114e-08f);
    p = EPI_FMA(p, x2, 1.48572235717979e-05f);
    p = EPI_FMA(p, x2, 6.37261928875436e-04f);
    p = EPI_FMA(p, x2, 4.89352455891786e-03f);
    float q = 1.19825839466702e-06f;
    q = EPI_FMA(q, x2, 1.18534705686654e-04f);
    q = EPI_FMA(q, x2, 2.26843463243900e-03f);
    q = EPI_FMA(q, x2, 4.89352518554385e-03f);
    const float r = y * p / q; /* past |x| = 9, tanh rounds to +-1 in f32 */
    return (x < 0.0004f && x > -0.0004f) ? x : x > 9.0f ? 1.0f : x < -9.0f ? -1.0f : r;
}

/* dst row (i, j0..j0+n) of the output = epilogue(src[0..n)) */
static inline __attribute__((always_inline)) void epi_row_body(const epi_t *e, const float *src,
                                                               long i, long j0, long n,
                                                               float *restrict tmp) {
    const float al = e->alpha;
    const float *bias = e->bias ? e->bias + j0 : NULL;
    const float *res = e->res ? e->res + i * e->ldr + j0 : NULL;
    float *v = e->c_bf16 ? tmp : (float *)e->c + i * e->ldc + j0;
    if (bias) {
#pragma omp simd
        for (long j = 0; j < n; j++) v[j] = al * src[j] + bias[j];
    } else {
#pragma omp simd
        for (long j = 0; j < n; j++) v[j] = al * src[j];
    }
    switch (e->act) {
    case 1:
#pragma omp simd
        for (long j = 0; j < n; j++) v[j] = v[j] < 0.0f ? 0.0f : v[j]; /* NaN stays NaN, as np.maximum */
        break;
    case 2:
#pragma omp simd
        for (long j = 0; j < n; j++) {
            const float x = v[j];
            v[j] = (0.5f * x) * (1.0f + erf_f32(x * 0.70710678118654752f));
        }
        break;
    case 3:
#pragma omp simd
        for (long j = 0; j < n; j++) {
            const float x = v[j];
            const float inner = 0.7978845834732056f * (x + ((0.044714998453855515f * x) * x) * x);
            v[j] = (0.5f * x) * (1.0f + tanh_f32(inner));
        }
        break;
    case 4:
#pragma omp simd
        for (long j = 0; j < n; j++) v[j] = v[j] * rlx_sigmoidf(v[j]);
        break;
    case 5:
#pragma omp simd
        for (long j = 0; j < n; j++) v[j] = tanh_f32(v[j]);
        break;
    default:
        break;
    }
    if (res) {
#pragma omp simd
        for (long j = 0; j < n; j++) v[j] += res[j];
    }
    if (e->c_bf16) {
        uint16_t *o = (uint16_t *)e->c + i * e->ldc + j0;
#pragma omp simd
        for (long j = 0; j < n; j++) o[j] = rlx_f32_to_bf16(v[j]);
    }
}

static void epi_row(const epi_t *e, const float *src, long i, long j0, long n,
                    float *restrict tmp) {
    epi_row_body(e, src, i, j0, n, tmp);
}

/* the epilogue in place on rows i0 .. i0+r of the output, w = NR or NR / 2 columns
 * (whole vectors): the row body inlined at a constant width, one call per tile instead of
 * one per row and no remainder loops (the bias pass of a 64 x 64 product took 0.7 us
 * through epi_row); the same operations per element as epi_row, so the same bits */
static void epi_rows(const epi_t *e, long i0, long r, long j0, long w, float *restrict tmp) {
    float *c = (float *)e->c + i0 * e->ldc + j0;
    if (w == NR)
        for (long i = 0; i < r; i++) epi_row_body(e, c + i * e->ldc, i0 + i, j0, NR, tmp);
    else
        for (long i = 0; i < r; i++) epi_row_body(e, c + i * e->ldc, i0 + i, j0, NR / 2, tmp);
}
#pragma GCC pop_options

static int epi_trivial(const epi_t *e) {
    return !e->c_bf16 && !e->bias && !e->res && e->alpha == 1.0f && e->act == 0;
}

/* ---- driver ------------------------------------------------------------------------- */

typedef struct {
    float *buf;
    size_t cap;
} tbuf_t;

static __thread tbuf_t t_apack, t_bpack;

static float *grow(tbuf_t *t, size_t n) {
    if (t->cap < n) {
        free(t->buf);
        size_t bytes = ((n * sizeof(float)) + 63) & ~(size_t)63;
        t->buf = (float *)aligned_alloc(64, bytes);
        t->cap = t->buf ? n : 0;
    }
    return t->buf;
}

/* rows i0 .. i0+mr of a tile (row stride ldt, nr columns from jr) into the output: plus
 * the output's partial sums unless first, through the epilogue on the last K block */
static void tile_out(const epi_t *e, float *tile, long ldt, long i0, long mr, long jr, long nr,
                     int first, int last, int trivial, float *tmp) {
    for (long i = 0; i < mr; i++) {
        float *t = tile + i * ldt;
        if (e->c_bf16) {
            epi_row(e, t, i0 + i, jr, nr, tmp);
            continue;
        }
        float *c = (float *)e->c + (i0 + i) * e->ldc + jr;
        if (!first)
            for (long j = 0; j < nr; j++) t[j] += c[j];
        if (last && !trivial)
            epi_row(e, t, i0 + i, jr, nr, tmp);
        else
            memcpy(c, t, nr * sizeof(float));
    }
}

#ifdef RLX_SGEMM_DIRECT
/* The small-product path (see UKERNEL_D): the whole K in one block, A read in place,
 * blocks of RD rows (then 4, 2, 1) down each column panel; a panel of at most VL columns
 * on the half-width kernels. Tiles that are not whole vectors go through `tile`. */
static void gemm_direct(long m0, long m1, long n0, long n1, long k, const float *a, long rsa,
                        const float *bp, const epi_t *e, int trivial, float *tile, float *tmp) {
    for (long jr = n0; jr < n1; jr += NR) {
        const long nr = n1 - jr < NR ? n1 - jr : NR;
        const int half = nr <= VL;
        const float *bpan = bp + (jr / NR) * k * NR;
        for (long i0 = m0; i0 < m1;) {
            const long rem = m1 - i0;
            const long r = rem >= RD ? RD : rem >= 4 ? 4 : rem >= 2 ? 2 : 1;
            const ukd_fn f = r == RD ? (half ? ukd8h : ukd8w)
                           : r == 4  ? (half ? ukd4h : ukd4w)
                           : r == 2  ? (half ? ukd2h : ukd2w)
                                     : (half ? ukd1h : ukd1w);
            const float *ap = a + i0 * rsa;
            if (nr == (half ? VL : NR)) {
                float *c = (float *)e->c + i0 * e->ldc + jr;
                f(k, ap, rsa, bpan, c, e->ldc);
                if (!trivial)
                    epi_rows(e, i0, r, jr, nr, tmp);
            } else {
                f(k, ap, rsa, bpan, tile, NR);
                tile_out(e, tile, NR, i0, r, jr, nr, 1, 1, trivial, tmp);
            }
            i0 += r;
        }
    }
}

/* whether a rectangle takes the direct path: f32 output, unit column stride of A, K in one
 * block and few column panels (packing A pays off when many panels reuse it); the caller
 * keeps 1-2 rows on NP panels on the 4-panel kernels */
#ifndef DIRECT_MAX_N
#define DIRECT_MAX_N (4 * NR)
#endif
#ifndef DIRECT_MAX_K
#define DIRECT_MAX_K 512
#endif
static int use_direct(long n, long k, long csa, const epi_t *e) {
    return !e->c_bf16 && csa == 1 && n <= DIRECT_MAX_N && k <= DIRECT_MAX_K && k <= g_kc;
}
#endif

/* one thread: rows [m0, m1) x columns [n0, n1) (n0 a multiple of NR) */
static int gemm_rect(long m0, long m1, long n0, long n1, long k, const float *a, long rsa,
                     long csa, const float *bp, const epi_t *e) {
    if (m0 >= m1 || n0 >= n1) return 0;
    const int trivial = epi_trivial(e);
    float tile[MR * NR] __attribute__((aligned(64)));
    float tile4[2 * NP * NR] __attribute__((aligned(64)));
    float tmp[NR] __attribute__((aligned(64)));
    if (k == 0) {
        memset(tile, 0, sizeof(tile));
        for (long i = m0; i < m1; i++)
            for (long j = n0; j < n1; j += NR) epi_row(e, tile, i, j, n1 - j < NR ? n1 - j : NR, tmp);
        return 0;
    }
#ifdef RLX_SGEMM_DIRECT
    if (use_direct(n1 - n0, k, csa, e) && (m1 - m0 > 2 || n1 - n0 < NP * NR)) {
        gemm_direct(m0, m1, n0, n1, k, a, rsa, bp, e, trivial, tile, tmp);
        return 0;
    }
#endif
    /* K in equal blocks of at most g_kc (all of K for a bf16 output); the A block of
     * MC rows x KC takes g_l2 bytes */
    const long nkb = e->c_bf16 ? 1 : (k + g_kc - 1) / g_kc;
    const long kcb = ((k + nkb - 1) / nkb + 7) / 8 * 8;
    const long mcb = g_l2 / (4 * kcb) / MR * MR;
    const long mcs = mcb < MR ? MR : mcb;
    float *ap = grow(&t_apack, (size_t)((mcs + MR) * (kcb < k ? kcb : k)));
    if (!ap) return -1;
    for (long jc = n0; jc < n1; jc += g_nc) {
        const long jend = jc + g_nc < n1 ? jc + g_nc : n1;
        for (long pc = 0; pc < k; pc += kcb) {
            const long kc = k - pc < kcb ? k - pc : kcb;
            const int first = pc == 0, last = pc + kc == k;
            for (long ic = m0; ic < m1; ic += mcs) {
                const long mc = m1 - ic < mcs ? m1 - ic : mcs;
                pack_a(a + ic * rsa + pc * csa, rsa, csa, mc, kc, ap);
                for (long jr = jc; jr < jend; jr += NR) {
                    if (mc <= 2 && jr + NP * NR <= jend) { /* 1-2 rows: NP panels at once */
                        const float *bpan = bp + (jr / NR) * k * NR + pc * NR;
                        (mc == 1 ? ukernel1p : ukernel2p)(kc, ap, bpan, k * NR, tile4);
                        for (int p = 0; p < NP; p++)
                            tile_out(e, tile4 + p * NR, NP * NR, ic, mc, jr + p * NR, NR, first,
                                     last, trivial, tmp);
                        jr += (NP - 1) * NR;
                        continue;
                    }
                    const long nr = jend - jr < NR ? jend - jr : NR;
                    const float *bpan = bp + (jr / NR) * k * NR + pc * NR;
                    /* the B block the next panel reads, for the kernel's prefetch */
                    const float *bnext = jr + NR < jend ? bpan + k * NR
                                       : pc + kc < k  ? bp + (jc / NR) * k * NR + (pc + kc) * NR
                                       : jend < n1    ? bp + (jend / NR) * k * NR
                                                      : bpan;
                    for (long ir = 0; ir < mc; ir += MR) {
                        const long mr = mc - ir < MR ? mc - ir : MR;
                        const float *apan = ap + ir * kc;
                        const long i0 = ic + ir;
                        const float *bnx = ir == 0 ? bnext : NULL;
                        if (!e->c_bf16 && mr == MR && nr == NR) {
                            float *c = (float *)e->c + i0 * e->ldc + jr;
                            ukernel(kc, apan, bpan, c, e->ldc, !first, bnx);
                            if (last && !trivial)
                                epi_rows(e, i0, MR, jr, NR, tmp);
                        } else {
                            ukernel_for(mr)(kc, apan, bpan, tile, NR, 0, bnx);
                            tile_out(e, tile, NR, i0, mr, jr, nr, first, last, trivial, tmp);
                        }
                    }
                }
            }
        }
    }
    return 0;
}

static void grid(long m, long n, int threads, int *tm, int *tn) {
    long mp = (m + MR - 1) / MR, np = (n + NR - 1) / NR;
    int a = threads, b = 1;
    if (mp < 2L * threads) { /* few rows: split the columns too */
        a = (int)(mp / 2 > 0 ? mp / 2 : 1);
        if (a > threads) a = threads;
        b = threads / a;
        if (b > np) b = (int)np;
    }
    *tm = a;
    *tn = b > 0 ? b : 1;
}

static void span(long total, long unit, int parts, int idx, long *lo, long *hi) {
    long units = (total + unit - 1) / unit;
    long s = units * idx / parts, t = units * (idx + 1) / parts;
    *lo = s * unit;
    *hi = t * unit < total ? t * unit : total;
}

static int gemm_packed(long m, long n, long k, const float *a, long rsa, long csa, const float *bp,
                       const epi_t *e, int threads) {
    int tm, tn;
    if (m <= 0 || n <= 0) return 0;
    if ((double)m * n * (k > 0 ? k : 1) < (double)(1L << 20)) /* ~20 us: waking a team costs more */
        threads = 1;
    grid(m, n, threads, &tm, &tn);
    const int nt = tm * tn;
    if (nt <= 1) return gemm_rect(0, m, 0, n, k, a, rsa, csa, bp, e);
    int rc = 0;
#pragma omp parallel num_threads(nt) reduction(| : rc)
    {
#ifdef _OPENMP
        const int t = omp_get_thread_num(), got = omp_get_num_threads();
#else
        const int t = 0, got = 1;
#endif
        for (int w = t; w < nt; w += got) {
            long m0, m1, n0, n1;
            span(m, MR, tm, w / tn, &m0, &m1);
            span(n, NR, tn, w % tn, &n0, &n1);
            rc |= gemm_rect(m0, m1, n0, n1, k, a, rsa, csa, bp, e);
        }
    }
    return rc;
}

/* C = act(alpha * A @ B + bias) + res with B packed by rlx_sgemm_pack_b. 0, or -1 when a
 * packing buffer could not be allocated. */
int rlx_sgemm(long m, long n, long k, const float *a, long rsa, long csa, const float *bp,
              void *c, long ldc, int c_bf16, const float *bias, const float *res, long ldr,
              float alpha, int act, int threads) {
    epi_t e = {c, ldc, c_bf16, bias, res, ldr, alpha, act};
    return gemm_packed(m, n, k, a, rsa, csa, bp, &e, threads < 1 ? 1 : threads);
}

/* batch products C[b] = alpha * A[b] @ B[b] (f32 output, any strides of A and B, rows of
 * C unit-stride), packing each B per call: batches over threads when there are enough of
 * them, else one batch at a time with all threads. */
int rlx_sgemm_batched(long batch, long m, long n, long k, const float *a, long sa, long rsa,
                      long csa, const float *b, long sb, long rsb, long csb, float *c, long sc,
                      long ldc, float alpha, int threads) {
    if (threads < 1) threads = 1;
    const size_t psize = (size_t)rlx_sgemm_packed_size(k, n);
    if (batch >= threads && threads > 1) {
        int rc = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : rc)
        for (long q = 0; q < batch; q++) {
            float *bp = grow(&t_bpack, psize ? psize : 1);
            if (!bp) {
                rc |= -1;
                continue;
            }
            pack_b_panels(b + q * sb, rsb, csb, k, n, bp, 0, (n + NR - 1) / NR);
            epi_t e = {c + q * sc, ldc, 0, NULL, NULL, 0, alpha, 0};
            rc |= gemm_rect(0, m, 0, n, k, a + q * sa, rsa, csa, bp, &e);
        }
        return rc;
    }
    float *bp = grow(&t_bpack, psize ? psize : 1);
    if (!bp) return -1;
    for (long q = 0; q < batch; q++) {
        rlx_sgemm_pack_b(b + q * sb, rsb, csb, k, n, bp, threads);
        epi_t e = {c + q * sc, ldc, 0, NULL, NULL, 0, alpha, 0};
        if (gemm_packed(m, n, k, a + q * sa, rsa, csa, bp, &e, threads)) return -1;
    }
    return 0;
}
