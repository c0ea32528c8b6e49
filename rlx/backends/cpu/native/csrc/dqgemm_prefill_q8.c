/* dqprefill part 2 of 2 (after dqgemm_prefill.c): the integer prefill path,
 * rlx_dqp_gemm_q8, for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K .. Q6_K.
 *
 * Activations: each X row is quantized once per call, per block of 32 inputs, to int8
 * codes xq = rint(x * id), id = 1 / dx, dx = max|x| / 127 (f32; round to nearest even), as
 * the decode path (dqgemm_q8.c) and llama.cpp's q8_0; a block with a non-finite input gets
 * dx = NaN (the outputs of its row are NaN). The codes are stored in token panels of QNT
 * tokens, 4 consecutive inputs of a token per 32-bit lane (the vpdpbusd layout), with dx
 * per (token, 32-block) and the integer sums of xq per (token, 16 inputs).
 *
 * Weights: a block of QMW rows x one K block is unpacked per call into unsigned 8-bit
 * codes u (row stride a compile-time constant) with, per group of G inputs (32, or 16 for
 * Q2_K / Q3_K / Q6_K), a scale s and a min mm: w = s * (u - off) - mm, off a per-scheme
 * constant (Q4_0 8, Q5_0 16, Q3_K 4, Q6_K 32, Q8_0 128 with u = code + 128; Q8_0 on AVX2
 * keeps its signed codes, off 0, and moves the signs onto X with vpsignb), mm nonzero for
 * Q4_1 / Q5_1 (-m), Q2_K / Q4_K / Q5_K (dmin * m).
 *
 * Product of a group g of one weight row and one token: the exact integer
 * T = sum u xq (vpdpbusd on AVX-512 VNNI; vpmaddubsw + vpmaddwd on AVX2; int32 C on the
 * portable target), then acc += (s dx) T - mm' (dx sum xq) in f32, where mm' = mm + s off
 * (exact: off is a power of two, and mm = 0 where off != 0) and dx sum xq is computed once
 * per call with X's quantization. So
 * against the f64 product of the decoded weight the error is the activation rounding,
 * at most sum_j |w_j| dx_j / 2, plus f32 rounding of the per-group terms and their sum.
 */
#include <math.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include "gguf_unpack.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define QL 16
#define QLEVEL 3
#elif defined(__AVX512F__) || defined(__AVX2__)
#define QL 8
#define QLEVEL 1
#else
#define QL 4
#define QLEVEL 0
#endif
#define QNT (2 * QL) /* tokens per panel */
#define QMW 4        /* weight rows per block */
#define QKS (KCW + 64) /* row stride of the unpacked codes */

typedef struct {
    int g, off, mins, sgn; /* group size, code offset, has mins, signed codes (AVX2 Q8_0) */
} qform_t;

static int q_form(int code, qform_t *f) {
    f->g = 32;
    f->off = 0;
    f->mins = 0;
    f->sgn = 0;
    switch (code) {
    case P_Q4_0: f->off = 8; f->mins = 1; return 1;
    case P_Q5_0: f->off = 16; f->mins = 1; return 1;
    case P_Q4_1: case P_Q5_1: case P_Q4_K: case P_Q5_K: f->mins = 1; return 1;
    case P_Q8_0:
        if (QLEVEL == 1) f->sgn = 1;
        else f->off = 128;
        f->mins = !f->sgn;
        return 1;
    case P_Q2_K: f->g = 16; f->mins = 1; return 1;
    case P_Q3_K: f->g = 16; f->off = 4; f->mins = 1; return 1;
    case P_Q6_K: f->g = 16; f->off = 32; f->mins = 1; return 1;
    default: return 0;
    }
}

#if QLEVEL >= 1
/* the 32 nibble codes of qs[16] (low nibbles, then high) as bytes */
static inline __m256i q_nibbles(const uint8_t *qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
}

/* bit j of qh as byte j (0 or 16) */
static inline __m256i q_hbits16(uint32_t qh) {
    const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                            0x0303030303030303LL);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
    return _mm256_and_si256(v, _mm256_set1_epi8(16));
}
#endif

