/* The aarch64 (AdvSIMD) micro-kernels of the GGUF dequant libraries (dqgemm, dqprefill),
 * one header behind the same names as the x86 branches. Each kernel file includes it in
 * its ISA #if chain after defining DQ_NEON_PART (the header is inlined at every include by
 * rlx.backends.cpu.native.csrc_source, so each part is one section):
 *
 *   1 dqgemm_decode.c   the vector layer: VW = 4 lanes of float32x4_t, FMLA (fused)
 *   2 dqgemm_q8.c       Q8_DOT: the int8-activation dot products of a prepared weight row
 *                       (SDOT with dotprod; SMULL + SADDLP + ADDP on plain armv8-a)
 *   3 dqgemm_q8.c       the int8-activation GEMV (M = 1) on weights repacked by R = 4
 *                       (dq_layout.h) for the 32-weight layouts Q8_0, Q4_0, Q5_0, Q4_1,
 *                       Q5_1: per block, the activation block is loaded once for the four
 *                       rows, each row's codes are unpacked in registers (vandq_u8 /
 *                       vshrq_n_u8 for nibbles; Q5's 32 high bits spread to bytes by a
 *                       vqtbl1q_u8 byte broadcast and vtstq_u8), two SDOT per row, the
 *                       four row sums folded by two ADDP into one vector (row r in lane r)
 *                       and scaled by one FMLA with the rows' d times dx
 *   4 dqgemm_prefill.c  the f32 micro-tile: MW = 8 weight rows x NT = 8 tokens (16 q
 *                       accumulators; no spill), FMLA by element
 *   5 dqgemm_prefill_q8.c  q_kernel_c: QMW = 4 weight rows x QNT = 8 tokens of int32 SDOT
 *                       accumulators per group (4 inputs of a token per lane, the x86
 *                       vpdpbusd layout), Q8_0's unsigned codes u = c + 128 moved back to
 *                       signed (EOR 0x80) so its offset term drops out
 *
 * Targets (rlx/backends/cpu/native/cpu.py): neon (-march=armv8-a), dotprod (+dotprod:
 * __ARM_FEATURE_DOTPROD, SDOT), i8mm (+i8mm +bf16: SDOT here too). Every integer sum is
 * exact, so the q8 results are those of the C model up to the f32 order of the scaled
 * sums (the bound at the top of dqgemm_q8.c / dqgemm_prefill_q8.c). */
#include <arm_neon.h>

/* ---- part 1: the vector layer of dqgemm --------------------------------------------- */
#if DQ_NEON_PART == 1
#define VW 4
typedef float32x4_t vf;
#define VLOAD(p) vld1q_f32(p)
#define VSTORE(p, v) vst1q_f32(p, v)
#define VSET1(s) vdupq_n_f32(s)
#define VZERO() vdupq_n_f32(0.0f)
#define VFMA(a, b, c) vfmaq_f32(c, a, b)
#define VADD(a, b) vaddq_f32(a, b)
static inline float vhsum(vf v) { return vaddvq_f32(v); }
#if defined(__ARM_FEATURE_MATMUL_INT8)
#define ISA_NAME "i8mm"
#elif defined(__ARM_FEATURE_DOTPROD)
#define ISA_NAME "dotprod"
#else
#define ISA_NAME "neon"
#endif
#endif

/* ---- the integer dot product (parts 2, 3, 5) ------------------------------------------ */
#if DQ_NEON_PART == 2 || DQ_NEON_PART == 5
/* acc + the sums of 4 adjacent s8 x s8 products (lane l: bytes 4 l .. 4 l + 3) */
static inline int32x4_t dqn_dot(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else /* |a b| <= 128 * 127 fits int16; pairs widened to int32, then adjacent pairs */
    int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    int16x8_t p1 = vmull_high_s8(a, b);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)));
#endif
}
#endif

/* ---- part 2: Q8_DOT over a prepared weight row (dqgemm_q8.c) -------------------------- */
#if DQ_NEON_PART == 2
/* out[r] = sum_b dx[r][b] * (ws-weighted integer products of block b) for the mr X rows
 * at xq + r * K. The codes are signed (sgn) or unsigned below 64: both read as s8. */
static inline __attribute__((always_inline)) void q8_dot_neon(
    const uint8_t *wq, long stride, const float *ws, int per16, long nb, const int8_t *xq,
    long K, const float *dx, long nbx, int mr, float *out) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f),
                          vdupq_n_f32(0.0f)};
    const int32x4_t z = vdupq_n_s32(0);
    for (long b = 0; b < nb; b++) {
        const int8x16_t w0 = vld1q_s8((const int8_t *)wq + b * stride);
        const int8x16_t w1 = vld1q_s8((const int8_t *)wq + b * stride + 16);
        for (int r = 0; r < mr; r++) {
            const int8_t *xb = xq + r * K + 32 * b;
            const float d = dx[r * nbx + b];
            int32x4_t s0 = dqn_dot(z, w0, vld1q_s8(xb));
            int32x4_t s1 = dqn_dot(z, w1, vld1q_s8(xb + 16));
            if (per16) {
                acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(s0), ws[8 * b] * d);
                acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(s1), ws[8 * b + 4] * d);
            } else {
                acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(vaddq_s32(s0, s1)), ws[b] * d);
            }
        }
    }
    for (int r = 0; r < mr; r++) out[r] = vaddvq_f32(acc[r]);
}
#define Q8_DOT(mr, per16, sgn)                                                                  \
    q8_dot_neon(q, stride, ws, per16, nb32, xq + m0 * K, K, dx + m0 * nb32, nb32, (int)(mr),  \
                part)
