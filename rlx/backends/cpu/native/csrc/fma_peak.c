/* The f32 FMA peak probe. In: an iteration count and a thread count. Out: a checksum
   (so nothing is optimised away) and how many threads ran.

   Each thread runs `iters` rounds of RLX_PEAK_CHAINS independent multiply-add chains on
   the widest vectors the build target has: AVX-512 (16 f32 lanes, vfmadd on zmm), AVX2 +
   FMA (8 lanes, ymm), otherwise 4-lane GCC vectors (SSE2 on x86-64: a mul and an add, as
   the portable target's own kernels run). 12 chains cover FMA latency x throughput on
   current cores (4-5 cycles x 2 units) and leave registers for the two constants.
   A multiply-add counts 2 FLOPs.

   Two more probes for the low-precision GEMMs (rlx_peak_int8_run, rlx_peak_bf16_run),
   same chains, same calibration by the caller (native/peak.py):
     int8: the instructions the int8 GEMM of the build target multiplies with. AVX-512 with
           VNNI: vpdpbusd on zmm (64 u8 x s8 multiply-adds each); AVX2 (and AVX-512
           without VNNI, whose int8 GEMM is the AVX2 path): vpmaddubsw + vpmaddwd by ones
           on ymm, as the 7-bit-weight kernel runs them (32 multiply-adds per pair);
           portable: none (0 ops).
     int16 (rlx_peak_int16_run): vpmaddwd on ymm alone (16 s16 x s16 multiply-adds each),
           the instruction of the AVX2 kernel for 8-bit weights; 0 ops without AVX2.
     bf16: vdpbf16ps on zmm (32 bf16 multiply-adds each) when the target has AVX512_BF16;
           none elsewhere (0 ops: the bf16 GEMM runs on the f32 FMA path there).
   rlx_peak_int8_ops / rlx_peak_bf16_ops give the multiply-adds one instruction does. */
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__FMA__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#ifndef RLX_PEAK_CHAINS
#define RLX_PEAK_CHAINS 12
#endif

int rlx_peak_lanes(void) {
#if defined(__AVX512F__)
    return 16;
#elif defined(__FMA__)
    return 8;
#else
    return 4;
#endif
}

int rlx_peak_chains(void) { return RLX_PEAK_CHAINS; }

/* 1 when the loop uses fused multiply-adds, 0 for a separate mul + add. */
int rlx_peak_fused(void) {
#if defined(__AVX512F__) || defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

typedef float rlx_v4f __attribute__((vector_size(16)));

double rlx_peak_run(int64_t iters, int nthreads, int *used) {
    double total = 0.0;
    int n = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(+ : total)
#endif
    {
#ifdef _OPENMP
#pragma omp single
        n = omp_get_num_threads();
#endif
#if defined(__AVX512F__)
        __m512 acc[RLX_PEAK_CHAINS];
        const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_set1_ps(1.0f + j);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) total += _mm512_reduce_add_ps(acc[j]);
#elif defined(__FMA__)
        __m256 acc[RLX_PEAK_CHAINS];
        const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm256_set1_ps(1.0f + j);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
        float lanes[8];
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) {
            _mm256_storeu_ps(lanes, acc[j]);
            for (int l = 0; l < 8; l++) total += lanes[l];
        }
#else
        rlx_v4f acc[RLX_PEAK_CHAINS];
        const rlx_v4f a = {0.999999f, 0.999999f, 0.999999f, 0.999999f};
        const rlx_v4f b = {1e-7f, 1e-7f, 1e-7f, 1e-7f};
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) {
            const float s = 1.0f + j;
            acc[j] = (rlx_v4f){s, s, s, s};
        }
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = acc[j] * a + b;
        for (int j = 0; j < RLX_PEAK_CHAINS; j++)
            for (int l = 0; l < 4; l++) total += acc[j][l];
#endif
    }
    *used = n;
    return total;
}

#if defined(__AVX2__)
/* 12 ymm integer chains stepped iters times by the instruction(s) in STEP (AT&T syntax,
 * %[x] the chain, %[b] / %[o] the constants), their lanes summed. Inline assembly: gcc
 * spills intrinsics chains of this kind to the stack every iteration (stores that cap
 * the rate), whatever the source looks like. */
