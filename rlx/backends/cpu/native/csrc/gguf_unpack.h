/* GGUF Q6_K unpacking on AVX2 / AVX-512 shared by the fused decode-dot rows
 * (dqgemm_rows.c) and the integer path (dqgemm_q8.c). In: one 210-byte block_q6_k (u8
 * ql[128]; u8 qh[64]; i8 scales[16]; half d). Out: q6k_scales() (the 16 scales times d
 * as f32, scales 0-7 and 8-15) and, per half h (outputs 128 h ..), q6k_half() loading
 * its ql / qh bytes and q6k_codes() giving group g's 32 unsigned 6-bit codes (outputs
 * 128 h + 32 g + l, l < 32; the value is d * scale[8 h + 2 g + l / 16] * (code - 32)).
 * Inlined by rlx.backends.cpu.native.csrc_source (part of the cache key); the guard
 * keeps one copy per library. Also q3k_scales16: Q3_K's 16 scales times d. */
#ifndef RLX_GGUF_UNPACK_H
#define RLX_GGUF_UNPACK_H
#ifdef __AVX2__
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline void q6k_scales(const uint8_t *block, float d, __m256 *lo, __m256 *hi) {
    __m128i s8 = _mm_loadu_si128((const __m128i *)(block + 192));
    __m256 dv = _mm256_set1_ps(d);
    *lo = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s8)));
    *hi = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8))));
}

/* Q3_K: the 16 6-bit scales (offset 32) of the block at p (12 bytes at p + 96) times d,
 * as f32 (scales 0-7 in *lo, 8-15 in *hi), unpacked four at a time with 32-bit masks (as
 * ggml's kmask trick): scale i has low bits nibble i % 8 of byte i % 8 (low nibble for
 * i < 8) and high bits 2 (i / 4) of byte 8 + i % 4. */
static inline void q3k_scales16(const uint8_t *p, float d, __m256 *lo, __m256 *hi) {
    uint32_t a[4];
    memcpy(a, p + 96, 12);
    const uint32_t k1 = 0x03030303u, k2 = 0x0f0f0f0fu;
    uint32_t t = a[2];
    a[2] = ((a[0] >> 4) & k2) | (((t >> 4) & k1) << 4);
    a[3] = ((a[1] >> 4) & k2) | (((t >> 6) & k1) << 4);
    a[0] = (a[0] & k2) | ((t & k1) << 4);
    a[1] = (a[1] & k2) | (((t >> 2) & k1) << 4);
    /* from registers: a 16-byte load of the words just stored would miss store forwarding */
    __m128i s8 = _mm_sub_epi8(_mm_setr_epi32((int)a[0], (int)a[1], (int)a[2], (int)a[3]),
                              _mm_set1_epi8(32));
    __m256 dv = _mm256_set1_ps(d);
    *lo = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s8)));
    *hi = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8))));
}

typedef struct {
    __m256i l0, l1, hb; /* ql bytes 0..31 and 32..63 of the half, its 32 qh bytes */
} q6k_half_t;

static inline q6k_half_t q6k_half(const uint8_t *block, int h) {
    q6k_half_t x;
    x.l0 = _mm256_loadu_si256((const __m256i *)(block + h * 64));
    x.l1 = _mm256_loadu_si256((const __m256i *)(block + h * 64 + 32));
    x.hb = _mm256_loadu_si256((const __m256i *)(block + 128 + h * 32));
    return x;
}

static inline __m256i q6k_codes(q6k_half_t x, int g) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    __m256i lo = g & 1 ? x.l1 : x.l0;
    lo = _mm256_and_si256(g >> 1 ? _mm256_srli_epi16(lo, 4) : lo, m4);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x.hb, 2 * g), m2);
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}
#endif
#endif
