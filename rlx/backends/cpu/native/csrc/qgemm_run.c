/* INT8 GEMM for rlx, part 4 of 4 (after qgemm.c, qgemm_kernels.c and qgemm_epilogue.c):
 * the AMX-INT8 path, the entry points (rlx_qgemm_run, the batched product, row
 * quantization) and the per-tensor f32 -> 8-bit quantizer. */

/* ---- AMX-INT8 (path 2 on a CPU with amx_int8 whose kernel grants the tile state) --------
 * tdpbusd multiplies a 16-row x 64-byte tile of u8 activations (rows straight from a
 * row-major buffer) by a tile of 16 k-quads x 16 columns of s8 weights: in the VNNI packed
 * layout a panel's k-quads are 128 bytes apart and its two 16-column halves 64 bytes apart,
 * so the packed B is read as it is. 32 rows x 32 columns keep 4 int32 accumulator tiles
 * over the whole K; they are stored to a per-thread buffer and go through the same
 * epilogue. Taken when K is a multiple of 64 (rlx_qgemm_has_amx() says whether the CPU and
 * kernel allow it; flag bit 0 of rlx_qgemm_run turns it off, and RLX_NO_AMX, defined by the
 * loader under RLX_AMX=0, compiles it out). Integer sums are exact
 * either way, so results equal the VNNI path's bit for bit. */
#include <stdatomic.h>
#include <time.h>

#include "omp_workspace.h"
#include "late_team.h"
#if RLX_ISA == 2 && defined(__x86_64__) && defined(__linux__) && !defined(RLX_NO_AMX)
#define RLX_AMX_CPUID_EDX ((1u << 24) | (1u << 25)) /* AMX-TILE, AMX-INT8 */
#include "amx.h"

/* tiles: 0, 1 A (rows 0..15, 16..31); 2, 3 B (columns 0..15, 16..31); 4..7 C.
 * ct[32][32] = raw sums of rows (16 or 32) of a (row stride lda bytes) over kq quads. */
__attribute__((target("amx-tile,amx-int8"), noinline)) static void amx_block(
    long rows, long kq, const uint8_t *a, long lda, const int8_t *bpan, int32_t *ct) {
    _tile_zero(4);
    _tile_zero(5);
    if (rows == 32) {
        _tile_zero(6);
        _tile_zero(7);
        for (long q = 0; q < kq; q += 16) {
            _tile_loadd(2, bpan + q * NR * 4, 128);
            _tile_loadd(3, bpan + q * NR * 4 + 64, 128);
            _tile_loadd(0, a + 4 * q, lda);
            _tile_dpbusd(4, 0, 2);
            _tile_dpbusd(5, 0, 3);
            _tile_loadd(1, a + 16 * lda + 4 * q, lda);
            _tile_dpbusd(6, 1, 2);
            _tile_dpbusd(7, 1, 3);
        }
        _tile_stored(6, ct + 16 * 32, 128);
        _tile_stored(7, ct + 16 * 32 + 16, 128);
    } else {
        for (long q = 0; q < kq; q += 16) {
            _tile_loadd(2, bpan + q * NR * 4, 128);
            _tile_loadd(3, bpan + q * NR * 4 + 64, 128);
            _tile_loadd(0, a + 4 * q, lda);
            _tile_dpbusd(4, 0, 2);
            _tile_dpbusd(5, 0, 3);
        }
    }
    _tile_stored(4, ct, 128);
    _tile_stored(5, ct + 16, 128);
}

/* Row m of the row-major AMX activations Ar (zeros past M or for a non-finite row). */
static void amx_prepare(int a_kind, const void *A, long lda, long M, long K, long m,
                        int32_t a_zp, float a_scale, int mode, uint8_t *Ar, float *rs,
                        int32_t *corr, float *fbuf) {
    uint8_t *dst = Ar + m * K;
    rs[m] = 0.0f;
    corr[m] = 0;
    if (m >= M || !prepare_row(a_kind, A, lda, K, m, a_zp, a_scale, mode, dst, KG, fbuf,
                               rs + m, corr + m))
        memset(dst, 0, (size_t)K);
}

