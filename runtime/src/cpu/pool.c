/* cpu/pool.c: 2-d max and average pooling on the CPU, forward and backward. Each plane (one
   channel of one image) is independent; kiln's pool takes the planes in ranges. Max pooling saves
   the index (h * W + w) of each window's maximum; its backward adds grad there. */
#include "cpu.h"
#include "dtype_math.h"
#include "nn_calls.h"
#include <math.h>
#include <string.h>

struct pool_job {
  int dt;
  int64_t H, W, OH, OW;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int count_include_pad, adaptive;
  const char *in;       /* x, or gy for the backward */
  char *out;            /* y, or gx */
  int64_t *idx;         /* max pooling's indices */
};

static void pool_job_init(struct pool_job *j, const struct kiln_call *c, const struct kiln_tensor *x,
                          const struct kiln_tensor *y) {
  int nd = x->ndim;
  j->dt = x->dtype;
  j->H = x->sizes[nd - 2]; j->W = x->sizes[nd - 1];
  j->OH = y->sizes[nd - 2]; j->OW = y->sizes[nd - 1];
  j->kh = c->ints[0]; j->kw = c->ints[1]; j->sh = c->ints[2]; j->sw = c->ints[3]; j->ph = c->ints[4]; j->pw = c->ints[5];
  if (c->op == KILN_OP_MAX_POOL2D || c->op == KILN_OP_MAX_POOL2D_BACKWARD) { j->dh = c->ints[6]; j->dw = c->ints[7]; }
  else { j->dh = j->dw = 1; j->count_include_pad = (int)c->ints[6]; j->adaptive = (int)c->ints[7]; }
}

static int64_t grain_for(int64_t per_plane) { return per_plane >= 4096 ? 1 : 4096 / (per_plane ? per_plane : 1); }

