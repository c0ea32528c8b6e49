/* aarch64 NEON micro-kernels of the 16-bit float libraries: the conversions of
 * csrc/lowp_cast.c and the widening products of csrc/half_linear.c (each includes this
 * header in its ISA chain as SIMD level 3).
 *
 * Widening: bf16 -> f32 is the 16 bits shifted up (USHLL / USHLL2, exact); f16 -> f32 is
 * FCVTL / FCVTL2 (exact). Rounding: f32 -> bf16 to nearest even in integer registers
 * (the x86 paths' arithmetic: + 0x7fff + lsb, then the high half); f32 -> f16 is FCVTN
 * (nearest even under the default FPCR, overflow to inf, subnormals kept). FCVTL / FCVTN
 * quiet a signalling NaN; so does NumPy on aarch64 (it converts with the same
 * instructions), so the f16 results are NumPy's bits there.
 *
 * The bf16 GEMM (csrc/lowp_gemm.c includes this header a second time, with G_NR defined,
 * on a target with the BF16 extension: the i8mm target) is the section at the end.
 */
#ifndef LOWP_NEON_H /* the conversions and widening (the first inclusion) */
#define LOWP_NEON_H
#include <arm_neon.h>
#define LOWP_NEON_FN static inline __attribute__((unused, always_inline))

/* ---- conversions (csrc/lowp_cast.c) ------------------------------------------------ */

/* 8 f32 bit patterns -> bf16: nearest even; NaN -> 0x7fc0 with the input's sign */
LOWP_NEON_FN void lowp_neon_f32_to_bf16x8(const uint32_t *src, uint16_t *dst) {
    const uint32x4_t bias = vdupq_n_u32(0x7fff), one = vdupq_n_u32(1);
    const uint32x4_t absm = vdupq_n_u32(0x7fffffff), inf = vdupq_n_u32(0x7f800000);
    uint16x4_t h[2];
    for (int k = 0; k < 2; k++) {
        uint32x4_t u = vld1q_u32(src + 4 * k);
        uint32x4_t r = vaddq_u32(u, vaddq_u32(bias, vandq_u32(vshrq_n_u32(u, 16), one)));
        uint16x4_t rn = vshrn_n_u32(r, 16);
        uint16x4_t nv = vorr_u16(vand_u16(vshrn_n_u32(u, 16), vdup_n_u16(0x8000)), vdup_n_u16(0x7fc0));
        uint16x4_t nan = vmovn_u32(vcgtq_u32(vandq_u32(u, absm), inf));
        h[k] = vbsl_u16(nan, nv, rn);
    }
    vst1q_u16(dst, vcombine_u16(h[0], h[1]));
}

/* 8 bf16 -> f32 bit patterns (exact) */
LOWP_NEON_FN void lowp_neon_bf16_to_f32x8(const uint16_t *src, uint32_t *dst) {
    uint16x8_t h = vld1q_u16(src);
    vst1q_u32(dst, vshll_n_u16(vget_low_u16(h), 16));
    vst1q_u32(dst + 4, vshll_high_n_u16(h, 16));
}

/* 8 f32 -> f16 (FCVTN) */
LOWP_NEON_FN void lowp_neon_f32_to_f16x8(const uint32_t *src, uint16_t *dst) {
    float32x4_t f0 = vreinterpretq_f32_u32(vld1q_u32(src));
    float32x4_t f1 = vreinterpretq_f32_u32(vld1q_u32(src + 4));
    vst1q_u16(dst, vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(f0), f1)));
}

/* 8 f16 -> f32 (FCVTL) */
LOWP_NEON_FN void lowp_neon_f16_to_f32x8(const uint16_t *src, uint32_t *dst) {
    float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src));
    vst1q_f32((float *)dst, vcvt_f32_f16(vget_low_f16(h)));
    vst1q_f32((float *)dst + 4, vcvt_high_f32_f16(h));
}

/* one f32 bit pattern -> f16 bits and back (FCVT, as the vector forms) */
LOWP_NEON_FN uint16_t lowp_neon_f16_from_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    __fp16 h = (__fp16)f;
    uint16_t r;
    memcpy(&r, &h, 2);
    return r;
}

LOWP_NEON_FN uint32_t lowp_neon_f32_from_f16(uint16_t b) {
    __fp16 h;
    memcpy(&h, &b, 2);
    float f = (float)h;
    uint32_t r;
    memcpy(&r, &f, 4);
    return r;
}

