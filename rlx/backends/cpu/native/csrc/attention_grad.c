/* Backward of multi-head attention (rlx/ops/nn_grad.py AttentionBackward), f32; built
 * after csrc/attention_vec.c (its vector layer: the build target's SIMD width and vexp).
 *
 * In: q[B,Sq,H*D], k, v[B,Skv,Hkv*D], the output cotangent dout[B,Sq,H*D], a mask kind
 * (none / causal / sliding window, end-aligned) and an optional additive f32 mask given
 * by element strides over [B,H,Sq,Skv] (0 on broadcast dims). Out (each optional, NULL
 * skips it): dq[B,Sq,H*D], dk, dv[B,Skv,Hkv*D] and the score gradient ds[B,H,Sq,Skv].
 *
 * One task is (batch, kv head): its keys and values are transposed into the workspace
 * (kt[d][j], vt[d][j], rows padded to a multiple of W), then for every query row of the
 * G = H / Hkv heads that read it:
 *   s = q_i k^T * scale (+ mask, hidden keys -inf) and dp = dout_i v^T (register tiles
 *   of AG_JT key vectors, lanes over keys), p = softmax(s) (the row max subtracted, as
 *   the forward), ds = p * (dp - sum(p * dp)), dq_i = scale * ds k (lanes over D);
 * and per block of AG_RB rows the task's accumulators dk_j += scale * ds_j q_i and
 * dv_j += p_j dout_i (lanes over D, each accumulator row loaded and stored once per
 * block).
 * A row whose every key is hidden (a query that sees no key) has p = 0, so its dq, ds
 * and its share of dk, dv are 0, as the forward's 0 output (rlx/ops/nn_grad.py).
 * The per-row arithmetic is in the order of the NumPy kernel up to summation order.
 * Tasks run in an OpenMP loop; each writes only its own (batch, kv head) slices.
 */
#include "omp_workspace.h"
enum { AG_NONE = 0, AG_CAUSAL = 1, AG_SLIDING = 2, AG_CUSTOM = 3 };

int rlx_attention_grad_isa(void) { return RLX_ATT_ISA; }

static inline long ag_pad(long n) { return (n + W - 1) / W * W; }

#define AG_RB 4 /* query rows per block: dk / dv rows are updated once per block */
#define AG_JT 4 /* key vectors per score tile */

/* floats of workspace one thread needs */
long rlx_attention_grad_ws_floats(long Skv, long D) {
    const long sp = ag_pad(Skv);
    return 2 * D * sp + 2 * Skv * D + 2 * AG_RB * sp + 16;
}

typedef struct {
    const float *q, *k, *v, *dout, *mask;
    float *dq, *dk, *dv, *ds;
    long B, Sq, Skv, H, Hkv, D;
    float scale;
    int mtype;
    long window, msb, msh, msq, msk;
} ag_args;

/* s[j] = sum_d qi[d] kt[d][j], dp[j] = sum_d oi[d] vt[d][j] for j < sp (lanes over keys,
 * AG_JT vectors of keys per register tile) */
static inline void ag_scores(const float *qi, const float *oi, const float *kt,
                             const float *vt, long sp, long D, float *s, float *dp) {
    long j0 = 0;
    for (; j0 + AG_JT * W <= sp; j0 += AG_JT * W) {
        vf as[AG_JT], ap[AG_JT];
        for (int t = 0; t < AG_JT; t++) as[t] = ap[t] = VZERO();
        for (long d = 0; d < D; d++) {
            const vf qb = VSET1(qi[d]), ob = VSET1(oi[d]);
            const float *kr = kt + d * sp + j0, *vr = vt + d * sp + j0;
            for (int t = 0; t < AG_JT; t++) {
                as[t] = VFMA(qb, VLOAD(kr + t * W), as[t]);
                ap[t] = VFMA(ob, VLOAD(vr + t * W), ap[t]);
            }
        }
        for (int t = 0; t < AG_JT; t++) {
            VSTORE(s + j0 + t * W, as[t]);
            VSTORE(dp + j0 + t * W, ap[t]);
        }
    }
    for (; j0 < sp; j0 += W) {
        vf as = VZERO(), ap = VZERO();
        for (long d = 0; d < D; d++) {
            as = VFMA(VSET1(qi[d]), VLOAD(kt + d * sp + j0), as);
            ap = VFMA(VSET1(oi[d]), VLOAD(vt + d * sp + j0), ap);
        }
        VSTORE(s + j0, as);
        VSTORE(dp + j0, ap);
    }
}

/* acc[j][d] += sum_r w[r][j] * rows[r][d] for keys j0..j0+nj (nj <= 4) over D (vectors
 * of D, a scalar tail): dk / dv rows updated by a block of m query rows; the nj keys are
 * independent FMA chains */
