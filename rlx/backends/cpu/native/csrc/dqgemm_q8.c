/* dqgemm part 6 of 7 (see dqgemm.c): the integer path, activations quantized to q8 (as
 * llama.cpp's vec_dot kernels), for every GGUF layout but Q8_K.
 *
 * Activations: each X row is quantized once per call, per block of 32 inputs, to int8
 * codes xq = round(x / dx) with dx = max|x| / 127 (round to nearest even), so
 * |x - dx * xq| <= dx / 2 (plus f32 rounding of x / dx). Per 16 inputs the scaled sum
 * dx * sum(xq) is kept for the weight's offset terms.
 *
 * Weights: each row is brought to one form, w = ws[g] * q[j] + wo[g] (g: the 32 or, for
 * Q6_K, 16 inputs sharing a scale), with q unsigned 0..63 (Q4_K: 0..15 scale d * sc,
 * offset -dmin * m; Q6_K: 0..63 scale d * sc, offset -32 d * sc), or signed with no offset
 * (Q5_0: q - 16 in -16..15; Q4_0: q - 8; Q8_0: the codes read in place, stride 34); Q4_1
 * and Q5_1 are unsigned with scale d and offset m per 32, Q5_K as Q4_K with 5-bit codes,
 * Q2_K / Q3_K as Q6_K with 2- / 3-bit codes (offsets -dmin m / -4 d scl per 16). On AVX2 /
 * AVX-512 below 4 X rows every layout skips this prepared copy (gemv_q8_direct: q8_row32,
 * q8_row_q45_k, q8_row_k16 read the codes straight from the packed bytes, reduce the
 * per-block dot products to one vector and scale it by one FMA), and so do, at every M,
 * the layouts whose prepared copy is built by scalar code (Q4_0, Q4_1, Q5_1, Q2_K, Q3_K,
 * Q5_K). The product of a 32-input block is an exact integer
 * dot product per 16 (vpdpbusd on AVX-512 VNNI; vpmaddubsw + vpmaddwd on AVX2; with
 * Q8_0's signs moved onto X by vpsignb), scaled in f32 by ws * dx and summed; the offsets
 * add dot(wo, dx * sum(xq)) over the K / 16 groups.
 *
 * Error against the f64 product of the decoded weight: sum_j |w_j| dx_j / 2 (the
 * activation rounding) plus f32 rounding of the scale products and of the sum over
 * blocks (about K / 32 * 2^-23 relative to sum_j |ws q_j| + |wo| times |x_j|).
 */

#include <math.h>
#include "gguf_unpack.h"

#if VW >= 8
#define Q8_HF(p) hf(p) /* F16C */
#else
#define Q8_HF(p) h2f(p)
#endif

static int q8_ok(int code) {
    switch (code) {
    case S_Q8_0: case S_Q5_0: case S_Q4_0: case S_Q4_1: case S_Q5_1:
    case S_Q2_K: case S_Q3_K: case S_Q4_K: case S_Q5_K: case S_Q6_K:
        return 1;
    default: return 0;
    }
}

/* X row -> int8 codes q[K], scales d[K / 32], scaled sums s16[K / 16] and s32[K / 32]. A
 * non-finite block gets a NaN scale (the outputs it touches are NaN). */
static void quant_x(const float *x, long K, int8_t *q, float *d, float *s16, float *s32) {
    for (long b = 0; b < K / 32; b++) {
        const float *xb = x + 32 * b;
        int s0 = 0, s1 = 0;
        float db;
#if VW >= 8
        __m256 v[4], mx = _mm256_setzero_ps(), z = _mm256_setzero_ps();
        const __m256 sign = _mm256_set1_ps(-0.0f);
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
            z = _mm256_add_ps(z, _mm256_mul_ps(v[i], _mm256_setzero_ps())); /* NaN if any inf/nan */
        }
        int bad = _mm256_movemask_ps(_mm256_cmp_ps(z, z, _CMP_UNORD_Q)) != 0;
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        float amax = _mm_cvtss_f32(m4);
        db = amax / 127.0f;
        float id = db != 0.0f && !bad ? 1.0f / db : 0.0f;
        __m256i iv[4];
        for (int i = 0; i < 4; i++) iv[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
        __m256i a = _mm256_add_epi32(iv[0], iv[1]), c = _mm256_add_epi32(iv[2], iv[3]);
        __m128i a4 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        __m128i c4 = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        a4 = _mm_hadd_epi32(a4, c4);
        a4 = _mm_hadd_epi32(a4, a4);
        s0 = _mm_cvtsi128_si32(a4);
        s1 = _mm_extract_epi32(a4, 1);
        __m256i p0 = _mm256_packs_epi32(iv[0], iv[1]), p1 = _mm256_packs_epi32(iv[2], iv[3]);
        p0 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p0, p1),
                                          _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), p0);
#else
        float amax = 0.0f;
        int bad = 0;
        for (int j = 0; j < 32; j++) {
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
            bad |= !(a <= 3.4e38f);
        }
        db = amax / 127.0f;
        float id = db != 0.0f ? 1.0f / db : 0.0f;
        for (int j = 0; j < 32; j++) {
            int v = bad ? 0 : (int)lrintf(xb[j] * id);
            q[32 * b + j] = (int8_t)v;
            if (j < 16) s0 += v;
            else s1 += v;
        }
