/* The f32 FMA peak probe. In: an iteration count and a thread count. Out: a checksum
   (so nothing is optimised away) and how many threads ran.

   Each thread runs `iters` rounds of RLX_PEAK_CHAINS independent multiply-add chains on
   the widest vectors the build target has: AVX-512 (16 f32 lanes, vfmadd on zmm), AVX2 +
   FMA (8 lanes, ymm), otherwise 4-lane GCC vectors (SSE2 on x86-64: a mul and an add, as
   the portable target's own kernels run). 12 chains cover FMA latency x throughput on
   current cores (4-5 cycles x 2 units) and leave registers for the two constants.
   A multiply-add counts 2 FLOPs.

   Two more probes for the low-precision GEMMs (rlx_peak_int8_run, rlx_peak_bf16_run),
   same chains, same calibration by the caller (native/peak.py):
     int8: the instructions the int8 GEMM of the build target multiplies with. AVX-512 with
           VNNI: vpdpbusd on zmm (64 u8 x s8 multiply-adds each); AVX2 (and AVX-512
           without VNNI, whose int8 GEMM is the AVX2 path): vpmaddubsw + vpmaddwd by ones
           on ymm, as the 7-bit-weight kernel runs them (32 multiply-adds per pair);
           portable: none (0 ops).
     int16 (rlx_peak_int16_run): vpmaddwd on ymm alone (16 s16 x s16 multiply-adds each),
           the instruction of the AVX2 kernel for 8-bit weights; 0 ops without AVX2.
     bf16: vdpbf16ps on zmm (32 bf16 multiply-adds each) when the target has AVX512_BF16;
           none elsewhere (0 ops: the bf16 GEMM runs on the f32 FMA path there).
   rlx_peak_int8_ops / rlx_peak_bf16_ops give the multiply-adds one instruction does.

   aarch64 (NEON, behind the ACLE feature macros the targets' -march set), 24 chains
   (FMLA latency 4 x 4 pipes on Neoverse V1 / V2 and Apple cores; 24 + 2 constants of the
   32 vector registers):
     f32: FMLA .4s (vfmaq_f32, 4 lanes, fused).
     int8: SMMLA (vmmlaq_s32, 32 multiply-adds: a 2x8 by 8x2 int8 tile) on i8mm, the
           int8 GEMM's instruction there; SDOT .4s (vdotq_s32, 16) on dotprod; none on
           neon. rlx_peak_int8dot_run: SDOT alone (every target with dotprod).
     bf16: BFMMLA (vbfmmlaq_f32, 16: 2x4 by 4x2 bf16 into f32) on i8mm (+bf16);
           rlx_peak_bf16dot_run: BFDOT .4s (vbfdotq_f32, 8).
   On x86-64 the int8dot / bf16dot probes do nothing (0 ops). */
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__FMA__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define RLX_PEAK_NEON 1
#endif

#ifndef RLX_PEAK_CHAINS
#ifdef RLX_PEAK_NEON
#define RLX_PEAK_CHAINS 24
#else
#define RLX_PEAK_CHAINS 12
#endif
#endif

#ifdef RLX_PEAK_NEON
/* 24 chains of vector type T (named variables: gcc keeps an array of them in memory),
   acc = STEP(acc) iters times, each chain's lanes summed by SUM into total. The
   constants the steps read are made opaque first (RLX_OPAQUE): gcc 12 would otherwise
   fold the bf16 ones into an fp16 `fmov` that the bf16 target does not have. */
#define RLX_24(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) \
    M(13) M(14) M(15) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23)
#define RLX_OPAQUE(v) __asm__("" : "+w"(v))
/* the chains' type, start, step and lane sum: RLX_CH_T, RLX_CH_INIT(j), RLX_CH_STEP(x),
   RLX_CH_SUM, defined just before each use */
#define RLX_CH_DECL(j) RLX_CH_T acc##j = RLX_CH_INIT(j);
#define RLX_CH_STEP1(j) acc##j = RLX_CH_STEP(acc##j);
#define RLX_CH_ADD(j) total += RLX_CH_SUM(acc##j);
#define RLX_NEON_PROBE()                                                                    \
    do {                                                                                    \
        RLX_24(RLX_CH_DECL)                                                                 \
        for (int64_t i = 0; i < iters; i++) {                                               \
            RLX_24(RLX_CH_STEP1)                                                            \
        }                                                                                   \
        RLX_24(RLX_CH_ADD)                                                                  \
    } while (0)
#define RLX_F32_INIT(j) vdupq_n_f32(1.0f + (float)(j))
#define RLX_I32_INIT(j) vdupq_n_s32(j)
#endif

int rlx_peak_lanes(void) {
#if defined(__AVX512F__)
    return 16;
#elif defined(__FMA__)
    return 8;
#else
    return 4;
#endif
}