static inline void ag_axpy_rows(float *acc, const float *const *rows, const float *w,
                                long wstride, long j0, int nj, int m, long D) {
    long d0 = 0;
    for (; d0 + W <= D; d0 += W) {
        vf t[4];
        for (int u = 0; u < nj; u++) t[u] = VLOAD(acc + (j0 + u) * D + d0);
        for (int r = 0; r < m; r++) {
            const vf x = VLOAD(rows[r] + d0);
            for (int u = 0; u < nj; u++) t[u] = VFMA(VSET1(w[r * wstride + j0 + u]), x, t[u]);
        }
        for (int u = 0; u < nj; u++) VSTORE(acc + (j0 + u) * D + d0, t[u]);
    }
    for (; d0 < D; d0++)
        for (int u = 0; u < nj; u++)
            for (int r = 0; r < m; r++) acc[(j0 + u) * D + d0] += w[r * wstride + j0 + u] * rows[r][d0];
}

/* o[d] = scale * sum_j w[j] kb[j*ks + d] over D (four FMA chains over j, summed) */
static inline void ag_dq_row(float *o, const float *w, const float *kb, long ks, long Skv,
                             long D, float scale) {
    long d0 = 0;
    for (; d0 + W <= D; d0 += W) {
        vf c[4] = {VZERO(), VZERO(), VZERO(), VZERO()};
        long j = 0;
        for (; j + 4 <= Skv; j += 4)
            for (int u = 0; u < 4; u++)
                c[u] = VFMA(VSET1(w[j + u]), VLOAD(kb + (j + u) * ks + d0), c[u]);
        for (; j < Skv; j++) c[0] = VFMA(VSET1(w[j]), VLOAD(kb + j * ks + d0), c[0]);
        VSTORE(o + d0, VMUL(VADD(VADD(c[0], c[1]), VADD(c[2], c[3])), VSET1(scale)));
    }
    for (; d0 < D; d0++) {
        float acc = 0.0f;
        for (long j = 0; j < Skv; j++) acc += w[j] * kb[j * ks + d0];
        o[d0] = acc * scale;
    }
}