#endif
        if (bad) db = NAN;
        d[b] = db;
        s16[2 * b] = db * (float)s0;
        s16[2 * b + 1] = db * (float)s1;
        s32[b] = db * (float)(s0 + s1);
    }
}

/* Q4_K scale j and min j (6 bits each) of the block whose 12 scale bytes are at q */
static inline void q4k_sm(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q3_K block p: the 16 scales d * scl (sc) and offsets -4 d * scl (of) of its 16-runs */
static inline void q3k_scales(const uint8_t *p, float *sc, float *of) {
    const uint8_t *s = p + 96;
    float d = Q8_HF(p + 108);
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
        int hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
        sc[i] = d * (float)((lo | (hi << 4)) - 32);
        of[i] = -4.0f * sc[i];
    }
}

/* Row n of the weight in the form above: codes in wq (or *qp pointing into the packed row,
 * stride *stride per 32 codes). Q8_0 / Q5_0 (signed codes, no offset): ws per 32
 * (returns 0); Q4_K: ws / wo per 32 (returns 1);
 * Q6_K: ws as 8 lanes per 32 codes (lanes 0-3 the scale of the first 16, 4-7 the
 * second) and wo per 16 (returns 2). */
static int prep_row(const dq_t *s, long n, uint8_t *restrict wq, float *restrict ws,
                    float *restrict wo, const uint8_t **qp, long *stride) {
    const uint8_t *p = dq_row(s, n);
    long st = dq_bst(s, n); /* block to block: bb plain, R bb interleaved */
    *qp = wq;
    *stride = 32;
    switch (s->code) {
    case S_Q8_0:
        for (long b = 0; b < s->nb; b++) ws[b] = Q8_HF(p + st * b);
        *qp = p + 2;
        *stride = st;
        return 0;
    case S_Q5_0: /* signed codes q - 16 (as Q8_0's, no offset term) */
        for (long b = 0; b < s->nb; b++, p += st, wq += 32) {
            uint32_t qh;
            memcpy(&qh, p + 2, 4);
            const uint8_t *qs = p + 6;
#if VW >= 8
            __m128i v = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(15);
            __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4),
                                           _mm_and_si128(v, m4));
            const __m256i hi = _mm256_set1_epi8((char)0xF0); /* nib - 16 as int8 */
#if VW == 16 /* AVX-512 BW + VL: bit j of qh keeps byte j at nib (= q - 16) */
            nib = _mm256_mask_mov_epi8(_mm256_or_si256(nib, hi), (__mmask32)qh, nib);
#else
            /* bit j of qh -> byte j (llama.cpp's bytes_from_bits_32) */
            const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101LL,
                                                    0x0202020202020202LL, 0x0303030303030303LL);
            __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
            bits = _mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
            bits = _mm256_cmpeq_epi8(bits, _mm256_set1_epi64x(-1));
            nib = _mm256_or_si256(nib, _mm256_andnot_si256(bits, hi));
#endif
            _mm256_storeu_si256((__m256i *)wq, nib);
#else
            for (int j = 0; j < 16; j++) {
                int lo = (qs[j] & 15) | (((qh >> j) & 1) << 4);
                int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                wq[j] = (uint8_t)(int8_t)(lo - 16);
                wq[j + 16] = (uint8_t)(int8_t)(hi - 16);
            }