/* 32-row blocks b0 .. b1 of Ar times panel j of B, through the epilogue. */
static void amx_panel(long b0, long b1, long j, long M, long N, long K, const uint8_t *Ar,
                      const b_t *Bp, int32_t *ct, const epi_t *e, const float *rs,
                      const int32_t *corr) {
    long nr = N - j * NR < NR ? N - j * NR : NR;
    for (long bi = b0; bi < b1; ++bi) {
        long i0 = bi * 32, rows = M - i0 > 16 ? 32 : 16;
        amx_block(rows, K / 4, Ar + i0 * K, K, (const int8_t *)Bp + j * K * NR, ct);
        long mr = M - i0 < 32 ? M - i0 : 32;
        epilogue_tile(e, ct, 32, i0, mr, j * NR, nr, rs + i0, corr + i0);
    }
}

static int amx_run(long M, long N, long K, int a_kind, const void *A, long lda, int32_t a_zp,
                   float a_scale, int mode, const b_t *Bp, const epi_t *e, float *rs,
                   int32_t *corr, int nthreads) {
    long m32 = round_up(M, 32), nb = (N + NR - 1) / NR;
    uint8_t *Ar = (uint8_t *)aligned_alloc(64, (size_t)(m32 * K) + 64);
    if (!Ar) return -1;
    long mcb = A_BLOCK_BYTES / (32 * K); /* 32-row blocks per M block (A kept in L2) */
    if (mcb < 1) mcb = 1;
    int oom = 0;
    long blocks = m32 / 32;
    /* enough rows: each thread quantizes its own rows and multiplies them by every panel,
     * with no barrier (a descheduled thread on a busy machine then delays nobody);
     * otherwise all rows first, then the panels shared out */
    int rowsplit = nthreads == 1 || blocks >= 2L * nthreads;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        float *fbuf = (float *)malloc((size_t)(K + 16) * sizeof(float));
        int32_t *ct = (int32_t *)aligned_alloc(64, 32 * 32 * sizeof(int32_t));
        int T = rlx_nthreads(), t = rlx_tid();
        if (!fbuf || !ct) {
#pragma omp atomic write
            oom = 1;
        }
        long lo = rowsplit ? blocks * t / T : 0, hi = rowsplit ? blocks * (t + 1) / T : blocks;
        if (!rowsplit) {
#pragma omp barrier
        }
        if (!oom && fbuf && ct) {
            if (rowsplit) {
                for (long m = lo * 32; m < hi * 32; ++m)
                    amx_prepare(a_kind, A, lda, M, K, m, a_zp, a_scale, mode, Ar, rs, corr, fbuf);
            } else {
#pragma omp for schedule(static)
                for (long m = 0; m < m32; ++m)
                    amx_prepare(a_kind, A, lda, M, K, m, a_zp, a_scale, mode, Ar, rs, corr, fbuf);
            }
            amx_config(1);
            for (long b0 = lo; b0 < hi; b0 += mcb) {
                long b1 = b0 + mcb < hi ? b0 + mcb : hi;
                if (rowsplit) {
                    for (long j = 0; j < nb; ++j)
                        amx_panel(b0, b1, j, M, N, K, Ar, Bp, ct, e, rs, corr);
                } else {
#pragma omp for schedule(static)
                    for (long j = 0; j < nb; ++j)
                        amx_panel(b0, b1, j, M, N, K, Ar, Bp, ct, e, rs, corr);
                }
            }
            amx_config(0);
        }
        free(fbuf);
        free(ct);
    }
    free(Ar);
    return oom ? -1 : 0;
}
#else
#define RLX_AMX_BUILD 0
#endif

int rlx_qgemm_has_amx(void) {
#if RLX_AMX_BUILD
    return amx_ok();
#else
    return 0;
#endif
}

/* Row tiles i0 .. i1 of Ap times panel j of Bp (K in slices of kcg groups, sums in acc),
 * through the epilogue. */
