/* INT8 GEMM for rlx, part 3 of 4 (native/qgemm.py joins qgemm.c, qgemm_kernels.c,
 * qgemm_epilogue.c and qgemm_run.c into one translation unit, in that order): the fused
 * f32 epilogue, in SIMD registers on paths 1 and 2 (polynomial exp / erf), scalar libm on
 * path 0. */

/* ---- the epilogue ------------------------------------------------------------------ */

#if RLX_ISA == 2
#define VL 16
typedef __m512 vf;
typedef __m512i vi;
#define VLOADI(p) _mm512_loadu_si512((const void *)(p))
#define VSTOREI(p, v) _mm512_storeu_si512((void *)(p), v)
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VSET(x) _mm512_set1_ps(x)
#define VSETI(x) _mm512_set1_epi32(x)
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VDIV _mm512_div_ps
#define VMAX _mm512_max_ps
#define VMIN _mm512_min_ps
#define VFMA _mm512_fmadd_ps
#define VFNMA _mm512_fnmadd_ps
#define VABS(x) _mm512_abs_ps(x)
#define VROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VCVTI(x) _mm512_cvtepi32_ps(x)
#define VTOI(x) _mm512_cvtps_epi32(x)
#define VASF(x) _mm512_castsi512_ps(x)
#define VIADD _mm512_add_epi32
#define VISUB _mm512_sub_epi32
#define VIMUL _mm512_mullo_epi32
#define VISLL(x, s) _mm512_slli_epi32(x, s)
#define VSIGN_OF(x, s) /* |x| with the sign of s */ \
    _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(x), \
        _mm512_castps_si512(s), _mm512_set1_epi32(0x7fffffff), 0xe4))
#elif RLX_ISA == 1
#define VL 8
typedef __m256 vf;
typedef __m256i vi;
#define VLOADI(p) _mm256_loadu_si256((const __m256i *)(p))
#define VSTOREI(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VSET(x) _mm256_set1_ps(x)
#define VSETI(x) _mm256_set1_epi32(x)
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VDIV _mm256_div_ps
#define VMAX _mm256_max_ps
#define VMIN _mm256_min_ps
#define VFMA _mm256_fmadd_ps
#define VFNMA _mm256_fnmadd_ps
#define VABS(x) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x)
#define VROUND(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VCVTI(x) _mm256_cvtepi32_ps(x)
#define VTOI(x) _mm256_cvtps_epi32(x)
#define VASF(x) _mm256_castsi256_ps(x)
#define VIADD _mm256_add_epi32
#define VISUB _mm256_sub_epi32
#define VIMUL _mm256_mullo_epi32
#define VISLL(x, s) _mm256_slli_epi32(x, s)
#define VSIGN_OF(x, s) \
    _mm256_or_ps(VABS(x), _mm256_and_ps(_mm256_set1_ps(-0.0f), s))
#endif

#ifdef VL
/* exp(x) (Cephes expf: range reduction by ln 2, degree-5 polynomial; ~1 ulp), with x
 * clamped to [-80, 88]: exp(-80) = 1.8e-35 stands for smaller values, so no result (nor
 * a product of one in the callers) is subnormal, which would cost a microcode assist per
 * lane (measured: an erf-GELU epilogue took 6x the GEMM's time); callers only add it to 1
 * or multiply it by bounded values. */
static inline vf vexp(vf x) {
    x = VMIN(VMAX(x, VSET(-80.0f)), VSET(88.0f));
    vf fx = VROUND(VMUL(x, VSET(1.44269504088896341f)));
    vf r = VFNMA(fx, VSET(0.693359375f), x);
    r = VFNMA(fx, VSET(-2.12194440e-4f), r);
    vf p = VSET(1.9875691500e-4f);
    p = VFMA(p, r, VSET(1.3981999507e-3f));
    p = VFMA(p, r, VSET(8.3334519073e-3f));
    p = VFMA(p, r, VSET(4.1665795894e-2f));
    p = VFMA(p, r, VSET(1.6666665459e-1f));
    p = VFMA(p, r, VSET(5.0000001201e-1f));
    p = VFMA(p, VMUL(r, r), VADD(r, VSET(1.0f)));
    vi e = VISLL(VIADD(VTOI(fx), VSETI(127)), 23);
    return VMUL(p, VASF(e));
}

