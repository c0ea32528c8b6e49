/* dqgemm part 2 of 7 (see dqgemm.c): fused decode-dot row kernels for AVX2 / AVX-512 (Q8_0,
 * Q5_0, Q4_K, Q6_K, Int8Block, Int4Block; the other GGUF layouts and the dispatch:
 * dqgemm_rows_gguf.c). */
#include "gguf_unpack.h"

/* ---- fused decode-dot rows (AVX2 / AVX-512): the packed bytes go straight to vector
 * registers, widened to i32 lanes, converted and multiplied with X (no decode buffer).
 * Block scales multiply the per-block vector sums; Q4_K's mins use per-32 sums of X. ---- */
#if VW >= 8
#define FUSED 1
#if VW == 16
typedef __m512i vi;
#define VU8(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define VI8(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define VIAND(a, b) _mm512_and_si512(a, b)
#define VIOR(a, b) _mm512_or_si512(a, b)
#define VISUB(a, b) _mm512_sub_epi32(a, b)
#define VISET1(v) _mm512_set1_epi32(v)
#define VISRL(a, n) _mm512_srli_epi32(a, n) /* immediate form once n is constant */
#define VISLL(a, n) _mm512_slli_epi32(a, n)
#define VISRLV(a, c) _mm512_srlv_epi32(a, c)
#define VCVT(a) _mm512_cvtepi32_ps(a)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VLANES() _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#else
typedef __m256i vi;
#define VU8(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define VI8(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define VIAND(a, b) _mm256_and_si256(a, b)
#define VIOR(a, b) _mm256_or_si256(a, b)
#define VISUB(a, b) _mm256_sub_epi32(a, b)
#define VISET1(v) _mm256_set1_epi32(v)
#define VISRL(a, n) _mm256_srli_epi32(a, n)
#define VISLL(a, n) _mm256_slli_epi32(a, n)
#define VISRLV(a, c) _mm256_srlv_epi32(a, c)
#define VCVT(a) _mm256_cvtepi32_ps(a)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VLANES() _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
#endif

static inline float hf(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h); /* F16C: part of both targets */
}

static float row_q8_0(const uint8_t *p, long st, long nb, const float *x) {
    vf t0 = VZERO(), t1 = VZERO();
    long b = 0;
    for (; b + 2 <= nb; b += 2, p += 2 * st, x += 64) {
        vf a0 = VZERO(), a1 = VZERO();
        for (int v = 0; v < 32; v += VW) {
            a0 = VFMA(VCVT(VI8(p + 2 + v)), VLOAD(x + v), a0);
            a1 = VFMA(VCVT(VI8(p + st + 2 + v)), VLOAD(x + 32 + v), a1);
        }
        t0 = VFMA(VSET1(hf(p)), a0, t0);
        t1 = VFMA(VSET1(hf(p + st)), a1, t1);
    }
    for (; b < nb; b++, p += st, x += 32) {
        vf a0 = VZERO();
        for (int v = 0; v < 32; v += VW) a0 = VFMA(VCVT(VI8(p + 2 + v)), VLOAD(x + v), a0);
        t0 = VFMA(VSET1(hf(p)), a0, t0);
    }
    return vhsum(VADD(t0, t1));
}

/* Four Q8_0 rows (row i's block 0 at p + i rb, block stride st bytes: rb = row bytes and
 * st = 34 plain, rb = 34 and st = 34 R interleaved) against one X row: each X vector load
 * is shared by the four rows and each row is reduced once (the caller prefetches). */
static void rows4_q8_0(const uint8_t *p, long rb, long st, long nb, const float *x, float *y) {
    vf t0 = VZERO(), t1 = VZERO(), t2 = VZERO(), t3 = VZERO();
    const uint8_t *p1 = p + rb, *p2 = p + 2 * rb, *p3 = p + 3 * rb;
    for (long b = 0; b < nb; b++, p += st, p1 += st, p2 += st, p3 += st, x += 32) {
        vf a0 = VZERO(), a1 = VZERO(), a2 = VZERO(), a3 = VZERO();
        for (int v = 0; v < 32; v += VW) {
            vf xv = VLOAD(x + v);
            a0 = VFMA(VCVT(VI8(p + 2 + v)), xv, a0);
            a1 = VFMA(VCVT(VI8(p1 + 2 + v)), xv, a1);
            a2 = VFMA(VCVT(VI8(p2 + 2 + v)), xv, a2);
            a3 = VFMA(VCVT(VI8(p3 + 2 + v)), xv, a3);
        }
        t0 = VFMA(VSET1(hf(p)), a0, t0);
        t1 = VFMA(VSET1(hf(p1)), a1, t1);
        t2 = VFMA(VSET1(hf(p2)), a2, t2);
        t3 = VFMA(VSET1(hf(p3)), a3, t3);
    }
    y[0] = vhsum(t0);
    y[1] = vhsum(t1);
    y[2] = vhsum(t2);
    y[3] = vhsum(t3);
}

