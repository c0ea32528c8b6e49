/* dqgemm part 4 of 7. Weight-only quantized matmul for rlx:
 * Y[M,N] = X[M,K] @ dequant(W)[N,K]^T, reading the packed weight directly (no f32 copy of
 * the whole weight).
 *
 * W is stored row-major by output channel (row n = the K weights of output n), in one of
 * the layouts of rlx.formats.schemes (codes below): the llama.cpp GGUF blocks (scales inside
 * the bytes: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 with 32 weights per block, Q2_K..Q8_K with 256)
 * or rlx's Int8Block / Int4Block (separate f32 scale and i32 zero point per block) and
 * per-tensor FP8 (a 256-entry byte -> f32 table from the caller).
 *
 * Every block is decoded exactly as ggml-quants.c (and rlx.formats.gguf) decode it, into a
 * small f32 buffer that stays in L1; the products are f32 FMAs (f32 accumulation):
 *
 *   decode (M < 4, a GEMV streaming W once): on AVX2 / AVX-512, every GGUF layout but
 *     Q8_K, and Int8Block and Int4Block, run fused row kernels (dqgemm_rows.c,
 *     dqgemm_rows_gguf.c: bytes widened to i32 lanes and converted, or on AVX-512 looked
 *     up in a per-block table of decoded values, FMA with X, block scales applied to the
 *     block's vector sum, mins times per-block sums of X; at M = 1, Q8_0 takes four rows
 *     per pass sharing the X loads); every other scheme (and the portable target) decodes
 *     a chunk of ~256 weights of the row into an L1 buffer and dots it with each X row
 *     (4 vector accumulators).
 *   small batches (2 <= M <= 16, batched decode; dqgemm_small.c): each weight row is
 *     decoded once, 2048 weights at a time, into an L1 buffer (vector decoders for Q8_0,
 *     Q5_0, Q4_0, Q4_1, Q5_1, Q4_K, Q6_K from M = 2; the others from M = 4) and applied
 *     to all M X rows, 3 weight rows x 8 (AVX-512) / 4 (AVX2) X rows of accumulators.
 *   prefill (M > 16): per chunk of K, the X chunk is copied into a contiguous panel, and
 *     each panel of NB output rows x KC weights is decoded into a transposed f32 tile
 *     [KC][NB] (NB = 2 vectors) for a register-blocked micro-kernel of MR = 6 X rows x NB
 *     columns (12 vector accumulators), accumulating into Y.
 *
 * Interleaved weights (dq_layout.h; rows = R = 4 or 8, GGUF only, dq_t.R): every kernel
 * walks row n from dq_row() in steps of dq_bst(); at M = 1 the GEMV runs one group of R
 * rows at a time (one sequential stream, prefetched as it goes): Q4_0 / Q4_1 / Q5_0 / Q5_1 /
 * Q2_K / Q3_K / Q4_K / Q5_K / Q6_K in one pass sharing each X load (group_rows), Q8_0 four
 * rows per pass; the integer path's 32-weight layouts in dqgemm_q8_group.c.
 *
 * Vectors: AVX-512 (16 lanes, FMA), AVX2 (8 lanes, FMA) or SSE2 (4 lanes, mul + add),
 * chosen by the build target's -march flags (never -march=native). Threads: OpenMP over
 * output rows (decode) or NB-row panels (prefill), num_threads from the caller.
 *
 * The integer path (rlx_dq_gemm_q8, dqgemm_q8.c): for every GGUF layout but Q8_K, X is
 * quantized to int8 per 32 inputs once per call and each 32-input block's product is an
 * integer dot product (VNNI vpdpbusd / AVX2 vpmaddubsw / C), scaled in f32, as llama.cpp
 * decodes; the caller picks it (native/dqgemm.py: RLX_DQ_ACT=auto at batch < 4, or q8).
 *
 * Source: seven files that native/dqgemm.py concatenates in this order: dqgemm_decode.c
 * (vector layer, f16, the packed weight and its exact block decoder), dqgemm_rows.c and
 * dqgemm_rows_gguf.c (the fused decode-dot rows, the interleaved groups and their
 * dispatch), dqgemm.c (GEMV, tiled GEMM, entry points), dqgemm_small.c (the small-batch
 * path), dqgemm_q8.c (the integer path and its entry point), dqgemm_q8_group.c (its
 * interleaved groups).
 */


