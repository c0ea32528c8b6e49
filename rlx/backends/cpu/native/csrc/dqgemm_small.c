/* dqgemm part 5 of 7 (see dqgemm.c): small batches, 2 <= M <= SMALL_M (batched decode:
 * one row of X per sequence). A register-tiled group kernel: SMALL_NR = 3 weight rows
 * (consecutive rows, so with the interleaved layout (dq_layout.h) one
 * stream through the group's blocks) are decoded once per call, SMALL_K weights at a time,
 * into an L1 buffer (vector decoders for Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, Q4_K and Q6_K, the
 * exact scalar decode_block for the rest), and the tile of SMALL_NR weight rows x SMALL_G
 * X rows (8 on AVX-512, 4 on AVX2) accumulates in registers over the row (Gemma's
 * K <= 2048 is one step): each weight vector is loaded once for the SMALL_G X rows, each
 * X vector once for the SMALL_NR weight rows, and the SMALL_NR x SMALL_G sums leave
 * through one transposing reduction tree per vector width (vsums). The weight is read and
 * decoded once for the M rows, where the per-row GEMV would decode it M times and the
 * tiled GEMM transposes it into tiles. The decoded values are those of decode_block (the
 * same f32 operations in the same order; the build has -ffp-contract=off); the products
 * are f32 FMAs (f32 accumulation). Threads: OpenMP over units of SMALL_NR weight rows,
 * with the GEMV's grain divided by M / 2. */

#ifndef SMALL_M
#define SMALL_M 16 /* the most X rows this path takes (dqgemm.py: SMALL_MAX_M) */
#endif
#define SMALL_K 2048 /* weights of a row decoded per step (8 KB of f32 per row) */
/* The register tile: SMALL_NR decoded weight rows x SMALL_G X rows of vector accumulators
 * (plus the SMALL_NR weight vectors and one X vector) within the 32 zmm registers of
 * AVX-512 or the 16 ymm of AVX2 */
#if VW == 16
#ifndef SMALL_NR
#define SMALL_NR 3
#endif
#define SMALL_G 8
#else
#ifndef SMALL_NR
#define SMALL_NR 3
#endif
#define SMALL_G 4
#endif
#define SMALL_ACC (SMALL_NR * SMALL_G)
#define SMALL_RED ((SMALL_ACC + VW - 1) / VW * VW) /* rounded up to whole vsums trees */

#if FUSED
#if VW == 16
#define VSUBF(a, b) _mm512_sub_ps(a, b)
#define VADDF(a, b) _mm512_add_ps(a, b)
#else
#define VSUBF(a, b) _mm256_sub_ps(a, b)
#define VADDF(a, b) _mm256_add_ps(a, b)
#endif

static void dec_q8_0(const uint8_t *p, long st, long nblk, float *o) {
    for (long b = 0; b < nblk; b++, p += st, o += 32) {
        vf d = VSET1(hf(p));
        for (int v = 0; v < 32; v += VW) VSTORE(o + v, VMUL(VCVT(VI8(p + 2 + v)), d));
    }
}

#if VW == 16
/* AVX-512: qh's 32 bits are the lane masks of the two halves: (q & 15) - 16 where the
 * fifth bit is clear, q & 15 where it is set (the same integer as decode_block's) */
