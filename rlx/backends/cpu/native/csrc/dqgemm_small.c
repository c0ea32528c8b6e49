/* dqgemm part 5 of 7 (see dqgemm.c): small batches, 2 <= M <= SMALL_M (batched decode:
 * one row of X per sequence). Each weight row is decoded once per call, SMALL_K weights
 * at a time, into an L1 buffer (vector decoders for Q8_0, Q5_0, Q4_K and Q6_K, the exact
 * scalar decode_block for the rest), and every decoded vector is applied to all M rows
 * of X: two weight rows per pass share each X load, SMALL_G X rows at a time, one vector
 * accumulator per (weight row, X row) kept in registers over the row (Gemma's K <= 2048
 * is one step). The weight is read and decoded once for the M rows, where the per-row
 * GEMV would decode it M times and the tiled GEMM transposes it into tiles. The decoded
 * values are those of decode_block (the same f32 operations in the same order; the build
 * has -ffp-contract=off); the products are f32 FMAs (f32 accumulation). Threads: OpenMP
 * over pairs of weight rows, with the GEMV's grain. */

#ifndef SMALL_M
#define SMALL_M 16 /* the most X rows this path takes (dqgemm.py: SMALL_MAX_M) */
#endif
#define SMALL_K 2048 /* weights of a row decoded per step (8 KB of f32 per row) */
/* X rows per pass over the decoded buffer: two weight rows x SMALL_G accumulators fit the
 * 32 zmm registers of AVX-512 (8) or the 16 ymm of AVX2 (4) */
#if VW == 16
#define SMALL_G 8
#else
#define SMALL_G 4
#endif

#if FUSED
#if VW == 16
#define VSUBF(a, b) _mm512_sub_ps(a, b)
#else
#define VSUBF(a, b) _mm256_sub_ps(a, b)
#endif

static void dec_q8_0(const uint8_t *p, long st, long nblk, float *o) {
    for (long b = 0; b < nblk; b++, p += st, o += 32) {
        vf d = VSET1(h2f(p));
        for (int v = 0; v < 32; v += VW) VSTORE(o + v, VMUL(VCVT(VI8(p + 2 + v)), d));
    }
}

static void dec_q5_0(const uint8_t *p, long st, long nblk, float *o) {
    const vi m15 = VISET1(15), one = VISET1(1), c16 = VISET1(16), lanes = VLANES();
    for (long b = 0; b < nblk; b++, p += st, o += 32) {
        uint32_t qh;
        memcpy(&qh, p + 2, 4);
        const vi hv = VISET1((int)qh);
        vf d = VSET1(h2f(p));
        for (int v = 0; v < 16; v += VW) {
            vi q = VU8(p + 6 + v);
            vi bl = VIAND(VISRLV(hv, VIOR(lanes, VISET1(v))), one);
            vi bh = VIAND(VISRLV(hv, VIOR(lanes, VISET1(v + 16))), one);
            vi lo = VISUB(VIOR(VIAND(q, m15), VISLL(bl, 4)), c16);
            vi hi = VISUB(VIOR(VISRL(q, 4), VISLL(bh, 4)), c16);
            VSTORE(o + v, VMUL(d, VCVT(lo)));
            VSTORE(o + 16 + v, VMUL(d, VCVT(hi)));
        }
    }
}

static void dec_q4_k(const uint8_t *p, long st, long nblk, float *o) {
    const vi m15 = VISET1(15);
    for (long b = 0; b < nblk; b++, p += st, o += 256) {
        float d = h2f(p), dmin = h2f(p + 2);
        const uint8_t *q = p + 4, *ql = p + 16;
        for (int j = 0; j < 8; j++) {
            int scj, mj;
            if (j < 4) {
                scj = q[j] & 63;
                mj = q[j + 4] & 63;
            } else {
                scj = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
                mj = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
            }
            vf d1 = VSET1(d * (float)scj), m1 = VSET1(dmin * (float)mj);
            const uint8_t *c = ql + (j >> 1) * 32;
            for (int l = 0; l < 32; l += VW) {
                vi w = VU8(c + l);
                vi qv = (j & 1) ? VISRL(w, 4) : VIAND(w, m15);
                VSTORE(o + j * 32 + l, VSUBF(VMUL(d1, VCVT(qv)), m1));
            }
        }
    }
}