__attribute__((unused)) static float row_q5_0_v(const uint8_t *p, long st, long nb, const float *x) {
    vf t0 = VZERO(), t1 = VZERO();
    const vi m15 = VISET1(15), one = VISET1(1), c16 = VISET1(16), lanes = VLANES();
    for (long b = 0; b < nb; b++, p += st, x += 32) {
        uint32_t qh;
        memcpy(&qh, p + 2, 4);
        const vi hv = VISET1((int)qh);
        vf a0 = VZERO(), a1 = VZERO();
        for (int v = 0; v < 16; v += VW) {
            vi q = VU8(p + 6 + v);
            vi bl = VIAND(VISRLV(hv, VIOR(lanes, VISET1(v))), one);
            vi bh = VIAND(VISRLV(hv, VIOR(lanes, VISET1(v + 16))), one);
            vi lo = VISUB(VIOR(VIAND(q, m15), VISLL(bl, 4)), c16);
            vi hi = VISUB(VIOR(VISRL(q, 4), VISLL(bh, 4)), c16);
            a0 = VFMA(VCVT(lo), VLOAD(x + v), a0);
            a1 = VFMA(VCVT(hi), VLOAD(x + 16 + v), a1);
        }
        vf d = VSET1(hf(p));
        t0 = VFMA(d, a0, t0);
        t1 = VFMA(d, a1, t1);
    }
    return vhsum(VADD(t0, t1));
}

#if VW == 16
#define VI8R(v) _mm512_cvtepi8_epi32(v) /* 16 bytes of an xmm -> i32 lanes */
#else
#define VI8R(v) _mm256_cvtepi8_epi32(v) /* the low 8 bytes */
#endif

/* the VW bytes at offset v (a multiple of VW) of a 32-byte vector, in an xmm's low bytes */
static inline __m128i part32(__m256i q, int v) {
    __m128i h = v < 16 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
    return (v & 15) ? _mm_srli_si128(h, 8) : h;
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* The 8 6-bit scales (*sc) and 8 6-bit mins (*mn) of the Q4_K block at p, as f32 lanes,
 * unpacked eight at a time with 32-bit masks (as ggml's utmp trick). */
static inline void q4k_scales_mins(const uint8_t *p, __m256 *sc, __m256 *mn) {
    uint32_t u[4];
    memcpy(u, p + 4, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    uint32_t m03 = u[1] & 0x3f3f3f3fu;
    u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = m03;
    u[0] &= 0x3f3f3f3fu; /* bytes: scales 0..7, then mins 0..7 */
    __m128i sm = _mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]); /* no reload */
    *sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm));
    *mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
}

/* xs[j]: sum of X over the j-th run of 32 inputs. The scales and mins come from
 * q4k_scales_mins; the mins' term is one 8-lane FMA per super-block against xs. */
__attribute__((unused)) static float row_q4_k_v(const uint8_t *p, long st, long nb, const float *x, const float *xs) {
    vf t0 = VZERO(), t1 = VZERO();
    __m256 mins = _mm256_setzero_ps();
#if VW == 16
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
    const vi m15 = VISET1(15);
#endif
    float dsc[8];
    for (long b = 0; b < nb; b++, p += st, x += 256, xs += 8) {
        __m256 scf, mf;
        q4k_scales_mins(p, &scf, &mf);
        _mm256_storeu_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(hf(p)), scf));
        mins = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(hf(p + 2)), mf), _mm256_loadu_ps(xs),
                               mins);
        const uint8_t *qs = p + 16;
        for (int c = 0; c < 4; c++) {
            vf alo = VZERO(), ahi = VZERO();
            for (int v = 0; v < 32; v += VW) {
                vi w = VU8(qs + c * 32 + v);
#if VW == 16 /* low nibble -> f32 by vpermps over 0..15 (p5), balancing the cvt (p0) */
                alo = VFMA(_mm512_permutexvar_ps(w, iota), VLOAD(x + c * 64 + v), alo);
#else
                alo = VFMA(VCVT(VIAND(w, m15)), VLOAD(x + c * 64 + v), alo);
#endif
                ahi = VFMA(VCVT(VISRL(w, 4)), VLOAD(x + c * 64 + 32 + v), ahi);
            }
            t0 = VFMA(VSET1(dsc[2 * c]), alo, t0);
            t1 = VFMA(VSET1(dsc[2 * c + 1]), ahi, t1);
        }
    }
    return vhsum(VADD(t0, t1)) - hsum8(mins);
}