static void dec_q5_0(const uint8_t *p, long st, long nblk, float *o) {
    const vi m15 = VISET1(15), c16 = VISET1(16);
    for (long b = 0; b < nblk; b++, p += st, o += 32) {
        uint32_t qh;
        memcpy(&qh, p + 2, 4);
        vf d = VSET1(hf(p));
        vi q = VU8(p + 6), lo = VIAND(q, m15), hi = VISRL(q, 4);
        lo = _mm512_mask_sub_epi32(lo, (__mmask16)~qh, lo, c16);
        hi = _mm512_mask_sub_epi32(hi, (__mmask16)~(qh >> 16), hi, c16);
        VSTORE(o, VMUL(d, VCVT(lo)));
        VSTORE(o + 16, VMUL(d, VCVT(hi)));
    }
}
#else
static void dec_q5_0(const uint8_t *p, long st, long nblk, float *o) {
    const vi m15 = VISET1(15), one = VISET1(1), c16 = VISET1(16), lanes = VLANES();
    for (long b = 0; b < nblk; b++, p += st, o += 32) {
        uint32_t qh;
        memcpy(&qh, p + 2, 4);
        const vi hv = VISET1((int)qh);
        vf d = VSET1(hf(p));
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
#endif

static void dec_q4_k(const uint8_t *p, long st, long nblk, float *o) {
    const vi m15 = VISET1(15);
    for (long b = 0; b < nblk; b++, p += st, o += 256) {
        float d = hf(p), dmin = hf(p + 2);
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
        q6k_scales(p, hf(p + 208), &s_lo, &s_hi);
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

/* Q4_0 / Q4_1 / Q5_1 (32-weight blocks): d (q - 8); d q + m; d q + m with the fifth bit
 * from qh, as decode_block */
static void dec_q4_01(const uint8_t *p, long st, long nblk, float *o, int one) {
    const vi m15 = VISET1(15), c8 = VISET1(8);
    for (long b = 0; b < nblk; b++, p += st, o += 32) {
        vf d = VSET1(hf(p)), m = VSET1(one ? hf(p + 2) : 0.0f);
        const uint8_t *qs = p + 2 + 2 * one;
        for (int v = 0; v < 16; v += VW) {
            vi q = VU8(qs + v), lo = VIAND(q, m15), hi = VISRL(q, 4);
            if (one) {
                VSTORE(o + v, VADDF(VMUL(d, VCVT(lo)), m));
                VSTORE(o + 16 + v, VADDF(VMUL(d, VCVT(hi)), m));
            } else {
                VSTORE(o + v, VMUL(d, VCVT(VISUB(lo, c8))));
                VSTORE(o + 16 + v, VMUL(d, VCVT(VISUB(hi, c8))));
            }
        }
    }
}

#if VW == 16
static void dec_q5_1(const uint8_t *p, long st, long nblk, float *o) {
    const vi m15 = VISET1(15), c16 = VISET1(16);
    for (long b = 0; b < nblk; b++, p += st, o += 32) {
        uint32_t qh;
        memcpy(&qh, p + 4, 4);
        vf d = VSET1(hf(p)), m = VSET1(hf(p + 2));
        vi q = VU8(p + 8), lo = VIAND(q, m15), hi = VISRL(q, 4);
        lo = _mm512_mask_or_epi32(lo, (__mmask16)qh, lo, c16); /* the fifth bit by mask */
        hi = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, c16);
        VSTORE(o, VADDF(VMUL(d, VCVT(lo)), m));
        VSTORE(o + 16, VADDF(VMUL(d, VCVT(hi)), m));
    }
}
#else
static void dec_q5_1(const uint8_t *p, long st, long nblk, float *o) {
    const vi m15 = VISET1(15), one = VISET1(1), lanes = VLANES();
    for (long b = 0; b < nblk; b++, p += st, o += 32) {
        uint32_t qh;
        memcpy(&qh, p + 4, 4);
        const vi hv = VISET1((int)qh);
        vf d = VSET1(hf(p)), m = VSET1(hf(p + 2));
        for (int v = 0; v < 16; v += VW) {
            vi q = VU8(p + 8 + v);
            vi bl = VIAND(VISRLV(hv, VIOR(lanes, VISET1(v))), one);
            vi bh = VIAND(VISRLV(hv, VIOR(lanes, VISET1(v + 16))), one);
            vi lo = VIOR(VIAND(q, m15), VISLL(bl, 4));
            vi hi = VIOR(VISRL(q, 4), VISLL(bh, 4));
            VSTORE(o + v, VADDF(VMUL(d, VCVT(lo)), m));
            VSTORE(o + 16 + v, VADDF(VMUL(d, VCVT(hi)), m));
        }
    }
}
#endif

/* blocks b0 .. b0 + nblk of row n (any layout R) into out, as decode_blocks */
static void decode_fast(const dq_t *s, long n, long b0, long nblk, float *out) {
    long st = dq_bst(s, n);
    const uint8_t *p = dq_row(s, n) + b0 * st;
    switch (s->code) {
    case S_Q8_0: dec_q8_0(p, st, nblk, out); break;
    case S_Q5_0: dec_q5_0(p, st, nblk, out); break;
    case S_Q4_0: dec_q4_01(p, st, nblk, out, 0); break;
    case S_Q4_1: dec_q4_01(p, st, nblk, out, 1); break;
    case S_Q5_1: dec_q5_1(p, st, nblk, out); break;
    case S_Q4_K: dec_q4_k(p, st, nblk, out); break;
    case S_Q6_K: dec_q6_k(p, st, nblk, out); break;
    default: decode_blocks(s, n, b0, nblk, out);
    }
}

/* out[j] = the horizontal sum of v[j] for VW vectors v: a transposing tree of unpacks /
 * lane shuffles and adds (15 adds for 16 vectors, where 16 separate reductions take 64
 * dependent ops) */
static inline __attribute__((always_inline)) void vsums(const vf *v, float *out) {
#if VW == 16
    __m512 u[8], w[4], z[2];
    for (int j = 0; j < 8; j++)
        u[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]),
                             _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
    for (int j = 0; j < 4; j++) {
        __m512d a = _mm512_castps_pd(u[2 * j]), b = _mm512_castps_pd(u[2 * j + 1]);
        w[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int j = 0; j < 2; j++) /* lanes (0 + 1, 2 + 3) of each */
        z[j] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0xDD));
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88),
                                        _mm512_shuffle_f32x4(z[0], z[1], 0xDD)));
