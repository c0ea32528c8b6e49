/* bf16 GEMM for rlx: C[M,N] = A[M,K] @ B[K,N], bf16 inputs, f32 accumulation.
 *
 * Compiled appended to lowp_cast.c (one library; it reuses bf16_from_bits for the bf16
 * output rounding, the same round-to-nearest-even as the Cast kernel and ml_dtypes).
 *
 * A: bf16 row-major with row stride lda; packed per call (in parallel) into blocks of
 *    MR rows whose 32-bit pairs A[i, 2p..2p+1] sit side by side for each k pair p.
 * B: packed by rlx_bf16_pack_b into panels of NR = 32 columns; in a panel, k pair p holds
 *    the 32 columns' (B[2p, j], B[2p+1, j]) side by side (64 bf16 = two zmm), the layout
 *    vdpbf16ps multiplies against a broadcast A pair. K is padded to even and N to a
 *    multiple of 32 with zeros.
 * C: f32 (c_bf16 = 0) or bf16 rounded once from the f32 accumulator (c_bf16 = 1), row
 *    stride ldc; the ragged last panel is stored with a lane mask.
 *
 * Microkernel: MR = 8 rows x 32 columns in 16 zmm accumulators, over a K block of 256.
 * Cache blocking: a (row block of MC = 256 rows, panel) tile runs its K blocks in turn,
 * each over all its row groups, so the panel's K-block slice (16 KiB) stays in L1 and the
 * A block in L2; partial sums live in a per-thread f32 tile buffer (MC x 32), rounded
 * (bf16) or copied (f32) to C once at the end. Tiles are split over OpenMP threads.
 * Needs AVX512_BF16 at compile time (rlx_lowp_has_dpbf16() says whether it is in); the
 * caller checks the CPU flag before calling rlx_bf16_gemm. On aarch64 with the BF16
 * extension (the i8mm target) a BFDOT micro-kernel on the same packed B runs instead
 * (csrc/lowp_neon.h).
 * AMX: on a CPU with amx_bf16 (CPUID, and the kernel grants the tile state), rows
 * [0, M rounded down to 16) of a GEMM whose K is a multiple of 32 run on AMX tiles
 * (below; about 10x the vdpbf16ps kernel where that instruction runs at half the f32 FMA
 * rate); rlx_bf16_has_amx() says whether it is used.
 * rlx_bf16_gemm_ep: the same with a bf16 output epilogue (bias, activation table) applied
 * at the write-out, rounding where the reference rounds (struct gemm_ep).
 */

#define G_MR 8
#define G_NR 32

int rlx_lowp_has_dpbf16(void) {
#if (defined(__AVX512BF16__) && RLX_HAVE_512) || (RLX_HAVE_NEON && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC))
    return 1;
#else
    return 0;
#endif
}

long rlx_bf16_packed_size(long k, long n) {
    /* elements (bf16) of the packed B */
    return ((n + G_NR - 1) / G_NR) * ((k + 1) / 2) * (2 * G_NR);
}

void rlx_bf16_pack_b(const uint16_t *b, long ldb, long k, long n, uint16_t *out, int threads) {
    long npan = (n + G_NR - 1) / G_NR, kp = (k + 1) / 2;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && k * n >= (1L << 15))
    for (long p = 0; p < npan; p++) {
        long j0 = p * G_NR;
        uint16_t *dst = out + p * kp * 2 * G_NR;
        int full = j0 + G_NR <= n;
        (void)full;
        for (long q = 0; q < kp; q++) {
            const uint16_t *r0 = b + (2 * q) * ldb + j0;
            const uint16_t *r1 = r0 + ldb;
            int has1 = 2 * q + 1 < k;
            uint16_t *d = dst + q * 2 * G_NR;
#if RLX_HAVE_512
            if (full && has1) {
                const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                                    39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
                const __m512i hi = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
                                                    55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
                __m512i x0 = _mm512_loadu_si512((const void *)r0), x1 = _mm512_loadu_si512((const void *)r1);
                _mm512_storeu_si512((void *)d, _mm512_permutex2var_epi16(x0, lo, x1));
                _mm512_storeu_si512((void *)(d + G_NR), _mm512_permutex2var_epi16(x0, hi, x1));
                continue;
            }
#endif
            for (long j = 0; j < G_NR; j++) {
                int in = j0 + j < n;
                d[2 * j] = in ? r0[j] : 0;
                d[2 * j + 1] = (in && has1) ? r1[j] : 0;
            }
        }
    }
}

