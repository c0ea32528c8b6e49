/* One-pass Adam / AdamW update in place (rlx/ops/state.py ``adam_update``), f32 and f64.
 *
 * In: p[n], g[n], m[n], v[n] (p, m, v are written in place), n, and the scalars of this
 * step already rounded to the element type: keep (1 - lr * weight_decay, AdamW), wd (Adam's
 * L2 factor), omb1 (1 - beta1), b2, omb2 (1 - beta2), bc2s (sqrt(1 - beta2**t)), eps and
 * step_size (lr / (1 - beta1**t)); decoupled selects keep (1) or wd (0). Out: per element,
 * in torch.optim's order of operations (and rlx.train.optim's graph, bit for bit: built
 * with -ffp-contract=off, no fast-math):
 *   p' = decoupled ? p * keep : p;   g' = decoupled || wd == 0 ? g : g + p * wd
 *   m  = m + (g' - m) * omb1;        v = v * b2 + (g' * g') * omb2
 *   p  = p' - (m / (sqrt(v) / bc2s + eps)) * step_size
 * One read of p, g, m, v and one write of p, m, v per element: memory-bound, OpenMP over
 * static chunks of the elements, loops vectorised by gcc for the build target.
 */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define RLX_ADAM(NAME, T, SQRT)                                                            \
    void NAME(T *p, const T *g, T *m, T *v, long n, T keep, T wd, T omb1, T b2, T omb2,    \
              T bc2s, T eps, T step_size, int decoupled, int threads) {                    \
        _Pragma("omp parallel for simd schedule(static) num_threads(threads) if (threads > 1)") \
        for (long i = 0; i < n; i++) {                                                     \
            T pv = p[i], gv = g[i];                                                        \
            if (decoupled) {                                                               \
                pv = pv * keep;                                                            \
            } else if (wd != (T)0) {                                                       \
                gv = gv + pv * wd;                                                         \
            }                                                                              \
            T mv = m[i] + (gv - m[i]) * omb1;                                              \
            T vv = v[i] * b2 + (gv * gv) * omb2;                                           \
            m[i] = mv;                                                                     \
            v[i] = vv;                                                                     \
            p[i] = pv - (mv / (SQRT(vv) / bc2s + eps)) * step_size;                        \
        }                                                                                  \
    }

/* The entry points, declared for their readers (native/bindings.py types them from these
 * prototypes; gcc checks them against the macro's definitions). */
void rlx_adam_update_f32(float *p, const float *g, float *m, float *v, long n, float keep,
                         float wd, float omb1, float b2, float omb2, float bc2s, float eps,
                         float step_size, int decoupled, int threads);
void rlx_adam_update_f64(double *p, const double *g, double *m, double *v, long n,
                         double keep, double wd, double omb1, double b2, double omb2,
                         double bc2s, double eps, double step_size, int decoupled, int threads);

RLX_ADAM(rlx_adam_update_f32, float, sqrtf)
RLX_ADAM(rlx_adam_update_f64, double, sqrt)