#elif VW == 8 && defined(__AVX2__)
    __m256 u[4], w[2];
    for (int j = 0; j < 4; j++)
        u[j] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * j], v[2 * j + 1]),
                             _mm256_unpackhi_ps(v[2 * j], v[2 * j + 1]));
    for (int j = 0; j < 2; j++) {
        __m256d a = _mm256_castps_pd(u[2 * j]), b = _mm256_castps_pd(u[2 * j + 1]);
        w[j] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(w[0], w[1], 0x20),
                                        _mm256_permute2f128_ps(w[0], w[1], 0x31)));
#else
    for (int j = 0; j < VW; j++) out[j] = vhsum(v[j]);
#endif
}

/* The register tile: nr <= SMALL_NR decoded weight rows (w + r * ldw) x mr <= SMALL_G X
 * rows (x + i * ldx), len weights (a multiple of VW). Each X vector is loaded once and
 * FMAs into the nr accumulators of its row, each weight vector into the mr of its row.
 * first: the accumulators start at zero, else from acc[r * SMALL_G + i]; last: their
 * horizontal sums go to y[i * ldy + r] (one transposing tree for every VW of them), else
 * back to acc. mr and nr are constants once inlined. */
static inline __attribute__((always_inline)) void tile(const float *restrict w, long ldw,
                                                       const float *x, long ldx, long len,
                                                       int mr, int nr, vf *acc, int first,
                                                       int last, float *y, long ldy) {
    vf a[SMALL_ACC];
#pragma GCC unroll 32
    for (int j = 0; j < SMALL_ACC; j++)
        a[j] = first || j / SMALL_G >= nr || j % SMALL_G >= mr ? VZERO() : acc[j];
    for (long v = 0; v < len; v += VW) {
        vf wv[SMALL_NR];
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) wv[r] = VLOAD(w + r * ldw + v);
#pragma GCC unroll 16
        for (int i = 0; i < mr; i++) {
            vf xv = VLOAD(x + i * ldx + v);
#if defined(__x86_64__)
            /* one load kept in a register for the nr FMAs (gcc would fold it into each:
             * nr times the loads) */
            __asm__("" : "+v"(xv));
#endif
#pragma GCC unroll 8
            for (int r = 0; r < nr; r++)
                a[r * SMALL_G + i] = VFMA(wv[r], xv, a[r * SMALL_G + i]);
        }
    }
    if (!last) {
#pragma GCC unroll 32
        for (int j = 0; j < SMALL_ACC; j++) acc[j] = a[j];
        return;
    }
    float sum[SMALL_RED];
#pragma GCC unroll 4
    for (int c = 0; c < SMALL_RED / VW; c++) {
        vf part[VW];
#pragma GCC unroll 16
        for (int j = 0; j < VW; j++) part[j] = c * VW + j < SMALL_ACC ? a[c * VW + j] : VZERO();
        vsums(part, sum + c * VW);
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < mr; i++) y[i * ldy + r] = sum[r * SMALL_G + i];
}

