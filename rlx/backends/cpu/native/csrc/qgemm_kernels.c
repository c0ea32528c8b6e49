/* INT8 GEMM for rlx, part 2 of 4 (native/qgemm.py joins qgemm.c, qgemm_kernels.c,
 * qgemm_epilogue.c and qgemm_run.c into one translation unit, in that order): the
 * micro-kernels. Each computes ct[R][NR] (+)= raw sums over kg groups of packed k for the
 * first R rows of a packed A tile (R = MR, or fewer for a last row tile that short: no work
 * on zero rows); `zero` set: the sums start from 0 (the first K slice: no memset of the
 * tile, no load of it), else they add to ct. */

#if RLX_ISA == 2
/* vpdpbusd through inline assembly: with the intrinsic, gcc 12 folds the two B vectors of
 * a k group into every vpdpbusd as a memory operand (24 zmm loads per k group instead of
 * 2, next to the 12 broadcasts); here they stay in registers. */
static inline __m512i dpbusd(__m512i c, __m512i a, __m512i b) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
    return c;
}

/* B (both cache lines of a k group's 128 bytes) prefetched VNNI_PFB bytes ahead into L2
 * (the next panel's start at a panel's end: panels are contiguous). The 36 int8 GEMMs of
 * the 1x16 MiniLM forward (10.6 MB of weights), sum of per-call minima, one process: 1.90
 * ms without, 1.86 at 1 KB into L1, 1.72-1.75 at 8 KB and 1.73 at 16 KB into L2, 1.81 at
 * 32 KB (Zen 4, load ~12). */
#ifndef VNNI_PFB
#define VNNI_PFB 8192
#endif
#ifndef VNNI_PFH
#define VNNI_PFH _MM_HINT_T1
#endif
#define VNNI_PREFETCH(p)                                                   \
    do {                                                                   \
        if (VNNI_PFB) {                                                    \
            _mm_prefetch((const char *)(p) + VNNI_PFB, VNNI_PFH);          \
            _mm_prefetch((const char *)(p) + VNNI_PFB + 64, VNNI_PFH);     \
        }                                                                  \
    } while (0)

/* R rows x 32 columns: 2R zmm accumulators, the two B vectors of a k group in registers,
 * A broadcast as one 4-byte group per row (R = 12: 24 + 2 + 1 of the 32 zmm) */
#define VNNI_UKERNEL(NAME, R)                                                         \
    static void NAME(long kg, const a_t *ap, const b_t *bp, int32_t *ct, int zero) {  \
        __m512i c0[R], c1[R];                                                         \
        _Pragma("GCC unroll 12") for (int r = 0; r < R; ++r) {                        \
            c0[r] = zero ? _mm512_setzero_si512()                                     \
                         : _mm512_loadu_si512((const void *)(ct + r * NR));           \
            c1[r] = zero ? _mm512_setzero_si512()                                     \
                         : _mm512_loadu_si512((const void *)(ct + r * NR + 16));      \
        }                                                                             \
        for (long k = 0; k < kg; ++k) {                                               \
            __m512i b0 = _mm512_loadu_si512((const void *)bp);                        \
            __m512i b1 = _mm512_loadu_si512((const void *)(bp + 64));                 \
            VNNI_PREFETCH(bp);                                                        \
            _Pragma("GCC unroll 12") for (int r = 0; r < R; ++r) {                    \
                __m512i a = _mm512_set1_epi32(load4(ap + 4 * r));                     \
                c0[r] = dpbusd(c0[r], a, b0);                                         \
                c1[r] = dpbusd(c1[r], a, b1);                                         \
            }                                                                         \
            ap += KG * MR;                                                            \
            bp += KG * NR;                                                            \
        }                                                                             \
        _Pragma("GCC unroll 12") for (int r = 0; r < R; ++r) {                        \
            _mm512_storeu_si512((void *)(ct + r * NR), c0[r]);                        \
            _mm512_storeu_si512((void *)(ct + r * NR + 16), c1[r]);                   \
        }                                                                             \
    }
VNNI_UKERNEL(ukernel_v12, 12)
VNNI_UKERNEL(ukernel_v8, 8)
VNNI_UKERNEL(ukernel_v4, 4)
VNNI_UKERNEL(ukernel_v2, 2)
#undef VNNI_UKERNEL

