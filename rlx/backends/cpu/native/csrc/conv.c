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
 *   The 2x2 stride-2 pool without padding (the small CNNs' downsampling) runs one
 *   straight pass per output row.
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
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
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

/* the 2x2 stride-2 pool without padding: one pass over each pair of input rows */
static void pool2x2(const float *x, float *out, const int64_t *p, int threads) {
    const int64_t NC = p[0], H = p[1], W = p[2], OH = p[3], OW = p[4], kind = p[11];
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t q = 0; q < NC * OH; q++) {
        const float *r0 = x + ((q / OH) * H + (q % OH) * 2) * W, *r1 = r0 + W;
        float *y = out + q * OW;
        if (kind == 0) {
            for (int64_t ow = 0; ow < OW; ow++) {
                const float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
                const float ab = a > b ? a : b, cd = c > d ? c : d, m = ab > cd ? ab : cd;
                /* NaN wins (as np.max): the sum of the four is NaN then */
                y[ow] = (a != a) | (b != b) | (c != c) | (d != d) ? a + b + c + d : m;
            }
        } else {
            for (int64_t ow = 0; ow < OW; ow++)
                y[ow] = (r0[2 * ow] + r0[2 * ow + 1] + r1[2 * ow] + r1[2 * ow + 1]) / 4.0f;
        }
    }
}

