/* rlx_omp.c: a minimal OpenMP runtime of rlx's own (a persistent pthread pool) for a
 * compiler that lowers `#pragma omp` but has no runtime library to link: clang without
 * libomp (Apple's clang; clang-14 without libomp-dev). The kernel libraries are built
 * with `-Xclang -fopenmp -I<omp_shim>` (clang's OpenMP lowering and rlx's omp.h, no
 * libomp link), leaving undefined references to the libomp ABI entry points below;
 * this library is loaded first with RTLD_GLOBAL and serves them (native/omp_shim.py).
 *
 * What it implements: exactly what clang emits for the constructs csrc/ and the
 * generated code use: `parallel` with num_threads / if / reduction (__kmpc_fork_call,
 * __kmpc_push_num_threads, __kmpc_serialized_parallel), `for` with schedule(static[,
 * c]) (__kmpc_for_static_init_4/4u/8/8u) or schedule(dynamic, c) (__kmpc_dispatch_*),
 * collapse (the same calls on the collapsed 64-bit count), `single`, `barrier`,
 * `reduction` (__kmpc_reduce[_nowait]: the threads combine one at a time in thread
 * order, so a reduction's result does not depend on which thread finishes first) and
 * the omp_* calls of omp.h (renamed rlx_omp_* there, so that only rlx's libraries bind
 * to them). `atomic` and `simd` need no runtime. The __kmpc_* names are libomp's: a
 * process that also loads a libomp-linked library on Linux after this one would bind
 * that library's __kmpc_* calls here too (it runs correctly, on rlx's pool).
 *
 * Semantics: one team at a time (a `parallel` met while the pool runs another team, or
 * inside a team, runs on its calling thread as a team of one, as libgomp does for nested
 * regions); schedule(static) splits the iterations as libgomp and libomp do (contiguous
 * blocks, the first trip % n threads one iteration more). Idle workers spin RLX_SPIN
 * pause iterations, then sleep on a condition variable. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RLX_MAX_ARGS 64
#define RLX_MAX_THREADS 256
#define RLX_RING 16 /* dispatch buffers and single slots in flight per team */
#define RLX_SPIN 10000

#if defined(__x86_64__) || defined(__i386__)
#define RLX_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define RLX_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define RLX_RELAX() ((void)0)
#endif

typedef void (*rlx_micro)(int32_t *gtid, int32_t *btid, ...);

typedef struct {
    _Atomic int64_t next; /* the next chunk number */
    _Atomic int32_t done; /* threads that found no chunk left */
    _Atomic int64_t tag;  /* the dynamic loop (count within the region) it serves */
} rlx_disp;

typedef struct {
    int nth;
    _Atomic int32_t bar_count, bar_gen;
    _Atomic int64_t reduce_turn;
    _Atomic int64_t single[RLX_RING];
    rlx_disp disp[RLX_RING];
    pthread_mutex_t mu;
    pthread_cond_t cv;
} rlx_team;

typedef struct {
    rlx_team *team; /* NULL: no team (outside a region, or a serialized one) */
    int tid, nth, level, push_nth;
    int64_t singles, reductions, loops; /* constructs met in this region */
    /* the dynamic loop being run */
    int64_t d_lb, d_st, d_chunk, d_trip, d_loop, d_next;
} rlx_thread;

