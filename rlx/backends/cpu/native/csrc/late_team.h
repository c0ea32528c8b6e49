/* A late second thread, shared by the int8 column split (qgemm_run.c) and attention
 * (attention.c). When the calling thread, out of tasks, waits at the end of its team more
 * than RLX_LATE_NS plus twice its own mean time per task (the other thread was not
 * scheduled in time, or was preempted in the middle of a task: a busy machine, or another
 * runtime's threads spinning on the other core; a woken thread on an idle core takes
 * ~5-20 us), the next calls run on one thread: RLX_SOLO_MIN of them, doubling with each
 * late team in a row up to RLX_SOLO_MAX, back to RLX_SOLO_MIN after a team on time. One
 * late wake-up costs a few calls on one thread; a machine that stays busy, one wait per
 * RLX_SOLO_MAX calls. The callers' tasks are the same on any team size, so only the time
 * changes: on a busy machine each small call would otherwise wait for a time slice
 * (0.2-0.3 ms under load 5-6 here, against 14-50 us on one thread). */
#ifndef RLX_LATE_TEAM_H
#define RLX_LATE_TEAM_H
#include <stdatomic.h>
#include <time.h>

#define RLX_LATE_NS 40000L
#define RLX_SOLO_MIN 8
#define RLX_SOLO_MAX 256

/* calls left to run on one thread; the count the next late team sets */
typedef struct {
    _Atomic int calls;
    _Atomic int next;
} rlx_late_team;
#define RLX_LATE_TEAM_INIT {0, RLX_SOLO_MIN}

static inline long rlx_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Whether this call takes one thread instead of a team (counts the solo calls down). */
static inline int rlx_late_go_solo(rlx_late_team *t) {
    int left = atomic_load_explicit(&t->calls, memory_order_relaxed);
    while (left > 0)
        if (atomic_compare_exchange_weak(&t->calls, &left, left - 1)) return 1;
    return 0;
}

/* Sets the calls left to run on one thread; returns the previous number (tests). */
static inline int rlx_late_set_solo(rlx_late_team *t, int n) {
    return atomic_exchange(&t->calls, n);
}

/* The calling thread's allowed wait at the team's end: it started at start_ns and ran
 * out of tasks at done_ns after `mine` of them. */
static inline long rlx_late_allow(long start_ns, long done_ns, long mine) {
    return RLX_LATE_NS + 2 * (done_ns - start_ns) / (mine > 0 ? mine : 1);
}

/* After the team joined: a late team (the join came more than allow_ns after done_ns)
 * starts a run of solo calls; a team on time resets the count. done_ns == 0: no team. */
static inline void rlx_late_after(rlx_late_team *t, long done_ns, long allow_ns) {
    if (!done_ns) return;
    if (rlx_now_ns() - done_ns > allow_ns) {
        int n = atomic_load(&t->next);
        atomic_store(&t->calls, n);
        atomic_store(&t->next, n < RLX_SOLO_MAX ? 2 * n : RLX_SOLO_MAX);
    } else {
        atomic_store(&t->next, RLX_SOLO_MIN);
    }
}
#endif