/* erf(z) by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), odd extension; NaN stays NaN
 * through the caller's product with z. */
static inline vf verf(vf z) {
    vf a = VMIN(VABS(z), VSET(5.0f)); /* erf(5) is 1 in f32 */
    vf t = VDIV(VSET(1.0f), VFMA(a, VSET(0.3275911f), VSET(1.0f)));
    vf p = VSET(1.061405429f);
    p = VFMA(p, t, VSET(-1.453152027f));
    p = VFMA(p, t, VSET(1.421413741f));
    p = VFMA(p, t, VSET(-0.284496736f));
    p = VFMA(p, t, VSET(0.254829592f));
    p = VMUL(p, t);
    vf e = VSUB(VSET(1.0f), VMUL(p, vexp(VMUL(VSUB(VSET(0.0f), a), a))));
    return VSIGN_OF(e, z);
}

static inline vf vact(vf y, int act) {
    switch (act) {
    case ACT_RELU:
        return VMAX(VSET(0.0f), y); /* NaN in y stays NaN (max returns its 2nd operand) */
    case ACT_GELU:
        return VMUL(VMUL(VSET(0.5f), y),
                    VADD(VSET(1.0f), verf(VMUL(y, VSET(0.70710678118654752f)))));
    case ACT_GELU_TANH: {
        /* 0.5 y (1 + tanh(u)) == y / (1 + exp(-2u)), u = sqrt(2/pi) (y + 0.044715 y^3) */
        vf u = VMUL(VSET(0.7978845608028654f), VFMA(VMUL(VMUL(y, y), y), VSET(0.044715f), y));
        return VDIV(y, VADD(VSET(1.0f), vexp(VMUL(VSET(-2.0f), u))));
    }
    case ACT_SILU:
        return VDIV(y, VADD(VSET(1.0f), vexp(VSUB(VSET(0.0f), y))));
    default:
        return y;
    }
}
#endif

static inline float sact(float y, int act) {
    switch (act) {
    case ACT_RELU:
        return y < 0.0f ? 0.0f : y;
    case ACT_GELU:
        return 0.5f * y * (1.0f + erff(y * 0.70710678118654752f));
    case ACT_GELU_TANH: {
        float u = 0.7978845608028654f * (y + 0.044715f * y * y * y);
        return 0.5f * y * (1.0f + tanhf(u));
    }
    case ACT_SILU:
        return y / (1.0f + expf(-y));
    default:
        return y;
    }
}

typedef struct {
    const int32_t *colsum;
    const float *ws, *bias, *res;
    long ldr;
    float *Y;
    long ldy;
    int32_t *C;
    long ldc;
    int act;
} epi_t;