/* rows: how many rows of the tile are real (1..MR; more than MR: all) */
static void ukernel_rows(long kg, const a_t *ap, const b_t *bp, int32_t *ct, long rows,
                         int zero) {
    if (rows > 8)
        ukernel_v12(kg, ap, bp, ct, zero);
    else if (rows > 4)
        ukernel_v8(kg, ap, bp, ct, zero);
    else if (rows > 2)
        ukernel_v4(kg, ap, bp, ct, zero);
    else
        ukernel_v2(kg, ap, bp, ct, zero);
}
#elif RLX_ISA == 1
/* a) 7-bit weights: vpmaddubsw + vpmaddwd(ones), 6 / 4 / 2 rows x 16 columns. The ones are
 * a memory operand of vpmaddwd (inline assembly): 12 accumulators, two B vectors, the
 * broadcast and a product use all 16 ymm registers, and gcc otherwise spills an
 * accumulator to the stack every iteration. */
static const int16_t ones16[16] __attribute__((aligned(32))) = {1, 1, 1, 1, 1, 1, 1, 1,
                                                                1, 1, 1, 1, 1, 1, 1, 1};
static inline __m256i madd_ones(__m256i x) {
    __asm__("vpmaddwd %1, %0, %0" : "+x"(x) : "m"(ones16));
    return x;
}
#define ROW(r)                                                                          \
    do {                                                                                \
        __m256i a = _mm256_set1_epi32(load4(ap + 4 * (r)));                             \
        c##r##0 = _mm256_add_epi32(c##r##0, madd_ones(_mm256_maddubs_epi16(a, b0)));    \
        c##r##1 = _mm256_add_epi32(c##r##1, madd_ones(_mm256_maddubs_epi16(a, b1)));    \
    } while (0)
#define STORE(r)                                                         \
    do {                                                                 \
        _mm256_storeu_si256((__m256i *)(ct + (r) * NR), c##r##0);        \
        _mm256_storeu_si256((__m256i *)(ct + (r) * NR + 8), c##r##1);    \
    } while (0)
#define LOAD(r)                                                                         \
    __m256i c##r##0 = zero ? _mm256_setzero_si256()                                     \
                           : _mm256_loadu_si256((const __m256i *)(ct + (r) * NR)),      \
            c##r##1 = zero ? _mm256_setzero_si256()                                     \
                           : _mm256_loadu_si256((const __m256i *)(ct + (r) * NR + 8))
#define NARROW_LOOP(...)                                                         \
    for (long k = 0; k < kg; ++k) {                                              \
        __m256i b0 = _mm256_loadu_si256((const __m256i *)bp);                    \
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(bp + 32));             \
        __VA_ARGS__                                                              \
        ap += KG * MR;                                                           \
        bp += KG * NR;                                                           \
    }

__attribute__((noinline)) static void ukernel6(long kg, const a_t *ap, const b_t *bp,
                                               int32_t *ct, int zero) {
    LOAD(0); LOAD(1); LOAD(2); LOAD(3); LOAD(4); LOAD(5);
    NARROW_LOOP(ROW(0); ROW(1); ROW(2); ROW(3); ROW(4); ROW(5);)
    STORE(0); STORE(1); STORE(2); STORE(3); STORE(4); STORE(5);
}

__attribute__((noinline)) static void ukernel4(long kg, const a_t *ap, const b_t *bp,
                                               int32_t *ct, int zero) {
    LOAD(0); LOAD(1); LOAD(2); LOAD(3);
    NARROW_LOOP(ROW(0); ROW(1); ROW(2); ROW(3);)
    STORE(0); STORE(1); STORE(2); STORE(3);
}

__attribute__((noinline)) static void ukernel2(long kg, const a_t *ap, const b_t *bp,
                                               int32_t *ct, int zero) {
    LOAD(0); LOAD(1);
    NARROW_LOOP(ROW(0); ROW(1);)
    STORE(0); STORE(1);
}

/* rows: how many rows of the tile are real (1..MR) */
static void ukernel_rows(long kg, const a_t *ap, const b_t *bp, int32_t *ct, long rows,
                         int zero) {
    if (rows > 4)
        ukernel6(kg, ap, bp, ct, zero);
    else if (rows > 2)
        ukernel4(kg, ap, bp, ct, zero);
    else
        ukernel2(kg, ap, bp, ct, zero);
}
#undef ROW
#undef NARROW_LOOP

/* b) any other 8-bit weights: s16 k pairs, ap[kp2][MR][2] x bp[kp2][NR][2] over kp2 pairs */
#define ROWW(r)                                                                 \
    do {                                                                        \
        __m256i a = _mm256_set1_epi32(load4(ap + 2 * (r)));                     \
        c##r##0 = _mm256_add_epi32(c##r##0, _mm256_madd_epi16(a, b0));          \
        c##r##1 = _mm256_add_epi32(c##r##1, _mm256_madd_epi16(a, b1));          \
    } while (0)
#define WIDE_LOOP(...)                                                           \
    for (long k = 0; k < kp2; ++k) {                                             \
        __m256i b0 = _mm256_loadu_si256((const __m256i *)bp);                    \
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(bp + 16));             \
        __VA_ARGS__                                                              \
        ap += 2 * MR;                                                            \
        bp += 2 * NR;                                                            \
    }

