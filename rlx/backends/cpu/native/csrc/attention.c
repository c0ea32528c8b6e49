/* Fused multi-head attention, flash style, f32 arithmetic (built after
 * csrc/attention_vec.c, its vector layer).
 *
 * In: q[B,Sq,H*D], k[B,Skv,Hkv*D], v[B,Skv,Hkv*D] (C-contiguous; all f32, bf16 or f16 as
 * RLX_ATT_DT says), a mask kind (none / causal / sliding window, end-aligned) and an
 * optional additive f32 mask given by element strides over [B,H,Sq,Skv] (0 on broadcast
 * dims). Out: out[B,Sq,H*D] = softmax(cap(q k^T * scale) + mask) v per head; query
 * head h reads kv head h / (H / Hkv). cap(s) = softcap * tanh(s / softcap) for softcap >
 * 0 (Gemma 2's attention-logit soft-capping, a pass over a block's scores before its
 * mask), s for 0 (that path does not change: no pass, the same bits).
 *
 * One task is (batch, kv head, block of MB query rows): the G = H / Hkv query heads that
 * share a kv head are stacked into G * Sq rows (so a decode step of grouped-query
 * attention still fills vectors). Tasks run in an OpenMP loop. A task keeps its queries
 * transposed (qt[d][i], W x W blocks transposed in registers), so every vector holds
 * consecutive query rows of one column: scores, the running max / sum of the online
 * softmax and the output accumulator ot[d][i] are all lane-wise, with no horizontal
 * reductions. Keys come in blocks of NB: scores st[j][i] = (sum_d k[j,d] * qt[d][i]) *
 * scale (+ mask, hidden keys -inf), the block max updates the running max m (the
 * accumulator and the running sum are rescaled by exp(m_old - m_new)), p = exp(s - m)
 * overwrites st and ot[d][i] += sum_j v[j,d] * p[j][i]. Only an NB x MB block of
 * scores exists at a time.
 *
 * A row whose every key is hidden (-inf: a query that sees no key) gives exactly 0, not
 * NaN (rlx/ops/nn.py Attention): it keeps a sum of 0 and is selected to 0 at the end;
 * while a row has seen only hidden keys its max is -inf and exp is taken against 0
 * instead (so no NaN leaks into rows that see keys later).
 */
#include <stdatomic.h>
#include <time.h>

#include "omp_workspace.h"
#include "late_team.h"
#define RMAX 4           /* row vectors per task: MB = RMAX * W query rows */
#define MB (RMAX * W)
#define NB 64            /* keys per block */
_Static_assert(NB >= MB, "the widened key block also holds a block of query rows");

enum { MASK_NONE = 0, MASK_CAUSAL = 1, MASK_SLIDING = 2, MASK_CUSTOM = 3 };

int rlx_attention_isa(void) { return RLX_ATT_ISA; }

int rlx_attention_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int rlx_attention_block_rows(void) { return MB; }

/* qt[d][ii] = rows[ii][d] for ii < m (0 for m <= ii < nv * W), d < D */
static inline void pack_rows_t(float *qt, const float *const *rows, long m, int nv, long D) {
    for (int g = 0; g < nv; g++) {
        long d0 = 0;
        for (; d0 + W <= D; d0 += W) {
            vf r[W];
            for (int l = 0; l < W; l++) {
                long ii = g * W + l;
                r[l] = ii < m ? VLOAD(rows[ii] + d0) : VZERO();
            }
            transpose_w(r);
            for (int c = 0; c < W; c++) VSTORE(qt + (d0 + c) * MB + g * W, r[c]);
        }
        for (long d = d0; d < D; d++)
            for (int l = 0; l < W; l++) {
                long ii = g * W + l;
                qt[d * MB + ii] = ii < m ? rows[ii][d] : 0.0f;
            }
    }
}