int rlx_peak_chains(void) { return RLX_PEAK_CHAINS; }

/* 1 when the loop uses fused multiply-adds, 0 for a separate mul + add. */
int rlx_peak_fused(void) {
#if defined(__AVX512F__) || defined(__FMA__) || defined(RLX_PEAK_NEON)
    return 1;
#else
    return 0;
#endif
}

/* A probe's loop: its own function (noipa: gcc would fold two identical bodies, such as
   the int8 and SDOT probes on dotprod, into one symbol). */
#if defined(__clang__)
#define RLX_PROBE_BODY __attribute__((noinline)) static double
#else
#define RLX_PROBE_BODY __attribute__((noipa)) static double
#endif

/* Runs body(iters) on a team of nthreads (one thread without OpenMP); returns the sum of
   the threads' checksums and stores the team's size in *used. */
static double team_run(double (*body)(int64_t), int64_t iters, int nthreads, int *used) {
    double total = 0.0;
    int n = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(+ : total)
#endif
    {
#ifdef _OPENMP
#pragma omp single
        n = omp_get_num_threads();
#endif
        total += body(iters);
    }
    (void)nthreads;
    *used = n;
    return total;
}

typedef float rlx_v4f __attribute__((vector_size(16)));

RLX_PROBE_BODY fma_body(int64_t iters) {
    double total = 0.0;
    {
#if defined(__AVX512F__)
        __m512 acc[RLX_PEAK_CHAINS];
        const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_set1_ps(1.0f + j);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) total += _mm512_reduce_add_ps(acc[j]);
#elif defined(__FMA__)
        __m256 acc[RLX_PEAK_CHAINS];
        const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm256_set1_ps(1.0f + j);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
        float lanes[8];
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) {
            _mm256_storeu_ps(lanes, acc[j]);
            for (int l = 0; l < 8; l++) total += lanes[l];
        }
#elif defined(RLX_PEAK_NEON)
        float32x4_t a = vdupq_n_f32(0.999999f), b = vdupq_n_f32(1e-7f); /* acc grows 1e-7 a step */
#define RLX_FMLA(x) vfmaq_f32(x, a, b) /* x += a * b: FMLA accumulates in place */
        RLX_OPAQUE(a);
        RLX_OPAQUE(b);
#define RLX_CH_T float32x4_t
#define RLX_CH_INIT RLX_F32_INIT
#define RLX_CH_STEP RLX_FMLA
#define RLX_CH_SUM vaddvq_f32
        RLX_NEON_PROBE();
#undef RLX_CH_T
#undef RLX_CH_INIT
#undef RLX_CH_STEP
#undef RLX_CH_SUM
#else
        rlx_v4f acc[RLX_PEAK_CHAINS];
        const rlx_v4f a = {0.999999f, 0.999999f, 0.999999f, 0.999999f};
        const rlx_v4f b = {1e-7f, 1e-7f, 1e-7f, 1e-7f};
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) {
            const float s = 1.0f + j;
            acc[j] = (rlx_v4f){s, s, s, s};
        }
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = acc[j] * a + b;
        for (int j = 0; j < RLX_PEAK_CHAINS; j++)
            for (int l = 0; l < 4; l++) total += acc[j][l];
#endif
    }
    return total;
}

double rlx_peak_run(int64_t iters, int nthreads, int *used) {
    return team_run(fma_body, iters, nthreads, used);
}

#if defined(__AVX2__)
/* 12 ymm integer chains stepped iters times by the instruction(s) in STEP (AT&T syntax,
 * %[x] the chain, %[b] / %[o] the constants), their lanes summed. Inline assembly: gcc
 * spills intrinsics chains of this kind to the stack every iteration (stores that cap
 * the rate), whatever the source looks like. */
