/* Direct 2-D convolution over channel-blocked activations (NCHWc, as oneDNN and ONNX
 * Runtime's MLAS run theirs), for the dense (groups == 1) convolutions with a window larger
 * than 1x1, where the GEMM path packs KH*KW copies of the input per call.
 *
 * CB channels make a block: 16 on AVX-512, 8 on AVX2 + FMA, 4 otherwise (one vector; on
 * aarch64 conv_neon.h's NEON helpers, a tile of 12 positions).
 *
 * int rlx_nchwc_block(void): CB.
 * int rlx_nchwc_tile(void): TMAX, the register tile's width (output positions per pass).
 *
 * Input blocks: ci = p[21] channels, CB, or 1 for a conv with fewer than CB input channels
 * (a network's 3-channel stem: its input stays NCHW, only the output channels are
 * blocked, as MLAS's NCHW-input kernel does; with CB the block would be mostly zeros).
 *
 * rlx_nchwc_pack_w(w, wb, p)
 *   the weight w [O, C, KH, KW] as wb [Ob][Cb][KH][KW][ci][CB (out)] (Ob = ceil(O / CB),
 *   Cb = ceil(C / ci); lanes past O or C zero): a tap's ci input channels each hold one
 *   vector of CB output channels. Once per weight (at bind, or when the weight changes).
 *
 * rlx_conv2d_nchwc_f32(x, xb, wb, bias|NULL, out, res|NULL, p, threads)
 *   p = {N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups, act, lo, hi, Hp, Wp,
 *   ci, (Winograd's NTB), flags}. x [N, C, H, W] is reordered into xb [N][Cb][Hp][Wp][ci]
 *   (its interior at row ph, column pw; the border and the lanes past C stay zero: the
 *   caller zeroes xb once; Hp / Wp: every tap inside), then each register tile is T output
 *   positions of one output row x NG blocks of output channels (NG = 3 with 3+ blocks,
 *   T <= 8 on AVX-512 / 4 on AVX2; else 2 blocks, T <= TMAX): NG x T vectors of CB output channels stay in
 *   registers over every input channel and tap (each input value broadcast once per tile,
 *   each weight vector loaded once per tile). The epilogue adds the bias, the residual res
 *   (out's shape) and applies act (0 none, 1 relu, 5 relu6, 6 clip(lo, hi); lo / hi float
 *   bits) while writing out [N, O, OH, OW] (NCHW) from the tile, transposed in registers.
 *   flags (p[23]): RLX_IN_BLOCKED, x is [N][Cb][H][W][CB] (copied row by row into xb, or
 *   read in place without a border); RLX_OUT_BLOCKED, out and res are [N][Ob][OH][OW][CB]
 *   (stored as the tile's vectors, no transpose). Threads: an OpenMP team over the tiles.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "omp_workspace.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define CB 16
#define TMAX 12
#define NBMAX 3
#define TMAX3 8
typedef __m512 vf;
#define VZERO() _mm512_setzero_ps()
#define VSET1(s) _mm512_set1_ps(s)
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps((p), (v))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CB 8
#define TMAX 6
#define NBMAX 3
#define TMAX3 4
typedef __m256 vf;
#define VZERO() _mm256_setzero_ps()
#define VSET1(s) _mm256_set1_ps(s)
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps((p), (v))
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include "conv_neon.h"
#else
#define CB 4
#define TMAX 6
typedef float vf __attribute__((vector_size(16)));
typedef float vfu __attribute__((vector_size(16), aligned(4)));
#define VZERO() ((vf){0.0f, 0.0f, 0.0f, 0.0f})
#define VSET1(s) (VZERO() + (s))
#define VLOAD(p) (*(const vfu *)(p))
#define VSTORE(p, v) (*(vfu *)(p) = (v))
#define VFMA(a, b, c) ((a) * (b) + (c))
#endif

#ifndef NBMAX
#define NBMAX 2
#define TMAX3 TMAX
#endif

#if defined(__AVX512F__)
/* r[0..16) (rows) transposed in place: r[j] lane t = the old r[t] lane j */
static inline __attribute__((always_inline)) void transpose_block(vf r[16]) {
    vf t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}
