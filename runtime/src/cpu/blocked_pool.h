/* cpu/blocked_pool.h: the fused LeNet layer (conv2d, relu, 2x2 max pooling: cpu/conv.c for f32,
   cpu/bf16_conv.c for bf16) over oneDNN's blocked layout, nChw16c: sixteen channels a position.
   One body for both dtypes (bf16 values widened to f32 lanes, which holds them exactly), each step
   with the bits of the three ops in that dtype:
   - the epilogue: a part's output as oneDNN leaves it -> relu, the 2x2 pick as max_pool2d makes it
     (cpu/max2x2.h), the pooled NCHW output (a 16 x 16 transpose a row), one code a window: the
     pick's rank (0-3) or 4 where the relu passes no grad (the pick <= 0);
   - the prologue: the pooled grad and the codes -> the part's output grad in the blocked layout,
     each grad as max_pool2d's backward makes it (f32: 0 + g; bf16: -0 as +0, a NaN quieted), and
     the bias grad's lanes as that dtype's sum_bias adds them (f32: 8, bf16: 16).
   Planes of even width (OW = 2 PW: the callers take no other, as max_pool2d's vector pick).
   Included at the avx512 level only. */
#ifndef KILN_CPU_BLOCKED_POOL_H
#define KILN_CPU_BLOCKED_POOL_H
#include <stdint.h>

/* A fused layer's call, as its kernels see it (at every level: the backward reads it) */
struct kiln_pool_fuse {
  int columns;                /* bf16: 1 when the columns' NCHW planes run it (cpu/bf16_conv.c), 0 blocked */
  int64_t O, OH, OW, PH, PW;  /* channels, the convolution's output plane, the pooled plane */
  void *y;                    /* forward: the pooled output */
  const void *gp;             /* backward: its grad */
  uint8_t *codes;             /* blocked [N][O/16][PH][PW][16]; columns [N][O][PH][PW] */
  float *lanes;               /* backward: the bias grad's lanes [N][O][8 f32, 16 bf16], or NULL */
};

#if defined(__AVX512BW__)
#include "bf16x16.h"
#include "max2x2.h"
#include "transpose16.h"

/* bf16's relu on widened values: a negative number (not -0) is +0, a NaN quieted, as cpu/elementwise.c */
static inline __attribute__((always_inline)) __m512 kiln_relu_bf16(__m512 x) {
  x = relu16(x);
  return _mm512_castsi512_ps(_mm512_mask_or_epi32(_mm512_castps_si512(x), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                                                  _mm512_castps_si512(x), _mm512_set1_epi32(0x400000)));
}
/* bf16 grads (16-bit values in 32-bit lanes) as max pooling's scatter rounds them: -0 as +0, a NaN quieted */
static inline __attribute__((always_inline)) __m512i kiln_scatter_bf16(__m512i g) {
  g = _mm512_mask_mov_epi32(g, _mm512_cmpeq_epi32_mask(g, _mm512_set1_epi32(0x8000)), _mm512_setzero_si512());
  return _mm512_mask_or_epi32(g, _mm512_cmpgt_epi32_mask(_mm512_and_si512(g, _mm512_set1_epi32(0x7fff)), _mm512_set1_epi32(0x7f80)),
                              g, _mm512_set1_epi32(0x40));
}
/* a window's code: its pick's rank, or 4 where the pick is <= 0 (relu passes no grad; a NaN does) */
static inline __attribute__((always_inline)) __m512i kiln_pool_code(__m512 best, __m512i rank) {
  return _mm512_mask_mov_epi32(rank, _mm512_cmp_ps_mask(best, _mm512_setzero_ps(), _CMP_LE_OQ), _mm512_set1_epi32(4));
}

/* sixteen channels at p (a position of the blocked layout) as f32 lanes */
static inline __attribute__((always_inline)) __m512 kiln_bp_load(int bf16, const char *p) {
  if (bf16) return kiln_bf16x16_load(0xffff, (const uint16_t *)p);
  return _mm512_load_ps((const float *)p);
}
/* f32 lanes (a grad's bits for bf16: 16-bit values in 32-bit lanes) where mask, else 0, to position p */
static inline __attribute__((always_inline)) void kiln_bp_store(int bf16, char *p, __mmask16 mask, __m512 v) {
  if (bf16) _mm256_store_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_maskz_mov_epi32(mask, _mm512_castps_si512(v))));
  else _mm512_store_ps((float *)p, _mm512_maskz_mov_ps(mask, v));
}