/* Software prefetch for the GEMV: a row's compute issues few loads, so the out-of-order
 * window alone keeps too few cache misses in flight to stream from DRAM (measured here:
 * 1-2 GB/s without, against 4-5 GB/s for a plain read). Each thread keeps the packed
 * bytes (and Int8/Int4 scales and zero points) PF_AHEAD bytes ahead of the row it reads
 * prefetched; every line is prefetched once. */
#ifndef PF_AHEAD
#define PF_AHEAD 4096
#endif
typedef struct {
    const uint8_t *next; /* first byte not yet prefetched */
    const uint8_t *snext; /* same for the scale / zero-point arrays */
} prefetcher;

static inline void pf_range(const uint8_t **next, const uint8_t *from, const uint8_t *to) {
    const uint8_t *p = *next;
    if (p < from || p > to) p = from; /* first row of this thread */
    for (; p < to; p += 64) __builtin_prefetch(p, 0, 3);
    *next = p;
}

static inline void prefetch_rows(const dq_t *s, prefetcher *pf, long n) {
    /* interleaved: row r of a group reads the whole group, whose first r + 1 rows' worth
     * of bytes (and PF_AHEAD more) are kept prefetched: the group's lines spread over its
     * rows, not issued in one burst */
    const uint8_t *row = dq_row(s, n);
    long r = dq_bst(s, n) > s->bb ? n % s->R : 0;
    pf_range(&pf->next, row, row - r * s->bb + (r + 1) * s->row_bytes + PF_AHEAD);
    if (s->code == S_I8 || s->code == S_I4) {
        long per = s->nb * 4; /* bytes of scale (and of zp) per row */
        const uint8_t *sc = (const uint8_t *)(s->scale + n * s->nb);
        pf_range(&pf->snext, sc, sc + per + PF_AHEAD / 8);
        const uint8_t *zp = (const uint8_t *)(s->zp + n * s->nb);
        for (long o = 0; o < per; o += 64) __builtin_prefetch(zp + o + PF_AHEAD / 8, 0, 3);
    }
}

#if FUSED
/* Rows n0 .. n0 + G - 1 (one unit of the fused GEMV: an interleaved group of R rows, four
 * plain Q8_0 rows at M = 1, or one row) for M X rows. */
static void fused_unit(const dq_t *s, prefetcher *pf, long n0, long G, long M, long K,
                       const float *x, long ldx, const float *px, float *y, long ldy) {
    if (M == 1 && G % 4 == 0 && s->code == S_Q8_0) {
        int inter = s->R > 1;
        for (long r = 0; r < G; r += 4) {
            if (inter) prefetch_rows(s, pf, n0 + r + 3); /* rows 0 .. r + 3 of the group */
            else pf_range(&pf->next, dq_row(s, n0), dq_row(s, n0) + 4 * s->row_bytes + PF_AHEAD);
            rows4_q8_0(dq_row(s, n0 + r), inter ? s->bb : s->row_bytes, dq_bst(s, n0), s->nb, x,
                       y + n0 + r);
        }
        return;
    }
    if (G > 1 && group_ok(s, M)) { /* one pass, prefetching as it goes (dqgemm_rows_gguf.c) */
        group_rows(s, n0, x, px, y + n0);
        return;
    }
    for (long r = 0; r < G; r++) {
        prefetch_rows(s, pf, n0 + r);
        for (long m = 0; m < M; m++)
            y[m * ldy + n0 + r] = fused_row(s, n0 + r, x + m * ldx, px + m * K, K);
    }
}
#elif defined(__aarch64__) && defined(__ARM_NEON) /* dqn_gemv: NEON fused rows */
#define DQ_NEON_PART 6
#include "dqgemm_neon.h"
#undef DQ_NEON_PART
#endif

