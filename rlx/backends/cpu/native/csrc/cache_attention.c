/* KV-cache attention entries (built after csrc/attention.c, whose kernel they call for
 * prompt chunks): one call checks the positions, writes the new K / V rows into the
 * cache and attends over its valid prefix, so a decode step has no Python per layer.
 *
 * rlx_cache_attention: q, k, v f32 [B,S,*], caches elt [B,C,Hkv*D], positions [S]
 * (int32 or int64). Returns 1 (nothing written) unless the positions are p..p+S-1 with
 * p >= 0 and p + S <= C; -1 when the workspace is too small; else 0. The new rows are
 * rounded into the cache (st1: nearest even). S = 1: the decode kernel below. S > 1:
 * rlx_attention per batch row over the first p+S rows, q rounded into qn (elt) and the
 * elt output in `on` widened into out (a bf16 / f16 cache; f32: q and out directly).
 * rlx_cache_attention_i8 (the f32 build): int8 caches with f32 scales [B,C,groups]; the
 * new rows are quantized as rlx.ops.kvcache.quantize_heads (max|x| / 127 per group,
 * rint, clip to +-127); S = 1 dequantizes each key / value block inside the decode
 * kernel, S > 1 dequantizes the prefix into f32 scratch rows and runs rlx_attention.
 * rlx_slot_cache_attention: per-token slots and positions (int64): returns 1 when a slot
 * or position is out of range or two tokens write one row; runs of one slot at
 * consecutive positions: runs of one token go to the decode kernel (all in one parallel
 * call), longer runs to rlx_attention.
 *
 * Decode kernel (one query row per head, so the end-aligned causal mask hides nothing and
 * a sliding window of w keeps keys >= skv - w): vectorized over head_dim, the G query
 * heads of a kv head share each key / value load. The keys are cut into chunks of CH
 * (flash-decoding): a task is (job, kv head, chunk) with its own running max / sum /
 * accumulator, tasks run in an OpenMP loop, and the partial softmaxes are merged exactly
 * (rescaled by exp(m_c - M)) in chunk order. The chunks depend only on the context
 * length, so the result is the same bits at any thread count. */
#define CH 128    /* keys per decode chunk */
#define DNB 64    /* keys per decode block */
#define GMAX 4    /* query heads per register group */

static inline float vhsum(vf x) {
#if RLX_ATT_ISA == 2
    return _mm512_reduce_add_ps(x);
#elif RLX_ATT_ISA == 1
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
#elif RLX_ATT_ISA == 3
    return att_neon_hsum(x);
#else
    return x[0] + x[1] + x[2] + x[3];
#endif
}

/* x rounded to the cache's element type and back (identity for f32) */
static inline float rnd(float x) {
#if RLX_ATT_DT == 0
    return x;
#else
    elt e;
    st1(&e, x);
    return ld(&e);
#endif
}

typedef struct {
    const float *q; /* H*D f32 (one token) */
    float *out;     /* H*D f32 */
    const void *k, *v;          /* the slot's / batch row's cache rows, Hkv*D apart */
    const float *ks, *vs;       /* int8 scales [rows][groups] (NULL otherwise) */
    long skv;                   /* valid rows */
} dec_job;

typedef struct {
    long H, Hkv, D, groups;
    float scale, softcap;
    long window;
    int i8;
} dec_cfg;

static inline long dec_lo(const dec_cfg *c, long skv) {
    return c->window > 0 && skv > c->window ? skv - c->window : 0;
}

static inline long dec_chunks(const dec_cfg *c, long skv) {
    long n = skv - dec_lo(c, skv);
    return n > 0 ? (n + CH - 1) / CH : 1;
}

/* rows j0..j0+nb of kv head hk as f32 at dst (D apart); returns the rows' base and
 * stride (the cache itself for f32) */
