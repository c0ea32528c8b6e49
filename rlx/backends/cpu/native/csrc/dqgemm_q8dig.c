/* dqgemm: the exact Q8_0 decode GEMV (M = 1, f32 activations) on AVX-512 VNNI, used by
 * rlx_dq_gemv_bf16 (dqgemm_bf16dot.c) for the interleaved row groups (R = 4 / 8).
 *
 * Activation digits. Once per call (x is shared by every row), each group g of 4 inputs
 * (one int32 lane below: 8 per 32-block) is written as x_j ~ X_j 2^e_g with X_j an integer,
 * |X_j| <= 2^22 - 1 (e_g = exponent of the group's largest |x| - 22, X_j = x_j 2^-e_g
 * rounded to nearest), and X_j as its three two's-complement bytes: X = 2^16 D0 + 2^8 D1 +
 * D2, D0 signed (-64 .. 63), D1, D2 unsigned. (One exponent per 32-block instead: 84 % of
 * the blocks of Gemma-3-270M's LM-head input passed the test below, per group 92 %.)
 * A row's block (half d, i8 codes q_j) then gives, per group of 4 codes (one int32 lane of
 * vpdpbusd, u8 x s8 quads):
 *   a = sum (q + 128) D0 - 128 sum D0   (q + 128 = q ^ 0x80: vpdpbusd wants unsigned bytes
 *                                        first; the 128 sum D0 per lane is set once per call)
 *   a = 256 a + sum D1 q;  a = 256 a + sum D2 q   (D1, D2 unsigned, q signed: no offset)
 * so a = sum q X exactly: |a| <= 4 128 (2^22 - 1) < 2^31, and int32 wrap-around in the
 * intermediate steps cancels out. The lane goes to f32 (one rounding) and is added to the
 * row's accumulator with one FMA by the lane's scale d 2^e_g (exact: 11 significant bits,
 * e_g >= -125 so even a subnormal product keeps every bit), 8 lanes (256 bits) per row and
 * block:
 * on Zen 4 a 512-bit op costs two 256-bit ones, and two rows per zmm needed an insert and a
 * scale shuffle per pair (measured 26 vs 31 GB/s with the weight in L2).
 *
 * Exactness. The only error besides f32 rounding is x_j - X_j 2^e_g. A block takes the
 * integer path only when, for every j, |x_j - X_j 2^e_g| <= 0.85 K 2^-23 |x_j| (checked
 * exactly once per call, q8dig_prep): then each term w_j x_j is off by at most
 * 0.85 K 2^-23 |w_j x_j|, and the f32 rounding adds at most (nb + 7) 2^-24 sum |w_j x_j|
 * (digit path: lane conversion, nb FMAs per lane, 3 + 1 final additions; f32 path: product,
 * pair sum, nb FMAs, 4 + 1), nb = K / 32, which together stay within the f32 accumulation
 * bound K 2^-23 sum |w_j x_j| for every nb >= 1 (0.85 + (nb + 7) / (64 nb) <= 0.975). Every
 * other block takes the f32 kernel's arithmetic (exact products of the f32 codes and x,
 * f32 accumulation in separate accumulators): a block with a non-finite x (so +-inf and NaN
 * give what the f32 kernels give), a group whose largest |x| is under 2^-103 (subnormal
 * scales) or whose small entries sit too far below its largest to keep their bits (entries
 * under ~1/540 of it at K = 640, 1/27 at K = 32; zeros are exact). Which blocks take which
 * path depends on x only, so every row and every thread count gives the same bits.
 *
 * Cost per row and block (32 weights): 3 vpdpbusd, 2 shifts, 1 xor, 1 convert, the scale
 * (broadcast, vcvtph2ps, multiply) and 1 FMA on 256 bits, against 2 widenings, 2 converts,
 * a multiply and 2 FMAs on 512 bits for the f32 kernel. */

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && VW == 16 && FUSED
#define Q8DIG 1

/* per-call activation digits: per block 160 bytes, the digits D0, D1, D2 (32 bytes each),
 * 8 int32 lane corrections (-128 sum D0) and the 8 lanes' 2^e (f32), kept small so a row
 * group's pass over K = 2048 leaves them in L1 beside the weight stream; and whether the
 * block takes the integer path */