static __thread rlx_thread me = {NULL, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
static __thread rlx_thread saved[16];
static __thread int nsaved;

static struct {
    pthread_mutex_t fork_mu; /* held by the master of the running team */
    pthread_mutex_t mu;      /* workers sleep on cv for a new job */
    pthread_cond_t cv;
    pthread_mutex_t jmu; /* the master sleeps on jcv for the join */
    pthread_cond_t jcv;
    _Atomic uint64_t job; /* (sequence << 16) | team size */
    _Atomic int32_t joined;
    int nworkers;
    rlx_micro fn;
    int argc;
    void *args[RLX_MAX_ARGS];
    rlx_team team;
} P = {.fork_mu = PTHREAD_MUTEX_INITIALIZER,
       .mu = PTHREAD_MUTEX_INITIALIZER,
       .cv = PTHREAD_COND_INITIALIZER,
       .jmu = PTHREAD_MUTEX_INITIALIZER,
       .jcv = PTHREAD_COND_INITIALIZER};

static _Atomic int icv_nthreads; /* nthreads-var; 0 until first read */

static void die(const char *what) {
    fprintf(stderr, "rlx_omp: %s\n", what);
    abort();
}

static int cpu_count(void) {
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int max_threads(void) {
    int n = atomic_load_explicit(&icv_nthreads, memory_order_relaxed);
    if (n > 0) return n;
    const char *e = getenv("OMP_NUM_THREADS");
    n = e ? atoi(e) : 0;
    if (n < 1) n = cpu_count();
    if (n > RLX_MAX_THREADS) n = RLX_MAX_THREADS;
    atomic_store(&icv_nthreads, n);
    return n;
}

/* ---- the omp.h API (renamed rlx_omp_* by rlx's omp.h) ------------------------------- */
int rlx_omp_get_thread_num(void) { return me.tid; }
int rlx_omp_get_num_threads(void) { return me.nth; }
int rlx_omp_get_max_threads(void) { return max_threads(); }
int rlx_omp_get_num_procs(void) { return cpu_count(); }
int rlx_omp_in_parallel(void) { return me.team != NULL; }
void rlx_omp_set_num_threads(int n) {
    if (n >= 1) atomic_store(&icv_nthreads, n > RLX_MAX_THREADS ? RLX_MAX_THREADS : n);
}
/* which runtime serves the kernels (rlx info asks) */
const char *rlx_omp_runtime(void) { return "rlx pool"; }
int rlx_omp_workers(void) { return P.nworkers; }

/* ---- waiting ------------------------------------------------------------------------ */
/* until *word != old: spin, then sleep on cv (the waker changes word under mu) */
static void wait_change32(_Atomic int32_t *word, int32_t old, pthread_mutex_t *mu, pthread_cond_t *cv) {
    for (int i = 0; i < RLX_SPIN; i++) {
        if (atomic_load_explicit(word, memory_order_acquire) != old) return;
        RLX_RELAX();
    }
    pthread_mutex_lock(mu);
    while (atomic_load_explicit(word, memory_order_acquire) == old) pthread_cond_wait(cv, mu);
    pthread_mutex_unlock(mu);
}

static void wait_until64(_Atomic int64_t *word, int64_t want) {
    for (int i = 0; atomic_load_explicit(word, memory_order_acquire) != want; i++) {
        if (i < RLX_SPIN) RLX_RELAX();
        else sched_yield();
    }
}

static void team_barrier(rlx_team *t, int nth) {
    int32_t gen = atomic_load_explicit(&t->bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&t->bar_count, 1, memory_order_acq_rel) + 1 == nth) {
        atomic_store_explicit(&t->bar_count, 0, memory_order_relaxed);
        pthread_mutex_lock(&t->mu);
        atomic_fetch_add_explicit(&t->bar_gen, 1, memory_order_release);
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
    } else {
        wait_change32(&t->bar_gen, gen, &t->mu, &t->cv);
    }
}

/* ---- the pool ------------------------------------------------------------------------ */
/* The outlined region is `void f(int32_t *gtid, int32_t *btid, T1 *v1, ..., Tn *vn)`: it is
 * called through a prototype of 64 pointers, the first argc of them the shared
 * variables' addresses and the rest NULL. Passing more pointer arguments than a function
 * reads is harmless in the x86-64 System V ABI and AAPCS64 (Apple's too: pointers take
 * 8-byte stack slots either way, and the caller pops them); calling it as variadic would
 * not be on Apple arm64, whose variadic arguments all go on the stack. */
typedef void (*rlx_micro64)(int32_t *, int32_t *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *);

static void invoke(rlx_micro fn, int32_t gtid, int32_t tid, int argc, void **args) {
    void *a[RLX_MAX_ARGS] = {0};
    for (int i = 0; i < argc; i++) a[i] = args[i];
    ((rlx_micro64)(void (*)(void))fn)(&gtid, &tid, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], a[38], a[39], a[40], a[41], a[42], a[43], a[44], a[45], a[46], a[47], a[48], a[49], a[50], a[51], a[52], a[53], a[54], a[55], a[56], a[57], a[58], a[59], a[60], a[61], a[62], a[63]);
}