static inline const float *dec_rows(const dec_cfg *c, const void *src, const float *sc,
                                    long hk, long j0, long nb, float *dst, long *stride) {
    const long rs = c->Hkv * c->D, D = c->D;
    if (c->i8) {
        const int8_t *s8 = (const int8_t *)src;
        const long gs = rs / c->groups;
        for (long jj = 0; jj < nb; jj++) {
            const int8_t *r = s8 + (j0 + jj) * rs + hk * D;
            const float *g = sc + (j0 + jj) * c->groups;
            float *o = dst + jj * D;
            for (long d = 0; d < D;) {
                long grp = (hk * D + d) / gs, end = (grp + 1) * gs - hk * D;
                if (end > D) end = D;
                const float f = g[grp];
                for (; d < end; d++) o[d] = (float)r[d] * f;
            }
        }
        *stride = D;
        return dst;
    }
#if RLX_ATT_DT == 0
    *stride = rs;
    return (const float *)src + j0 * rs + hk * D;
#else
    for (long jj = 0; jj < nb; jj++) load_row(dst + jj * D, (const elt *)src + (j0 + jj) * rs + hk * D, D);
    *stride = D;
    return dst;
#endif
}

/* one task: query heads hk*G.. of job j against keys [c0, c1); its partial result (G
 * accumulators of D, G maxima, G sums) at part */