/* rows[ii][d] = ot[d][ii] for ii < m, d < D */
static inline void unpack_rows_t(float *const *rows, const float *ot, long m, int nv, long D) {
    for (int g = 0; g < nv; g++) {
        long d0 = 0;
        for (; d0 + W <= D; d0 += W) {
            vf r[W];
            for (int c = 0; c < W; c++) r[c] = VLOAD(ot + (d0 + c) * MB + g * W);
            transpose_w(r);
            for (int l = 0; l < W; l++) {
                long ii = g * W + l;
                if (ii < m) VSTORE(rows[ii] + d0, r[l]);
            }
        }
        for (long d = d0; d < D; d++)
            for (int l = 0; l < W; l++) {
                long ii = g * W + l;
                if (ii < m) rows[ii][d] = ot[d * MB + ii];
            }
    }
}

typedef struct {
    const elt *q, *k, *v;
    const float *mask;
    elt *out;
    long B, Sq, Skv, H, Hkv, D;
    float scale, softcap;
    int mtype;
    long window;
    long msb, msh, msq, msk;
} att_args;

/* One block of rows: the query index of each row as a float (causal masks) and the
 * offset of its mask row (custom masks with a per-head or per-query mask). */
typedef struct {
    float iq[MB];
    long moff[MB];
    const float *mbase; /* mask + b * msb (NULL: no custom mask) */
    int mrow_scalar;    /* the mask is one value per key for every row */
} rows_t;

/* NJ keys (rows kp[t]) against R row vectors of qt: scaled scores into st[t][i] (st at
 * the tile's first key) and, unless MASKED (mask_pass does it then), the block max. */
static inline __attribute__((always_inline)) void qk_tile(
    const float *qt, float *st, const float *kbase, long kstride, long D, vf scale, int R,
    int NJ, int MASKED, vf *bmax) {
    const float *kp[QK_J];
    for (int t = 0; t < NJ; t++) kp[t] = kbase + t * kstride;
    vf acc[QK_J][RMAX];
    for (int t = 0; t < NJ; t++)
        for (int r = 0; r < R; r++) acc[t][r] = VZERO();
    for (long d = 0; d < D; d++) {
        vf qv[RMAX];
        for (int r = 0; r < R; r++) qv[r] = VLOAD(qt + d * MB + r * W);
        for (int t = 0; t < NJ; t++) {
            vf kb = VSET1(kp[t][d]);
            for (int r = 0; r < R; r++) acc[t][r] = VFMA(kb, qv[r], acc[t][r]);
        }
    }
    for (int t = 0; t < NJ; t++)
        for (int r = 0; r < R; r++) {
            vf s = VMUL(acc[t][r], scale);
            VSTORE(st + t * MB + r * W, s);
            if (!MASKED) bmax[r] = VMAX(bmax[r], s);
        }
}

/* the custom mask added to / the causal mask applied to scores st[j][i] of keys
 * j0..j0+nb, and the block max of the result */