/* Block at p -> codes u[0 .. qk), per-group scale s[] and min mm[] (G = 32 or 16) */
static void q_unpack(int code, const uint8_t *p, uint8_t *restrict u, float *s, float *mm) {
    switch (code) {
    case P_Q4_0:
    case P_Q4_1: {
        const int one = code == P_Q4_1;
        s[0] = p_h2f(p);
        mm[0] = one ? -p_h2f(p + 2) : 8.0f * s[0];
        const uint8_t *qs = p + 2 + 2 * one;
#if QLEVEL >= 1
        _mm256_storeu_si256((__m256i *)u, q_nibbles(qs));
#else
        for (int j = 0; j < 16; j++) {
            u[j] = qs[j] & 15;
            u[j + 16] = qs[j] >> 4;
        }
#endif
        break;
    }
    case P_Q5_0:
    case P_Q5_1: {
        const int one = code == P_Q5_1;
        s[0] = p_h2f(p);
        mm[0] = one ? -p_h2f(p + 2) : 16.0f * s[0];
        const uint8_t *qhp = p + 2 + 2 * one, *qs = qhp + 4;
        uint32_t qh;
        memcpy(&qh, qhp, 4);
#if QLEVEL >= 1
        _mm256_storeu_si256((__m256i *)u, _mm256_or_si256(q_nibbles(qs), q_hbits16(qh)));
#else
        for (int j = 0; j < 16; j++) {
            u[j] = (uint8_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
            u[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
#endif
        break;
    }
    case P_Q8_0: {
        s[0] = p_h2f(p);
        mm[0] = QLEVEL == 1 ? 0.0f : 128.0f * s[0];
        const uint8_t flip = QLEVEL == 1 ? 0 : 0x80;
        for (int j = 0; j < 32; j++) u[j] = p[2 + j] ^ flip;
        break;
    }
    case P_Q2_K: {
        const uint8_t *sc = p, *qs = p + 16;
        const float d = p_h2f(p + 80), dmin = p_h2f(p + 82);
        for (int is = 0; is < 16; is++) {
            s[is] = d * (float)(sc[is] & 15);
            mm[is] = dmin * (float)(sc[is] >> 4);
        }
        for (int h = 0; h < 2; h++)
            for (int sh = 0; sh < 4; sh++)
                for (int l = 0; l < 32; l++)
                    u[h * 128 + sh * 32 + l] = (qs[h * 32 + l] >> (2 * sh)) & 3;
        break;
    }
    case P_Q3_K: {
        const uint8_t *hm = p, *qs = p + 32, *sc = p + 96;
        const float d = p_h2f(p + 108);
        for (int i = 0; i < 16; i++) {
            int lo = i < 8 ? (sc[i] & 15) : (sc[i - 8] >> 4);
            int hi = (sc[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
            s[i] = d * (float)((lo | (hi << 4)) - 32);
            mm[i] = 4.0f * s[i];
        }
        for (int h = 0; h < 2; h++)
            for (int sh = 0; sh < 4; sh++) {
                const int bit = h * 4 + sh;
                for (int l = 0; l < 32; l++)
                    u[h * 128 + sh * 32 + l] = (uint8_t)(((qs[h * 32 + l] >> (2 * sh)) & 3) |
                                                         (((hm[l] >> bit) & 1) << 2));
            }
        break;
    }
    case P_Q4_K:
    case P_Q5_K: {
        const int five = code == P_Q5_K;
        const float d = p_h2f(p), dmin = p_h2f(p + 2);
        const uint8_t *q = p + 4, *qh = p + 16, *ql = p + 16 + 32 * five;
        for (int j = 0; j < 8; j++) {
            int scj, mj;
            p_scale_min_k4(j, q, &scj, &mj);
            s[j] = d * (float)scj;
            mm[j] = dmin * (float)mj;
            const uint8_t *c = ql + (j >> 1) * 32;
            const int shift = (j & 1) * 4;
#if QLEVEL >= 1
            const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
            __m256i v = _mm256_loadu_si256((const __m256i *)c);
            v = _mm256_and_si256(shift ? _mm256_srli_epi16(v, 4) : v, m4);
            if (five) {
                __m256i h = _mm256_loadu_si256((const __m256i *)qh);
                h = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(j)), one);
                v = _mm256_or_si256(v, _mm256_slli_epi16(h, 4));
            }
            _mm256_storeu_si256((__m256i *)(u + j * 32), v);
#else
            for (int l = 0; l < 32; l++)
                u[j * 32 + l] = (uint8_t)(((c[l] >> shift) & 15) |
                                          (five ? ((qh[l] >> j) & 1) << 4 : 0));
#endif
        }
        break;
    }
    case P_Q6_K: {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = p_h2f(p + 208);
        for (int i = 0; i < 16; i++) {
            s[i] = d * (float)sc[i];
            mm[i] = 32.0f * s[i];
        }
#if QLEVEL >= 1
        (void)ql;
        (void)qh;
        for (int h = 0; h < 2; h++) {
            const q6k_half_t hx = q6k_half(p, h);
            for (int g = 0; g < 4; g++)
                _mm256_storeu_si256((__m256i *)(u + h * 128 + g * 32), q6k_codes(hx, g));
        }
#else
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++)
                for (int l = 0; l < 32; l++)
                    u[h * 128 + g * 32 + l] =
                        (uint8_t)(((ql[h * 64 + (g & 1) * 32 + l] >> ((g >> 1) * 4)) & 15) |
                                  (((qh[h * 32 + l] >> (2 * g)) & 3) << 4));
#endif
        break;
    }
    default:
        break;
    }
}

/* ---- activations ------------------------------------------------------------------- */
typedef struct {
    int8_t *q;  /* [np][K / 4][QNT][4] */
    float *dx;  /* [np][K / 32][QNT] */
    float *m16; /* [np][K / 16][QNT]: dx * sum of xq per 16 inputs */
    float *m32; /* [np][K / 32][QNT]: dx * sum of xq per 32 inputs */
} qx_t;

/* One 32-block of X: codes c[32], returns dx (NaN for a non-finite block, codes 0) and
 * the sums of the codes per 16 in sum[2]. */
static inline float q_quant_block(const float *xb, int8_t *c, int *sum) {
    float amax = 0.0f;
    int bad = 0;
#if QLEVEL >= 1
    __m256 v[4], mx = _mm256_setzero_ps(), z = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
        z = _mm256_add_ps(z, _mm256_mul_ps(v[i], _mm256_setzero_ps())); /* NaN if inf / nan */
    }
    bad = _mm256_movemask_ps(_mm256_cmp_ps(z, z, _CMP_UNORD_Q)) != 0;
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    amax = _mm_cvtss_f32(m4);
    const float db = amax / 127.0f;
    const float id = db != 0.0f && !bad ? 1.0f / db : 0.0f;
    __m256i iv[4];
    for (int i = 0; i < 4; i++) /* cvtps: round to nearest even (the default MXCSR mode) */
        iv[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
    __m256i a = _mm256_add_epi32(iv[0], iv[1]), b = _mm256_add_epi32(iv[2], iv[3]);
    __m128i a4 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    __m128i b4 = _mm_add_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    a4 = _mm_hadd_epi32(a4, b4);
    a4 = _mm_hadd_epi32(a4, a4);
    sum[0] = _mm_cvtsi128_si32(a4);
    sum[1] = _mm_extract_epi32(a4, 1);
    __m256i p0 = _mm256_packs_epi32(iv[0], iv[1]), p1 = _mm256_packs_epi32(iv[2], iv[3]);
    p0 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p0, p1),
                                      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)c, p0);
