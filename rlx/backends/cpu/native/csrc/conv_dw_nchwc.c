/* Depthwise convolution over NCHWc blocks (after conv_nchwc.c in one translation unit: its
 * CB, TMAX, vf, V* macros and the transposing epilogue's helpers), for the small planes of
 * MobileNet-style networks (14x14, 7x7), where a vector along a row of the NCHW plane is
 * mostly padding: here a vector holds CB channels of one position, every lane useful.
 *
 * rlx_dw_nchwc_pack_w(w, wb, p)
 *   w [C, 1, KH, KW] (groups == C == O) as wb [Cb][KH*KW][CB] (lanes past C zero).
 *
 * rlx_dw_nchwc_f32(x, xb, wb, bias|NULL, out, res|NULL, p, threads)
 *   p as rlx_conv2d_nchwc_f32's (ci = CB). x is reordered into the zero-bordered xb
 *   [N][Cb][Hp][Wp][CB]; per (image, channel block, output row) a tile of at most TMAX
 *   positions sums its taps in registers (one vector load per tap and position, the
 *   tap's weight vector loaded once per tile), then the bias, residual and activation
 *   while writing out (NCHW). Threads: an OpenMP team over (image, block, row).
 *   flags (p[23], as rlx_conv2d_nchwc_f32's): RLX_IN_BLOCKED, x is [N][Cb][H][W][CB], read
 *   in place (taps outside the image skipped: no bordered copy); RLX_OUT_BLOCKED, out and
 *   res are [N][Cb][OH][OW][CB] (the tile's vectors stored as they are).
 */

void rlx_dw_nchwc_pack_w(const float *w, float *wb, const int64_t *p) {
    const int64_t C = p[1], KK = p[5] * p[6];
    const int64_t Cb = (C + CB - 1) / CB;
    for (int64_t cb = 0; cb < Cb; cb++)
        for (int64_t k = 0; k < KK; k++)
            for (int64_t j = 0; j < CB; j++) {
                const int64_t c = cb * CB + j;
                wb[(cb * KK + k) * CB + j] = c < C ? w[c * KK + k] : 0.0f;
            }
}

static inline __attribute__((always_inline)) void dw_tile(const float *xc, const float *wc,
                                                          const int64_t *p, int64_t n,
                                                          int64_t cb, int64_t oh, int64_t ow0,
                                                          int64_t nv, const int T,
                                                          const float *bias, const float *res,
                                                          float *out) {
    const int64_t C = p[1], KH = p[5], KW = p[6], OH = p[7], OW = p[8];
    const int64_t sh = p[9], sw = p[10], dh = p[13], dw = p[14], act = p[16], Wp = p[20];
    vf a[TMAX];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) a[t] = VZERO();
    if (p[23] & RLX_IN_BLOCKED) {
        /* xc: the image's block [H][W][CB] read in place; taps outside it skipped (the
         * zero border, without a bordered copy) */
        const int64_t H = p[2], W = p[3], ph = p[11], pw = p[12];
        const int64_t iw0 = ow0 * sw - pw;
        const int inner = iw0 >= 0 && iw0 + (T - 1) * sw + (KW - 1) * dw < W;
        for (int64_t kh = 0; kh < KH; kh++) {
            const int64_t ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= H) continue;
            const float *xr = xc + ih * W * CB;
            for (int64_t kw = 0; kw < KW; kw++) {
                const vf wv = VLOAD(wc + (kh * KW + kw) * CB);
                if (inner) {
                    const float *xk = xr + (iw0 + kw * dw) * CB;
#pragma GCC unroll 16
                    for (int t = 0; t < T; t++) a[t] = VFMA(VLOAD(xk + t * sw * CB), wv, a[t]);
                } else {
                    for (int t = 0; t < T; t++) {
                        const int64_t iw = iw0 + t * sw + kw * dw;
                        if (iw >= 0 && iw < W) a[t] = VFMA(VLOAD(xr + iw * CB), wv, a[t]);
                    }
                }
            }
        }
    } else {
        const float *x0 = xc + (oh * sh * Wp + ow0 * sw) * CB;
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++) {
                const vf wv = VLOAD(wc + (kh * KW + kw) * CB);
                const float *xk = x0 + (kh * dh * Wp + kw * dw) * CB;
#pragma GCC unroll 16
                for (int t = 0; t < T; t++) a[t] = VFMA(VLOAD(xk + t * sw * CB), wv, a[t]);
            }
    }
    float lo = ((const float *)(p + 17))[0], hi = ((const float *)(p + 18))[0];
    if (act == 0) lo = -INFINITY, hi = INFINITY;
    if (act == 1) lo = 0.0f, hi = INFINITY;
    if (act == 5) lo = 0.0f, hi = 6.0f;
    const int64_t o0 = cb * CB, oc = C - o0 < CB ? C - o0 : CB;
    if (p[23] & RLX_OUT_BLOCKED) {
        const int64_t off = (((n * ((C + CB - 1) / CB) + cb) * OH + oh) * OW + ow0) * CB;
        store_blocked(a, T, out + off, res ? res + off : NULL, bias ? bias + o0 : NULL, oc, lo,
                      hi);
        return;
    }
    float *y0 = out + ((n * C + o0) * OH + oh) * OW + ow0;
    const float *r0 = res ? res + ((n * C + o0) * OH + oh) * OW + ow0 : NULL;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    vf r[CB];