static inline __attribute__((always_inline)) void mask_pass(
    const att_args *a, const rows_t *rw, float *st, long j0, long nb, long m, int R,
    int need_causal, vf *bmax) {
    const long off = a->Skv - a->Sq, msk = a->msk;
    const int sliding = a->mtype == MASK_SLIDING;
    const vf ninf = VSET1(-INFINITY);
    vf iv[RMAX];
    for (int r = 0; r < R; r++) iv[r] = VLOAD(rw->iq + r * W);
    long jj = 0;
    if (rw->mbase != NULL && !rw->mrow_scalar && msk == 1) {
        /* a mask row per query row, contiguous along keys: W keys x W rows at a time,
         * transposed in registers */
        for (; jj + W <= nb; jj += W)
            for (int r = 0; r < R; r++) {
                vf c[W];
                for (int l = 0; l < W; l++) {
                    long ii = r * W + l;
                    c[l] = ii < m ? VLOAD(rw->mbase + rw->moff[ii] + j0 + jj) : VZERO();
                }
                transpose_w(c);
                for (int t = 0; t < W; t++) {
                    float *sp = st + (jj + t) * MB + r * W;
                    vf s = VADD(VLOAD(sp), c[t]);
                    VSTORE(sp, s);
                    bmax[r] = VMAX(bmax[r], s);
                }
            }
    }
    for (; jj < nb; jj++) {
        const long j = j0 + jj;
        for (int r = 0; r < R; r++) {
            vf s = VLOAD(st + jj * MB + r * W);
            if (rw->mbase != NULL) {
                if (rw->mrow_scalar) {
                    s = VADD(s, VSET1(rw->mbase[j * msk]));
                } else {
                    float tmp[W];
                    for (int l = 0; l < W; l++) {
                        long ii = r * W + l;
                        tmp[l] = ii < m ? rw->mbase[rw->moff[ii] + j * msk] : 0.0f;
                    }
                    s = VADD(s, VLOAD(tmp));
                }
            }
            if (need_causal) {
                /* hidden when i < j - off, or (sliding) i > j - off + window - 1 */
                s = VSEL_LT(iv[r], VSET1((float)(j - off)), s, ninf);
                if (sliding) s = VSEL_LT(VSET1((float)(j - off + a->window - 1)), iv[r], s, ninf);
            }
            VSTORE(st + jj * MB + r * W, s);
            bmax[r] = VMAX(bmax[r], s);
        }
    }
}

static inline __attribute__((always_inline)) void qk_tiles(
    const float *qt, float *st, const float *kbase, long kstride, long nb, long D, vf scale,
    int R, int MASKED, vf *bmax) {
    long jj = 0;
    for (; jj + QK_J <= nb; jj += QK_J)
        qk_tile(qt, st + jj * MB, kbase + jj * kstride, kstride, D, scale, R, QK_J, MASKED,
                bmax);
    const float *kb = kbase + jj * kstride;
    float *sb = st + jj * MB;
    switch ((int)(nb - jj)) {
#define QK_TAIL(n)                                                                          \
    case n:                                                                                 \
        if (n < QK_J)                                                                       \
            qk_tile(qt, sb, kb, kstride, D, scale, R, n < QK_J ? n : 1, MASKED, bmax);      \
        break;
        QK_TAIL(1) QK_TAIL(2) QK_TAIL(3) QK_TAIL(4) QK_TAIL(5) QK_TAIL(6) QK_TAIL(7)
#undef QK_TAIL
    default: break;
    }
}

/* st[j][i] = cap * tanh(st[j][i] / cap) for the nb keys of a block and, when MAXED,
 * the block max of the result */
static inline __attribute__((always_inline)) void softcap_pass(
    float *st, long nb, int R, float cap, int MAXED, vf *bmax) {
    const vf c = VSET1(cap);
    for (long jj = 0; jj < nb; jj++)
        for (int r = 0; r < R; r++) {
            float *sp = st + jj * MB + r * W;
            vf s = VMUL(vtanh(VDIV(VLOAD(sp), c)), c);
            VSTORE(sp, s);
            if (MAXED) bmax[r] = VMAX(bmax[r], s);
        }
}

/* scores of keys j0..j0+nb (their rows at kbase, kstride apart) for R row vectors into
 * st[j][i] (scaled, masked); returns the block max per row vector in bmax. Tiles of
 * QK_J keys, the last one as wide as the keys left (a compile-time width each); a masked
 * block gets its mask in a second pass over the scores (the tiles stay register-only). */
static inline __attribute__((always_inline)) void qk_block(
    const att_args *a, const rows_t *rw, const float *qt, float *st, const float *kbase,
    long kstride, long j0, long nb, long m, int R, int need_causal, vf *bmax) {
    const vf scale = VSET1(a->scale);
    for (int r = 0; r < R; r++) bmax[r] = VSET1(-INFINITY);
    if (a->softcap != 0.0f) { /* cap the scaled scores, then the mask (if any) */
        const int masked = rw->mbase != NULL || need_causal;
        qk_tiles(qt, st, kbase, kstride, nb, a->D, scale, R, 1, bmax);
        softcap_pass(st, nb, R, a->softcap, !masked, bmax);
        if (masked) mask_pass(a, rw, st, j0, nb, m, R, need_causal, bmax);
        return;
    }
    if (rw->mbase == NULL && !need_causal) {
        qk_tiles(qt, st, kbase, kstride, nb, a->D, scale, R, 0, bmax);
        return;
    }
    qk_tiles(qt, st, kbase, kstride, nb, a->D, scale, R, 1, bmax);
    mask_pass(a, rw, st, j0, nb, m, R, need_causal, bmax);
}