#else
    for (int j = 0; j < 32; j++) {
        const float a = fabsf(xb[j]);
        amax = a > amax ? a : amax;
        bad |= !(a <= 3.4028235e38f);
    }
    const float db = amax / 127.0f;
    const float id = db != 0.0f && !bad ? 1.0f / db : 0.0f;
    sum[0] = sum[1] = 0;
    for (int j = 0; j < 32; j++) {
        c[j] = (int8_t)lrintf(xb[j] * id);
        sum[j / 16] += c[j];
    }
#endif
    return bad ? NAN : db;
}

static void q_pack_x(const float *x, long ldx, long M, long K, qx_t *X, int threads) {
    const long np = (M + QNT - 1) / QNT;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (long m = 0; m < np * QNT; m++) {
        const long p = m / QNT, t = m % QNT;
        int32_t *q = (int32_t *)(X->q + p * K * QNT) + t; /* word w of token t: q[w * QNT] */
        float *dx = X->dx + p * (K / 32) * QNT + t;
        float *m16 = X->m16 + p * (K / 16) * QNT + t, *m32 = X->m32 + p * (K / 32) * QNT + t;
        for (long b = 0; b < K / 32; b++) {
            int32_t c[8] = {0};
            int sum[2] = {0, 0};
            float db = 0.0f;
            if (m < M) db = q_quant_block(x + m * ldx + 32 * b, (int8_t *)c, sum);
            dx[b * QNT] = db;
            m16[2 * b * QNT] = db * (float)sum[0];
            m16[(2 * b + 1) * QNT] = db * (float)sum[1];
            m32[b * QNT] = db * (float)(sum[0] + sum[1]);
            for (int w = 0; w < 8; w++) q[(8 * b + w) * QNT] = c[w];
        }
    }
}

