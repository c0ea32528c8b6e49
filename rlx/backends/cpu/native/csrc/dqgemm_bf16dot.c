/* dqgemm part 8 of 8 (see dqgemm.c): the exact decode GEMV (M = 1, f32 activations) on
 * AVX-512 with avx512_bf16 (vdpbf16ps): rlx_dq_gemv_bf16, for Q4_0, Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K and Q6_K; and Q8_0 with f32 FMAs in groups of R rows (see the end of this
 * note; Q2_K, Q3_K keep the f32 kernels of dqgemm_rows_gguf.c).
 *
 * vdpbf16ps multiplies pairs of bf16 values (8 significant bits each) and adds both
 * products to an f32 lane: a product of two bf16 values has at most 16 significant bits,
 * so it is exact in f32, and only the additions round (RNE), as in an f32 FMA chain.
 *   - a weight's integer code (Q4_0 -8..7, Q5_0 -16..15, Q4_1 / Q4_K 0..15, Q5_1 / Q5_K
 *     0..31, Q6_K -32..31) is exact in bf16: the packed bytes are widened to 16-bit words
 *     and looked up in a table of the codes' bf16 bits (vpermw, 32 entries; vpermt2w, 64
 *     entries for Q6_K);
 *   - each f32 activation x is split once per call (shared by every row) into bf16 parts
 *     x = h + m + l: h = x rounded to 8 significant bits (RNE; truncated when rounding
 *     would overflow), m = (x - h) rounded the same way, l = x - h - m (x - h and l are
 *     exact f32 differences; l has at most 8 significant bits left, so l is exact in bf16).
 * A sub-block's sum of code * part products is scaled by its f32 scale d * sc afterwards
 * (one FMA per sub-block and row) and a min term (Q4_1 / Q5_1 m, Q4_K / Q5_K dmin m_j) is
 * the min times the per-32 sums of X (f32, once per call), as the f32 kernels do
 * (dqgemm_rows_gguf.c).
 *
 * Error: with the three parts the products are those of the exact x; with two (h + m) each
 * term errs by |q l| <= 2^-16 |q x| (|x - h| <= 2^-8 |x|, |l| <= 2^-8 |x - h|). The f32
 * accumulation bound the kernels keep, K 2^-23 sum |x| |w| (and for a split min term the same
 * on |d sc q| + |dmin m|), leaves room for that from K = 256: 2^-16 + n 2^-24 <= K 2^-23
 * for the addition chain per lane here, n <= 8 + K / 32 (at K = 256, 16 2^-24 + 2^-16 <
 * 2^-15). Two parts would do from K = 256 up, but they move a model's logits by more than
 * the f32 kernels' rounding does (Gemma-3-270M: 3.3e-4 at a largest logit of 28, against
 * the 1e-5 relative its transformers comparison keeps, and different greedy text): every
 * K takes the three parts, so each product is exact and only the summation order differs
 * from the f32 kernels (TWO_PARTS=1 at build time keeps the faster two-part split).
 * Non-finite x: +-inf is its own h (no rest), NaN a quiet NaN: the results are the f32
 * kernels' (+-inf, or NaN where an inf meets a zero code or another inf of opposite sign).
 * Denormals: vdpbf16ps reads bf16 inputs below 2^-126 as zero and flushes results below it;
 * a part below that range (an |x| under ~2^-110, or x itself denormal) is dropped: an
 * absolute error under 2^-125 per weight code unit times its scale, far below what any
 * f32 output resolves beside a normal term (and 0 when every x is that small: the f32
 * path's products would be denormal too).
 *
 * Groups: as group_rows (dqgemm_rows_gguf.c), an interleaved group of R rows is one
 * sequential stream, each X part load shared by the R rows; rows outside a group (the
 * N % R tail, or R = 1) run one at a time. Threads: OpenMP over groups, dynamic chunks of
 * ~32 KB of weight, as gemv. Only built with __AVX512BF16__ (the AVX-512 target on a CPU
 * with avx512_bf16): elsewhere rlx_dq_bf16_ok says 0 and the f32 kernels run.
 *
 * Not here: Q8_0's codes (-128..127) have no cheap bf16 conversion (a 256-entry table is
 * four vpermt2w, the f32 route is vpmovsxbd + vcvtdq2ps + vcvtne2ps2bf16 per 32, one op
 * more than the f32 kernel's convert + FMA), and with two parts vdpbf16ps does the same 16
 * multiply-adds of x per instruction as an FMA: nothing to gain. Its kernel here is the
 * f32 one (exact products of the f32 codes and x, f32 accumulation) run over a whole
 * interleaved group of R rows sharing each X load (rows4_q8_0 takes four), the scale
 * broadcast with vcvtph2ps: bit-identical per row, measured 1.05x in L2. With avx512_vnni,
 * interleaved groups run dqgemm_q8dig.c instead (the activation as integer digits,
 * vpdpbusd; blocks it cannot keep within the bound on this kernel's arithmetic), unless
 * RLX_DQ_Q8_DIGITS=0.
 * Q2_K / Q3_K: not done. */

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && VW == 16 && FUSED
#define BF16DOT 1

static inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }

/* bf16 bits of f32 lanes rounded to nearest even (a value that would round to infinity is
 * truncated instead), as f32 lanes with the low 16 bits cleared */
static inline __m512i bf16_rne(__m512i u) {
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    r = _mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u));
    const __m512i expm = _mm512_set1_epi32(0x7F800000);
    /* rounding carried into an all-ones exponent from a finite value: truncate */
    __mmask16 over = _mm512_cmpeq_epi32_mask(_mm512_and_si512(r, expm), expm) &
                     _mm512_cmpneq_epi32_mask(_mm512_and_si512(u, expm), expm);
    return _mm512_mask_and_epi32(r, over, u, _mm512_set1_epi32((int)0xFFFF0000u));
}

/* the high 16 bits of the 32 lanes of a and b (f32 with zero low halves) as 32 bf16 words
 * in order: a's 16 then b's 16 */
static inline __m512i pack_hi16(__m512i a, __m512i b) {
    const __m512i idx = _mm512_setr_epi32(
        0x00030001, 0x00070005, 0x000B0009, 0x000F000D, 0x00130011, 0x00170015, 0x001B0019,
        0x001F001D, 0x00230021, 0x00270025, 0x002B0029, 0x002F002D, 0x00330031, 0x00370035,
        0x003B0039, 0x003F003D);
    return _mm512_permutex2var_epi16(a, idx, b);
}

/* x[0 .. K) -> parts (bf16 words): xp[0 .. K) = h, xp[K .. 2K) = m, and with P = 3
 * xp[2K .. 3K) = l (K a multiple of 32) */
static void split_x(const float *x, long K, int P, uint16_t *xp) {
    for (long j = 0; j < K; j += 32) {
        __m512i hv[2], mv[2], lv[2];
        for (int t = 0; t < 2; t++) {
            __m512 xv = _mm512_loadu_ps(x + j + 16 * t);
            __m512i h = bf16_rne(_mm512_castps_si512(xv));
            /* +-inf: h = x, no rest; NaN: a quiet NaN (rounding could make it inf) */
            __mmask16 fin = _mm512_cmpneq_epi32_mask(
                _mm512_and_si512(_mm512_castps_si512(xv), _mm512_set1_epi32(0x7F800000)),
                _mm512_set1_epi32(0x7F800000));
            __mmask16 nan = _mm512_cmp_ps_mask(xv, xv, _CMP_UNORD_Q);
            h = _mm512_mask_mov_epi32(h, nan, _mm512_set1_epi32(0x7FC00000));
            /* exact (Sterbenz: h within a factor 2 of x) */
            __m512 r = _mm512_maskz_sub_ps(fin, xv, _mm512_castsi512_ps(h));
            __m512i m = bf16_rne(_mm512_castps_si512(r));
            __m512 l = _mm512_sub_ps(r, _mm512_castsi512_ps(m)); /* exact, <= 8 bits */
            hv[t] = h, mv[t] = m, lv[t] = _mm512_castps_si512(l);
        }
        _mm512_storeu_si512(xp + j, pack_hi16(hv[0], hv[1]));
        _mm512_storeu_si512(xp + K + j, pack_hi16(mv[0], mv[1]));
        if (P == 3) _mm512_storeu_si512(xp + 2 * K + j, pack_hi16(lv[0], lv[1]));
    }
}