/* q6 values are assembled 32 at a time in bytes (AVX2 byte ops), then widened */
static float row_q6_k(const uint8_t *p, long st, long nb, const float *x) {
    vf t0 = VZERO(), t1 = VZERO();
    const __m256i c32 = _mm256_set1_epi8(32);
    float dsc[16];
    for (long b = 0; b < nb; b++, p += st, x += 256) {
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
                    if (g & 1) t1 = VFMA(dl, a, t1);
                    else t0 = VFMA(dl, a, t0);
                }
            }
        }
    }
    return vhsum(VADD(t0, t1));
}

static float row_i8(const int8_t *q, const float *sc, const int32_t *zp, long nb, long bs,
                    const float *x) {
    vf t0 = VZERO(), t1 = VZERO();
    for (long b = 0; b < nb; b++, q += bs, x += bs) {
        const vi z = VISET1(zp[b]);
        vf a0 = VZERO(), a1 = VZERO();
        long v = 0;
        for (; v + 2 * VW <= bs; v += 2 * VW) {
            a0 = VFMA(VCVT(VISUB(VI8(q + v), z)), VLOAD(x + v), a0);
            a1 = VFMA(VCVT(VISUB(VI8(q + v + VW), z)), VLOAD(x + v + VW), a1);
        }
        for (; v < bs; v += VW) a0 = VFMA(VCVT(VISUB(VI8(q + v), z)), VLOAD(x + v), a0);
        vf s = VSET1(sc[b]);
        t0 = VFMA(s, a0, t0);
        t1 = VFMA(s, a1, t1);
    }
    return vhsum(VADD(t0, t1));
}

/* xe / xo: X at the even / odd inputs (a byte holds inputs 2j (low) and 2j + 1 (high)) */
__attribute__((unused)) static float row_i4_v(const uint8_t *q, const float *sc, const int32_t *zp, long nb, long bs,
                      const float *xe, const float *xo) {
    vf t0 = VZERO(), t1 = VZERO();
    const vi m15 = VISET1(15);
    long hb = bs / 2;
    for (long b = 0; b < nb; b++, q += hb, xe += hb, xo += hb) {
        const vi z = VISET1(zp[b]);
        vf a0 = VZERO(), a1 = VZERO();
        for (long v = 0; v < hb; v += VW) {
            vi w = VU8(q + v);
            a0 = VFMA(VCVT(VISUB(VIAND(w, m15), z)), VLOAD(xe + v), a0);
            a1 = VFMA(VCVT(VISUB(VISRL(w, 4), z)), VLOAD(xo + v), a1);
        }
        vf s = VSET1(sc[b]);
        t0 = VFMA(s, a0, t0);
        t1 = VFMA(s, a1, t1);
    }
    return vhsum(VADD(t0, t1));
}

#if VW == 16
/* AVX-512: a 4- or 5-bit code indexes a table of the block's 16 (32) decoded values held in
 * one (two) zmm: vpermps / vpermt2ps replace the int -> float conversion, the scale and the
 * offset (the table entries are computed exactly as the reference decodes them). */