/* ---- micro-kernel: QMW weight rows x QNT tokens over one K block ---------------------- */
#if QLEVEL >= 1
#if QLEVEL == 3
typedef __m512i vi;
typedef __m512 vq;
#define VI_ZERO() _mm512_setzero_si512()
#define VI_LOAD(p) _mm512_load_si512((const void *)(p))
#define VI_SET1(v) _mm512_set1_epi32(v)
#define VI_SUB(a, b) _mm512_sub_epi32(a, b)
#define VI_ADD(a, b) _mm512_add_epi32(a, b)
#define VI_MULLO(a, b) _mm512_mullo_epi32(a, b)
#define VI_DOT(acc, w, x) _mm512_dpbusd_epi32(acc, w, x)
#define VQ_CVT(a) _mm512_cvtepi32_ps(a)
#define VQ_LOAD(p) _mm512_load_ps(p)
#define VQ_SET1(v) _mm512_set1_ps(v)
#define VQ_MUL(a, b) _mm512_mul_ps(a, b)
#define VQ_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VQ_FNMA(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define VQ_ZERO() _mm512_setzero_ps()
#define VQ_STORE(p, v) _mm512_store_ps(p, v)
#else
typedef __m256i vi;
typedef __m256 vq;
#define VI_ZERO() _mm256_setzero_si256()
#define VI_LOAD(p) _mm256_load_si256((const __m256i *)(p))
#define VI_SET1(v) _mm256_set1_epi32(v)
#define VI_SUB(a, b) _mm256_sub_epi32(a, b)
#define VI_ADD(a, b) _mm256_add_epi32(a, b)
#define VI_MULLO(a, b) _mm256_mullo_epi32(a, b)
/* codes <= 127: the pair sums of vpmaddubsw cannot saturate (2 * 127 * 127 < 2^15) */
#define VI_DOT(acc, w, x) \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)))
#define VI_DOTS(acc, w, x)                                                                  \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w),         \
                                                                 _mm256_sign_epi8(x, w)),    \
                                            _mm256_set1_epi16(1)))
#define VQ_CVT(a) _mm256_cvtepi32_ps(a)
#define VQ_LOAD(p) _mm256_load_ps(p)
#define VQ_SET1(v) _mm256_set1_ps(v)
#define VQ_MUL(a, b) _mm256_mul_ps(a, b)
#define VQ_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VQ_FNMA(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define VQ_ZERO() _mm256_setzero_ps()
#define VQ_STORE(p, v) _mm256_store_ps(p, v)
#endif
#ifndef VI_DOTS
#define VI_DOTS VI_DOT
#endif

/* acc[QMW][QNT] (+)= the K block's groups: u [QMW][QKS] codes, s / mm [QMW][groups],
 * X panel pointers at the block's start (q: 4 inputs per lane, dx per 32, xs per 16). */