static inline vf vload_n(const float *s, int64_t n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), s);
}
static inline void vstore_n(float *d, vf v, int64_t n) {
    _mm512_mask_storeu_ps(d, (__mmask16)((1u << n) - 1), v);
}
static inline vf vclamp(vf v, float lo, float hi) {
    /* bound first: max / min return the second operand when either is NaN (NaN stays) */
    return _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), v));
}
#elif defined(__AVX2__) && defined(__FMA__)
static inline __attribute__((always_inline)) void transpose_block(vf r[8]) {
    vf t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}
static inline __m256i lane_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vload_n(const float *s, int64_t n) { return _mm256_maskload_ps(s, lane_mask(n)); }
static inline void vstore_n(float *d, vf v, int64_t n) { _mm256_maskstore_ps(d, lane_mask(n), v); }
static inline vf vclamp(vf v, float lo, float hi) {
    return _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), v));
}
#elif !defined(RLX_CONV_NEON)
static inline vf vclamp(vf v, float lo, float hi) {
    float b[CB];
    VSTORE(b, v);
    for (int j = 0; j < CB; j++) { /* branch-free selects: a NaN compares false and stays */
        b[j] = b[j] < lo ? lo : b[j];
        b[j] = b[j] > hi ? hi : b[j];
    }
    return VLOAD(b);
}
#endif

/* A blocked epilogue (p[23] & RLX_OUT_BLOCKED): the tile's T vectors of CB output channels
 * stored as they are into y (out NCHWc [N][Ob][OH][OW][CB], y at the tile's first
 * position), plus the bias (lanes past oc zero) and the residual r (the same layout), then
 * the clamp. A lane past O holds act(0 + its residual lane): 0 for relu / relu6. */
static inline __attribute__((always_inline)) void store_blocked(const vf *a, int T, float *y,
                                                                 const float *r,
                                                                 const float *bias, int64_t oc,
                                                                 float lo, float hi) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)) || defined(RLX_CONV_NEON)
    const vf bv = bias ? vload_n(bias, oc) : VZERO(); /* masked: no store-to-load stall */
#else
    float bb[CB];
    for (int j = 0; j < CB; j++) bb[j] = bias && j < oc ? bias[j] : 0.0f;
    const vf bv = VLOAD(bb);
#endif
    for (int t = 0; t < T; t++) {
        vf v = a[t] + bv;
        if (r) v = v + VLOAD(r + t * CB);
        VSTORE(y + t * CB, vclamp(v, lo, hi));
    }
}

/* Blocked input (p[23] & RLX_IN_BLOCKED): x is [N][Cb][H][W][CB] (ci = CB), copied row by
 * row into xb's interior, or read in place when the conv has no border (Hp = H, Wp = W). */
#define RLX_IN_BLOCKED 1
#define RLX_OUT_BLOCKED 2

/* one input row of cc (<= CB) channels (s: channel j's row at s + j * cs) into d [W][CB],
 * the lanes past cc zero: CB x CB squares transposed in registers where the target has
 * the transpose, else lane by lane */
static void reorder_row(const float *s, float *d, int64_t cs, int64_t W, int64_t cc) {
    int64_t i0 = 0;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)) || defined(RLX_CONV_NEON)
    for (; i0 < W; i0 += CB) {
        const int64_t nw = W - i0 < CB ? W - i0 : CB;
        vf r[CB];
        for (int j = 0; j < CB; j++) r[j] = j < cc ? vload_n(s + j * cs + i0, nw) : VZERO();
        transpose_block(r);
        for (int64_t i = 0; i < nw; i++) VSTORE(d + (i0 + i) * CB, r[i]);
    }
#endif
    for (int64_t j = 0; j < cc && i0 < W; j++)
        for (int64_t i = i0; i < W; i++) d[i * CB + j] = s[j * cs + i];
    for (int64_t j = cc; j < CB && i0 < W; j++)
        for (int64_t i = i0; i < W; i++) d[i * CB + j] = 0.0f;
}

int rlx_nchwc_block(void) { return CB; }
int rlx_nchwc_tile(void) { return TMAX; }