static void dec_q6_k(const uint8_t *p, long st, long nblk, float *o) {
    const __m256i c32 = _mm256_set1_epi8(32);
    float dsc[16];
    for (long b = 0; b < nblk; b++, p += st, o += 256) {
        __m256 s_lo, s_hi;
        q6k_scales(p, h2f(p + 208), &s_lo, &s_hi);
        _mm256_storeu_ps(dsc, s_lo);
        _mm256_storeu_ps(dsc + 8, s_hi);
        for (int h = 0; h < 2; h++) {
            q6k_half_t half = q6k_half(p, h);
            for (int g = 0; g < 4; g++) {
                __m256i q = _mm256_sub_epi8(q6k_codes(half, g), c32);
                float *og = o + h * 128 + g * 32;
                for (int v = 0; v < 32; v += VW)
                    VSTORE(og + v,
                           VMUL(VSET1(dsc[h * 8 + g * 2 + v / 16]), VCVT(VI8R(part32(q, v)))));
            }
        }
    }
}

/* blocks b0 .. b0 + nblk of row n (any layout R) into out, as decode_blocks */
static void decode_fast(const dq_t *s, long n, long b0, long nblk, float *out) {
    long st = dq_bst(s, n);
    const uint8_t *p = dq_row(s, n) + b0 * st;
    switch (s->code) {
    case S_Q8_0: dec_q8_0(p, st, nblk, out); break;
    case S_Q5_0: dec_q5_0(p, st, nblk, out); break;
    case S_Q4_K: dec_q4_k(p, st, nblk, out); break;
    case S_Q6_K: dec_q6_k(p, st, nblk, out); break;
    default: decode_blocks(s, n, b0, nblk, out);
    }
}

/* a[i] = (first ? 0 : acc[i]) + w[0 .. len) * x[i * ldx + 0 .. len) lane-wise for i < mr,
 * and with two weight rows b[i] likewise with w2, sharing the X loads; then with last the
 * sums go to y[i * ldy] (and y[i * ldy + 1]), else back to acc (acc[SMALL_G + i] for b).
 * mr, two are constants once inlined (the accumulators stay in registers); len is a
 * multiple of VW */
static inline __attribute__((always_inline)) void dot_rows(const float *restrict w,
                                                            const float *restrict w2,
                                                            const float *x, long ldx, long len,
                                                            int mr, int two, vf *acc, int first,
                                                            int last, float *y, long ldy) {
    vf a[SMALL_G], b[SMALL_G];
    for (int i = 0; i < mr; i++) {
        a[i] = first ? VZERO() : acc[i];
        b[i] = two && !first ? acc[SMALL_G + i] : VZERO();
    }
    for (long v = 0; v < len; v += VW) {
        vf wv = VLOAD(w + v), wv2 = two ? VLOAD(w2 + v) : VZERO();
        for (int i = 0; i < mr; i++) {
            vf xv = VLOAD(x + i * ldx + v);
            a[i] = VFMA(wv, xv, a[i]);
            if (two) b[i] = VFMA(wv2, xv, b[i]);
        }
    }
    for (int i = 0; i < mr; i++) {
        if (last) {
            y[i * ldy] = vhsum(a[i]);
            if (two) y[i * ldy + 1] = vhsum(b[i]);
        } else {
            acc[i] = a[i];
            if (two) acc[SMALL_G + i] = b[i];
        }
    }
}

#define DOT_CASES(two)                                                                       \
    switch (mr) {                                                                            \
    case 1: dot_rows(w, w2, x, ldx, len, 1, two, acc, first, last, y, ldy); break;           \
    case 2: dot_rows(w, w2, x, ldx, len, 2, two, acc, first, last, y, ldy); break;           \
    case 3: dot_rows(w, w2, x, ldx, len, 3, two, acc, first, last, y, ldy); break;           \
    DOT_WIDE(two)                                                                            \
    default: dot_rows(w, w2, x, ldx, len, SMALL_G, two, acc, first, last, y, ldy);           \
    }
#if SMALL_G == 8
#define DOT_WIDE(two)                                                                        \
    case 4: dot_rows(w, w2, x, ldx, len, 4, two, acc, first, last, y, ldy); break;           \
    case 5: dot_rows(w, w2, x, ldx, len, 5, two, acc, first, last, y, ldy); break;           \
    case 6: dot_rows(w, w2, x, ldx, len, 6, two, acc, first, last, y, ldy); break;           \
    case 7: dot_rows(w, w2, x, ldx, len, 7, two, acc, first, last, y, ldy); break;