#define QKERNEL(NAME, G, DOT)                                                               \
    static void NAME(long kc, const uint8_t *restrict u, const float *s, const float *mm,  \
                     long gs, const int8_t *xq, const float *dx, const float *mxs,         \
                     const qform_t *f, float *restrict c, int accum) {                     \
        vq acc[QMW][2];                                                                     \
        for (int i = 0; i < QMW; i++)                                                       \
            for (int v = 0; v < 2; v++)                                                     \
                acc[i][v] = accum ? VQ_LOAD(c + i * QNT + v * QL) : VQ_ZERO();              \
        for (long g = 0; g < kc / G; g++) {                                                 \
            vi ia[QMW][2];                                                                  \
            for (int i = 0; i < QMW; i++) ia[i][0] = ia[i][1] = VI_ZERO();                  \
            _Pragma("GCC unroll 8") for (int st = 0; st < G / 4; st++) {                    \
                const int8_t *xp = xq + ((g * G) / 4 + st) * QNT * 4;                       \
                const vi x0 = VI_LOAD(xp), x1 = VI_LOAD(xp + QL * 4);                       \
                _Pragma("GCC unroll 4") for (int i = 0; i < QMW; i++) {                     \
                    int32_t wv;                                                             \
                    memcpy(&wv, u + i * QKS + g * G + 4 * st, 4);                           \
                    const vi wb = VI_SET1(wv);                                              \
                    ia[i][0] = DOT(ia[i][0], wb, x0);                                       \
                    ia[i][1] = DOT(ia[i][1], wb, x1);                                       \
                }                                                                           \
            }                                                                               \
            const long b32 = (g * G) / 32;                                                  \
            for (int v = 0; v < 2; v++) {                                                   \
                const vq dxv = VQ_LOAD(dx + b32 * QNT + v * QL);                            \
                const vq mx = VQ_LOAD(mxs + g * QNT + v * QL);                              \
                for (int i = 0; i < QMW; i++) {                                             \
                    const vq t = VQ_CVT(ia[i][v]);                                          \
                    acc[i][v] = VQ_FMA(t, VQ_MUL(VQ_SET1(s[i * gs + g]), dxv), acc[i][v]);  \
                    if (f->mins) acc[i][v] = VQ_FNMA(VQ_SET1(mm[i * gs + g]), mx, acc[i][v]); \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        for (int i = 0; i < QMW; i++)                                                       \
            for (int v = 0; v < 2; v++) VQ_STORE(c + i * QNT + v * QL, acc[i][v]);          \
    }
QKERNEL(q_kernel32, 32, VI_DOT)
QKERNEL(q_kernel16, 16, VI_DOT)
QKERNEL(q_kernel32s, 32, VI_DOTS)
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define DQ_NEON_PART 5
#include "dqgemm_neon.h"
#undef DQ_NEON_PART
#else
/* portable: int32 C */
static void q_kernel_c(long kc, int G, const uint8_t *restrict u, const float *s,
                       const float *mm, long gs, const int8_t *xq, const float *dx,
                       const float *mxs, const qform_t *f, float *restrict c, int accum) {
    for (int i = 0; i < QMW; i++)
        for (int t = 0; t < QNT; t++) {
            float a = accum ? c[i * QNT + t] : 0.0f;
            for (long g = 0; g < kc / G; g++) {
                int32_t ia = 0;
                for (int j = 0; j < G; j++) {
                    const long k = g * G + j;
                    ia += (int32_t)u[i * QKS + k] * xq[(k / 4 * QNT + t) * 4 + k % 4];
                }
                const float d = dx[(g * G) / 32 * QNT + t];
                a += (float)ia * (s[i * gs + g] * d);
                if (f->mins) a -= mm[i * gs + g] * mxs[g * QNT + t];
            }
            c[i * QNT + t] = a;
        }
}
#endif

/* ---- the int8 driver ---------------------------------------------------------------- */
static int q_gemm(const pw_t *s, const qform_t *f, long M, long N, long K, const qx_t *X,
                  float *y, long ldy, int threads) {
    const long np = (M + QNT - 1) / QNT, nblocks = (N + QMW - 1) / QMW;
    const long bpk = KCW / s->qk, G = f->g, gs = KCW / G;
    int fail = 0;
    if (threads > nblocks) threads = (int)nblocks;
#pragma omp parallel num_threads(threads) reduction(| : fail)
    {
        uint8_t *u = (uint8_t *)p_alloc((size_t)QMW * QKS);
        float *sc = (float *)p_alloc((size_t)2 * QMW * gs * 4), *mm = sc + QMW * gs;
        float *tile = (float *)p_alloc((size_t)np * QMW * QNT * 4);
        if (!u || !sc || !tile) fail = 1;
        else {
            memset(u, 0, (size_t)QMW * QKS);
            memset(sc, 0, (size_t)2 * QMW * gs * 4);
        }
#pragma omp for schedule(dynamic, 1)
        for (long blk = 0; blk < nblocks; blk++) {
            if (!u || !sc || !tile) continue;
            const long n0 = blk * QMW, mw = N - n0 < QMW ? N - n0 : QMW;
            for (long b0 = 0; b0 < s->nb; b0 += bpk) {
                const long nblk = s->nb - b0 < bpk ? s->nb - b0 : bpk, kc = nblk * s->qk;
                const long gpb = s->qk / G; /* groups per weight block */
                for (long i = 0; i < QMW; i++) {
                    if (i >= mw) { /* rows past N: zero scales */
                        memset(sc + i * gs, 0, (size_t)gs * 4);
                        memset(mm + i * gs, 0, (size_t)gs * 4);
                        continue;
                    }
                    const uint8_t *row = dq_row_start(s->w, n0 + i, s->n, s->nb, s->bb, s->r);
                    const int64_t st = dq_block_stride(n0 + i, s->n, s->bb, s->r);
                    for (long b = 0; b < nblk; b++)
                        q_unpack(s->code, row + (b0 + b) * st, u + i * QKS + b * s->qk,
                                 sc + i * gs + b * gpb, mm + i * gs + b * gpb);
                }
                const long k0 = b0 * s->qk;
                for (long p = 0; p < np; p++) {
                    const int8_t *xq = X->q + p * K * QNT + k0 * QNT;
                    const float *dx = X->dx + p * (K / 32) * QNT + (k0 / 32) * QNT;
                    const float *xs = G == 32 ? X->m32 + p * (K / 32) * QNT + (k0 / 32) * QNT
                                              : X->m16 + p * (K / 16) * QNT + (k0 / 16) * QNT;
                    float *c = tile + p * QMW * QNT;
#if QLEVEL >= 1
                    if (f->sgn) q_kernel32s(kc, u, sc, mm, gs, xq, dx, xs, f, c, b0 != 0);
                    else if (G == 32) q_kernel32(kc, u, sc, mm, gs, xq, dx, xs, f, c, b0 != 0);
                    else q_kernel16(kc, u, sc, mm, gs, xq, dx, xs, f, c, b0 != 0);
#else
                    q_kernel_c(kc, (int)G, u, sc, mm, gs, xq, dx, xs, f, c, b0 != 0);
#endif
                }
            }
            for (long m = 0; m < M; m++) {
                const float *t = tile + (m / QNT) * QMW * QNT + m % QNT;
                float *yr = y + m * ldy + n0;
                for (long i = 0; i < mw; i++) yr[i] = t[i * QNT];
            }
        }
        free(u);
        free(sc);
        free(tile);
    }
    return fail;
}

/* Y[M, N] = X[M, K] @ dequant(W)^T with X quantized to int8 per 32 inputs (see the top of
 * this file). Same arguments and results as rlx_dqp_gemm; 2 also for Q8_K. */
int rlx_dqp_gemm_q8(int code, long qk, long bb, int r, long M, long N, long K, const float *x,
                    long ldx, const uint8_t *w, float *y, long ldy, int threads) {
    qform_t f;
    if (p_check(code, qk, bb, M, N, K, r, threads) || !q_form(code, &f)) return 2;
    if (M == 0 || N == 0) return 0;
    if (K == 0) {
        for (long m = 0; m < M; m++) memset(y + m * ldy, 0, (size_t)N * 4);
        return 0;
    }
    pw_t s = {code, r, qk, bb, K / qk, N, w};
    const long np = (M + QNT - 1) / QNT;
    qx_t X;
    X.q = (int8_t *)p_alloc((size_t)np * QNT * K);
    X.dx = (float *)p_alloc((size_t)np * QNT * (K / 32) * 4);
    X.m16 = (float *)p_alloc((size_t)np * QNT * (K / 16) * 4);
    X.m32 = (float *)p_alloc((size_t)np * QNT * (K / 32) * 4);
    int rc = 1;
    if (X.q && X.dx && X.m16 && X.m32) {
        q_pack_x(x, ldx, M, K, &X, threads);
        rc = q_gemm(&s, &f, M, N, K, &X, y, ldy, threads);
    }
    free(X.q);
    free(X.dx);
    free(X.m16);
    free(X.m32);
    return rc;
}

int rlx_dqp_q8_level(void) { return QLEVEL; }
