/* cpu/bf16_pool.c: max pooling of bf16 tensors (what autocast's max_pool2d runs on the CPU), forward
   and backward, so that a bf16 network's activations stay bf16 between its convolutions. Values are
   compared exactly (bf16 in f32); the largest wins, a NaN wins at once, as cpu/pool.c does; the
   backward adds the grads of overlapping windows in f32 and rounds once. At the avx512 level the
   common case, 2 x 2 windows of stride 2 over planes of even width, runs on the bits sixteen
   outputs a vector, and its backward writes each grad once (no f32 plane, no scatter). */
#include "cpu.h"
#include "convert.h"
#include "nn_calls.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct bpool {
  int64_t H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
  const uint16_t *in;
  uint16_t *out;
  int64_t *idx;
  int fast;   /* 2 x 2 windows, stride 2, W = 2 OW: each input in at most one window */
  int failed;
};

#if defined(__AVX512BW__)
#include "max2x2.h"

/* 2 x 2 windows, stride 2, of a plane whose width is twice the output's (W = 2 OW), sixteen
   outputs at a time: a vector of 32 values of a row holds each window's pair of that row in a
   32-bit lane, so the left one widened to f32 is the lane shifted up and the right one the lane's
   high half. The four are compared in raster order as take() does in cpu/pool.c (a larger value
   or a NaN replaces the best: the first maximum, or the last NaN), the best's own bits are the
   output, and its rank in the window (0 to 3) gives the index. */
static void max2x2_plane(const uint16_t *x, int64_t H, int64_t OH, int64_t OW, int64_t W, uint16_t *y, int64_t *idx) {
  for (int64_t oh = 0; oh < OH; oh++) {
    for (int64_t ow = 0; ow < OW; ow += 16) {
      int64_t n = OW - ow < 16 ? OW - ow : 16, o = oh * OW + ow;
      __mmask16 m16 = (__mmask16)((1u << n) - 1);
      /* whole vectors within the plane: the lanes past n write outputs of the next row, which it
         writes again; partly masked stores of cold memory stall (Zen 5) */
      int whole = o + 16 <= OH * OW;
      __m512 cand[4];
      kiln_max2x2_load_bf16(x, H, W, oh, ow, n, whole, cand);
      __m512i rank;
      __m512 best = kiln_max2x2_pick(cand, &rank);
      __m256i yv = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(best), 16));
      if (whole) _mm256_storeu_si256((void *)(y + o), yv);
      else _mm256_mask_storeu_epi16(y + o, m16, yv);
      __m512i at = kiln_max2x2_index(2 * oh * W + 2 * ow, rank, W);
      if (whole) {
        _mm512_storeu_si512(idx + o, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(at)));
        _mm512_storeu_si512(idx + o + 8, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(at, 1)));
        continue;
      }
      _mm512_mask_storeu_epi64(idx + o, (__mmask8)m16, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(at)));
      if (n > 8) _mm512_mask_storeu_epi64(idx + o + 8, (__mmask8)(m16 >> 8), _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(at, 1)));
    }
  }
}

/* The backward of max2x2_plane, each element of gx written once: gy at the maximum of its window
   (as the scatter's f32 sum rounds it: -0 as +0, a NaN quieted), 0 elsewhere and in a last odd
   row. 1 (nothing trusted) when an index is not in its own window. */
static int max2x2_back_plane(const uint16_t *gy, const int64_t *idx, int64_t H, int64_t OH, int64_t OW, int64_t W,
                             uint16_t *gx) {
  const __m512i lane2 = _mm512_slli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 1);
  const __m512i one = _mm512_set1_epi32(1), w = _mm512_set1_epi32((int)W), w1 = _mm512_set1_epi32((int)W + 1);
  const __m512i negzero = _mm512_set1_epi32(0x8000), absmask = _mm512_set1_epi32(0x7fff), inf = _mm512_set1_epi32(0x7f80);
  const __m512i quiet = _mm512_set1_epi32(0x40), zero = _mm512_setzero_si512();
  for (int64_t oh = 0; oh < OH; oh++) {
    for (int64_t ow = 0; ow < OW; ow += 16) {
      int64_t n = OW - ow < 16 ? OW - ow : 16, o = oh * OW + ow;
      __mmask16 m16 = (__mmask16)((1u << n) - 1);
      /* within the plane, whole vectors (the lanes past n are not used): partly masked loads
         of cold memory stall (Zen 5) */
      int whole = o + 16 <= OH * OW;
      __m512i g = _mm512_cvtepu16_epi32(whole ? _mm256_loadu_si256((const void *)(gy + o)) : _mm256_maskz_loadu_epi16(m16, gy + o));
      g = _mm512_mask_mov_epi32(g, _mm512_cmpeq_epi32_mask(g, negzero), zero);
      g = _mm512_mask_or_epi32(g, _mm512_cmpgt_epi32_mask(_mm512_and_si512(g, absmask), inf), g, quiet);
      __m256i lo = _mm512_cvtepi64_epi32(whole ? _mm512_loadu_si512(idx + o) : _mm512_maskz_loadu_epi64((__mmask8)m16, idx + o));
      __m256i hi = _mm512_cvtepi64_epi32(whole ? _mm512_loadu_si512(idx + o + 8)
                                               : _mm512_maskz_loadu_epi64((__mmask8)(m16 >> 8), idx + o + 8));
      __m512i at = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      __m512i local = _mm512_sub_epi32(at, _mm512_add_epi32(_mm512_set1_epi32((int)(2 * oh * W + 2 * ow)), lane2));
      __mmask16 ok = _mm512_cmpeq_epi32_mask(local, zero) | _mm512_cmpeq_epi32_mask(local, one) |
                     _mm512_cmpeq_epi32_mask(local, w) | _mm512_cmpeq_epi32_mask(local, w1);
      if ((ok & m16) != m16) return 1;
      kiln_max2x2_put_bf16(gx, H, W, OW, oh, ow, n, g, _mm512_test_epi32_mask(local, one), _mm512_cmpge_epi32_mask(local, w));
    }
  }
  if (H > 2 * OH) memset(gx + 2 * OH * W, 0, sizeof(uint16_t) * (size_t)((H - 2 * OH) * W));
  return 0;
}
#endif

