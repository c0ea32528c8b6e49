/* The depthwise convolution of conv.c's library (after conv.c in one translation unit:
 * its RLX_MADD, conv_clamp and the OpenMP workspace helpers). */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* rlx_conv2d_depthwise_f32(x, w, bias|NULL, out, xp, p, threads)
 *   groups == C, O = C * m (m output channels per input channel), any window, stride,
 *   dilation, padding: per (n, o) the input plane is copied into the zero-bordered
 *   per-thread buffer xp (Hp x Wp, border zeroed here). At stride 1 or 2 along W (and at
 *   most DW_TAPS taps) 4 output rows x DW_L outputs are summed in registers over every
 *   tap, then clamped and stored; at stride 2 the plane's rows are first split into
 *   their even and odd columns (Wq floats each, after the Hp x Wp plane in xp) so a
 *   tap's outputs are consecutive floats there. The caller makes Wp at least the last
 *   vector's reads (stride 1: ceil(OW / DW_L) * DW_L + (KW-1)*dw; stride 2: Wq >=
 *   ceil(OW / DW_L) * DW_L + (KW-1)*dw / 2 and Wp >= 2*Wq). Other strides: every tap
 *   adds w * a row of the plane to the output row (a vector loop over the width).
 *   p = {N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups, act, lo, hi, Hp, Wp,
 *   Wq}; act: 0 none, 1 relu, 5 relu6, 6 clip(lo, hi) (lo / hi: float bits), after the
 *   bias. xp: threads * (Hp * Wp + (stride 2: Hp * 2 * Wq)) floats.
 */
/* depthwise: a vector of outputs kept in a register (GCC vector extensions) */
#if defined(__AVX512F__)
#define DW_L 16
#elif defined(__AVX2__)
#define DW_L 8
#else
#define DW_L 4
#endif
typedef float dwv __attribute__((vector_size(4 * DW_L)));
typedef float dwvu __attribute__((vector_size(4 * DW_L), aligned(4)));
typedef int32_t dwi __attribute__((vector_size(4 * DW_L)));
static inline dwv dw_madd(dwv acc, float w, dwv x) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA) /* vfmadd / FMLA */
    dwv r;
    for (int j = 0; j < DW_L; j++) r[j] = fmaf(w, x[j], acc[j]);
    return r;
#else
    return acc + w * x;
#endif
}

#define DW_TAPS 64 /* windows of up to this many taps take the register path */
int rlx_conv_dw_l(void) { return DW_L; }

/* the vector a of outputs ow0.. of a row into y (clamped to [lo, hi] when act; only the
 * floats before OW) */
static inline void dw_store(float *y, int64_t ow0, int64_t OW, dwv a, int64_t act, float lo,
                            float hi) {
    if (act) { /* selects on the lane masks of the compares: NaN stays NaN */
        const dwv lov = (dwv){0} + lo, hiv = (dwv){0} + hi;
        dwi m = a < lov;
        a = (dwv)(((dwi)a & ~m) | ((dwi)lov & m));
        m = a > hiv;
        a = (dwv)(((dwi)a & ~m) | ((dwi)hiv & m));
    }
    if (ow0 + DW_L <= OW)
        *(dwvu *)(y + ow0) = a;
    else
        memcpy(y + ow0, &a, (size_t)(OW - ow0) * sizeof(float));
}