#define RLX_INT_PROBE(NAME, STEP, BVAL)                                                     \
    __attribute__((noinline)) static double NAME(int64_t iters) {                           \
        __m256i x0 = _mm256_set1_epi32(0), x1 = _mm256_set1_epi32(1),                        \
                x2 = _mm256_set1_epi32(2), x3 = _mm256_set1_epi32(3),                        \
                x4 = _mm256_set1_epi32(4), x5 = _mm256_set1_epi32(5),                        \
                x6 = _mm256_set1_epi32(6), x7 = _mm256_set1_epi32(7),                        \
                x8 = _mm256_set1_epi32(8), x9 = _mm256_set1_epi32(9),                        \
                x10 = _mm256_set1_epi32(10), x11 = _mm256_set1_epi32(11);                    \
        const __m256i b = BVAL, one = _mm256_set1_epi16(1);                                  \
        for (int64_t i = 0; i < iters; i++)                                                  \
            __asm__ volatile(STEP("%0") STEP("%1") STEP("%2") STEP("%3") STEP("%4")          \
                             STEP("%5") STEP("%6") STEP("%7") STEP("%8") STEP("%9")          \
                             STEP("%10") STEP("%11")                                         \
                             : "+x"(x0), "+x"(x1), "+x"(x2), "+x"(x3), "+x"(x4), "+x"(x5),   \
                               "+x"(x6), "+x"(x7), "+x"(x8), "+x"(x9), "+x"(x10), "+x"(x11)  \
                             : [b] "x"(b), [o] "x"(one));                                    \
        __m256i s_ = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(x0, x1),              \
                                                       _mm256_add_epi32(x2, x3)),             \
                                      _mm256_add_epi32(_mm256_add_epi32(x4, x5),              \
                                                       _mm256_add_epi32(x6, x7)));            \
        s_ = _mm256_add_epi32(s_, _mm256_add_epi32(_mm256_add_epi32(x8, x9),                  \
                                                   _mm256_add_epi32(x10, x11)));              \
        int32_t lanes_[8];                                                                   \
        _mm256_storeu_si256((__m256i *)lanes_, s_);                                          \
        double total = 0.0;                                                                  \
        for (int l = 0; l < 8; l++) total += lanes_[l];                                      \
        return total;                                                                        \
    }

/* x = madd(maddubs(x, b), ones): as the 7-bit-weight GEMM's chains */
#define RLX_PAIR(x) "vpmaddubsw %[b], " x ", " x "\n\tvpmaddwd %[o], " x ", " x "\n\t"
/* x = madd(x, b) */
#define RLX_MADD(x) "vpmaddwd %[b], " x ", " x "\n\t"
RLX_INT_PROBE(pair_loop, RLX_PAIR, _mm256_set1_epi8(1))
RLX_INT_PROBE(madd_loop, RLX_MADD, _mm256_set1_epi16(1))
#endif

/* Multiply-adds per step of the int8 probe (0: no int8 SIMD on this target). */
int rlx_peak_int8_ops(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 64;
#elif defined(__AVX2__)
    return 32;
#elif defined(RLX_PEAK_NEON) && defined(__ARM_FEATURE_MATMUL_INT8)
    return 32;
#elif defined(RLX_PEAK_NEON) && defined(__ARM_FEATURE_DOTPROD)
    return 16;
#else
    return 0;
#endif
}

/* Multiply-adds per instruction of the bf16 probe (0: no bf16 dot product here). */
int rlx_peak_bf16_ops(void) {
#if defined(__AVX512BF16__)
    return 32;
#elif defined(RLX_PEAK_NEON) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
    return 16;
#else
    return 0;
#endif
}

RLX_PROBE_BODY int8_body(int64_t iters) {
    double total = 0.0;
    {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
        __m512i acc[RLX_PEAK_CHAINS];
        const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_set1_epi32(j);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) total += _mm512_reduce_add_epi32(acc[j]);
#elif defined(__AVX2__)
        total += pair_loop(iters);
#elif defined(RLX_PEAK_NEON) && defined(__ARM_FEATURE_MATMUL_INT8)
        int8x16_t a = vdupq_n_s8(3), b = vdupq_n_s8(-2);
#define RLX_SMMLA(x) vmmlaq_s32(x, a, b)
        RLX_OPAQUE(a);
        RLX_OPAQUE(b);
#define RLX_CH_T int32x4_t
#define RLX_CH_INIT RLX_I32_INIT
#define RLX_CH_STEP RLX_SMMLA
#define RLX_CH_SUM vaddvq_s32
        RLX_NEON_PROBE();
#undef RLX_CH_T
#undef RLX_CH_INIT
#undef RLX_CH_STEP
#undef RLX_CH_SUM
#elif defined(RLX_PEAK_NEON) && defined(__ARM_FEATURE_DOTPROD)
        int8x16_t a = vdupq_n_s8(3), b = vdupq_n_s8(-2);
#define RLX_SDOT(x) vdotq_s32(x, a, b)
        RLX_OPAQUE(a);
        RLX_OPAQUE(b);
#define RLX_CH_T int32x4_t
#define RLX_CH_INIT RLX_I32_INIT
#define RLX_CH_STEP RLX_SDOT
#define RLX_CH_SUM vaddvq_s32
        RLX_NEON_PROBE();
#undef RLX_CH_T
#undef RLX_CH_INIT
#undef RLX_CH_STEP
#undef RLX_CH_SUM
#else
        (void)iters;
#endif
    }
    return total;
}

double rlx_peak_int8_run(int64_t iters, int nthreads, int *used) {
    return team_run(int8_body, iters, nthreads, used);
}

