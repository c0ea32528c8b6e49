/* dqgemm part 3 of 7 (see dqgemm.c): fused decode-dot rows for the other GGUF layouts
 * (Q4_0, Q4_1, Q5_1, Q2_K, Q3_K, Q5_K) on AVX2 / AVX-512, their interleaved groups (each X
 * load shared by R rows), and the fused-row dispatch.
 *
 * As dqgemm_rows.c: a block's codes go from the packed bytes straight to vector registers
 * and are multiplied with X in f32 (no decode buffer). Two forms:
 *   table (AVX-512, Q4_0 / Q4_1 / Q5_1): the block's 16 (32) decoded values d * q (+ m),
 *     computed exactly as decode_block computes them, held in one (two) zmm; vpermps /
 *     vpermt2ps look each code up, FMA with X: products of the exact decoded weights.
 *   integer codes (the rest, and AVX2): codes widened to i32 lanes, converted, FMA with X
 *     per sub-block; the sub-block's scale multiplies the vector sum, and a min (Q4_1,
 *     Q5_1, Q2_K, Q5_K: w = d q + m or d q - m) adds m times the sum of X over the
 *     sub-block (prep_x: per 32 inputs, per 16 for Q2_K), as row_q4_k_v does.
 * Both accumulate in f32 (error within K * 2^-23 of sum |x| |w| plus, for the split min
 * term, the same bound on |d q| + |m|). Two blocks per iteration of the 32-weight
 * layouts run into separate accumulators (FMA latency). */

#if FUSED
/* ---- Q4_0: 18-byte blocks, half d; u8 qs[16]; w = d * (q - 8) ---------------------- */
static inline __attribute__((always_inline)) void blk_q4_0(const uint8_t *p, const float *x,
                                                            const float *xs, vf *t0, vf *t1,
                                                            float *mt) {
    (void)xs, (void)mt;
#if VW == 16
    const __m512 iota_m8 = _mm512_sub_ps(_mm512_loadu_ps(IOTA16), VSET1(8.0f));
    __m512 tb = _mm512_mul_ps(VSET1(hf(p)), iota_m8); /* d * (q - 8) as the reference */
    __m512i w = VU8(p + 2);
    *t0 = VFMA(_mm512_permutexvar_ps(w, tb), VLOAD(x), *t0); /* low 4 bits index */
    *t1 = VFMA(_mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), tb), VLOAD(x + 16), *t1);
#else
    const vi m15 = VISET1(15), c8 = VISET1(8);
    vf a0 = VZERO(), a1 = VZERO();
    for (int v = 0; v < 16; v += VW) {
        vi w = VU8(p + 2 + v);
        a0 = VFMA(VCVT(VISUB(VIAND(w, m15), c8)), VLOAD(x + v), a0);
        a1 = VFMA(VCVT(VISUB(VISRL(w, 4), c8)), VLOAD(x + 16 + v), a1);
    }
    vf d = VSET1(hf(p));
    *t0 = VFMA(d, a0, *t0);
    *t1 = VFMA(d, a1, *t1);
#endif
}

/* ---- Q4_1: 20-byte blocks, half d, half m; u8 qs[16]; w = d * q + m ---------------- */
static inline __attribute__((always_inline)) void blk_q4_1(const uint8_t *p, const float *x,
                                                            const float *xs, vf *t0, vf *t1,
                                                            float *mt) {
#if VW == 16
    (void)xs, (void)mt;
    __m512 tb = _mm512_add_ps(_mm512_mul_ps(VSET1(hf(p)), _mm512_loadu_ps(IOTA16)),
                              VSET1(hf(p + 2)));
    __m512i w = VU8(p + 4);
    *t0 = VFMA(_mm512_permutexvar_ps(w, tb), VLOAD(x), *t0);
    *t1 = VFMA(_mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), tb), VLOAD(x + 16), *t1);