static void tile_panel(long i0, long i1, long j, long M, long N, long kp, long kg, long kcg,
                       const void *Ap_, int wide, const b_t *Bp, int32_t *acc, const epi_t *e,
                       const float *rs, const int32_t *corr) {
    const a_t *Ap = (const a_t *)Ap_;
    long nr = N - j * NR < NR ? N - j * NR : NR;
    if (kg == 0) memset(acc, 0, (size_t)((i1 - i0) * MR * NR) * sizeof(int32_t));
    for (long g0 = 0; g0 < kg; g0 += kcg) {
        long g1 = g0 + kcg < kg ? g0 + kcg : kg;
        for (long i = i0; i < i1; ++i) {
            /* element offsets: the same for u8 quads and s16 pairs (kernel b) */
            long ao = i * kp * MR + g0 * MR * KG, bo = j * kp * NR + g0 * NR * KG;
            long mr = M - i * MR < MR ? M - i * MR : MR;
            int32_t *ct = acc + (i - i0) * MR * NR;
#if RLX_ISA == 1
            if (wide)
                ukernel_wide(2 * (g1 - g0), (const int16_t *)Ap_ + ao, (const int16_t *)Bp + bo,
                             ct, mr, g0 == 0);
            else
                ukernel_rows(g1 - g0, Ap + ao, Bp + bo, ct, mr, g0 == 0);
#else
            (void)wide;
            ukernel_rows(g1 - g0, Ap + ao, Bp + bo, ct, mr, g0 == 0);
#endif
            /* the last K slice: the tile's epilogue while its sums are in L1 */
            if (g1 == kg)
                epilogue_tile(e, ct, NR, i * MR, mr, j * NR, nr, rs + i * MR, corr + i * MR);
        }
    }
    if (kg == 0)
        for (long i = i0; i < i1; ++i) {
            long mr = M - i * MR < MR ? M - i * MR : MR;
            epilogue_tile(e, acc + (i - i0) * MR * NR, NR, i * MR, mr, j * NR, nr, rs + i * MR,
                          corr + i * MR);
        }
}

/* The minimum multiply-adds (M * N * K) for a second thread (rlx_qgemm_set_mt_min).
 * Below it the GEMM runs on the calling thread. With few row tiles each thread packs
 * every row itself and takes its share of the column panels (no barrier: a team costs
 * one fork and one join, each core streams its part of the weights), so the second
 * thread pays from a smaller size than the old split (all rows packed, a barrier, the
 * panels shared out; threshold 3.2e7) did. On a busy machine a team waits for its
 * second thread to be scheduled: there one thread is faster at any of these sizes. */
#ifndef QGEMM_MT_MIN
#define QGEMM_MT_MIN 1.0e6
#endif
static double qgemm_mt_min = QGEMM_MT_MIN;

/* Sets the 2-thread threshold (multiply-adds; <= 0 restores the built-in one); returns
 * the previous value. For benchmarks and for tests of the split paths at small sizes. */
double rlx_qgemm_set_mt_min(double v) {
    double old = qgemm_mt_min;
    qgemm_mt_min = v > 0 ? v : QGEMM_MT_MIN;
    return old;
}

/* A late second thread: csrc/late_team.h (the column split's tasks are its panels). */
static rlx_late_team qgemm_late = RLX_LATE_TEAM_INIT;

/* Sets the number of column splits left to run on one thread (tests: a late thread's
 * back-off and its end); returns the previous number. */
int rlx_qgemm_set_solo_calls(int n) { return rlx_late_set_solo(&qgemm_late, n); }

/* The column split for few row tiles: every thread packs row tiles 0 .. mb of A itself
 * (its own copy in Ap + t * ap_bytes, row parameters in rs / corr + t * mb * MR), then
 * claims panels of B one at a time from a shared counter and multiplies them, through
 * the epilogue (a thread that starts late takes fewer panels instead of holding the
 * others up). Every output tile is computed exactly as on one thread, so the result is
 * the same bit for bit. Thread 0's rs / corr are the ones read afterwards. Returns 0,
 * or -1 when out of memory. */
