/* Weight-only quantized matmul for rlx: Y[M,N] = X[M,K] @ dequant(W)[N,K]^T, reading the
 * packed weight directly (no f32 copy of the whole weight).
 *
 * W is stored row-major by output channel (row n = the K weights of output n), in one of
 * the layouts of rlx.quant.schemes (codes below): the llama.cpp GGUF blocks (scales inside
 * the bytes: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 with 32 weights per block, Q2_K..Q8_K with 256)
 * or rlx's Int8Block / Int4Block (separate f32 scale and i32 zero point per block) and
 * per-tensor FP8 (a 256-entry byte -> f32 table from the caller).
 *
 * Every block is decoded exactly as ggml-quants.c (and rlx.quant.gguf) decode it, into a
 * small f32 buffer that stays in L1; the products are f32 FMAs (f32 accumulation):
 *
 *   decode (M < 4, a GEMV streaming W once): on AVX2 / AVX-512, Q8_0, Q5_0, Q4_K, Q6_K,
 *     Int8Block and Int4Block run fused row kernels (bytes widened to i32 lanes, converted,
 *     FMA with X, block scales applied to the block's vector sum); every other scheme (and
 *     the portable target) decodes a chunk of ~256 weights of the row into an L1 buffer
 *     and dots it with each X row (4 vector accumulators).
 *   prefill (M >= 4): a panel of NB output rows x KC weights is decoded into a transposed
 *     f32 tile [KC][NB] (NB = 2 vectors), then a register-blocked micro-kernel runs
 *     MR = 6 X rows x NB columns (12 vector accumulators) over it, accumulating into Y.
 *
 * Vectors: AVX-512 (16 lanes, FMA), AVX2 (8 lanes, FMA) or SSE2 (4 lanes, mul + add),
 * chosen by the build target's -march flags (never -march=native). Threads: OpenMP over
 * output rows (decode) or NB-row panels (prefill), num_threads from the caller.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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
} dq_t;

/* Decode block b of row n into out[0 .. qk). Same arithmetic, in the same order, as
 * rlx.quant.gguf / rlx.quant.schemes.dequantize_weight (so the values are bit-exact). */