void rlx_conv2d_depthwise_f32(const float *x, const float *w, const float *bias, float *out,
                              float *xp, const int64_t *p, int threads) {
    const int64_t N = p[0], C = p[1], H = p[2], W = p[3], O = p[4], KH = p[5], KW = p[6];
    const int64_t OH = p[7], OW = p[8], sh = p[9], sw = p[10], ph = p[11], pw = p[12];
    const int64_t dh = p[13], dw = p[14], act = p[16], Hp = p[19], Wp = p[20], Wq = p[21];
    float lo = ((const float *)(p + 17))[0], hi = ((const float *)(p + 18))[0];
    if (act == 1) lo = 0.0f, hi = INFINITY;
    if (act == 5) lo = 0.0f, hi = 6.0f;
    const int64_t m = O / C, plane = OH * OW, KK = KH * KW;
    /* the register path: stride 1 or 2 along W, at most DW_TAPS taps */
    const int vec = (sw == 1 || (sw == 2 && Wq > 0)) && KK <= DW_TAPS;
    const int64_t rw = sw == 2 ? 2 * Wq : Wp; /* floats per row of the buffer it reads */
    const int64_t per = Hp * Wp + (sw == 2 ? Hp * rw : 0);
    int64_t toff[DW_TAPS]; /* each tap's offset in that buffer */
    for (int64_t t = 0; vec && t < KK; t++) {
        const int64_t kh = t / KW, c = (t % KW) * dw;
        toff[t] = kh * dh * rw + (sw == 2 ? (c & 1) * Wq + (c >> 1) : c);
    }
#pragma omp parallel num_threads(threads)
    {
        float *buf = xp + (int64_t)rlx_tid() * per;
        float *split = buf + Hp * Wp; /* stride 2: each row's even then odd columns */
        int64_t cur = -1;
        memset(buf, 0, (size_t)(Hp * Wp) * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t no = 0; no < N * O; no++) {
            const int64_t n = no / O, o = no % O, c = o / m;
            if (cur != n * C + c) {
                cur = n * C + c;
                const float *xc = x + cur * H * W;
                for (int64_t h = 0; h < H; h++)
                    memcpy(buf + (h + ph) * Wp + pw, xc + h * W, (size_t)W * sizeof(float));
                if (vec && sw == 2)
                    for (int64_t r = 0; r < Hp; r++) {
                        const float *src = buf + r * Wp;
                        float *ev = split + r * rw, *od = ev + Wq;
                        for (int64_t i = 0; i < Wq; i++) {
                            ev[i] = src[2 * i];
                            od[i] = src[2 * i + 1];
                        }
                    }
            }
            const float *wo = w + o * KK;
            const float b = bias ? bias[o] : 0.0f;
            float *y = out + no * plane;
            const float *src = sw == 2 ? split : buf;
            const int64_t rs = sh * rw; /* floats between the input rows of two output rows */
            int64_t oh1 = 0;
            for (; vec && oh1 + 4 <= OH; oh1 += 4) {
                /* 4 output rows x DW_L-wide vectors in registers over all the taps (4
                 * independent FMA chains; a tap's weight loaded once) */
                const float *r0 = src + oh1 * rs;
                float *yr = y + oh1 * OW;
                for (int64_t ow0 = 0; ow0 < OW; ow0 += DW_L) {
                    dwv a0 = (dwv){0} + b, a1 = a0, a2 = a0, a3 = a0;
                    for (int64_t t = 0; t < KK; t++) {
                        const float wv = wo[t], *sp = r0 + toff[t] + ow0;
                        a0 = dw_madd(a0, wv, *(const dwvu *)sp);
                        a1 = dw_madd(a1, wv, *(const dwvu *)(sp + rs));
                        a2 = dw_madd(a2, wv, *(const dwvu *)(sp + 2 * rs));
                        a3 = dw_madd(a3, wv, *(const dwvu *)(sp + 3 * rs));
                    }
                    dw_store(yr, ow0, OW, a0, act, lo, hi);
                    dw_store(yr + OW, ow0, OW, a1, act, lo, hi);
                    dw_store(yr + 2 * OW, ow0, OW, a2, act, lo, hi);
                    dw_store(yr + 3 * OW, ow0, OW, a3, act, lo, hi);
                }
            }
            for (int64_t oh = oh1; vec && oh < OH; oh++) {
                /* the last rows: one row's vectors at a time */
                float *yr = y + oh * OW;
                const float *r0 = src + oh * rs;
                for (int64_t ow0 = 0; ow0 < OW; ow0 += DW_L) {
                    dwv a0 = (dwv){0} + b;
                    for (int64_t t = 0; t < KK; t++)
                        a0 = dw_madd(a0, wo[t], *(const dwvu *)(r0 + toff[t] + ow0));
                    dw_store(yr, ow0, OW, a0, act, lo, hi);
                }
            }
            for (int64_t oh = 0; oh < OH && !vec; oh++) {
                float *yr = y + oh * OW;
                for (int64_t ow = 0; ow < OW; ow++) yr[ow] = b;
                for (int64_t kh = 0; kh < KH; kh++) {
                    const float *xr = buf + (oh * sh + kh * dh) * Wp;
                    for (int64_t kw = 0; kw < KW; kw++) {
                        const float wv = wo[kh * KW + kw];
                        const float *xs = xr + kw * dw;
                        if (sw == 1) {
#pragma omp simd
                            for (int64_t ow = 0; ow < OW; ow++) RLX_MADD(yr[ow], wv, xs[ow]);
                        } else if (sw == 2) {
#pragma omp simd
                            for (int64_t ow = 0; ow < OW; ow++) RLX_MADD(yr[ow], wv, xs[2 * ow]);
                        } else {
                            for (int64_t ow = 0; ow < OW; ow++) RLX_MADD(yr[ow], wv, xs[ow * sw]);
                        }
                    }
                }
                if (act) conv_clamp(yr, OW, lo, hi);
            }
        }
    }
}
