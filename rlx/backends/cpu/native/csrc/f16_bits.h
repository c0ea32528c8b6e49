/* IEEE binary16 -> binary32 bit pattern, exact (subnormals, inf and NaN included): the
 * scalar widening of lowp_cast.c and half_linear.c (tails and the portable path). The
 * loaders inline this file where it is #included (rlx.backends.cpu.native.csrc_source),
 * so it is part of each library's cache key. */
#ifndef RLX_F16_BITS_H
#define RLX_F16_BITS_H
#include <stdint.h>

static inline uint32_t rlx_f16_bits(uint16_t h) {
    uint32_t h_exp = h & 0x7c00u;
    uint32_t f_sgn = ((uint32_t)h & 0x8000u) << 16;
    if (h_exp == 0) {
        uint32_t h_sig = h & 0x03ffu;
        if (h_sig == 0) return f_sgn;
        h_sig <<= 1;
        while ((h_sig & 0x0400u) == 0) {
            h_sig <<= 1;
            h_exp++;
        }
        return f_sgn + (((uint32_t)(127 - 15 - h_exp)) << 23) + ((h_sig & 0x03ffu) << 13);
    }
    if (h_exp == 0x7c00u) return f_sgn + 0x7f800000u + (((uint32_t)(h & 0x03ffu)) << 13);
    return f_sgn + ((((uint32_t)h & 0x7fffu) + 0x1c000u) << 13);
}
#endif