#endif
            ws[b] = Q8_HF(p);
        }
        return 0;
    case S_Q4_0: /* signed codes q - 8, no offset */
        for (long b = 0; b < s->nb; b++, p += st, wq += 32) {
            for (int j = 0; j < 16; j++) {
                wq[j] = (uint8_t)(int8_t)((p[2 + j] & 15) - 8);
                wq[j + 16] = (uint8_t)(int8_t)((p[2 + j] >> 4) - 8);
            }
            ws[b] = Q8_HF(p);
        }
        return 0;
    case S_Q4_1: /* unsigned codes, scale d and offset m per 32 (kind 1) */
    case S_Q5_1: {
        int five = s->code == S_Q5_1;
        for (long b = 0; b < s->nb; b++, p += st, wq += 32) {
            uint32_t qh = 0;
            if (five) memcpy(&qh, p + 4, 4);
            const uint8_t *qs = p + 4 + 4 * five;
            for (int j = 0; j < 16; j++) {
                wq[j] = (uint8_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
                wq[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
            }
            ws[b] = Q8_HF(p);
            wo[b] = Q8_HF(p + 2);
        }
        return 1;
    }
    case S_Q5_K: /* as Q4_K, codes 0..31 (bit 4 from qh) */
        for (long b = 0; b < s->nb; b++, p += st, wq += 256) {
            float d = Q8_HF(p), dmin = Q8_HF(p + 2);
            const uint8_t *qh = p + 16, *qs = p + 48;
            for (int j = 0; j < 8; j++) {
                int sc, m;
                q4k_sm(p + 4, j, &sc, &m);
                ws[8 * b + j] = d * (float)sc;
                wo[8 * b + j] = -(dmin * (float)m);
                for (int l = 0; l < 32; l++)
                    wq[32 * j + l] = (uint8_t)(((qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 15) |
                                               (((qh[l] >> j) & 1) << 4));
            }
        }
        return 1;
    case S_Q4_K:
        for (long b = 0; b < s->nb; b++, p += st, wq += 256) {
            float d = Q8_HF(p), dmin = Q8_HF(p + 2);
            const uint8_t *qs = p + 16;
#if VW >= 8
            __m256 scf, mf;
            q4k_scales_mins(p, &scf, &mf);
            _mm256_storeu_ps(ws + 8 * b, _mm256_mul_ps(_mm256_set1_ps(d), scf));
            _mm256_storeu_ps(wo + 8 * b,
                             _mm256_sub_ps(_mm256_setzero_ps(),
                                           _mm256_mul_ps(_mm256_set1_ps(dmin), mf)));
            const __m256i m4 = _mm256_set1_epi8(15);
            for (int c = 0; c < 4; c++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
                _mm256_storeu_si256((__m256i *)(wq + 64 * c), _mm256_and_si256(v, m4));
                _mm256_storeu_si256((__m256i *)(wq + 64 * c + 32),
                                    _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
#else
            for (int j = 0; j < 8; j++) {
                int sc, m;
                q4k_sm(p + 4, j, &sc, &m);
                ws[8 * b + j] = d * (float)sc;
                wo[8 * b + j] = -(dmin * (float)m);
            }
            for (int c = 0; c < 4; c++)
                for (int l = 0; l < 32; l++) {
                    wq[64 * c + l] = qs[32 * c + l] & 15;
                    wq[64 * c + 32 + l] = qs[32 * c + l] >> 4;
                }
#endif
        }
        return 1;
    case S_Q2_K: /* codes 0..3, scale d sc & 15 and offset -dmin sc >> 4 per 16 */
    case S_Q3_K: /* codes 0..7 (bit 2 from hmask), scale d scl and offset -4 d scl per 16 */
        for (long b = 0; b < s->nb; b++, p += st, wq += 256) {
            float sc16[16], of16[16];
            const uint8_t *qs = p + (s->code == S_Q2_K ? 16 : 32), *hm = p;
            if (s->code == S_Q2_K) {
                float d = Q8_HF(p + 80), dmin = Q8_HF(p + 82);
                for (int i = 0; i < 16; i++) {
                    sc16[i] = d * (float)(p[i] & 15);
                    of16[i] = -(dmin * (float)(p[i] >> 4));
                }
            } else {
                q3k_scales(p, sc16, of16);
            }
            for (int i = 0; i < 16; i++) {
                wo[16 * b + i] = of16[i];
                for (int l = 0; l < 4; l++) ws[64 * b + 8 * (i / 2) + 4 * (i & 1) + l] = sc16[i];
            }
            for (int h = 0; h < 2; h++)
                for (int sh = 0; sh < 4; sh++)
                    for (int l = 0; l < 32; l++) {
                        int c = (qs[32 * h + l] >> (2 * sh)) & 3;
                        if (s->code == S_Q3_K) c |= ((hm[l] >> (4 * h + sh)) & 1) << 2;
                        wq[128 * h + 32 * sh + l] = (uint8_t)c;
                    }
        }
        return 2;
    default: /* S_Q6_K */
        for (long b = 0; b < s->nb; b++, p += st, wq += 256) {
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = Q8_HF(p + 208);
            float *w8 = ws + 64 * b;
            for (int i = 0; i < 16; i++) wo[16 * b + i] = -32.0f * (d * (float)sc[i]);
#if VW >= 8
            __m256 lo8, hi8;
            q6k_scales(p, d, &lo8, &hi8);
            for (int i = 0; i < 8; i++) {
                __m256i idx = _mm256_set_m128i(_mm_set1_epi32((2 * i + 1) & 7),
                                               _mm_set1_epi32((2 * i) & 7));
                _mm256_storeu_ps(w8 + 8 * i, _mm256_permutevar8x32_ps(i < 4 ? lo8 : hi8, idx));
            }
            for (int h = 0; h < 2; h++) {
                q6k_half_t half = q6k_half(p, h);
                for (int g = 0; g < 4; g++)
                    _mm256_storeu_si256((__m256i *)(wq + h * 128 + g * 32), q6k_codes(half, g));
            }
#else
            const uint8_t *ql = p, *qh = p + 128;
            for (int i = 0; i < 16; i++)
                for (int l = 0; l < 4; l++) w8[4 * i + l] = d * (float)sc[i];
            for (int h = 0; h < 2; h++)
                for (int g = 0; g < 4; g++)
                    for (int l = 0; l < 32; l++) {
                        int lo = (ql[h * 64 + (g & 1) * 32 + l] >> ((g >> 1) * 4)) & 15;
                        int hi = (qh[h * 32 + l] >> (2 * g)) & 3;
                        wq[h * 128 + g * 32 + l] = (uint8_t)(lo | (hi << 4));
                    }
#endif
        }
        return 2;
    }
}

#define Q8_MR 4 /* X rows per pass over a prepared weight row */

#if VW >= 8
/* sums of 4 adjacent u8 x s8 products, as 8 i32 lanes (lanes 0-3: bytes 0-15) */
static inline __m256i dp_us(__m256i u, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
}

/* acc + (block's integer products) * scale: sc = ws * dx (per32) or sv[0..8] * dx (per16) */
static inline __attribute__((always_inline)) __m256 q8_blk(__m256 acc, const uint8_t *wp,
                                                            const int8_t *xp, float sc,
                                                            const float *sv, int per16, int sgn) {
    __m256i w = _mm256_loadu_si256((const __m256i *)wp);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xp);
    __m256i u = w;
    if (sgn) {
        u = _mm256_sign_epi8(w, w);
        xv = _mm256_sign_epi8(xv, w);
    }
    __m256 f = _mm256_cvtepi32_ps(dp_us(u, xv));
    __m256 s = per16 ? _mm256_mul_ps(_mm256_loadu_ps(sv), _mm256_set1_ps(sc)) : _mm256_set1_ps(sc);
    return _mm256_fmadd_ps(f, s, acc);
}

/* out[r] = sum_b dx[r][b] * (ws-weighted integer products of block b) for the mr X rows
 * at xq + r * K (weight codes signed when sgn) */
static inline __attribute__((always_inline)) void q8_dot(
    const uint8_t *wq, long stride, const float *ws, int per16, int sgn, long nb,
    const int8_t *xq, long K, const float *dx, long nbx, int mr, float *out) {
#define Q8_SC(r, b) (per16 ? dx[(r) * nbx + (b)] : ws[b] * dx[(r) * nbx + (b)])
    if (mr == 1) { /* 4 accumulators: the FMA latency, not its throughput, bounds one chain */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        long b = 0;
        for (; b + 4 <= nb; b += 4) {
            a0 = q8_blk(a0, wq + b * stride, xq + 32 * b, Q8_SC(0, b), ws + 8 * b, per16, sgn);
            a1 = q8_blk(a1, wq + (b + 1) * stride, xq + 32 * (b + 1), Q8_SC(0, b + 1),
                        ws + 8 * (b + 1), per16, sgn);
            a2 = q8_blk(a2, wq + (b + 2) * stride, xq + 32 * (b + 2), Q8_SC(0, b + 2),
                        ws + 8 * (b + 2), per16, sgn);
            a3 = q8_blk(a3, wq + (b + 3) * stride, xq + 32 * (b + 3), Q8_SC(0, b + 3),
                        ws + 8 * (b + 3), per16, sgn);
        }
        for (; b < nb; b++)
            a0 = q8_blk(a0, wq + b * stride, xq + 32 * b, Q8_SC(0, b), ws + 8 * b, per16, sgn);
        out[0] = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        return;
    }
    __m256 acc[Q8_MR];
    for (int r = 0; r < Q8_MR; r++) acc[r] = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++)
        for (int r = 0; r < mr; r++)
            acc[r] = q8_blk(acc[r], wq + b * stride, xq + r * K + 32 * b, Q8_SC(r, b),
                            ws + 8 * b, per16, sgn);
    for (int r = 0; r < mr; r++) out[r] = hsum8(acc[r]);
#undef Q8_SC
}
#define Q8_DOT(mr, per16, sgn)                                                                  \
    q8_dot(q, stride, ws, per16, sgn, nb32, xq + m0 * K, K, dx + m0 * nb32, nb32, mr, part)
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define DQ_NEON_PART 2
#include "dqgemm_neon.h"
#undef DQ_NEON_PART
#else
static void q8_dot_c(const uint8_t *wq, long stride, const float *ws, int per16, int sgn,
                     long nb, const int8_t *xq, long K, const float *dx, long nbx, int mr,
                     float *out) {
    for (int r = 0; r < mr; r++) {
        float acc = 0.0f;
        for (long b = 0; b < nb; b++) {
            const uint8_t *w = wq + b * stride;
            const int8_t *xb = xq + r * K + 32 * b;
            int s0 = 0, s1 = 0;
            for (int j = 0; j < 16; j++) {
                s0 += (sgn ? (int)(int8_t)w[j] : (int)w[j]) * xb[j];
                s1 += (sgn ? (int)(int8_t)w[j + 16] : (int)w[j + 16]) * xb[j + 16];
            }
            float d = dx[r * nbx + b];
            if (per16) acc += d * (ws[8 * b] * (float)s0 + ws[8 * b + 4] * (float)s1);
            else acc += (ws[b] * d) * (float)(s0 + s1);
        }
        out[r] = acc;
    }
}
#define Q8_DOT(mr, per16, sgn)                                                                  \
    q8_dot_c(q, stride, ws, per16, sgn, nb32, xq + m0 * K, K, dx + m0 * nb32, nb32, mr, part)
#endif

#if VW >= 8
/* ---- M = 1, the 32-weight layouts: one row straight from its packed bytes (no prepared
 * copy), two blocks per step into separate accumulators. Per block: the 32 codes as bytes
 * (signed: Q8_0, Q4_0 q - 8, Q5_0 q - 16, their signs moved onto X; unsigned: Q4_1 / Q5_1
 * q, whose min m adds m * dx * sum(xq) over the block), one integer dot product, one FMA
 * by d * dx. ---- */
static inline __m256i q4_nibbles(const uint8_t *qs) {
    const __m128i m4 = _mm_set1_epi8(15);
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}

/* the 32 5-bit codes of a Q5_0 / Q5_1 block (nibbles at qs, bit j of qh as bit 4 of byte
 * j), as llama.cpp's bytes_from_bits_32 */
static inline __m256i q5_codes(const uint8_t *qs, uint32_t qh) {
    const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                            0x0303030303030303LL);
    __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    bits = _mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    bits = _mm256_cmpeq_epi8(bits, _mm256_set1_epi64x(-1));
    return _mm256_or_si256(q4_nibbles(qs), _mm256_and_si256(bits, _mm256_set1_epi8(16)));
}