#if defined(__AVX512BF16__) && RLX_HAVE_512

/* f32 -> bf16 bits (in the low half of each 32-bit lane): round to nearest even, NaN ->
 * the canonical quiet NaN with the input's sign (bf16_from_bits / ml_dtypes) */
static inline __m512i round_bf16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i nv = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)),
                                 _mm512_set1_epi32(0x7fc0));
    return _mm512_mask_blend_epi32(nan, r, nv);
}

/* bf16 output epilogue (rlx_bf16_gemm_ep), each step rounding to bf16 as the reference:
 * bias: f32 [N] added to the rounded product; lut: 65537 uint16 codes (the activation of
 * every bf16 code, one pad entry so a 32-bit gather at the last code stays inside) */
struct gemm_ep {
    const float *bias;
    const uint16_t *lut;
};

/* 16 lanes of row accumulators to C at column j (lanes in m): f32, or bf16 through the
 * epilogue */
static inline void store_row(__m512 v, void *c, long j, int c_bf16, __mmask16 m, const struct gemm_ep *ep) {
    if (c_bf16) {
        __m512i r = round_bf16(v);
        if (ep->bias) {
            __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
            r = round_bf16(_mm512_add_ps(f, _mm512_maskz_loadu_ps(m, ep->bias + j)));
        }
        if (ep->lut)
            r = _mm512_and_si512(_mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, r, (const void *)ep->lut, 2),
                                 _mm512_set1_epi32(0xffff));
        _mm256_mask_storeu_epi16((uint16_t *)c + j, m, _mm512_cvtepi32_epi16(r));
    } else {
        _mm512_mask_storeu_ps((float *)c + j, m, v);
    }
}

/* A packed per call into blocks of G_MR rows: Ap[row block][k pair][G_MR] (32-bit pairs,
 * rows past M and the odd K's high half zero), so the microkernel's broadcasts come from
 * one cache line per k pair instead of G_MR rows a full row stride apart. */
static void pack_a(const uint16_t *a, long lda, long m, long k, uint32_t *ap, long rb0, long rb1) {
    long kp = (k + 1) / 2, kfull = k / 2;
    for (long rb = rb0; rb < rb1; rb++) {
        uint32_t *dst = ap + rb * kp * G_MR;
        for (int i = 0; i < G_MR; i++) {
            long row = rb * G_MR + i;
            if (row >= m) {
                for (long q = 0; q < kp; q++) dst[q * G_MR + i] = 0;
                continue;
            }
            const uint16_t *src = a + row * lda;
            for (long q = 0; q < kfull; q++) {
                uint32_t v;
                memcpy(&v, src + 2 * q, 4);
                dst[q * G_MR + i] = v;
            }
            if (k & 1) dst[kfull * G_MR + i] = (uint32_t)src[k - 1];
        }
    }
}

/* one MR x NR tile over kp k pairs, accumulated into the f32 tile buffer ct (row stride
 * G_NR; first: start from zero) */
static inline void ukernel(long kp, const uint32_t *ap, const uint16_t *bp, float *ct, int first) {
    __m512 acc0[G_MR], acc1[G_MR];
#pragma GCC unroll 8
    for (int i = 0; i < G_MR; i++) {
        acc0[i] = first ? _mm512_setzero_ps() : _mm512_load_ps(ct + i * G_NR);
        acc1[i] = first ? _mm512_setzero_ps() : _mm512_load_ps(ct + i * G_NR + 16);
    }
    for (long q = 0; q < kp; q++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)(bp + q * 2 * G_NR));
        __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(bp + q * 2 * G_NR + G_NR));
        const uint32_t *aq = ap + q * G_MR;