/* sum over the P parts of code words c . part words at xp (32 of each, parts K apart):
 * 16 f32 lanes, lane i holding the products of inputs 2 i and 2 i + 1 */
static inline __attribute__((always_inline)) __m512 dot32(__m512i c, const uint16_t *xp,
                                                         long K, int P) {
    __m512 a = _mm512_dpbf16_ps(_mm512_setzero_ps(), as_bh(c), as_bh(_mm512_loadu_si512(xp)));
    a = _mm512_dpbf16_ps(a, as_bh(c), as_bh(_mm512_loadu_si512(xp + K)));
    if (P == 3) a = _mm512_dpbf16_ps(a, as_bh(c), as_bh(_mm512_loadu_si512(xp + 2 * K)));
    return a;
}

/* the bf16 bits of the integers lo .. lo + n - 1 (n <= 64), in a 64-word table (t[0] the
 * first 32 words, t[1] the rest); entries past n repeat modulo n */
static inline void code_table(int lo, int n, __m512i t[2]) {
    uint16_t w[64];
    for (int i = 0; i < 64; i++) {
        float f = (float)(lo + i % n);
        uint32_t u;
        memcpy(&u, &f, 4);
        w[i] = (uint16_t)(u >> 16); /* exact: |code| < 256 */
    }
    t[0] = _mm512_loadu_si512(w);
    t[1] = _mm512_loadu_si512(w + 32);
}

#ifndef PF_AHEAD
#define PF_AHEAD 4096
#endif

/* the f16 at p in all 16 lanes (vpbroadcastw + vcvtph2ps) */
static inline __m512 hf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)h));
}

/* Q4_K / Q5_K: the G rows' 8 sub-block scales d sc (into dsc) and their min terms
 * dmin m . (per-32 sums of X) accumulated into mins; rows `bytes` apart. */
static inline __attribute__((always_inline)) void kq_scales(int G, const uint8_t *p, long bytes,
                                                           __m256 xs8, float dsc[8][8],
                                                           __m256 *mins) {
    for (int r = 0; r < G; r++) {
        const uint8_t *q = p + r * bytes;
        __m256 scf, mf;
        q4k_scales_mins(q, &scf, &mf);
        _mm256_storeu_ps(dsc[r], _mm256_mul_ps(_mm256_set1_ps(hf(q)), scf));
        mins[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(hf(q + 2)), mf), xs8, mins[r]);
    }
}

/* ---- Q4_K: 144-byte blocks (half d, half dmin, 12 bytes of 6-bit scales / mins, 128 bytes
 * of nibbles); output 64 c + l is d sc_{2c} q - dmin m_{2c} (low nibble of qs[32 c + l],
 * l < 32), 64 c + 32 + l the high nibble with sc_{2c+1}, m_{2c+1}. ---- */
