/* dqgemm: the exact Q8_0 decode GEMV (M = 1, f32 activations) on AVX-512 VNNI, used by
 * rlx_dq_gemv_bf16 (dqgemm_bf16dot.c) for the interleaved row groups (R = 4 / 8).
 *
 * Activation digits. Once per call (x is shared by every row), each 32-block b of x is
 * written as x_j ~ X_j 2^e_b with X_j an integer, |X_j| <= 2^22 - 1 (e_b = exponent of the
 * block's largest |x| - 22, X_j = x_j 2^-e_b rounded to nearest), and X_j as its three
 * two's-complement bytes: X = 2^16 D0 + 2^8 D1 + D2, D0 signed (-64 .. 63), D1, D2 unsigned.
 * A row's block (half d, i8 codes q_j) then gives, per group of 4 codes (one int32 lane of
 * vpdpbusd, u8 x s8 quads):
 *   a = sum (q + 128) D0 - 128 sum D0   (q + 128 = q ^ 0x80: vpdpbusd wants unsigned bytes
 *                                        first; the 128 sum D0 per lane is set once per call)
 *   a = 256 a + sum D1 q;  a = 256 a + sum D2 q   (D1, D2 unsigned, q signed: no offset)
 * so a = sum q X exactly: |a| <= 4 128 (2^22 - 1) < 2^31, and int32 wrap-around in the
 * intermediate steps cancels out. The lane goes to f32 (one rounding) and is added to the
 * row's accumulator with one FMA by the scale d 2^e_b (exact: 11 significant bits, e_b >=
 * -125 so even a subnormal product keeps every bit). Two rows share one zmm (rows r, r + 1
 * of a block in the two 256-bit halves), so one 16-lane FMA serves 64 weights.
 *
 * Exactness. The only error besides f32 rounding is x_j - X_j 2^e_b. A block takes the
 * integer path only when, for every j, |x_j - X_j 2^e_b| <= 0.85 K 2^-23 |x_j| (checked in
 * f64 once per call): then each term w_j x_j is off by at most 0.85 K 2^-23 |w_j x_j|, and the
 * f32 rounding adds at most (nb + 7) 2^-24 sum |w_j x_j| (lane conversion, nb FMAs per lane,
 * 3 + 1 + 4 final additions), nb = K / 32, which together stay within the f32 accumulation
 * bound K 2^-23 sum |w_j x_j| for every nb >= 1 (0.85 + (nb + 7) / (64 nb) <= 0.975). Every
 * other block takes the f32 kernel's arithmetic (exact products of the f32 codes and x,
 * f32 accumulation in separate accumulators): a block with a non-finite x (so +-inf and NaN
 * give what the f32 kernels give), a largest |x| under 2^-103 (subnormal scales) or one
 * whose small entries sit too far below the block's largest to keep their bits (entries
 * under ~1/540 of it at K = 640, 1/27 at K = 32; zeros are exact). Which blocks take which
 * path depends on x only, so every row and every thread count gives the same bits.
 *
 * Cost: 3 vpdpbusd, 2 shifts, 1 xor, 1 convert and 1 FMA per 64 weights (two rows), against
 * 4 converts, 2 multiply-adds and 1 FMA per 32 weights for the f32 kernel. */

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && VW == 16 && FUSED
#define Q8DIG 1

/* per-call activation digits: per block 192 bytes of digits (D0, D1, D2, each block's 32
 * bytes twice: one copy per row of a zmm), 16 int32 lane corrections (-128 sum D0), the
 * scale 2^e (f32) and whether the block takes the integer path */
typedef struct {
    int8_t *dg;
    int32_t *c0;
    float *e2;
    uint8_t *ok;
} q8dig_t;

/* 2^e as a double (|e| < 1000) */
static inline double pow2d(int e) {
    uint64_t u = (uint64_t)(1023 + e) << 52;
    double r;
    memcpy(&r, &u, 8);
    return r;
}

static size_t q8dig_bytes(long nb) { return (size_t)nb * (192 + 64 + 4 + 1) + 64; }

/* split x[0 .. 32 nb) into d (memory at buf, q8dig_bytes(nb), 64-byte aligned); K the
 * GEMV's K (the bound). Returns the number of blocks on the integer path. */
