/* INT8 GEMM for rlx: the aarch64 paths (included by qgemm.c inside its ISA chain, so
 * ahead of the shared driver). They define what the x86 branches define: the tile shape
 * (MR, NR, KG), the activation shifts, a_t / b_t, row_stats16 / quantize_row_dyn (the
 * dynamic row quantization in 4 lanes), ukernel_rows (the micro-kernel) and the epilogue's
 * vector macros (VL = 4). Weights and activations are packed by the shared driver in its
 * layout Bp[panel][k / KG][NR][KG] and Ap[k / KG][MR][KG], which is what each kernel
 * reads: with KG = 8 a k group of two adjacent columns (or rows) is the 2 x 8 operand of
 * SMMLA.
 *
 * Activations are packed as SIGNED bytes here (x86 packs them unsigned for vpdpbusd):
 * int8 activations as they are (S_SHIFT 0), uint8 ones minus 128 (U_SHIFT -128, the top
 * bit flipped). The raw sums are then sum_k (q + shift) * b and the driver's correction
 * corr = shift + zp gives the exact (q - zp) @ B as on x86: raw - corr * colsum[n].
 *
 *   3  NEON (armv8-a): 4 x 8 tile, KG = 4. Per k group and row, the row's 4 bytes
 *      broadcast (dup .4s), SMULL / SMULL2 (s8 x s8 -> s16, exact: |product| <= 16384)
 *      and SADALP (adjacent s16 pairs added into s32) per 4 columns: 16 accumulators
 *      hold two partial sums per column, added pairwise (ADDP) at the end.
 *   4  SDOT (armv8.2-a+dotprod): 8 x 12 tile, KG = 4. Per k group, 2 loads of A (4 rows
 *      x 4 bytes each), 3 of B (4 columns x 4 bytes) and 24 `sdot v.4s, b.16b, a.4b[r]`
 *      into 24 accumulators (29 of the 32 vector registers).
 *   5  SMMLA (+i8mm): 8 x 12 tile, KG = 8. Per k group, 4 loads of A (row pairs x 8
 *      bytes), 6 of B (column pairs x 8 bytes) and 24 SMMLA (2x8 by 8x2 -> a 2 x 2 int32
 *      tile each) into 24 accumulators.
 */
#include <arm_neon.h>

#if RLX_ISA == 3
#define MR 4
#define NR 8
#define KG 4
#elif RLX_ISA == 4
#define MR 8
#define NR 12
#define KG 4
#else
#define MR 8
#define NR 12
#define KG 8
#endif
#define S_SHIFT 0    /* added to a signed activation: packed as it is */
#define U_SHIFT -128 /* added to an unsigned one: packed as a signed byte */
typedef uint8_t a_t; /* the bytes of signed activations */
typedef int8_t b_t;

/* 8 activation bytes of k .. k + 7 (k a multiple of 4) into their places of a packed row
 * (groups of KG bytes qs bytes apart) */
static inline void qn_put8(uint8_t *out, long k, long qs, uint8x8_t v) {
#if KG == 8
    vst1_u8(out + (k / 8) * qs, v);
#else
    vst1_lane_u32((uint32_t *)(void *)(out + (k / 4) * qs), vreinterpret_u32_u8(v), 0);
    vst1_lane_u32((uint32_t *)(void *)(out + (k / 4 + 1) * qs), vreinterpret_u32_u8(v), 1);
#endif
}

/* 8 values of a static row, clip(rint(x / scale) + zp, lo, hi) + sh as bytes (each
 * result in [-128, 255]: its low byte), NaN giving zp: the steps of quantize_row's scalar
 * loop in 4 lanes (FRINTN rounds half to even as rint does) */
static inline uint8x8_t qn_quantize8(const float *x, float32x4_t vs, float32x4_t vz,
                                     float32x4_t vlo, float32x4_t vhi, float32x4_t vsh) {
    int32x4_t q[2];
    for (int h = 0; h < 2; ++h) {
        float32x4_t t = vrndnq_f32(vdivq_f32(vld1q_f32(x + 4 * h), vs));
        t = vbslq_f32(vceqq_f32(t, t), t, vdupq_n_f32(0.0f)); /* NaN -> 0: q = zp */
        t = vminq_f32(vmaxq_f32(vaddq_f32(t, vz), vlo), vhi);
        q[h] = vcvtnq_s32_f32(vaddq_f32(t, vsh));
    }
    int16x8_t w = vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]));
    return vreinterpret_u8_s8(vmovn_s16(w));
}

/* lo = min(0, min x), hi = max(0, max x) (mode 0: -max|x|, max|x|) of x[0..K); returns 1
 * when the row holds NaN or +-inf (max of the sign-cleared bit patterns >= that of inf) */
