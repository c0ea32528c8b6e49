/* Backward of layer norm and RMS norm over the last axis (rlx/ops/nn_grad.py), f32.
 *
 * In: x[rows, D], gamma[D], the cotangent ct[rows, D], eps, center (1: layer norm, 0: RMS
 * norm). Out: dx[rows, D] = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = ct *
 * gamma (no mean(g) term for RMS norm), or dgamma[D] = sum over rows of ct * xhat.
 *
 * Per row, in f32 as the NumPy kernels: the mean, the (biased) variance of the centred
 * row, rstd = 1 / sqrt(var + eps), then one pass for the two row sums and one for dx.
 * dx runs rows in an OpenMP loop; dgamma sums each thread's rows into its own slice of
 * the workspace ([threads, D]) and adds the slices in thread order (the result does not
 * depend on the scheduling for a given thread count). Loops are plain C that gcc
 * vectorises for the build target (omp simd reductions: -fopenmp).
 */
#include <math.h>
#include "omp_workspace.h"

static inline float row_stats(const float *xr, long D, float eps, int center, float *mean) {
    float m = 0.0f;
    if (center) {
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (long d = 0; d < D; d++) s += xr[d];
        m = s / (float)D;
    }
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (long d = 0; d < D; d++) {
        float c = xr[d] - m;
        v += c * c;
    }
    *mean = m;
    return 1.0f / sqrtf(v / (float)D + eps);
}

void rlx_norm_grad_x_f32(const float *x, const float *gamma, const float *ct, float *dx,
                         long rows, long D, float eps, int center, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * D, *cr = ct + r * D;
        float *o = dx + r * D;
        float m;
        const float rstd = row_stats(xr, D, eps, center, &m);
        float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
        for (long d = 0; d < D; d++) {
            float g = cr[d] * gamma[d];
            sg += g;
            sgx += g * ((xr[d] - m) * rstd);
        }
        const float mg = center ? sg / (float)D : 0.0f, mgx = sgx / (float)D;
#pragma omp simd
        for (long d = 0; d < D; d++) {
            float g = cr[d] * gamma[d];
            o[d] = rstd * (g - mg - (xr[d] - m) * rstd * mgx);
        }
    }
}

/* ws: threads * D floats */
void rlx_norm_grad_gamma_f32(const float *x, const float *ct, float *dgamma, float *ws,
                             long rows, long D, float eps, int center, int threads) {
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int t = rlx_tid(), nt = rlx_nthreads();
        float *acc = ws + (long)t * D;
        for (long d = 0; d < D; d++) acc[d] = 0.0f;
        const long per = (rows + nt - 1) / nt, r0 = t * per;
        const long r1 = r0 + per < rows ? r0 + per : rows;
        for (long r = r0; r < r1; r++) {
            const float *xr = x + r * D, *cr = ct + r * D;
            float m;
            const float rstd = row_stats(xr, D, eps, center, &m);
#pragma omp simd
            for (long d = 0; d < D; d++) acc[d] += cr[d] * ((xr[d] - m) * rstd);
        }
#pragma omp barrier
#pragma omp single
        {
            for (long d = 0; d < D; d++) dgamma[d] = ws[d];
            for (int k = 1; k < nt; k++)
                for (long d = 0; d < D; d++) dgamma[d] += ws[(long)k * D + d];
        }
    }
}