/* ---- decode: M < 4 ------------------------------------------------------------------ */
static int gemv(const dq_t *s, long M, long N, long K, const float *x, long ldx, float *y,
                long ldy, int threads) {
    long cb = chunk_blocks(s), clen = cb * s->qk;
    int fail = 0;
    (void)K;
    /* grain: waking a second thread costs tens of microseconds (OMP_WAIT_POLICY=PASSIVE),
     * more than streaming a small weight takes, so below ~256 KB per thread fewer run */
    long per = 262144, want = (N * s->row_bytes + per - 1) / per;
    if (want < threads) threads = want < 1 ? 1 : (int)want;
    /* dynamic chunks of ~32 KB of weight: on a shared machine a thread that loses its core
     * leaves its rows to the others instead of holding the barrier */
    long chunk = 32768 / s->row_bytes;
    if (chunk < 1) chunk = 1;
#if FUSED
    if (fused_ok(s)) {
        float *px = alloc_f(M * K + 1);
        if (!px) return 1;
        for (long m = 0; m < M; m++) prep_x(s, x + m * ldx, K, px + m * K);
        /* units of G rows: an interleaved group (R rows, one sequential stream of R * row
         * bytes), or four plain Q8_0 rows at M = 1 sharing the X loads, or one row; the
         * N % G tail rows one by one */
        long G = s->R > 1 ? s->R : (M == 1 && s->code == S_Q8_0 ? 4 : 1);
        long full = N - N % G, units = full / G + (N - full);
        long uchunk = chunk / G < 1 ? 1 : chunk / G;
#pragma omp parallel num_threads(threads)
        {
            prefetcher pf = {0, 0};
#pragma omp for schedule(dynamic, uchunk)
            for (long u = 0; u < units; u++) {
                long n0 = u < full / G ? u * G : full + (u - full / G);
                long g = u < full / G ? G : 1;
                fused_unit(s, &pf, n0, g, M, K, x, ldx, px, y, ldy);
            }
        }
        free(px);
        return 0;
    }
#elif defined(__aarch64__) && defined(__ARM_NEON)
    if (dqn_fused_ok(s)) return dqn_gemv(s, M, N, K, x, ldx, y, ldy, threads, chunk);
#endif
#pragma omp parallel num_threads(threads) reduction(| : fail)
    {
        float *buf = alloc_f(clen);
        if (!buf) fail = 1;
        else {
            prefetcher pf = {0, 0};
#pragma omp for schedule(dynamic, chunk)
            for (long n = 0; n < N; n++) {
                prefetch_rows(s, &pf, n);
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (long b0 = 0; b0 < s->nb; b0 += cb) {
                    long nblk = s->nb - b0 < cb ? s->nb - b0 : cb;
                    decode_blocks(s, n, b0, nblk, buf);
                    for (long m = 0; m < M; m++)
                        acc[m] += dot(buf, x + m * ldx + b0 * s->qk, nblk * s->qk);
                }
                for (long m = 0; m < M; m++) y[m * ldy + n] = acc[m];
            }
            free(buf);
        }
    }
    return fail;
}

/* ---- prefill: M >= 4 ---------------------------------------------------------------- */
/* Y[m0 .. m0+mr, cols) += X[m0 .., k0 .. k0+kc) @ tile[kc][NB] (only ncols columns stored) */
static inline void micro(const float *restrict tile, long kc, const float *x, long ldx,
                         long mr, float *y, long ldy, long ncols, int first) {
    const float *xr[MR];
    for (int i = 0; i < MR; i++) xr[i] = x + (i < mr ? i : 0) * ldx;
    vf a0[MR], a1[MR];
    for (int i = 0; i < MR; i++) a0[i] = a1[i] = VZERO();
    for (long t = 0; t < kc; t++) {
        vf b0 = VLOAD(tile + t * NB), b1 = VLOAD(tile + t * NB + VW);
        for (int i = 0; i < MR; i++) {
            vf a = VSET1(xr[i][t]);
            a0[i] = VFMA(a, b0, a0[i]);
            a1[i] = VFMA(a, b1, a1[i]);
        }
    }
    for (long i = 0; i < mr; i++) {
        float tmp[NB];
        VSTORE(tmp, a0[i]);
        VSTORE(tmp + VW, a1[i]);
        float *yr = y + i * ldy;
        if (first)
            for (long j = 0; j < ncols; j++) yr[j] = tmp[j];
        else
            for (long j = 0; j < ncols; j++) yr[j] += tmp[j];
    }
}

