/* dqgemm part 1 of 7 (see dqgemm.c for the library's overview): the vector layer, f16,
 * the packed weight and its exact block decoder. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "dq_layout.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__AVX2__) || defined(__SSE2__)
#include <immintrin.h>
#endif

enum {
    S_I8 = 0, S_I4 = 1, S_FP8 = 2,
    S_Q4_0 = 10, S_Q4_1 = 11, S_Q5_0 = 12, S_Q5_1 = 13, S_Q8_0 = 14,
    S_Q2_K = 20, S_Q3_K = 21, S_Q4_K = 22, S_Q5_K = 23, S_Q6_K = 24, S_Q8_K = 25
};

/* ---- vectors ----------------------------------------------------------------------- */
#if defined(__AVX512F__)
#define VW 16
typedef __m512 vf;
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VSET1(s) _mm512_set1_ps(s)
#define VZERO() _mm512_setzero_ps()
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)
static inline float vhsum(vf v) { return _mm512_reduce_add_ps(v); }
#define ISA_NAME "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
typedef __m256 vf;
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VSET1(s) _mm256_set1_ps(s)
#define VZERO() _mm256_setzero_ps()
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)
static inline float vhsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#define ISA_NAME "avx2"
#elif defined(__SSE2__)
#define VW 4
typedef __m128 vf;
#define VLOAD(p) _mm_loadu_ps(p)
#define VSTORE(p, v) _mm_storeu_ps(p, v)
#define VSET1(s) _mm_set1_ps(s)
#define VZERO() _mm_setzero_ps()
#define VFMA(a, b, c) _mm_add_ps(_mm_mul_ps(a, b), c)
#define VADD(a, b) _mm_add_ps(a, b)
static inline float vhsum(vf v) {
    __m128 s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#define ISA_NAME "sse2"
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define DQ_NEON_PART 1
#include "dqgemm_neon.h"
#undef DQ_NEON_PART
#else
#define VW 1
typedef float vf;
#define VLOAD(p) (*(p))
#define VSTORE(p, v) (*(p) = (v))
#define VSET1(s) (s)
#define VZERO() 0.0f
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VADD(a, b) ((a) + (b))
static inline float vhsum(vf v) { return v; }
#define ISA_NAME "scalar"
#endif

#ifndef DQ_TABLE_Q4K /* AVX-512 table (vpermps) decode per scheme: 1 on, 0 off */
#define DQ_TABLE_Q4K 0
#endif
#ifndef DQ_TABLE_Q5_0
#define DQ_TABLE_Q5_0 1
#endif
#ifndef DQ_TABLE_I4
#define DQ_TABLE_I4 1
#endif

#define NB (2 * VW) /* output rows per prefill panel */
#define MR 6        /* X rows per micro-kernel call */
#define CHUNK 256   /* target weights decoded per step */

/* ---- scalars ----------------------------------------------------------------------- */
static inline float f32_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* IEEE half (little-endian bytes) -> f32, exact (subnormals, inf and nan included) */
static inline float h2f(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24, exact */
        return sign ? -v : v;
    }
    if (e == 31) return f32_bits(sign | 0x7F800000u | (m << 13));
    return f32_bits(sign | ((e + 112) << 23) | (m << 13));
}

/* 64-byte aligned room for n floats (aligned_alloc needs a multiple of the alignment) */
static float *alloc_f(long n) {
    return (float *)aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
}

static inline float ld_f32(const uint8_t *p) { float f; memcpy(&f, p, 4); return f; }

/* ---- the packed weight ------------------------------------------------------------- */
typedef struct {
    int code;
    long qk;        /* weights per block */
    long bb;        /* bytes per block (GGUF), or per block of w_q (Int8/Int4/FP8) */
    long nb;        /* blocks per row */
    long row_bytes; /* bytes per packed row */
    const uint8_t *w;
    const float *scale; /* [N, nb] (Int8/Int4) or [1] (FP8) */
    const int32_t *zp;  /* same shape as scale */
    const float *lut;   /* FP8: byte -> f32 */
    long N;             /* rows (the interleaved layout's tail starts at N - N % R) */
    int R;              /* rows interleaved (dq_layout.h): 1 plain, 4 or 8 (GGUF only) */
} dq_t;

/* Block 0 of row n and the bytes from one of its blocks to the next (dq_layout.h). */
static inline const uint8_t *dq_row(const dq_t *s, long n) {
    return dq_row_start(s->w, n, s->N, s->nb, s->bb, s->R);
}
static inline long dq_bst(const dq_t *s, long n) { return dq_block_stride(n, s->N, s->bb, s->R); }