static void enter_team(rlx_team *t, int tid, int nth) {
    rlx_thread z = {t, tid, nth, me.level + 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    me = z;
}

static void *worker(void *arg) {
    uintptr_t v = (uintptr_t)arg;
    int tid = (int)(v & 0xffff);
    uint64_t last = (uint64_t)(v >> 16);
    for (;;) {
        uint64_t job = atomic_load_explicit(&P.job, memory_order_acquire);
        for (int i = 0; job == last && i < RLX_SPIN; i++) {
            RLX_RELAX();
            job = atomic_load_explicit(&P.job, memory_order_acquire);
        }
        if (job == last) {
            pthread_mutex_lock(&P.mu);
            while ((job = atomic_load_explicit(&P.job, memory_order_acquire)) == last)
                pthread_cond_wait(&P.cv, &P.mu);
            pthread_mutex_unlock(&P.mu);
        }
        last = job;
        int nth = (int)(job & 0xffff);
        if (tid >= nth) continue;
        enter_team(&P.team, tid, nth);
        invoke(P.fn, tid, tid, P.argc, P.args);
        rlx_thread z = {NULL, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        me = z;
        if (atomic_fetch_add_explicit(&P.joined, 1, memory_order_acq_rel) + 1 == nth - 1) {
            pthread_mutex_lock(&P.jmu);
            pthread_cond_signal(&P.jcv);
            pthread_mutex_unlock(&P.jmu);
        }
    }
    return NULL;
}

/* start workers 1..n-1 (under fork_mu); returns the team size they allow */
static int grow(int n) {
    while (P.nworkers < n - 1) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        uint64_t job = atomic_load(&P.job);
        uintptr_t arg = (uintptr_t)(P.nworkers + 1) | ((uintptr_t)job << 16);
        int rc = pthread_create(&th, &at, worker, (void *)arg);
        pthread_attr_destroy(&at);
        if (rc != 0) break;
        P.nworkers++;
    }
    return P.nworkers + 1 < n ? P.nworkers + 1 : n;
}

static void after_fork_child(void) {
    /* the child has no workers: start again from none */
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    P.fork_mu = m; P.mu = m; P.jmu = m; P.cv = c; P.jcv = c;
    P.nworkers = 0;
    rlx_thread z = {NULL, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    me = z;
    nsaved = 0;
}

__attribute__((constructor)) static void rlx_omp_init(void) {
    pthread_mutex_init(&P.team.mu, NULL);
    pthread_cond_init(&P.team.cv, NULL);
    pthread_atfork(NULL, NULL, after_fork_child);
}

static void push_serial(void) {
    if (nsaved >= 16) die("parallel regions nested more than 16 deep");
    saved[nsaved++] = me;
    enter_team(NULL, 0, 1);
}

static void pop_serial(void) {
    if (nsaved <= 0) die("__kmpc_end_serialized_parallel without __kmpc_serialized_parallel");
    me = saved[--nsaved];
}

/* ---- the libomp ABI clang calls ---------------------------------------------------- */
typedef struct ident ident_t;
typedef int32_t kmp_critical_name[8];

int32_t __kmpc_global_thread_num(ident_t *loc) { (void)loc; return me.tid; }
int32_t __kmpc_global_num_threads(ident_t *loc) { (void)loc; return me.nth; }
int32_t __kmpc_bound_thread_num(ident_t *loc) { (void)loc; return me.tid; }
int32_t __kmpc_ok_to_fork(ident_t *loc) { (void)loc; return 1; }

void __kmpc_push_num_threads(ident_t *loc, int32_t gtid, int32_t n) {
    (void)loc; (void)gtid;
    me.push_nth = n;
}

void __kmpc_serialized_parallel(ident_t *loc, int32_t gtid) {
    (void)loc; (void)gtid;
    me.push_nth = 0;
    push_serial();
}

void __kmpc_end_serialized_parallel(ident_t *loc, int32_t gtid) {
    (void)loc; (void)gtid;
    pop_serial();
}

static void fork_team(rlx_micro fn, int argc, void **args) {
    int n = me.push_nth > 0 ? me.push_nth : max_threads();
    me.push_nth = 0;
    if (n > RLX_MAX_THREADS) n = RLX_MAX_THREADS;
    if (n <= 1 || me.team != NULL || nsaved > 0 || pthread_mutex_trylock(&P.fork_mu) != 0) {
        push_serial();
        invoke(fn, 0, 0, argc, args);
        pop_serial();
        return;
    }
    n = grow(n);
    rlx_team *t = &P.team;
    t->nth = n;
    atomic_store(&t->bar_count, 0);
    atomic_store(&t->reduce_turn, 0);
    for (int i = 0; i < RLX_RING; i++) {
        atomic_store(&t->single[i], -1);
        atomic_store(&t->disp[i].next, 0);
        atomic_store(&t->disp[i].done, 0);
        atomic_store(&t->disp[i].tag, i);
    }
    P.fn = fn;
    P.argc = argc;
    for (int i = 0; i < argc; i++) P.args[i] = args[i];
    atomic_store(&P.joined, 0);
    uint64_t seq = (atomic_load(&P.job) >> 16) + 1;
    pthread_mutex_lock(&P.mu);
    atomic_store_explicit(&P.job, (seq << 16) | (uint64_t)n, memory_order_release);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    rlx_thread outer = me;
    enter_team(t, 0, n);
    invoke(fn, 0, 0, argc, args);
    me = outer;
    for (int i = 0; i < RLX_SPIN && atomic_load_explicit(&P.joined, memory_order_acquire) < n - 1; i++)
        RLX_RELAX();
    if (atomic_load_explicit(&P.joined, memory_order_acquire) < n - 1) {
        pthread_mutex_lock(&P.jmu);
        while (atomic_load_explicit(&P.joined, memory_order_acquire) < n - 1)
            pthread_cond_wait(&P.jcv, &P.jmu);
        pthread_mutex_unlock(&P.jmu);
    }
    pthread_mutex_unlock(&P.fork_mu);
}

void __kmpc_fork_call(ident_t *loc, int32_t argc, rlx_micro fn, ...) {
    (void)loc;
    if (argc < 0 || argc > RLX_MAX_ARGS) die("a parallel region shares more than 64 variables");
    void *args[RLX_MAX_ARGS];
    va_list ap;
    va_start(ap, fn);
    for (int i = 0; i < argc; i++) args[i] = va_arg(ap, void *);
    va_end(ap);
    fork_team(fn, argc, args);
}

/* clang 17 and later: `parallel if(c)` in one call; args is the one shared-data pointer */
void __kmpc_fork_call_if(ident_t *loc, int32_t argc, rlx_micro fn, int32_t cond, void *args) {
    (void)loc;
    void *a[1] = {args};
    int n = args ? 1 : 0;
    (void)argc;
    if (cond) {
        fork_team(fn, n, a);
    } else {
        me.push_nth = 0;
        push_serial();
        invoke(fn, 0, 0, n, a);
        pop_serial();
    }
}

void __kmpc_barrier(ident_t *loc, int32_t gtid) {
    (void)loc; (void)gtid;
    if (me.team) team_barrier(me.team, me.nth);
}

void __kmpc_flush(ident_t *loc) {
    (void)loc;
    atomic_thread_fence(memory_order_seq_cst);
}

int32_t __kmpc_single(ident_t *loc, int32_t gtid) {
    (void)loc; (void)gtid;
    if (!me.team) return 1;
    int64_t k = me.singles++;
    _Atomic int64_t *slot = &me.team->single[k % RLX_RING];
    int64_t cur = atomic_load_explicit(slot, memory_order_acquire);
    while (cur < k) {
        if (atomic_compare_exchange_weak_explicit(slot, &cur, k, memory_order_acq_rel, memory_order_acquire))
            return 1;
    }
    return 0;
}

void __kmpc_end_single(ident_t *loc, int32_t gtid) { (void)loc; (void)gtid; }

/* reductions: thread t of n combines the r-th reduction of the region at turn r * n + t */
static int32_t reduce_begin(void) {
    if (!me.team) return 1;
    int64_t r = me.reductions++;
    wait_until64(&me.team->reduce_turn, r * me.nth + me.tid);
    return 1;
}

static void reduce_end(void) {
    if (me.team) atomic_fetch_add_explicit(&me.team->reduce_turn, 1, memory_order_acq_rel);
}

int32_t __kmpc_reduce_nowait(ident_t *loc, int32_t gtid, int32_t nvars, size_t size, void *data,
                             void (*fn)(void *, void *), kmp_critical_name *lck) {
    (void)loc; (void)gtid; (void)nvars; (void)size; (void)data; (void)fn; (void)lck;
    return reduce_begin();
}

void __kmpc_end_reduce_nowait(ident_t *loc, int32_t gtid, kmp_critical_name *lck) {
    (void)loc; (void)gtid; (void)lck;
    reduce_end();
}

int32_t __kmpc_reduce(ident_t *loc, int32_t gtid, int32_t nvars, size_t size, void *data,
                      void (*fn)(void *, void *), kmp_critical_name *lck) {
    (void)loc; (void)gtid; (void)nvars; (void)size; (void)data; (void)fn; (void)lck;
    return reduce_begin();
}

void __kmpc_end_reduce(ident_t *loc, int32_t gtid, kmp_critical_name *lck) {
    (void)loc; (void)gtid; (void)lck;
    reduce_end();
    if (me.team) team_barrier(me.team, me.nth);
}

/* ---- worksharing loops ---------------------------------------------------------------- */
enum { SCH_STATIC_CHUNKED = 33, SCH_STATIC = 34, SCH_DYNAMIC = 35, SCH_MASK = 0xffff };

static int64_t trip_count(int64_t lb, int64_t ub, int64_t st) {
    if (st > 0) return ub < lb ? 0 : (ub - lb) / st + 1;
    if (st < 0) return lb < ub ? 0 : (lb - ub) / (-st) + 1;
    die("a worksharing loop with step 0");
    return 0;
}

static void static_init(int32_t sched, int32_t *plast, int64_t *plower, int64_t *pupper,
                        int64_t *pstride, int64_t incr, int64_t chunk) {
    int64_t lb = *plower, ub = *pupper, n = me.nth, t = me.tid;
    int64_t trip = trip_count(lb, ub, incr);
    if (plast) *plast = 0;
    if (trip == 0) { *pstride = incr; return; }
    if (n == 1) {
        if (plast) *plast = 1;
        *pstride = trip * incr;
        return;
    }
    if ((sched & SCH_MASK) == SCH_STATIC_CHUNKED) {
        if (chunk < 1) chunk = 1;
        *plower = lb + t * chunk * incr;
        *pupper = *plower + (chunk - 1) * incr;
        *pstride = chunk * n * incr;
        if (plast) *plast = ((trip - 1) / chunk) % n == t;
        return;
    }
    if ((sched & SCH_MASK) != SCH_STATIC) die("unsupported static schedule");
    int64_t q = trip / n, r = trip % n;
    int64_t first = t * q + (t < r ? t : r), cnt = q + (t < r);
    *pstride = trip * incr;
    if (cnt == 0) {
        *plower = ub + incr;
        *pupper = ub;
        return;
    }
    *plower = lb + first * incr;
    *pupper = *plower + (cnt - 1) * incr;
    if (plast) *plast = first + cnt == trip;
}

#define STATIC_INIT(suffix, T)                                                                 \
    void __kmpc_for_static_init_##suffix(ident_t *loc, int32_t gtid, int32_t sched, int32_t *plast, \
                                         T *plower, T *pupper, T *pstride, T incr, T chunk) { \
        (void)loc; (void)gtid;                                                                 \
        int64_t lo = (int64_t)*plower, hi = (int64_t)*pupper, st = 0;                          \
        static_init(sched, plast, &lo, &hi, &st, (int64_t)incr, (int64_t)chunk);               \
        *plower = (T)lo; *pupper = (T)hi; *pstride = (T)st;                                    \
    }
STATIC_INIT(4, int32_t)
STATIC_INIT(4u, uint32_t)
STATIC_INIT(8, int64_t)
STATIC_INIT(8u, uint64_t)

void __kmpc_for_static_fini(ident_t *loc, int32_t gtid) { (void)loc; (void)gtid; }

static void dispatch_init(int32_t sched, int64_t lb, int64_t ub, int64_t st, int64_t chunk) {
    int s = sched & SCH_MASK;
    if (s != SCH_DYNAMIC && s != SCH_STATIC && s != SCH_STATIC_CHUNKED && s != 36 /* guided */)
        die("unsupported dynamic schedule");
    me.d_lb = lb;
    me.d_st = st;
    me.d_chunk = chunk < 1 ? 1 : chunk;
    me.d_trip = trip_count(lb, ub, st);
    me.d_next = 0;
    me.d_loop = me.loops++;
    if (me.team) wait_until64(&me.team->disp[me.d_loop % RLX_RING].tag, me.d_loop);
}

static int32_t dispatch_next(int32_t *plast, int64_t *plower, int64_t *pupper, int64_t *pstride) {
    int64_t c;
    rlx_disp *b = me.team ? &me.team->disp[me.d_loop % RLX_RING] : NULL;
    if (b) c = atomic_fetch_add_explicit(&b->next, 1, memory_order_relaxed);
    else c = me.d_next++;
    int64_t start = c * me.d_chunk;
    if (start >= me.d_trip) {
        if (b && atomic_fetch_add_explicit(&b->done, 1, memory_order_acq_rel) + 1 == me.nth) {
            atomic_store_explicit(&b->next, 0, memory_order_relaxed);
            atomic_store_explicit(&b->done, 0, memory_order_relaxed);
            atomic_store_explicit(&b->tag, me.d_loop + RLX_RING, memory_order_release);
        }
        return 0;
    }
    int64_t end = start + me.d_chunk < me.d_trip ? start + me.d_chunk : me.d_trip;
    *plower = me.d_lb + start * me.d_st;
    *pupper = me.d_lb + (end - 1) * me.d_st;
    *pstride = me.d_st;
    if (plast) *plast = end == me.d_trip;
    return 1;
}

#define DISPATCH(suffix, T)                                                                    \
    void __kmpc_dispatch_init_##suffix(ident_t *loc, int32_t gtid, int32_t sched, T lb, T ub,  \
                                       T st, T chunk) {                                        \
        (void)loc; (void)gtid;                                                                 \
        dispatch_init(sched, (int64_t)lb, (int64_t)ub, (int64_t)st, (int64_t)chunk);          \
    }                                                                                          \
    int32_t __kmpc_dispatch_next_##suffix(ident_t *loc, int32_t gtid, int32_t *plast,         \
                                          T *plower, T *pupper, T *pstride) {                  \
        (void)loc; (void)gtid;                                                                 \
        int64_t lo, hi, st;                                                                    \
        int32_t more = dispatch_next(plast, &lo, &hi, &st);                                    \
        if (more) { *plower = (T)lo; *pupper = (T)hi; if (pstride) *pstride = (T)st; }         \
        return more;                                                                           \
    }                                                                                          \
    void __kmpc_dispatch_fini_##suffix(ident_t *loc, int32_t gtid) { (void)loc; (void)gtid; }
DISPATCH(4, int32_t)
DISPATCH(4u, uint32_t)
DISPATCH(8, int64_t)
DISPATCH(8u, uint64_t)