static int float_dtype(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_F32 || t->dtype == KILN_F64) return KILN_OK;
  return kiln_fail(KILN_ERR_DTYPE, "%s: %s tensors are not supported on cpu (f32 or f64; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

/* ---- max pooling ---- */

/* Each kernel is one body over dt (cpu/dtype_math.h), with a named function per dtype that
   kiln_parallel_for calls. */

/* best, at = v, i where v is larger or NaN: compared and chosen in the dtype, which gcc vectorises. */
static inline __attribute__((always_inline)) void take(int dt, double *best, int64_t *at, double v, int64_t i) {
  int t = dt == KILN_F32 ? (float)v > (float)*best || (float)v != (float)v : v > *best || v != v;
  *best = dt_select(dt, t, v, *best);
  *at = t ? i : *at;
}

/* 2 x 2 windows, stride 2, in f32, one plane, in two passes of selects that gcc vectorises (the
   general body below, over doubles, it does not): down the columns, each pair of input rows to
   one row of t (the larger, or the NaN, of the two: the lower row's on a tie of numbers, as the
   window's raster order wants) with its rank in the window (0 or 2); then across, each pair of
   t's columns to an output (rank 1 or 3 for the right one). Ties between the two columns go to
   the lower rank, and between NaNs to the higher: the first maximum in raster order, or the last
   NaN, as take() gives. With W = 2 * OW the second pass runs over the whole plane at once. */
void kiln_cpu_max2x2_plane_f32(const float *restrict x, int64_t OH, int64_t OW, int64_t W, float *restrict y,
                               int64_t *restrict idx, float *restrict t, int32_t *restrict tk, int32_t *restrict k) {
  for (int64_t oh = 0; oh < OH; oh++) {
    const float *r0 = x + 2 * oh * W, *r1 = r0 + W;
    float *to = t + oh * 2 * OW;
    int32_t *tko = tk + oh * 2 * OW;
    for (int64_t w = 0; w < 2 * OW; w++) {
      float a = r0[w], c = r1[w];
      int take = c > a || c != c;
      to[w] = take ? c : a;
      tko[w] = take ? 2 : 0;
    }
  }
  for (int64_t o = 0; o < OH * OW; o++) {
    float m0 = t[2 * o], m1 = t[2 * o + 1];
    int32_t k0 = tk[2 * o], k1 = tk[2 * o + 1] + 1;
    int n0 = m0 != m0, n1 = m1 != m1;
    int take = n1 ? (!n0 || k1 > k0) : (!n0 && (m1 > m0 || (m1 == m0 && k1 < k0)));
    y[o] = take ? m1 : m0;
    k[o] = take ? k1 : k0;
  }
  for (int64_t oh = 0; oh < OH; oh++)
    for (int64_t ow = 0; ow < OW; ow++) {
      int32_t r = k[oh * OW + ow];
      idx[oh * OW + ow] = 2 * oh * W + 2 * ow + (r & 1) + (r >> 1) * W;
    }
}

#if defined(__AVX512F__)
#include "max2x2.h"

/* 2 x 2 windows, stride 2, of an f32 plane whose width is twice the output's (W = 2 OW), sixteen
   outputs at a time: 32 values of each of the window's two rows in two vectors, split into the
   windows' left and right values (vpermt2ps), compared in raster order as take() does (a larger
   value or a NaN replaces the best: the first maximum, or the last NaN); the best's rank in the
   window (0 to 3) gives the index. Whole vectors within the plane: the lanes past the row's n
   windows read further rows (not used) and write outputs of later rows, which those write again
   (partly masked loads and stores of cold memory stall, Zen 5). */
static void max2x2_plane_avx512(const float *x, int64_t H, int64_t OH, int64_t OW, int64_t W, float *y, int64_t *idx) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t oh = 0; oh < OH; oh++)
    for (int64_t ow = 0; ow < OW; ow += 16) {
      int64_t n = OW - ow < 16 ? OW - ow : 16, o = oh * OW + ow, at0 = 2 * oh * W + 2 * ow;
      __mmask16 m16 = (__mmask16)((1u << n) - 1), mlo = n >= 8 ? 0xffff : (__mmask16)((1u << (2 * n)) - 1);
      __mmask16 mhi = n > 8 ? (__mmask16)((1u << (2 * n - 16)) - 1) : 0;
      __m512 v[4];   /* row 0's 32 values, then row 1's */
      for (int r = 0; r < 2; r++) {
        const float *src = x + at0 + r * W;
        int whole = at0 + r * W + 32 <= H * W;
        v[2 * r] = whole ? _mm512_loadu_ps(src) : _mm512_maskz_loadu_ps(mlo, src);
        v[2 * r + 1] = whole ? _mm512_loadu_ps(src + 16) : _mm512_maskz_loadu_ps(mhi, src + 16);
      }
      __m512 cand[4] = {_mm512_permutex2var_ps(v[0], even, v[1]), _mm512_permutex2var_ps(v[0], odd, v[1]),
                        _mm512_permutex2var_ps(v[2], even, v[3]), _mm512_permutex2var_ps(v[2], odd, v[3])};
      __m512i rank;
      __m512 best = kiln_max2x2_pick(cand, &rank);
      __m512i at = kiln_max2x2_index(at0, rank, W);
      __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(at)), hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(at, 1));
      if (o + 16 <= OH * OW) {
        _mm512_storeu_ps(y + o, best);
        _mm512_storeu_si512(idx + o, lo);
        _mm512_storeu_si512(idx + o + 8, hi);
      } else {
        _mm512_mask_storeu_ps(y + o, m16, best);
        _mm512_mask_storeu_epi64(idx + o, (__mmask8)m16, lo);
        _mm512_mask_storeu_epi64(idx + o + 8, (__mmask8)(m16 >> 8), hi);
      }
    }
}
#endif

static inline __attribute__((always_inline)) int pool_is_2x2(const struct pool_job *j) {
  return j->kh == 2 && j->kw == 2 && j->sh == 2 && j->sw == 2 && j->ph == 0 && j->pw == 0 && j->dh == 1 && j->dw == 1 &&
         2 * j->OH <= j->H && 2 * j->OW <= j->W;
}

