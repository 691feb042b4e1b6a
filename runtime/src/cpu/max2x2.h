/* cpu/max2x2.h: what the AVX-512 2x2 max pooling of f32 (cpu/pool.c) and bf16 (cpu/bf16_pool.c)
   share: sixteen windows' four candidates in f32 lanes, compared in raster order, and the flat
   index of each window's pick. Only at the avx512 level. */
#ifndef KILN_CPU_MAX2X2_H
#define KILN_CPU_MAX2X2_H
#if defined(__AVX512F__)
#include <immintrin.h>
#include <stdint.h>

/* The pick of each lane's window among its values in raster order (c[0] top left, c[1] top
   right, c[2] bottom left, c[3] bottom right), as cpu/pool.c's take(): a larger value or a NaN
   replaces the best, so the first maximum wins, or the last NaN. *rank: 0 to 3. */
static inline __attribute__((always_inline)) __m512 kiln_max2x2_pick(const __m512 c[4], __m512i *rank) {
  __m512 best = c[0];
  __m512i r = _mm512_setzero_si512();
  for (int k = 1; k < 4; k++) {
    __mmask16 take = _mm512_cmp_ps_mask(c[k], best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(c[k], c[k], _CMP_UNORD_Q);
    best = _mm512_mask_mov_ps(best, take, c[k]);
    r = _mm512_mask_mov_epi32(r, take, _mm512_set1_epi32(k));
  }
  *rank = r;
  return best;
}

/* The plane index of each pick, windows starting at at0 (2 oh W + 2 ow) two columns apart:
   at0 + 2 lane + (rank & 1) + (rank >> 1) W, in 32 bits. */
static inline __attribute__((always_inline)) __m512i kiln_max2x2_index(int64_t at0, __m512i rank, int64_t W) {
  const __m512i lane2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  __m512i at = _mm512_add_epi32(_mm512_set1_epi32((int)at0), lane2);
  at = _mm512_add_epi32(at, _mm512_and_si512(rank, _mm512_set1_epi32(1)));
  return _mm512_add_epi32(at, _mm512_mullo_epi32(_mm512_srli_epi32(rank, 1), _mm512_set1_epi32((int)W)));
}

#if defined(__AVX512BW__)
/* The bf16 forward's loads (cpu/bf16_pool.c, cpu/bf16_conv.c): the four candidates of sixteen
   windows of plane x [H, W = 2 OW] from rows 2 oh and 2 oh + 1, column 2 ow, n windows, widened to
   f32 (a vector of 32 values of a row holds each window's pair of that row in a 32-bit lane: the
   left one is the lane shifted up, the right one its high half). Whole vectors (whole: the sixteen
   outputs lie in the plane; the lanes past n read the next row, not used) where they stay in the
   plane: partly masked loads of cold memory stall (Zen 5). */
static inline __attribute__((always_inline)) void kiln_max2x2_load_bf16(const uint16_t *x, int64_t H, int64_t W, int64_t oh,
                                                                     int64_t ow, int64_t n, int whole, __m512 c[4]) {
  const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
  __mmask32 m32 = n == 16 ? 0xffffffffu : (__mmask32)((1u << (2 * n)) - 1);
  const uint16_t *r0 = x + 2 * oh * W, *r1 = r0 + W;
  __m512i v0 = whole ? _mm512_loadu_si512(r0 + 2 * ow) : _mm512_maskz_loadu_epi16(m32, r0 + 2 * ow);
  __m512i v1 = whole && (2 * oh + 1) * W + 2 * ow + 32 <= H * W ? _mm512_loadu_si512(r1 + 2 * ow)
                                                               : _mm512_maskz_loadu_epi16(m32, r1 + 2 * ow);
  c[0] = _mm512_castsi512_ps(_mm512_slli_epi32(v0, 16));
  c[1] = _mm512_castsi512_ps(_mm512_and_si512(v0, hi));
  c[2] = _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16));
  c[3] = _mm512_castsi512_ps(_mm512_and_si512(v1, hi));
}

/* The bf16 backward's stores (cpu/bf16_pool.c, cpu/bf16_conv.c): sixteen windows' grads g (16-bit
   values in 32-bit lanes, 0 where none goes) put each at its pick (right: the pair's right
   column, low: the lower row) in output rows 2 oh and 2 oh + 1 of the plane gx [H, W = 2 OW] from
   column 2 ow, n windows (n < 16: the row's last), every element of the pairs written once. Whole
   vectors where what they write past the row's pairs is written again by a store after them,
   within the plane: the lower row's spills into the next window row (a later pair), the upper
   row's into the lower row, which only a row of one vector writes after it. */
static inline __attribute__((always_inline)) void kiln_max2x2_put_bf16(uint16_t *gx, int64_t H, int64_t W, int64_t OW, int64_t oh,
                                                                    int64_t ow, int64_t n, __m512i g, __mmask16 right, __mmask16 low) {
  __mmask32 m32 = n == 16 ? 0xffffffffu : (__mmask32)((1u << (2 * n)) - 1);
  uint16_t *g0 = gx + 2 * oh * W, *g1 = g0 + W;
  __m512i t = _mm512_mask_slli_epi32(g, right, g, 16);   /* the pair's right half, or its left */
  __m512i v0 = _mm512_maskz_mov_epi32((__mmask16)~low, t), v1 = _mm512_maskz_mov_epi32(low, t);
  int64_t at0 = 2 * oh * W + 2 * ow;
  if ((OW <= 16 || 2 * ow + 32 <= W) && at0 + 32 <= H * W) _mm512_storeu_si512(g0 + 2 * ow, v0);
  else _mm512_mask_storeu_epi16(g0 + 2 * ow, m32, v0);
  if (at0 + W + 32 <= H * W) _mm512_storeu_si512(g1 + 2 * ow, v1);
  else _mm512_mask_storeu_epi16(g1 + 2 * ow, m32, v1);
}
#endif
#endif
#endif