static int run_colsplit(long M, long N, long K, int a_kind, const void *A, long lda,
                        int32_t a_zp, float a_scale, int mode, const b_t *Bp, const epi_t *e,
                        char *Ap, size_t ap_bytes, float *rs, int32_t *corr, long mcb, long kcg,
                        int wide, long esz, int nthreads) {
    long kp = round_up(K, KG), kg = kp / KG;
    long mb = (M + MR - 1) / MR, nb = (N + NR - 1) / NR;
    int oom = 0;
    _Atomic long next = 0; /* the next panel to claim */
    long done_ns = 0, allow_ns = 0; /* the calling thread out of panels; its allowed wait */
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        int t = rlx_tid();
        float *fbuf = (float *)malloc((size_t)(K + 16) * sizeof(float));
        a_t *qbuf = (a_t *)malloc((size_t)(kp + 64) * sizeof(a_t));
        int32_t *acc = (int32_t *)aligned_alloc(64, (size_t)(mcb * MR * NR) * sizeof(int32_t));
        char *ap = Ap + (size_t)t * ap_bytes;
        float *rst = rs + t * mb * MR;
        int32_t *ct = corr + t * mb * MR;
        if (fbuf && qbuf && acc) {
            for (long i = 0; i < mb; ++i)
                prepare_tile(a_kind, A, lda, M, K, i * MR, a_zp, a_scale, mode,
                             ap + i * kp * MR * esz, wide, rst + i * MR, ct + i * MR, fbuf, qbuf);
            long start_ns = t == 0 && nthreads > 1 ? rlx_now_ns() : 0, mine = 0;
            for (long j = atomic_fetch_add(&next, 1); j < nb; j = atomic_fetch_add(&next, 1)) {
                for (long i0 = 0; i0 < mb; i0 += mcb) {
                    long i1 = i0 + mcb < mb ? i0 + mcb : mb;
                    tile_panel(i0, i1, j, M, N, kp, kg, kcg, ap, wide, Bp, acc, e, rst, ct);
                }
                ++mine;
            }
            if (start_ns) {
                done_ns = rlx_now_ns();
                allow_ns = rlx_late_allow(start_ns, done_ns, mine);
            }
        } else {
#pragma omp atomic write
            oom = 1;
        }
        free(fbuf);
        free(qbuf);
        free(acc);
    }
    rlx_late_after(&qgemm_late, done_ns, allow_ns);
    return oom ? -1 : 0;
}

/* The whole operation (see the header). A: int8 / uint8 (a_kind 0 / 1, zero point a_zp,
 * scale a_scale) or f32 / bf16 rows (2 / 3, quantized per row by mode). Outputs: Y (f32,
 * optional) and / or C (int32 acc, optional); row_scale / row_zp (optional, [M]) receive
 * each row's activation scale and zero point. ws: [N] weight scales (needed for Y).
 * flags: bit 0 set = never AMX. Returns 0, or -1 when out of memory. */