/* block b of the row at p (bytes bb) -> its 32 codes; *m: the min (unsigned forms) */
static inline __attribute__((always_inline)) __m256i q8r_codes(int code, const uint8_t *p,
                                                                float *m) {
    uint32_t qh;
    switch (code) {
    case S_Q8_0: return _mm256_loadu_si256((const __m256i *)(p + 2));
    case S_Q4_0: return _mm256_sub_epi8(q4_nibbles(p + 2), _mm256_set1_epi8(8));
    case S_Q5_0:
        memcpy(&qh, p + 2, 4);
        return _mm256_sub_epi8(q5_codes(p + 6, qh), _mm256_set1_epi8(16));
    case S_Q4_1: *m = Q8_HF(p + 2); return q4_nibbles(p + 4);
    default: /* S_Q5_1 */
        memcpy(&qh, p + 4, 4);
        *m = Q8_HF(p + 2);
        return q5_codes(p + 8, qh);
    }
}

/* the 8 lane sums of each of v[0 .. 8), as the 8 lanes of one vector (hadd tree) */
static inline __m256i hsum8x8(const __m256i *v) {
    __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    a = _mm256_hadd_epi32(a, b); /* per 128-bit half: sums of v0..v3 over that half */
    c = _mm256_hadd_epi32(c, d);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, c, 0x20),
                            _mm256_permute2x128_si256(a, c, 0x31));
}