static inline __attribute__((always_inline)) void max_pool_planes(int dt, const struct pool_job *j, int64_t begin, int64_t end) {
  int64_t H = j->H, W = j->W, OH = j->OH, OW = j->OW;
  /* the f32 2 x 2 planes' buffers, for planes of up to 64 x 64 outputs */
  enum { PLANE = 64 * 64 };
  float t[2 * PLANE];
  int32_t tk[2 * PLANE], k[PLANE];
  int plane2x2 = dt == KILN_F32 && pool_is_2x2(j) && 2 * OW == W && OH * OW <= PLANE;
  for (int64_t p = begin; p < end; p++) {
    const void *x = dt_at(j->in, dt, p * H * W);
    void *y = dt_at(j->out, dt, p * OH * OW);
    int64_t *idx = j->idx + p * OH * OW;
#if defined(__AVX512F__)
    if (dt == KILN_F32 && pool_is_2x2(j) && 2 * OW == W && H * W <= INT32_MAX) {
      max2x2_plane_avx512((const float *)x, H, OH, OW, W, (float *)y, idx);
      continue;
    }
#endif
    if (plane2x2) {
      kiln_cpu_max2x2_plane_f32((const float *)x, OH, OW, W, (float *)y, idx, t, tk, k);
      continue;
    }
    if (pool_is_2x2(j)) {   /* the common case, unchecked */
      for (int64_t oh = 0; oh < OH; oh++) {
        int64_t r0 = 2 * oh * W, r1 = r0 + W;   /* the window's two rows */
        for (int64_t ow = 0; ow < OW; ow++) {
          int64_t w0 = 2 * ow;
          double best = dt_load(x, dt, r0 + w0);
          int64_t bi = r0 + w0;
          take(dt, &best, &bi, dt_load(x, dt, r0 + w0 + 1), r0 + w0 + 1);
          take(dt, &best, &bi, dt_load(x, dt, r1 + w0), r1 + w0);
          take(dt, &best, &bi, dt_load(x, dt, r1 + w0 + 1), r1 + w0 + 1);
          dt_store(y, dt, oh * OW + ow, best); idx[oh * OW + ow] = bi;
        }
      }
      continue;
    }
    for (int64_t oh = 0; oh < OH; oh++) {
      int64_t hs = oh * j->sh - j->ph;
      for (int64_t ow = 0; ow < OW; ow++) {
        int64_t ws = ow * j->sw - j->pw;
        double best = -INFINITY; int64_t bi = -1;
        for (int64_t ki = 0; ki < j->kh; ki++) {
          int64_t ih = hs + ki * j->dh;
          if (ih < 0 || ih >= H) continue;
          for (int64_t kj = 0; kj < j->kw; kj++) {
            int64_t iw = ws + kj * j->dw;
            if (iw < 0 || iw >= W) continue;
            double v = dt_load(x, dt, ih * W + iw);
            if (bi < 0 || v > best || v != v) { best = v; bi = ih * W + iw; }
            if (v != v) goto found;   /* NaN wins, as in PyTorch */
          }
        }
      found:
        dt_store(y, dt, oh * OW + ow, best); idx[oh * OW + ow] = bi < 0 ? 0 : bi;
      }
    }
  }
}
static void max_pool_planes_f32(void *ctx, int64_t begin, int64_t end) { max_pool_planes(KILN_F32, ctx, begin, end); }
static void max_pool_planes_f64(void *ctx, int64_t begin, int64_t end) { max_pool_planes(KILN_F64, ctx, begin, end); }

static inline __attribute__((always_inline)) void max_pool_back_planes(int dt, const struct pool_job *j, int64_t begin, int64_t end) {
  int64_t HW = j->H * j->W, OHW = j->OH * j->OW;
  for (int64_t p = begin; p < end; p++) {
    const void *gy = dt_at(j->in, dt, p * OHW);
    const int64_t *idx = j->idx + p * OHW;
    void *gx = dt_at(j->out, dt, p * HW);
    memset(gx, 0, dt_size(dt) * (size_t)HW);
    for (int64_t o = 0; o < OHW; o++) dt_store(gx, dt, idx[o], dt_add(dt, dt_load(gx, dt, idx[o]), dt_load(gy, dt, o)));
  }
}
static void max_pool_back_planes_f32(void *ctx, int64_t begin, int64_t end) { max_pool_back_planes(KILN_F32, ctx, begin, end); }
static void max_pool_back_planes_f64(void *ctx, int64_t begin, int64_t end) { max_pool_back_planes(KILN_F64, ctx, begin, end); }

