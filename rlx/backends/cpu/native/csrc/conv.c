/* Direct 2-D convolution and pooling over f32 NCHW (1-D as H = 1), for the small
 * convolutions of imported CNNs where im2col + BLAS costs more than the arithmetic.
 *
 * rlx_conv2d_f32(x, w, bias|NULL, out, p, threads)
 *   p = {N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups}
 *   out[n, o] = bias[o] + sum_{c in group, kh, kw} w[o, c, kh, kw] * x[n, c, ih, iw]
 *   with ih = oh*sh - ph + kh*dh (taps outside the input read zero). Per (n, o) an output row is accumulated tap by tap over
 *   the range of ow whose taps fall inside the input (no test in the inner loop: it
 *   vectorises for any target). Threads: an OpenMP team over (n, o).
 *
 * rlx_conv2d_wide_f32(x, xp, ws, w, bias|NULL, out, p, threads)
 *   the same for stride 1 (any dilation, padding, groups), faster: x is copied into the
 *   interior of the zero-bordered private buffer xp [N*C, Hp, Wp] (Hp = OH + (KH-1)*dh,
 *   Wp = OW + (KW-1)*dw; its border is zeroed by the caller, once), then every tap adds
 *   w * xp[i + kh*dh*Wp + kw*dw] over the "wide" output i in [0, (OH-1)*Wp + OW) (rows
 *   of Wp, the last KW-1 columns of each row discarded): one long vector loop per tap,
 *   for 4 output channels at once (each input load feeds 4 multiply-adds). ws: per
 *   thread 4 * (OH*Wp) floats.
 *
 * rlx_pool2d_f32(x, out, p, threads)
 *   p = {NC, H, W, OH, OW, KH, KW, sh, sw, ph, pw, kind}; kind 0 max, 1 average.
 *   Max over the window's real elements (-inf when none; NaN propagates, as np.max);
 *   average = their sum / their count (padding not counted), as rlx's Pool reference.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "omp_workspace.h"

static inline int64_t lo_index(int64_t off, int64_t step) {
    /* smallest i >= 0 with i*step + off >= 0 */
    if (off >= 0) return 0;
    return (-off + step - 1) / step;
}

static inline int64_t hi_index(int64_t off, int64_t step, int64_t n, int64_t outn) {
    /* one past the largest i < outn with i*step + off < n */
    if (off > n - 1) return 0;
    int64_t h = (n - 1 - off) / step + 1;
    return h < outn ? h : outn;
}

void rlx_conv2d_f32(const float *x, const float *w, const float *bias, float *out,
                    const int64_t *p, int threads) {
    const int64_t N = p[0], C = p[1], H = p[2], W = p[3], O = p[4], KH = p[5], KW = p[6];
    const int64_t OH = p[7], OW = p[8], sh = p[9], sw = p[10], ph = p[11], pw = p[12];
    const int64_t dh = p[13], dw = p[14], G = p[15];
    const int64_t cg = C / G, og = O / G, plane = OH * OW;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t o = 0; o < O; o++) {
            const int64_t g = o / og;
            float *y = out + (n * O + o) * plane;
            const float b = bias ? bias[o] : 0.0f;
            for (int64_t i = 0; i < plane; i++) y[i] = b;
            for (int64_t c = 0; c < cg; c++) {
                const float *xc = x + (n * C + g * cg + c) * H * W;
                const float *wc = w + (o * cg + c) * KH * KW;
                for (int64_t kh = 0; kh < KH; kh++) {
                    const int64_t offh = kh * dh - ph;
                    const int64_t oh0 = lo_index(offh, sh), oh1 = hi_index(offh, sh, H, OH);
                    for (int64_t kw = 0; kw < KW; kw++) {
                        const float wv = wc[kh * KW + kw];
                        const int64_t offw = kw * dw - pw;
                        const int64_t ow0 = lo_index(offw, sw), ow1 = hi_index(offw, sw, W, OW);
                        for (int64_t oh = oh0; oh < oh1; oh++) {
                            const float *xr = xc + (oh * sh + offh) * W + offw;
                            float *yr = y + oh * OW;
                            if (sw == 1) {
                                for (int64_t ow = ow0; ow < ow1; ow++) yr[ow] += wv * xr[ow];
                            } else {
                                for (int64_t ow = ow0; ow < ow1; ow++) yr[ow] += wv * xr[ow * sw];
                            }
                        }
                    }
                }
            }
        }
    }
}

#define RLX_CONV_BLOCK 4 /* output channels per pass */
#define RLX_CONV_CHUNK 16 /* wide outputs kept in registers per pass */
#ifdef __FMA__
#define RLX_MADD(acc, w, v) ((acc) = fmaf((w), (v), (acc)))
#else
#define RLX_MADD(acc, w, v) ((acc) += (w) * (v))
#endif


void rlx_conv2d_wide_f32(const float *x, float *xp, float *ws, const float *w,
                         const float *bias, float *out, const int64_t *p, int threads) {
    const int64_t N = p[0], C = p[1], H = p[2], W = p[3], O = p[4], KH = p[5], KW = p[6];
    const int64_t OH = p[7], OW = p[8], ph = p[11], pw = p[12];
    const int64_t dh = p[13], dw = p[14], G = p[15];
    const int64_t Hp = OH + (KH - 1) * dh, Wp = OW + (KW - 1) * dw;
    const int64_t cg = C / G, og = O / G, plane = OH * OW, ct = cg * KH * KW;
    const int64_t L = (OH - 1) * Wp + OW;
    const int64_t Lpad = (L + RLX_CONV_CHUNK - 1) / RLX_CONV_CHUNK * RLX_CONV_CHUNK;
    const int64_t blocks = (og + RLX_CONV_BLOCK - 1) / RLX_CONV_BLOCK;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t q = 0; q < N * C; q++) {
            for (int64_t h = 0; h < H; h++) {
                const int64_t r = h + ph;
                if (r < 0 || r >= Hp) continue;
                int64_t w0 = pw < 0 ? -pw : 0, w1 = W + pw > Wp ? Wp - pw : W;
                if (w1 > w0)
                    memcpy(xp + (q * Hp + r) * Wp + w0 + pw, x + (q * H + h) * W + w0,
                           (size_t)(w1 - w0) * sizeof(float));
            }
        }
        float *acc = ws + (int64_t)rlx_tid() * RLX_CONV_BLOCK * Lpad;