static inline __attribute__((always_inline)) void grp_q4_k(int G, const uint8_t *p, long st,
                                                          long nb, const uint16_t *xp, long K,
                                                          int P, const float *xs, float *y) {
    __m512i tb[2];
    code_table(0, 16, tb); /* word index: low 5 bits; entry i = bf16(i & 15) */
    __m512 t[8];
    __m256 mins[8];
    for (int r = 0; r < G; r++) t[r] = _mm512_setzero_ps(), mins[r] = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++, p += st, xp += 256, xs += 8) {
        for (int o = 0; o < G * 144; o += 64) __builtin_prefetch(p + PF_AHEAD + o, 0, 3);
        float dsc[8][8];
        __m256 xs8 = _mm256_loadu_ps(xs);
        kq_scales(G, p, 144, xs8, dsc, mins);
        for (int c = 0; c < 4; c++) {
            for (int r = 0; r < G; r++) {
                __m512i w = _mm512_cvtepu8_epi16(
                    _mm256_loadu_si256((const __m256i *)(p + r * 144 + 16 + 32 * c)));
                __m512i lo = _mm512_permutexvar_epi16(w, tb[0]);
                __m512i hi = _mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), tb[0]);
                __m512 alo = dot32(lo, xp + 64 * c, K, P);
                __m512 ahi = dot32(hi, xp + 64 * c + 32, K, P);
                t[r] = _mm512_fmadd_ps(_mm512_set1_ps(dsc[r][2 * c]), alo, t[r]);
                t[r] = _mm512_fmadd_ps(_mm512_set1_ps(dsc[r][2 * c + 1]), ahi, t[r]);
            }
        }
    }
    for (int r = 0; r < G; r++) y[r] = _mm512_reduce_add_ps(t[r]) - hsum8(mins[r]);
}

/* ---- Q6_K: 210-byte blocks (ql[128], qh[64], i8 scales[16], half d); output 128 h +
 * 32 g + l is d scale[8 h + 2 g + l / 16] (code - 32) (q6k_codes). ---- */
static inline __attribute__((always_inline)) void grp_q6_k(int G, const uint8_t *p, long st,
                                                          long nb, const uint16_t *xp, long K,
                                                          int P, const float *xs, float *y) {
    (void)xs;
    __m512i tb[2];
    code_table(-32, 64, tb);
    __m512 t[8];
    for (int r = 0; r < G; r++) t[r] = _mm512_setzero_ps();
    const __m512i sel = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (long b = 0; b < nb; b++, p += st, xp += 256) {
        for (int o = 0; o < G * 210; o += 64) __builtin_prefetch(p + PF_AHEAD + o, 0, 3);
        __m512 sc[8];
        for (int r = 0; r < G; r++) {
            __m256 s_lo, s_hi;
            q6k_scales(p + r * 210, hf(p + r * 210 + 208), &s_lo, &s_hi);
            sc[r] = _mm512_insertf32x8(_mm512_castps256_ps512(s_lo), s_hi, 1);
        }
        for (int h = 0; h < 2; h++) {
            for (int g = 0; g < 4; g++) {
                __m512i si = _mm512_add_epi32(sel, _mm512_set1_epi32(8 * h + 2 * g));
                for (int r = 0; r < G; r++) {
                    q6k_half_t half = q6k_half(p + r * 210, h);
                    __m512i w = _mm512_cvtepu8_epi16(q6k_codes(half, g));
                    __m512i c = _mm512_permutex2var_epi16(tb[0], w, tb[1]);
                    __m512 a = dot32(c, xp + 128 * h + 32 * g, K, P);
                    t[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(si, sc[r]), a, t[r]);
                }
            }
        }
    }
    for (int r = 0; r < G; r++) y[r] = _mm512_reduce_add_ps(t[r]);
}

/* ---- Q4_0: 18-byte blocks (half d, u8 qs[16]); output l is d (q - 8), q the low nibble
 * of qs[l] (l < 16), the high nibble of qs[l - 16] above. ---- */
static inline __attribute__((always_inline)) void grp_q4_0(int G, const uint8_t *p, long st,
                                                          long nb, const uint16_t *xp, long K,
                                                          int P, const float *xs, float *y) {
    (void)xs;
    __m512i tb[2];
    code_table(-8, 16, tb);
    __m512 t[8];
    for (int r = 0; r < G; r++) t[r] = _mm512_setzero_ps();
    for (long b = 0; b < nb; b++, p += st, xp += 32) {
        if ((b & 3) == 0)
            for (int o = 0; o < 4 * G * 18; o += 64) __builtin_prefetch(p + PF_AHEAD + o, 0, 3);
        for (int r = 0; r < G; r++) {
            __m128i v = _mm_loadu_si128((const __m128i *)(p + r * 18 + 2));
            __m256i nib = _mm256_set_m128i(_mm_srli_epi16(v, 4), v); /* low 4 bits index */
            __m512i c = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(nib), tb[0]);
            __m512 a = dot32(c, xp, K, P);
            t[r] = _mm512_fmadd_ps(hf16(p + r * 18), a, t[r]);
        }
    }
    for (int r = 0; r < G; r++) y[r] = _mm512_reduce_add_ps(t[r]);
}