#else
    const vi m15 = VISET1(15);
    vf a0 = VZERO(), a1 = VZERO();
    for (int v = 0; v < 16; v += VW) {
        vi w = VU8(p + 4 + v);
        a0 = VFMA(VCVT(VIAND(w, m15)), VLOAD(x + v), a0);
        a1 = VFMA(VCVT(VISRL(w, 4)), VLOAD(x + 16 + v), a1);
    }
    vf d = VSET1(hf(p));
    *t0 = VFMA(d, a0, *t0);
    *t1 = VFMA(d, a1, *t1);
    *mt += hf(p + 2) * xs[0];
#endif
}

#if VW == 8
/* the 32 5-bit codes of a Q5_0 / Q5_1 block in output order as bytes: the nibbles of the
 * 16 bytes at qs, bit j of qh as bit 4 of byte j (llama.cpp's bytes_from_bits_32) */
static inline __m256i q5_bytes(const uint8_t *qs, uint32_t qh) {
    const __m128i m4 = _mm_set1_epi8(15);
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
    const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                            0x0303030303030303LL);
    __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    bits = _mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    bits = _mm256_cmpeq_epi8(bits, _mm256_set1_epi64x(-1));
    return _mm256_or_si256(nib, _mm256_and_si256(bits, _mm256_set1_epi8(16)));
}

/* 32 signed byte codes c . x[0 .. 32): *t1 += d * (the second 16), returns t0 + d * (the
 * first 16) */
static inline __attribute__((always_inline)) vf blk_dot32(__m256i c, const float *x, vf t0,
                                                           vf d, vf *t1) {
    vf a0 = VMUL(VCVT(VI8R(part32(c, 0))), VLOAD(x));
    vf a1 = VMUL(VCVT(VI8R(part32(c, 16))), VLOAD(x + 16));
    a0 = VFMA(VCVT(VI8R(part32(c, 8))), VLOAD(x + 8), a0);
    a1 = VFMA(VCVT(VI8R(part32(c, 24))), VLOAD(x + 24), a1);
    *t1 = VFMA(d, a1, *t1);
    return VFMA(d, a0, t0);
}
#endif

/* ---- Q5_1: 24-byte blocks, half d, half m, u32 qh, u8 qs[16]; w = d * q5 + m ------- */
static inline __attribute__((always_inline)) void blk_q5_1(const uint8_t *p, const float *x,
                                                            const float *xs, vf *t0, vf *t1,
                                                            float *mt) {
    uint32_t qh;
    memcpy(&qh, p + 4, 4);
#if VW == 16
    (void)xs, (void)mt;
    const __m512 iota = _mm512_loadu_ps(IOTA16);
    const __m512i m15 = VISET1(15), c16 = VISET1(16);
    __m512 d = VSET1(hf(p)), m = VSET1(hf(p + 2));
    __m512 ta = _mm512_add_ps(_mm512_mul_ps(d, iota), m);
    __m512 tb = _mm512_add_ps(_mm512_mul_ps(d, _mm512_add_ps(iota, VSET1(16.0f))), m);
    __m512i w = VU8(p + 8);
    __m512i lo = _mm512_and_si512(w, m15), hi = _mm512_srli_epi32(w, 4);
    lo = _mm512_mask_or_epi32(lo, (__mmask16)(qh & 0xFFFFu), lo, c16);
    hi = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, c16);
    *t0 = VFMA(_mm512_permutex2var_ps(ta, lo, tb), VLOAD(x), *t0);
    *t1 = VFMA(_mm512_permutex2var_ps(ta, hi, tb), VLOAD(x + 16), *t1);
#else
    __m256i c = q5_bytes(p + 8, qh); /* codes 0..31 */
    *t0 = blk_dot32(c, x, *t0, VSET1(hf(p)), t1);
    *mt += hf(p + 2) * xs[0];
#endif
}

/* Q5_0 (22-byte blocks: half d, u32 qh, u8 qs[16]; w = d * (q5 - 16)): on AVX2 the codes
 * - 16 as bytes; on AVX-512 the table of row_q5_0 (d * (q - 16), two zmm) */