#endif

/* ---- part 3: the int8-activation GEMV on rows interleaved by 4 (dqgemm_q8.c) --------- */
#if DQ_NEON_PART == 3
static int q8_group_ok(const dq_t *s, long M) {
    if (M != 1 || s->R != 4) return 0;
    switch (s->code) {
    case S_Q8_0: case S_Q4_0: case S_Q5_0: case S_Q4_1: case S_Q5_1: return 1;
    default: return 0;
    }
}

/* y[0 .. G) for the G rows (4 interleaved, or 1 plain) whose blocks start at p, bst bytes
 * from a row's block to its next; xq, dx, s32: quant_x of x. Q4_0 / Q5_0 are read as
 * unsigned codes, their offset (-8 d, -16 d) times dx sum xq added with the mins. */
static inline __attribute__((always_inline)) void q8_group_neon(int code, int G,
                                                                const uint8_t *p, long bb,
                                                                long bst, long nb,
                                                                const int8_t *xq,
                                                                const float *dx,
                                                                const float *s32, float *y) {
    const int mins = code == S_Q4_1 || code == S_Q5_1;
    const float off = code == S_Q4_0 ? -8.0f : code == S_Q5_0 ? -16.0f : 0.0f;
    float32x4_t acc = vdupq_n_f32(0.0f), macc = acc;
    const int32x4_t z = vdupq_n_s32(0);
    for (long b = 0; b < nb; b++, p += bst, xq += 32) {
        __builtin_prefetch(p + PF_AHEAD, 0, 3);
        if (G == 4) __builtin_prefetch(p + PF_AHEAD + 64, 0, 3);
        const int8x16_t x0 = vld1q_s8(xq), x1 = vld1q_s8(xq + 16);
        int32x4_t t[4] = {z, z, z, z};
        uint16x4_t dh = vdup_n_u16(0), mh = dh;
        /* row i: its codes' dot products, its f16 d (and m) into lane i */
#define DQN_ROW(i)                                                                            \
    if ((i) < G) {                                                                            \
        int8x16_t lo, hi;                                                                     \
        dqn_codes(code, p + (i) * bb, 1, &lo, &hi);                                           \
        t[i] = dqn_dot2(z, lo, hi, x0, x1);                                                   \
        dh = vld1_lane_u16((const uint16_t *)(p + (i) * bb), dh, i);                          \
        if (mins) mh = vld1_lane_u16((const uint16_t *)(p + (i) * bb + 2), mh, i);            \
    }
        DQN_ROW(0)
        DQN_ROW(1)
        DQN_ROW(2)
        DQN_ROW(3)
#undef DQN_ROW
        /* row i's four lanes summed into lane i */
        const int32x4_t sums = vpaddq_s32(vpaddq_s32(t[0], t[1]), vpaddq_s32(t[2], t[3]));
        const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(dh));
        acc = vfmaq_f32(acc, vcvtq_f32_s32(sums), vmulq_n_f32(d, dx[b]));
        if (mins) macc = vfmaq_n_f32(macc, vcvt_f32_f16(vreinterpret_f16_u16(mh)), s32[b]);
        else if (off != 0.0f) macc = vfmaq_n_f32(macc, d, off * s32[b]);
    }
    float o[4], mo[4];
    vst1q_f32(o, acc);
    vst1q_f32(mo, macc);
    for (int i = 0; i < G; i++) y[i] = o[i] + mo[i];
}

#define Q8_GROUP_NEON(CODE, BB)                                                               \
    if (u < groups) q8_group_neon(CODE, 4, p, BB, 4 * BB, nb, xq, dx, s32, y + n0);           \
    else q8_group_neon(CODE, 1, p, BB, BB, nb, xq, dx, s32, y + n0);

/* Y[0, n] for every row: units of one interleaved group of 4 rows (one sequential stream),
 * the N % 4 tail rows one by one; threads split the units as the other GEMVs do */