int rlx_qgemm_run(long M, long N, long K, int a_kind, const void *A, long lda, int32_t a_zp,
                  float a_scale, int mode, const void *Bp_, const int32_t *colsum,
                  const float *ws, const float *bias, int act, const float *res, long ldr,
                  float *Y, long ldy, int32_t *C, long ldc, float *row_scale, int32_t *row_zp,
                  int nthreads, int flags) {
    const b_t *Bp = (const b_t *)Bp_;
    long kp = round_up(K, KG), kg = kp / KG;
    long mb = (M + MR - 1) / MR, nb = (N + NR - 1) / NR;
    if (M <= 0 || N <= 0) return 0;
    if (nthreads < 1) nthreads = 1;
    double macs = (double)M * (double)N * (double)K;
    /* AMX keeps the old threshold (its split has a barrier; not measured lower) */
    int amx_threads = macs < 3.2e7 ? 1 : nthreads;
    if (macs < qgemm_mt_min) nthreads = 1;
    /* the split: enough row tiles, each thread packs its own rows and multiplies them by
     * every panel; few row tiles but enough panels, the column split (run_colsplit);
     * otherwise all rows first, then the panels shared out */
    int rowsplit = nthreads == 1 || mb >= 4L * nthreads;
    int colsplit = !rowsplit && nb >= 2L * nthreads;
    if (colsplit && rlx_late_go_solo(&qgemm_late)) /* a late second thread lately: one thread */
        nthreads = 1, rowsplit = 1, colsplit = 0;
    int copies = colsplit ? nthreads : 1;
    /* path 1: the vpmaddubsw kernel for 7-bit weights, else s16 activations (see qgemm.c) */
    int wide = RLX_ISA == 1 && !rlx_qgemm_packed_narrow(Bp_, K, N);
    long esz = wide ? (long)sizeof(int16_t) : (long)sizeof(a_t);
    size_t ap_bytes = (size_t)round_up(mb * kp * MR * esz, 64);
    char *Ap = (char *)aligned_alloc(64, ap_bytes ? ap_bytes * (size_t)copies : 64);
    float *rs = (float *)malloc((size_t)(copies * mb * MR) * sizeof(float));
    int32_t *corr = (int32_t *)malloc((size_t)(copies * mb * MR) * sizeof(int32_t));
    if (!Ap || !rs || !corr) {
        free(Ap), free(rs), free(corr);
        return -1;
    }
    epi_t e = {colsum, ws, bias, res, ldr, Y, ldy, C, ldc, act};
#if RLX_AMX_BUILD
    if (!(flags & 1) && K > 0 && K % 64 == 0 && amx_ok()) {
        free(Ap);
        float *rs2 = (float *)malloc((size_t)round_up(M, 32) * sizeof(float));
        int32_t *corr2 = (int32_t *)malloc((size_t)round_up(M, 32) * sizeof(int32_t));
        int rc = rs2 && corr2 ? amx_run(M, N, K, a_kind, A, lda, a_zp, a_scale, mode, Bp, &e,
                                        rs2, corr2, amx_threads)
                              : -1;
        if (rc == 0) {
            int unsigned_a = a_kind == A_U8 || (a_kind >= A_F32 && (mode == 1 || mode == 3));
            for (long m = 0; m < M; ++m) {
                if (row_scale) row_scale[m] = rs2[m];
                if (row_zp) row_zp[m] = corr2[m] - (unsigned_a ? U_SHIFT : S_SHIFT);
            }
        }
        free(rs2), free(corr2), free(rs), free(corr);
        return rc;
    }
#else
    (void)flags, (void)amx_threads;
#endif
    /* cache blocking: M in blocks of mcb row tiles whose packed A (mcb * MR x K) stays in
     * L2 (A_BLOCK_BYTES); for each NR-column panel of B, K in slices of kcg groups whose
     * B slice (KC_BYTES) stays in L1 while every row tile of the block uses it, the tiles'
     * int32 sums kept in a small per-thread buffer; threads share out the panels */
    long mcb = kp > 0 ? A_BLOCK_BYTES / (kp * MR * esz) : mb;
    if (mcb < 1) mcb = 1;
    if (mcb > mb) mcb = mb;
    long kcg = KC_BYTES / (NR * KG * (wide ? (long)sizeof(int16_t) : (long)sizeof(b_t)));
    int oom = 0;

    if (colsplit) {
        oom = run_colsplit(M, N, K, a_kind, A, lda, a_zp, a_scale, mode, Bp, &e, Ap, ap_bytes,
                           rs, corr, mcb, kcg, wide, esz, nthreads) != 0;
    } else {
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
        {
            float *fbuf = (float *)malloc((size_t)(K + 16) * sizeof(float));
            a_t *qbuf = (a_t *)malloc((size_t)(kp + 64) * sizeof(a_t));
            int32_t *acc =
                (int32_t *)aligned_alloc(64, (size_t)(mcb * MR * NR) * sizeof(int32_t));
            int T = rlx_nthreads(), t = rlx_tid();
            int mine = fbuf && qbuf && acc;
            if (!mine) {
#pragma omp atomic write
                oom = 1;
            }
            long lo = rowsplit ? mb * t / T : 0, hi = rowsplit ? mb * (t + 1) / T : mb;
            if (!rowsplit) {
#pragma omp barrier
            }
            if (!oom && mine) {
                if (rowsplit) {
                    for (long i = lo; i < hi; ++i)
                        prepare_tile(a_kind, A, lda, M, K, i * MR, a_zp, a_scale, mode,
                                     Ap + i * kp * MR * esz, wide, rs + i * MR, corr + i * MR,
                                     fbuf, qbuf);
                } else {
#pragma omp for schedule(static)
                    for (long i = 0; i < mb; ++i)
                        prepare_tile(a_kind, A, lda, M, K, i * MR, a_zp, a_scale, mode,
                                     Ap + i * kp * MR * esz, wide, rs + i * MR, corr + i * MR,
                                     fbuf, qbuf);
                }
                for (long i0 = lo; i0 < hi; i0 += mcb) {
                    long i1 = i0 + mcb < hi ? i0 + mcb : hi;
                    if (rowsplit) {
                        for (long j = 0; j < nb; ++j)
                            tile_panel(i0, i1, j, M, N, kp, kg, kcg, Ap, wide, Bp, acc, &e, rs,
                                       corr);
                    } else {
#pragma omp for schedule(static)
                        for (long j = 0; j < nb; ++j)
                            tile_panel(i0, i1, j, M, N, kp, kg, kcg, Ap, wide, Bp, acc, &e, rs,
                                       corr);
                    }
                }
            }
            free(fbuf);
            free(qbuf);
            free(acc);
        }
    }
    if (!oom) {
        int unsigned_a = a_kind == A_U8 || (a_kind >= A_F32 && (mode == 1 || mode == 3));
        for (long m = 0; m < M; ++m) {
            if (row_scale) row_scale[m] = rs[m];
            if (row_zp) row_zp[m] = corr[m] - (unsigned_a ? U_SHIFT : S_SHIFT);
        }
    }
    free(Ap);
    free(rs);
    free(corr);
    return oom ? -1 : 0;
}