void rlx_nchwc_pack_w(const float *w, float *wb, const int64_t *p) {
    const int64_t C = p[1], O = p[4], KH = p[5], KW = p[6], ci_n = p[21];
    const int64_t Cb = (C + ci_n - 1) / ci_n, Ob = (O + CB - 1) / CB, KK = KH * KW;
    for (int64_t ob = 0; ob < Ob; ob++)
        for (int64_t cb = 0; cb < Cb; cb++)
            for (int64_t k = 0; k < KK; k++)
                for (int64_t ci = 0; ci < ci_n; ci++) {
                    float *d = wb + (((ob * Cb + cb) * KK + k) * ci_n + ci) * CB;
                    const int64_t c = cb * ci_n + ci;
                    for (int64_t co = 0; co < CB; co++) {
                        const int64_t o = ob * CB + co;
                        d[co] = o < O && c < C ? w[(o * C + c) * KK + k] : 0.0f;
                    }
                }
}

/* one tile: T output positions (from column ow0 of output row oh) x NB (1 or 2) blocks of
 * CB output channels, summed in registers, then the epilogue into out (NCHW) */
static inline __attribute__((always_inline)) void tile(const float *xn, const float *wb0,
                                                        const int64_t *p, int64_t n, int64_t ob,
                                                        int64_t oh, int64_t ow0, int64_t nv,
                                                        const int T, const int NB,
                                                        const float *bias, const float *res,
                                                        float *out) {
    const int64_t C = p[1], O = p[4], KH = p[5], KW = p[6], OH = p[7], OW = p[8];
    const int64_t sh = p[9], sw = p[10], dh = p[13], dw = p[14], act = p[16];
    const int64_t Hp = p[19], Wp = p[20], ci_n = p[21];
    const int64_t Cb = (C + ci_n - 1) / ci_n, KK = KH * KW;
    const int64_t wstep = Cb * KK * ci_n * CB; /* floats between two output blocks' weights */
    vf acc[NBMAX][TMAX];
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[b][t] = VZERO();
    const int64_t xs = sw * ci_n; /* floats between two output positions' inputs */
    for (int64_t cb = 0; cb < Cb; cb++) {
        const float *xc = xn + cb * Hp * Wp * ci_n + (oh * sh * Wp + ow0 * sw) * ci_n;
        const float *wc = wb0 + cb * KK * ci_n * CB;
        for (int64_t kh = 0; kh < KH; kh++) {
            for (int64_t kw = 0; kw < KW; kw++) {
                const float *xk = xc + (kh * dh * Wp + kw * dw) * ci_n;
                const float *wk = wc + (kh * KW + kw) * ci_n * CB;
                for (int64_t ci = 0; ci < ci_n; ci++) {
                    vf wv[NBMAX];
#pragma GCC unroll 4
                    for (int b = 0; b < NB; b++) wv[b] = VLOAD(wk + b * wstep + ci * CB);
#pragma GCC unroll 16
                    for (int t = 0; t < T; t++) {
                        const vf v = VSET1(xk[t * xs + ci]);
#pragma GCC unroll 4
                        for (int b = 0; b < NB; b++) acc[b][t] = VFMA(v, wv[b], acc[b][t]);
                    }
                }
            }
        }
    }
    float lo = ((const float *)(p + 17))[0], hi = ((const float *)(p + 18))[0];
    if (act == 0) lo = -INFINITY, hi = INFINITY;
    if (act == 1) lo = 0.0f, hi = INFINITY;
    if (act == 5) lo = 0.0f, hi = 6.0f;
    if (p[23] & RLX_OUT_BLOCKED) {
        const int64_t Ob = (O + CB - 1) / CB;
        for (int b = 0; b < NB; b++) {
            const int64_t o0 = (ob + b) * CB, oc = O - o0 < CB ? O - o0 : CB;
            const int64_t off = (((n * Ob + ob + b) * OH + oh) * OW + ow0) * CB;
            store_blocked(acc[b], T, out + off, res ? res + off : NULL,
                          bias ? bias + o0 : NULL, oc, lo, hi);
        }
        return;
    }
    for (int b = 0; b < NB; b++) {
        const int64_t o0 = (ob + b) * CB;
        const int64_t oc = O - o0 < CB ? O - o0 : CB;
        float *y0 = out + ((n * O + o0) * OH + oh) * OW + ow0;
        const float *r0 = res ? res + ((n * O + o0) * OH + oh) * OW + ow0 : NULL;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
        /* the tile transposed in registers (a row per output channel, its nv positions
         * consecutive in out), then bias, residual and clamp on whole vectors */
        vf r[CB];
#pragma GCC unroll 16
        for (int t = 0; t < CB; t++) r[t] = t < T ? acc[b][t] : VZERO();
        transpose_block(r);
        for (int64_t j = 0; j < oc; j++) {
            const int64_t off = j * OH * OW;
            vf v = r[j] + VSET1(bias ? bias[o0 + j] : 0.0f);
            if (r0) v = v + vload_n(r0 + off, nv);
            vstore_n(y0 + off, vclamp(v, lo, hi), nv);
        }
#elif defined(RLX_CONV_NEON) /* T > CB here: 4 positions at a time */
#pragma GCC unroll 4
        for (int g = 0; g < T; g += 4) {
            vf r[4];
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) r[t] = g + t < T ? acc[b][g + t] : VZERO();
            tile_store4(r, nv - g, oc, OH * OW, bias ? bias + o0 : NULL, r0 ? r0 + g : NULL,
                        y0 + g, lo, hi);
        }
#else
        float buf[TMAX * CB];
        for (int t = 0; t < T; t++) VSTORE(buf + t * CB, acc[b][t]);
        for (int64_t j = 0; j < oc; j++) {
            const int64_t off = j * OH * OW;
            const float bj = bias ? bias[o0 + j] : 0.0f;
            /* branch-free clamps (selects: a NaN compares false and stays) */
            for (int64_t t = 0; t < nv; t++) {
                float v = buf[t * CB + j] + bj + (r0 ? r0[off + t] : 0.0f);
                v = v < lo ? lo : v;
                y0[off + t] = v > hi ? hi : v;
            }
        }
#endif
    }
}