/* ot[d][i] += sum_j v[j,d] * st[j][i] for ND columns from d0 */
static inline __attribute__((always_inline)) void pv_tile(
    float *ot, const float *st, const float *vbase, long vstride, long nb, long d0, int R,
    int ND) {
    vf acc[PV_D][RMAX];
    for (int t = 0; t < ND; t++)
        for (int r = 0; r < R; r++) acc[t][r] = VLOAD(ot + (d0 + t) * MB + r * W);
    for (long jj = 0; jj < nb; jj++) {
        const float *vp = vbase + jj * vstride + d0;
        vf pv[RMAX];
        for (int r = 0; r < R; r++) pv[r] = VLOAD(st + jj * MB + r * W);
        for (int t = 0; t < ND; t++) {
            vf vb = VSET1(vp[t]);
            for (int r = 0; r < R; r++) acc[t][r] = VFMA(vb, pv[r], acc[t][r]);
        }
    }
    for (int t = 0; t < ND; t++)
        for (int r = 0; r < R; r++) VSTORE(ot + (d0 + t) * MB + r * W, acc[t][r]);
}

/* ot[d][i] += sum_j v[j,d] * st[j][i] for the nb keys of the block at vbase: tiles of
 * PV_D columns, the last one as wide as the columns left */
static inline __attribute__((always_inline)) void pv_block(
    float *ot, const float *st, const float *vbase, long vstride, long nb, long D, int R) {
    long d = 0;
    for (; d + PV_D <= D; d += PV_D) pv_tile(ot, st, vbase, vstride, nb, d, R, PV_D);
    switch ((int)(D - d)) {
#define PV_TAIL(n)                                                                  \
    case n:                                                                         \
        if (n < PV_D) pv_tile(ot, st, vbase, vstride, nb, d, R, n < PV_D ? n : 1); \
        break;
        PV_TAIL(1) PV_TAIL(2) PV_TAIL(3) PV_TAIL(4) PV_TAIL(5) PV_TAIL(6) PV_TAIL(7)
#undef PV_TAIL
    default: break;
    }
}

/* rows r0..r0+m-1 of the G*Sq rows (query head hk*G + r / Sq, query r % Sq) that share
 * kv head hk of batch b */