#pragma GCC unroll 8
        for (int i = 0; i < G_MR; i++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)aq[i]);
            acc0[i] = _mm512_dpbf16_ps(acc0[i], av, b0);
            acc1[i] = _mm512_dpbf16_ps(acc1[i], av, b1);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < G_MR; i++) {
        _mm512_store_ps(ct + i * G_NR, acc0[i]);
        _mm512_store_ps(ct + i * G_NR + 16, acc1[i]);
    }
}

#define G_KCP 128  /* k pairs per K block: the B slice (16 KiB) stays in L1 */
#define G_MC 256   /* rows per block of A (256 x 256 bf16 = 128 KiB per K block, in L2) */

static int dp_gemm(long m, long n, long k, const uint16_t *a, long lda, const uint16_t *bp, void *c, long ldc,
                   int c_bf16, int threads, const struct gemm_ep *ep) {
    long npan = (n + G_NR - 1) / G_NR, kp = (k + 1) / 2, kp2 = kp * 2 * G_NR;
    long nrb = (m + G_MR - 1) / G_MR;
    uint32_t *ap = aligned_alloc(64, ((size_t)(nrb * kp * G_MR * 4) + 63) & ~(size_t)63);
    if (ap == NULL) return -2;
    long mc = G_MC < nrb * G_MR ? G_MC : nrb * G_MR;
    long nmb = (m + mc - 1) / mc;
    long tiles = nmb * npan;
    int par = threads > 1 && tiles > 1, failed = 0;
    (void)par; /* used by the OpenMP pragma only */
#pragma omp parallel num_threads(threads) if (par)
    {
        float *ct = aligned_alloc(64, (size_t)mc * G_NR * 4);
#pragma omp for schedule(static)
        for (long rb = 0; rb < nrb; rb++) pack_a(a, lda, m, k, ap, rb, rb + 1);
        if (ct == NULL) {
#pragma omp atomic write
            failed = 1;
        } else {
#pragma omp for schedule(dynamic, 1)
            for (long t = 0; t < tiles; t++) {
                long ib = t / npan, p = t % npan;
                long j0 = p * G_NR, left = n - j0;
                __mmask16 m0 = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
                __mmask16 m1 = left >= 32 ? 0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
                long r0 = ib * mc, r1 = (ib + 1) * mc < m ? (ib + 1) * mc : m;
                if (kp == 0) memset(ct, 0, (size_t)mc * G_NR * 4);
                for (long q0 = 0; q0 < kp; q0 += G_KCP) {
                    long nq = kp - q0 < G_KCP ? kp - q0 : G_KCP;
                    for (long i0 = r0; i0 < r1; i0 += G_MR)
                        ukernel(nq, ap + (i0 / G_MR) * kp * G_MR + q0 * G_MR, bp + p * kp2 + q0 * 2 * G_NR,
                                ct + (i0 - r0) * G_NR, q0 == 0);
                }
                for (long i = r0; i < r1; i++) {
                    void *cc = c_bf16 ? (void *)((uint16_t *)c + i * ldc) : (void *)((float *)c + i * ldc);
                    store_row(_mm512_load_ps(ct + (i - r0) * G_NR), cc, j0, c_bf16, m0, ep);
                    store_row(_mm512_load_ps(ct + (i - r0) * G_NR + 16), cc, j0 + 16, c_bf16, m1, ep);
                }
            }
            free(ct);
        }
    }
    free(ap);
    return failed ? -2 : 0;
}