__attribute__((noinline)) static void ukernel_wide6(long kp2, const int16_t *ap,
                                                    const int16_t *bp, int32_t *ct, int zero) {
    LOAD(0); LOAD(1); LOAD(2); LOAD(3); LOAD(4); LOAD(5);
    WIDE_LOOP(ROWW(0); ROWW(1); ROWW(2); ROWW(3); ROWW(4); ROWW(5);)
    STORE(0); STORE(1); STORE(2); STORE(3); STORE(4); STORE(5);
}

__attribute__((noinline)) static void ukernel_wide4(long kp2, const int16_t *ap,
                                                    const int16_t *bp, int32_t *ct, int zero) {
    LOAD(0); LOAD(1); LOAD(2); LOAD(3);
    WIDE_LOOP(ROWW(0); ROWW(1); ROWW(2); ROWW(3);)
    STORE(0); STORE(1); STORE(2); STORE(3);
}

__attribute__((noinline)) static void ukernel_wide2(long kp2, const int16_t *ap,
                                                    const int16_t *bp, int32_t *ct, int zero) {
    LOAD(0); LOAD(1);
    WIDE_LOOP(ROWW(0); ROWW(1);)
    STORE(0); STORE(1);
}

/* rows: how many rows of the tile are real (1..MR) */
static void ukernel_wide(long kp2, const int16_t *ap, const int16_t *bp, int32_t *ct,
                         long rows, int zero) {
    if (rows > 4)
        ukernel_wide6(kp2, ap, bp, ct, zero);
    else if (rows > 2)
        ukernel_wide4(kp2, ap, bp, ct, zero);
    else
        ukernel_wide2(kp2, ap, bp, ct, zero);
}
#undef STORE
#undef LOAD
#undef ROWW
#undef WIDE_LOOP
#elif RLX_ISA >= 3
/* aarch64 (NEON, SDOT, SMMLA): ukernel_rows is in qgemm_neon.h */
#else
static void ukernel_rows(long kg, const a_t *ap, const b_t *bp, int32_t *ct, long rows,
                         int zero) {
    int32_t acc[MR][NR];
    (void)rows;
    if (zero)
        memset(acc, 0, sizeof(acc));
    else
        memcpy(acc, ct, sizeof(acc));
    for (long k = 0; k < kg; ++k) {
        for (int r = 0; r < MR; ++r) {
            const int32_t a0 = ap[4 * r], a1 = ap[4 * r + 1];
            const int32_t a2 = ap[4 * r + 2], a3 = ap[4 * r + 3];
            for (int c = 0; c < NR; ++c) {
                const b_t *b = bp + 4 * c;
                acc[r][c] += a0 * b[0] + a1 * b[1] + a2 * b[2] + a3 * b[3];
            }
        }
        ap += KG * MR;
        bp += KG * NR;
    }
    memcpy(ct, acc, sizeof(acc));
}
#endif
