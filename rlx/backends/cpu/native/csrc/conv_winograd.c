/* Winograd F(2x2, 3x3) over NCHWc blocks (after conv_nchwc.c in one translation unit:
 * its CB, TMAX, vf and V* macros), for the 3x3 stride-1 undilated dense convolutions: 16
 * multiplies per 2x2 output tile and channel pair instead of 36. The transforms are
 * vector code over a block of CB channels (one vector per tile element), so they cost
 * little next to the products.
 *
 * rlx_wino_pack_w(w, u, p)
 *   the weight w [O, C, 3, 3] transformed, U = G g G^T (G = [1 0 0; .5 .5 .5; .5 -.5 .5;
 *   0 0 1]), as u [16][Ob][Cb][CB (in)][CB (out)] (lanes past O or C zero). Once per
 *   weight.
 *
 * rlx_conv2d_wino_f32(x, xb, u, bias|NULL, out, res|NULL, ws, p, threads)
 *   p as rlx_conv2d_nchwc_f32's (ci = CB; Hp >= 2*ceil(OH/2) + 2, Wp >= 2*ceil(OW/2) + 2)
 *   plus p[22] = NTB, the tiles per block. x is reordered into xb as there; then per
 *   (image, block of NTB tiles): the input transform V = B^T d B of each tile and channel
 *   block into V [16][NTB][Cb][CB], sixteen products M[e] [NTB, O] = V[e] [NTB, C] @ U[e]
 *   [C, O] (a register tile of T tiles x 2 output blocks, as the direct kernel), and the
 *   output transform Y = A^T M A of each tile and output block, then the bias, residual
 *   and activation while writing out (NCHW). ws: per thread 16 * NTB * (Cb + Ob) * CB
 *   floats. Threads: an OpenMP team over (image, tile block).
 */

void rlx_wino_pack_w(const float *w, float *u, const int64_t *p) {
    const int64_t C = p[1], O = p[4];
    const int64_t Cb = (C + CB - 1) / CB, Ob = (O + CB - 1) / CB;
    for (int64_t o = 0; o < Ob * CB; o++)
        for (int64_t c = 0; c < Cb * CB; c++) {
            float g[3][3] = {{0}}, t[4][3], r[4][4];
            if (o < O && c < C)
                for (int i = 0; i < 9; i++) g[i / 3][i % 3] = w[(o * C + c) * 9 + i];
            for (int j = 0; j < 3; j++) { /* t = G g */
                t[0][j] = g[0][j];
                t[1][j] = 0.5f * (g[0][j] + g[1][j] + g[2][j]);
                t[2][j] = 0.5f * (g[0][j] - g[1][j] + g[2][j]);
                t[3][j] = g[2][j];
            }
            for (int i = 0; i < 4; i++) { /* r = t G^T */
                r[i][0] = t[i][0];
                r[i][1] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
                r[i][2] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
                r[i][3] = t[i][2];
            }
            const int64_t ob = o / CB, co = o % CB, cb = c / CB, ci = c % CB;
            for (int e = 0; e < 16; e++)
                u[((((int64_t)e * Ob + ob) * Cb + cb) * CB + ci) * CB + co] = r[e / 4][e % 4];
        }
}

/* M[e] rows t0..t0+T (T tiles) x output blocks ob, ob+1 (NB of them) += V[e] @ U[e] */
static inline __attribute__((always_inline)) void wino_mm(const float *v, const float *u0,
                                                           float *m, int64_t Cb, int64_t Ob,
                                                           int64_t ob, const int T,
                                                           const int NB) {
    vf a0[TMAX], a1[TMAX];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) a0[t] = a1[t] = VZERO();
    const int64_t vs = Cb * CB, ustep = Cb * CB * CB;
    for (int64_t cb = 0; cb < Cb; cb++) {
        const float *vc = v + cb * CB, *uc = u0 + cb * CB * CB;
        for (int ci = 0; ci < CB; ci++) {
            const vf w0 = VLOAD(uc + ci * CB);
            if (NB == 2) {
                const vf w1 = VLOAD(uc + ustep + ci * CB);
#pragma GCC unroll 16
                for (int t = 0; t < T; t++) {
                    const vf x = VSET1(vc[t * vs + ci]);
                    a0[t] = VFMA(x, w0, a0[t]);
                    a1[t] = VFMA(x, w1, a1[t]);
                }
            } else {
#pragma GCC unroll 16
                for (int t = 0; t < T; t++) a0[t] = VFMA(VSET1(vc[t * vs + ci]), w0, a0[t]);
            }
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        VSTORE(m + (t * Ob + ob) * CB, a0[t]);
        if (NB == 2) VSTORE(m + (t * Ob + ob + 1) * CB, a1[t]);
    }
}