static inline __attribute__((always_inline)) void blk_q5_0(const uint8_t *p, const float *x,
                                                            const float *xs, vf *t0, vf *t1,
                                                            float *mt) {
    (void)xs, (void)mt;
    uint32_t qh;
    memcpy(&qh, p + 2, 4);
#if VW == 16
    const __m512 iota = _mm512_loadu_ps(IOTA16);
    const __m512i m15 = VISET1(15), c16 = VISET1(16);
    __m512 d = VSET1(hf(p));
    __m512 ta = _mm512_mul_ps(d, _mm512_sub_ps(iota, VSET1(16.0f))), tb = _mm512_mul_ps(d, iota);
    __m512i w = VU8(p + 6);
    __m512i lo = _mm512_and_si512(w, m15), hi = _mm512_srli_epi32(w, 4);
    lo = _mm512_mask_or_epi32(lo, (__mmask16)(qh & 0xFFFFu), lo, c16);
    hi = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, c16);
    *t0 = VFMA(_mm512_permutex2var_ps(ta, lo, tb), VLOAD(x), *t0);
    *t1 = VFMA(_mm512_permutex2var_ps(ta, hi, tb), VLOAD(x + 16), *t1);
#else
    __m256i c = _mm256_sub_epi8(q5_bytes(p + 6, qh), _mm256_set1_epi8(16));
    *t0 = blk_dot32(c, x, *t0, VSET1(hf(p)), t1);
#endif
}

/* a row of 32-weight blocks st bytes apart: two blocks per step into separate
 * accumulators; xs: the per-32 sums of X (the min term, where the block adds one) */
#define ROW32(name, blk)                                                                   \
    static float name(const uint8_t *p, long st, long nb, const float *x, const float *xs) { \
        vf t0 = VZERO(), t1 = VZERO(), t2 = VZERO(), t3 = VZERO();                         \
        float m0 = 0.0f, m1 = 0.0f;                                                        \
        long b = 0;                                                                        \
        for (; b + 2 <= nb; b += 2, p += 2 * st, x += 64, xs += 2) {                       \
            blk(p, x, xs, &t0, &t1, &m0);                                                  \
            blk(p + st, x + 32, xs + 1, &t2, &t3, &m1);                                    \
        }                                                                                  \
        if (b < nb) blk(p, x, xs, &t0, &t1, &m0);                                          \
        return vhsum(VADD(VADD(t0, t1), VADD(t2, t3))) + (m0 + m1);                        \
    }
ROW32(row_q4_0, blk_q4_0)
ROW32(row_q4_1, blk_q4_1)
ROW32(row_q5_1, blk_q5_1)
#if VW == 8
ROW32(row_q5_0_b, blk_q5_0)
#endif

#ifndef PF_AHEAD
#define PF_AHEAD 4096 /* as dqgemm.c: bytes of the stream kept prefetched ahead */
#endif
/* G interleaved rows (block b of the G rows consecutive, blocks `bytes` apart) in one
 * pass: each X vector load shared by the G rows, two accumulators per row, the block scale
 * applied per block as in ROW32, one horizontal sum per row at the end */
#define GROUP32(name, blk, bytes)                                                          \
    static inline __attribute__((always_inline)) void name##_g(                            \
        int G, const uint8_t *p, long nb, const float *x, const float *xs, float *y) {     \
        vf t0[8], t1[8];                                                                   \
        float mt[8];                                                                       \
        for (int r = 0; r < G; r++) t0[r] = t1[r] = VZERO(), mt[r] = 0.0f;                \
        for (long b = 0; b < nb; b++, p += G * (bytes), x += 32, xs++) {                   \
            for (int o = 0; o < G * (bytes); o += 64) __builtin_prefetch(p + PF_AHEAD + o, 0, 3); \
            for (int r = 0; r < G; r++) blk(p + r * (bytes), x, xs, &t0[r], &t1[r], &mt[r]); \
        }                                                                                  \
        for (int r = 0; r < G; r++) y[r] = vhsum(VADD(t0[r], t1[r])) + mt[r];              \
    }                                                                                      \
    static void name(int G, const uint8_t *p, long nb, const float *x, const float *xs,    \
                     float *y) {                                                           \
        if (G == 8) name##_g(8, p, nb, x, xs, y);                                          \
        else name##_g(4, p, nb, x, xs, y);                                                 \
    }