/* ---- Q5_0: 22-byte blocks (half d, u32 qh, u8 qs[16]); output l is d (q - 16), q the low
 * nibble of qs[l] | bit l of qh << 4 (l < 16), the high nibble of qs[l - 16] | bit l of qh
 * << 4 above. ---- */
static inline __attribute__((always_inline)) void grp_q5_0(int G, const uint8_t *p, long st,
                                                          long nb, const uint16_t *xp, long K,
                                                          int P, const float *xs, float *y) {
    (void)xs;
    __m512i tb[2];
    code_table(-16, 32, tb);
    const __m512i m15 = _mm512_set1_epi16(15), c16 = _mm512_set1_epi16(16);
    __m512 t[8];
    for (int r = 0; r < G; r++) t[r] = _mm512_setzero_ps();
    for (long b = 0; b < nb; b++, p += st, xp += 32) {
        if ((b & 3) == 0)
            for (int o = 0; o < 4 * G * 22; o += 64) __builtin_prefetch(p + PF_AHEAD + o, 0, 3);
        for (int r = 0; r < G; r++) {
            const uint8_t *q = p + r * 22;
            uint32_t qh;
            memcpy(&qh, q + 2, 4);
            __m128i v = _mm_loadu_si128((const __m128i *)(q + 6));
            __m512i nib = _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_srli_epi16(v, 4), v));
            /* (nib & 15) | 16 where the qh bit is set: ternary logic A & B | C */
            __m512i idx = _mm512_ternarylogic_epi32(nib, m15, _mm512_maskz_mov_epi16(qh, c16),
                                                    0xEA);
            __m512i c = _mm512_permutexvar_epi16(idx, tb[0]);
            __m512 a = dot32(c, xp, K, P);
            t[r] = _mm512_fmadd_ps(hf16(q), a, t[r]);
        }
    }
    for (int r = 0; r < G; r++) y[r] = _mm512_reduce_add_ps(t[r]);
}

/* ---- Q4_1 (20-byte blocks: half d, half m, u8 qs[16]; w = d q + m) and Q5_1 (24-byte
 * blocks: half d, half m, u32 qh, u8 qs[16]; w = d q5 + m): codes as Q4_0 / Q5_0 without
 * the offset, the min m times the block's sum of X (xs) added per row in f32. ---- */
static inline __attribute__((always_inline)) void grp_q41_q51(int G, int five,
                                                             const uint8_t *p, long st,
                                                             long nb, const uint16_t *xp,
                                                             long K, int P, const float *xs,
                                                             float *y) {
    __m512i tb[2];
    code_table(0, 32, tb); /* Q4_1 indices keep bit 4 clear */
    const __m512i m15 = _mm512_set1_epi16(15), c16 = _mm512_set1_epi16(16);
    const int bb = five ? 24 : 20, qs = five ? 8 : 4;
    __m512 t[8];
    float mt[8];
    for (int r = 0; r < G; r++) t[r] = _mm512_setzero_ps(), mt[r] = 0.0f;
    for (long b = 0; b < nb; b++, p += st, xp += 32, xs++) {
        if ((b & 3) == 0)
            for (int o = 0; o < 4 * G * bb; o += 64) __builtin_prefetch(p + PF_AHEAD + o, 0, 3);
        for (int r = 0; r < G; r++) {
            const uint8_t *q = p + r * bb;
            __m128i v = _mm_loadu_si128((const __m128i *)(q + qs));
            __m512i nib = _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_srli_epi16(v, 4), v));
            __m512i hb = _mm512_setzero_si512();
            if (five) {
                uint32_t qh;
                memcpy(&qh, q + 4, 4);
                hb = _mm512_maskz_mov_epi16(qh, c16);
            }
            __m512i idx = _mm512_ternarylogic_epi32(nib, m15, hb, 0xEA); /* A & B | C */
            __m512 a = dot32(_mm512_permutexvar_epi16(idx, tb[0]), xp, K, P);
            t[r] = _mm512_fmadd_ps(hf16(q), a, t[r]);
            mt[r] += hf(q + 2) * xs[0];
        }
    }
    for (int r = 0; r < G; r++) y[r] = _mm512_reduce_add_ps(t[r]) + mt[r];
}
static inline __attribute__((always_inline)) void grp_q4_1(int G, const uint8_t *p, long st,
                                                          long nb, const uint16_t *xp, long K,
                                                          int P, const float *xs, float *y) {
    grp_q41_q51(G, 0, p, st, nb, xp, K, P, xs, y);
}
static inline __attribute__((always_inline)) void grp_q5_1(int G, const uint8_t *p, long st,
                                                          long nb, const uint16_t *xp, long K,
                                                          int P, const float *xs, float *y) {
    grp_q41_q51(G, 1, p, st, nb, xp, K, P, xs, y);
}