/* ---- widening products (csrc/half_linear.c) ----------------------------------------- */

/* 8 weight elements at p widened to two f32 vectors (kind: 0 bf16, 1 f16) */
LOWP_NEON_FN void lowp_neon_widen8(const uint16_t *p, int kind, float32x4_t *lo, float32x4_t *hi) {
    uint16x8_t h = vld1q_u16(p);
    if (kind) {
        float16x8_t f = vreinterpretq_f16_u16(h);
        *lo = vcvt_f32_f16(vget_low_f16(f));
        *hi = vcvt_high_f32_f16(f);
    } else {
        *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    }
}
#endif /* LOWP_NEON_H */

/* ---- the bf16 GEMM (csrc/lowp_gemm.c, BF16 extension) ----------------------------------
 * The same packed B as the x86 kernel (rlx_bf16_pack_b: 32-column panels, k pair p holding
 * (B[2p, j], B[2p+1, j]) side by side), which is BFDOT's operand layout: one 128-bit load
 * is 4 columns' pairs, and `bfdot v.4s, b.8h, a.2h[r]` adds row r's pair of A times them
 * to 4 accumulators. A is packed per call into blocks of G_MR = 8 rows (the k pairs of 8
 * rows side by side: two loads give the 8 broadcast pairs).
 * Micro-kernel: 8 rows x 8 columns (16 accumulators), per k pair 2 A loads, 2 B loads and
 * 16 BFDOTs (128 multiply-adds); a panel is 4 such column groups. Cache blocking and the
 * per-thread f32 tile buffer as the x86 kernel (K blocks of NB_KCP pairs, MC = 256 rows);
 * the write-out rounds to bf16 once (bf16_from_bits of lowp_cast.c) and applies the
 * epilogue (bias, activation table) element by element.
 * BFDOT rounds its two additions with round-to-odd and flushes subnormals (the
 * architecture's BF16 arithmetic), within the f32 accumulation bound the tests hold. */
#if defined(G_NR) && !defined(LOWP_NEON_GEMM) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#define LOWP_NEON_GEMM 1
#define NB_KCP 128 /* k pairs per K block: the B slice (16 KiB) stays in L1 */
#define NB_MC 256  /* rows per block of A */

struct gemm_ep {
    const float *bias;
    const uint16_t *lut;
};

static void nb_pack_a(const uint16_t *a, long lda, long m, long k, uint32_t *ap, long rb) {
    long kp = (k + 1) / 2, kfull = k / 2;
    uint32_t *dst = ap + rb * kp * G_MR;
    for (int i = 0; i < G_MR; i++) {
        long row = rb * G_MR + i;
        if (row >= m) {
            for (long q = 0; q < kp; q++) dst[q * G_MR + i] = 0;
            continue;
        }
        const uint16_t *src = a + row * lda;
        for (long q = 0; q < kfull; q++) {
            uint32_t v;
            memcpy(&v, src + 2 * q, 4);
            dst[q * G_MR + i] = v;
        }
        if (k & 1) dst[kfull * G_MR + i] = (uint32_t)src[k - 1];
    }
}

/* 8 rows x 8 columns over kp k pairs: ap the rows' pairs (G_MR per pair), bp the column
 * group's first pair (rows of 2 * G_NR), ct the f32 tile (row stride G_NR; first: from 0) */
static inline void nb_ukernel(long kp, const uint32_t *ap, const uint16_t *bp, float *ct, int first) {
    float32x4_t c[G_MR][2];
    for (int i = 0; i < G_MR; i++) {
        c[i][0] = first ? vdupq_n_f32(0.0f) : vld1q_f32(ct + i * G_NR);
        c[i][1] = first ? vdupq_n_f32(0.0f) : vld1q_f32(ct + i * G_NR + 4);
    }
    for (long q = 0; q < kp; q++) {
        const bfloat16x8_t b0 = vld1q_bf16((const bfloat16_t *)(bp + q * 2 * G_NR));
        const bfloat16x8_t b1 = vld1q_bf16((const bfloat16_t *)(bp + q * 2 * G_NR + 8));
        const bfloat16x8_t a0 = vreinterpretq_bf16_u32(vld1q_u32(ap + q * G_MR));
        const bfloat16x8_t a1 = vreinterpretq_bf16_u32(vld1q_u32(ap + q * G_MR + 4));
#define NB_ROW(i, av, l)                                    \
    c[i][0] = vbfdotq_laneq_f32(c[i][0], b0, av, l);        \
    c[i][1] = vbfdotq_laneq_f32(c[i][1], b1, av, l);
        NB_ROW(0, a0, 0) NB_ROW(1, a0, 1) NB_ROW(2, a0, 2) NB_ROW(3, a0, 3)
        NB_ROW(4, a1, 0) NB_ROW(5, a1, 1) NB_ROW(6, a1, 2) NB_ROW(7, a1, 3)
#undef NB_ROW
    }
    for (int i = 0; i < G_MR; i++) {
        vst1q_f32(ct + i * G_NR, c[i][0]);
        vst1q_f32(ct + i * G_NR + 4, c[i][1]);
    }
}