/* rlx_qgemm_run's arguments in one block (native/qgemm.py fills a ctypes Structure of the
 * same fields once per bound call: one pointer through ctypes per run instead of 25
 * converted arguments, about 7 us of a 16 x 384 x 384 GEMM's 30). */
typedef struct {
    long M, N, K;
    int a_kind;
    const void *A;
    long lda;
    int32_t a_zp;
    float a_scale;
    int mode;
    const void *Bp;
    const int32_t *colsum;
    const float *ws, *bias;
    int act;
    const float *res;
    long ldr;
    float *Y;
    long ldy;
    int32_t *C;
    long ldc;
    float *row_scale;
    int32_t *row_zp;
    int nthreads, flags;
} qgemm_args_t;

/* rlx_qgemm_run on the arguments in *p. */
int rlx_qgemm_run_args(const void *p_) {
    const qgemm_args_t *p = (const qgemm_args_t *)p_;
    return rlx_qgemm_run(p->M, p->N, p->K, p->a_kind, p->A, p->lda, p->a_zp, p->a_scale,
                         p->mode, p->Bp, p->colsum, p->ws, p->bias, p->act, p->res, p->ldr,
                         p->Y, p->ldy, p->C, p->ldc, p->row_scale, p->row_zp, p->nthreads,
                         p->flags);
}

/* Rows of x (f32, [M, K], row stride ldx) quantized as the dynamic path does (mode 0: s8,
 * 1: u8), without any shift: out (int8 / uint8, row stride ldo), scales[m], zps[m]. A row
 * holding NaN / inf gets q = 0 and scale NaN. Returns 0, or -1 when out of memory. */
int rlx_qgemm_quantize_rows(const float *x, long M, long K, long ldx, int mode, void *out,
                            long ldo, float *scales, int32_t *zps) {
    a_t *tmp = (a_t *)malloc((size_t)(K + 16) * sizeof(a_t));
    if (!tmp) return -1;
    for (long m = 0; m < M; ++m) {
        const float *row = x + m * ldx;
        int32_t zp;
        float scale = row_params(row, K, mode, &zp);
        scales[m] = scale;
        zps[m] = zp;
        if (isnan(scale)) {
            for (long k = 0; k < K; ++k) tmp[k] = 0;
        } else if (mode == 0) { /* shifted as the packed activations are (a_t may be u8) */
            quantize_row(row, K, scale, 0, -128, 127, S_SHIFT, tmp, KG);
        } else {
            quantize_row(row, K, scale, zp, 0, 255, 0, tmp, KG);
        }
        if (mode == 0)
            for (long k = 0; k < K; ++k)
                ((int8_t *)out)[m * ldo + k] = isnan(scale) ? 0 : (int8_t)(tmp[k] - S_SHIFT);
        else
            for (long k = 0; k < K; ++k) ((uint8_t *)out)[m * ldo + k] = (uint8_t)tmp[k];
    }
    free(tmp);
    return 0;
}