GROUP32(group_q4_0, blk_q4_0, 18)
GROUP32(group_q4_1, blk_q4_1, 20)
GROUP32(group_q5_1, blk_q5_1, 24)
GROUP32(group_q5_0, blk_q5_0, 22)

/* ---- K-quant blocks for the groups: one 256-weight block of one row into two vector
 * accumulators, the mins term (Q4_K: dmin m_j times the per-32 sums xs of X) subtracted in
 * the low 8 lanes of t1 (one horizontal sum per row at the end) ---- */
#if VW == 16
#define VSUBV(a, b) _mm512_sub_ps(a, b)
static inline vf lo8(__m256 v) { return _mm512_zextps256_ps512(v); }
#else
#define VSUBV(a, b) _mm256_sub_ps(a, b)
static inline vf lo8(__m256 v) { return v; }
#endif

static inline __attribute__((always_inline)) void blk_q4_k(const uint8_t *p, const float *x,
                                                            const float *xs, vf *t0, vf *t1,
                                                            float *mt) {
    (void)mt;
#if VW == 16
    const __m512 iota = _mm512_loadu_ps(IOTA16);
#else
    const vi m15 = VISET1(15);
#endif
    __m256 scf, mf;
    q4k_scales_mins(p, &scf, &mf);
    float dsc[8];
    _mm256_storeu_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(hf(p)), scf));
    __m256 mn = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(hf(p + 2)), mf), _mm256_loadu_ps(xs));
    *t1 = VSUBV(*t1, lo8(mn));
    const uint8_t *qs = p + 16;
    for (int c = 0; c < 4; c++) {
        vf alo = VZERO(), ahi = VZERO();
        for (int v = 0; v < 32; v += VW) {
            vi w = VU8(qs + c * 32 + v);
#if VW == 16
            alo = VFMA(_mm512_permutexvar_ps(w, iota), VLOAD(x + c * 64 + v), alo);
#else
            alo = VFMA(VCVT(VIAND(w, m15)), VLOAD(x + c * 64 + v), alo);
#endif
            ahi = VFMA(VCVT(VISRL(w, 4)), VLOAD(x + c * 64 + 32 + v), ahi);
        }
        *t0 = VFMA(VSET1(dsc[2 * c]), alo, *t0);
        *t1 = VFMA(VSET1(dsc[2 * c + 1]), ahi, *t1);
    }
}

static inline __attribute__((always_inline)) void blk_q6_k(const uint8_t *p, const float *x,
                                                            const float *xs, vf *t0, vf *t1,
                                                            float *mt) {
    (void)xs, (void)mt;
    const __m256i c32 = _mm256_set1_epi8(32);
    float dsc[16];
    __m256 s_lo, s_hi;
    q6k_scales(p, hf(p + 208), &s_lo, &s_hi);
    _mm256_storeu_ps(dsc, s_lo);
    _mm256_storeu_ps(dsc + 8, s_hi);
    for (int h = 0; h < 2; h++) {
        q6k_half_t half = q6k_half(p, h);
        for (int g = 0; g < 4; g++) {
            __m256i q = _mm256_sub_epi8(q6k_codes(half, g), c32);
            const float *xg = x + h * 128 + g * 32;
            for (int v = 0; v < 32; v += VW) {
                vf a = VMUL(VCVT(VI8R(part32(q, v))), VLOAD(xg + v));
                vf dl = VSET1(dsc[h * 8 + g * 2 + v / 16]);
                if (g & 1) *t1 = VFMA(dl, a, *t1);
                else *t0 = VFMA(dl, a, *t0);
            }
        }
    }
}