static void decode_block(const dq_t *s, long n, long b, float *restrict out) {
    const uint8_t *p = s->w + n * s->row_bytes + b * s->bb;
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

static float row_q8_0(const uint8_t *p, long nb, const float *x) {
    vf t0 = VZERO(), t1 = VZERO();
    long b = 0;
    for (; b + 2 <= nb; b += 2, p += 68, x += 64) {
        vf a0 = VZERO(), a1 = VZERO();
        for (int v = 0; v < 32; v += VW) {
            a0 = VFMA(VCVT(VI8(p + 2 + v)), VLOAD(x + v), a0);
            a1 = VFMA(VCVT(VI8(p + 36 + v)), VLOAD(x + 32 + v), a1);
        }
        t0 = VFMA(VSET1(hf(p)), a0, t0);
        t1 = VFMA(VSET1(hf(p + 34)), a1, t1);
    }
    for (; b < nb; b++, p += 34, x += 32) {
        vf a0 = VZERO();
        for (int v = 0; v < 32; v += VW) a0 = VFMA(VCVT(VI8(p + 2 + v)), VLOAD(x + v), a0);
        t0 = VFMA(VSET1(hf(p)), a0, t0);
    }
    return vhsum(VADD(t0, t1));
}

__attribute__((unused)) static float row_q5_0_v(const uint8_t *p, long nb, const float *x) {
    vf t0 = VZERO(), t1 = VZERO();
    const vi m15 = VISET1(15), one = VISET1(1), c16 = VISET1(16), lanes = VLANES();
    for (long b = 0; b < nb; b++, p += 22, x += 32) {
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

/* xs[j]: sum of X over the j-th run of 32 inputs. The 6-bit scales and mins are unpacked
 * eight at a time with 32-bit masks (as ggml's utmp trick), the mins' term is one 8-lane
 * FMA per super-block against xs. */
__attribute__((unused)) static float row_q4_k_v(const uint8_t *p, long nb, const float *x, const float *xs) {
    vf t0 = VZERO(), t1 = VZERO();
    __m256 mins = _mm256_setzero_ps();
#if VW == 16
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
    const vi m15 = VISET1(15);
#endif
    float dsc[8];
    for (long b = 0; b < nb; b++, p += 144, x += 256, xs += 8) {
        uint32_t u[4];
        memcpy(u, p + 4, 12);
        u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
        uint32_t m03 = u[1] & 0x3f3f3f3fu;
        u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
        u[2] = m03;
        u[0] &= 0x3f3f3f3fu; /* bytes: scales 0..7, then mins 0..7 */
        __m128i sm = _mm_loadu_si128((const __m128i *)u);
        __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm));
        __m256 mf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
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
static float row_q6_k(const uint8_t *p, long nb, const float *x) {
    vf t0 = VZERO(), t1 = VZERO();
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3), c32 = _mm256_set1_epi8(32);
    float dsc[16];
    for (long b = 0; b < nb; b++, p += 210, x += 256) {
        const uint8_t *ql = p, *qh = p + 128;
        __m128i s8 = _mm_loadu_si128((const __m128i *)(p + 192));
        __m256 dv = _mm256_set1_ps(hf(p + 208));
        _mm256_storeu_ps(dsc, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s8))));
        _mm256_storeu_ps(dsc + 8, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                      _mm_srli_si128(s8, 8)))));
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + h * 64));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + h * 64 + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + h * 32));
            for (int g = 0; g < 4; g++) {
                __m256i lo = g & 1 ? l1 : l0;
                lo = _mm256_and_si256(g >> 1 ? _mm256_srli_epi16(lo, 4) : lo, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), m2);
                __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), c32);
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
static float row_q4_k(const uint8_t *p, long nb, const float *x, const float *xs) {
    (void)xs;
    __m512 t0 = VZERO(), t1 = VZERO(), t2 = VZERO(), t3 = VZERO();
    const __m512 iota = _mm512_loadu_ps(IOTA16);
    float dsc[8], dmn[8];
    for (long b = 0; b < nb; b++, p += 144, x += 256) {
        uint32_t u[4];
        memcpy(u, p + 4, 12);
        u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
        uint32_t m03 = u[1] & 0x3f3f3f3fu;
        u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
        u[2] = m03;
        u[0] &= 0x3f3f3f3fu;
        __m128i sm = _mm_loadu_si128((const __m128i *)u);
        __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm));
        __m256 mf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
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
static float row_q5_0(const uint8_t *p, long nb, const float *x) {
    __m512 t0 = VZERO(), t1 = VZERO();
    const __m512 iota = _mm512_loadu_ps(IOTA16), iota_m16 = _mm512_sub_ps(iota, VSET1(16.0f));
    const __m512i m15 = VISET1(15), c16 = VISET1(16);
    for (long b = 0; b < nb; b++, p += 22, x += 32) {
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

static int fused_ok(const dq_t *s) {
    switch (s->code) {
    case S_Q8_0: case S_Q5_0: case S_Q4_K: case S_Q6_K: return 1;
    case S_I8: return s->qk % VW == 0;
    case S_I4: return (s->qk / 2) % VW == 0;
    default: return 0;
    }
}

/* per X row: [K] prepared values then [K / 32] sums (Q4_K) or the even / odd split (Int4) */
static void prep_x(const dq_t *s, const float *x, long K, float *out) {
    if (s->code == S_Q4_K) {
        for (long j = 0; j < K / 32; j++) {
            float t = 0.0f;
            for (int l = 0; l < 32; l++) t += x[j * 32 + l];
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
    const uint8_t *p = s->w + n * s->row_bytes;
    switch (s->code) {
    case S_Q8_0: return row_q8_0(p, s->nb, x);
    case S_Q5_0: return row_q5_0(p, s->nb, x);
    case S_Q4_K: return row_q4_k(p, s->nb, x, px);
    case S_Q6_K: return row_q6_k(p, s->nb, x);
    case S_I8:
        return row_i8((const int8_t *)p, s->scale + n * s->nb, s->zp + n * s->nb, s->nb, s->qk, x);
    default:
        return row_i4(p, s->scale + n * s->nb, s->zp + n * s->nb, s->nb, s->qk, px, px + K / 2);
    }
}
#else
#define FUSED 0
#endif

/* ---- decode: M < 4 ------------------------------------------------------------------ */
static int gemv(const dq_t *s, long M, long N, long K, const float *x, long ldx, float *y,
                long ldy, int threads) {
    long cb = chunk_blocks(s), clen = cb * s->qk;
    int fail = 0;
    (void)K;
    /* grain: waking a second thread costs tens of microseconds (OMP_WAIT_POLICY=PASSIVE),
     * more than streaming a small weight takes, so below ~256 KB per thread fewer run */
    long per = 262144, want = (N * s->row_bytes + per - 1) / per;
    if (want < threads) threads = want < 1 ? 1 : (int)want;
#if FUSED
    if (fused_ok(s)) {
        float *px = alloc_f(M * K + 1);
        if (!px) return 1;
        for (long m = 0; m < M; m++) prep_x(s, x + m * ldx, K, px + m * K);
#pragma omp parallel for num_threads(threads) schedule(static)
        for (long n = 0; n < N; n++)
            for (long m = 0; m < M; m++)
                y[m * ldy + n] = fused_row(s, n, x + m * ldx, px + m * K, K);
        free(px);
        return 0;
    }
#endif
#pragma omp parallel num_threads(threads) reduction(| : fail)
    {
        float *buf = alloc_f(clen);
        if (!buf) fail = 1;
        else {
#pragma omp for schedule(static)
            for (long n = 0; n < N; n++) {
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (long b0 = 0; b0 < s->nb; b0 += cb) {
                    long nblk = s->nb - b0 < cb ? s->nb - b0 : cb;
                    decode_blocks(s, n, b0, nblk, buf);
                    for (long m = 0; m < M; m++)
                        acc[m] += dot(buf, x + m * ldx + b0 * s->qk, nblk * s->qk);
                }
                for (long m = 0; m < M; m++) y[m * ldy + n] = acc[m];
            }
            free(buf);
        }
    }
    return fail;
}

/* ---- prefill: M >= 4 ---------------------------------------------------------------- */
/* Y[m0 .. m0+mr, cols) += X[m0 .., k0 .. k0+kc) @ tile[kc][NB] (only ncols columns stored) */
static inline void micro(const float *restrict tile, long kc, const float *x, long ldx,
                         long mr, float *y, long ldy, long ncols, int first) {
    const float *xr[MR];
    for (int i = 0; i < MR; i++) xr[i] = x + (i < mr ? i : 0) * ldx;
    vf a0[MR], a1[MR];
    for (int i = 0; i < MR; i++) a0[i] = a1[i] = VZERO();
    for (long t = 0; t < kc; t++) {
        vf b0 = VLOAD(tile + t * NB), b1 = VLOAD(tile + t * NB + VW);
        for (int i = 0; i < MR; i++) {
            vf a = VSET1(xr[i][t]);
            a0[i] = VFMA(a, b0, a0[i]);
            a1[i] = VFMA(a, b1, a1[i]);
        }
    }
    for (long i = 0; i < mr; i++) {
        float tmp[NB];
        VSTORE(tmp, a0[i]);
        VSTORE(tmp + VW, a1[i]);
        float *yr = y + i * ldy;
        if (first)
            for (long j = 0; j < ncols; j++) yr[j] = tmp[j];
        else
            for (long j = 0; j < ncols; j++) yr[j] += tmp[j];
    }
}

static int gemm_tiled(const dq_t *s, long M, long N, long K, const float *x, long ldx, float *y,
                      long ldy, int threads) {
    long cb = chunk_blocks(s), clen = cb * s->qk;
    long panels = (N + NB - 1) / NB;
    int fail = 0;
    (void)K;
    /* K chunks outermost: the chunk of X is copied once into a contiguous [M][kc] panel
     * (rows a few KB apart instead of K floats) that every weight panel then reuses */
    float *xc = alloc_f(M * clen);
    if (!xc) return 1;
#pragma omp parallel num_threads(threads) reduction(| : fail)
    {
        float *buf = alloc_f(clen);
        float *tile = alloc_f(clen * NB);
        int ok = buf && tile;
        if (!ok) fail = 1;
        for (long b0 = 0; b0 < s->nb; b0 += cb) {
            long nblk = s->nb - b0 < cb ? s->nb - b0 : cb, kc = nblk * s->qk;
#pragma omp for schedule(static)
            for (long m = 0; m < M; m++)
                memcpy(xc + m * kc, x + m * ldx + b0 * s->qk, (size_t)kc * sizeof(float));
#pragma omp for schedule(dynamic, 1)
            for (long p = 0; p < panels; p++) {
                if (!ok) continue;
                long n0 = p * NB, ncols = N - n0 < NB ? N - n0 : NB;
                for (long r = 0; r < NB; r++) {
                    if (r < ncols) {
                        decode_blocks(s, n0 + r, b0, nblk, buf);
                        for (long t = 0; t < kc; t++) tile[t * NB + r] = buf[t];
                    } else {
                        for (long t = 0; t < kc; t++) tile[t * NB + r] = 0.0f;
                    }
                }
                for (long m0 = 0; m0 < M; m0 += MR) {
                    long mr = M - m0 < MR ? M - m0 : MR;
                    micro(tile, kc, xc + m0 * kc, kc, mr, y + m0 * ldy + n0, ldy, ncols, b0 == 0);
                }
            }
        }
        free(buf);
        free(tile);
    }
    free(xc);
    return fail;
}

/* ---- entry points ------------------------------------------------------------------- */
/* Returns 0 on success, 1 when a scratch buffer could not be allocated, 2 on bad args. */
int rlx_dq_gemm(int code, long qk, long bb, long M, long N, long K, const float *x, long ldx,
                const uint8_t *w, long row_bytes, const float *scale, const int32_t *zp,
                const float *lut, float *y, long ldy, int threads) {
    if (qk <= 0 || K % qk || M < 0 || N < 0 || threads < 1) return 2;
    dq_t s = {code, qk, bb, K / qk, row_bytes, w, scale, zp, lut};
    if (M == 0 || N == 0) return 0;
    if (K == 0) {
        for (long m = 0; m < M; m++) memset(y + m * ldy, 0, (size_t)N * 4);
        return 0;
    }
    if (M < 4) return gemv(&s, M, N, K, x, ldx, y, ldy, threads);
    return gemm_tiled(&s, M, N, K, x, ldx, y, ldy, threads);
}

/* Decode rows [n0, n0 + rows) fully into out [rows, K] (tests and the reference path). */
int rlx_dq_decode(int code, long qk, long bb, long K, const uint8_t *w, long row_bytes,
                  const float *scale, const int32_t *zp, const float *lut, long n0, long rows,
                  float *out) {
    if (qk <= 0 || K % qk) return 2;
    dq_t s = {code, qk, bb, K / qk, row_bytes, w, scale, zp, lut};
    for (long r = 0; r < rows; r++) decode_blocks(&s, n0 + r, 0, s.nb, out + r * K);
    return 0;
}

/* Streaming read of n floats on `threads` threads (the bandwidth probe): their sum. */
double rlx_dq_stream_read(const float *a, long n, int threads) {
    double total = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        vf s0 = VZERO(), s1 = VZERO(), s2 = VZERO(), s3 = VZERO();
        long per = 4 * VW;
        long chunks = n / per;
#pragma omp for schedule(static)
        for (long c = 0; c < chunks; c++) {
            const float *p = a + c * per;
            s0 = VADD(s0, VLOAD(p));
            s1 = VADD(s1, VLOAD(p + VW));
            s2 = VADD(s2, VLOAD(p + 2 * VW));
            s3 = VADD(s3, VLOAD(p + 3 * VW));
        }
        total += (double)vhsum(VADD(VADD(s0, s1), VADD(s2, s3)));
    }
    for (long j = n / (4 * VW) * 4 * VW; j < n; j++) total += a[j];
    return total;
}

int rlx_dq_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int rlx_dq_lanes(void) { return VW; }

/* 1 when scheme `code` (with block size qk) has a fused decode-dot row kernel here */
int rlx_dq_fused(int code, long qk) {
#if FUSED
    dq_t s = {code, qk, 0, 0, 0, 0, 0, 0, 0};
    return fused_ok(&s);
#else
    (void)code;
    (void)qk;
    return 0;
#endif
}