void rlx_pool2d_f32(const float *x, float *out, const int64_t *p, int threads) {
    const int64_t NC = p[0], H = p[1], W = p[2], OH = p[3], OW = p[4], KH = p[5], KW = p[6];
    const int64_t sh = p[7], sw = p[8], ph = p[9], pw = p[10], kind = p[11];
    if (KH == 2 && KW == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0 && 2 * OH <= H &&
        2 * OW <= W) {
        pool2x2(x, out, p, threads);
        return;
    }
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

/* ---- convolution as a GEMM on rlx's packed sgemm ------------------------------------
 *
 * rlx_conv2d_gemm_f32(x, xp, wa, out, res|NULL, bp, p, sgemm, threads)
 *   p = {N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups, NR, has_bias, act,
 *        Hp, Wp, lo, hi}
 *   Per image and group, out[n, g] [O/G, OH*OW] = wa[g] [O/G, Kp] @ B [Kp, OH*OW], with
 *   Kp = C/G*KH*KW (+1 with a bias: wa's last column is the bias, B's last row ones), on
 *   the packed sgemm of the same target (`sgemm`: the address of its rlx_sgemm). B is
 *   written straight into the sgemm's packed layout (panels of NR output positions, NR
 *   floats per k), from the zero-bordered copy xp [N*C, Hp, Wp] of x (the border zeroed
 *   once by the caller; xp == x when there is no padding): no im2col matrix. A panel is
 *   copied run by run (an output row's share: consecutive floats at stride 1, every
 *   other float at stride 2), else gathered. res: a residual of out's shape, added in the
 *   sgemm's epilogue (in the tile).
 *   act (sgemm epilogue, in the tile): 0 none, 1 relu; 5 relu6, 6 clip(lo, hi) and a relu
 *   after a residual are applied after the product, on the block while it is in cache.
 *   The output positions go in column blocks of p[23] (a multiple of NR, about 256 KB of
 *   packed B so it stays in L2 from its packing to its product; at least 128 columns so
 *   the sgemm's repacking of the weight per block stays small): each block is packed then
 *   multiplied. Threads: blocks over the team (sgemm on one thread each) when there are
 *   at least two per thread, else one block at a time with the sgemm's team.
 *   bp: threads * p[23] * Kp floats. A private xp has CONV_SLACK readable floats before
 *   and after it (whole-panel reads of a panel split over two output rows).
 */
typedef int (*rlx_sgemm_fn)(long m, long n, long k, const float *a, long rsa, long csa,
                            const float *bp, void *c, long ldc, int c_bf16, const float *bias,
                            const float *res, long ldr, float alpha, int act, int threads);

#if defined(__AVX512F__)
#define CONV_NR 32
#elif defined(__AVX2__) && defined(__FMA__)
#define CONV_NR 16
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define CONV_NR 12 /* sgemm_neon.h's */
#else
#define CONV_NR 8
#endif
#define CONV_SLACK 64 /* floats of readable slack around a private bordered input */

/* int rlx_conv_nr(void): the sgemm panel width of this target (sgemm.c's NR) */
int rlx_conv_nr(void) { return CONV_NR; }

static void conv_pack_panels(const float *xg, const int64_t *p, int64_t Kp, int64_t p0,
                             int64_t p1, float *bp, int slack) {
    const int64_t C = p[1], OW = p[8], KH = p[5], KW = p[6], OH = p[7];
    const int64_t sh = p[9], sw = p[10], dh = p[13], dw = p[14], G = p[15], NR = p[16];
    const int64_t has_bias = p[17], Hp = p[19], Wp = p[20];
    const int64_t cg = C / G, L = OH * OW, KK = KH * KW;
    int64_t base[64], rs[64], rl[64];
    for (int64_t q = p0; q < p1; q++) {
        float *d = bp + q * Kp * NR;
        const int64_t j0 = q * NR, nv = L - j0 < NR ? L - j0 : NR;
        for (int64_t j = 0; j < nv; j++) base[j] = ((j0 + j) / OW) * sh * Wp + ((j0 + j) % OW) * sw;
        /* runs of positions sw apart in xp (each output row's share) */
        int64_t nr = 0;
        for (int64_t j = 0; j < nv; j++) {
            if (nr > 0 && base[j] == base[rs[nr - 1]] + rl[nr - 1] * sw) {
                rl[nr - 1]++;
            } else {
                rs[nr] = j;
                rl[nr++] = 1;
            }
        }
        for (int64_t c = 0; c < cg; c++) {
            const float *xc = xg + c * Hp * Wp;
            for (int64_t kh = 0; kh < KH; kh++) {
                for (int64_t kw = 0; kw < KW; kw++) {
                    const float *s = xc + kh * dh * Wp + kw * dw;
                    float *dk = d + (c * KK + kh * KW + kw) * NR;
                    if (NR == CONV_NR && nv == CONV_NR && nr == 1 && sw == 1) {
                        const float *sa = s + base[0];
#pragma GCC unroll 4
                        for (int j = 0; j < CONV_NR; j++) dk[j] = sa[j];
                    } else if (NR == CONV_NR && nv == CONV_NR && nr == 1 && sw == 2) {
                        const float *sa = s + base[0];
#pragma GCC unroll 4
                        for (int j = 0; j < CONV_NR; j++) dk[j] = sa[2 * j];
                    } else if (NR == CONV_NR && nv == CONV_NR && nr == 2 && slack && sw == 1) {
                        /* two rows' shares: whole-width reads past either run stay in
                         * the private buffer's slack, the select keeps the run's floats */
                        const float *sa = s + base[0], *sb = s + base[rs[1]] - rs[1];
                        const int64_t r0 = rl[0];
#pragma GCC unroll 4
                        for (int j = 0; j < CONV_NR; j++) dk[j] = j < r0 ? sa[j] : sb[j];
                    } else if (sw == 1) {
                        for (int64_t r = 0; r < nr; r++) {
                            float *dd = dk + rs[r];
                            const float *ss = s + base[rs[r]];
                            for (int64_t j = 0; j < rl[r]; j++) dd[j] = ss[j];
                        }
                    } else if (sw == 2) {
                        for (int64_t r = 0; r < nr; r++) {
                            float *dd = dk + rs[r];
                            const float *ss = s + base[rs[r]];
                            for (int64_t j = 0; j < rl[r]; j++) dd[j] = ss[2 * j];
                        }
                    } else {
                        for (int64_t j = 0; j < nv; j++) dk[j] = s[base[j]];
                    }
                    for (int64_t j = nv; j < NR; j++) dk[j] = 0.0f;
                }
            }
        }
        if (has_bias)
            for (int64_t j = 0; j < NR; j++) d[(Kp - 1) * NR + j] = 1.0f;
    }
}

static void conv_clamp(float *y, int64_t n, float lo, float hi) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float v = y[i];
        /* NaN stays NaN, as np.clip */
        y[i] = v < lo ? lo : (v > hi ? hi : v);
    }
}

