/* cpu/transpose16.h: sixteen vectors of sixteen 32-bit lanes transposed in registers (AVX-512),
   and relu on a vector as kiln's relu does it, for the fused LeNet layers of cpu/conv.c and
   cpu/bf16_conv.c, which move between oneDNN's blocked layout (sixteen channels a vector) and
   NCHW rows, and for cpu/sgemm.c's packing of a transposed operand. Included at the avx512 level
   only. */
#ifndef KILN_CPU_TRANSPOSE16_H
#define KILN_CPU_TRANSPOSE16_H
#include <immintrin.h>

/* v[i][j] <- v[j][i] for 16 vectors of 16 floats */
static inline __attribute__((always_inline)) void transpose16(__m512 v[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int h = 0; h < 16; h += 8)   /* u[h..h+3] and u[h+4..h+7]: rows h..h+7 */
    for (int k = 0; k < 4; k++) {
      t[h + k] = _mm512_shuffle_f32x4(u[h + k], u[h + 4 + k], 0x88);
      t[h + 4 + k] = _mm512_shuffle_f32x4(u[h + k], u[h + 4 + k], 0xdd);
    }
  for (int k = 0; k < 8; k++) {
    v[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
    v[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
  }
}

/* x < 0 ? 0 : x, as relu: NaN and -0 stay. vmaxps gives its second operand unless the first is
   larger: 0 > x gives +0, and x otherwise, a NaN or a -0 included. */
static inline __attribute__((always_inline)) __m512 relu16(__m512 x) { return _mm512_max_ps(_mm512_setzero_ps(), x); }

#endif