static void ag_task(const ag_args *a, long b, long hk, float *ws) {
    const long Sq = a->Sq, Skv = a->Skv, H = a->H, Hkv = a->Hkv, D = a->D;
    const long G = H / Hkv, sp = ag_pad(Skv), qs = H * D, ks = Hkv * D, off = Skv - Sq;
    float *kt = ws, *vt = kt + D * sp, *dka = vt + D * sp, *dva = dka + Skv * D;
    float *pb = dva + Skv * D, *dsb = pb + AG_RB * sp; /* [AG_RB][sp] each */
    const float *kb = a->k + b * Skv * ks + hk * D, *vb = a->v + b * Skv * ks + hk * D;
    for (long d = 0; d < D; d++)
        for (long j = 0; j < sp; j++) {
            kt[d * sp + j] = j < Skv ? kb[j * ks + d] : 0.0f;
            vt[d * sp + j] = j < Skv ? vb[j * ks + d] : 0.0f;
        }
    const int want_kv = a->dk != NULL || a->dv != NULL;
    if (want_kv) memset(dka, 0, sizeof(float) * 2 * Skv * D);
    const int causal = a->mtype == AG_CAUSAL || a->mtype == AG_SLIDING;
    const float scale = a->scale;
    for (long h = hk * G; h < (hk + 1) * G; h++)
        for (long i0 = 0; i0 < Sq; i0 += AG_RB) {
            const int m = Sq - i0 < AG_RB ? (int)(Sq - i0) : AG_RB;
            const float *qrow[AG_RB], *orow[AG_RB];
            for (int r = 0; r < m; r++) {
                const long i = i0 + r;
                float *s = pb + r * sp, *dsr = dsb + r * sp;
                qrow[r] = a->q + (b * Sq + i) * qs + h * D;
                orow[r] = a->dout + (b * Sq + i) * qs + h * D;
                ag_scores(qrow[r], orow[r], kt, vt, sp, D, s, dsr); /* dsr holds dp */
                const float *mrow = a->mtype == AG_CUSTOM
                                        ? a->mask + b * a->msb + h * a->msh + i * a->msq
                                        : NULL;
                /* scale, mask, hide: keys outside [jlo, jhi) and the padding get -inf */
                long jlo = 0, jhi = Skv;
                if (causal && i + off + 1 < jhi) jhi = i + off + 1 < 0 ? 0 : i + off + 1;
                if (a->mtype == AG_SLIDING && i + off - a->window + 1 > 0)
                    jlo = i + off - a->window + 1;
                const vf vsc = VSET1(scale);
                for (long j = 0; j < sp; j += W) VSTORE(s + j, VMUL(VLOAD(s + j), vsc));
                if (mrow != NULL) {
                    long j = 0;
                    if (a->msk == 1)
                        for (; j + W <= Skv; j += W)
                            VSTORE(s + j, VADD(VLOAD(s + j), VLOAD(mrow + j)));
                    for (; j < Skv; j++) s[j] += mrow[j * a->msk];
                }
                for (long j = 0; j < jlo && j < sp; j++) s[j] = -INFINITY;
                for (long j = jhi > jlo ? jhi : jlo; j < sp; j++) s[j] = -INFINITY;
                vf vmax = VSET1(-INFINITY);
                for (long j = 0; j < sp; j += W) vmax = VMAX(vmax, VLOAD(s + j));
                float lanes[W], mx = -INFINITY, sum = 0.0f, dsum = 0.0f;
                VSTORE(lanes, vmax);
                for (int l = 0; l < W; l++) mx = lanes[l] > mx ? lanes[l] : mx;
                /* exp(s - max) lane-wise; a row of only -inf: exp against 0 (all 0) */
                const vf vmx = VSET1(mx == -INFINITY ? 0.0f : mx);
                vf vsum = VZERO();
                for (long j = 0; j < sp; j += W) {
                    vf e = vexp(VSUB(VLOAD(s + j), vmx));
                    VSTORE(s + j, e);
                    vsum = VADD(vsum, e);
                }
                VSTORE(lanes, vsum);
                for (int l = 0; l < W; l++) sum += lanes[l];
                const vf vinv = VSET1(sum == 0.0f ? 0.0f : 1.0f / sum); /* no key: p = 0 */
                vf vd = VZERO();
                for (long j = 0; j < sp; j += W) { /* p (0 on the padding), sum(p * dp) */
                    vf p = VMUL(VLOAD(s + j), vinv);
                    VSTORE(s + j, p);
                    vd = VFMA(p, VLOAD(dsr + j), vd);
                }
                VSTORE(lanes, vd);
                for (int l = 0; l < W; l++) dsum += lanes[l];
                const vf vds = VSET1(dsum);
                for (long j = 0; j < sp; j += W)
                    VSTORE(dsr + j, VMUL(VLOAD(s + j), VSUB(VLOAD(dsr + j), vds)));
                if (a->ds != NULL)
                    memcpy(a->ds + ((b * H + h) * Sq + i) * Skv, dsr, sizeof(float) * Skv);
                if (a->dq != NULL) /* dq_i = scale * sum_j ds_j k_j */
                    ag_dq_row(a->dq + (b * Sq + i) * qs + h * D, dsr, kb, ks, Skv, D, scale);
                for (long j = 0; j < sp; j += W) VSTORE(dsr + j, VMUL(VLOAD(dsr + j), vsc)); /* dk */
            }
            if (!want_kv) continue;
            for (long j0 = 0; j0 < Skv; j0 += 4) {
                const int nj = Skv - j0 < 4 ? (int)(Skv - j0) : 4;
                ag_axpy_rows(dka, qrow, dsb, sp, j0, nj, m, D);
                ag_axpy_rows(dva, orow, pb, sp, j0, nj, m, D);
            }
        }
    if (!want_kv) return;
    for (long j = 0; j < Skv; j++) {
        const long o = (b * Skv + j) * ks + hk * D;
        if (a->dk != NULL) memcpy(a->dk + o, dka + j * D, sizeof(float) * D);
        if (a->dv != NULL) memcpy(a->dv + o, dva + j * D, sizeof(float) * D);
    }
}

/* Returns 0, or -1 when the workspace is too small. */
int rlx_attention_grad(const float *q, const float *k, const float *v, const float *dout,
                       float *dq, float *dk, float *dv, float *ds, long B, long Sq, long Skv,
                       long H, long Hkv, long D, float scale, int mtype, long window,
                       const float *mask, long msb, long msh, long msq, long msk, float *ws,
                       long ws_floats, int threads) {
    ag_args a = {q, k, v, dout, mask, dq, dk, dv, ds, B, Sq, Skv, H, Hkv, D, scale, mtype,
                 window, msb, msh, msq, msk};
    const long per = rlx_attention_grad_ws_floats(Skv, D), ntask = B * Hkv;
    if (!(threads = rlx_ws_team(threads, ntask, per, ws_floats))) return -1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (long t = 0; t < ntask; t++) {
        float *w = rlx_ws_slice(ws, per);
        ag_task(&a, t / Hkv, t % Hkv, w);
    }
    return 0;
}
