/* cpu/bf16x16.h: sixteen bf16 values to and from a zmm of f32 lanes, at the avx512 level (AVX-512 F
   and BW). Widening is exact; rounding is convert_f32_to_bf16's (core/convert.h), to nearest even
   with a NaN kept and made quiet, so that vector and scalar paths give the same bits. */
#ifndef KILN_CPU_BF16X16_H
#define KILN_CPU_BF16X16_H
#include <immintrin.h>
#include <stdint.h>

/* the lanes of mask read from p, widened; the other lanes 0 */
static inline __attribute__((always_inline)) __m512 kiln_bf16x16_load(__mmask16 mask, const uint16_t *p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
}

/* the lanes of v rounded to bf16 */
static inline __attribute__((always_inline)) __m256i kiln_bf16x16_round(__m512 v) {
  __m512i u = _mm512_castps_si512(v), top = _mm512_srli_epi32(u, 16);
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                                 _mm512_and_si512(top, _mm512_set1_epi32(1))), 16);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_or_epi32(r, nan, top, _mm512_set1_epi32(0x40)));
}
#endif