static int row_stats16(const float *x, long K, int mode, float *lo_, float *hi_) {
    uint32x4_t amax = vdupq_n_u32(0);
    float32x4_t vlo = vdupq_n_f32(0.0f), vhi = vdupq_n_f32(0.0f);
    long k = 0;
    for (; k + 4 <= K; k += 4) {
        float32x4_t v = vld1q_f32(x + k);
        amax = vmaxq_u32(amax, vandq_u32(vreinterpretq_u32_f32(v), vdupq_n_u32(0x7fffffffu)));
        if (mode) {
            vlo = vminnmq_f32(vlo, v);
            vhi = vmaxnmq_f32(vhi, v);
        }
    }
    uint32_t bits = vmaxvq_u32(amax);
    float lo = vminvq_f32(vlo), hi = vmaxvq_f32(vhi);
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

/* A dynamic row (finite, |x / scale| <= 255) packed: mode 0 s8, mode 1 u8 with zero point
 * zp then minus 128. FCVTNS rounds half to even as rint does, the saturating narrowings
 * clip, so q is the same integer as the reference's. */
static void quantize_row_dyn(const float *x, long K, float scale, int32_t zp, int mode,
                             a_t *out, long qs) {
    const float32x4_t vs = vdupq_n_f32(scale);
    const int32x4_t vz = vdupq_n_s32(zp);
    long k = 0;
    if (K % KG) memset(out + (K / KG) * qs, 0, KG);
    for (; k + 8 <= K; k += 8) {
        int32x4_t l = vcvtnq_s32_f32(vdivq_f32(vld1q_f32(x + k), vs));
        int32x4_t h = vcvtnq_s32_f32(vdivq_f32(vld1q_f32(x + k + 4), vs));
        uint8x8_t b;
        if (mode == 0) {
            b = vreinterpret_u8_s8(vqmovn_s16(vcombine_s16(vqmovn_s32(l), vqmovn_s32(h))));
        } else {
            uint16x8_t w = vcombine_u16(vqmovun_s32(vaddq_s32(l, vz)), vqmovun_s32(vaddq_s32(h, vz)));
            b = veor_u8(vqmovn_u16(w), vdup_n_u8(0x80));
        }
        qn_put8(out, k, qs, b);
    }
    for (; k < K; ++k) {
        float t = nearbyintf(x[k] / scale) + (float)zp;
        t = mode == 0 ? (t < -128.0f ? -128.0f : t > 127.0f ? 127.0f : t)
                      : (t < 0.0f ? 0.0f : t > 255.0f ? 255.0f : t) - 128.0f;
        out[(k / KG) * qs + k % KG] = (a_t)(int32_t)t;
    }
}

/* A scheduling barrier for gcc (a volatile asm): keeps it from hoisting the next column
 * pair's B load (SMMLA) or the next row's products (NEON) above this step's
 * instructions, which made it spill accumulators (gcc 12: 2 of 24 per k group on SMMLA,
 * 1 of 16 on NEON, with 6 B vectors or 16 products live at once). */
#define QN_NO_HOIST() __asm__ __volatile__("" ::: "memory")

#if RLX_ISA == 3
/* NEON: R (4 or 2) rows x 8 columns. lo/hi: columns 0-1 / 2-3 of each 4-column B vector,
 * each lane the sum of a k pair; ADDP folds them into the 4 columns at the end. */
#define NEON_ROW(r)                                                                      \
    do {                                                                                 \
        int8x16_t ar = vreinterpretq_s8_s32(vdupq_laneq_s32(a, r));                      \
        lo0[r] = vpadalq_s16(lo0[r], vmull_s8(vget_low_s8(ar), vget_low_s8(b0)));        \
        hi0[r] = vpadalq_s16(hi0[r], vmull_high_s8(ar, b0));                             \
        lo1[r] = vpadalq_s16(lo1[r], vmull_s8(vget_low_s8(ar), vget_low_s8(b1)));        \
        hi1[r] = vpadalq_s16(hi1[r], vmull_high_s8(ar, b1));                             \
        QN_NO_HOIST();                                                                   \
    } while (0)
#define NEON_UKERNEL(NAME, R, ROWS)                                                      \
    static void NAME(long kg, const a_t *ap, const b_t *bp, int32_t *ct, int zero) {     \
        int32x4_t lo0[R], hi0[R], lo1[R], hi1[R];                                        \
        for (int r = 0; r < R; ++r)                                                      \
            lo0[r] = hi0[r] = lo1[r] = hi1[r] = vdupq_n_s32(0);                          \
        for (long k = 0; k < kg; ++k) {                                                  \
            int32x4_t a = vreinterpretq_s32_u8(vld1q_u8(ap));                            \
            int8x16_t b0 = vld1q_s8(bp), b1 = vld1q_s8(bp + 16);                         \
            ROWS                                                                         \
            ap += KG * MR;                                                               \
            bp += KG * NR;                                                               \
        }                                                                                \
        for (int r = 0; r < R; ++r) {                                                    \
            int32x4_t s0 = vpaddq_s32(lo0[r], hi0[r]), s1 = vpaddq_s32(lo1[r], hi1[r]);   \
            if (!zero) {                                                                 \
                s0 = vaddq_s32(s0, vld1q_s32(ct + r * NR));                              \
                s1 = vaddq_s32(s1, vld1q_s32(ct + r * NR + 4));                          \
            }                                                                            \
            vst1q_s32(ct + r * NR, s0);                                                  \
            vst1q_s32(ct + r * NR + 4, s1);                                              \
        }                                                                                \
    }
NEON_UKERNEL(ukernel_n4, 4, NEON_ROW(0); NEON_ROW(1); NEON_ROW(2); NEON_ROW(3);)
NEON_UKERNEL(ukernel_n2, 2, NEON_ROW(0); NEON_ROW(1);)
#undef NEON_UKERNEL
#undef NEON_ROW

/* rows: how many rows of the tile are real (1..MR) */
static void ukernel_rows(long kg, const a_t *ap, const b_t *bp, int32_t *ct, long rows,
                         int zero) {
    if (rows > 2)
        ukernel_n4(kg, ap, bp, ct, zero);
    else
        ukernel_n2(kg, ap, bp, ct, zero);
}
#elif RLX_ISA == 4
#if !defined(__ARM_FEATURE_DOTPROD)
#error "RLX_ISA=4 (SDOT) needs the dotprod or i8mm target (-march=armv8.2-a+dotprod)"
#endif
/* SDOT: R (8, 4 or 2) rows x 12 columns; row r of the k group is lane r % 4 of A vector r / 4 */
#define SD_ROW(r, A, L)                                                                  \
    do {                                                                                 \
        c[r][0] = vdotq_laneq_s32(c[r][0], b0, A, L);                                    \
        c[r][1] = vdotq_laneq_s32(c[r][1], b1, A, L);                                    \
        c[r][2] = vdotq_laneq_s32(c[r][2], b2, A, L);                                    \
    } while (0)
#define SDOT_UKERNEL(NAME, R, ROWS)                                                      \
    static void NAME(long kg, const a_t *ap, const b_t *bp, int32_t *ct, int zero) {     \
        int32x4_t c[R][3];                                                               \
        for (int r = 0; r < R; ++r)                                                      \
            for (int j = 0; j < 3; ++j)                                                  \
                c[r][j] = zero ? vdupq_n_s32(0) : vld1q_s32(ct + r * NR + 4 * j);        \
        for (long k = 0; k < kg; ++k) {                                                  \
            int8x16_t a0 = vreinterpretq_s8_u8(vld1q_u8(ap));                            \
            int8x16_t b0 = vld1q_s8(bp), b1 = vld1q_s8(bp + 16), b2 = vld1q_s8(bp + 32); \
            ROWS                                                                         \
            ap += KG * MR;                                                               \
            bp += KG * NR;                                                               \
        }                                                                                \
        for (int r = 0; r < R; ++r)                                                      \
            for (int j = 0; j < 3; ++j) vst1q_s32(ct + r * NR + 4 * j, c[r][j]);         \
    }
SDOT_UKERNEL(ukernel_d8, 8,
             int8x16_t a1 = vreinterpretq_s8_u8(vld1q_u8(ap + 16));
             SD_ROW(0, a0, 0); SD_ROW(1, a0, 1); SD_ROW(2, a0, 2); SD_ROW(3, a0, 3);
             SD_ROW(4, a1, 0); SD_ROW(5, a1, 1); SD_ROW(6, a1, 2); SD_ROW(7, a1, 3);)
SDOT_UKERNEL(ukernel_d4, 4, SD_ROW(0, a0, 0); SD_ROW(1, a0, 1); SD_ROW(2, a0, 2);
             SD_ROW(3, a0, 3);)
SDOT_UKERNEL(ukernel_d2, 2, SD_ROW(0, a0, 0); SD_ROW(1, a0, 1);)
#undef SDOT_UKERNEL
#undef SD_ROW

/* rows: how many rows of the tile are real (1..MR) */
static void ukernel_rows(long kg, const a_t *ap, const b_t *bp, int32_t *ct, long rows,
                         int zero) {
    if (rows > 4)
        ukernel_d8(kg, ap, bp, ct, zero);
    else if (rows > 2)
        ukernel_d4(kg, ap, bp, ct, zero);
    else
        ukernel_d2(kg, ap, bp, ct, zero);
}
#elif RLX_ISA == 5
#if !defined(__ARM_FEATURE_MATMUL_INT8)
#error "RLX_ISA=5 (SMMLA) needs the i8mm target (-march=armv8.2-a+dotprod+i8mm)"
#endif
/* SMMLA: P row pairs (4, 3, 2 or 1) x 6 column pairs. c[p][q] holds rows 2p, 2p+1 x
 * columns 2q, 2q+1 as [r0c0, r0c1, r1c0, r1c1]: its halves are 8-byte pieces of ct rows. */
#define SMMLA_UKERNEL(NAME, P)                                                           \
    static void NAME(long kg, const a_t *ap, const b_t *bp, int32_t *ct, int zero) {     \
        int32x4_t c[P][6];                                                               \
        _Pragma("GCC unroll 4") for (int p = 0; p < P; ++p)                              \
            _Pragma("GCC unroll 6") for (int q = 0; q < 6; ++q)                          \
                c[p][q] = zero ? vdupq_n_s32(0)                                          \
                               : vcombine_s32(vld1_s32(ct + 2 * p * NR + 2 * q),         \
                                              vld1_s32(ct + (2 * p + 1) * NR + 2 * q));  \
        for (long k = 0; k < kg; ++k) {                                                  \
            int8x16_t a[P];                                                              \
            _Pragma("GCC unroll 4") for (int p = 0; p < P; ++p)                          \
                a[p] = vreinterpretq_s8_u8(vld1q_u8(ap + 16 * p));                       \
            _Pragma("GCC unroll 6") for (int q = 0; q < 6; ++q) {                        \
                int8x16_t b = vld1q_s8(bp + 16 * q);                                     \
                _Pragma("GCC unroll 4") for (int p = 0; p < P; ++p)                      \
                    c[p][q] = vmmlaq_s32(c[p][q], a[p], b);                              \
                QN_NO_HOIST();                                                           \
            }                                                                            \
            ap += KG * MR;                                                               \
            bp += KG * NR;                                                               \
        }                                                                                \
        _Pragma("GCC unroll 4") for (int p = 0; p < P; ++p)                              \
            _Pragma("GCC unroll 6") for (int q = 0; q < 6; ++q) {                        \
                vst1_s32(ct + 2 * p * NR + 2 * q, vget_low_s32(c[p][q]));                \
                vst1_s32(ct + (2 * p + 1) * NR + 2 * q, vget_high_s32(c[p][q]));         \
            }                                                                            \
    }
SMMLA_UKERNEL(ukernel_m8, 4)
SMMLA_UKERNEL(ukernel_m6, 3)
SMMLA_UKERNEL(ukernel_m4, 2)
SMMLA_UKERNEL(ukernel_m2, 1)
#undef SMMLA_UKERNEL

/* rows: how many rows of the tile are real (1..MR) */
static void ukernel_rows(long kg, const a_t *ap, const b_t *bp, int32_t *ct, long rows,
                         int zero) {
    if (rows > 6)
        ukernel_m8(kg, ap, bp, ct, zero);
    else if (rows > 4)
        ukernel_m6(kg, ap, bp, ct, zero);
    else if (rows > 2)
        ukernel_m4(kg, ap, bp, ct, zero);
    else
        ukernel_m2(kg, ap, bp, ct, zero);
}
#endif

/* ---- the epilogue's vector layer (qgemm_epilogue.c), 4 f32 lanes -------------------- */
#define VL 4
typedef float32x4_t vf;
typedef int32x4_t vi;
#define VLOADI(p) vld1q_s32((const int32_t *)(p))
#define VSTOREI(p, v) vst1q_s32((int32_t *)(p), v)
#define VLOAD(p) vld1q_f32(p)
#define VSTORE(p, v) vst1q_f32(p, v)
#define VSET(x) vdupq_n_f32(x)
#define VSETI(x) vdupq_n_s32(x)
#define VADD vaddq_f32
#define VSUB vsubq_f32
#define VMUL vmulq_f32
#define VDIV vdivq_f32
#define VMAX vmaxq_f32
#define VMIN vminq_f32
#define VFMA(a, b, c) vfmaq_f32(c, a, b)  /* a * b + c */
#define VFNMA(a, b, c) vfmsq_f32(c, a, b) /* c - a * b */
#define VABS(x) vabsq_f32(x)
#define VROUND(x) vrndnq_f32(x)
#define VCVTI(x) vcvtq_f32_s32(x)
#define VTOI(x) vcvtnq_s32_f32(x)
#define VASF(x) vreinterpretq_f32_s32(x)
#define VIADD vaddq_s32
#define VISUB vsubq_s32
#define VIMUL vmulq_s32
#define VISLL(x, s) vshlq_n_s32(x, s)
#define VSIGN_OF(x, s) /* |x| with the sign of s */ \
    vbslq_f32(vdupq_n_u32(0x80000000u), s, vabsq_f32(x))