/* one tile with run-time mr (1 .. SMALL_G) and nr (1 .. SMALL_NR) as constants */
#define TILE_ARGS w, ldw, x, ldx, len
#define TILE_NR(MR)                                                                          \
    switch (nr) {                                                                            \
    case SMALL_NR: tile(TILE_ARGS, MR, SMALL_NR, acc, first, last, y, ldy); break;           \
    case 1: tile(TILE_ARGS, MR, 1, acc, first, last, y, ldy); break;                         \
    TILE_NR_MID(MR)                                                                          \
    }
#if SMALL_NR >= 3
#define TILE_NR_MID(MR)                                                                      \
    case 2: tile(TILE_ARGS, MR, 2, acc, first, last, y, ldy); break;
#else
#define TILE_NR_MID(MR)
#endif

static void tile_any(const float *w, long ldw, const float *x, long ldx, long len, int mr,
                     int nr, vf *acc, int first, int last, float *y, long ldy) {
    switch (mr) {
    case 1: TILE_NR(1) break;
    case 2: TILE_NR(2) break;
    case 3: TILE_NR(3) break;
#if SMALL_G > 4
    case 4: TILE_NR(4) break;
    case 5: TILE_NR(5) break;
#endif
#if SMALL_G > 6
    case 6: TILE_NR(6) break;
    case 7: TILE_NR(7) break;
#endif
    default: TILE_NR(SMALL_G) break;
    }
}

/* whether this path takes scheme s at M rows: the vector decoders at 2 <= M <= SMALL_M;
 * other layouts whose blocks are whole vectors from M = 4 (below, their fused GEMV rows
 * are faster than the scalar decode here) */
static int small_ok(const dq_t *s, long M) {
    if (M < 2 || M > SMALL_M || s->qk % VW) return 0;
    switch (s->code) {
    case S_Q8_0: case S_Q5_0: case S_Q4_0: case S_Q4_1: case S_Q5_1: case S_Q4_K:
    case S_Q6_K: return 1;
    default: return M >= 4;
    }
}

static int gemv_small(const dq_t *s, long M, long N, long K, const float *x, long ldx,
                      float *y, long ldy, int threads) {
    long cb = SMALL_K / s->qk < 1 ? 1 : SMALL_K / s->qk;
    if (cb > s->nb) cb = s->nb;
    /* grain as the GEMV's (~256 KB of weight per thread), scaled down by the M rows each
     * weight byte serves: a second thread is worth waking for less weight */
    long per = 262144 * 2 / M, want = (N * s->row_bytes + per - 1) / per;
    if (want < threads) threads = want < 1 ? 1 : (int)want;
    long chunk = 32768 / s->row_bytes;
    if (chunk < 1) chunk = 1;
    int fail = 0;
    (void)K;
    long units = (N + SMALL_NR - 1) / SMALL_NR;
    long uchunk = chunk / SMALL_NR < 1 ? 1 : chunk / SMALL_NR;
#pragma omp parallel num_threads(threads) reduction(| : fail)
    {
        long clen = cb * s->qk;
        float *buf = alloc_f(SMALL_NR * clen);
        if (!buf) fail = 1;
        else {
            prefetcher pf = {0, 0};
            /* per group of SMALL_G X rows: SMALL_ACC accumulators (K over several steps) */
            vf acc[(SMALL_M + SMALL_G - 1) / SMALL_G * SMALL_ACC];
#pragma omp for schedule(dynamic, uchunk)
            for (long u = 0; u < units; u++) {
                long n = u * SMALL_NR;
                int nr = (int)(N - n < SMALL_NR ? N - n : SMALL_NR);
                for (int r = 0; r < nr; r++) prefetch_rows(s, &pf, n + r);
                for (long b0 = 0; b0 < s->nb; b0 += cb) {
                    long nblk = s->nb - b0 < cb ? s->nb - b0 : cb, off = b0 * s->qk;
                    int first = b0 == 0, last = b0 + nblk >= s->nb;
                    for (int r = 0; r < nr; r++) decode_fast(s, n + r, b0, nblk, buf + r * clen);
                    for (long m0 = 0; m0 < M; m0 += SMALL_G) {
                        int mr = (int)(M - m0 < SMALL_G ? M - m0 : SMALL_G);
                        tile_any(buf, clen, x + m0 * ldx + off, ldx, nblk * s->qk, mr, nr,
                                 acc + m0 / SMALL_G * SMALL_ACC, first, last, y + m0 * ldy + n,
                                 ldy);
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