/* words with bit `bit` of hv moved to bit 4 (the other bits are not used) */
static inline __m512i bit_to4(__m512i hv, int bit) {
    if (bit < 4) return _mm512_slli_epi16(hv, (unsigned)(4 - bit));
    return _mm512_srli_epi16(hv, (unsigned)(bit - 4));
}

/* ---- Q5_K: 176-byte blocks (half d, half dmin, 12 bytes of scales / mins as Q4_K, u8
 * qh[32], u8 qs[128]); output 32 j + l is d sc_j q - dmin m_j, q = the nibble of qs[32 (j /
 * 2) + l] (low for even j) | bit j of qh[l] << 4. ---- */
static inline __attribute__((always_inline)) void grp_q5_k(int G, const uint8_t *p, long st,
                                                          long nb, const uint16_t *xp, long K,
                                                          int P, const float *xs, float *y) {
    __m512i tb[2];
    code_table(0, 32, tb);
    const __m512i m15 = _mm512_set1_epi16(15);
    __m512 t[8];
    __m256 mins[8];
    for (int r = 0; r < G; r++) t[r] = _mm512_setzero_ps(), mins[r] = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++, p += st, xp += 256, xs += 8) {
        for (int o = 0; o < G * 176; o += 64) __builtin_prefetch(p + PF_AHEAD + o, 0, 3);
        float dsc[8][8];
        __m256 xs8 = _mm256_loadu_ps(xs);
        kq_scales(G, p, 176, xs8, dsc, mins);
        for (int c = 0; c < 4; c++) {
            for (int r = 0; r < G; r++) {
                const uint8_t *q = p + r * 176;
                __m512i hv = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 16)));
                __m512i w = _mm512_cvtepu8_epi16(
                    _mm256_loadu_si256((const __m256i *)(q + 48 + 32 * c)));
                /* bits 0-3 from the nibble, bit 4 from qh: (B ? A : C) with B = 15 */
                __m512i ilo = _mm512_ternarylogic_epi32(w, m15, bit_to4(hv, 2 * c), 0xE2);
                __m512i ihi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(w, 4), m15,
                                                        bit_to4(hv, 2 * c + 1), 0xE2);
                __m512 alo = dot32(_mm512_permutexvar_epi16(ilo, tb[0]), xp + 64 * c, K, P);
                __m512 ahi = dot32(_mm512_permutexvar_epi16(ihi, tb[0]), xp + 64 * c + 32, K, P);
                t[r] = _mm512_fmadd_ps(_mm512_set1_ps(dsc[r][2 * c]), alo, t[r]);
                t[r] = _mm512_fmadd_ps(_mm512_set1_ps(dsc[r][2 * c + 1]), ahi, t[r]);
            }
        }
    }
    for (int r = 0; r < G; r++) y[r] = _mm512_reduce_add_ps(t[r]) - hsum8(mins[r]);
}