/* the integer dot product of block p's codes with xq (32 bytes); *m: its min (unsigned
 * forms). off: Q4_0 / Q5_0 as unsigned codes q, their offset -8 / -16 applied by the
 * caller (times dx sum xq) */
static inline __attribute__((always_inline)) __m256i q8r_dot(int code, const uint8_t *p,
                                                              const int8_t *xq, float *m,
                                                              int off) {
    __m256i c;
    if (off && code == S_Q4_0) c = q4_nibbles(p + 2);
    else if (off && code == S_Q5_0) {
        uint32_t qh;
        memcpy(&qh, p + 2, 4);
        c = q5_codes(p + 6, qh);
    } else c = q8r_codes(code, p, m);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xq);
    if (code == S_Q8_0 || (!off && (code == S_Q4_0 || code == S_Q5_0))) {
        xv = _mm256_sign_epi8(xv, c);
        c = _mm256_sign_epi8(c, c);
    }
    return dp_us(c, xv);
}

/* y = row . x for the row at p (nb blocks of bb bytes); xq, dx, s32: quant_x of x. Eight
 * blocks per step: their dot products reduced to one vector (hsum8x8), converted and
 * scaled by d_b * dx_b in one FMA (the eight f16 d gathered into one vcvtph2ps), the mins
 * of the unsigned forms likewise (m_b * dx_b sum xq_b; Q4_0 / Q5_0 read as unsigned codes
 * with the min -8 d_b / -16 d_b); the last nb % 8 blocks one at a time. */
static inline __attribute__((always_inline)) float q8_row32(int code, const uint8_t *p,
                                                             long bb, long nb, const int8_t *xq,
                                                             const float *dx, const float *s32) {
    __m256 acc = _mm256_setzero_ps(), macc = acc;
    int mins = !(code == S_Q8_0 || code == S_Q4_0 || code == S_Q5_0);
    float m0 = 0.0f;
    long b = 0;
    for (; b + 8 <= nb; b += 8, p += 8 * bb, xq += 256) {
        __m256i v[8];
        float m;
        for (int i = 0; i < 8; i++) v[i] = q8r_dot(code, p + i * bb, xq + 32 * i, &m, 1);
        __m128i dh = _mm_setzero_si128(), mh = dh;
        uint16_t u;
#define Q8_LANE(i)                                                                             \
    memcpy(&u, p + (i) * bb, 2);                                                               \
    dh = _mm_insert_epi16(dh, u, i);                                                           \
    if (mins) {                                                                                \
        memcpy(&u, p + (i) * bb + 2, 2);                                                       \
        mh = _mm_insert_epi16(mh, u, i);                                                       \
    }
        Q8_LANE(0) Q8_LANE(1) Q8_LANE(2) Q8_LANE(3) Q8_LANE(4) Q8_LANE(5) Q8_LANE(6) Q8_LANE(7)
#undef Q8_LANE
        __m256 sc = _mm256_mul_ps(_mm256_cvtph_ps(dh), _mm256_loadu_ps(dx + b));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8x8(v)), sc, acc);
        if (mins) macc = _mm256_fmadd_ps(_mm256_cvtph_ps(mh), _mm256_loadu_ps(s32 + b), macc);
        if (code == S_Q4_0 || code == S_Q5_0) {
            __m256 off = _mm256_set1_ps(code == S_Q4_0 ? -8.0f : -16.0f);
            macc = _mm256_fmadd_ps(_mm256_mul_ps(off, _mm256_cvtph_ps(dh)),
                                   _mm256_loadu_ps(s32 + b), macc);
        }
    }
    __m256 a1 = _mm256_setzero_ps();
    for (; b < nb; b++, p += bb, xq += 32) {
        float m = 0.0f;
        __m256i d = q8r_dot(code, p, xq, &m, 0);
        a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(Q8_HF(p) * dx[b]), a1);
        if (mins) m0 += m * s32[b];
    }
    return hsum8(_mm256_add_ps(acc, a1)) + (hsum8(macc) + m0);
}