static void dec_task(const dec_cfg *c, const dec_job *j, long hk, long c0, long c1,
                     float *part, float *ws) {
    const long D = c->D, G = c->H / c->Hkv, Dv = D / W * W;
    float *qf = ws, *kb = qf + G * D, *vb = kb + DNB * D, *sc = vb + DNB * D;
    float *o = part, *m = o + G * D, *l = m + G;
    for (long g = 0; g < G; g++) {
        const float *qs = j->q + (hk * G + g) * D;
        for (long d = 0; d < D; d++) qf[g * D + d] = rnd(qs[d]);
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(o, 0, sizeof(float) * G * D);
    const long npad = (DNB + W - 1) / W * W;
    for (long j0 = c0; j0 < c1; j0 += DNB) {
        const long nb = c1 - j0 < DNB ? c1 - j0 : DNB;
        long ks, vs;
        const float *kr = dec_rows(c, j->k, j->ks, hk, j0, nb, kb, &ks);
        /* scores sc[g][jj] */
        for (long g0 = 0; g0 < G; g0 += GMAX) {
            const int ng = (int)(G - g0 < GMAX ? G - g0 : GMAX);
            for (long jj = 0; jj < nb; jj++) {
                const float *kp = kr + jj * ks;
                vf acc[GMAX];
                for (int g = 0; g < ng; g++) acc[g] = VZERO();
                for (long d = 0; d < Dv; d += W) {
                    vf kv = VLOAD(kp + d);
                    for (int g = 0; g < ng; g++) acc[g] = VFMA(kv, VLOAD(qf + (g0 + g) * D + d), acc[g]);
                }
                for (int g = 0; g < ng; g++) {
                    float s = vhsum(acc[g]);
                    for (long d = Dv; d < D; d++) s += kp[d] * qf[(g0 + g) * D + d];
                    sc[(g0 + g) * npad + jj] = s * c->scale;
                }
            }
        }
        for (long g = 0; g < G; g++) {
            float *s = sc + g * npad;
            for (long jj = nb; jj < npad; jj++) s[jj] = -INFINITY;
            if (c->softcap != 0.0f) {
                const vf cap = VSET1(c->softcap);
                for (long jj = 0; jj < npad; jj += W)
                    VSTORE(s + jj, VMUL(vtanh(VDIV(VLOAD(s + jj), cap)), cap));
                for (long jj = nb; jj < npad; jj++) s[jj] = -INFINITY;
            }
            float bm = -INFINITY;
            for (long jj = 0; jj < nb; jj++) bm = s[jj] > bm ? s[jj] : bm;
            const float mn = bm > m[g] ? bm : m[g];
            const float ms = mn == -INFINITY ? 0.0f : mn;
            if (m[g] != -INFINITY && m[g] != mn) {
                float tmp[W];
                VSTORE(tmp, vexp(VSET1(m[g] - ms)));
                const float alpha = tmp[0];
                l[g] *= alpha;
                for (long d = 0; d < D; d++) o[g * D + d] *= alpha;
            }
            m[g] = mn;
            vf sum = VZERO();
            const vf msv = VSET1(ms);
            for (long jj = 0; jj < npad; jj += W) {
                vf p = vexp(VSUB(VLOAD(s + jj), msv));
                sum = VADD(sum, p);
                VSTORE(s + jj, p);
            }
            l[g] += vhsum(sum);
        }
        /* o[g] += sum_jj p[g][jj] v[jj] */
        const float *vr = dec_rows(c, j->v, j->vs, hk, j0, nb, vb, &vs);
        for (long g0 = 0; g0 < G; g0 += GMAX) {
            const int ng = (int)(G - g0 < GMAX ? G - g0 : GMAX);
            long d = 0;
            for (; d + 2 * W <= D; d += 2 * W) {
                vf a0[GMAX], a1[GMAX];
                for (int g = 0; g < ng; g++) {
                    a0[g] = VLOAD(o + (g0 + g) * D + d);
                    a1[g] = VLOAD(o + (g0 + g) * D + d + W);
                }
                for (long jj = 0; jj < nb; jj++) {
                    vf v0 = VLOAD(vr + jj * vs + d), v1 = VLOAD(vr + jj * vs + d + W);
                    for (int g = 0; g < ng; g++) {
                        vf p = VSET1(sc[(g0 + g) * npad + jj]);
                        a0[g] = VFMA(p, v0, a0[g]);
                        a1[g] = VFMA(p, v1, a1[g]);
                    }
                }
                for (int g = 0; g < ng; g++) {
                    VSTORE(o + (g0 + g) * D + d, a0[g]);
                    VSTORE(o + (g0 + g) * D + d + W, a1[g]);
                }
            }
            for (; d < D; d++)
                for (int g = 0; g < ng; g++) {
                    float a = o[(g0 + g) * D + d];
                    for (long jj = 0; jj < nb; jj++) a += sc[(g0 + g) * npad + jj] * vr[jj * vs + d];
                    o[(g0 + g) * D + d] = a;
                }
        }
    }
}

/* floats of decode workspace one thread needs */
static long dec_ws_thread(long H, long Hkv, long D) {
    const long G = H / Hkv;
    return G * D + 2 * DNB * D + G * ((DNB + W - 1) / W * W) + 16;
}

/* floats of partial results the jobs need at most (skv <= cap each) */
static long dec_ws_parts(long njobs, long cap, long H, long D) {
    return njobs * H * (D + 2) * ((cap + CH - 1) / CH);
}

/* every job's attention (module comment); 0, or -1 when the workspace is too small */
static int dec_run(const dec_cfg *c, const dec_job *jobs, long njobs, float *ws, long ws_floats,
                   int threads) {
    const long G = c->H / c->Hkv, D = c->D, psz = G * (D + 2);
    long ntask = 0, work = 0;
    for (long i = 0; i < njobs; i++) {
        ntask += c->Hkv * dec_chunks(c, jobs[i].skv);
        work += (jobs[i].skv - dec_lo(c, jobs[i].skv)) * c->H * D;
    }
    if (ntask == 0) return 0;
    if (work < (1L << 19)) threads = 1; /* a team costs more than it saves below this */
    const long parts = ntask * psz, per = dec_ws_thread(c->H, c->Hkv, D);
    if (parts > ws_floats) return -1;
    if (!(threads = rlx_ws_team(threads, ntask, per, ws_floats - parts))) return -1;
    float *pbase = ws, *tbase = ws + parts;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (long t = 0; t < ntask; t++) {
        long i = 0, first = 0;
        for (;; i++) {
            long n = c->Hkv * dec_chunks(c, jobs[i].skv);
            if (t < first + n) break;
            first += n;
        }
        const long nch = dec_chunks(c, jobs[i].skv), lo = dec_lo(c, jobs[i].skv);
        const long hk = (t - first) / nch, ch = (t - first) % nch;
        const long c0 = lo + ch * CH, c1 = c0 + CH < jobs[i].skv ? c0 + CH : jobs[i].skv;
        dec_task(c, jobs + i, hk, c0, c1, pbase + t * psz, rlx_ws_slice(tbase, per));
    }
    /* merge the chunks of each (job, kv head) in chunk order */
    long t = 0;
    for (long i = 0; i < njobs; i++) {
        const long nch = dec_chunks(c, jobs[i].skv);
        for (long hk = 0; hk < c->Hkv; hk++, t += nch) {
            for (long g = 0; g < G; g++) {
                float M = -INFINITY, L = 0.0f, wgt[64];
                const float *p0 = pbase + t * psz;
                for (long k = 0; k < nch; k++) {
                    float mk = p0[k * psz + G * D + g];
                    M = mk > M ? mk : M;
                }
                float *out = jobs[i].out + (hk * G + g) * D;
                for (long d = 0; d < D; d++) out[d] = 0.0f;
                for (long k0 = 0; k0 < nch; k0 += 64) {
                    const long kn = nch - k0 < 64 ? nch - k0 : 64;
                    for (long k = 0; k < kn; k++) {
                        const float *pk = p0 + (k0 + k) * psz;
                        float mk = pk[G * D + g];
                        wgt[k] = mk == -INFINITY ? 0.0f : (nch == 1 ? 1.0f : expf(mk - M));
                        L += pk[G * D + G + g] * wgt[k];
                        const float *ok = pk + g * D;
                        for (long d = 0; d < D; d++) out[d] += ok[d] * wgt[k];
                    }
                }
                const float inv = L > 0.0f ? 1.0f / L : 0.0f;
                for (long d = 0; d < D; d++) out[d] = rnd(L > 0.0f ? out[d] * inv : 0.0f);
            }
        }
    }
    return 0;
}

/* the start p of positions [S] (int64 when pos64, else int32), or -1 unless they are
 * p..p+S-1 with p >= 0 and p + S <= cap */
static long cache_start_c(const void *pos, int pos64, long S, long cap) {
    if (S == 0) return 0;
    long p = pos64 ? (long)((const int64_t *)pos)[0] : (long)((const int32_t *)pos)[0];
    if (p < 0 || p + S > cap) return -1;
    for (long i = 1; i < S; i++) {
        long x = pos64 ? (long)((const int64_t *)pos)[i] : (long)((const int32_t *)pos)[i];
        if (x != p + i) return -1;
    }
    return p;
}

static inline void put_rows(elt *dst, const float *src, long n) {
#if RLX_ATT_DT == 0
    memcpy(dst, src, sizeof(float) * n);
#else
    store_row(dst, src, n);
#endif
}

/* rlx_attention of S query rows (q f32, rows qs apart) over skv cache rows, into out */
static int prompt_attend(const float *q, const elt *kc, const elt *vc, float *out, long S,
                         long skv, long H, long Hkv, long D, float scale, float softcap,
                         long window, elt *qn, elt *on, float *ws, long ws_floats, int threads) {
    const int mt = window > 0 ? MASK_SLIDING : MASK_CAUSAL;
    if (S * skv * H * D < (1L << 18)) threads = 1;
#if RLX_ATT_DT == 0
    (void)qn;
    (void)on;
    return rlx_attention(q, kc, vc, out, 1, S, skv, H, Hkv, D, scale, softcap, mt, window, NULL,
                         0, 0, 0, 0, ws, ws_floats, threads);
#else
    const long n = S * H * D;
    store_row(qn, q, n);
    int rc = rlx_attention(qn, kc, vc, on, 1, S, skv, H, Hkv, D, scale, softcap, mt, window,
                           NULL, 0, 0, 0, 0, ws, ws_floats, threads);
    load_row(out, on, n);
    return rc;
#endif
}

/* floats of workspace the entries need for njobs decode rows / batch rows, cache length
 * cap and `threads` threads */
long rlx_cache_ws_floats(long njobs, long cap, long H, long Hkv, long D, int threads) {
    long t = threads > 0 ? threads : 1;
    long a = rlx_attention_ws_floats(D) * t;
    long d = dec_ws_parts(njobs, cap, H, D) + dec_ws_thread(H, Hkv, D) * t;
    return a > d ? a : d;
}

int rlx_cache_attention(const float *q, const float *k, const float *v, const void *pos,
                        int pos64, elt *kc, elt *vc, float *out, long B, long S, long cap,
                        long H, long Hkv, long D, float scale, float softcap, long window,
                        elt *qn, elt *on, float *ws, long ws_floats, int threads) {
    const long p = cache_start_c(pos, pos64, S, cap), rs = Hkv * D;
    if (p < 0) return 1;
    for (long b = 0; b < B; b++)
        for (long i = 0; i < S; i++) {
            put_rows(kc + (b * cap + p + i) * rs, k + (b * S + i) * rs, rs);
            put_rows(vc + (b * cap + p + i) * rs, v + (b * S + i) * rs, rs);
        }
    if (S == 0) return 0;
    if (S == 1) {
        dec_cfg c = {H, Hkv, D, 1, scale, softcap, window, 0};
        dec_job jobs[64];
        for (long b0 = 0; b0 < B; b0 += 64) {
            long n = B - b0 < 64 ? B - b0 : 64;
            for (long i = 0; i < n; i++) {
                long b = b0 + i;
                jobs[i] = (dec_job){q + b * H * D, out + b * H * D, kc + b * cap * rs,
                                    vc + b * cap * rs, NULL, NULL, p + 1};
            }
            if (dec_run(&c, jobs, n, ws, ws_floats, threads)) return -1;
        }
        return 0;
    }
    for (long b = 0; b < B; b++)
        if (prompt_attend(q + b * S * H * D, kc + b * cap * rs, vc + b * cap * rs,
                          out + b * S * H * D, S, p + S, H, Hkv, D, scale, softcap, window, qn,
                          on, ws, ws_floats, threads))
            return -1;
    return 0;
}

int rlx_slot_cache_attention(const float *q, const float *k, const float *v,
                             const int64_t *pos, const int64_t *slots, elt *kc, elt *vc,
                             float *out, long T, long nslots, long cap, long H, long Hkv,
                             long D, float scale, float softcap, long window, elt *qn, elt *on,
                             float *ws, long ws_floats, int threads) {
    const long rs = Hkv * D, hd = H * D;
    for (long t = 0; t < T; t++)
        if (slots[t] < 0 || slots[t] >= nslots || pos[t] < 0 || pos[t] >= cap) return 1;
    /* runs: [t0, t1) one slot at consecutive positions; no two runs may overlap */
    for (long a0 = 0; a0 < T;) {
        long a1 = a0 + 1;
        while (a1 < T && slots[a1] == slots[a0] && pos[a1] == pos[a1 - 1] + 1) a1++;
        for (long b0 = a1; b0 < T;) {
            long b1 = b0 + 1;
            while (b1 < T && slots[b1] == slots[b0] && pos[b1] == pos[b1 - 1] + 1) b1++;
            if (slots[b0] == slots[a0] && pos[b0] <= pos[a1 - 1] && pos[a0] <= pos[b1 - 1])
                return 1;
            b0 = b1;
        }
        a0 = a1;
    }
    for (long t = 0; t < T; t++) {
        put_rows(kc + (slots[t] * cap + pos[t]) * rs, k + t * rs, rs);
        put_rows(vc + (slots[t] * cap + pos[t]) * rs, v + t * rs, rs);
    }
    dec_cfg c = {H, Hkv, D, 1, scale, softcap, window, 0};
    dec_job jobs[64];
    long nj = 0;
    for (long a0 = 0; a0 < T;) {
        long a1 = a0 + 1;
        while (a1 < T && slots[a1] == slots[a0] && pos[a1] == pos[a1 - 1] + 1) a1++;
        const elt *kb = kc + slots[a0] * cap * rs, *vb = vc + slots[a0] * cap * rs;
        if (a1 - a0 == 1) {
            jobs[nj++] = (dec_job){q + a0 * hd, out + a0 * hd, kb, vb, NULL, NULL, pos[a0] + 1};
            if (nj == 64) {
                if (dec_run(&c, jobs, nj, ws, ws_floats, threads)) return -1;
                nj = 0;
            }
        } else if (prompt_attend(q + a0 * hd, kb, vb, out + a0 * hd, a1 - a0, pos[a1 - 1] + 1,
                                 H, Hkv, D, scale, softcap, window, qn ? qn + a0 * hd : NULL,
                                 on ? on + a0 * hd : NULL, ws, ws_floats, threads)) {
            return -1;
        }
        a0 = a1;
    }
    if (nj && dec_run(&c, jobs, nj, ws, ws_floats, threads)) return -1;
    return 0;
}

/* x's n values (one group) quantized into dst as quantize_heads does; returns the scale */
static float quant_group(int8_t *dst, const float *x, long n) {
    float mx = 0.0f;
    for (long i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        mx = a > mx ? a : mx;
    }
    const float s = mx / 127.0f, safe = s > 0.0f ? s : 1.0f;
    for (long i = 0; i < n; i++) {
        float r = nearbyintf(x[i] / safe);
        r = r < -127.0f ? -127.0f : (r > 127.0f ? 127.0f : r);
        dst[i] = (int8_t)r;
    }
    return s;
}

/* the int8 cache (module comment); only the f32 library runs it (-1 in the others) */
int rlx_cache_attention_i8(const float *q, const float *k, const float *v, const void *pos,
                           int pos64, int8_t *kc, int8_t *vc, float *ksc, float *vsc,
                           long groups, float *out, long B, long S, long cap, long H, long Hkv,
                           long D, float scale, float softcap, long window, float *kf,
                           float *vf_, float *ws, long ws_floats, int threads) {
#if RLX_ATT_DT != 0
    (void)q, (void)k, (void)v, (void)pos, (void)pos64, (void)kc, (void)vc, (void)ksc, (void)vsc;
    (void)groups, (void)out, (void)B, (void)S, (void)cap, (void)H, (void)Hkv, (void)D;
    (void)scale, (void)softcap, (void)window, (void)kf, (void)vf_, (void)ws, (void)ws_floats;
    (void)threads, (void)quant_group;
    return -1;
#else
    const long p = cache_start_c(pos, pos64, S, cap), rs = Hkv * D, gs = rs / groups;
    if (p < 0) return 1;
    for (long b = 0; b < B; b++)
        for (long i = 0; i < S; i++) {
            const long row = b * cap + p + i, src = (b * S + i) * rs;
            for (long g = 0; g < groups; g++) {
                ksc[row * groups + g] = quant_group(kc + row * rs + g * gs, k + src + g * gs, gs);
                vsc[row * groups + g] = quant_group(vc + row * rs + g * gs, v + src + g * gs, gs);
            }
        }
    if (S == 0) return 0;
    if (S == 1) {
        dec_cfg c = {H, Hkv, D, groups, scale, softcap, window, 1};
        dec_job jobs[64];
        for (long b0 = 0; b0 < B; b0 += 64) {
            long n = B - b0 < 64 ? B - b0 : 64;
            for (long i = 0; i < n; i++) {
                long b = b0 + i;
                jobs[i] = (dec_job){q + b * H * D, out + b * H * D, kc + b * cap * rs,
                                    vc + b * cap * rs, ksc + b * cap * groups,
                                    vsc + b * cap * groups, p + 1};
            }
            if (dec_run(&c, jobs, n, ws, ws_floats, threads)) return -1;
        }
        return 0;
    }
    for (long b = 0; b < B; b++) {
        const long r0 = b * cap;
        for (long r = r0; r < r0 + p + S; r++)
            for (long i = 0; i < rs; i++) {
                kf[r * rs + i] = (float)kc[r * rs + i] * ksc[r * groups + i / gs];
                vf_[r * rs + i] = (float)vc[r * rs + i] * vsc[r * groups + i / gs];
            }
        if (prompt_attend(q + b * S * H * D, kf + r0 * rs, vf_ + r0 * rs, out + b * S * H * D,
                          S, p + S, H, Hkv, D, scale, softcap, window, NULL, NULL, ws,
                          ws_floats, threads))
            return -1;
    }
    return 0;
#endif
}
