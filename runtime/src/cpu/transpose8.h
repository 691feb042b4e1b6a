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

/* A 16 x 16 block the same way with AVX-512 (for code built for it): dst[i * ld + j] = r[j][i],
   whole 64-byte rows stored. Four steps of 16 shuffles: a quarter of a shuffle an element, against
   three eighths for two 8 x 8 blocks. */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void kiln_transpose16_store(__m512 r[16], float *dst, int64_t ld) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {   /* lane L of t[i]: r[i][4L], r[i+1][4L], r[i][4L+1], r[i+1][4L+1] */
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {   /* lane L of u[i + c]: column 4L + c of rows i .. i + 3 */
    u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  for (int c = 0; c < 4; c++) {   /* column 4L + c: lane L of u[c], u[4 + c], u[8 + c], u[12 + c] */
    __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
    __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    _mm512_storeu_ps(dst + c * ld, _mm512_shuffle_f32x4(v0, v2, 0x88));
    _mm512_storeu_ps(dst + (4 + c) * ld, _mm512_shuffle_f32x4(v1, v3, 0x88));
    _mm512_storeu_ps(dst + (8 + c) * ld, _mm512_shuffle_f32x4(v0, v2, 0xDD));
    _mm512_storeu_ps(dst + (12 + c) * ld, _mm512_shuffle_f32x4(v1, v3, 0xDD));
  }
}
#endif

#endif
