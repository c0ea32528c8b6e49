/* aarch64 NEON helpers of the NCHWc convolutions (included by conv_nchwc.c's ISA chain on
 * __aarch64__ with __ARM_NEON; conv_winograd.c, conv_pointwise.c and conv_dw_nchwc.c use
 * them from the same translation unit). The names are the x86 branches': CB, TMAX, vf,
 * VZERO / VSET1 / VLOAD / VSTORE / VFMA, transpose_block, vload_n / vstore_n, vclamp, plus
 * tile_store4 (the transposing epilogue of 4 positions).
 *
 * A block is CB = 4 channels, one q register: the NCHWc layouts keep a vector per
 * position, and a block of 8 would be a pair of registers (half the positions per
 * register tile) with more zero lanes on channel counts that are not multiples of 8.
 * VFMA is FMLA (fused, one rounding, whatever -ffp-contract says). The register tile
 * holds TMAX = 8 positions x 2 output blocks: 16 accumulators, 2 weight vectors and 8
 * input floats (FMLA by element) in the 32 vector registers; per input channel and tap
 * 2 weight loads + 8 input loads feed 16 FMLAs. (12 positions, 24 accumulators, left gcc
 * spilling 4 of them every step.) The epilogue transposes the tile 4 positions at a time
 * (TMAX > CB here, unlike x86's CB x CB squares).
 */
#ifndef RLX_CONV_NEON_H
#define RLX_CONV_NEON_H
#include <arm_neon.h>

#define RLX_CONV_NEON 1
#define CB 4
#define TMAX 8
typedef float32x4_t vf;
#define VZERO() vdupq_n_f32(0.0f)
#define VSET1(s) vdupq_n_f32(s)
#define VLOAD(p) vld1q_f32(p)
#define VSTORE(p, v) vst1q_f32((p), (v))
#define VFMA(a, b, c) vfmaq_f32((c), (a), (b))

/* r[0..4) (rows) transposed in place: r[j] lane t = the old r[t] lane j */
static inline __attribute__((always_inline)) void transpose_block(vf r[4]) {
    const float32x4x2_t p = vtrnq_f32(r[0], r[1]), q = vtrnq_f32(r[2], r[3]);
    r[0] = vcombine_f32(vget_low_f32(p.val[0]), vget_low_f32(q.val[0]));
    r[1] = vcombine_f32(vget_low_f32(p.val[1]), vget_low_f32(q.val[1]));
    r[2] = vcombine_f32(vget_high_f32(p.val[0]), vget_high_f32(q.val[0]));
    r[3] = vcombine_f32(vget_high_f32(p.val[1]), vget_high_f32(q.val[1]));
}

/* the first n (<= 4) floats of s, the other lanes zero */
static inline vf vload_n(const float *s, int64_t n) {
    if (n >= 4) return vld1q_f32(s);
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i = 0; i < n; i++) t[i] = s[i];
    return vld1q_f32(t);
}

/* the first n (<= 4) lanes of v into d */
static inline void vstore_n(float *d, vf v, int64_t n) {
    if (n >= 4) {
        vst1q_f32(d, v);
        return;
    }
    float t[4];
    vst1q_f32(t, v);
    for (int64_t i = 0; i < n; i++) d[i] = t[i];
}

/* min(hi, max(lo, v)): FMAX / FMIN return NaN when either operand is NaN (NaN stays, as
 * on x86 and as np.clip) */
static inline vf vclamp(vf v, float lo, float hi) {
    return vminq_f32(vdupq_n_f32(hi), vmaxq_f32(vdupq_n_f32(lo), v));
}

/* the epilogue of 4 positions of a register tile, r[0..4) (a vector of CB output channels
 * per position; transposed here to a vector of positions per channel), into oc <= CB
 * output rows of NCHW (y0: channel 0's first position, rows plane floats apart; the first
 * ng <= 4 positions stored): + bias[j] (bias: the block's first channel's, or NULL), +
 * the residual (r0, out's layout, or NULL), clamped to [lo, hi]. The caller fills r from
 * its accumulators element by element (taking their address would keep them in memory) */
static inline __attribute__((always_inline)) void tile_store4(vf r[4], int64_t ng, int64_t oc,
                                                               int64_t plane, const float *bias,
                                                               const float *r0, float *y0,
                                                               float lo, float hi) {
    transpose_block(r);
    if (ng > 4) ng = 4;
    for (int64_t j = 0; j < oc; j++) {
        const int64_t off = j * plane;
        vf v = r[j] + VSET1(bias ? bias[j] : 0.0f);
        if (r0) v = v + vload_n(r0 + off, ng);
        vstore_n(y0 + off, vclamp(v, lo, hi), ng);
    }
}
#endif /* RLX_CONV_NEON_H */