static const float IOTA16[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

#if DQ_TABLE_Q4K
static float row_q4_k(const uint8_t *p, long st, long nb, const float *x, const float *xs) {
    (void)xs;
    __m512 t0 = VZERO(), t1 = VZERO(), t2 = VZERO(), t3 = VZERO();
    const __m512 iota = _mm512_loadu_ps(IOTA16);
    float dsc[8], dmn[8];
    for (long b = 0; b < nb; b++, p += st, x += 256) {
        __m256 scf, mf;
        q4k_scales_mins(p, &scf, &mf);
        _mm256_storeu_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(hf(p)), scf));
        _mm256_storeu_ps(dmn, _mm256_mul_ps(_mm256_set1_ps(hf(p + 2)), mf));
        const uint8_t *qs = p + 16;
        for (int c = 0; c < 4; c++) {
            __m512 tb0 = _mm512_sub_ps(_mm512_mul_ps(iota, VSET1(dsc[2 * c])), VSET1(dmn[2 * c]));
            __m512 tb1 =
                _mm512_sub_ps(_mm512_mul_ps(iota, VSET1(dsc[2 * c + 1])), VSET1(dmn[2 * c + 1]));
            __m512i w0 = VU8(qs + c * 32), w1 = VU8(qs + c * 32 + 16);
            const float *xc = x + c * 64;
            t0 = VFMA(_mm512_permutexvar_ps(w0, tb0), VLOAD(xc), t0);
            t1 = VFMA(_mm512_permutexvar_ps(w1, tb0), VLOAD(xc + 16), t1);
            t2 = VFMA(_mm512_permutexvar_ps(_mm512_srli_epi32(w0, 4), tb1), VLOAD(xc + 32), t2);
            t3 = VFMA(_mm512_permutexvar_ps(_mm512_srli_epi32(w1, 4), tb1), VLOAD(xc + 48), t3);
        }
    }
    return vhsum(VADD(VADD(t0, t1), VADD(t2, t3)));
}
#endif

#if DQ_TABLE_Q5_0
static float row_q5_0(const uint8_t *p, long st, long nb, const float *x) {
    __m512 t0 = VZERO(), t1 = VZERO();
    const __m512 iota = _mm512_loadu_ps(IOTA16), iota_m16 = _mm512_sub_ps(iota, VSET1(16.0f));
    const __m512i m15 = VISET1(15), c16 = VISET1(16);
    for (long b = 0; b < nb; b++, p += st, x += 32) {
        __m512 d = VSET1(hf(p));
        __m512 ta = _mm512_mul_ps(d, iota_m16), tb = _mm512_mul_ps(d, iota); /* d * (q - 16) */
        uint32_t qh;
        memcpy(&qh, p + 2, 4);
        __m512i w = VU8(p + 6);
        __m512i lo = _mm512_and_si512(w, m15), hi = _mm512_srli_epi32(w, 4);
        lo = _mm512_mask_or_epi32(lo, (__mmask16)(qh & 0xFFFFu), lo, c16);
        hi = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, c16);
        t0 = VFMA(_mm512_permutex2var_ps(ta, lo, tb), VLOAD(x), t0);
        t1 = VFMA(_mm512_permutex2var_ps(ta, hi, tb), VLOAD(x + 16), t1);
    }
    return vhsum(VADD(t0, t1));
}
#endif

#if DQ_TABLE_I4
static float row_i4(const uint8_t *q, const float *sc, const int32_t *zp, long nb, long bs,
                    const float *xe, const float *xo) {
    __m512 t0 = VZERO(), t1 = VZERO();
    const __m512 iota = _mm512_loadu_ps(IOTA16);
    long hb = bs / 2;
    for (long b = 0; b < nb; b++, q += hb, xe += hb, xo += hb) {
        /* (q - zp) * scale, as the reference: the difference is exact in f32 */
        __m512 tb = _mm512_mul_ps(_mm512_sub_ps(iota, VSET1((float)zp[b])), VSET1(sc[b]));
        for (long v = 0; v < hb; v += 16) {
            __m512i w = VU8(q + v);
            t0 = VFMA(_mm512_permutexvar_ps(w, tb), VLOAD(xe + v), t0);
            t1 = VFMA(_mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), tb), VLOAD(xo + v), t1);
        }
    }
    return vhsum(VADD(t0, t1));
}
#endif
#endif /* VW == 16 */
#if VW != 16 || !DQ_TABLE_Q4K
#define row_q4_k row_q4_k_v
#endif
#if VW != 16 || !DQ_TABLE_Q5_0
#define row_q5_0 row_q5_0_v
#endif
#if VW != 16 || !DQ_TABLE_I4
#define row_i4 row_i4_v
#endif

#else
#define FUSED 0
#endif