RLX_PROBE_BODY bf16_body(int64_t iters) {
    double total = 0.0;
    {
#if defined(__AVX512BF16__)
        __m512 acc[RLX_PEAK_CHAINS];
        const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_set1_ps(1.0f + j);
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < RLX_PEAK_CHAINS; j++) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
        for (int j = 0; j < RLX_PEAK_CHAINS; j++) total += _mm512_reduce_add_ps(acc[j]);
#elif defined(RLX_PEAK_NEON) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
        uint32x4_t ai = vdupq_n_u32(0x3f803f80u), bi = vdupq_n_u32(0x33803380u);
        RLX_OPAQUE(ai);
        RLX_OPAQUE(bi);
        bfloat16x8_t a = vreinterpretq_bf16_u32(ai), b = vreinterpretq_bf16_u32(bi);
#define RLX_BFMMLA(x) vbfmmlaq_f32(x, a, b)
        RLX_OPAQUE(a);
        RLX_OPAQUE(b);
#define RLX_CH_T float32x4_t
#define RLX_CH_INIT RLX_F32_INIT
#define RLX_CH_STEP RLX_BFMMLA
#define RLX_CH_SUM vaddvq_f32
        RLX_NEON_PROBE();
#undef RLX_CH_T
#undef RLX_CH_INIT
#undef RLX_CH_STEP
#undef RLX_CH_SUM
#else
        (void)iters;
#endif
    }
    return total;
}

double rlx_peak_bf16_run(int64_t iters, int nthreads, int *used) {
    return team_run(bf16_body, iters, nthreads, used);
}

/* Multiply-adds per vpmaddwd of the int16 probe (0: no AVX2). */
int rlx_peak_int16_ops(void) {
#if defined(__AVX2__)
    return 16;
#else
    return 0;
#endif
}

RLX_PROBE_BODY int16_body(int64_t iters) {
    double total = 0.0;
    {
#if defined(__AVX2__)
        total += madd_loop(iters);
#else
        (void)iters;
#endif
    }
    return total;
}

double rlx_peak_int16_run(int64_t iters, int nthreads, int *used) {
    return team_run(int16_body, iters, nthreads, used);
}

/* Multiply-adds per SDOT of the int8 dot probe (0: no dotprod, and on x86-64). */
int rlx_peak_int8dot_ops(void) {
#if defined(RLX_PEAK_NEON) && defined(__ARM_FEATURE_DOTPROD)
    return 16;
#else
    return 0;
#endif
}

RLX_PROBE_BODY int8dot_body(int64_t iters) {
    double total = 0.0;
    {
#if defined(RLX_PEAK_NEON) && defined(__ARM_FEATURE_DOTPROD)
        int8x16_t a = vdupq_n_s8(3), b = vdupq_n_s8(-2);
#define RLX_SDOT1(x) vdotq_s32(x, a, b)
        RLX_OPAQUE(a);
        RLX_OPAQUE(b);
#define RLX_CH_T int32x4_t
#define RLX_CH_INIT RLX_I32_INIT
#define RLX_CH_STEP RLX_SDOT1
#define RLX_CH_SUM vaddvq_s32
        RLX_NEON_PROBE();
#undef RLX_CH_T
#undef RLX_CH_INIT
#undef RLX_CH_STEP
#undef RLX_CH_SUM
#else
        (void)iters;
#endif
    }
    return total;
}

double rlx_peak_int8dot_run(int64_t iters, int nthreads, int *used) {
    return team_run(int8dot_body, iters, nthreads, used);
}

/* Multiply-adds per BFDOT of the bf16 dot probe (0: no bf16, and on x86-64). */
int rlx_peak_bf16dot_ops(void) {
#if defined(RLX_PEAK_NEON) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
    return 8;
#else
    return 0;
#endif
}

RLX_PROBE_BODY bf16dot_body(int64_t iters) {
    double total = 0.0;
    {
#if defined(RLX_PEAK_NEON) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
        uint32x4_t ai = vdupq_n_u32(0x3f803f80u), bi = vdupq_n_u32(0x33803380u);
        RLX_OPAQUE(ai);
        RLX_OPAQUE(bi);
        bfloat16x8_t a = vreinterpretq_bf16_u32(ai), b = vreinterpretq_bf16_u32(bi);
#define RLX_BFDOT(x) vbfdotq_f32(x, a, b)
        RLX_OPAQUE(a);
        RLX_OPAQUE(b);
#define RLX_CH_T float32x4_t
#define RLX_CH_INIT RLX_F32_INIT
#define RLX_CH_STEP RLX_BFDOT
#define RLX_CH_SUM vaddvq_f32
        RLX_NEON_PROBE();
#undef RLX_CH_T
#undef RLX_CH_INIT
#undef RLX_CH_STEP
#undef RLX_CH_SUM
#else
        (void)iters;
#endif
    }
    return total;
}

double rlx_peak_bf16dot_run(int64_t iters, int nthreads, int *used) {
    return team_run(bf16dot_body, iters, nthreads, used);
}