/* M = 1, Q4_K (five = 0, 144-byte blocks) and Q5_K (five = 1, 176: bit 4 of the codes of
 * sub-block j is bit j of qh[l]): one row straight from its packed bytes. Per 256-weight
 * block: the 8 sub-blocks' integer dot products (codes x xq), reduced to one vector of 8
 * sums, converted and scaled by (d * sc_j) * dx_j in one FMA; the mins add (dmin * m_j) *
 * (dx_j * sum xq_j) in one FMA per block. */
static inline __attribute__((always_inline)) float q8_row_q45_k(const uint8_t *p, long st,
                                                                 long nb,
                                                                 const int8_t *xq,
                                                                 const float *dx,
                                                                 const float *s32, int five) {
    __m256 acc = _mm256_setzero_ps(), mins = acc;
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (long b = 0; b < nb; b++, p += st, xq += 256, dx += 8, s32 += 8) {
        __m256 scf, mf;
        q4k_scales_mins(p, &scf, &mf);
        __m256 sc = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(Q8_HF(p)), scf),
                                  _mm256_loadu_ps(dx));
        mins = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(Q8_HF(p + 2)), mf),
                               _mm256_loadu_ps(s32), mins);
        const uint8_t *qs = p + 16 + 32 * five;
        __m256i hv = _mm256_setzero_si256();
        if (five) hv = _mm256_loadu_si256((const __m256i *)(p + 16));
        __m256i v[8];
        for (int c = 0; c < 4; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) {
                __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * c), one);
                __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * c + 1), one);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
            }
            v[2 * c] = dp_us(lo, _mm256_loadu_si256((const __m256i *)(xq + 64 * c)));
            v[2 * c + 1] = dp_us(hi, _mm256_loadu_si256((const __m256i *)(xq + 64 * c + 32)));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8x8(v)), sc, acc);
    }
    return hsum8(acc) - hsum8(mins);
}

/* M = 1, the layouts with a scale per 16 weights (Q2_K, Q3_K, Q6_K), straight from the
 * packed bytes. Output 128 h + 32 g + l (l < 32) is group i = 4 h + g (X block i) with
 * unsigned codes (Q6_K: 6 bits; Q3_K: 2 bits of qs and bit 4 h + g of hmask; Q2_K: 2 bits)
 * and 16-run t = 2 i + l / 16: w = sc_t * code - of_t, sc_t / of_t: Q6_K d scl, 32 d scl;
 * Q3_K d scl, 4 d scl; Q2_K d (s & 15), dmin (s >> 4). Two hadd stages leave [groups 0-3
 * first 16 | groups 0-3 second 16] (and 4-7), matched by the scales permuted
 * (0 2 4 6 1 3 5 7) times dx; the offsets add of_t * (dx sum xq over run t). */
static inline __attribute__((always_inline)) float q8_row_k16(int code, const uint8_t *p,
                                                               long bb, long nb,
                                                               const int8_t *xq,
                                                               const float *dx,
                                                               const float *s16) {
    __m256 acc = _mm256_setzero_ps(), offs = acc;
    const __m256i perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    for (long b = 0; b < nb; b++, p += bb, xq += 256, dx += 8, s16 += 16) {
        __m256 lo, hi, olo, ohi;
        if (code == S_Q6_K) {
            q6k_scales(p, Q8_HF(p + 208), &lo, &hi); /* d * sc[0..8), d * sc[8..16) */
            olo = _mm256_mul_ps(_mm256_set1_ps(32.0f), lo);
            ohi = _mm256_mul_ps(_mm256_set1_ps(32.0f), hi);
        } else if (code == S_Q2_K) {
            __m128i s8 = _mm_loadu_si128((const __m128i *)p), m4 = _mm_set1_epi8(15);
            __m128i sl = _mm_and_si128(s8, m4), sh = _mm_and_si128(_mm_srli_epi16(s8, 4), m4);
            __m256 d = _mm256_set1_ps(Q8_HF(p + 80)), dm = _mm256_set1_ps(Q8_HF(p + 82));
            lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sl)));
            hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sl, 8))));
            olo = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sh)));
            ohi = _mm256_mul_ps(dm,
                                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sh, 8))));
        } else { /* S_Q3_K */
            q3k_scales16(p, Q8_HF(p + 108), &lo, &hi);
            olo = _mm256_mul_ps(_mm256_set1_ps(4.0f), lo);
            ohi = _mm256_mul_ps(_mm256_set1_ps(4.0f), hi);
        }
        offs = _mm256_fmadd_ps(olo, _mm256_loadu_ps(s16), offs);
        offs = _mm256_fmadd_ps(ohi, _mm256_loadu_ps(s16 + 8), offs);
        __m256i v[8];
        for (int h = 0; h < 2; h++) {
            q6k_half_t half;
            __m256i qv, hv;
            if (code == S_Q6_K) half = q6k_half(p, h);
            else {
                const uint8_t *qs = p + (code == S_Q2_K ? 16 : 32) + 32 * h;
                qv = _mm256_loadu_si256((const __m256i *)qs);
                hv = _mm256_loadu_si256((const __m256i *)p);
            }
            for (int g = 0; g < 4; g++) {
                __m256i c;
                if (code == S_Q6_K) c = q6k_codes(half, g);
                else {
                    c = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * g), m3);
                    if (code == S_Q3_K) {
                        __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hv, 4 * h + g), one);
                        c = _mm256_or_si256(c, _mm256_slli_epi16(hb, 2));
                    }
                }
                const int8_t *xg = xq + 128 * h + 32 * g;
                v[4 * h + g] = dp_us(c, _mm256_loadu_si256((const __m256i *)xg));
            }
        }
        __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]),
                                      _mm256_hadd_epi32(v[2], v[3]));
        __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]),
                                      _mm256_hadd_epi32(v[6], v[7]));
        __m256 sa = _mm256_mul_ps(_mm256_permutevar8x32_ps(lo, perm),
                                  _mm256_broadcast_ps((const __m128 *)dx));
        __m256 sc = _mm256_mul_ps(_mm256_permutevar8x32_ps(hi, perm),
                                  _mm256_broadcast_ps((const __m128 *)(dx + 4)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), sa, acc);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), sc, acc);
    }
    return hsum8(acc) - hsum8(offs);
}

