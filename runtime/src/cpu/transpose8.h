/* cpu/transpose8.h: an 8 x 8 block of 32-bit words transposed in registers, for the copies and
   packings that turn rows into columns (cpu/elementwise.c's tiled copy, the recurrent layers'
   weight panels, the bf16 GEMM's packing). The caller loads the block's 8 rows, one vector each;
   this stores them as 8 columns: dst[i * ld + j] = r[j][i], whole 32-byte pieces on both sides.
   Compiled for AVX wherever it is inlined: into code built for AVX2 or AVX-512, or a function
   with its own AVX-512 target attribute. */
#ifndef KILN_CPU_TRANSPOSE8_H
#define KILN_CPU_TRANSPOSE8_H
#include <immintrin.h>
#include <stdint.h>

__attribute__((target("avx"), always_inline)) static inline void kiln_transpose8_store(__m256 r[8], float *dst, int64_t ld) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; i++) {
    _mm256_storeu_ps(dst + i * ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}

#endif