static void gemv_q8_group(const dq_t *s, long N, const int8_t *xq, const float *dx,
                          const float *s32, float *y, int threads, long chunk) {
    long G = 4, full = N - N % G, groups = full / G, units = groups + (N - full);
    long uchunk = chunk / G < 1 ? 1 : chunk / G, nb = s->nb;
    (void)threads, (void)uchunk; /* without OpenMP */
#pragma omp parallel for num_threads(threads) schedule(dynamic, uchunk)
    for (long u = 0; u < units; u++) {
        long n0 = u < groups ? u * G : full + (u - groups);
        const uint8_t *p = dq_row(s, n0);
        switch (s->code) {
        case S_Q8_0: Q8_GROUP_NEON(S_Q8_0, 34) break;
        case S_Q4_0: Q8_GROUP_NEON(S_Q4_0, 18) break;
        case S_Q5_0: Q8_GROUP_NEON(S_Q5_0, 22) break;
        case S_Q4_1: Q8_GROUP_NEON(S_Q4_1, 20) break;
        default: Q8_GROUP_NEON(S_Q5_1, 24) break;
        }
    }
}
#undef Q8_GROUP_NEON
#endif

/* ---- part 6: the f32 GEMV (M < 4) fused with the unpacking (dqgemm.c) ---------------- */
#if DQ_NEON_PART == 6
static inline float dqn_h2f(const uint8_t *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h; /* FCVT: exact */
}

/* acc + the 32 x 32 s8 products of x (x0: inputs 0-15, x1: 16-31) and the codes lo / hi */
static inline int32x4_t dqn_dot2(int32x4_t acc, int8x16_t lo, int8x16_t hi, int8x16_t x0,
                                 int8x16_t x1) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdotq_s32(acc, lo, x0), hi, x1);
#else
    int16x8_t p0 = vmull_s8(vget_low_s8(lo), vget_low_s8(x0));
    p0 = vmlal_high_s8(p0, lo, x0); /* |sum of two| <= 2 * 128 * 127 < 2^15 */
    int16x8_t p1 = vmull_s8(vget_low_s8(hi), vget_low_s8(x1));
    p1 = vmlal_high_s8(p1, hi, x1);
    return vpadalq_s16(vpadalq_s16(acc, p0), p1);
#endif
}

/* bit j of qh as byte j's bit 4 (16 or 0): bytes 0-15 in *lo, 16-31 in *hi (the four
 * bytes of qh broadcast to their eight lanes by a table lookup, then tested) */