#if NBMAX > 2
#define TILE_NB3(TT)                                                                     \
    else if (nb == 3) tile(xn, wb0, p, n, ob, oh, ow0, nv, TT, 3, bias, res, out);
#else
#define TILE_NB3(TT)
#endif
#define TILE_CASE(TT)                                                                    \
    case TT:                                                                             \
        if (nb == 2)                                                                     \
            tile(xn, wb0, p, n, ob, oh, ow0, nv, TT, 2, bias, res, out);                 \
        TILE_NB3(TT)                                                                     \
        else tile(xn, wb0, p, n, ob, oh, ow0, nv, TT, 1, bias, res, out);                \
        break;

static void tile_any(const float *xn, const float *wb0, const int64_t *p, int64_t n,
                     int64_t ob, int64_t oh, int64_t ow0, int64_t nv, int T, int nb,
                     const float *bias, const float *res, float *out) {
    switch (T) {
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
        TILE_CASE(4)
        TILE_CASE(5)
        TILE_CASE(6)
#if TMAX > 6
        TILE_CASE(7)
        TILE_CASE(8)
#endif
#if TMAX > 8 /* NEON: 8 */
        TILE_CASE(9)
        TILE_CASE(10)
        TILE_CASE(11)
        TILE_CASE(12)
#endif
        default:
            break;
    }
}

