/* Low-precision float conversions for rlx: f32 <-> bf16 and f32 <-> f16.
 *
 * Every function gives exactly the bits of the Python references:
 *   f32 -> bf16  ml_dtypes: round to nearest even; any NaN becomes the canonical quiet
 *                NaN 0x7fc0 with the input's sign.
 *   bf16 -> f32  ml_dtypes: the 16 bits shifted up (exact, NaN payloads kept).
 *   f32 -> f16   NumPy (npy_floatbits_to_halfbits): round to nearest even, overflow to
 *                inf; a NaN keeps its sign and the top 10 significand bits (a NaN whose
 *                kept bits are zero gets significand 1), a signalling NaN stays signalling.
 *   f16 -> f32   NumPy (npy_halfbits_to_floatbits): exact, NaN payloads kept unquieted.
 *   On aarch64 NumPy converts f16 with FCVT (__fp16), which quiets a signalling NaN:
 *   every level there does the same (CAST_F16_FROM_F32 / CAST_F32_FROM_F16).
 *
 * Code paths, picked per call by `level` (the caller clamps it to
 * rlx_lowp_max_level(), the best one this library was compiled for):
 *   3  aarch64 NEON (csrc/lowp_neon.h): 8 elements per step; f16 through FCVTN / FCVTL.
 *   2  AVX-512 (F + BW + VL): 16 lanes; f16 through vcvtps2ph / vcvtph2ps.
 *   1  AVX2 + F16C: 8 lanes.
 *   0  scalar C.
 * The hardware f16 conversions quiet signalling NaNs where NumPy does not: blocks
 * holding a NaN are redone lane by lane with the scalar code (NaNs are rare).
 * Large arrays are split over `threads` OpenMP threads.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RLX_HAVE_512 1
#else
#define RLX_HAVE_512 0
#endif
#if defined(__AVX2__) && defined(__F16C__)
#define RLX_HAVE_256 1
#else
#define RLX_HAVE_256 0
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define RLX_HAVE_NEON 1
#include "lowp_neon.h"
#else
#define RLX_HAVE_NEON 0
#endif

/* split sizes: below PAR_MIN elements one thread; chunks are multiples of 64 elements */
#define PAR_MIN (1L << 16)

int rlx_lowp_max_level(void) {
#if RLX_HAVE_NEON
    return 3;
#elif RLX_HAVE_512
    return 2;
#elif RLX_HAVE_256
    return 1;
#else
    return 0;
#endif
}

int rlx_lowp_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* ---- scalar reference conversions ---------------------------------------------- */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline uint16_t bf16_from_bits(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline uint16_t f16_from_bits(uint32_t f) {
    uint16_t h_sgn = (uint16_t)((f & 0x80000000u) >> 16);
    uint32_t f_exp = f & 0x7f800000u;
    uint32_t f_sig;
    if (f_exp >= 0x47800000u) {
        if (f_exp == 0x7f800000u) {
            f_sig = f & 0x007fffffu;
            if (f_sig != 0) {
                uint16_t ret = (uint16_t)(0x7c00u + (f_sig >> 13));
                if (ret == 0x7c00u) ret++;
                return (uint16_t)(h_sgn + ret);
            }
        }
        return (uint16_t)(h_sgn + 0x7c00u);
    }
    if (f_exp <= 0x38000000u) {
        if (f_exp < 0x33000000u) return h_sgn;
        f_exp >>= 23;
        f_sig = 0x00800000u + (f & 0x007fffffu);
        f_sig >>= (113 - f_exp);
        if (((f_sig & 0x00003fffu) != 0x00001000u) || (f & 0x000007ffu)) f_sig += 0x00001000u;
        return (uint16_t)(h_sgn + (uint16_t)(f_sig >> 13));
    }
    uint16_t h_exp = (uint16_t)((f_exp - 0x38000000u) >> 13);
    f_sig = f & 0x007fffffu;
    if ((f_sig & 0x00003fffu) != 0x00001000u) f_sig += 0x00001000u;
    return (uint16_t)(h_sgn + (uint16_t)((uint16_t)(f_sig >> 13) + h_exp));
}

#include "f16_bits.h"

/* the scalar f16 conversions of the ranges below: NumPy's on x86-64 (the functions
 * above); on aarch64 NumPy converts with the FCVT instruction (a signalling NaN comes out
 * quiet), and so does every level here */
#if RLX_HAVE_NEON
#define CAST_F16_FROM_F32 lowp_neon_f16_from_f32
#define CAST_F32_FROM_F16 lowp_neon_f32_from_f16
#else
#define CAST_F16_FROM_F32 f16_from_bits
#define CAST_F32_FROM_F16 rlx_f16_bits
#endif

/* ---- one contiguous range per kind and level ----------------------------------- */

static void f32_to_bf16_range(const uint32_t *src, uint16_t *dst, long n, int level) {
    long i = 0;
#if RLX_HAVE_512
    if (level >= 2) {
        const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
        const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
        const __m512i sgn = _mm512_set1_epi32(0x8000), qnan = _mm512_set1_epi32(0x7fc0);
        for (; i + 16 <= n; i += 16) {
            __m512i u = _mm512_loadu_si512((const void *)(src + i));
            __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
            r = _mm512_srli_epi32(r, 16);
            __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), inf);
            __m512i nv = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), sgn), qnan);
            r = _mm512_mask_blend_epi32(nan, r, nv);
            _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
        }
    }
