/* The OpenMP prologue of the kernels whose threads each take a slice of one workspace
 * (attention.c, attention_grad.c, norm_grad.c, conv.c, qgemm_run.c). In: the team asked
 * for, the task count and the floats each thread needs. Out: rlx_tid() / rlx_nthreads()
 * (this thread's number and its team's size; 0 and 1 outside a team or without OpenMP),
 * rlx_ws_team() (the team size a caller-sized workspace allows) and rlx_ws_slice() (this
 * thread's 64-byte aligned slice). The loaders inline this file where it is #included
 * (rlx.backends.cpu.native.csrc_source), so it is part of each library's cache key; the
 * guard keeps one copy when several files of one library include it. */
#ifndef RLX_OMP_WORKSPACE_H
#define RLX_OMP_WORKSPACE_H
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static inline int rlx_tid(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static inline int rlx_nthreads(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* threads clamped to 1..ntask (1 when there is no task); 0 when a workspace of ws_floats
 * cannot give each of them `per` floats (the caller then returns -1) */
static inline int rlx_ws_team(int threads, long ntask, long per, long ws_floats) {
    if (threads < 1) threads = 1;
    if (threads > ntask) threads = (int)(ntask > 0 ? ntask : 1);
    return (long)threads * per > ws_floats ? 0 : threads;
}

/* this thread's `per` floats of ws, the start rounded up to 64 bytes (per counts the
 * 15 floats of slack that rounding needs) */
static inline float *rlx_ws_slice(float *ws, long per) {
    float *w = ws + (long)rlx_tid() * per;
    return (float *)(((uintptr_t)w + 63) & ~(uintptr_t)63);
}
#endif