void rlx_conv2d_nchwc_f32(const float *x, float *xb, const float *wb, const float *bias,
                          float *out, const float *res, const int64_t *p, int threads) {
    const int64_t N = p[0], C = p[1], H = p[2], W = p[3], O = p[4], KH = p[5], KW = p[6];
    const int64_t OH = p[7], OW = p[8], ph = p[11], pw = p[12];
    const int64_t Hp = p[19], Wp = p[20], ci_n = p[21];
    const int64_t Cb = (C + ci_n - 1) / ci_n, Ob = (O + CB - 1) / CB, KK = KH * KW;
    /* NG blocks of output channels per register tile: NBMAX (3 x 8 positions on AVX-512:
     * 3 weight vectors and 8 broadcasts per 24 FMAs) when there are that many, else 2 */
    const int64_t NG = Ob >= NBMAX ? NBMAX : 2, tmax = NG == 3 ? TMAX3 : TMAX;
    const int64_t pairs = (Ob + NG - 1) / NG;
    /* tiles per row: as even as tmax allows (a 56-wide row: 5 x 12 would waste 4) */
    const int64_t ntile = (OW + tmax - 1) / tmax, T = (OW + ntile - 1) / ntile;
    const int in_blocked = (p[23] & RLX_IN_BLOCKED) != 0;
    const int in_place = in_blocked && Hp == H && Wp == W;
    const float *xr = in_place ? x : xb;
    const int rows_outer = Ob * Cb * KK * ci_n * CB * (int64_t)sizeof(float) <= (256 << 10);
    const int64_t per_row = (OW + T - 1) / T; /* tiles per output row */
#pragma omp parallel num_threads(threads)
    {
        /* the reorder: every (image, channel block, input row) of xb's interior */
#pragma omp for schedule(static)
        for (int64_t q = 0; q < (in_place ? 0 : N * Cb * H); q++) {
            const int64_t h = q % H, cb = (q / H) % Cb, n = q / (H * Cb);
            float *d = xb + (((n * Cb + cb) * Hp + h + ph) * Wp + pw) * ci_n;
            const int64_t c0 = cb * ci_n, cc = C - c0 < ci_n ? C - c0 : ci_n;
            const float *s = x + ((n * C + c0) * H + h) * W;
            if (in_blocked) {
                memcpy(d, x + ((n * Cb + cb) * H + h) * W * CB, (size_t)(W * CB) * sizeof(float));
                continue;
            }
            if (ci_n == 1) {
                memcpy(d, s, (size_t)W * sizeof(float));
                continue;
            }
            reorder_row(s, d, H * W, W, cc);
        }
        /* one item per register tile: (image, row, tile, block pair) with the weights in L2
         * (an input row stays in L1 over every pair), else (image, block pair, row, tile)
         * (a pair's weights over every row); items, not rows, so that small planes split
         * evenly over the team */
#pragma omp for schedule(static)
        for (int64_t q = 0; q < N * pairs * OH * per_row; q++) {
            int64_t pr, oh, tl, r;
            if (rows_outer) {
                pr = q % pairs, r = q / pairs, tl = r % per_row, r /= per_row;
                oh = r % OH, r /= OH;
            } else {
                tl = q % per_row, r = q / per_row, oh = r % OH, r /= OH;
                pr = r % pairs, r /= pairs;
            }
            const int64_t n = r, ob = NG * pr, nb = Ob - ob < NG ? Ob - ob : NG;
            const float *xn = xr + n * Cb * Hp * Wp * ci_n;
            const float *wb0 = wb + ob * Cb * KK * ci_n * CB;
            const int64_t ow0 = tl * T, nv = OW - ow0 < T ? OW - ow0 : T;
            tile_any(xn, wb0, p, n, ob, oh, ow0, nv, (int)nv, (int)nb, bias, res, out);
        }
    }
}

/* rlx_nchwc_to_blocked(x, out, p): x [N, C, H, W] -> out [N][Cb][H][W][CB], the lanes past C
 * zero; p = {N, C, H, W}. rlx_nchwc_from_blocked(x, out, p): the inverse (lanes past C
 * dropped). Threads: an OpenMP team over (image, block, row). */
void rlx_nchwc_to_blocked(const float *x, float *out, const int64_t *p, int threads) {
    const int64_t N = p[0], C = p[1], H = p[2], W = p[3], Cb = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t q = 0; q < N * Cb * H; q++) {
        const int64_t h = q % H, cb = (q / H) % Cb, n = q / (H * Cb);
        const int64_t c0 = cb * CB, cc = C - c0 < CB ? C - c0 : CB;
        reorder_row(x + ((n * C + c0) * H + h) * W, out + q * W * CB, H * W, W, cc);
    }
}

void rlx_nchwc_from_blocked(const float *x, float *out, const int64_t *p, int threads) {
    const int64_t N = p[0], C = p[1], H = p[2], W = p[3], Cb = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t q = 0; q < N * Cb * H; q++) {
        const int64_t h = q % H, cb = (q / H) % Cb, n = q / (H * Cb);
        const int64_t c0 = cb * CB, cc = C - c0 < CB ? C - c0 : CB;
        const float *s = x + q * W * CB;
        float *d = out + ((n * C + c0) * H + h) * W;
        int64_t i0 = 0;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)) || defined(RLX_CONV_NEON)
        for (; i0 + CB <= W; i0 += CB) { /* CB x CB squares transposed in registers */
            vf r[CB];
            for (int i = 0; i < CB; i++) r[i] = VLOAD(s + (i0 + i) * CB);
            transpose_block(r);
            for (int64_t j = 0; j < cc; j++) VSTORE(d + j * H * W + i0, r[j]);
        }
#endif
        for (int64_t j = 0; j < cc; j++)
            for (int64_t i = i0; i < W; i++) d[j * H * W + i] = s[i * CB + j];
    }
}
