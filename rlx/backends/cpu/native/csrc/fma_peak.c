/* The f32 FMA peak probe. In: an iteration count and a thread count. Out: a checksum
   (so nothing is optimised away) and how many threads ran.

   Each thread runs `iters` rounds of RLX_PEAK_CHAINS independent multiply-add chains on
   the widest vectors the build target has: AVX-512 (16 f32 lanes, vfmadd on zmm), AVX2 +
   FMA (8 lanes, ymm), otherwise 4-lane GCC vectors (SSE2 on x86-64: a mul and an add, as
   the portable target's own kernels run). 12 chains cover FMA latency x throughput on
   current cores (4-5 cycles x 2 units) and leave registers for the two constants.
   A multiply-add counts 2 FLOPs. */
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__FMA__)
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