static int gemm_tiled(const dq_t *s, long M, long N, long K, const float *x, long ldx, float *y,
                      long ldy, int threads) {
    long cb = chunk_blocks(s), clen = cb * s->qk;
    long panels = (N + NB - 1) / NB;
    int fail = 0;
    (void)K;
    /* K chunks outermost: the chunk of X is copied once into a contiguous [M][kc] panel
     * (rows a few KB apart instead of K floats) that every weight panel then reuses */
    float *xc = alloc_f(M * clen);
    if (!xc) return 1;
#pragma omp parallel num_threads(threads) reduction(| : fail)
    {
        float *buf = alloc_f(clen);
        float *tile = alloc_f(clen * NB);
        int ok = buf && tile;
        if (!ok) fail = 1;
        for (long b0 = 0; b0 < s->nb; b0 += cb) {
            long nblk = s->nb - b0 < cb ? s->nb - b0 : cb, kc = nblk * s->qk;
#pragma omp for schedule(static)
            for (long m = 0; m < M; m++)
                memcpy(xc + m * kc, x + m * ldx + b0 * s->qk, (size_t)kc * sizeof(float));
#pragma omp for schedule(dynamic, 1)
            for (long p = 0; p < panels; p++) {
                if (!ok) continue;
                long n0 = p * NB, ncols = N - n0 < NB ? N - n0 : NB;
                for (long r = 0; r < NB; r++) {
                    if (r < ncols) {
                        decode_blocks(s, n0 + r, b0, nblk, buf);
                        for (long t = 0; t < kc; t++) tile[t * NB + r] = buf[t];
                    } else {
                        for (long t = 0; t < kc; t++) tile[t * NB + r] = 0.0f;
                    }
                }
                for (long m0 = 0; m0 < M; m0 += MR) {
                    long mr = M - m0 < MR ? M - m0 : MR;
                    micro(tile, kc, xc + m0 * kc, kc, mr, y + m0 * ldy + n0, ldy, ncols, b0 == 0);
                }
            }
        }
        free(buf);
        free(tile);
    }
    free(xc);
    return fail;
}

/* ---- entry points ------------------------------------------------------------------- */
/* the small-batch path (dqgemm_small.c, concatenated after this file) */
static int small_ok(const dq_t *s, long M);
static int gemv_small(const dq_t *s, long M, long N, long K, const float *x, long ldx,
                      float *y, long ldy, int threads);

/* Returns 0 on success, 1 when a scratch buffer could not be allocated, 2 on bad args. */
int rlx_dq_gemm(int code, long qk, long bb, long M, long N, long K, const float *x, long ldx,
                const uint8_t *w, long row_bytes, const float *scale, const int32_t *zp,
                const float *lut, float *y, long ldy, int threads, int R) {
    if (qk <= 0 || K % qk || M < 0 || N < 0 || threads < 1 || !dq_r_ok(code, R)) return 2;
    dq_t s = {code, qk, bb, K / qk, row_bytes, w, scale, zp, lut, N, R};
    if (M == 0 || N == 0) return 0;
    if (K == 0) {
        for (long m = 0; m < M; m++) memset(y + m * ldy, 0, (size_t)N * 4);
        return 0;
    }
    if (small_ok(&s, M)) return gemv_small(&s, M, N, K, x, ldx, y, ldy, threads);
    if (M < 4) return gemv(&s, M, N, K, x, ldx, y, ldy, threads);
    return gemm_tiled(&s, M, N, K, x, ldx, y, ldy, threads);
}

/* Decode rows [n0, n0 + rows) of an [N, K] weight (R rows interleaved) fully into out
 * [rows, K] (tests and the reference path). */
int rlx_dq_decode(int code, long qk, long bb, long K, const uint8_t *w, long row_bytes,
                  const float *scale, const int32_t *zp, const float *lut, long n0, long rows,
                  float *out, long N, int R) {
    if (qk <= 0 || K % qk || !dq_r_ok(code, R)) return 2;
    dq_t s = {code, qk, bb, K / qk, row_bytes, w, scale, zp, lut, N, R};
    for (long r = 0; r < rows; r++) decode_blocks(&s, n0 + r, 0, s.nb, out + r * K);
    return 0;
}

/* Streaming read of n floats on `threads` threads (the bandwidth probe): their sum. */
double rlx_dq_stream_read(const float *a, long n, int threads) {
    double total = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        vf s0 = VZERO(), s1 = VZERO(), s2 = VZERO(), s3 = VZERO();
        long per = 4 * VW;
        long chunks = n / per;
#pragma omp for schedule(static)
        for (long c = 0; c < chunks; c++) {
            const float *p = a + c * per;
            s0 = VADD(s0, VLOAD(p));
            s1 = VADD(s1, VLOAD(p + VW));
            s2 = VADD(s2, VLOAD(p + 2 * VW));
            s3 = VADD(s3, VLOAD(p + 3 * VW));
        }
        total += (double)vhsum(VADD(VADD(s0, s1), VADD(s2, s3)));
    }
    for (long j = n / (4 * VW) * 4 * VW; j < n; j++) total += a[j];
    return total;
}

int rlx_dq_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int rlx_dq_lanes(void) { return VW; }

/* 1 when scheme `code` (with block size qk) has a fused decode-dot row kernel here */
int rlx_dq_fused(int code, long qk) {
#if FUSED
    dq_t s = {code, qk, 0, 0, 0, 0, 0, 0, 0};
    return fused_ok(&s);
#else
    (void)code;
    (void)qk;
    return 0;
#endif
}