static inline void dqn_qh16(uint32_t qh, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t idx[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vreinterpretq_u8_u32(vdupq_n_u32(qh)), bt = vld1q_u8(bit);
    const uint8x16_t s16 = vdupq_n_u8(16);
    *lo = vandq_u8(vtstq_u8(vqtbl1q_u8(v, vld1q_u8(idx)), bt), s16);
    *hi = vandq_u8(vtstq_u8(vqtbl1q_u8(v, vld1q_u8(idx + 16)), bt), s16);
}

/* block p of a 32-weight layout: its 32 codes as s8 (lo: weights 0-15, hi: 16-31; Q4_0 /
 * Q5_0 signed q - 8 / q - 16, or with raw the unsigned q; Q4_1 / Q5_1 unsigned q, Q8_0 in
 * place) */
static inline __attribute__((always_inline)) void dqn_codes(int code, const uint8_t *p, int raw,
                                                            int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t m4 = vdupq_n_u8(15);
    if (code == S_Q8_0) {
        *lo = vld1q_s8((const int8_t *)p + 2);
        *hi = vld1q_s8((const int8_t *)p + 18);
        return;
    }
    const int one = code == S_Q4_1 || code == S_Q5_1, five = code == S_Q5_0 || code == S_Q5_1;
    const uint8_t *qs = p + 2 + 2 * one + 4 * five;
    const uint8x16_t v = vld1q_u8(qs);
    uint8x16_t a = vandq_u8(v, m4), c = vshrq_n_u8(v, 4);
    if (five) {
        uint32_t qh;
        memcpy(&qh, p + 2 + 2 * one, 4);
        uint8x16_t h0, h1;
        dqn_qh16(qh, &h0, &h1);
        a = vorrq_u8(a, h0);
        c = vorrq_u8(c, h1);
    }
    int8x16_t sa = vreinterpretq_s8_u8(a), sc = vreinterpretq_s8_u8(c);
    if (!one && !raw) {
        const int8x16_t off = vdupq_n_s8(five ? 16 : 8);
        sa = vsubq_s8(sa, off);
        sc = vsubq_s8(sc, off);
    }
    *lo = sa;
    *hi = sc;
}

/* the 16 s8 codes c times x[0 .. 16), as 4 lanes (widened s8 -> s16 -> s32, SCVTF, FMLA) */
#define DQN_CV(v, h) vcvtq_f32_s32((h) ? vmovl_high_s16(v) : vmovl_s16(vget_low_s16(v)))
static inline float32x4_t dqn_blk16(int8x16_t c, const float *x) {
    const int16x8_t a = vmovl_s8(vget_low_s8(c)), b = vmovl_high_s8(c);
    float32x4_t p0 = vmulq_f32(DQN_CV(a, 0), vld1q_f32(x));
    float32x4_t p1 = vmulq_f32(DQN_CV(a, 1), vld1q_f32(x + 4));
    p0 = vfmaq_f32(p0, DQN_CV(b, 0), vld1q_f32(x + 8));
    p1 = vfmaq_f32(p1, DQN_CV(b, 1), vld1q_f32(x + 12));
    return vaddq_f32(p0, p1);
}

/* the 32 codes lo (x[0 .. 16)) and hi (x[16 .. 32)) times x: four independent chains */
static inline float32x4_t dqn_blk32(int8x16_t lo, int8x16_t hi, const float *x) {
    const int16x8_t a = vmovl_s8(vget_low_s8(lo)), b = vmovl_high_s8(lo);
    const int16x8_t c = vmovl_s8(vget_low_s8(hi)), e = vmovl_high_s8(hi);
    float32x4_t p0 = vmulq_f32(DQN_CV(a, 0), vld1q_f32(x));
    float32x4_t p1 = vmulq_f32(DQN_CV(a, 1), vld1q_f32(x + 4));
    float32x4_t p2 = vmulq_f32(DQN_CV(b, 0), vld1q_f32(x + 8));
    float32x4_t p3 = vmulq_f32(DQN_CV(b, 1), vld1q_f32(x + 12));
    p0 = vfmaq_f32(p0, DQN_CV(c, 0), vld1q_f32(x + 16));
    p1 = vfmaq_f32(p1, DQN_CV(c, 1), vld1q_f32(x + 20));
    p2 = vfmaq_f32(p2, DQN_CV(e, 0), vld1q_f32(x + 24));
    p3 = vfmaq_f32(p3, DQN_CV(e, 1), vld1q_f32(x + 28));
    return vaddq_f32(vaddq_f32(p0, p1), vaddq_f32(p2, p3));
}

/* the 32-weight layouts: sum_b d_b (codes . x) (+ m_b sum x over the block: Q4_1 / Q5_1,
 * xs = the sums of X per 32) */
static float dqn_row32(int code, const uint8_t *p, long st, long nb, const float *x,
                       const float *xs) {
    const int mins = code == S_Q4_1 || code == S_Q5_1;
    float32x4_t t0 = vdupq_n_f32(0.0f), t1 = t0;
    float mo = 0.0f;
    long b = 0;
    for (; b + 2 <= nb; b += 2, p += 2 * st, x += 64) {
        int8x16_t l0, h0, l1, h1;
        dqn_codes(code, p, 0, &l0, &h0);
        dqn_codes(code, p + st, 0, &l1, &h1);
        t0 = vfmaq_n_f32(t0, dqn_blk32(l0, h0, x), dqn_h2f(p));
        t1 = vfmaq_n_f32(t1, dqn_blk32(l1, h1, x + 32), dqn_h2f(p + st));
        if (mins) mo += dqn_h2f(p + 2) * xs[b] + dqn_h2f(p + st + 2) * xs[b + 1];
    }
    for (; b < nb; b++, p += st, x += 32) {
        int8x16_t l0, h0;
        dqn_codes(code, p, 0, &l0, &h0);
        t0 = vfmaq_n_f32(t0, dqn_blk32(l0, h0, x), dqn_h2f(p));
        if (mins) mo += dqn_h2f(p + 2) * xs[b];
    }
    return vaddvq_f32(vaddq_f32(t0, t1)) + mo;
}

/* Q4_K / Q5_K scale j and min j (6 bits each) of the block whose 12 scale bytes are at q */
static inline void dqn_sm(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K (five = 0) / Q5_K: sub-block j (32 weights) = d sc_j q - dmin m_j; q the nibbles of
 * qs[32 (j / 2) ..] (low for even j), Q5_K's bit 4 bit j of qh[l] */
static float dqn_row_k45(int five, const uint8_t *p, long st, long nb, const float *x,
                         const float *xs) {
    const uint8x16_t m4 = vdupq_n_u8(15), s16 = vdupq_n_u8(16);
    float32x4_t t0 = vdupq_n_f32(0.0f), t1 = t0;
    float mo = 0.0f;
    for (long b = 0; b < nb; b++, p += st, x += 256, xs += 8) {
        const float d = dqn_h2f(p), dmin = dqn_h2f(p + 2);
        const uint8_t *qs = p + (five ? 48 : 16), *qh = p + 16;
        uint8x16_t h0 = vdupq_n_u8(0), h1 = h0;
        if (five) {
            h0 = vld1q_u8(qh);
            h1 = vld1q_u8(qh + 16);
        }
        for (int c = 0; c < 4; c++) {
            const uint8x16_t v0 = vld1q_u8(qs + 32 * c), v1 = vld1q_u8(qs + 32 * c + 16);
            for (int e = 0; e < 2; e++) {
                const int j = 2 * c + e;
                int sc, m;
                dqn_sm(p + 4, j, &sc, &m);
                uint8x16_t a = e ? vshrq_n_u8(v0, 4) : vandq_u8(v0, m4);
                uint8x16_t bb = e ? vshrq_n_u8(v1, 4) : vandq_u8(v1, m4);
                if (five) {
                    const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << j));
                    a = vorrq_u8(a, vandq_u8(vtstq_u8(h0, bit), s16));
                    bb = vorrq_u8(bb, vandq_u8(vtstq_u8(h1, bit), s16));
                }
                const float32x4_t s = dqn_blk32(vreinterpretq_s8_u8(a), vreinterpretq_s8_u8(bb),
                                                x + 32 * j);
                if (e) t1 = vfmaq_n_f32(t1, s, d * (float)sc);
                else t0 = vfmaq_n_f32(t0, s, d * (float)sc);
                mo += (dmin * (float)m) * xs[j];
            }
        }
    }
    return vaddvq_f32(vaddq_f32(t0, t1)) - mo;
}

