/* cpu/pool.c: 2-d max and average pooling on the CPU, forward and backward. Each plane (one
   channel of one image) is independent; kiln's pool takes the planes in ranges. Max pooling saves
   the index (h * W + w) of each window's maximum; its backward adds grad there. */
#include "cpu.h"
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

#define MAX_POOL(T, sfx)                                                                            \
static void max_pool_planes_##sfx(void *ctx, int64_t begin, int64_t end) {                          \
  const struct pool_job *j = ctx;                                                                   \
  int64_t H = j->H, W = j->W, OH = j->OH, OW = j->OW;                                               \
  for (int64_t p = begin; p < end; p++) {                                                           \
    const T *x = (const T *)j->in + p * H * W;                                                      \
    T *y = (T *)j->out + p * OH * OW;                                                               \
    int64_t *idx = j->idx + p * OH * OW;                                                            \
    if (j->kh == 2 && j->kw == 2 && j->sh == 2 && j->sw == 2 && j->ph == 0 && j->pw == 0 &&         \
        j->dh == 1 && j->dw == 1 && 2 * OH <= H && 2 * OW <= W) {   /* the common case, unchecked */  \
      for (int64_t oh = 0; oh < OH; oh++) {                                                         \
        const T *r0 = x + 2 * oh * W, *r1 = r0 + W;                                                 \
        for (int64_t ow = 0; ow < OW; ow++) {                                                       \
          int64_t w0 = 2 * ow;                                                                      \
          T best = r0[w0]; int64_t bi = 2 * oh * W + w0;                                            \
          if (r0[w0 + 1] > best || r0[w0 + 1] != r0[w0 + 1]) { best = r0[w0 + 1]; bi = 2 * oh * W + w0 + 1; } \
          if (r1[w0] > best || r1[w0] != r1[w0]) { best = r1[w0]; bi = (2 * oh + 1) * W + w0; }   \
          if (r1[w0 + 1] > best || r1[w0 + 1] != r1[w0 + 1]) { best = r1[w0 + 1]; bi = (2 * oh + 1) * W + w0 + 1; } \
          y[oh * OW + ow] = best; idx[oh * OW + ow] = bi;                                           \
        }                                                                                           \
      }                                                                                             \
      continue;                                                                                     \
    }                                                                                               \
    for (int64_t oh = 0; oh < OH; oh++) {                                                           \
      int64_t hs = oh * j->sh - j->ph;                                                              \
      for (int64_t ow = 0; ow < OW; ow++) {                                                         \
        int64_t ws = ow * j->sw - j->pw;                                                            \
        T best = -INFINITY; int64_t bi = -1;                                                        \
        for (int64_t ki = 0; ki < j->kh; ki++) {                                                    \
          int64_t ih = hs + ki * j->dh;                                                             \
          if (ih < 0 || ih >= H) continue;                                                          \
          for (int64_t kj = 0; kj < j->kw; kj++) {                                                  \
            int64_t iw = ws + kj * j->dw;                                                           \
            if (iw < 0 || iw >= W) continue;                                                        \
            T v = x[ih * W + iw];                                                                   \
            if (bi < 0 || v > best || v != v) { best = v; bi = ih * W + iw; }                       \
            if (v != v) goto found_##sfx;   /* NaN wins, as in PyTorch */                          \
          }                                                                                         \
        }                                                                                           \
      found_##sfx:                                                                                  \
        y[oh * OW + ow] = best; idx[oh * OW + ow] = bi < 0 ? 0 : bi;                                \
      }                                                                                             \
    }                                                                                               \
  }                                                                                                 \
}                                                                                                   \
static void max_pool_back_planes_##sfx(void *ctx, int64_t begin, int64_t end) {                     \
  const struct pool_job *j = ctx;                                                                   \
  int64_t HW = j->H * j->W, OHW = j->OH * j->OW;                                                    \
  for (int64_t p = begin; p < end; p++) {                                                           \
    const T *gy = (const T *)j->in + p * OHW;                                                       \
    const int64_t *idx = j->idx + p * OHW;                                                          \
    T *gx = (T *)j->out + p * HW;                                                                   \
    memset(gx, 0, sizeof(T) * (size_t)HW);                                                          \
    for (int64_t o = 0; o < OHW; o++) gx[idx[o]] += gy[o];                                          \
  }                                                                                                 \
}
MAX_POOL(float, f32)
MAX_POOL(double, f64)

int cpu_max_pool2d(const struct kiln_call *c) {
  struct kiln_tensor *y = c->out, *ind = (struct kiln_tensor *)c->extra;
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

#define AVG_POOL(T, sfx)                                                                            \
static void avg_pool_planes_##sfx(void *ctx, int64_t begin, int64_t end) {                         \
  const struct pool_job *j = ctx;                                                                   \
  int64_t H = j->H, W = j->W, OH = j->OH, OW = j->OW;                                               \
  for (int64_t p = begin; p < end; p++) {                                                           \
    const T *x = (const T *)j->in + p * H * W;                                                      \
    T *y = (T *)j->out + p * OH * OW;                                                               \
    for (int64_t oh = 0; oh < OH; oh++) {                                                           \
      int64_t hs, he, ch = window(j, oh, OH, H, j->kh, j->sh, j->ph, &hs, &he);                     \
      for (int64_t ow = 0; ow < OW; ow++) {                                                         \
        int64_t ws, we, cw = window(j, ow, OW, W, j->kw, j->sw, j->pw, &ws, &we);                   \
        int64_t count = j->count_include_pad || j->adaptive ? ch * cw : (he - hs) * (we - ws);      \
        T s = 0;                                                                                    \
        for (int64_t ih = hs; ih < he; ih++)                                                        \
          for (int64_t iw = ws; iw < we; iw++) s += x[ih * W + iw];                                 \
        y[oh * OW + ow] = count > 0 ? s / (T)count : 0;                                             \
      }                                                                                             \
    }                                                                                               \
  }                                                                                                 \
}                                                                                                   \
static void avg_pool_back_planes_##sfx(void *ctx, int64_t begin, int64_t end) {                    \
  const struct pool_job *j = ctx;                                                                   \
  int64_t H = j->H, W = j->W, OH = j->OH, OW = j->OW;                                               \
  for (int64_t p = begin; p < end; p++) {                                                           \
    const T *gy = (const T *)j->in + p * OH * OW;                                                   \
    T *gx = (T *)j->out + p * H * W;                                                                \
    memset(gx, 0, sizeof(T) * (size_t)(H * W));                                                     \
    for (int64_t oh = 0; oh < OH; oh++) {                                                           \
      int64_t hs, he, ch = window(j, oh, OH, H, j->kh, j->sh, j->ph, &hs, &he);                     \
      for (int64_t ow = 0; ow < OW; ow++) {                                                         \
        int64_t ws, we, cw = window(j, ow, OW, W, j->kw, j->sw, j->pw, &ws, &we);                   \
        int64_t count = j->count_include_pad || j->adaptive ? ch * cw : (he - hs) * (we - ws);      \
        if (count <= 0) continue;                                                                   \
        T g = gy[oh * OW + ow] / (T)count;                                                          \
        for (int64_t ih = hs; ih < he; ih++)                                                        \
          for (int64_t iw = ws; iw < we; iw++) gx[ih * W + iw] += g;                                \
      }                                                                                             \
    }                                                                                               \
  }                                                                                                 \
}
AVG_POOL(float, f32)
AVG_POOL(double, f64)

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