static inline __attribute__((always_inline)) void kiln_blocked_pool_epilogue(int bf16, const struct kiln_pool_fuse *f, int64_t n0,
                                                                           int64_t nb, const void *blocked) {
  const int64_t es = bf16 ? 2 : 4, OW = f->OW, OHW = f->OH * f->OW, PH = f->PH, PW = f->PW, Cb = (f->O + 15) / 16;
  const int64_t off[4] = {0, 16 * es, OW * 16 * es, (OW + 1) * 16 * es};
  for (int64_t n = 0; n < nb; n++)
    for (int64_t cb = 0; cb < Cb; cb++) {
      const char *plane = (const char *)blocked + (n * Cb + cb) * OHW * 16 * es;
      uint8_t *code = f->codes + ((n0 + n) * Cb + cb) * PH * PW * 16;
      char *out = (char *)f->y + ((n0 + n) * f->O + cb * 16) * PH * PW * es;
      int64_t nc = f->O - cb * 16 < 16 ? f->O - cb * 16 : 16;
      for (int64_t ph = 0; ph < PH; ph++)
        for (int64_t pw0 = 0; pw0 < PW; pw0 += 16) {
          int m = PW - pw0 < 16 ? (int)(PW - pw0) : 16;
          __mmask16 mm = (__mmask16)((1u << m) - 1);
          __m512 v[16];
#pragma GCC unroll 16
          for (int i = 0; i < 16; i++) {   /* whole, so that v stays in registers through the transpose */
            v[i] = _mm512_setzero_ps();
            if (i >= m) continue;
            const char *at = plane + (2 * ph * OW + 2 * (pw0 + i)) * 16 * es;
            __m512 c[4];
            for (int k = 0; k < 4; k++) c[k] = bf16 ? kiln_relu_bf16(kiln_bp_load(1, at + off[k])) : relu16(kiln_bp_load(0, at + off[k]));
            __m512i rank;
            v[i] = kiln_max2x2_pick(c, &rank);
            _mm_storeu_si128((__m128i *)(code + (ph * PW + pw0 + i) * 16), _mm512_cvtepi32_epi8(kiln_pool_code(v[i], rank)));
          }
          transpose16(v);
          for (int64_t k = 0; k < nc; k++) {
            char *row = out + (k * PH * PW + ph * PW + pw0) * es;
            if (bf16) _mm256_mask_storeu_epi16(row, mm, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v[k]), 16)));
            else _mm512_mask_storeu_ps(row, mm, v[k]);
          }
        }
    }
}

static inline __attribute__((always_inline)) void kiln_blocked_pool_prologue(int bf16, const struct kiln_pool_fuse *f, int64_t n0,
                                                                           int64_t nb, void *blocked) {
  const int64_t es = bf16 ? 2 : 4, OW = f->OW, OHW = f->OH * f->OW, PH = f->PH, PW = f->PW, PP = PH * PW;
  const int64_t Cb = (f->O + 15) / 16, L = bf16 ? 16 : 8, PL = OHW - OHW % L;
  const int64_t off[4] = {0, 16 * es, OW * 16 * es, (OW + 1) * 16 * es};
  for (int64_t n = 0; n < nb; n++)
    for (int64_t cb = 0; cb < Cb; cb++) {
      char *plane = (char *)blocked + (n * Cb + cb) * OHW * 16 * es;
      const uint8_t *code = f->codes + ((n0 + n) * Cb + cb) * PH * PW * 16;
      const char *gp = (const char *)f->gp + ((n0 + n) * f->O + cb * 16) * PP * es;
      int64_t nc = f->O - cb * 16 < 16 ? f->O - cb * 16 : 16;
      /* sixteen pooled positions at a time in the plane's flat order (each channel's grads read
         along, the next line of the sixteen streams prefetched), their windows' four positions
         written from the codes */
      for (int64_t p0 = 0, ph = 0, pw = 0; p0 < PP; p0 += 16) {
        int m = PP - p0 < 16 ? (int)(PP - p0) : 16;
        __mmask16 mm = (__mmask16)((1u << m) - 1);
        __m512 v[16];
        for (int64_t k = 0; k < 16; k++) {
          const char *row = gp + (k * PP + p0) * es;
          v[k] = k >= nc ? _mm512_setzero_ps()
                 : bf16  ? _mm512_castsi512_ps(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mm, row)))
                         : _mm512_maskz_loadu_ps(mm, row);
        }
        for (int64_t k = 0; k < nc; k++) _mm_prefetch(gp + (k * PP + p0 + 64) * es, _MM_HINT_T0);
        transpose16(v);
        for (int i = 0; i < m; i++) {
          __m512 g = bf16 ? _mm512_castsi512_ps(kiln_scatter_bf16(_mm512_castps_si512(v[i])))
                          : _mm512_add_ps(_mm512_setzero_ps(), v[i]);   /* 0 + g */
          __m512i r = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(code + (p0 + i) * 16)));
          char *at = plane + (2 * ph * OW + 2 * pw) * 16 * es;
          for (int q = 0; q < 4; q++) kiln_bp_store(bf16, at + off[q], _mm512_cmpeq_epi32_mask(r, _mm512_set1_epi32(q)), g);
          if (++pw == PW) { pw = 0; ph++; }
        }
      }
      for (int64_t p = 2 * PH * OW; p < OHW; p++) kiln_bp_store(bf16, plane + p * 16 * es, 0, _mm512_setzero_ps());   /* a last row */
      if (f->lanes) {   /* position p in lane p % L, the last OHW % L in lane 0 */
        __m512 acc[16];
        for (int l = 0; l < L; l++) acc[l] = _mm512_setzero_ps();
        int64_t p = 0;
        for (; p < PL; p += L)
          for (int l = 0; l < L; l++) acc[l] = _mm512_add_ps(acc[l], kiln_bp_load(bf16, plane + (p + l) * 16 * es));
        for (; p < OHW; p++) acc[0] = _mm512_add_ps(acc[0], kiln_bp_load(bf16, plane + p * 16 * es));
        float a[16][16];
        for (int l = 0; l < L; l++) _mm512_storeu_ps(a[l], acc[l]);
        for (int64_t k = 0; k < nc; k++)
          for (int l = 0; l < L; l++) f->lanes[((n0 + n) * f->O + cb * 16 + k) * L + l] = a[l][k];
      }
    }
}
#endif
#endif
