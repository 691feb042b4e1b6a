/* philox.h: Philox 4x32-10 (Salmon et al., SC'11), the generator behind every random draw of kiln,
   written once for the CPU (cpu/random.c) and the CUDA kernels (runtime/cuda/kernels/elements.cuh), which
   therefore draw the same bits. Block ctr under key: counter (ctr, 0), key (key low, key high). */
#ifndef KILN_PHILOX_H
#define KILN_PHILOX_H
#include <stdint.h>

#ifdef __CUDACC__
#define KILN_PHILOX_FN static inline __host__ __device__
#else
#define KILN_PHILOX_FN static inline
#endif

KILN_PHILOX_FN void kiln_philox4x32(uint64_t ctr, uint64_t key, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* Uniform in [0, 1) with 53 bits from the first two words of a block. */
KILN_PHILOX_FN double kiln_philox_unit53(const uint32_t r[4]) {
  return (double)(((uint64_t)r[0] << 21) ^ (r[1] >> 11)) * 0x1p-53;
}

#endif