#endif
#if RLX_HAVE_256
    if (level >= 1) {
        const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
        const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
        const __m256i sgn = _mm256_set1_epi32(0x8000), qnan = _mm256_set1_epi32(0x7fc0);
        for (; i + 16 <= n; i += 16) {
            __m256i r2[2];
            for (int h = 0; h < 2; h++) {
                __m256i u = _mm256_loadu_si256((const __m256i *)(src + i + 8 * h));
                __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
                r = _mm256_srli_epi32(r, 16);
                /* signed compare is enough: the masked values are < 2^31 */
                __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
                __m256i nv = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), sgn), qnan);
                r2[h] = _mm256_blendv_epi8(r, nv, nan);
            }
            __m256i p = _mm256_packus_epi32(r2[0], r2[1]); /* lanes 0-3,8-11,4-7,12-15 */
            p = _mm256_permute4x64_epi64(p, 0xd8);
            _mm256_storeu_si256((__m256i *)(dst + i), p);
        }
    }
#endif
#if RLX_HAVE_NEON
    if (level >= 3)
        for (; i + 8 <= n; i += 8) lowp_neon_f32_to_bf16x8(src + i, dst + i);
#endif
    (void)level;
    for (; i < n; i++) dst[i] = bf16_from_bits(src[i]);
}

static void bf16_to_f32_range(const uint16_t *src, uint32_t *dst, long n, int level) {
    long i = 0;
#if RLX_HAVE_512
    if (level >= 2) {
        for (; i + 16 <= n; i += 16) {
            __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
            _mm512_storeu_si512((void *)(dst + i), _mm512_slli_epi32(w, 16));
        }
    }
#endif
#if RLX_HAVE_256
    if (level >= 1) {
        for (; i + 8 <= n; i += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
            _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(w, 16));
        }
    }
#endif
#if RLX_HAVE_NEON
    if (level >= 3)
        for (; i + 8 <= n; i += 8) lowp_neon_bf16_to_f32x8(src + i, dst + i);
#endif
    (void)level;
    for (; i < n; i++) dst[i] = (uint32_t)src[i] << 16;
}

static void f32_to_f16_range(const uint32_t *src, uint16_t *dst, long n, int level) {
    long i = 0;
#if RLX_HAVE_512
    if (level >= 2) {
        const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
        for (; i + 16 <= n; i += 16) {
            __m512i u = _mm512_loadu_si512((const void *)(src + i));
            __m256i h = _mm512_cvtps_ph(_mm512_castsi512_ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm256_storeu_si256((__m256i *)(dst + i), h);
            if (_mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), inf))
                for (long j = i; j < i + 16; j++) dst[j] = f16_from_bits(src[j]);
        }
    }