/* Whether scheme `code` may be stored with R rows interleaved: R = 1 always, R = 4 or 8
 * for the GGUF block layouts (codes 10..25). */
static inline int dq_r_ok(int code, int R) { return R == 1 || ((R == 4 || R == 8) && code >= 10); }

/* Decode block b of row n into out[0 .. qk). Same arithmetic, in the same order, as
 * rlx.formats.gguf / rlx.formats.schemes.dequantize_weight (so the values are bit-exact). */
static void decode_block(const dq_t *s, long n, long b, float *restrict out) {
    const uint8_t *p = dq_row(s, n) + b * dq_bst(s, n);
    switch (s->code) {
    case S_I8: {
        const int8_t *q = (const int8_t *)p;
        float sc = s->scale[n * s->nb + b];
        int32_t z = s->zp[n * s->nb + b];
        for (long j = 0; j < s->qk; j++) out[j] = (float)((int32_t)q[j] - z) * sc;
        break;
    }
    case S_I4: {
        float sc = s->scale[n * s->nb + b];
        int32_t z = s->zp[n * s->nb + b];
        for (long j = 0; j < s->qk / 2; j++) {
            out[2 * j] = (float)((int32_t)(p[j] & 15) - z) * sc;
            out[2 * j + 1] = (float)((int32_t)(p[j] >> 4) - z) * sc;
        }
        break;
    }
    case S_FP8: {
        float sc = s->scale[0], z = (float)s->zp[0];
        for (long j = 0; j < s->qk; j++) out[j] = (s->lut[p[j]] - z) * sc;
        break;
    }
    case S_Q4_0: {
        float d = h2f(p);
        const uint8_t *qs = p + 2;
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)((int)(qs[j] & 15) - 8);
            out[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
        }
        break;
    }
    case S_Q4_1: {
        float d = h2f(p), m = h2f(p + 2);
        const uint8_t *qs = p + 4;
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)(qs[j] & 15) + m;
            out[j + 16] = d * (float)(qs[j] >> 4) + m;
        }
        break;
    }
    case S_Q5_0:
    case S_Q5_1: {
        int one = s->code == S_Q5_1;
        float d = h2f(p), m = one ? h2f(p + 2) : 0.0f;
        const uint8_t *qhp = p + 2 + 2 * one;
        uint32_t qh = (uint32_t)qhp[0] | ((uint32_t)qhp[1] << 8) | ((uint32_t)qhp[2] << 16) |
                      ((uint32_t)qhp[3] << 24);
        const uint8_t *qs = qhp + 4;
        int lo[32];
        for (int j = 0; j < 16; j++) {
            lo[j] = (qs[j] & 15) | (((qh >> j) & 1) << 4);
            lo[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        }
        if (one)
            for (int j = 0; j < 32; j++) out[j] = d * (float)lo[j] + m;
        else
            for (int j = 0; j < 32; j++) out[j] = d * (float)(lo[j] - 16);
        break;
    }
    case S_Q8_0: {
        float d = h2f(p);
        const int8_t *qs = (const int8_t *)(p + 2);
        for (int j = 0; j < 32; j++) out[j] = (float)qs[j] * d;
        break;
    }
    case S_Q2_K: {
        const uint8_t *sc = p, *qs = p + 16;
        float d = h2f(p + 80), dmin = h2f(p + 82);
        for (int h = 0; h < 2; h++)
            for (int sh = 0; sh < 4; sh++)
                for (int half16 = 0; half16 < 2; half16++) {
                    int is = h * 8 + sh * 2 + half16; /* sub-block of 16 */
                    float dl = d * (float)(sc[is] & 15), ml = dmin * (float)(sc[is] >> 4);
                    const uint8_t *q = qs + h * 32 + half16 * 16;
                    float *o = out + h * 128 + sh * 32 + half16 * 16;
                    for (int l = 0; l < 16; l++) o[l] = dl * (float)((q[l] >> (2 * sh)) & 3) - ml;
                }
        break;
    }
    case S_Q3_K: {
        const uint8_t *hm = p, *qs = p + 32, *sc = p + 96;
        float d = h2f(p + 108);
        int8_t scl[16];
        for (int i = 0; i < 16; i++) {
            int lo = i < 8 ? (sc[i] & 15) : (sc[i - 8] >> 4);
            int hi = (sc[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
            scl[i] = (int8_t)((lo | (hi << 4)) - 32);
        }
        for (int h = 0; h < 2; h++)
            for (int sh = 0; sh < 4; sh++)
                for (int half16 = 0; half16 < 2; half16++) {
                    int is = h * 8 + sh * 2 + half16, bit = h * 4 + sh;
                    float dl = d * (float)scl[is];
                    const uint8_t *q = qs + h * 32 + half16 * 16, *hq = hm + half16 * 16;
                    float *o = out + h * 128 + sh * 32 + half16 * 16;
                    for (int l = 0; l < 16; l++) {
                        int v = ((q[l] >> (2 * sh)) & 3) - (((hq[l] >> bit) & 1) ? 0 : 4);
                        o[l] = dl * (float)v;
                    }
                }
        break;
    }
    case S_Q4_K:
    case S_Q5_K: {
        int five = s->code == S_Q5_K;
        float d = h2f(p), dmin = h2f(p + 2);
        const uint8_t *q = p + 4, *qh = p + 16, *ql = p + 16 + 32 * five;
        for (int j = 0; j < 8; j++) {
            int scj, mj;
            if (j < 4) {
                scj = q[j] & 63;
                mj = q[j + 4] & 63;
            } else {
                scj = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
                mj = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
            }
            float d1 = d * (float)scj, m1 = dmin * (float)mj;
            const uint8_t *c = ql + (j >> 1) * 32;
            int shift = (j & 1) * 4;
            float *o = out + j * 32;
            if (five)
                for (int l = 0; l < 32; l++)
                    o[l] = d1 * (float)(((c[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4)) - m1;
            else
                for (int l = 0; l < 32; l++) o[l] = d1 * (float)((c[l] >> shift) & 15) - m1;
        }
        break;
    }
    case S_Q6_K: {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = h2f(p + 208);
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++)
                for (int half16 = 0; half16 < 2; half16++) {
                    /* output 128 h + 32 g + l (l < 32): scale 8 h + 2 g + l / 16 */
                    float dl = d * (float)sc[h * 8 + g * 2 + half16];
                    const uint8_t *lq = ql + h * 64 + (g & 1) * 32 + half16 * 16;
                    const uint8_t *hq = qh + h * 32 + half16 * 16;
                    int lsh = (g >> 1) * 4, hsh = 2 * g;
                    float *o = out + h * 128 + g * 32 + half16 * 16;
                    for (int l = 0; l < 16; l++) {
                        int v = (((lq[l] >> lsh) & 15) | (((hq[l] >> hsh) & 3) << 4)) - 32;
                        o[l] = dl * (float)v;
                    }
                }
        break;
    }
    case S_Q8_K: {
        float d = ld_f32(p);
        const int8_t *qs = (const int8_t *)(p + 4);
        for (int j = 0; j < 256; j++) out[j] = d * (float)qs[j];
        break;
    }
    default:
        memset(out, 0, (size_t)s->qk * sizeof(float));
    }
}

static inline void decode_blocks(const dq_t *s, long n, long b0, long nblk, float *out) {
    for (long b = 0; b < nblk; b++) decode_block(s, n, b0 + b, out + b * s->qk);
}

/* sum_j a[j] * b[j], f32 accumulation in 4 vector accumulators */
static inline float dot(const float *restrict a, const float *restrict b, long len) {
    vf s0 = VZERO(), s1 = VZERO(), s2 = VZERO(), s3 = VZERO();
    long j = 0;
    for (; j + 4 * VW <= len; j += 4 * VW) {
        s0 = VFMA(VLOAD(a + j), VLOAD(b + j), s0);
        s1 = VFMA(VLOAD(a + j + VW), VLOAD(b + j + VW), s1);
        s2 = VFMA(VLOAD(a + j + 2 * VW), VLOAD(b + j + 2 * VW), s2);
        s3 = VFMA(VLOAD(a + j + 3 * VW), VLOAD(b + j + 3 * VW), s3);
    }
    for (; j + VW <= len; j += VW) s0 = VFMA(VLOAD(a + j), VLOAD(b + j), s0);
    float r = vhsum(VADD(VADD(s0, s1), VADD(s2, s3)));
    for (; j < len; j++) r += a[j] * b[j];
    return r;
}

static long chunk_blocks(const dq_t *s) {
    long c = s->qk >= CHUNK ? 1 : CHUNK / s->qk;
    return c > s->nb ? s->nb : c;
}