#define WINO_CASE(TT)                                                                    \
    case TT:                                                                             \
        if (nb == 2)                                                                     \
            wino_mm(v, u0, m, Cb, Ob, ob, TT, 2);                                        \
        else                                                                             \
            wino_mm(v, u0, m, Cb, Ob, ob, TT, 1);                                        \
        break;

static void wino_mm_any(const float *v, const float *u0, float *m, int64_t Cb, int64_t Ob,
                        int64_t ob, int T, int nb) {
    switch (T) {
        WINO_CASE(1)
        WINO_CASE(2)
        WINO_CASE(3)
        WINO_CASE(4)
        WINO_CASE(5)
        WINO_CASE(6)
#if TMAX > 6
        WINO_CASE(7)
        WINO_CASE(8)
#endif
#if TMAX > 8 /* NEON: 8 */
        WINO_CASE(9)
        WINO_CASE(10)
        WINO_CASE(11)
        WINO_CASE(12)
#endif
        default:
            break;
    }
}

void rlx_conv2d_wino_f32(const float *x, float *xb, const float *u, const float *bias,
                         float *out, const float *res, float *ws, const int64_t *p,
                         int threads) {
    const int64_t N = p[0], C = p[1], H = p[2], W = p[3], O = p[4];
    const int64_t OH = p[7], OW = p[8], ph = p[11], pw = p[12], act = p[16];
    const int64_t Hp = p[19], Wp = p[20], NTB = p[22];
    const int64_t Cb = (C + CB - 1) / CB, Ob = (O + CB - 1) / CB;
    const int64_t nty = (OH + 1) / 2, ntx = (OW + 1) / 2, ntiles = nty * ntx;
    const int64_t nblk = (ntiles + NTB - 1) / NTB;
    float lo = ((const float *)(p + 17))[0], hi = ((const float *)(p + 18))[0];
    if (act == 0) lo = -INFINITY, hi = INFINITY;
    if (act == 1) lo = 0.0f, hi = INFINITY;
    if (act == 5) lo = 0.0f, hi = 6.0f;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t q = 0; q < N * Cb * H; q++) {
            const int64_t h = q % H, cb = (q / H) % Cb, n = q / (H * Cb);
            float *d = xb + (((n * Cb + cb) * Hp + h + ph) * Wp + pw) * CB;
            const int64_t c0 = cb * CB, cc = C - c0 < CB ? C - c0 : CB;
            if (p[23] & RLX_IN_BLOCKED) { /* x [N][Cb][H][W][CB]: a row copy */
                memcpy(d, x + q * W * CB, (size_t)(W * CB) * sizeof(float));
                continue;
            }
            reorder_row(x + ((n * C + c0) * H + h) * W, d, H * W, W, cc);
        }
        float *V = ws + (int64_t)rlx_tid() * 16 * NTB * (Cb + Ob) * CB;
        float *M = V + 16 * NTB * Cb * CB;
        const int64_t vstride = NTB * Cb * CB, mstride = NTB * Ob * CB; /* per element e */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < N * nblk; task++) {
            const int64_t n = task / nblk, t0 = (task % nblk) * NTB;
            const int64_t nt = ntiles - t0 < NTB ? ntiles - t0 : NTB;
            const float *xn = xb + n * Cb * Hp * Wp * CB;
            /* input transform: V[e][t][cb] = (B^T d B)[e] */
            for (int64_t t = 0; t < nt; t++) {
                const int64_t ty = (t0 + t) / ntx, tx = (t0 + t) % ntx;
                for (int64_t cb = 0; cb < Cb; cb++) {
                    const float *d = xn + ((cb * Hp + 2 * ty) * Wp + 2 * tx) * CB;
                    vf r[4][4];
                    for (int j = 0; j < 4; j++) {
                        const vf d0 = VLOAD(d + j * CB), d1 = VLOAD(d + (Wp + j) * CB);
                        const vf d2 = VLOAD(d + (2 * Wp + j) * CB);
                        const vf d3 = VLOAD(d + (3 * Wp + j) * CB);
                        r[0][j] = d0 - d2;
                        r[1][j] = d1 + d2;
                        r[2][j] = d2 - d1;
                        r[3][j] = d1 - d3;
                    }
                    float *vt = V + (t * Cb + cb) * CB;
                    for (int i = 0; i < 4; i++) {
                        VSTORE(vt + (4 * i + 0) * vstride, r[i][0] - r[i][2]);
                        VSTORE(vt + (4 * i + 1) * vstride, r[i][1] + r[i][2]);
                        VSTORE(vt + (4 * i + 2) * vstride, r[i][2] - r[i][1]);
                        VSTORE(vt + (4 * i + 3) * vstride, r[i][1] - r[i][3]);
                    }
                }
            }
            /* the 16 products, T tiles x 2 output blocks at a time */
            const int64_t nch = (nt + TMAX - 1) / TMAX, T = (nt + nch - 1) / nch;
            for (int e = 0; e < 16; e++)
                for (int64_t ob = 0; ob < Ob; ob += 2) {
                    const int nb = Ob - ob < 2 ? 1 : 2;
                    const float *u0 = u + ((int64_t)e * Ob + ob) * Cb * CB * CB;
                    for (int64_t ta = 0; ta < nt; ta += T) {
                        const int64_t tn = nt - ta < T ? nt - ta : T;
                        wino_mm_any(V + e * vstride + ta * Cb * CB, u0,
                                    M + e * mstride + ta * Ob * CB, Cb, Ob, ob, (int)tn, nb);
                    }
                }
            /* output transform Y = A^T m A (A^T = [1 1 1 0; 0 1 -1 -1]), then the epilogue */
            for (int64_t t = 0; t < nt; t++) {
                const int64_t ty = (t0 + t) / ntx, tx = (t0 + t) % ntx;
                const int64_t oh0 = 2 * ty, ow0 = 2 * tx;
                const int64_t nh = OH - oh0 < 2 ? 1 : 2, nw = OW - ow0 < 2 ? 1 : 2;
                for (int64_t ob = 0; ob < Ob; ob++) {
                    const float *mt = M + (t * Ob + ob) * CB;
                    vf r0[4], r1[4];
                    for (int j = 0; j < 4; j++) {
                        const vf m0 = VLOAD(mt + j * mstride), m1 = VLOAD(mt + (4 + j) * mstride);
                        const vf m2 = VLOAD(mt + (8 + j) * mstride);
                        const vf m3 = VLOAD(mt + (12 + j) * mstride);
                        r0[j] = m0 + m1 + m2;
                        r1[j] = m1 - m2 - m3;
                    }
                    const int64_t o0 = ob * CB, oc = O - o0 < CB ? O - o0 : CB;
                    if (p[23] & RLX_OUT_BLOCKED) { /* out / res [N][Ob][OH][OW][CB] */
                        const vf y[4] = {r0[0] + r0[1] + r0[2], r0[1] - r0[2] - r0[3],
                                         r1[0] + r1[1] + r1[2], r1[1] - r1[2] - r1[3]};
                        for (int64_t a = 0; a < nh; a++) {
                            const int64_t off = (((n * Ob + ob) * OH + oh0 + a) * OW + ow0) * CB;
                            store_blocked(y + 2 * a, (int)nw, out + off, res ? res + off : NULL,
                                          bias ? bias + o0 : NULL, oc, lo, hi);
                        }
                        continue;
                    }
                    float buf[4][CB];
                    VSTORE(buf[0], r0[0] + r0[1] + r0[2]);
                    VSTORE(buf[1], r0[1] - r0[2] - r0[3]);
                    VSTORE(buf[2], r1[0] + r1[1] + r1[2]);
                    VSTORE(buf[3], r1[1] - r1[2] - r1[3]);
                    for (int64_t j = 0; j < oc; j++) {
                        const float bj = bias ? bias[o0 + j] : 0.0f;
                        for (int64_t a = 0; a < nh; a++)
                            for (int64_t b = 0; b < nw; b++) {
                                const int64_t off = ((n * O + o0 + j) * OH + oh0 + a) * OW + ow0 + b;
                                float v = buf[2 * a + b][j] + bj + (res ? res[off] : 0.0f);
                                v = v < lo ? lo : v;
                                out[off] = v > hi ? hi : v;
                            }
                    }
                }
            }
        }
    }
}