/* Q6_K: outputs 128 h + 32 g + l = d sc[8 h + 2 g + l / 16] (q - 32), q = the nibble of
 * ql[64 h + 32 (g & 1) + l] (high for g >= 2) | bits 2 g of qh[32 h + l] << 4 */
static float dqn_row_q6_k(const uint8_t *p, long st, long nb, const float *x) {
    const uint8x16_t m4 = vdupq_n_u8(15), m3 = vdupq_n_u8(3);
    const int8x16_t c32 = vdupq_n_s8(32);
    float32x4_t t0 = vdupq_n_f32(0.0f), t1 = t0;
    for (long b = 0; b < nb; b++, p += st, x += 256) {
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = dqn_h2f(p + 208);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
            const uint8x16_t hb[2] = {vld1q_u8(qh), vld1q_u8(qh + 16)};
            for (int g = 0; g < 4; g++) {
                const float *xg = x + 128 * h + 32 * g;
                int8x16_t q[2];
                for (int e = 0; e < 2; e++) {
                    uint8x16_t l = vld1q_u8(ql + 32 * (g & 1) + 16 * e);
                    l = g >> 1 ? vshrq_n_u8(l, 4) : vandq_u8(l, m4);
                    uint8x16_t hi = vandq_u8(vshlq_u8(hb[e], vdupq_n_s8((int8_t)(-2 * g))), m3);
                    q[e] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l, vshlq_n_u8(hi, 4))), c32);
                }
                const int i = 8 * h + 2 * g;
                t0 = vfmaq_n_f32(t0, dqn_blk16(q[0], xg), d * (float)sc[i]);
                t1 = vfmaq_n_f32(t1, dqn_blk16(q[1], xg + 16), d * (float)sc[i + 1]);
            }
        }
    }
    return vaddvq_f32(vaddq_f32(t0, t1));
}

static int dqn_fused_ok(const dq_t *s) {
    switch (s->code) {
    case S_Q4_0: case S_Q4_1: case S_Q5_0: case S_Q5_1: case S_Q8_0:
    case S_Q4_K: case S_Q5_K: case S_Q6_K: return 1;
    default: return 0;
    }
}

static float dqn_row(const dq_t *s, long n, const float *x, const float *xs) {
    const uint8_t *p = dq_row(s, n);
    const long st = dq_bst(s, n), nb = s->nb;
    switch (s->code) {
    case S_Q4_K: return dqn_row_k45(0, p, st, nb, x, xs);
    case S_Q5_K: return dqn_row_k45(1, p, st, nb, x, xs);
    case S_Q6_K: return dqn_row_q6_k(p, st, nb, x);
    default: return dqn_row32(s->code, p, st, nb, x, xs);
    }
}

/* The GEMV (M < 4) on a dqn_fused_ok scheme: per X row the sums per 32 (the min terms),
 * then units of one interleaved group of R rows (its bytes stay in L1 while its rows are
 * read in turn) or one plain row, split over the threads as the x86 GEMV. 0, or 1 when a
 * buffer could not be allocated. */
static int dqn_gemv(const dq_t *s, long M, long N, long K, const float *x, long ldx, float *y,
                    long ldy, int threads, long chunk) {
    float *xs = alloc_f(M * (K / 32) + 1);
    if (!xs) return 1;
    for (long m = 0; m < M; m++)
        for (long j = 0; j < K / 32; j++) {
            float t = 0.0f;
            for (int l = 0; l < 32; l++) t += x[m * ldx + 32 * j + l];
            xs[m * (K / 32) + j] = t;
        }
    long G = s->R > 1 ? s->R : 1, full = N - N % G, units = full / G + (N - full);
    long uchunk = chunk / G < 1 ? 1 : chunk / G;
    (void)uchunk; /* without OpenMP */
#pragma omp parallel num_threads(threads)
    {
        prefetcher pf = {0, 0};
#pragma omp for schedule(dynamic, uchunk)
        for (long u = 0; u < units; u++) {
            long n0 = u < full / G ? u * G : full + (u - full / G);
            long g = u < full / G ? G : 1;
            for (long r = 0; r < g; r++) {
                prefetch_rows(s, &pf, n0 + r);
                for (long m = 0; m < M; m++)
                    y[m * ldy + n0 + r] = dqn_row(s, n0 + r, x + m * ldx, xs + m * (K / 32));
            }
        }
    }
    free(xs);
    return 0;
}
#endif