typedef struct {
    int8_t *dg;
    uint8_t *ok;
} q8dig_t;

static size_t q8dig_bytes(long nb) { return (size_t)nb * (160 + 1) + 64; }

/* f32 lanes 2^(c - 127) from biased exponents c in 1 .. 254 */
static inline __m512 pow2v(__m512i c) { return _mm512_castsi512_ps(_mm512_slli_epi32(c, 23)); }

/* per input (16 lanes of |x| bits, finite): e = exponent of the largest |x| of its group of
 * 4 (lanes 4 l .. 4 l + 3, one vpdpbusd lane) - 22, so that largest is f 2^(e + 22) with
 * f in [0.5, 1); 0 for an all-zero group (the bits of non-negative floats order as integers) */
static inline __m512i lane_exp(__m512i a) {
    __m512i m = _mm512_max_epu32(a, _mm512_shuffle_epi32(a, _MM_PERM_CDAB));
    m = _mm512_max_epu32(m, _mm512_shuffle_epi32(m, _MM_PERM_BADC));
    __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(m, 23), _mm512_set1_epi32(126 + 22));
    return _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(m, m), e);
}

/* split x[0 .. 32 nb) into d (memory at buf, q8dig_bytes(nb), 64-byte aligned); K the
 * GEMV's K (the bound). Returns the number of blocks on the integer path. The test below
 * is in f32 and exact (e its group's): x 2^-e and X 2^e are powers-of-two scalings without
 * overflow
 * (|x| < 2^(e + 22)) or loss (a non-zero |X 2^e| >= 2^-125), x - X 2^e is exact (a
 * multiple of ulp(x) below 2^24 of them, or x itself when X = 0), and the limit is lowered
 * by 2^-20 to cover the rounding of lim |x| (a product that underflows makes it stricter). */