/* columns [j0, j1) of image n, group g (j0 a multiple of NR): pack them, one sgemm */
static void conv_block(const float *src, const float *wa, float *out, const float *res,
                       const int64_t *p, int64_t n, int64_t g, int64_t j0, int64_t j1,
                       float *bp, rlx_sgemm_fn sgemm, int threads, int slack) {
    const int64_t C = p[1], O = p[4], KH = p[5], KW = p[6], OH = p[7], OW = p[8];
    const int64_t G = p[15], NR = p[16], has_bias = p[17], act = p[18], Hp = p[19], Wp = p[20];
    const float lo = act == 5 ? 0.0f : ((const float *)(p + 21))[0];
    const float hi = act == 5 ? 6.0f : ((const float *)(p + 22))[0];
    const int64_t cg = C / G, og = O / G, L = OH * OW;
    const int64_t Kp = cg * KH * KW + has_bias;
    const int64_t q0 = j0 / NR, q1 = (j1 + NR - 1) / NR;
    const float *xg = src + (n * C + g * cg) * Hp * Wp;
    if (threads > 1) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t q = q0; q < q1; q++) conv_pack_panels(xg, p, Kp, q, q + 1, bp - q0 * Kp * NR, slack);
    } else {
        conv_pack_panels(xg, p, Kp, q0, q1, bp - q0 * Kp * NR, slack);
    }
    float *y = out + (n * O + g * og) * L + j0;
    const float *r = res ? res + (n * O + g * og) * L + j0 : NULL;
    /* the sgemm adds the residual after its activation: with one, the relu comes after */
    sgemm(og, j1 - j0, Kp, wa + g * og * Kp, Kp, 1, bp, y, L, 0, NULL, r, L, 1.0f,
          act == 1 && !r ? 1 : 0, threads);
    if (act >= 5 || (act == 1 && r))
        for (int64_t o = 0; o < og; o++)
            conv_clamp(y + o * L, j1 - j0, act == 1 ? 0.0f : lo, act == 1 ? INFINITY : hi);
}

void rlx_conv2d_gemm_f32(const float *x, float *xp, const float *wa, float *out,
                         const float *res, float *bp, const int64_t *p, void *sgemm_addr,
                         int threads) {
    const int64_t N = p[0], C = p[1], H = p[2], W = p[3], KH = p[5], KW = p[6];
    const int64_t OH = p[7], OW = p[8], ph = p[11], pw = p[12], G = p[15];
    const int64_t has_bias = p[17], Hp = p[19], Wp = p[20], ncb = p[23];
    const int64_t L = OH * OW, Kp = C / G * KH * KW + has_bias;
    rlx_sgemm_fn sgemm = (rlx_sgemm_fn)sgemm_addr;
    const int copy = xp != x;
    if (copy) {
#pragma omp parallel for schedule(static) num_threads(threads)
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
    }
    const float *src = copy ? xp : x;
    /* column blocks of ncb positions (a multiple of NR, the packed block sized for L2) */
    const int64_t nblk = (L + ncb - 1) / ncb, tasks = N * G * nblk;
    const int64_t psize = ncb * Kp;
    if (threads > 1 && tasks >= 2 * threads) {
        /* one block per task, tasks over the team, sgemm on one thread each */
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int64_t t = 0; t < tasks; t++) {
            const int64_t n = t / (G * nblk), g = (t / nblk) % G, j0 = (t % nblk) * ncb;
            conv_block(src, wa, out, res, p, n, g, j0, j0 + ncb < L ? j0 + ncb : L,
                       bp + rlx_tid() * psize, sgemm, 1, copy);
        }
    } else {
        for (int64_t t = 0; t < tasks; t++) {
            const int64_t n = t / (G * nblk), g = (t / nblk) % G, j0 = (t % nblk) * ncb;
            conv_block(src, wa, out, res, p, n, g, j0, j0 + ncb < L ? j0 + ncb : L, bp,
                       sgemm, threads, copy);
        }
    }
}

