/* rlx's own omp.h: the OpenMP API calls csrc/ uses, for a compiler without an OpenMP
 * runtime (clang without libomp: Apple's, or clang-14 without libomp-dev). The kernels
 * are compiled with `-Xclang -fopenmp` (clang's OpenMP lowering, calling the libomp
 * ABI: __kmpc_fork_call & co.) and those calls are served by csrc/rlx_omp.c, a pool of
 * rlx's own loaded before any kernel library. See docs/platforms.md, "Threads". */
#ifndef RLX_OMP_SHIM_H
#define RLX_OMP_SHIM_H
/* the calls are renamed rlx_omp_*: the pool is loaded RTLD_GLOBAL, and another library's
 * own omp_get_thread_num & co. (libgomp's, libomp's) must not bind to rlx's */
#define omp_get_thread_num rlx_omp_get_thread_num
#define omp_get_num_threads rlx_omp_get_num_threads
#define omp_get_max_threads rlx_omp_get_max_threads
#define omp_set_num_threads rlx_omp_set_num_threads
#define omp_get_num_procs rlx_omp_get_num_procs
#define omp_in_parallel rlx_omp_in_parallel
#ifdef __cplusplus
extern "C" {
#endif
int omp_get_thread_num(void);
int omp_get_num_threads(void);
int omp_get_max_threads(void);
void omp_set_num_threads(int n);
int omp_get_num_procs(void);
int omp_in_parallel(void);
#ifdef __cplusplus
}
#endif
#endif