/* G interleaved rows of 256-weight blocks, as GROUP32 */
#define GROUPK(name, blk, bytes, xsper)                                                    \
    static inline __attribute__((always_inline)) void name##_g(                            \
        int G, const uint8_t *p, long nb, const float *x, const float *xs, float *y) {     \
        vf t0[8], t1[8];                                                                   \
        for (int r = 0; r < G; r++) t0[r] = t1[r] = VZERO();                               \
        for (long b = 0; b < nb; b++, p += G * (bytes), x += 256, xs += (xsper)) {         \
            for (int o = 0; o < G * (bytes); o += 64) __builtin_prefetch(p + PF_AHEAD + o, 0, 3); \
            for (int r = 0; r < G; r++) blk(p + r * (bytes), x, xs, &t0[r], &t1[r], 0);    \
        }                                                                                  \
        for (int r = 0; r < G; r++) y[r] = vhsum(VADD(t0[r], t1[r]));                      \
    }                                                                                      \
    static void name(int G, const uint8_t *p, long nb, const float *x, const float *xs,    \
                     float *y) {                                                           \
        if (G == 8) name##_g(8, p, nb, x, xs, y);                                          \
        else name##_g(4, p, nb, x, xs, y);                                                 \
    }
GROUPK(group_q4_k, blk_q4_k, 144, 8)
GROUPK(group_q6_k, blk_q6_k, 210, 0)

/* ---- Q2_K / Q3_K: the 2-bit codes of output 128 h + 32 sh + l (l < 32) are bits 2 sh of
 * byte 32 h + l of qs: each (h, sh) is one 32-byte AVX2 shift-and-mask in a register,
 * widened VW at a time (as row_q6_k); sub-block 8 h + 2 sh + l / 16. ---------------- */

/* t (4 accumulators, FMA latency) += dsc[sub-block] * (codes c . X) for the 32 outputs
 * of (h, sh); c: 32 signed byte codes */
#define DOT32(c, h, sh)                                                                    \
    for (int v = 0; v < 32; v += VW) {                                                     \
        vf a = VMUL(VCVT(VI8R(part32(c, v))), VLOAD(x + 128 * (h) + 32 * (sh) + v));       \
        vf dl = VSET1(dsc[8 * (h) + 2 * (sh) + v / 16]);                                   \
        if ((sh) & 1) {                                                                    \
            if (v < 16) t2 = VFMA(dl, a, t2);                                              \
            else t3 = VFMA(dl, a, t3);                                                     \
        } else {                                                                           \
            if (v < 16) t0 = VFMA(dl, a, t0);                                              \
            else t1 = VFMA(dl, a, t1);                                                     \
        }                                                                                  \
    }

/* Q2_K (84-byte blocks: u8 scales[16] (4-bit scale, 4-bit min), u8 qs[64], half d, half
 * dmin): w = d * sc * code - dmin * mn per sub-block of 16; xs: per-16 sums of X */
static float row_q2_k(const uint8_t *p, long st, long nb, const float *x, const float *xs) {
    vf t0 = VZERO(), t1 = VZERO(), t2 = VZERO(), t3 = VZERO();
    __m256 mins = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256i m3 = _mm256_set1_epi8(3);
    float dsc[16];
    for (long b = 0; b < nb; b++, p += st, x += 256, xs += 16) {
        __m128i s8 = _mm_loadu_si128((const __m128i *)p);
        __m128i lo = _mm_and_si128(s8, m4), hi = _mm_and_si128(_mm_srli_epi16(s8, 4), m4);
        __m256 d = _mm256_set1_ps(hf(p + 80)), dm = _mm256_set1_ps(hf(p + 82));
        _mm256_storeu_ps(dsc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo))));
        _mm256_storeu_ps(dsc + 8, _mm256_mul_ps(
            d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)))));
        __m256 mlo = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)));
        __m256 mhi = _mm256_mul_ps(
            dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))));
        mins = _mm256_fmadd_ps(mlo, _mm256_loadu_ps(xs), mins);
        mins = _mm256_fmadd_ps(mhi, _mm256_loadu_ps(xs + 8), mins);
        for (int h = 0; h < 2; h++) {
            __m256i qv = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * h));
            for (int sh = 0; sh < 4; sh++) {
                __m256i c = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * sh), m3);
                DOT32(c, h, sh)
            }
        }
    }
    return vhsum(VADD(VADD(t0, t1), VADD(t2, t3))) - hsum8(mins);
}