/* ---- AMX-BF16 path ------------------------------------------------------------------------
 * tdpbf16ps multiplies a 16 x 32 bf16 tile of A (rows straight from A, row stride lda) by a
 * 16 k-pair x 16 column tile of B in the pair layout above: a panel's k pairs are 128 bytes
 * apart and its two 16-column halves 64 bytes apart, so the packed B is read as it is.
 * A tile of 32 rows x 32 columns keeps 4 f32 accumulator tiles over the whole K; they are
 * stored to a per-thread f32 buffer and written out (bf16 rounding as store_row). Taken for
 * rows [0, M rounded down to 16) when K is a multiple of 32 and the CPU and kernel grant
 * AMX; the other rows go through the vdpbf16ps kernel (which rows take which path does not
 * depend on the thread count, so results do not either). */
#if defined(__x86_64__) && defined(__linux__) && !defined(RLX_NO_AMX) /* RLX_AMX=0 */
#define RLX_AMX_CPUID_EDX ((1u << 22) | (1u << 24)) /* AMX-BF16, AMX-TILE */
#include "amx.h"
#else
#define RLX_AMX_BUILD 0
#endif

#if RLX_AMX_BUILD
/* tiles: 0, 1 A (rows i..i+15, i+16..i+31); 2, 3 B (columns 0..15, 16..31); 4..7 C */
__attribute__((target("amx-tile,amx-bf16"), noinline)) static void amx_block(
    long rows, long kp, const uint16_t *a, long lda, const uint16_t *bpan, float *ct) {
    long sa = lda * 2;
    _tile_zero(4);
    _tile_zero(5);
    if (rows == 32) {
        _tile_zero(6);
        _tile_zero(7);
        for (long q = 0; q < kp; q += 16) {
            _tile_loadd(2, bpan + q * 2 * G_NR, 128);
            _tile_loadd(3, bpan + q * 2 * G_NR + G_NR, 128);
            _tile_loadd(0, a + 2 * q, sa);
            _tile_dpbf16ps(4, 0, 2);
            _tile_dpbf16ps(5, 0, 3);
            _tile_loadd(1, a + 16 * lda + 2 * q, sa);
            _tile_dpbf16ps(6, 1, 2);
            _tile_dpbf16ps(7, 1, 3);
        }
        _tile_stored(6, ct + 16 * G_NR, 128);
        _tile_stored(7, ct + 16 * G_NR + 16, 128);
    } else {
        for (long q = 0; q < kp; q += 16) {
            _tile_loadd(2, bpan + q * 2 * G_NR, 128);
            _tile_loadd(3, bpan + q * 2 * G_NR + G_NR, 128);
            _tile_loadd(0, a + 2 * q, sa);
            _tile_dpbf16ps(4, 0, 2);
            _tile_dpbf16ps(5, 0, 3);
        }
    }
    _tile_stored(4, ct, 128);
    _tile_stored(5, ct + 16, 128);
}

#define A_MC 256 /* rows per tile of work: its A rows (256 x K bf16) stay in L2 */

