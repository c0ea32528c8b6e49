/* aarch64 NEON vector layer of the attention kernels (included by csrc/attention_vec.c
 * inside its ISA chain; the same macro names as the AVX-512 / AVX2 branches there).
 *
 * 4 lanes of float32x4_t (W = 4); FMA is FMLA (fused, as x86's vfmadd); round to nearest
 * even is FRINTN; max / min / selects keep x86's NaN rule (max(a, b) is b unless a > b),
 * so vexp / vtanh and the online softmax give the x86 paths' values lane for lane.
 * Element rows: bf16 widened by a 16-bit shift (USHLL) and rounded to nearest even in
 * integer registers (NaN -> quiet NaN with its payload, as attention_vec.c's st1); f16
 * through FCVTL / FCVTN (vcvt_f32_f16 / vcvt_f16_f32: exact widening, nearest-even
 * rounding, every aarch64 CPU has them). 32 vector registers: QK / PV tiles of 6 x 4
 * accumulators (24) plus the 4 row vectors, like the AVX-512 branch.
 */
#include <arm_neon.h>
#define RLX_ATT_ISA 3
#define W 4
typedef float32x4_t vf;
#define VLOAD(p) vld1q_f32(p)
#define VSTORE(p, x) vst1q_f32((p), (x))
#define VSET1(x) vdupq_n_f32(x)
#define VZERO() vdupq_n_f32(0.0f)
#define VADD(a, b) vaddq_f32((a), (b))
#define VSUB(a, b) vsubq_f32((a), (b))
#define VMUL(a, b) vmulq_f32((a), (b))
#define VDIV(a, b) vdivq_f32((a), (b))
#define VFMA(a, b, c) vfmaq_f32((c), (a), (b))
/* x86's rule: the second operand unless the comparison holds (so NaN gives b) */
#define VMAX(a, b) att_neon_max((a), (b))
#define VMIN(a, b) att_neon_min((a), (b))
/* lanes where a < b (ordered) take y, the others x */
#define VSEL_LT(a, b, x, y) vbslq_f32(vcltq_f32((a), (b)), (y), (x))
#define VSEL_EQ(a, b, x, y) vbslq_f32(vceqq_f32((a), (b)), (y), (x))
#define VROUND(x) vrndnq_f32(x)
#define VPOW2I(n) /* 2^n for integral float n in [-126, 127] */ \
    vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23))
#define QK_J 6
#define ATT_NEON_FN static inline __attribute__((unused)) /* clang: unused in some builds */
#define PV_D 6

ATT_NEON_FN float32x4_t att_neon_max(float32x4_t a, float32x4_t b) {
    return vbslq_f32(vcgtq_f32(a, b), a, b);
}

ATT_NEON_FN float32x4_t att_neon_min(float32x4_t a, float32x4_t b) {
    return vbslq_f32(vcltq_f32(a, b), a, b);
}

/* r[i] = row i -> r[i] = column i of a 4 x 4 block */
ATT_NEON_FN void att_neon_transpose4(float32x4_t *r) {
    float32x4_t t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
    float32x4_t t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
    float64x2_t d0 = vreinterpretq_f64_f32(t0), d1 = vreinterpretq_f64_f32(t1);
    float64x2_t d2 = vreinterpretq_f64_f32(t2), d3 = vreinterpretq_f64_f32(t3);
    r[0] = vreinterpretq_f32_f64(vtrn1q_f64(d0, d2));
    r[1] = vreinterpretq_f32_f64(vtrn1q_f64(d1, d3));
    r[2] = vreinterpretq_f32_f64(vtrn2q_f64(d0, d2));
    r[3] = vreinterpretq_f32_f64(vtrn2q_f64(d1, d3));
}

/* the sum of the 4 lanes (FADDP pairs) */
ATT_NEON_FN float att_neon_hsum(float32x4_t x) { return vaddvq_f32(x); }

/* n bf16 / f16 elements widened to f32 (exact) */
ATT_NEON_FN void att_neon_widen_bf16(float *dst, const uint16_t *src, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t h = vld1q_u16(src + i);
        vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
        vst1q_f32(dst + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
    }
    for (; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, 4);
    }
}

ATT_NEON_FN void att_neon_widen_f16(float *dst, const uint16_t *src, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src + i));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i++) {
        __fp16 h;
        memcpy(&h, src + i, 2);
        dst[i] = (float)h;
    }
}

/* f32 -> bf16 bits of 4 lanes: nearest even; NaN -> its top bits, quieted (| 0x40) */
ATT_NEON_FN uint16x4_t att_neon_bf16x4(float32x4_t x) {
    uint32x4_t u = vreinterpretq_u32_f32(x);
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    uint16x4_t r = vshrn_n_u32(vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), lsb)), 16);
    uint16x4_t q = vorr_u16(vshrn_n_u32(u, 16), vdup_n_u16(0x40));
    uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
    return vbsl_u16(vmovn_u32(nan), q, r);
}

/* n f32 rounded to bf16 / f16 (nearest even) */
ATT_NEON_FN void att_neon_round_bf16(uint16_t *dst, const float *src, long n) {
    long i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(dst + i, att_neon_bf16x4(vld1q_f32(src + i)));
    if (i < n) {
        float t[4] = {0, 0, 0, 0};
        uint16_t o[4];
        memcpy(t, src + i, sizeof(float) * (size_t)(n - i));
        vst1_u16(o, att_neon_bf16x4(vld1q_f32(t)));
        memcpy(dst + i, o, 2 * (size_t)(n - i));
    }
}

ATT_NEON_FN void att_neon_round_f16(uint16_t *dst, const float *src, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(src + i)), vld1q_f32(src + i + 4));
        vst1q_u16(dst + i, vreinterpretq_u16_f16(h));
    }
    for (; i < n; i++) {
        __fp16 h = (__fp16)src[i];
        memcpy(dst + i, &h, 2);
    }
}