/* Q3_K (110-byte blocks: u8 hmask[32], u8 qs[64], u8 scales[12], half d): w = d * scale
 * * code per sub-block of 16 (16 6-bit scales, offset 32), code ((qs bits) | (hmask[l]
 * bit 4 h + sh) << 2) - 4 */
static float row_q3_k(const uint8_t *p, long st, long nb, const float *x) {
    vf t0 = VZERO(), t1 = VZERO(), t2 = VZERO(), t3 = VZERO();
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), c4 = _mm256_set1_epi8(4);
    float dsc[16];
    for (long b = 0; b < nb; b++, p += st, x += 256) {
        __m256 slo, shi; /* d * scale, as decode_block computes it */
        q3k_scales16(p, hf(p + 108), &slo, &shi);
        _mm256_storeu_ps(dsc, slo);
        _mm256_storeu_ps(dsc + 8, shi);
        __m256i hv = _mm256_loadu_si256((const __m256i *)p);
        for (int h = 0; h < 2; h++) {
            __m256i qv = _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * h));
            for (int sh = 0; sh < 4; sh++) {
                __m256i lo = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * sh), m3);
                __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hv, 4 * h + sh), one);
                __m256i c = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)), c4);
                DOT32(c, h, sh)
            }
        }
    }
    return vhsum(VADD(VADD(t0, t1), VADD(t2, t3)));
}

/* ---- Q5_K: 176-byte blocks: half d, half dmin, u8 scales[12] (as Q4_K), u8 qh[32], u8
 * qs[128]; output 32 j + l is d * sc_j * (((qs[32 (j / 2) + l] >> 4 (j & 1)) & 15) |
 * ((qh[l] >> j) & 1) << 4) - dmin * m_j. xs: per-32 sums of X --------------------------- */
/* Q5_K's 8 sub-blocks of one block p against x (256 floats), each scaled by dsc[j] (d times
 * its 6-bit scale) into t0 (even j) and t1 (odd j): shared by the row and group kernels. */
static inline __attribute__((always_inline)) void q5k_subs(const uint8_t *p, const float *x,
                                                            const float *dsc, vf *t0, vf *t1) {
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    const uint8_t *qs = p + 48;
    __m256i hv = _mm256_loadu_si256((const __m256i *)(p + 16));
    for (int c = 0; c < 4; c++) { /* sub-blocks 2 c (low nibbles), 2 c + 1 (high) */
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * c), one);
        __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * c + 1), one);
        __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_slli_epi16(h0, 4));
        __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                     _mm256_slli_epi16(h1, 4));
        vf alo = VZERO(), ahi = VZERO();
        for (int w = 0; w < 32; w += VW) {
            alo = VFMA(VCVT(VI8R(part32(lo, w))), VLOAD(x + c * 64 + w), alo);
            ahi = VFMA(VCVT(VI8R(part32(hi, w))), VLOAD(x + c * 64 + 32 + w), ahi);
        }
        *t0 = VFMA(VSET1(dsc[2 * c]), alo, *t0);
        *t1 = VFMA(VSET1(dsc[2 * c + 1]), ahi, *t1);
    }
}

static float row_q5_k(const uint8_t *p, long st, long nb, const float *x, const float *xs) {
    vf t0 = VZERO(), t1 = VZERO();
    __m256 mins = _mm256_setzero_ps();
    float dsc[8];
    for (long b = 0; b < nb; b++, p += st, x += 256, xs += 8) {
        __m256 scf, mf;
        q4k_scales_mins(p, &scf, &mf);
        _mm256_storeu_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(hf(p)), scf));
        mins = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(hf(p + 2)), mf), _mm256_loadu_ps(xs),
                               mins);
        q5k_subs(p, x, dsc, &t0, &t1);
    }
    return vhsum(VADD(t0, t1)) - hsum8(mins);
}