/* Y[m, n] for the M X rows (quant_x: xq [M, K], dx [M, K / 32], s16 [M, K / 16], s32
 * [M, K / 32]) and rows n of [0, N): each weight row runs the direct kernel once per X row
 * while it is in L1; the layout's kernel is chosen once per call */
#define Q8_DIRECT(CALL)                                                                        \
    _Pragma("omp for schedule(dynamic, chunk)") for (long n = 0; n < N; n++) {                 \
        prefetch_rows(s, &pf, n);                                                              \
        const uint8_t *p = dq_row(s, n);                                                       \
        long st = dq_bst(s, n);                                                                \
        for (long m = 0; m < M; m++) {                                                         \
            const int8_t *xqm = xq + m * K;                                                    \
            const float *dxm = dx + m * (K / 32), *s16m = s16 + m * (K / 16);                  \
            const float *s32m = s32 + m * (K / 32);                                            \
            (void)s16m, (void)s32m;                                                            \
            y[m * ldy + n] = CALL;                                                             \
        }                                                                                      \
    }
static void gemv_q8_direct(const dq_t *s, long M, long N, long K, const int8_t *xq,
                           const float *dx, const float *s16, const float *s32, float *y,
                           long ldy, int threads, long chunk) {
#pragma omp parallel num_threads(threads)
    {
        prefetcher pf = {0, 0};
        long nb = s->nb;
        switch (s->code) {
        case S_Q6_K: Q8_DIRECT(q8_row_k16(S_Q6_K, p, st, nb, xqm, dxm, s16m)) break;
        case S_Q3_K: Q8_DIRECT(q8_row_k16(S_Q3_K, p, st, nb, xqm, dxm, s16m)) break;
        case S_Q2_K: Q8_DIRECT(q8_row_k16(S_Q2_K, p, st, nb, xqm, dxm, s16m)) break;
        case S_Q4_K: Q8_DIRECT(q8_row_q45_k(p, st, nb, xqm, dxm, s32m, 0)) break;
        case S_Q5_K: Q8_DIRECT(q8_row_q45_k(p, st, nb, xqm, dxm, s32m, 1)) break;
        case S_Q8_0: Q8_DIRECT(q8_row32(S_Q8_0, p, st, nb, xqm, dxm, s32m)) break;
        case S_Q4_0: Q8_DIRECT(q8_row32(S_Q4_0, p, st, nb, xqm, dxm, s32m)) break;
        case S_Q5_0: Q8_DIRECT(q8_row32(S_Q5_0, p, st, nb, xqm, dxm, s32m)) break;
        case S_Q4_1: Q8_DIRECT(q8_row32(S_Q4_1, p, st, nb, xqm, dxm, s32m)) break;
        default: Q8_DIRECT(q8_row32(S_Q5_1, p, st, nb, xqm, dxm, s32m)) break;
        }
    }
}
#undef Q8_DIRECT

/* whether M X rows of layout `code` run gemv_q8_direct: below 4 rows every layout; from 4
 * rows those without a vector prep_row (the others share each prepared row over Q8_MR X
 * rows) */
static int q8_direct_ok(int code, long M) {
    if (M < 4) return 1;
    return code == S_Q4_0 || code == S_Q4_1 || code == S_Q5_1 || code == S_Q2_K ||
           code == S_Q3_K || code == S_Q5_K;
}
#endif

#if VW >= 8 /* interleaved groups at M = 1 (dqgemm_q8_group.c, concatenated after this file) */
static int q8_group_ok(const dq_t *s, long M);
static void gemv_q8_group(const dq_t *s, long N, const int8_t *xq, const float *dx,
                          const float *s32, float *y, int threads, long chunk);