static inline __attribute__((always_inline)) void task_r(
    const att_args *a, long b, long hk, long r0, long m, int R, float *ws) {
    const long D = a->D, Sq = a->Sq, Skv = a->Skv, H = a->H, Hkv = a->Hkv;
    const long G = H / Hkv;
    const long qstride = H * D, kstride = Hkv * D;
    float *qt = ws, *ot = qt + D * MB, *st = ot + D * MB;
    const long off = Skv - Sq;
    const elt *kbase = a->k + b * Skv * kstride + hk * D;
    const elt *vbase = a->v + b * Skv * kstride + hk * D;
#if RLX_ATT_DT != 0
    float *kc = st + NB * MB, *vc = kc + NB * D; /* widened key / value blocks */
#endif
    const int causal = a->mtype == MASK_CAUSAL || a->mtype == MASK_SLIDING;
    long qoff[MB];
    rows_t rw;
    long imin = Sq, imax = -1;
    for (long ii = 0; ii < R * W; ii++) {
        long r = r0 + (ii < m ? ii : 0);
        long h = hk * G + r / Sq, i = r % Sq;
        if (ii < m) {
            imin = i < imin ? i : imin;
            imax = i > imax ? i : imax;
        }
        qoff[ii] = (b * Sq + i) * qstride + h * D;
        rw.iq[ii] = ii < m ? (float)i : (float)Sq; /* a padded lane acts as a late row */
        rw.moff[ii] = h * a->msh + i * a->msq;
    }
    rw.mbase = a->mtype == MASK_CUSTOM ? a->mask + b * a->msb : NULL;
    rw.mrow_scalar = a->msq == 0 && (a->msh == 0 || r0 / Sq == (r0 + m - 1) / Sq);
    if (rw.mbase != NULL && rw.mrow_scalar) rw.mbase += rw.moff[0];

    /* keys any row of the block sees: [jlo, jhi] */
    long jlo = 0, jhi = Skv - 1;
    if (causal) {
        jhi = imax + off;
        if (jhi > Skv - 1) jhi = Skv - 1;
        if (a->mtype == MASK_SLIDING) {
            jlo = imin + off - a->window + 1;
            if (jlo < 0) jlo = 0;
        }
    }
    if (jhi < jlo) { /* every row sees no key: 0 */
        for (long ii = 0; ii < m; ii++)
            for (long d = 0; d < D; d++) st1(a->out + qoff[ii] + d, 0.0f);
        return;
    }
    const float *qrows[MB];
    for (long ii = 0; ii < m; ii++) {
#if RLX_ATT_DT == 0
        qrows[ii] = a->q + qoff[ii];
#else
        load_row(kc + ii * D, a->q + qoff[ii], D); /* kc holds NB >= MB rows of D */
        qrows[ii] = kc + ii * D;
#endif
    }
    pack_rows_t(qt, qrows, m, R, D);
    memset(ot, 0, sizeof(float) * D * MB);
    vf mx[RMAX], sum[RMAX];
    for (int r = 0; r < R; r++) {
        mx[r] = VSET1(-INFINITY);
        sum[r] = VZERO();
    }
    const vf ninf = VSET1(-INFINITY);
    int first = 1;
    for (long j0 = jlo; j0 <= jhi; j0 += NB) {
        long nb = jhi + 1 - j0 < NB ? jhi + 1 - j0 : NB;
        /* a causal block needs per-lane hiding only where some row's range cuts it */
        int need = causal && (j0 + nb - 1 > imin + off ||
                              (a->mtype == MASK_SLIDING && j0 < imax + off - a->window + 1));
        vf bmax[RMAX];
#if RLX_ATT_DT == 0
        const float *kb = kbase + j0 * kstride, *vb = vbase + j0 * kstride;
        const long kvs = kstride;
#else
        for (long jj = 0; jj < nb; jj++) {
            load_row(kc + jj * D, kbase + (j0 + jj) * kstride, D);
            load_row(vc + jj * D, vbase + (j0 + jj) * kstride, D);
        }
        const float *kb = kc, *vb = vc;
        const long kvs = D;
#endif
        qk_block(a, &rw, qt, st, kb, kvs, j0, nb, m, R, need, bmax);
        vf msafe[RMAX];
        for (int r = 0; r < R; r++) {
            vf mnew = VMAX(mx[r], bmax[r]);
            msafe[r] = VSEL_EQ(mnew, ninf, mnew, VZERO());
            if (!first) {
                vf alpha = vexp(VSUB(mx[r], msafe[r]));
                sum[r] = VMUL(sum[r], alpha);
                for (long d = 0; d < D; d++) {
                    float *o = ot + d * MB + r * W;
                    VSTORE(o, VMUL(VLOAD(o), alpha));
                }
            }
            mx[r] = mnew;
        }
        first = 0;
        for (long jj = 0; jj < nb; jj++) {
            for (int r = 0; r < R; r++) {
                float *s = st + jj * MB + r * W;
                vf p = vexp(VSUB(VLOAD(s), msafe[r]));
                sum[r] = VADD(sum[r], p);
                VSTORE(s, p);
            }
        }
        pv_block(ot, st, vb, kvs, nb, D, R);
    }
    const vf zero = VZERO();
    for (long d = 0; d < D; d++)
        for (int r = 0; r < R; r++) { /* a sum of 0: the row saw no key, 0 */
            float *o = ot + d * MB + r * W;
            VSTORE(o, VSEL_EQ(sum[r], zero, VDIV(VLOAD(o), sum[r]), zero));
        }
    float *orows[MB];
    for (long ii = 0; ii < m; ii++) {
#if RLX_ATT_DT == 0
        orows[ii] = a->out + qoff[ii];
#else
        orows[ii] = kc + ii * D;
#endif
    }
    unpack_rows_t(orows, ot, m, R, D);
#if RLX_ATT_DT != 0
    for (long ii = 0; ii < m; ii++) store_row(a->out + qoff[ii], kc + ii * D, D);
#endif
}