/* ---- the K-quant groups of Q2_K, Q3_K and Q5_K: one block of one row as the rows above
 * compute it, into the row's two accumulators of GROUPK (sub-blocks of even sh / c into
 * t0, odd into t1), the mins (Q2_K: dmin m_j times the per-16 sums of X; Q5_K: per 32)
 * subtracted in the low 8 lanes of t1 ---- */
#define DOT32G(c, h, sh)                                                                   \
    for (int v = 0; v < 32; v += VW) {                                                     \
        vf a = VMUL(VCVT(VI8R(part32(c, v))), VLOAD(x + 128 * (h) + 32 * (sh) + v));       \
        vf dl = VSET1(dsc[8 * (h) + 2 * (sh) + v / 16]);                                   \
        if ((sh) & 1) *t1 = VFMA(dl, a, *t1);                                              \
        else *t0 = VFMA(dl, a, *t0);                                                       \
    }

static inline __attribute__((always_inline)) void blk_q2_k(const uint8_t *p, const float *x,
                                                            const float *xs, vf *t0, vf *t1,
                                                            float *mt) {
    (void)mt;
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256i m3 = _mm256_set1_epi8(3);
    float dsc[16];
    __m128i s8 = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(s8, m4), hi = _mm_and_si128(_mm_srli_epi16(s8, 4), m4);
    __m256 d = _mm256_set1_ps(hf(p + 80)), dm = _mm256_set1_ps(hf(p + 82));
    _mm256_storeu_ps(dsc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo))));
    _mm256_storeu_ps(dsc + 8, _mm256_mul_ps(
        d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)))));
    __m256 mlo = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)));
    __m256 mhi = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))));
    __m256 mn = _mm256_fmadd_ps(mhi, _mm256_loadu_ps(xs + 8), _mm256_mul_ps(mlo, _mm256_loadu_ps(xs)));
    *t1 = VSUBV(*t1, lo8(mn));
    for (int h = 0; h < 2; h++) {
        __m256i qv = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * h));
        for (int sh = 0; sh < 4; sh++) {
            __m256i c = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * sh), m3);
            DOT32G(c, h, sh)
        }
    }
}

static inline __attribute__((always_inline)) void blk_q3_k(const uint8_t *p, const float *x,
                                                            const float *xs, vf *t0, vf *t1,
                                                            float *mt) {
    (void)xs, (void)mt;
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), c4 = _mm256_set1_epi8(4);
    float dsc[16];
    __m256 slo, shi;
    q3k_scales16(p, hf(p + 108), &slo, &shi);
    _mm256_storeu_ps(dsc, slo);
    _mm256_storeu_ps(dsc + 8, shi);
    __m256i hv = _mm256_loadu_si256((const __m256i *)p);
    for (int h = 0; h < 2; h++) {
        __m256i qv = _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * h));
        for (int sh = 0; sh < 4; sh++) {
            __m256i lo = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * sh), m3);
            __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hv, 4 * h + sh), one);
            __m256i c = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)), c4);
            DOT32G(c, h, sh)
        }
    }
}

static inline __attribute__((always_inline)) void blk_q5_k(const uint8_t *p, const float *x,
                                                            const float *xs, vf *t0, vf *t1,
                                                            float *mt) {
    (void)mt;
    float dsc[8];
    __m256 scf, mf;
    q4k_scales_mins(p, &scf, &mf);
    _mm256_storeu_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(hf(p)), scf));
    __m256 mn = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(hf(p + 2)), mf), _mm256_loadu_ps(xs));
    *t1 = VSUBV(*t1, lo8(mn));
    q5k_subs(p, x, dsc, t0, t1);
}

GROUPK(group_q2_k, blk_q2_k, 84, 16)
GROUPK(group_q3_k, blk_q3_k, 110, 0)
GROUPK(group_q5_k, blk_q5_k, 176, 8)

/* whether M X rows run group_rows on an interleaved weight */
static int group_ok(const dq_t *s, long M) {
    if (M != 1 || s->R < 4) return 0;
    switch (s->code) {
    case S_Q4_0: case S_Q4_1: case S_Q5_1: case S_Q4_K: case S_Q6_K: return 1;
    case S_Q2_K: case S_Q3_K: case S_Q5_K: case S_Q5_0: return 1;
    default: return 0;
    }
}