/* rlx_conv2d_gemm_t_f32(x, xp, cols, wp, bias|NULL, out, res|NULL, yt, p, sgemm, threads)
 *   groups == 1, for small output planes (the late stages of a ResNet: 7x7, 14x14), where
 *   the weight is the big operand: per image, yt [L, O] = cols [L, K] @ W^T [K, O] on the
 *   packed sgemm with W^T packed once as its B (wp, rlx_sgemm_pack_b) instead of the weight
 *   repacked as A on every call; cols is the image's im2col matrix stored K x L (cols[k*L
 *   + l], read as A with row stride 1 and column stride L; L*K floats, small here), the
 *   bias in the sgemm's epilogue; then out[n, o, l] = act(yt[l, o] + res[n, o, l]), the
 *   transpose with the residual and the activation. p as rlx_conv2d_gemm_f32's (its NR
 *   and ncb unused). yt: L*O floats.
 */
void rlx_conv2d_gemm_t_f32(const float *x, float *xp, float *cols, const float *wp,
                           const float *bias, float *out, const float *res, float *yt,
                           const int64_t *p, void *sgemm_addr, int threads) {
    const int64_t N = p[0], C = p[1], H = p[2], W = p[3], O = p[4], KH = p[5], KW = p[6];
    const int64_t OH = p[7], OW = p[8], sh = p[9], sw = p[10], ph = p[11], pw = p[12];
    const int64_t dh = p[13], dw = p[14], act = p[18], Hp = p[19], Wp = p[20];
    float lo = ((const float *)(p + 21))[0], hi = ((const float *)(p + 22))[0];
    if (act == 0) lo = -INFINITY, hi = INFINITY;
    if (act == 1) lo = 0.0f, hi = INFINITY;
    if (act == 5) lo = 0.0f, hi = 6.0f;
    const int64_t L = OH * OW, KK = KH * KW, K = C * KK;
    rlx_sgemm_fn sgemm = (rlx_sgemm_fn)sgemm_addr;
    const int copy = xp != x;
    for (int64_t n = 0; n < N; n++) {
        const float *xn = x + n * C * H * W;
        if (copy) {
            float *xpn = xp + n * C * Hp * Wp;
            for (int64_t q = 0; q < C; q++)
                for (int64_t h = 0; h < H; h++)
                    memcpy(xpn + (q * Hp + h + ph) * Wp + pw, xn + (q * H + h) * W,
                           (size_t)W * sizeof(float));
            xn = xpn;
        }
        /* a 1x1 stride-1 conv without padding: the image is its own im2col matrix */
        const int plain = KK == 1 && sh == 1 && sw == 1 && !copy;
#pragma omp parallel for schedule(static) num_threads(threads) if (K * L >= (1 << 16))
        for (int64_t q = 0; q < K * !plain; q++) {
            const int64_t c = q / KK, kh = (q / KW) % KH, kw = q % KW;
            const float *s = xn + c * Hp * Wp + kh * dh * Wp + kw * dw;
            float *d = cols + q * L;
            for (int64_t oh = 0; oh < OH; oh++) {
                const float *sr = s + oh * sh * Wp;
                float *dr = d + oh * OW;
                if (sw == 1) {
                    for (int64_t ow = 0; ow < OW; ow++) dr[ow] = sr[ow];
                } else {
                    for (int64_t ow = 0; ow < OW; ow++) dr[ow] = sr[ow * sw];
                }
            }
        }
        sgemm(L, O, K, plain ? xn : cols, 1, L, wp, yt, O, 0, bias, NULL, 0, 1.0f, 0, threads);
        float *y = out + n * O * L;
        const float *r = res ? res + n * O * L : NULL;
        for (int64_t o0 = 0; o0 < O; o0 += 16) { /* 16 channels: a line of yt per l */
            const int64_t o1 = o0 + 16 < O ? o0 + 16 : O;
            for (int64_t l = 0; l < L; l++)
                for (int64_t o = o0; o < o1; o++) {
                    /* branch-free clamps (selects: NaN compares false and stays) */
                    float v = yt[l * O + o] + (r ? r[o * L + l] : 0.0f);
                    v = v < lo ? lo : v;
                    y[o * L + l] = v > hi ? hi : v;
                }
        }
    }
}