/* ---- Q8_0 (34-byte blocks: half d, i8 qs[32]): f32 FMA (see the note at the top: bf16
 * has nothing to gain here), G rows sharing each X load, the block scale applied to the
 * block's vector sum. xp: the f32 X itself. ---- */
static inline __attribute__((always_inline)) void grp_q8_0(int G, const uint8_t *p, long st,
                                                          long nb, const float *x, float *y) {
    __m512 t[8];
    for (int r = 0; r < G; r++) t[r] = _mm512_setzero_ps();
    for (long b = 0; b < nb; b++, p += st, x += 32) {
        if ((b & 1) == 0)
            for (int o = 0; o < 2 * G * 34; o += 64) __builtin_prefetch(p + PF_AHEAD + o, 0, 3);
        __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        for (int r = 0; r < G; r++) {
            const uint8_t *q = p + r * 34;
            __m512 a = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 2)))),
                x0);
            a = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 18)))),
                x1, a);
            t[r] = _mm512_fmadd_ps(hf16(q), a, t[r]);
        }
    }
    for (int r = 0; r < G; r++) y[r] = _mm512_reduce_add_ps(t[r]);
}
static void f32_q8_0(int G, const uint8_t *p, long st, long nb, const float *x, float *y) {
    if (G == 8) grp_q8_0(8, p, st, nb, x, y);
    else if (G == 4) grp_q8_0(4, p, st, nb, x, y);
    else grp_q8_0(1, p, st, nb, x, y);
}

/* G rows (G = 8, 4 or 1) from p (row r's block b at p + b st + r bb) */
#define BF16_GROUPS(name, fn)                                                              \
    static void name(int G, const uint8_t *p, long st, long nb, const uint16_t *xp, long K, \
                     int P, const float *xs, float *y) {                                   \
        if (G == 8 && P == 2) fn(8, p, st, nb, xp, K, 2, xs, y);                           \
        else if (G == 8) fn(8, p, st, nb, xp, K, 3, xs, y);                                \
        else if (G == 4 && P == 2) fn(4, p, st, nb, xp, K, 2, xs, y);                      \
        else if (G == 4) fn(4, p, st, nb, xp, K, 3, xs, y);                                \
        else if (P == 2) fn(1, p, st, nb, xp, K, 2, xs, y);                                \
        else fn(1, p, st, nb, xp, K, 3, xs, y);                                            \
    }
BF16_GROUPS(bf16_q4_k, grp_q4_k)
BF16_GROUPS(bf16_q6_k, grp_q6_k)
BF16_GROUPS(bf16_q4_0, grp_q4_0)
BF16_GROUPS(bf16_q5_0, grp_q5_0)
BF16_GROUPS(bf16_q4_1, grp_q4_1)
BF16_GROUPS(bf16_q5_1, grp_q5_1)
BF16_GROUPS(bf16_q5_k, grp_q5_k)
#endif

/* 1 when rlx_dq_gemv_bf16 runs scheme `code` in this build */
int rlx_dq_bf16_ok(int code) {
#ifdef BF16DOT
    switch (code) {
    case S_Q4_0: case S_Q4_1: case S_Q5_0: case S_Q5_1: case S_Q4_K: case S_Q5_K: case S_Q6_K:
    case S_Q8_0:
        return 1;
    default: return 0;
    }
#else
    (void)code;
    return 0;
#endif
}

/* y[N] = W x for one f32 activation row x[K] (see the top of this file); q8dig: Q8_0 on
 * interleaved rows takes dqgemm_q8dig.c where this build has it (0: the f32 group kernel).
 * Returns 0, 1 when a scratch buffer could not be allocated, 2 on bad arguments, 3 when
 * this build has no bf16 kernel for `code` (rlx_dq_bf16_ok). */