/* task_r for 1, 2 or 4 row vectors (3 run as 4, with zero rows: one instantiation less,
 * a shorter build) */
static void task(const att_args *a, long b, long hk, long r0, long m, float *ws) {
    int R = (int)((m + W - 1) / W);
    switch (R) {
    case 1: task_r(a, b, hk, r0, m, 1, ws); break;
    case 2: task_r(a, b, hk, r0, m, 2, ws); break;
    default: task_r(a, b, hk, r0, m, 4, ws); break;
    }
}

/* floats of workspace one thread needs for head dim D (64-byte aligned inside) */
long rlx_attention_ws_floats(long D) {
    return 2 * D * MB + NB * MB + (RLX_ATT_DT != 0 ? 2 * NB * D : 0) + 16;
}

int rlx_attention_dtype(void) { return RLX_ATT_DT; }

/* A late second thread: csrc/late_team.h. */
static rlx_late_team att_late = RLX_LATE_TEAM_INIT;

/* Sets the number of calls left to run on one thread; returns the previous number. */
int rlx_attention_set_solo_calls(int n) { return rlx_late_set_solo(&att_late, n); }

/* Returns 0, or -1 when the workspace is too small. */
int rlx_attention(const elt *q, const elt *k, const elt *v, elt *out, long B, long Sq,
                  long Skv, long H, long Hkv, long D, float scale, float softcap, int mtype,
                  long window, const float *mask, long msb, long msh, long msq, long msk,
                  float *ws, long ws_floats, int threads) {
    att_args a = {q, k, v, mask, out, B, Sq, Skv, H, Hkv, D, scale, softcap, mtype, window,
                  msb, msh, msq, msk};
    const long per = rlx_attention_ws_floats(D);
    const long rows = (H / Hkv) * Sq; /* query rows per kv head */
    const long nblk = (rows + MB - 1) / MB;
    const long ntask = B * Hkv * nblk;
    if (ntask == 0) return 0;
    if (!(threads = rlx_ws_team(threads, ntask, per, ws_floats))) return -1;
    if (threads > 1 && rlx_late_go_solo(&att_late)) threads = 1; /* a late second thread lately */
    long done_ns = 0, allow_ns = 0; /* the calling thread out of tasks; its allowed wait */
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int me = rlx_tid();
        long start_ns = me == 0 && threads > 1 ? rlx_now_ns() : 0, mine = 0;
#pragma omp for schedule(dynamic, 1) nowait
        for (long t = 0; t < ntask; t++) {
            ++mine;
            float *w = rlx_ws_slice(ws, per);
            /* later query blocks (more keys under a causal mask) first */
            long blk = nblk - 1 - t % nblk;
            long bh = t / nblk;
            long r0 = blk * MB;
            long m = rows - r0 < MB ? rows - r0 : MB;
            task(&a, bh / Hkv, bh % Hkv, r0, m, w);
        }
        if (start_ns) {
            done_ns = rlx_now_ns();
            allow_ns = rlx_late_allow(start_ns, done_ns, mine);
        }
    }
    rlx_late_after(&att_late, done_ns, allow_ns);
    return 0;
}