#define RLX_INT_PROBE(NAME, STEP, BVAL)                                                     \
    __attribute__((noinline)) static double NAME(int64_t iters) {                           \
        __m256i x0 = _mm256_set1_epi32(0), x1 = _mm256_set1_epi32(1),                        \
                x2 = _mm256_set1_epi32(2), x3 = _mm256_set1_epi32(3),                        \
                x4 = _mm256_set1_epi32(4), x5 = _mm256_set1_epi32(5),                        \
                x6 = _mm256_set1_epi32(6), x7 = _mm256_set1_epi32(7),                        \
                x8 = _mm256_set1_epi32(8), x9 = _mm256_set1_epi32(9),                        \
                x10 = _mm256_set1_epi32(10), x11 = _mm256_set1_epi32(11);                    \
        const __m256i b = BVAL, one = _mm256_set1_epi16(1);                                  \
        for (int64_t i = 0; i < iters; i++)                                                  \
            __asm__ volatile(STEP("%0") STEP("%1") STEP("%2") STEP("%3") STEP("%4")          \
                             STEP("%5") STEP("%6") STEP("%7") STEP("%8") STEP("%9")          \
                             STEP("%10") STEP("%11")                                         \
                             : "+x"(x0), "+x"(x1), "+x"(x2), "+x"(x3), "+x"(x4), "+x"(x5),   \
                               "+x"(x6), "+x"(x7), "+x"(x8), "+x"(x9), "+x"(x10), "+x"(x11)  \
                             : [b] "x"(b), [o] "x"(one));                                    \
        __m256i s_ = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(x0, x1),              \
                                                       _mm256_add_epi32(x2, x3)),             \
                                      _mm256_add_epi32(_mm256_add_epi32(x4, x5),              \
                                                       _mm256_add_epi32(x6, x7)));            \
        s_ = _mm256_add_epi32(s_, _mm256_add_epi32(_mm256_add_epi32(x8, x9),                  \
                                                   _mm256_add_epi32(x10, x11)));              \
        int32_t lanes_[8];                                                                   \
        _mm256_storeu_si256((__m256i *)lanes_, s_);                                          \
        double total = 0.0;                                                                  \
        for (int l = 0; l < 8; l++) total += lanes_[l];                                      \
        return total;                                                                        \
    }

/* x = madd(maddubs(x, b), ones): as the 7-bit-weight GEMM's chains */
#define RLX_PAIR(x) "vpmaddubsw %[b], " x ", " x "\n\tvpmaddwd %[o], " x ", " x "\n\t"
/* x = madd(x, b) */
#define RLX_MADD(x) "vpmaddwd %[b], " x ", " x "\n\t"
RLX_INT_PROBE(pair_loop, RLX_PAIR, _mm256_set1_epi8(1))
RLX_INT_PROBE(madd_loop, RLX_MADD, _mm256_set1_epi16(1))
#endif

/* Multiply-adds per step of the int8 probe (0: no int8 SIMD on this target). */
int rlx_peak_int8_ops(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 64;
#elif defined(__AVX2__)
    return 32;
#else
    return 0;
#endif
}

/* Multiply-adds per instruction of the bf16 probe (0: no bf16 dot product here). */
int rlx_peak_bf16_ops(void) {
#if defined(__AVX512BF16__)
    return 32;
#else
    return 0;
#endif
}

double rlx_peak_int8_run(int64_t iters, int nthreads, int *used) {
    double total = 0.0;
    int n = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(+ : total)
#endif
    {
#ifdef _OPENMP
#pragma omp single
        n = omp_get_num_threads();
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
        __m512i acc[RLX_PEAK_CHAINS];
        const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_set1_epi32(j);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) total += _mm512_reduce_add_epi32(acc[j]);
#elif defined(__AVX2__)
        total += pair_loop(iters);
#else
        (void)iters;
#endif
    }
    *used = n;
    return total;
}

double rlx_peak_bf16_run(int64_t iters, int nthreads, int *used) {
    double total = 0.0;
    int n = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(+ : total)
#endif
    {
#ifdef _OPENMP
#pragma omp single
        n = omp_get_num_threads();
#endif
#if defined(__AVX512BF16__)
        __m512 acc[RLX_PEAK_CHAINS];
        const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_set1_ps(1.0f + j);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) total += _mm512_reduce_add_ps(acc[j]);
#else
        (void)iters;
#endif
    }
    *used = n;
    return total;
}

/* Multiply-adds per vpmaddwd of the int16 probe (0: no AVX2). */
int rlx_peak_int16_ops(void) {
#if defined(__AVX2__)
    return 16;
#else
    return 0;
#endif
}

double rlx_peak_int16_run(int64_t iters, int nthreads, int *used) {
    double total = 0.0;
    int n = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(+ : total)
#endif
    {
#ifdef _OPENMP
#pragma omp single
        n = omp_get_num_threads();
#endif
#if defined(__AVX2__)
        total += madd_loop(iters);
#else
        (void)iters;
#endif
    }
    *used = n;
    return total;
}