static void init(struct bpool *j, const struct kiln_call *c, const struct kiln_tensor *x, const struct kiln_tensor *y) {
  int nd = x->ndim;
  j->H = x->sizes[nd - 2]; j->W = x->sizes[nd - 1]; j->OH = y->sizes[nd - 2]; j->OW = y->sizes[nd - 1];
  j->kh = c->ints[0]; j->kw = c->ints[1]; j->sh = c->ints[2]; j->sw = c->ints[3]; j->ph = c->ints[4]; j->pw = c->ints[5];
  j->dh = c->ints[6]; j->dw = c->ints[7];
  j->fast = j->kh == 2 && j->kw == 2 && j->sh == 2 && j->sw == 2 && j->ph == 0 && j->pw == 0 && j->dh == 1 && j->dw == 1 &&
            2 * j->OH <= j->H && 2 * j->OW == j->W;
}

static void max_planes(void *ctx, int64_t begin, int64_t end) {
  const struct bpool *j = ctx;
  int64_t H = j->H, W = j->W, OH = j->OH, OW = j->OW;
  /* 2 x 2 windows over planes whose width is twice the output's, of up to 64 x 64 outputs: the
     plane widened to f32 (exactly) and cpu/pool.c's vectorised plane, the maximum then read back
     from x at its index (so a NaN keeps its bits) */
  enum { PLANE = 64 * 64 };
  float xf[4 * PLANE], yf[PLANE], t[2 * PLANE];
  int32_t tk[2 * PLANE], k[PLANE];
  int plane2x2 = j->kh == 2 && j->kw == 2 && j->sh == 2 && j->sw == 2 && j->ph == 0 && j->pw == 0 && j->dh == 1 &&
                 j->dw == 1 && 2 * OH <= H && 2 * OW == W && OH * OW <= PLANE;
  for (int64_t p = begin; p < end; p++) {
    const uint16_t *x = j->in + p * H * W;
    uint16_t *y = j->out + p * OH * OW;
    int64_t *idx = j->idx + p * OH * OW;
#if defined(__AVX512BW__)
    if (j->fast && H * W <= INT32_MAX) {
      max2x2_plane(x, H, OH, OW, W, y, idx);
      continue;
    }
#endif
    if (plane2x2) {
      for (int64_t i = 0; i < 2 * OH * W; i++) xf[i] = convert_bf16_to_f32(x[i]);
      kiln_cpu_max2x2_plane_f32(xf, OH, OW, W, yf, idx, t, tk, k);
      for (int64_t o = 0; o < OH * OW; o++) y[o] = x[idx[o]];
      continue;
    }
    if (j->kh == 2 && j->kw == 2 && j->sh == 2 && j->sw == 2 && j->ph == 0 && j->pw == 0 && j->dh == 1 && j->dw == 1 &&
        2 * OH <= H && 2 * OW <= W) {   /* the common case: branch-free, so that gcc vectorises it */
      for (int64_t oh = 0; oh < OH; oh++) {
        int64_t r0 = 2 * oh * W, r1 = r0 + W;
        for (int64_t ow = 0; ow < OW; ow++) {
          int64_t w0 = 2 * ow, bi = r0 + w0;
          float best = convert_bf16_to_f32(x[r0 + w0]);
          int64_t at[3] = {r0 + w0 + 1, r1 + w0, r1 + w0 + 1};
          for (int k = 0; k < 3; k++) {   /* selects by masks: random data would mispredict branches */
            float v = convert_bf16_to_f32(x[at[k]]);
            int64_t m = -(int64_t)((v > best) | (v != v));
            uint32_t vb, bb;
            memcpy(&vb, &v, 4); memcpy(&bb, &best, 4);
            bb = (vb & (uint32_t)m) | (bb & ~(uint32_t)m);
            memcpy(&best, &bb, 4);
            bi = (at[k] & m) | (bi & ~m);
          }
          y[oh * OW + ow] = x[bi];
          idx[oh * OW + ow] = bi;
        }
      }
      continue;
    }
    for (int64_t oh = 0; oh < OH; oh++) {
      int64_t hs = oh * j->sh - j->ph;
      for (int64_t ow = 0; ow < OW; ow++) {
        int64_t ws = ow * j->sw - j->pw, bi = -1;
        float best = 0;
        for (int64_t ki = 0; ki < j->kh; ki++) {
          int64_t ih = hs + ki * j->dh;
          if (ih < 0 || ih >= H) continue;
          for (int64_t kj = 0; kj < j->kw; kj++) {
            int64_t iw = ws + kj * j->dw;
            if (iw < 0 || iw >= W) continue;
            float v = convert_bf16_to_f32(x[ih * W + iw]);
            if (bi < 0 || v > best || v != v) { best = v; bi = ih * W + iw; }
            if (v != v) goto found;   /* NaN wins, as in PyTorch */
          }
        }
      found:
        y[oh * OW + ow] = bi < 0 ? convert_f32_to_bf16(-INFINITY) : x[bi];
        idx[oh * OW + ow] = bi < 0 ? 0 : bi;
      }
    }
  }
}