int cpu_max_pool2d(const struct kiln_call *c) {
  struct kiln_tensor *y = c->out, *ind = (struct kiln_tensor *)c->extra;
  if (c->in[0]->dtype == KILN_BF16) return cpu_max_pool2d_bf16(c);   /* cpu/bf16_pool.c */
  if (float_dtype("max_pool2d", c->in[0])) return kiln_error_code();
  if (y->numel == 0) return KILN_OK;
  struct kiln_tensor *x = kiln_cpu_contiguous(c->in[0]);
  if (!x) return kiln_error_code();
  struct pool_job j;
  memset(&j, 0, sizeof j);
  pool_job_init(&j, c, x, y);
  j.in = kiln_tensor_data(x); j.out = kiln_tensor_data(y); j.idx = kiln_tensor_data(ind);
  int64_t planes = y->numel / (j.OH * j.OW);
  kiln_parallel_for(planes, grain_for(j.OH * j.OW * j.kh * j.kw), j.dt == KILN_F32 ? max_pool_planes_f32 : max_pool_planes_f64, &j);
  kiln_tensor_release(x);
  return KILN_OK;
}

int cpu_max_pool2d_backward(const struct kiln_call *c) {
  struct kiln_tensor *gx = c->out;
  if (c->in[0]->dtype == KILN_BF16) return cpu_max_pool2d_backward_bf16(c);   /* cpu/bf16_pool.c */
  if (float_dtype("max_pool2d_backward", c->in[0])) return kiln_error_code();
  if (gx->numel == 0) return KILN_OK;
  struct kiln_tensor *gy = kiln_cpu_contiguous(c->in[0]), *ind = kiln_cpu_contiguous(c->in[1]);
  if (!gy || !ind) { kiln_tensor_release(gy); kiln_tensor_release(ind); return kiln_error_code(); }
  struct pool_job j;
  memset(&j, 0, sizeof j);
  pool_job_init(&j, c, gx, gy);
  j.in = kiln_tensor_data(gy); j.out = kiln_tensor_data(gx); j.idx = kiln_tensor_data(ind);
  int64_t planes = gx->numel / (j.H * j.W);
  if (j.OH * j.OW == 0) memset(j.out, 0, (size_t)(gx->numel * kiln_dtype_size(gx->dtype)));
  else kiln_parallel_for(planes, grain_for(j.H * j.W), j.dt == KILN_F32 ? max_pool_back_planes_f32 : max_pool_back_planes_f64, &j);
  kiln_tensor_release(gy); kiln_tensor_release(ind);
  return KILN_OK;
}

/* ---- average pooling ---- */

/* Window [*s, *e) of output row o along one dim of size n, and the count its divisor uses. */
static int64_t window(const struct pool_job *j, int64_t o, int64_t on, int64_t n, int64_t k, int64_t st, int64_t pad,
                      int64_t *s, int64_t *e) {
  if (j->adaptive) {
    *s = o * n / on;
    *e = ((o + 1) * n + on - 1) / on;
    return *e - *s;
  }
  int64_t a = o * st - pad, b = a + k < n + pad ? a + k : n + pad, padded = b - a;
  *s = a < 0 ? 0 : a;
  *e = b > n ? n : b;
  return j->count_include_pad ? padded : *e - *s;
}

/* The sum of rows [hs, he) x columns [ws, we) of a plane W wide. The sum is carried in the dtype's
   own type, which gcc does not narrow from double across a loop: one function per dtype. */
static float window_sum_f32(const float *x, int64_t W, int64_t hs, int64_t he, int64_t ws, int64_t we) {
  float s = 0;
  for (int64_t ih = hs; ih < he; ih++)
    for (int64_t iw = ws; iw < we; iw++) s += x[ih * W + iw];
  return s;
}
static double window_sum_f64(const double *x, int64_t W, int64_t hs, int64_t he, int64_t ws, int64_t we) {
  double s = 0;
  for (int64_t ih = hs; ih < he; ih++)
    for (int64_t iw = ws; iw < we; iw++) s += x[ih * W + iw];
  return s;
}