#elif defined(__aarch64__) && defined(__ARM_NEON) /* the same on R = 4 (dqgemm_neon.h) */
#define DQ_NEON_PART 3
#include "dqgemm_neon.h"
#undef DQ_NEON_PART
#endif

/* Y = X @ dequant(W)^T with X quantized to q8 (see the top of this file) */
static int gemm_q8(const dq_t *s, long M, long N, long K, const float *x, long ldx, float *y,
                   long ldy, int threads) {
    long nb32 = K / 32, ng = K / 16;
    int8_t *xq = (int8_t *)aligned_alloc(64, (size_t)((M * K + 63) / 64 * 64));
    float *dx = alloc_f(M * nb32), *xs16 = alloc_f(M * ng), *xs32 = alloc_f(M * nb32);
    int fail = !xq || !dx || !xs16 || !xs32;
    if (!fail) {
#pragma omp parallel for num_threads(threads) schedule(static) if (M >= 16)
        for (long m = 0; m < M; m++)
            quant_x(x + m * ldx, K, xq + m * K, dx + m * nb32, xs16 + m * ng, xs32 + m * nb32);
        /* as gemv(): below ~256 KB of weight per thread fewer threads run */
        long per = 262144, want = (N * s->row_bytes * (M < 4 ? 1 : 8) + per - 1) / per;
        if (want < threads) threads = want < 1 ? 1 : (int)want;
        /* dynamic chunks of ~32 KB of weight: on a shared machine a thread that loses its
         * core leaves its rows to the others instead of holding the barrier */
        long chunk = 32768 / s->row_bytes;
        if (chunk < 1) chunk = 1;
#if VW >= 8
        int direct = q8_direct_ok(s->code, M);
        if (direct && q8_group_ok(s, M)) gemv_q8_group(s, N, xq, dx, xs32, y, threads, chunk);
        else if (direct)
            gemv_q8_direct(s, M, N, K, xq, dx, xs16, xs32, y, ldy, threads, chunk);
#elif defined(__aarch64__) && defined(__ARM_NEON)
        int direct = q8_group_ok(s, M);
        if (direct) gemv_q8_group(s, N, xq, dx, xs32, y, threads, chunk);
#else
        int direct = 0;
#endif
        if (!direct)
#pragma omp parallel num_threads(threads) reduction(| : fail)
        {
            uint8_t *wq = (uint8_t *)aligned_alloc(64, (size_t)((K + 63) / 64 * 64));
            float *ws = alloc_f(K / 4), *wo = alloc_f(ng);
            if (!wq || !ws || !wo) fail = 1;
            else {
                prefetcher pf = {0, 0};
#pragma omp for schedule(dynamic, chunk)
                for (long n = 0; n < N; n++) {
                    prefetch_rows(s, &pf, n);
                    const uint8_t *q;
                    long stride;
                    int kind = prep_row(s, n, wq, ws, wo, &q, &stride);
                    for (long m0 = 0; m0 < M; m0 += Q8_MR) {
                        long mr = M - m0 < Q8_MR ? M - m0 : Q8_MR;
                        float part[Q8_MR];
                        if (kind == 0) {
                            if (mr == 1) Q8_DOT(1, 0, 1);
                            else Q8_DOT(mr, 0, 1);
                        } else if (kind == 1) {
                            if (mr == 1) Q8_DOT(1, 0, 0);
                            else if (mr == Q8_MR) Q8_DOT(Q8_MR, 0, 0);
                            else Q8_DOT(mr, 0, 0);
                        } else {
                            if (mr == 1) Q8_DOT(1, 1, 0);
                            else if (mr == Q8_MR) Q8_DOT(Q8_MR, 1, 0);
                            else Q8_DOT(mr, 1, 0);
                        }
                        for (long r = 0; r < mr; r++) {
                            float o = 0.0f;
                            if (kind == 1) o = dot(wo, xs32 + (m0 + r) * nb32, nb32);
                            else if (kind == 2) o = dot(wo, xs16 + (m0 + r) * ng, ng);
                            y[(m0 + r) * ldy + n] = part[r] + o;
                        }
                    }
                }
            }
            free(wq);
            free(ws);
            free(wo);
        }
    }
    free(xq);
    free(dx);
    free(xs16);
    free(xs32);
    return fail;
}

/* The entry point of the q8 path: as rlx_dq_gemm; 3 when the scheme has no q8 path. */
int rlx_dq_gemm_q8(int code, long qk, long bb, long M, long N, long K, const float *x,
                   long ldx, const uint8_t *w, long row_bytes, float *y, long ldy,
                   int threads, int R) {
    if (!q8_ok(code)) return 3;
    if (qk <= 0 || K % qk || K % 32 || M < 0 || N < 0 || threads < 1 || !dq_r_ok(code, R))
        return 2;
    dq_t s = {code, qk, bb, K / qk, row_bytes, w, 0, 0, 0, N, R};
    if (M == 0 || N == 0) return 0;
    if (K == 0) {
        for (long m = 0; m < M; m++) memset(y + m * ldy, 0, (size_t)N * 4);
        return 0;
    }
    return gemm_q8(&s, M, N, K, x, ldx, y, ldy, threads);
}