/* ---- part 7: the small-batch path, 2 <= M <= SMALL_M (dqgemm_small.c) ---------------- */
#if DQ_NEON_PART == 7
#define DQN_SG 8 /* X rows per pass: 2 weight rows x 8 accumulators, 2 weights, 1 X: 19 regs */

/* the 16 s8 codes c times d (+ m) into o[0 .. 16) (the f32 steps of decode_block) */
static inline void dqn_store16(int8x16_t c, float d, int add, float m, float *o) {
    const int16x8_t a = vmovl_s8(vget_low_s8(c)), b = vmovl_high_s8(c);
    float32x4_t v[4] = {DQN_CV(a, 0), DQN_CV(a, 1), DQN_CV(b, 0), DQN_CV(b, 1)};
    for (int i = 0; i < 4; i++) {
        float32x4_t r = vmulq_n_f32(v[i], d);
        if (add) r = vaddq_f32(r, vdupq_n_f32(m));
        vst1q_f32(o + 4 * i, r);
    }
}

/* blocks of a 32-weight layout: w = d q (Q4_0 / Q5_0 / Q8_0, q signed) or d q + m */
static void dqn_dec32(int code, const uint8_t *p, long st, long nblk, float *o) {
    const int one = code == S_Q4_1 || code == S_Q5_1;
    for (long b = 0; b < nblk; b++, p += st, o += 32) {
        int8x16_t lo, hi;
        dqn_codes(code, p, 0, &lo, &hi);
        const float d = dqn_h2f(p), m = one ? dqn_h2f(p + 2) : 0.0f;
        dqn_store16(lo, d, one, m, o);
        dqn_store16(hi, d, one, m, o + 16);
    }
}

/* Q4_K: sub-block j = (d sc_j) q - (dmin m_j) */
static void dqn_dec_q4_k(const uint8_t *p, long st, long nblk, float *o) {
    const uint8x16_t m4 = vdupq_n_u8(15);
    for (long b = 0; b < nblk; b++, p += st, o += 256) {
        const float d = dqn_h2f(p), dmin = dqn_h2f(p + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            dqn_sm(p + 4, j, &sc, &m);
            const float32x4_t d1 = vdupq_n_f32(d * (float)sc), m1 = vdupq_n_f32(dmin * (float)m);
            for (int e = 0; e < 2; e++) {
                const uint8x16_t v = vld1q_u8(p + 16 + 32 * (j >> 1) + 16 * e);
                const uint8x16_t q = j & 1 ? vshrq_n_u8(v, 4) : vandq_u8(v, m4);
                const uint16x8_t a = vmovl_u8(vget_low_u8(q)), c = vmovl_high_u8(q);
                const uint16x8_t h[2] = {a, c};
                for (int i = 0; i < 4; i++) {
                    const uint16x8_t hv = h[i >> 1];
                    const uint32x4_t w = i & 1 ? vmovl_high_u16(hv) : vmovl_u16(vget_low_u16(hv));
                    vst1q_f32(o + 32 * j + 16 * e + 4 * i,
                              vsubq_f32(vmulq_f32(d1, vcvtq_f32_u32(w)), m1));
                }
            }
        }
    }
}

/* Q6_K: outputs 128 h + 32 g + l = (d sc[8 h + 2 g + l / 16]) (q - 32) */
static void dqn_dec_q6_k(const uint8_t *p, long st, long nblk, float *o) {
    const uint8x16_t m4 = vdupq_n_u8(15), m3 = vdupq_n_u8(3);
    const int8x16_t c32 = vdupq_n_s8(32);
    for (long b = 0; b < nblk; b++, p += st, o += 256) {
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = dqn_h2f(p + 208);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
            for (int g = 0; g < 4; g++)
                for (int e = 0; e < 2; e++) {
                    uint8x16_t l = vld1q_u8(ql + 32 * (g & 1) + 16 * e);
                    l = g >> 1 ? vshrq_n_u8(l, 4) : vandq_u8(l, m4);
                    uint8x16_t hi = vandq_u8(vshlq_u8(vld1q_u8(qh + 16 * e),
                                                      vdupq_n_s8((int8_t)(-2 * g))), m3);
                    int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l, vshlq_n_u8(hi, 4))), c32);
                    dqn_store16(q, d * (float)sc[8 * h + 2 * g + e], 0, 0.0f,
                                o + 128 * h + 32 * g + 16 * e);
                }
        }
    }
}

