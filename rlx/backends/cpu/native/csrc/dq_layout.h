/* The row-interleaved layout of a packed quantized weight (rlx's dqgemm kernels).
 *
 * A weight W[N, K] in a block scheme (GGUF blocks of 32 or 256 weights, bsize bytes per
 * block, nb = K / block weights per row) is stored either
 *   - plain (R = 1): row n's nb blocks one after another, rows in order (the GGUF layout);
 *   - interleaved (R = 4 or 8): the first N - N % R rows in groups of R; inside a group,
 *     block b of rows n0 .. n0 + R - 1 are consecutive, then block b + 1 of the same rows,
 *     and so on; the N % R tail rows follow, plain.
 * The block bytes themselves are never changed, so every block decoder works unchanged:
 * a kernel walks row n from dq_row_start() in steps of dq_block_stride() bytes.
 * Inlined by rlx.backends.cpu.native.csrc_source; the guard keeps one copy per library. */
#ifndef RLX_DQ_LAYOUT_H
#define RLX_DQ_LAYOUT_H
#include <stdint.h>

/* Address of block 0 of row n (0 <= n < N). */
static inline const uint8_t *dq_row_start(const uint8_t *w, int64_t n, int64_t N, int64_t nb,
                                          int64_t bsize, int R) {
    int64_t full = R > 1 ? N - N % R : N;
    if (R <= 1 || n >= full) return w + n * nb * bsize;
    return w + ((n / R) * nb * R + n % R) * bsize;
}

/* Bytes from block b to block b + 1 of row n. */
static inline int64_t dq_block_stride(int64_t n, int64_t N, int64_t bsize, int R) {
    int64_t full = R > 1 ? N - N % R : N;
    return (R > 1 && n < full) ? (int64_t)R * bsize : bsize;
}
#endif
