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
 * G = H / Hkv heads that read it, with lanes over keys:
 *   s = q_i k^T * scale (+ mask, hidden keys -inf), p = softmax(s) (the row max
 *   subtracted, as the forward), dp = dout_i v^T, ds = p * (dp - sum(p * dp)),
 *   dq_i = scale * ds k, and into the task's accumulators dk += scale * ds^T q_i,
 *   dv += p^T dout_i.
 * A row whose every key is hidden gives NaN (0/0, as the forward and the reference).
 * The per-row arithmetic is in the order of the NumPy kernel up to summation order.
 * Tasks run in an OpenMP loop; each writes only its own (batch, kv head) slices.
 */
enum { AG_NONE = 0, AG_CAUSAL = 1, AG_SLIDING = 2, AG_CUSTOM = 3 };

int rlx_attention_grad_isa(void) { return RLX_ATT_ISA; }

static inline long ag_pad(long n) { return (n + W - 1) / W * W; }

/* floats of workspace one thread needs */
long rlx_attention_grad_ws_floats(long Skv, long D) {
    const long sp = ag_pad(Skv);
    return 2 * D * sp + 2 * Skv * D + 4 * sp + D + 16;
}

typedef struct {
    const float *q, *k, *v, *dout, *mask;
    float *dq, *dk, *dv, *ds;
    long B, Sq, Skv, H, Hkv, D;
    float scale;
    int mtype;
    long window, msb, msh, msq, msk;
} ag_args;

static void ag_task(const ag_args *a, long b, long hk, float *ws) {
    const long Sq = a->Sq, Skv = a->Skv, H = a->H, Hkv = a->Hkv, D = a->D;
    const long G = H / Hkv, sp = ag_pad(Skv), qs = H * D, ks = Hkv * D, off = Skv - Sq;
    float *kt = ws, *vt = kt + D * sp, *dka = vt + D * sp, *dva = dka + Skv * D;
    float *s = dva + Skv * D, *dp = s + sp, *dsr = dp + sp, *dq = dsr + sp;
    const float *kb = a->k + b * Skv * ks + hk * D, *vb = a->v + b * Skv * ks + hk * D;
    for (long d = 0; d < D; d++)
        for (long j = 0; j < sp; j++) {
            kt[d * sp + j] = j < Skv ? kb[j * ks + d] : 0.0f;
            vt[d * sp + j] = j < Skv ? vb[j * ks + d] : 0.0f;
        }
    const int want_kv = a->dk != NULL || a->dv != NULL;
    if (want_kv) memset(dka, 0, sizeof(float) * 2 * Skv * D);
    const int causal = a->mtype == AG_CAUSAL || a->mtype == AG_SLIDING;
    for (long h = hk * G; h < (hk + 1) * G; h++)
        for (long i = 0; i < Sq; i++) {
            const float *qi = a->q + (b * Sq + i) * qs + h * D;
            const float *oi = a->dout + (b * Sq + i) * qs + h * D;
            for (long j = 0; j < sp; j++) s[j] = dp[j] = 0.0f;
            for (long d = 0; d < D; d++) {
                const float qd = qi[d], od = oi[d];
                const float *kr = kt + d * sp, *vr = vt + d * sp;
                for (long j = 0; j < sp; j++) {
                    s[j] += qd * kr[j];
                    dp[j] += od * vr[j];
                }
            }
            const float *mrow = a->mtype == AG_CUSTOM
                                    ? a->mask + b * a->msb + h * a->msh + i * a->msq
                                    : NULL;
            float mx = -INFINITY;
            for (long j = 0; j < sp; j++) {
                float x = s[j] * a->scale;
                if (mrow != NULL && j < Skv) x += mrow[j * a->msk];
                if (j >= Skv || (causal && j > i + off) ||
                    (a->mtype == AG_SLIDING && j <= i + off - a->window))
                    x = -INFINITY;
                s[j] = x;
                mx = x > mx ? x : mx;
            }
            /* exp(s - max) lane-wise; a row of only -inf: -inf - -inf = NaN, as softmax */
            const vf vmx = VSET1(mx);
            vf vsum = VZERO();
            for (long j = 0; j < sp; j += W) {
                vf e = vexp(VSUB(VLOAD(s + j), vmx));
                VSTORE(s + j, e);
                vsum = VADD(vsum, e);
            }
            float lanes[W], sum = 0.0f;
            VSTORE(lanes, vsum);
            for (int l = 0; l < W; l++) sum += lanes[l];
            const float inv = 1.0f / sum;
            float dsum = 0.0f;
            for (long j = 0; j < Skv; j++) {
                s[j] *= inv; /* p */
                dsum += s[j] * dp[j];
            }
            for (long j = 0; j < Skv; j++) dsr[j] = s[j] * (dp[j] - dsum);
            if (a->ds != NULL) memcpy(a->ds + ((b * H + h) * Sq + i) * Skv, dsr, sizeof(float) * Skv);
            if (a->dq != NULL) {
                for (long d = 0; d < D; d++) dq[d] = 0.0f;
                for (long j = 0; j < Skv; j++) {
                    const float w = dsr[j];
                    const float *kr = kb + j * ks;
                    for (long d = 0; d < D; d++) dq[d] += w * kr[d];
                }
                float *o = a->dq + (b * Sq + i) * qs + h * D;
                for (long d = 0; d < D; d++) o[d] = dq[d] * a->scale;
            }
            if (!want_kv) continue;
            for (long j = 0; j < Skv; j++) {
                const float w = dsr[j] * a->scale, p = s[j];
                float *dkr = dka + j * D, *dvr = dva + j * D;
                for (long d = 0; d < D; d++) {
                    dkr[d] += w * qi[d];
                    dvr[d] += p * oi[d];
                }
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
    if (threads < 1) threads = 1;
    if (threads > ntask) threads = (int)(ntask > 0 ? ntask : 1);
    if ((long)threads * per > ws_floats) return -1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (long t = 0; t < ntask; t++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *w = ws + (long)tid * per;
        w = (float *)(((uintptr_t)w + 63) & ~(uintptr_t)63);
        ag_task(&a, t / Hkv, t % Hkv, w);
    }
    return 0;
}