#endif
#if RLX_HAVE_256
    if (level >= 1) {
        const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
        for (; i + 8 <= n; i += 8) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
            __m128i h = _mm256_cvtps_ph(_mm256_castsi256_ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_storeu_si128((__m128i *)(dst + i), h);
            if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf)))
                for (long j = i; j < i + 8; j++) dst[j] = f16_from_bits(src[j]);
        }
    }
#endif
#if RLX_HAVE_NEON
    if (level >= 3)
        for (; i + 8 <= n; i += 8) lowp_neon_f32_to_f16x8(src + i, dst + i);
#endif
    (void)level;
    for (; i < n; i++) dst[i] = CAST_F16_FROM_F32(src[i]);
}

static void f16_to_f32_range(const uint16_t *src, uint32_t *dst, long n, int level) {
    long i = 0;
#if RLX_HAVE_512
    if (level >= 2) {
        const __m256i absm = _mm256_set1_epi16(0x7fff), inf = _mm256_set1_epi16(0x7c00);
        for (; i + 16 <= n; i += 16) {
            __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
            _mm512_storeu_ps((void *)(dst + i), _mm512_cvtph_ps(h));
            if (_mm256_cmpgt_epu16_mask(_mm256_and_si256(h, absm), inf))
                for (long j = i; j < i + 16; j++) dst[j] = rlx_f16_bits(src[j]);
        }
    }
#endif
#if RLX_HAVE_256
    if (level >= 1) {
        const __m128i absm = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
        for (; i + 8 <= n; i += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
            _mm256_storeu_ps((float *)(dst + i), _mm256_cvtph_ps(h));
            /* signed 16-bit compare: the masked values are < 2^15 */
            if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, absm), inf)))
                for (long j = i; j < i + 8; j++) dst[j] = rlx_f16_bits(src[j]);
        }
    }
#endif
#if RLX_HAVE_NEON
    if (level >= 3)
        for (; i + 8 <= n; i += 8) lowp_neon_f16_to_f32x8(src + i, dst + i);
#endif
    (void)level;
    for (; i < n; i++) dst[i] = CAST_F32_FROM_F16(src[i]);
}

/* ---- entry points ---------------------------------------------------------------- */

typedef void (*range_fn)(const void *, void *, long, int);

static void run_split(range_fn fn, const char *src, size_t ssz, char *dst, size_t dsz, long n,
                      int level, int threads) {
    if (threads <= 1 || n < PAR_MIN) {
        fn(src, dst, n, level);
        return;
    }
    long chunk = ((n + threads - 1) / threads + 63) & ~63L;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++) {
        long lo = (long)t * chunk;
        long hi = lo + chunk < n ? lo + chunk : n;
        if (lo < hi) fn(src + lo * ssz, dst + lo * dsz, hi - lo, level);
    }
}

void rlx_f32_to_bf16(const float *src, uint16_t *dst, long n, int level, int threads) {
    run_split((range_fn)f32_to_bf16_range, (const char *)src, 4, (char *)dst, 2, n, level, threads);
}

void rlx_bf16_to_f32(const uint16_t *src, float *dst, long n, int level, int threads) {
    run_split((range_fn)bf16_to_f32_range, (const char *)src, 2, (char *)dst, 4, n, level, threads);
}

void rlx_f32_to_f16(const float *src, uint16_t *dst, long n, int level, int threads) {
    run_split((range_fn)f32_to_f16_range, (const char *)src, 4, (char *)dst, 2, n, level, threads);
}

void rlx_f16_to_f32(const uint16_t *src, float *dst, long n, int level, int threads) {
    run_split((range_fn)f16_to_f32_range, (const char *)src, 2, (char *)dst, 4, n, level, threads);
}

/* dst[i] = table[src[i]] for 16-bit codes (an activation of every bf16/f16 value,
 * tabulated once); src may be dst. */
void rlx_lut16(const uint16_t *src, const uint16_t *table, uint16_t *dst, long n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && n >= PAR_MIN)
    for (long i = 0; i < n; i++) dst[i] = table[src[i]];
}