static int amx_gemm(long m, long n, long k, const uint16_t *a, long lda, const uint16_t *bp, void *c, long ldc,
                    int c_bf16, int threads, const struct gemm_ep *ep) {
    long npan = (n + G_NR - 1) / G_NR, kp = k / 2, kp2 = kp * 2 * G_NR;
    long nmb = (m + A_MC - 1) / A_MC, tiles = nmb * npan;
    int par = threads > 1 && tiles > 1, failed = 0;
    (void)par;
#pragma omp parallel num_threads(threads) if (par)
    {
        float *ct = aligned_alloc(64, 32 * G_NR * 4);
        if (ct == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        if (ct != NULL) amx_config(1);
#pragma omp for schedule(dynamic, 1)
        for (long t = 0; t < tiles; t++) {
            if (ct == NULL) continue;
            long ib = t / npan, p = t % npan;
            long j0 = p * G_NR, left = n - j0;
            __mmask16 m0 = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            __mmask16 m1 = left >= 32 ? 0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
            long r1 = (ib + 1) * A_MC < m ? (ib + 1) * A_MC : m;
            for (long i0 = ib * A_MC; i0 < r1; i0 += 32) {
                long rows = r1 - i0 >= 32 ? 32 : 16;
                amx_block(rows, kp, a + i0 * lda, lda, bp + p * kp2, ct);
                for (long i = 0; i < rows; i++) {
                    void *cc = c_bf16 ? (void *)((uint16_t *)c + (i0 + i) * ldc) : (void *)((float *)c + (i0 + i) * ldc);
                    store_row(_mm512_load_ps(ct + i * G_NR), cc, j0, c_bf16, m0, ep);
                    store_row(_mm512_load_ps(ct + i * G_NR + 16), cc, j0 + 16, c_bf16, m1, ep);
                }
            }
        }
        if (ct != NULL) {
            amx_config(0);
            free(ct);
        }
    }
    return failed ? -2 : 0;
}
#endif

int rlx_bf16_gemm_ep(long m, long n, long k, const uint16_t *a, long lda, const uint16_t *bp, void *c, long ldc,
                     int c_bf16, int threads, const float *bias, const uint16_t *lut) {
    struct gemm_ep ep = {c_bf16 ? bias : NULL, c_bf16 ? lut : NULL};
#if RLX_AMX_BUILD
    long m16 = m & ~15L;
    if (m16 > 0 && k > 0 && k % 32 == 0 && amx_ok()) {
        int rc = amx_gemm(m16, n, k, a, lda, bp, c, ldc, c_bf16, threads, &ep);
        if (rc != 0 || m16 == m) return rc;
        size_t es = c_bf16 ? 2 : 4;
        return dp_gemm(m - m16, n, k, a + m16 * lda, lda, bp, (char *)c + (size_t)(m16 * ldc) * es, ldc, c_bf16,
                       threads, &ep);
    }
#endif
    return dp_gemm(m, n, k, a, lda, bp, c, ldc, c_bf16, threads, &ep);
}

int rlx_bf16_gemm(long m, long n, long k, const uint16_t *a, long lda, const uint16_t *bp, void *c, long ldc,
                  int c_bf16, int threads) {
    return rlx_bf16_gemm_ep(m, n, k, a, lda, bp, c, ldc, c_bf16, threads, NULL, NULL);
}

int rlx_bf16_has_amx(void) {
#if RLX_AMX_BUILD
    return amx_ok();
#else
    return 0;
#endif
}

#elif RLX_HAVE_NEON && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
/* aarch64 with BF16 (the i8mm target): BFDOT micro-kernel, csrc/lowp_neon.h */
#include "lowp_neon.h"

int rlx_bf16_gemm_ep(long m, long n, long k, const uint16_t *a, long lda, const uint16_t *bp, void *c, long ldc,
                     int c_bf16, int threads, const float *bias, const uint16_t *lut) {
    struct gemm_ep ep = {c_bf16 ? bias : NULL, c_bf16 ? lut : NULL};
    return nb_gemm(m, n, k, a, lda, bp, c, ldc, c_bf16, threads, &ep);
}

int rlx_bf16_gemm(long m, long n, long k, const uint16_t *a, long lda, const uint16_t *bp, void *c, long ldc,
                  int c_bf16, int threads) {
    return rlx_bf16_gemm_ep(m, n, k, a, lda, bp, c, ldc, c_bf16, threads, NULL, NULL);
}

int rlx_bf16_has_amx(void) { return 0; }
#else

int rlx_bf16_gemm(long m, long n, long k, const uint16_t *a, long lda, const uint16_t *bp, void *c, long ldc,
                  int c_bf16, int threads) {
    (void)m; (void)n; (void)k; (void)a; (void)lda; (void)bp; (void)c; (void)ldc; (void)c_bf16; (void)threads;
    return -1; /* compiled without AVX512_BF16 */
}

int rlx_bf16_gemm_ep(long m, long n, long k, const uint16_t *a, long lda, const uint16_t *bp, void *c, long ldc,
                     int c_bf16, int threads, const float *bias, const uint16_t *lut) {
    (void)bias; (void)lut;
    return rlx_bf16_gemm(m, n, k, a, lda, bp, c, ldc, c_bf16, threads);
}

int rlx_bf16_has_amx(void) { return 0; }

#endif
