/* Backward of the 2-D max pool (rlx/ops/nn_grad.py MaxPool2dBackward), f32.
 *
 * In: x[planes, H, W] (planes = N * C), the cotangent ct[planes, OH, OW], the window
 * (kh, kw), strides (sh, sw) and the leading padding (ph, pw). Out: dx[planes, H, W]:
 * each window's cotangent added at its first maximum (taps in row-major order, strict
 * ">": the first wins ties, as the NumPy kernel and PyTorch), padding counting as -inf (a
 * window whose maximum is padding adds nothing). One pass over the windows per plane,
 * planes in an OpenMP loop.
 */
#include <math.h>
#include <string.h>

void rlx_maxpool2d_grad_f32(const float *x, const float *ct, float *dx, long planes, long h,
                            long w, long oh, long ow, long kh, long kw, long sh, long sw,
                            long ph, long pw, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (long p = 0; p < planes; p++) {
        const float *xp = x + p * h * w, *cp = ct + p * oh * ow;
        float *dp = dx + p * h * w;
        memset(dp, 0, sizeof(float) * (size_t)(h * w));
        for (long oy = 0; oy < oh; oy++) {
            for (long ox = 0; ox < ow; ox++) {
                long best = -1;
                float bv = -INFINITY;
                int first = 1;
                for (long ky = 0; ky < kh; ky++) {
                    const long iy = oy * sh + ky - ph;
                    for (long kx = 0; kx < kw; kx++) {
                        const long ix = ox * sw + kx - pw;
                        const int inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
                        const float v = inside ? xp[iy * w + ix] : -INFINITY;
                        if (first || v > bv) {
                            bv = v;
                            best = inside ? iy * w + ix : -1;
                            first = 0;
                        }
                    }
                }
                if (best >= 0) dp[best] += cp[oy * ow + ox];
            }
        }
    }
}