static long q8dig_prep(const float *x, long nb, long K, uint8_t *buf, q8dig_t *d) {
    d->dg = (int8_t *)buf;
    d->c0 = (int32_t *)(buf + nb * 192);
    d->e2 = (float *)(buf + nb * 256);
    d->ok = buf + nb * 260;
    const double lim = 0.85 * (double)K * 0x1p-23;
    long n_ok = 0;
    for (long b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        int8_t *dg = d->dg + 192 * b;
        int32_t *c0 = d->c0 + 16 * b;
        float m = 0.0f;
        int fin = 1;
        for (int j = 0; j < 32; j++) {
            uint32_t u;
            memcpy(&u, xb + j, 4);
            if ((u & 0x7F800000u) == 0x7F800000u) fin = 0;
            float a = __builtin_fabsf(xb[j]);
            m = a > m ? a : m;
        }
        int ok = fin, e = 0;
        if (ok && m > 0.0f) {
            uint32_t mb;
            memcpy(&mb, &m, 4);
            e = (int)(mb >> 23) - 126 - 22; /* m = f 2^(e + 22), f in [0.5, 1); subnormal: < -125 */
            ok = e >= -125;
        }
        int32_t X[32] = {0};
        if (ok && m > 0.0f) {
            const double inv = pow2d(-e), sc = pow2d(e);
            for (int j = 0; j < 32 && ok; j++) {
                double r = __builtin_nearbyint((double)xb[j] * inv);
                r = r > 4194303.0 ? 4194303.0 : (r < -4194303.0 ? -4194303.0 : r);
                ok = __builtin_fabs((double)xb[j] - r * sc) <= lim * __builtin_fabs((double)xb[j]);
                X[j] = (int32_t)r;
            }
        }
        d->ok[b] = (uint8_t)ok;
        uint32_t eb = (uint32_t)(127 + e) << 23; /* 2^e, normal: e >= -125 */
        memcpy(&d->e2[b], &eb, 4);
        if (!ok) continue;
        n_ok++;
        for (int l = 0; l < 8; l++) c0[l] = 0;
        for (int j = 0; j < 32; j++) {
            int8_t d0 = (int8_t)(X[j] >> 16); /* arithmetic: -64 .. 63 */
            uint32_t u = (uint32_t)X[j];
            dg[j] = dg[32 + j] = d0;
            dg[64 + j] = dg[96 + j] = (int8_t)(uint8_t)(u >> 8);
            dg[128 + j] = dg[160 + j] = (int8_t)(uint8_t)u;
            c0[j / 4] -= 128 * d0;
        }
        for (int l = 0; l < 8; l++) c0[8 + l] = c0[l];
    }
    return n_ok;
}

#ifndef PF_AHEAD_Q8
#define PF_AHEAD_Q8 4096
#endif

/* G rows (G = 8 or 4, an interleaved group: row r's block b at p + b st + 34 r) */
static inline __attribute__((always_inline)) void q8dig_grp(int G, const uint8_t *p, long st,
                                                           long nb, const float *x,
                                                           const q8dig_t *d, float *y) {
    __m512 t[4], tf[8];
    for (int r = 0; r < G / 2; r++) t[r] = _mm512_setzero_ps();
    for (int r = 0; r < G; r++) tf[r] = _mm512_setzero_ps();
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    const __m512i hsel = _mm512_setr_epi32(0, 0, 0, 0, 0x00110011, 0x00110011, 0x00110011,
                                           0x00110011, 0, 0, 0, 0, 0, 0, 0, 0);
    for (long b = 0; b < nb; b++, p += st, x += 32) {
        if ((b & 1) == 0)
            for (int o = 0; o < 2 * G * 34; o += 64) __builtin_prefetch(p + PF_AHEAD_Q8 + o, 0, 3);
        if (d->ok[b]) {
            const int8_t *dg = d->dg + 192 * b;
            __m512i D0 = _mm512_loadu_si512(dg), D1 = _mm512_loadu_si512(dg + 64);
            __m512i D2 = _mm512_loadu_si512(dg + 128), C0 = _mm512_loadu_si512(d->c0 + 16 * b);
            __m512 eb = _mm512_set1_ps(d->e2[b]);
            for (int r = 0; r < G / 2; r++) {
                const uint8_t *q = p + 68 * r;
                __m512i w = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(q + 2))),
                    _mm256_loadu_si256((const __m256i *)(q + 36)), 1);
                __m512i a = _mm512_dpbusd_epi32(C0, _mm512_xor_si512(w, x80), D0);
                a = _mm512_dpbusd_epi32(_mm512_slli_epi32(a, 8), D1, w);
                a = _mm512_dpbusd_epi32(_mm512_slli_epi32(a, 8), D2, w);
                /* the two rows' f16 scales (words 0 and 17 from q), 8 lanes each */
                __m256i hh = _mm512_castsi512_si256(
                    _mm512_permutexvar_epi16(hsel, _mm512_loadu_si512(q)));
                __m512 s = _mm512_mul_ps(_mm512_cvtph_ps(hh), eb);
                t[r] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(a), t[r]);
            }
        } else { /* the f32 kernel's arithmetic (grp_q8_0) */
            __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
            for (int r = 0; r < G; r++) {
                const uint8_t *q = p + r * 34;
                __m512 a = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                             _mm_loadu_si128((const __m128i *)(q + 2)))),
                                         x0);
                a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                        _mm_loadu_si128((const __m128i *)(q + 18)))),
                                    x1, a);
                uint16_t h;
                memcpy(&h, q, 2);
                tf[r] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_set1_epi16((short)h)), a, tf[r]);
            }
        }
    }
    for (int r = 0; r < G / 2; r++) {
        y[2 * r] = hsum8(_mm512_castps512_ps256(t[r])) + _mm512_reduce_add_ps(tf[2 * r]);
        y[2 * r + 1] =
            hsum8(_mm512_extractf32x8_ps(t[r], 1)) + _mm512_reduce_add_ps(tf[2 * r + 1]);
    }
}
static void q8dig_rows(int G, const uint8_t *p, long st, long nb, const float *x,
                       const q8dig_t *d, float *y) {
    if (G == 8) q8dig_grp(8, p, st, nb, x, d, y);
    else q8dig_grp(4, p, st, nb, x, d, y);
}
#endif