#else
#define DOT_WIDE(two)
#endif

/* up to SMALL_G X rows against one (w2 == 0) or two decoded weight rows */
static void dot_group(const float *w, const float *w2, const float *x, long ldx, long len,
                      int mr, vf *acc, int first, int last, float *y, long ldy) {
    if (w2) {
        DOT_CASES(1)
    } else {
        DOT_CASES(0)
    }
}

/* whether this path takes scheme s at M rows: the vector decoders at 2 <= M <= SMALL_M;
 * other layouts whose blocks are whole vectors from M = 4 (below, their fused GEMV rows
 * are faster than the scalar decode here) */
static int small_ok(const dq_t *s, long M) {
    if (M < 2 || M > SMALL_M || s->qk % VW) return 0;
    switch (s->code) {
    case S_Q8_0: case S_Q5_0: case S_Q4_K: case S_Q6_K: return 1;
    default: return M >= 4;
    }
}

static int gemv_small(const dq_t *s, long M, long N, long K, const float *x, long ldx,
                      float *y, long ldy, int threads) {
    long cb = SMALL_K / s->qk < 1 ? 1 : SMALL_K / s->qk;
    if (cb > s->nb) cb = s->nb;
    long per = 262144, want = (N * s->row_bytes + per - 1) / per; /* as the GEMV's grain */
    if (want < threads) threads = want < 1 ? 1 : (int)want;
    long chunk = 32768 / s->row_bytes;
    if (chunk < 1) chunk = 1;
    int fail = 0;
    (void)K;
    long pairs = (N + 1) / 2, pchunk = chunk / 2 < 1 ? 1 : chunk / 2;
#pragma omp parallel num_threads(threads) reduction(| : fail)
    {
        long clen = cb * s->qk;
        float *buf = alloc_f(2 * clen);
        if (!buf) fail = 1;
        else {
            prefetcher pf = {0, 0};
            /* per group of SMALL_G X rows: the first weight row's accumulators, then the
             * second's */
            vf acc[2 * SMALL_M];
#pragma omp for schedule(dynamic, pchunk)
            for (long pr = 0; pr < pairs; pr++) {
                long n = 2 * pr;
                int two = n + 1 < N;
                prefetch_rows(s, &pf, n);
                if (two) prefetch_rows(s, &pf, n + 1);
                for (long b0 = 0; b0 < s->nb; b0 += cb) {
                    long nblk = s->nb - b0 < cb ? s->nb - b0 : cb, off = b0 * s->qk;
                    int first = b0 == 0, last = b0 + nblk >= s->nb;
                    decode_fast(s, n, b0, nblk, buf);
                    if (two) decode_fast(s, n + 1, b0, nblk, buf + clen);
                    for (long m0 = 0; m0 < M; m0 += SMALL_G) {
                        int mr = (int)(M - m0 < SMALL_G ? M - m0 : SMALL_G);
                        dot_group(buf, two ? buf + clen : 0, x + m0 * ldx + off, ldx,
                                  nblk * s->qk, mr, acc + 2 * m0, first, last,
                                  y + m0 * ldy + n, ldy);
                    }
                }
            }
            free(buf);
        }
    }
    return fail;
}
#elif defined(__aarch64__) && defined(__ARM_NEON) /* the same on NEON (dqgemm_neon.h) */
#define DQ_NEON_PART 7
#include "dqgemm_neon.h"
#undef DQ_NEON_PART
#else
static int small_ok(const dq_t *s, long M) {
    (void)s;
    (void)M;
    return 0;
}
static int gemv_small(const dq_t *s, long M, long N, long K, const float *x, long ldx,
                      float *y, long ldy, int threads) {
    (void)s, (void)M, (void)N, (void)K, (void)x, (void)ldx, (void)y, (void)ldy, (void)threads;
    return 2;
}
#endif

/* 1 when M rows of scheme `code` (block size qk) take this small-batch path */
int rlx_dq_small(int code, long qk, long M) {
    dq_t s = {code, qk, 0, 0, 0, 0, 0, 0, 0};
    return small_ok(&s, M);
}