int cpu_max_pool2d_bf16(const struct kiln_call *c) {
  struct kiln_tensor *y = c->out, *ind = (struct kiln_tensor *)c->extra;
  if (y->numel == 0) return KILN_OK;
  struct kiln_tensor *x = kiln_cpu_contiguous(c->in[0]);
  if (!x) return kiln_error_code();
  struct bpool j = {0};
  init(&j, c, x, y);
  j.in = kiln_tensor_data(x); j.out = kiln_tensor_data(y); j.idx = kiln_tensor_data(ind);
  int64_t planes = y->numel / (j.OH * j.OW), per = j.OH * j.OW * j.kh * j.kw;
  kiln_parallel_for(planes, per >= 4096 ? 1 : 4096 / (per ? per : 1), max_planes, &j);
  kiln_tensor_release(x);
  return KILN_OK;
}

static void max_back_planes(void *ctx, int64_t begin, int64_t end) {
  struct bpool *j = ctx;
  int64_t HW = j->H * j->W, OHW = j->OH * j->OW;
  float *acc = malloc(sizeof(float) * (size_t)HW + 16);
  if (!acc) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
  for (int64_t p = begin; p < end; p++) {
    const uint16_t *gy = j->in + p * OHW;
    const int64_t *idx = j->idx + p * OHW;
    uint16_t *gx = j->out + p * HW;
#if defined(__AVX512BW__)
    if (j->fast && HW <= INT32_MAX && !max2x2_back_plane(gy, idx, j->H, j->OH, j->OW, j->W, gx)) continue;
#endif
    memset(acc, 0, sizeof(float) * (size_t)HW);
    for (int64_t o = 0; o < OHW; o++) acc[idx[o]] += convert_bf16_to_f32(gy[o]);
    for (int64_t i = 0; i < HW; i++) gx[i] = convert_f32_to_bf16(acc[i]);
  }
  free(acc);
}

int cpu_max_pool2d_backward_bf16(const struct kiln_call *c) {
  struct kiln_tensor *gx = c->out;
  if (gx->numel == 0) return KILN_OK;
  struct kiln_tensor *gy = kiln_cpu_contiguous(c->in[0]), *ind = kiln_cpu_contiguous(c->in[1]);
  if (!gy || !ind) { kiln_tensor_release(gy); kiln_tensor_release(ind); return kiln_error_code(); }
  struct bpool j = {0};
  init(&j, c, gx, gy);
  j.in = kiln_tensor_data(gy); j.out = kiln_tensor_data(gx); j.idx = kiln_tensor_data(ind);
  int64_t HW = j.H * j.W, planes = gx->numel / HW;
  if (j.OH * j.OW == 0) memset(j.out, 0, (size_t)(gx->numel * 2));
  else kiln_parallel_for(planes, HW >= 4096 ? 1 : 4096 / HW, max_back_planes, &j);
  kiln_tensor_release(gy); kiln_tensor_release(ind);
  return j.failed ? kiln_fail(KILN_ERR_MEMORY, "max_pool2d_backward: out of memory") : KILN_OK;
}