/* blocks b0 .. b0 + nblk of row n (any layout R) into out, as decode_blocks */
static void dqn_decode_fast(const dq_t *s, long n, long b0, long nblk, float *out) {
    const long st = dq_bst(s, n);
    const uint8_t *p = dq_row(s, n) + b0 * st;
    switch (s->code) {
    case S_Q4_0: case S_Q4_1: case S_Q5_0: case S_Q5_1: case S_Q8_0:
        dqn_dec32(s->code, p, st, nblk, out);
        break;
    case S_Q4_K: dqn_dec_q4_k(p, st, nblk, out); break;
    case S_Q6_K: dqn_dec_q6_k(p, st, nblk, out); break;
    default: decode_blocks(s, n, b0, nblk, out);
    }
}

/* as dot_rows of the x86 branch: a[i] (+)= w . x row i lane-wise, b[i] likewise with w2
 * sharing the X loads; with last the sums go to y, else back to acc (acc[DQN_SG + i]: b) */
static inline __attribute__((always_inline)) void dqn_dot_rows(
    const float *restrict w, const float *restrict w2, const float *x, long ldx, long len,
    int mr, int two, vf *acc, int first, int last, float *y, long ldy) {
    vf a[DQN_SG], b[DQN_SG];
    for (int i = 0; i < mr; i++) {
        a[i] = first ? VZERO() : acc[i];
        b[i] = two && !first ? acc[DQN_SG + i] : VZERO();
    }
    for (long v = 0; v < len; v += VW) {
        vf wv = VLOAD(w + v), wv2 = two ? VLOAD(w2 + v) : VZERO();
        for (int i = 0; i < mr; i++) {
            vf xv = VLOAD(x + i * ldx + v);
            a[i] = VFMA(wv, xv, a[i]);
            if (two) b[i] = VFMA(wv2, xv, b[i]);
        }
    }
    for (int i = 0; i < mr; i++) {
        if (last) {
            y[i * ldy] = vhsum(a[i]);
            if (two) y[i * ldy + 1] = vhsum(b[i]);
        } else {
            acc[i] = a[i];
            if (two) acc[DQN_SG + i] = b[i];
        }
    }
}

#define DQN_DOT(n, two) dqn_dot_rows(w, w2, x, ldx, len, n, two, acc, first, last, y, ldy)
#define DQN_CASES(two)                                                                        \
    switch (mr) {                                                                             \
    case 1: DQN_DOT(1, two); break;                                                           \
    case 2: DQN_DOT(2, two); break;                                                           \
    case 3: DQN_DOT(3, two); break;                                                           \
    case 4: DQN_DOT(4, two); break;                                                           \
    case 5: DQN_DOT(5, two); break;                                                           \
    case 6: DQN_DOT(6, two); break;                                                           \
    case 7: DQN_DOT(7, two); break;                                                           \
    default: DQN_DOT(DQN_SG, two);                                                            \
    }
static void dqn_dot_group(const float *w, const float *w2, const float *x, long ldx, long len,
                          int mr, vf *acc, int first, int last, float *y, long ldy) {
    if (w2) {
        DQN_CASES(1)
    } else {
        DQN_CASES(0)
    }
}
#undef DQN_CASES
#undef DQN_DOT

/* as the x86 branch: the NEON-decoded layouts from 2 X rows, the others from 4 */
static int small_ok(const dq_t *s, long M) {
    if (M < 2 || M > SMALL_M || s->qk % VW) return 0;
    switch (s->code) {
    case S_Q8_0: case S_Q5_0: case S_Q4_K: case S_Q6_K: return 1;
    default: return M >= 4;
    }
}

static int gemv_small(const dq_t *s, long M, long N, long K, const float *x, long ldx,
                      float *y, long ldy, int threads) {
    long cb = SMALL_K / s->qk < 1 ? 1 : SMALL_K / s->qk;
    if (cb > s->nb) cb = s->nb;
    long per = 262144, want = (N * s->row_bytes + per - 1) / per; /* as the GEMV's grain */
    if (want < threads) threads = want < 1 ? 1 : (int)want;
    long chunk = 32768 / s->row_bytes;
    if (chunk < 1) chunk = 1;
    int fail = 0;
    (void)K;
    long pairs = (N + 1) / 2, pchunk = chunk / 2 < 1 ? 1 : chunk / 2;
    (void)pchunk; /* without OpenMP */
#pragma omp parallel num_threads(threads) reduction(| : fail)
    {
        long clen = cb * s->qk;
        float *buf = alloc_f(2 * clen);
        if (!buf) fail = 1;
        else {
            prefetcher pf = {0, 0};
            vf acc[2 * SMALL_M];
#pragma omp for schedule(dynamic, pchunk)
            for (long pr = 0; pr < pairs; pr++) {
                long n = 2 * pr;
                int two = n + 1 < N;
                prefetch_rows(s, &pf, n);
                if (two) prefetch_rows(s, &pf, n + 1);
                for (long b0 = 0; b0 < s->nb; b0 += cb) {
                    long nblk = s->nb - b0 < cb ? s->nb - b0 : cb, off = b0 * s->qk;
                    int first = b0 == 0, last = b0 + nblk >= s->nb;
                    dqn_decode_fast(s, n, b0, nblk, buf);
                    if (two) dqn_decode_fast(s, n + 1, b0, nblk, buf + clen);
                    for (long m0 = 0; m0 < M; m0 += DQN_SG) {
                        int mr = (int)(M - m0 < DQN_SG ? M - m0 : DQN_SG);
                        dqn_dot_group(buf, two ? buf + clen : 0, x + m0 * ldx + off, ldx,
                                      nblk * s->qk, mr, acc + 2 * m0, first, last,
                                      y + m0 * ldy + n, ldy);
                    }
                }
            }
            free(buf);
        }
    }
    return fail;
}
#endif