/* Batched product of two float operands, both quantized per row at run time:
 * Y[b] = f32((qa - za) @ qbt^T) * (sa[m] * (sb[n] * alpha)) for b < nb, where a[b] is
 * [M, K] (a_kind f32 / bf16, batch stride sab, row stride lda, rows quantized by a_mode)
 * and bt[b] is [N, K] f32 (batch stride sbb, row stride ldb; its rows are b's columns,
 * quantized s8). Batches run in parallel (each GEMM on one thread). Returns 0 or -1. */
int rlx_qbatch_run(long nb, long M, long N, long K, int a_kind, const void *A, long sab,
                   long lda, int a_mode, const float *Bt, long sbb, long ldb, float alpha,
                   float *Y, long syb, long ldy, int nthreads) {
    long es = a_kind == A_BF16 ? 2 : 4;
    int failed = 0;
    if (nthreads < 1) nthreads = 1;
    if (nb < 2 || (double)nb * M * N * K < 4e6) nthreads = 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        int8_t *qb = (int8_t *)malloc((size_t)(N * K) + 64);
        float *sb = (float *)malloc((size_t)N * sizeof(float));
        int32_t *zb = (int32_t *)malloc((size_t)N * sizeof(int32_t));
        int32_t *colsum = (int32_t *)malloc((size_t)N * sizeof(int32_t));
        void *bp = aligned_alloc(64, (size_t)round_up(rlx_qgemm_packed_size(K, N), 64) + 64);
        int ok = qb && sb && zb && colsum && bp;
#pragma omp for schedule(dynamic, 1)
        for (long b = 0; b < nb; ++b) {
            if (!ok || rlx_qgemm_quantize_rows(Bt + b * sbb, N, K, ldb, 0, qb, K, sb, zb) != 0) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            for (long n = 0; n < N; ++n) sb[n] = sb[n] * alpha;
            rlx_qgemm_pack_b_strided(qb, 1, K, K, N, bp, colsum);
            if (rlx_qgemm_run(M, N, K, a_kind, (const char *)A + b * sab * es, lda, 0, 1.0f,
                              a_mode, bp, colsum, sb, NULL, ACT_NONE, NULL, 0, Y + b * syb, ldy,
                              NULL, 0, NULL, NULL, 1, 0) != 0) {
#pragma omp atomic write
                failed = 1;
            }
        }
        free(qb), free(sb), free(zb), free(colsum), free(bp);
    }
    return failed ? -1 : 0;
}

/* C (int32, optional) and/or Y (f32, optional) = (A - a_zp) @ B for int8 A.
 * Y[m, n] = (float)acc * scale[n] + (bias ? bias[n] : 0). Returns 0, or -1 when out of
 * memory. */
int rlx_qgemm(long M, long N, long K, const int8_t *A, long lda, int32_t a_zp,
              const void *Bp_, const int32_t *colsum, int32_t *C, float *Y, long ldc,
              const float *scale, const float *bias, int nthreads) {
    return rlx_qgemm_run(M, N, K, A_S8, A, lda, a_zp, 1.0f, 0, Bp_, colsum, scale, bias,
                         ACT_NONE, NULL, 0, Y, ldc, C, ldc, NULL, NULL, nthreads, 0);
}

/* Per-tensor affine quantization of f32 to 8 bits (int8 or uint8 by [qmin, qmax]):
 * out = clamp(round_half_even(x / scale) + zp, qmin, qmax); NaN maps to zp. The division
 * and rounding match NumPy's np.rint(x / scale) in f32 exactly. */
void rlx_quantize_f32_q8(const float *x, long n, float scale, int32_t zp, int32_t qmin,
                         int32_t qmax, uint8_t *out) {
    const float fz = (float)zp, lo = (float)qmin, hi = (float)qmax;
    for (long i = 0; i < n; ++i) {
        /* round half to even without a libm call (vectorises): adding 2^23 to |v| < 2^23
         * leaves no fraction bits, so the FPU's default rounding mode does the work */
        const float v = x[i] / scale, a = fabsf(v);
        float r = a < 8388608.0f ? copysignf((a + 8388608.0f) - 8388608.0f, v) : v;
        r = r == r ? r + fz : fz; /* NaN -> zero point */
        r = r < lo ? lo : r;       /* plain compares: fminf/fmaxf would be libm calls */
        r = r > hi ? hi : r;
        out[i] = (uint8_t)(int32_t)r;
    }
}