int rlx_dq_gemv_bf16(int code, long qk, long bb, long N, long K, const float *x,
                     const uint8_t *w, long row_bytes, float *y, int threads, int R, int q8dig) {
    if (!rlx_dq_bf16_ok(code)) return 3;
#ifdef BF16DOT
    if (qk <= 0 || K % qk || K % 32 || N < 0 || threads < 1 || !dq_r_ok(code, R)) return 2;
    if (N == 0) return 0;
    if (K == 0) {
        memset(y, 0, (size_t)N * 4);
        return 0;
    }
    dq_t s = {code, qk, bb, K / qk, row_bytes, w, 0, 0, 0, N, R};
#ifndef TWO_PARTS
#define TWO_PARTS 0
#endif
    int P = (TWO_PARTS && K >= 256) ? 2 : 3; /* see the top of this file */
    long nxs = (code == S_Q4_K || code == S_Q5_K || code == S_Q4_1 || code == S_Q5_1) ? K / 32 : 0;
    /* parts (P K words) then the per-32 sums of X (the min terms) */
    uint16_t *xp = (uint16_t *)aligned_alloc(64, (size_t)((P * K * 2 + nxs * 4 + 63) / 64 * 64));
    if (!xp) return 1;
    float *xs = (float *)(xp + P * K);
    if (code != S_Q8_0) split_x(x, K, P, xp); /* Q8_0 reads x itself */
#ifdef Q8DIG
    /* Q8_0 on interleaved groups: the activation digits (dqgemm_q8dig.c) */
    q8dig_t dig = {0};
    uint8_t *digbuf = 0;
    if (code == S_Q8_0 && R > 1 && N >= R && q8dig) {
        digbuf = (uint8_t *)aligned_alloc(64, (q8dig_bytes(s.nb) + 63) / 64 * 64);
        if (!digbuf) {
            free(xp);
            return 1;
        }
        q8dig_prep(x, s.nb, K, digbuf, &dig);
    }
#endif
    for (long j = 0; j < nxs; j++) {
        float tsum = 0.0f;
        for (int l = 0; l < 32; l++) tsum += x[32 * j + l];
        xs[j] = tsum;
    }
    long per = 262144, want = (N * row_bytes + per - 1) / per;
    if (want < threads) threads = want < 1 ? 1 : (int)want;
    long G = R > 1 ? R : 1;
    long full = N - N % G, units = full / G + (N - full);
    long uchunk = 32768 / (G * row_bytes);
    if (uchunk < 1) uchunk = 1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, uchunk)
    for (long u = 0; u < units; u++) {
        long n0 = u < full / G ? u * G : full + (u - full / G);
        int g = u < full / G ? (int)G : 1;
        const uint8_t *p = dq_row(&s, n0);
        long st = dq_bst(&s, n0);
        switch (code) {
        case S_Q4_K: bf16_q4_k(g, p, st, s.nb, xp, K, P, xs, y + n0); break;
        case S_Q6_K: bf16_q6_k(g, p, st, s.nb, xp, K, P, xs, y + n0); break;
        case S_Q5_0: bf16_q5_0(g, p, st, s.nb, xp, K, P, xs, y + n0); break;
        case S_Q4_1: bf16_q4_1(g, p, st, s.nb, xp, K, P, xs, y + n0); break;
        case S_Q5_1: bf16_q5_1(g, p, st, s.nb, xp, K, P, xs, y + n0); break;
        case S_Q5_K: bf16_q5_k(g, p, st, s.nb, xp, K, P, xs, y + n0); break;
        case S_Q8_0:
#ifdef Q8DIG
            if (digbuf && (g == 8 || g == 4)) {
                q8dig_rows(g, p, st, s.nb, x, &dig, y + n0);
                break;
            }
#endif
            f32_q8_0(g, p, st, s.nb, x, y + n0);
            break;
        default: bf16_q4_0(g, p, st, s.nb, xp, K, P, xs, y + n0); break;
        }
    }
    free(xp);
#ifdef Q8DIG
    free(digbuf);
#endif
    return 0;
#else
    (void)qk, (void)bb, (void)N, (void)K, (void)x, (void)w, (void)row_bytes, (void)y;
    (void)threads, (void)R, (void)q8dig;
    return 3;
#endif
}