/* ---- part 4: the f32 prefill micro-tile (dqgemm_prefill.c) ---------------------------- */
#if DQ_NEON_PART == 4
#define VL 4
#define MW 8 /* 8 x 2 q accumulators + 2 token vectors + 8 weight scalars: 26 v registers */
#define DQP_LEVEL 3
#endif

/* ---- part 5: the int8 prefill micro-kernel (dqgemm_prefill_q8.c) ---------------------- */
#if DQ_NEON_PART == 5
/* c[QMW][QNT] (+)= the K block's groups of G inputs (as the portable q_kernel_c): u
 * [QMW][QKS] codes, s / mm [QMW][groups], X panel pointers at the block's start (xq: 4
 * inputs of a token per 32-bit lane, QNT tokens; dx per 32, mxs per G). */
static inline __attribute__((always_inline)) void q_kernel_neon(
    long kc, int G, const uint8_t *restrict u, const float *s, const float *mm, long gs,
    const int8_t *xq, const float *dx, const float *mxs, int flip, int mins, float *restrict c,
    int accum) {
    const int8x16_t fl = vdupq_n_s8(flip ? (int8_t)-128 : 0);
    float32x4_t acc[QMW][2];
    for (int i = 0; i < QMW; i++)
        for (int v = 0; v < 2; v++)
            acc[i][v] = accum ? vld1q_f32(c + i * QNT + 4 * v) : vdupq_n_f32(0.0f);
    for (long g = 0; g < kc / G; g++) {
        int32x4_t ia[QMW][2];
        for (int i = 0; i < QMW; i++) ia[i][0] = ia[i][1] = vdupq_n_s32(0);
        for (int st = 0; st < G / 4; st++) {
            const int8_t *xp = xq + ((g * G) / 4 + st) * QNT * 4;
            const int8x16_t x0 = vld1q_s8(xp), x1 = vld1q_s8(xp + 16);
            for (int i = 0; i < QMW; i++) { /* LD1R: the broadcast on a load port */
                int8x16_t wb = vreinterpretq_s8_s32(
                    vld1q_dup_s32((const int32_t *)(u + i * QKS + g * G + 4 * st)));
                if (flip) wb = veorq_s8(wb, fl);
                ia[i][0] = dqn_dot(ia[i][0], wb, x0);
                ia[i][1] = dqn_dot(ia[i][1], wb, x1);
            }
        }
        const long b32 = (g * G) / 32;
        for (int v = 0; v < 2; v++) {
            const float32x4_t dxv = vld1q_f32(dx + b32 * QNT + 4 * v);
            const float32x4_t mx = vld1q_f32(mxs + g * QNT + 4 * v);
            for (int i = 0; i < QMW; i++) {
                const float32x4_t t = vcvtq_f32_s32(ia[i][v]);
                acc[i][v] = vfmaq_f32(acc[i][v], t, vmulq_n_f32(dxv, s[i * gs + g]));
                if (mins) acc[i][v] = vfmsq_n_f32(acc[i][v], mx, mm[i * gs + g]);
            }
        }
    }
    for (int i = 0; i < QMW; i++)
        for (int v = 0; v < 2; v++) vst1q_f32(c + i * QNT + 4 * v, acc[i][v]);
}

static void q_kernel_c(long kc, int G, const uint8_t *restrict u, const float *s,
                       const float *mm, long gs, const int8_t *xq, const float *dx,
                       const float *mxs, const qform_t *f, float *restrict c, int accum) {
    /* Q8_0 (u = code + 128): the codes back to s8, the offset term (mm = 128 s) dropped */
    if (f->off == 128) q_kernel_neon(kc, G, u, s, mm, gs, xq, dx, mxs, 1, 0, c, accum);
    else if (G == 32) q_kernel_neon(kc, 32, u, s, mm, gs, xq, dx, mxs, 0, f->mins, c, accum);
    else q_kernel_neon(kc, 16, u, s, mm, gs, xq, dx, mxs, 0, f->mins, c, accum);
}
#endif