static long q8dig_prep(const float *x, long nb, long K, uint8_t *buf, q8dig_t *d) {
    d->dg = (int8_t *)buf;
    d->ok = buf + nb * 160;
    const __m512 lim = _mm512_set1_ps((float)(0.85 * (double)K * 0x1p-23 * (1.0 - 0x1p-20)));
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), expm = _mm512_set1_epi32(0x7F800000);
    const __m512i xhi = _mm512_set1_epi32(4194303), xlo = _mm512_set1_epi32(-4194303);
    long n_ok = 0;
    for (long b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        int8_t *dg = d->dg + 160 * b;
        d->ok[b] = 0;
        __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        __m512i a0 = _mm512_and_si512(_mm512_castps_si512(x0), absm);
        __m512i a1 = _mm512_and_si512(_mm512_castps_si512(x1), absm);
        __mmask16 inf0 = _mm512_cmpeq_epi32_mask(_mm512_and_si512(a0, expm), expm);
        __mmask16 inf1 = _mm512_cmpeq_epi32_mask(_mm512_and_si512(a1, expm), expm);
        if (inf0 | inf1) continue; /* +-inf or NaN */
        /* e per lane of 4 inputs: each input's lane exponent in its own position */
        __m512i e0 = lane_exp(a0), e1 = lane_exp(a1);
        const __m512i emin = _mm512_set1_epi32(-125);
        if (_mm512_cmplt_epi32_mask(e0, emin) | _mm512_cmplt_epi32_mask(e1, emin))
            continue; /* a lane's largest |x| under 2^-103 (or subnormal) */
        const __m512i b127 = _mm512_set1_epi32(127);
        const __m512 inv0 = pow2v(_mm512_sub_epi32(b127, e0));
        const __m512 inv1 = pow2v(_mm512_sub_epi32(b127, e1));
        const __m512 pe0 = pow2v(_mm512_add_epi32(b127, e0));
        const __m512 pe1 = pow2v(_mm512_add_epi32(b127, e1));
        __m512i X0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, inv0)); /* nearest (MXCSR) */
        __m512i X1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, inv1));
        X0 = _mm512_min_epi32(_mm512_max_epi32(X0, xlo), xhi);
        X1 = _mm512_min_epi32(_mm512_max_epi32(X1, xlo), xhi);
        __m512 r0 = _mm512_sub_ps(x0, _mm512_mul_ps(_mm512_cvtepi32_ps(X0), pe0));
        __m512 r1 = _mm512_sub_ps(x1, _mm512_mul_ps(_mm512_cvtepi32_ps(X1), pe1));
        __m512 l0 = _mm512_mul_ps(lim, _mm512_castsi512_ps(a0));
        __m512 l1 = _mm512_mul_ps(lim, _mm512_castsi512_ps(a1));
        __mmask16 g0 = _mm512_cmp_ps_mask(_mm512_abs_ps(r0), l0, _CMP_LE_OQ);
        __mmask16 g1 = _mm512_cmp_ps_mask(_mm512_abs_ps(r1), l1, _CMP_LE_OQ);
        if ((g0 & g1) != 0xFFFF) continue; /* an entry too far below its lane's largest */
        d->ok[b] = 1;
        n_ok++;
        /* the 8 lanes' 2^e (inputs 0, 4, .., 28) */
        const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0,
                                                0, 0);
        _mm256_storeu_ps((float *)(dg + 128),
                         _mm512_castps512_ps256(_mm512_permutex2var_ps(pe0, first, pe1)));
        /* the digits: X = 2^16 D0 + 2^8 D1 + D2 (D0 = X >> 16 in -64 .. 63) */
        __m256i dk[3];
        for (int k = 0; k < 3; k++) {
            unsigned sh = (unsigned)(16 - 8 * k);
            dk[k] = _mm256_set_m128i(_mm512_cvtepi32_epi8(_mm512_srai_epi32(X1, sh)),
                                     _mm512_cvtepi32_epi8(_mm512_srai_epi32(X0, sh)));
            _mm256_storeu_si256((__m256i *)(dg + 32 * k), dk[k]);
        }
        /* -128 times the sum of D0 over each lane's 4 inputs */
        __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), dk[0]);
        _mm256_storeu_si256((__m256i *)(dg + 96),
                            _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s0, 7)));
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
    __m256 t[8];
    __m512 tf[8];
    for (int r = 0; r < G; r++) t[r] = _mm256_setzero_ps(), tf[r] = _mm512_setzero_ps();
    const __m256i x80 = _mm256_set1_epi8((char)0x80);
    for (long b = 0; b < nb; b++, p += st, x += 32) {
        if ((b & 1) == 0)
            for (int o = 0; o < 2 * G * 34; o += 64) __builtin_prefetch(p + PF_AHEAD_Q8 + o, 0, 3);
        if (d->ok[b]) {
            const __m256i *dg = (const __m256i *)(d->dg + 160 * b);
            __m256i D0 = _mm256_loadu_si256(dg), D1 = _mm256_loadu_si256(dg + 1);
            __m256i D2 = _mm256_loadu_si256(dg + 2), C0 = _mm256_loadu_si256(dg + 3);
            __m256 eb = _mm256_castsi256_ps(_mm256_loadu_si256(dg + 4)); /* 2^e per lane */
            for (int r = 0; r < G; r++) {
                const uint8_t *q = p + 34 * r;
                __m256i w = _mm256_loadu_si256((const __m256i *)(q + 2));
                __m256i a = _mm256_dpbusd_epi32(C0, _mm256_xor_si256(w, x80), D0);
                a = _mm256_dpbusd_epi32(_mm256_slli_epi32(a, 8), D1, w);
                a = _mm256_dpbusd_epi32(_mm256_slli_epi32(a, 8), D2, w);
                uint16_t h;
                memcpy(&h, q, 2);
                __m256 s = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16((short)h)), eb);
                t[r] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(a), t[r]);
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
    for (int r = 0; r < G; r++) y[r] = hsum8(t[r]) + _mm512_reduce_add_ps(tf[r]);
}
static void q8dig_rows(int G, const uint8_t *p, long st, long nb, const float *x,
                       const q8dig_t *d, float *y) {
    if (G == 8) q8dig_grp(8, p, st, nb, x, d, y);
    else q8dig_grp(4, p, st, nb, x, d, y);
}
#endif