/* y[0 .. R) for the interleaved group starting at row n0 (group_ok) */
static void group_rows(const dq_t *s, long n0, const float *x, const float *px, float *y) {
    const uint8_t *p = dq_row(s, n0);
    int G = s->R;
    switch (s->code) {
    case S_Q4_0: group_q4_0(G, p, s->nb, x, px, y); break;
    case S_Q4_1: group_q4_1(G, p, s->nb, x, px, y); break;
    case S_Q4_K: group_q4_k(G, p, s->nb, x, px, y); break;
    case S_Q6_K: group_q6_k(G, p, s->nb, x, px, y); break;
    case S_Q2_K: group_q2_k(G, p, s->nb, x, px, y); break;
    case S_Q3_K: group_q3_k(G, p, s->nb, x, px, y); break;
    case S_Q5_K: group_q5_k(G, p, s->nb, x, px, y); break;
    case S_Q5_0: group_q5_0(G, p, s->nb, x, px, y); break;
    default: group_q5_1(G, p, s->nb, x, px, y); break;
    }
}

/* ---- dispatch ---------------------------------------------------------------------- */
static int fused_ok(const dq_t *s) {
    switch (s->code) {
    case S_Q8_0: case S_Q5_0: case S_Q4_K: case S_Q6_K: return 1;
    case S_Q4_0: case S_Q4_1: case S_Q5_1: case S_Q2_K: case S_Q3_K: case S_Q5_K: return 1;
    case S_I8: return s->qk % VW == 0;
    case S_I4: return (s->qk / 2) % VW == 0;
    default: return 0;
    }
}

/* per X row: [K] prepared values: sums of X per `span` inputs (the min terms of Q4_1,
 * Q5_1, Q4_K, Q5_K: 32; Q2_K: 16) or the even / odd split (Int4) */
static void prep_x(const dq_t *s, const float *x, long K, float *out) {
    int span = 0;
    switch (s->code) {
    case S_Q4_1: case S_Q5_1: case S_Q4_K: case S_Q5_K: span = 32; break;
    case S_Q2_K: span = 16; break;
    default: break;
    }
    if (span) {
        for (long j = 0; j < K / span; j++) {
            float t = 0.0f;
            for (int l = 0; l < span; l++) t += x[j * span + l];
            out[j] = t;
        }
    } else if (s->code == S_I4) {
        for (long j = 0; j < K / 2; j++) {
            out[j] = x[2 * j];
            out[K / 2 + j] = x[2 * j + 1];
        }
    }
}

static float fused_row(const dq_t *s, long n, const float *x, const float *px, long K) {
    const uint8_t *p = dq_row(s, n);
    long st = dq_bst(s, n), nb = s->nb;
    switch (s->code) {
    case S_Q8_0: return row_q8_0(p, st, nb, x);
#if VW == 8
    case S_Q5_0: return row_q5_0_b(p, st, nb, x, px);
#else
    case S_Q5_0: return row_q5_0(p, st, nb, x);
#endif
    case S_Q4_K: return row_q4_k(p, st, nb, x, px);
    case S_Q6_K: return row_q6_k(p, st, nb, x);
    case S_Q4_0: return row_q4_0(p, st, nb, x, px);
    case S_Q4_1: return row_q4_1(p, st, nb, x, px);
    case S_Q5_1: return row_q5_1(p, st, nb, x, px);
    case S_Q2_K: return row_q2_k(p, st, nb, x, px);
    case S_Q3_K: return row_q3_k(p, st, nb, x);
    case S_Q5_K: return row_q5_k(p, st, nb, x, px);
    case S_I8:
        return row_i8((const int8_t *)p, s->scale + n * nb, s->zp + n * nb, nb, s->qk, x);
    default:
        return row_i4(p, s->scale + n * nb, s->zp + n * nb, nb, s->qk, px, px + K / 2);
    }
}
#endif