static inline __attribute__((always_inline)) void avg_pool_planes(int dt, const struct pool_job *j, int64_t begin, int64_t end) {
  int64_t H = j->H, W = j->W, OH = j->OH, OW = j->OW;
  for (int64_t p = begin; p < end; p++) {
    const void *x = dt_at(j->in, dt, p * H * W);
    void *y = dt_at(j->out, dt, p * OH * OW);
    for (int64_t oh = 0; oh < OH; oh++) {
      int64_t hs, he, ch = window(j, oh, OH, H, j->kh, j->sh, j->ph, &hs, &he);
      for (int64_t ow = 0; ow < OW; ow++) {
        int64_t ws, we, cw = window(j, ow, OW, W, j->kw, j->sw, j->pw, &ws, &we);
        int64_t count = j->count_include_pad || j->adaptive ? ch * cw : (he - hs) * (we - ws);
        double s = dt == KILN_F32 ? window_sum_f32(x, W, hs, he, ws, we) : window_sum_f64(x, W, hs, he, ws, we);
        dt_store(y, dt, oh * OW + ow, count > 0 ? dt_div(dt, s, dt_round(dt, (double)count)) : 0);
      }
    }
  }
}
static void avg_pool_planes_f32(void *ctx, int64_t begin, int64_t end) { avg_pool_planes(KILN_F32, ctx, begin, end); }
static void avg_pool_planes_f64(void *ctx, int64_t begin, int64_t end) { avg_pool_planes(KILN_F64, ctx, begin, end); }

static inline __attribute__((always_inline)) void avg_pool_back_planes(int dt, const struct pool_job *j, int64_t begin, int64_t end) {
  int64_t H = j->H, W = j->W, OH = j->OH, OW = j->OW;
  for (int64_t p = begin; p < end; p++) {
    const void *gy = dt_at(j->in, dt, p * OH * OW);
    void *gx = dt_at(j->out, dt, p * H * W);
    memset(gx, 0, dt_size(dt) * (size_t)(H * W));
    for (int64_t oh = 0; oh < OH; oh++) {
      int64_t hs, he, ch = window(j, oh, OH, H, j->kh, j->sh, j->ph, &hs, &he);
      for (int64_t ow = 0; ow < OW; ow++) {
        int64_t ws, we, cw = window(j, ow, OW, W, j->kw, j->sw, j->pw, &ws, &we);
        int64_t count = j->count_include_pad || j->adaptive ? ch * cw : (he - hs) * (we - ws);
        if (count <= 0) continue;
        double g = dt_div(dt, dt_load(gy, dt, oh * OW + ow), dt_round(dt, (double)count));
        for (int64_t ih = hs; ih < he; ih++)
          for (int64_t iw = ws; iw < we; iw++) dt_store(gx, dt, ih * W + iw, dt_add(dt, dt_load(gx, dt, ih * W + iw), g));
      }
    }
  }
}
static void avg_pool_back_planes_f32(void *ctx, int64_t begin, int64_t end) { avg_pool_back_planes(KILN_F32, ctx, begin, end); }
static void avg_pool_back_planes_f64(void *ctx, int64_t begin, int64_t end) { avg_pool_back_planes(KILN_F64, ctx, begin, end); }

int cpu_avg_pool2d(const struct kiln_call *c) {
  struct kiln_tensor *y = c->out;
  if (float_dtype("avg_pool2d", c->in[0])) return kiln_error_code();
  if (y->numel == 0) return KILN_OK;
  struct kiln_tensor *x = kiln_cpu_contiguous(c->in[0]);
  if (!x) return kiln_error_code();
  struct pool_job j;
  memset(&j, 0, sizeof j);
  pool_job_init(&j, c, x, y);
  j.in = kiln_tensor_data(x); j.out = kiln_tensor_data(y);
  int64_t planes = y->numel / (j.OH * j.OW);
  kiln_parallel_for(planes, grain_for(j.H * j.W), j.dt == KILN_F32 ? avg_pool_planes_f32 : avg_pool_planes_f64, &j);
  kiln_tensor_release(x);
  return KILN_OK;
}

int cpu_avg_pool2d_backward(const struct kiln_call *c) {
  struct kiln_tensor *gx = c->out;
  if (float_dtype("avg_pool2d_backward", c->in[0])) return kiln_error_code();
  if (gx->numel == 0) return KILN_OK;
  struct kiln_tensor *gy = kiln_cpu_contiguous(c->in[0]);
  if (!gy) return kiln_error_code();
  struct pool_job j;
  memset(&j, 0, sizeof j);
  pool_job_init(&j, c, gx, gy);
  j.in = kiln_tensor_data(gy); j.out = kiln_tensor_data(gx);
  int64_t planes = gx->numel / (j.H * j.W);
  kiln_parallel_for(planes, grain_for(j.H * j.W), j.dt == KILN_F32 ? avg_pool_back_planes_f32 : avg_pool_back_planes_f64, &j);
  kiln_tensor_release(gy);
  return KILN_OK;
}