/* nc columns of an f32 tile row to C at column j0: f32, or bf16 through the epilogue */
static inline void nb_store_row(const float *t, void *c, long j0, long nc, int c_bf16,
                                const struct gemm_ep *ep) {
    if (!c_bf16) {
        memcpy((float *)c + j0, t, sizeof(float) * (size_t)nc);
        return;
    }
    uint16_t *o = (uint16_t *)c + j0;
    for (long j = 0; j < nc; j++) {
        uint32_t u;
        memcpy(&u, t + j, 4);
        uint16_t r = bf16_from_bits(u);
        if (ep->bias) {
            uint32_t w = (uint32_t)r << 16;
            float f;
            memcpy(&f, &w, 4);
            f += ep->bias[j0 + j];
            memcpy(&u, &f, 4);
            r = bf16_from_bits(u);
        }
        if (ep->lut) r = ep->lut[r];
        o[j] = r;
    }
}

/* C[m, n] = A @ B (B packed) through the epilogue ep; 0, or -2 when out of memory */
static int nb_gemm(long m, long n, long k, const uint16_t *a, long lda, const uint16_t *bp, void *c, long ldc,
                   int c_bf16, int threads, const struct gemm_ep *epp) {
    const struct gemm_ep ep = *epp;
    long npan = (n + G_NR - 1) / G_NR, kp = (k + 1) / 2, kp2 = kp * 2 * G_NR;
    long nrb = (m + G_MR - 1) / G_MR;
    uint32_t *ap = aligned_alloc(64, ((size_t)(nrb * kp * G_MR * 4) + 63) & ~(size_t)63);
    if (ap == NULL) return -2;
    long mc = NB_MC < nrb * G_MR ? NB_MC : nrb * G_MR;
    long nmb = (m + mc - 1) / mc, tiles = nmb * npan;
    int par = threads > 1 && tiles > 1, failed = 0;
    (void)par;
#pragma omp parallel num_threads(threads) if (par)
    {
        float *ct = aligned_alloc(64, (size_t)mc * G_NR * 4);
#pragma omp for schedule(static)
        for (long rb = 0; rb < nrb; rb++) nb_pack_a(a, lda, m, k, ap, rb);
        if (ct == NULL) {
#pragma omp atomic write
            failed = 1;
        } else {
#pragma omp for schedule(dynamic, 1)
            for (long t = 0; t < tiles; t++) {
                long ib = t / npan, p = t % npan;
                long j0 = p * G_NR, nc = n - j0 < G_NR ? n - j0 : G_NR;
                long r0 = ib * mc, r1 = (ib + 1) * mc < m ? (ib + 1) * mc : m;
                if (kp == 0) memset(ct, 0, (size_t)mc * G_NR * 4);
                for (long q0 = 0; q0 < kp; q0 += NB_KCP) {
                    long nq = kp - q0 < NB_KCP ? kp - q0 : NB_KCP;
                    for (long i0 = r0; i0 < r1; i0 += G_MR)
                        for (long cg = 0; cg * 8 < nc; cg++)
                            nb_ukernel(nq, ap + (i0 / G_MR) * kp * G_MR + q0 * G_MR,
                                       bp + p * kp2 + q0 * 2 * G_NR + 16 * cg,
                                       ct + (i0 - r0) * G_NR + 8 * cg, q0 == 0);
                }
                for (long i = r0; i < r1; i++) {
                    void *cc = c_bf16 ? (void *)((uint16_t *)c + i * ldc) : (void *)((float *)c + i * ldc);
                    nb_store_row(ct + (i - r0) * G_NR, cc, j0, nc, c_bf16, &ep);
                }
            }
            free(ct);
        }
    }
    free(ap);
    return failed ? -2 : 0;
}

#endif /* the bf16 GEMM */
