/* dqgemm part 7 of 7 (see dqgemm.c): the int8-activation GEMV (M = 1) on weights whose rows
 * are interleaved by R = 4 or 8 (dq_layout.h), for the 32-weight GGUF layouts (Q8_0, Q4_0,
 * Q5_0, Q4_1, Q5_1).
 *
 * In a group of R rows, block b of rows 0 .. R - 1 is R consecutive blocks, so eight
 * consecutive blocks of the stream are 8 / R blocks of the R rows ("slots": slot i is row
 * i % R, block b + i / R, at p + i bb, a constant offset). Per step the eight slots' integer
 * dot products (q8r_dot, the activation block loaded once for the R rows) are reduced to
 * one vector of 8 sums (hsum8x8) and scaled by one FMA with the slots' d times dx (the
 * eight f16 d in one vcvtph2ps); the mins (Q4_1 / Q5_1: m dx sum xq; Q4_0 / Q5_0 read as
 * unsigned codes: -8 d / -16 d times dx sum xq) by another. One vector accumulator per
 * group: no horizontal sum per row, one fold of the 8 / R lanes of each row at the end.
 * Products and error bound as q8_row32's (the top of dqgemm_q8.c). */

#if VW >= 8
static int q8_group_ok(const dq_t *s, long M) {
    if (M != 1 || s->R < 4) return 0;
    switch (s->code) {
    case S_Q8_0: case S_Q4_0: case S_Q5_0: case S_Q4_1: case S_Q5_1: return 1;
    default: return 0;
    }
}

/* y[0 .. G) for the G interleaved rows whose group starts at p (nb blocks of bb bytes per
 * row); xq, dx, s32: quant_x of x */
static inline __attribute__((always_inline)) void q8_group(int code, int G, const uint8_t *p,
                                                           long bb, long nb, const int8_t *xq,
                                                           const float *dx, const float *s32,
                                                           float *y) {
    __m256 acc = _mm256_setzero_ps(), macc = acc;
    int mins = !(code == S_Q8_0 || code == S_Q4_0 || code == S_Q5_0);
    int per = 8 / G; /* blocks per step */
    const __m256 off = _mm256_set1_ps(code == S_Q4_0 ? -8.0f : -16.0f);
    for (long b = 0; b < nb; b += per, p += 8 * bb, xq += 32 * per) {
        int slots = nb - b >= per ? 8 : G; /* the last block alone (G = 4, nb odd) */
        for (long o = 0; o < 8 * bb; o += 64) __builtin_prefetch(p + PF_AHEAD + o, 0, 3);
        __m256i v[8];
        float m;
        /* the slots' f16 scales / mins gathered in memory, then one load each (a lane
         * index of _mm_insert_epi16 must be a constant: clang does not unroll for it) */
        uint16_t dl[8] = {0}, ml[8] = {0};
        for (int i = 0; i < 8; i++) {
            if (i < slots) {
                v[i] = q8r_dot(code, p + i * bb, xq + 32 * (i / G), &m, 1);
                memcpy(&dl[i], p + i * bb, 2);
                if (mins) memcpy(&ml[i], p + i * bb + 2, 2);
            } else v[i] = _mm256_setzero_si256();
        }
        const __m128i dh = _mm_loadu_si128((const __m128i *)dl);
        const __m128i mh = _mm_loadu_si128((const __m128i *)ml);
        __m256 dxv, sv;
        if (G == 8) {
            dxv = _mm256_set1_ps(dx[b]);
            sv = _mm256_set1_ps(s32[b]);
        } else {
            float d1 = slots == 8 ? dx[b + 1] : 0.0f, s1 = slots == 8 ? s32[b + 1] : 0.0f;
            dxv = _mm256_setr_m128(_mm_set1_ps(dx[b]), _mm_set1_ps(d1));
            sv = _mm256_setr_m128(_mm_set1_ps(s32[b]), _mm_set1_ps(s1));
        }
        __m256 d = _mm256_cvtph_ps(dh);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8x8(v)), _mm256_mul_ps(d, dxv), acc);
        if (mins) macc = _mm256_fmadd_ps(_mm256_cvtph_ps(mh), sv, macc);
        if (code == S_Q4_0 || code == S_Q5_0)
            macc = _mm256_fmadd_ps(_mm256_mul_ps(off, d), sv, macc);
    }
    float t[8], o[8];
    _mm256_storeu_ps(t, acc);
    _mm256_storeu_ps(o, macc);
    if (G == 8)
        for (int r = 0; r < 8; r++) y[r] = t[r] + o[r];
    else
        for (int r = 0; r < 4; r++) y[r] = (t[r] + t[r + 4]) + (o[r] + o[r + 4]);
}

#define Q8_GROUP_CODE(CODE, BB)                                                                \
    if (G == 8) q8_group(CODE, 8, p, BB, nb, xq, dx, s32, y + n0);                             \
    else q8_group(CODE, 4, p, BB, nb, xq, dx, s32, y + n0);

/* Y[0, n] for every row: units of one interleaved group (one sequential stream of R rows),
 * the N % R tail rows by q8_row32; threads split the units as the other GEMVs do */
static void gemv_q8_group(const dq_t *s, long N, const int8_t *xq, const float *dx,
                          const float *s32, float *y, int threads, long chunk) {
    long G = s->R, full = N - N % G, groups = full / G, units = groups + (N - full);
    long uchunk = chunk / G < 1 ? 1 : chunk / G, nb = s->nb;
#pragma omp parallel num_threads(threads)
    {
        prefetcher pf = {0, 0};
#pragma omp for schedule(dynamic, uchunk)
        for (long u = 0; u < units; u++) {
            long n0 = u < groups ? u * G : full + (u - groups);
            const uint8_t *p = dq_row(s, n0);
            if (u >= groups) { /* (a group prefetches its stream as it goes) */
                pf_range(&pf.next, p, p + s->row_bytes + PF_AHEAD);
                y[n0] = q8_row32(s->code, p, s->bb, nb, xq, dx, s32);
                continue;
            }
            switch (s->code) {
            case S_Q8_0: Q8_GROUP_CODE(S_Q8_0, 34) break;
            case S_Q4_0: Q8_GROUP_CODE(S_Q4_0, 18) break;
            case S_Q5_0: Q8_GROUP_CODE(S_Q5_0, 22) break;
            case S_Q4_1: Q8_GROUP_CODE(S_Q4_1, 20) break;
            default: Q8_GROUP_CODE(S_Q5_1, 24) break;
            }
        }
    }
}
#undef Q8_GROUP_CODE
#endif