/* cnt (<= NR) columns n0.. of row m: ct -> C and / or Y. */
static void epilogue_row(const epi_t *e, const int32_t *ct, long m, long n0, long cnt,
                         float rs, int32_t corr) {
    long c = 0;
#ifdef VL
    if (e->Y && !e->C) {
        const vf vrs = VSET(rs);
        const vi vcorr = VSETI(corr);
        for (; c < cnt; c += VL) {
            long w = cnt - c < VL ? cnt - c : VL;
            int32_t cs[VL];
            float ws[VL], b[VL], r[VL], out[VL];
            const int32_t *pcs = e->colsum + n0 + c;
            const float *pws = e->ws + n0 + c, *pb = e->bias ? e->bias + n0 + c : NULL;
            const float *pr = e->res ? e->res + m * e->ldr + n0 + c : NULL;
            float *py = e->Y + m * e->ldy + n0 + c;
            if (w < VL) { /* a ragged edge: through zero-padded copies */
                memset(cs, 0, sizeof(cs));
                memset(ws, 0, sizeof(ws));
                memset(b, 0, sizeof(b));
                memset(r, 0, sizeof(r));
                memcpy(cs, pcs, (size_t)w * 4);
                memcpy(ws, pws, (size_t)w * 4);
                if (pb) memcpy(b, pb, (size_t)w * 4);
                if (pr) memcpy(r, pr, (size_t)w * 4);
                pcs = cs, pws = ws, pb = pb ? b : NULL, pr = pr ? r : NULL;
            }
            vi v = VISUB(VLOADI(ct + c), VIMUL(vcorr, VLOADI(pcs)));
            vf y = VMUL(VCVTI(v), VMUL(vrs, VLOAD(pws)));
            if (pb) y = VADD(y, VLOAD(pb));
            y = vact(y, e->act);
            if (pr) y = VADD(y, VLOAD(pr));
            if (w < VL) {
                VSTORE(out, y);
                memcpy(py, out, (size_t)w * 4);
            } else {
                VSTORE(py, y);
            }
        }
        return;
    }
    if (e->C && !e->Y) { /* int32 accumulators only */
        const vi vcorr = VSETI(corr);
        for (; c + VL <= cnt; c += VL)
            VSTOREI(e->C + m * e->ldc + n0 + c,
                    VISUB(VLOADI(ct + c), VIMUL(vcorr, VLOADI(e->colsum + n0 + c))));
    }
#endif
    for (; c < cnt; ++c) {
        long n = n0 + c;
        int32_t v = (int32_t)((uint32_t)ct[c] - (uint32_t)corr * (uint32_t)e->colsum[n]);
        if (e->C) e->C[m * e->ldc + n] = v;
        if (e->Y) {
            float y = (float)v * (rs * e->ws[n]);
            if (e->bias) y += e->bias[n];
            y = sact(y, e->act);
            if (e->res) y += e->res[m * e->ldr + n];
            e->Y[m * e->ldy + n] = y;
        }
    }
}

/* Rows m0 .. m0 + rows of a tile (row r's sums at ct + r * ldt), columns n0 .. n0 + cnt,
 * with their row scales rs[r] and corrections corr[r]: the epilogue of epilogue_row, with
 * a full NR-column panel's column sums, scales and bias loaded once for the whole tile
 * (the row-by-row form reloads them and pays a call per row: measured on a 128 x 384 x
 * 1536 GEMM, a quarter of the time). Same operations in the same order, so the same
 * bits. */
static void epilogue_tile(const epi_t *e, const int32_t *ct, long ldt, long m0, long rows,
                          long n0, long cnt, const float *rs, const int32_t *corr) {
#ifdef VL
#define NV (NR / VL)
    if (cnt == NR && e->Y && !e->C) {
        vi vcs[NV];
        vf vws[NV], vb[NV];
        for (int v = 0; v < NV; ++v) {
            vcs[v] = VLOADI(e->colsum + n0 + v * VL);
            vws[v] = VLOAD(e->ws + n0 + v * VL);
            vb[v] = e->bias ? VLOAD(e->bias + n0 + v * VL) : VSET(0.0f);
        }
        const int act = e->act, has_b = e->bias != NULL;
        for (long r = 0; r < rows; ++r) {
            const vf vrs = VSET(rs[r]);
            const vi vcorr = VSETI(corr[r]);
            float *py = e->Y + (m0 + r) * e->ldy + n0;
            const float *pr = e->res ? e->res + (m0 + r) * e->ldr + n0 : NULL;
            for (int v = 0; v < NV; ++v) {
                vi t = VISUB(VLOADI(ct + r * ldt + v * VL), VIMUL(vcorr, vcs[v]));
                vf y = VMUL(VCVTI(t), VMUL(vrs, vws[v]));
                if (has_b) y = VADD(y, vb[v]);
                if (act) y = vact(y, act);
                if (pr) y = VADD(y, VLOAD(pr + v * VL));
                VSTORE(py + v * VL, y);
            }
        }
        return;
    }
#undef NV
#endif
    for (long r = 0; r < rows; ++r)
        epilogue_row(e, ct + r * ldt, m0 + r, n0, cnt, rs[r], corr[r]);
}
