/* 1x1 stride-1 convolutions straight on NCHW (after conv_nchwc.c in one translation unit:
 * its CB, vf and V* macros): per image out [O, P] = W [O, C] @ x [C, P] (P = H*W), the
 * input rows read in place (no packing, no reorder) and the output written a vector of
 * positions at a time (no transposition), for the pointwise convs of MobileNet-style
 * networks on large planes, where a few input channels per output make the packed GEMM's
 * copies and tile stores the cost.
 *
 * rlx_conv1x1_f32(x, w, bias|NULL, out, res|NULL, tail, p, threads)
 *   p = {N, C, P, O, act, lo, hi}; w [O, C]; res: out's shape (NCHW); act as
 *   rlx_conv2d_nchwc_f32's. A register tile of 4 output channels x PV vectors of CB
 *   positions sums over every input channel (each input vector loaded once per 4
 *   channels, each weight broadcast once per PV vectors); the bias, residual and clamp
 *   on the vectors before their store. The last chunk of a row (fewer than PV*CB
 *   positions) is copied into tail (per thread C * PV * CB floats) first. Threads: an
 *   OpenMP team over (image, chunk of positions).
 */
#if defined(__AVX512F__) || defined(RLX_CONV_NEON) /* NEON: 16 of the 32 q registers */
#define PV 4
#else
#define PV 2
#endif
#define PW (PV * CB) /* positions per chunk */

static inline vf pw_clamp(vf v, float lo, float hi) {
    /* max(lo, v) then min(hi, v) with the bound first: x86's max / min return the second
     * operand when either is NaN, so a NaN stays (the select below does the same) */
#if defined(__AVX512F__)
    return _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), v));
#elif defined(__AVX2__) && defined(__FMA__)
    return _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), v));
#elif defined(RLX_CONV_NEON)
    return vclamp(v, lo, hi);
#else
    typedef int32_t vi __attribute__((vector_size(sizeof(vf))));
    const vf lov = VSET1(lo), hiv = VSET1(hi);
    vi m = v < lov;
    v = (vf)(((vi)v & ~m) | ((vi)lov & m));
    m = v > hiv;
    return (vf)(((vi)v & ~m) | ((vi)hiv & m));
#endif
}

#if defined(RLX_CONV_NEON)
/* aarch64: the sums in registers, copied into acc at the end (the caller's epilogue
 * indexes acc at run time, so gcc keeps acc in memory and stored all of it every channel
 * when the loop summed into it: 8 STP per 16 FMLA) */
static inline __attribute__((always_inline)) void pw_tile(const float *xs, int64_t xstride,
                                                          const float *w, int64_t C,
                                                          const int OT, vf acc[4][PV]) {
    vf s[4][PV];
#pragma GCC unroll 4
    for (int r = 0; r < OT; r++)
#pragma GCC unroll 4
        for (int v = 0; v < PV; v++) s[r][v] = VZERO();
    for (int64_t c = 0; c < C; c++) {
        vf xv[PV];
#pragma GCC unroll 4
        for (int v = 0; v < PV; v++) xv[v] = VLOAD(xs + c * xstride + v * CB);
#pragma GCC unroll 4
        for (int r = 0; r < OT; r++) {
            const vf wv = VSET1(w[r * C + c]);
#pragma GCC unroll 4
            for (int v = 0; v < PV; v++) s[r][v] = VFMA(wv, xv[v], s[r][v]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < OT; r++)
#pragma GCC unroll 4
        for (int v = 0; v < PV; v++) acc[r][v] = s[r][v];
}
#else
static inline __attribute__((always_inline)) void pw_tile(const float *xs, int64_t xstride,
                                                          const float *w, int64_t C,
                                                          const int OT, vf acc[4][PV]) {
    for (int r = 0; r < OT; r++)
        for (int v = 0; v < PV; v++) acc[r][v] = VZERO();
    for (int64_t c = 0; c < C; c++) {
        vf xv[PV];
        for (int v = 0; v < PV; v++) xv[v] = VLOAD(xs + c * xstride + v * CB);
        for (int r = 0; r < OT; r++) {
            const vf wv = VSET1(w[r * C + c]);
            for (int v = 0; v < PV; v++) acc[r][v] = VFMA(wv, xv[v], acc[r][v]);
        }
    }
}
#endif

void rlx_conv1x1_f32(const float *x, const float *w, const float *bias, float *out,
                     const float *res, float *tail, const int64_t *p, int threads) {
    const int64_t N = p[0], C = p[1], P = p[2], O = p[3], act = p[4];
    float lo = ((const float *)(p + 5))[0], hi = ((const float *)(p + 6))[0];
    if (act == 0) lo = -INFINITY, hi = INFINITY;
    if (act == 1) lo = 0.0f, hi = INFINITY;
    if (act == 5) lo = 0.0f, hi = 6.0f;
    const int clamp = act != 0;
    const int64_t nch = (P + PW - 1) / PW;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t task = 0; task < N * nch; task++) {
        const int64_t n = task / nch, p0 = (task % nch) * PW;
        const int64_t np = P - p0 < PW ? P - p0 : PW;
        const float *xs = x + n * C * P + p0;
        int64_t xstride = P;
        if (np < PW) { /* the row's last chunk: into a zero-padded copy */
            float *tl = tail + (int64_t)rlx_tid() * C * PW;
            for (int64_t c = 0; c < C; c++) {
                memcpy(tl + c * PW, xs + c * P, (size_t)np * sizeof(float));
                memset(tl + c * PW + np, 0, (size_t)(PW - np) * sizeof(float));
            }
            xs = tl;
            xstride = PW;
        }
        for (int64_t o0 = 0; o0 < O; o0 += 4) {
            const int OT = O - o0 < 4 ? (int)(O - o0) : 4;
            vf acc[4][PV];
            if (OT == 4)
                pw_tile(xs, xstride, w + o0 * C, C, 4, acc);
            else if (OT == 3)
                pw_tile(xs, xstride, w + o0 * C, C, 3, acc);
            else if (OT == 2)
                pw_tile(xs, xstride, w + o0 * C, C, 2, acc);
            else
                pw_tile(xs, xstride, w + o0 * C, C, 1, acc);
            for (int r = 0; r < OT; r++) {
                const int64_t off = (n * O + o0 + r) * P + p0;
                const vf b = VSET1(bias ? bias[o0 + r] : 0.0f);
                for (int v = 0; v < PV; v++) {
                    const int64_t q = v * CB;
                    if (q >= np) break;
                    vf y = acc[r][v] + b;
                    if (q + CB <= np) {
                        if (res) y = y + VLOAD(res + off + q);
                        if (clamp) y = pw_clamp(y, lo, hi);
                        VSTORE(out + off + q, y);
                    } else { /* the last partial vector */
                        float t[CB];
                        VSTORE(t, y);
                        for (int64_t i = 0; i < np - q; i++) {
                            float a = t[i] + (res ? res[off + q + i] : 0.0f);
                            a = a < lo ? lo : a;
                            out[off + q + i] = a > hi ? hi : a;
                        }
                    }
                }
            }
        }
    }
}