#pragma omp for collapse(3) schedule(static)
        for (int64_t n = 0; n < N; n++) {
            for (int64_t g = 0; g < G; g++) {
                for (int64_t b = 0; b < blocks; b++) {
                    const int64_t o0 = g * og + b * RLX_CONV_BLOCK;
                    int64_t nb = og - b * RLX_CONV_BLOCK;
                    nb = nb > RLX_CONV_BLOCK ? RLX_CONV_BLOCK : nb;
                    const float *wr[RLX_CONV_BLOCK];
                    for (int64_t j = 0; j < RLX_CONV_BLOCK; j++)
                        wr[j] = w + (o0 + (j < nb ? j : 0)) * ct;
                    const float *xn = xp + (n * C + g * cg) * Hp * Wp;
                    for (int64_t i0 = 0; i0 < Lpad; i0 += RLX_CONV_CHUNK) {
                        float a0[RLX_CONV_CHUNK] = {0}, a1[RLX_CONV_CHUNK] = {0};
                        float a2[RLX_CONV_CHUNK] = {0}, a3[RLX_CONV_CHUNK] = {0};
                        int64_t t = 0;
                        for (int64_t c = 0; c < cg; c++) {
                            for (int64_t kh = 0; kh < KH; kh++) {
                                for (int64_t kw = 0; kw < KW; kw++, t++) {
                                    const float *xs = xn + c * Hp * Wp + kh * dh * Wp + kw * dw + i0;
                                    const float w0 = wr[0][t], w1 = wr[1][t];
                                    const float w2 = wr[2][t], w3 = wr[3][t];
                                    for (int k = 0; k < RLX_CONV_CHUNK; k++) {
                                        const float v = xs[k];
                                        RLX_MADD(a0[k], w0, v);
                                        RLX_MADD(a1[k], w1, v);
                                        RLX_MADD(a2[k], w2, v);
                                        RLX_MADD(a3[k], w3, v);
                                    }
                                }
                            }
                        }
                        memcpy(acc + i0, a0, sizeof a0);
                        memcpy(acc + Lpad + i0, a1, sizeof a1);
                        memcpy(acc + 2 * Lpad + i0, a2, sizeof a2);
                        memcpy(acc + 3 * Lpad + i0, a3, sizeof a3);
                    }
                    for (int64_t j = 0; j < nb; j++) {
                        const float bj = bias ? bias[o0 + j] : 0.0f;
                        const float *aj = acc + j * Lpad;
                        float *y = out + (n * O + o0 + j) * plane;
                        for (int64_t oh = 0; oh < OH; oh++)
                            for (int64_t ow = 0; ow < OW; ow++) {
                                y[oh * OW + ow] = aj[oh * Wp + ow] + bj;
                            }
                    }
                }
            }
        }
    }
}

void rlx_pool2d_f32(const float *x, float *out, const int64_t *p, int threads) {
    const int64_t NC = p[0], H = p[1], W = p[2], OH = p[3], OW = p[4], KH = p[5], KW = p[6];
    const int64_t sh = p[7], sw = p[8], ph = p[9], pw = p[10], kind = p[11];
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t q = 0; q < NC; q++) {
        const float *xq = x + q * H * W;
        for (int64_t oh = 0; oh < OH; oh++) {
            float *y = out + (q * OH + oh) * OW;
            int64_t h0 = oh * sh - ph, h1 = h0 + KH;
            h0 = h0 < 0 ? 0 : h0;
            h1 = h1 > H ? H : h1;
            const float init = kind == 0 ? -INFINITY : 0.0f;
            for (int64_t ow = 0; ow < OW; ow++) y[ow] = init;
            for (int64_t ih = h0; ih < h1; ih++) {
                for (int64_t kw = 0; kw < KW; kw++) {
                    const int64_t off = kw - pw;
                    const int64_t ow0 = lo_index(off, sw), ow1 = hi_index(off, sw, W, OW);
                    const float *xr = xq + ih * W + off;
                    if (kind == 0) {
                        for (int64_t ow = ow0; ow < ow1; ow++) {
                            const float v = xr[ow * sw], m = y[ow];
                            /* NaN wins (as np.max): once y is NaN it stays */
                            y[ow] = ((v > m) | (v != v)) & (m == m) ? v : m;
                        }
                    } else {
                        for (int64_t ow = ow0; ow < ow1; ow++) y[ow] += xr[ow * sw];
                    }
                }
            }
            if (kind == 1) {
                const float hc = (float)(h1 > h0 ? h1 - h0 : 0);
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t w0 = ow * sw - pw, w1 = w0 + KW;
                    w0 = w0 < 0 ? 0 : w0;
                    w1 = w1 > W ? W : w1;
                    y[ow] = y[ow] / (hc * (float)(w1 > w0 ? w1 - w0 : 0));
                }
            }
        }
    }
}