#pragma GCC unroll 16
    for (int t = 0; t < CB; t++) r[t] = t < T ? a[t] : VZERO();
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
        for (int t = 0; t < 4; t++) r[t] = g + t < T ? a[g + t] : VZERO();
        tile_store4(r, nv - g, oc, OH * OW, bias ? bias + o0 : NULL, r0 ? r0 + g : NULL, y0 + g,
                    lo, hi);
    }
#else
    float buf[TMAX * CB];
    for (int t = 0; t < T; t++) VSTORE(buf + t * CB, a[t]);
    for (int64_t j = 0; j < oc; j++) {
        const int64_t off = j * OH * OW;
        const float bj = bias ? bias[o0 + j] : 0.0f;
        for (int64_t t = 0; t < nv; t++) { /* branch-free clamps: NaN compares false */
            float v = buf[t * CB + j] + bj + (r0 ? r0[off + t] : 0.0f);
            v = v < lo ? lo : v;
            y0[off + t] = v > hi ? hi : v;
        }
    }
#endif
}

#define DW_CASE(TT)                                                                      \
    case TT:                                                                             \
        dw_tile(xc, wc, p, n, cb, oh, ow0, nv, TT, bias, res, out);                      \
        break;

void rlx_dw_nchwc_f32(const float *x, float *xb, const float *wb, const float *bias,
                      float *out, const float *res, const int64_t *p, int threads) {
    const int64_t N = p[0], C = p[1], H = p[2], W = p[3], KH = p[5], KW = p[6];
    const int64_t OH = p[7], OW = p[8], ph = p[11], pw = p[12], Hp = p[19], Wp = p[20];
    const int64_t Cb = (C + CB - 1) / CB, KK = KH * KW;
    const int64_t ntile = (OW + TMAX - 1) / TMAX, T = (OW + ntile - 1) / ntile;
    const int in_blocked = (p[23] & RLX_IN_BLOCKED) != 0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t q = 0; q < (in_blocked ? 0 : N * Cb * H); q++) {
            const int64_t h = q % H, cb = (q / H) % Cb, n = q / (H * Cb);
            float *d = xb + (((n * Cb + cb) * Hp + h + ph) * Wp + pw) * CB;
            const int64_t c0 = cb * CB, cc = C - c0 < CB ? C - c0 : CB;
            reorder_row(x + ((n * C + c0) * H + h) * W, d, H * W, W, cc);
        }
#pragma omp for collapse(3) schedule(static)
        for (int64_t n = 0; n < N; n++)
            for (int64_t cb = 0; cb < Cb; cb++)
                for (int64_t oh = 0; oh < OH; oh++) {
                    const float *xc = in_blocked ? x + (n * Cb + cb) * H * W * CB
                                                 : xb + (n * Cb + cb) * Hp * Wp * CB;
                    const float *wc = wb + cb * KK * CB;
                    for (int64_t ow0 = 0; ow0 < OW; ow0 += T) {
                        const int64_t nv = OW - ow0 < T ? OW - ow0 : T;
                        switch ((int)nv) {
                            DW_CASE(1)
                            DW_CASE(2)
                            DW_CASE(3)
                            DW_CASE(4)
                            DW_CASE(5)
                            DW_CASE(6)
#if TMAX > 6
                            DW_CASE(7)
                            DW_CASE(8)
#endif
#if TMAX > 8 /* NEON: 8 */
                            DW_CASE(9)
                            DW_CASE(10)
                            DW_CASE(11)
                            DW_CASE(12)
#endif
                            default:
                                break;
                        }
                    }
                }
    }
}
