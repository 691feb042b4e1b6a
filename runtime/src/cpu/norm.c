/* cpu/norm.c: batch, layer and group normalisation on the CPU, forward and backward.
   Statistics accumulate in double, each over a fixed order of elements, so that results do not
   depend on the thread count. Batch norm runs one task per channel, layer and group norm one
   per row; the weight and bias grads of layer and group norm run per column / channel. */
#include "cpu.h"
#include "nn_calls.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int float_dtype(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_F32 || t->dtype == KILN_F64) return KILN_OK;
  return kiln_fail(KILN_ERR_DTYPE, "%s: %s tensors are not supported on cpu (f32 or f64; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

/* Sums in double over eight lanes (the loops vectorise; the order is fixed). */
#define SUMS(T, sfx)                                                                                \
static double sum_##sfx(const T *x, int64_t n) {                                                    \
  double l[8] = {0}; int64_t i = 0;                                                                 \
  for (; i + 8 <= n; i += 8) for (int k = 0; k < 8; k++) l[k] += x[i + k];                          \
  for (; i < n; i++) l[0] += x[i];                                                                  \
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));                         \
}                                                                                                   \
static double sumsq_##sfx(const T *x, int64_t n, double m) {      /* sum (x - m)^2 */              \
  double l[8] = {0}; int64_t i = 0;                                                                 \
  for (; i + 8 <= n; i += 8) for (int k = 0; k < 8; k++) { double d = x[i + k] - m; l[k] += d * d; } \
  for (; i < n; i++) { double d = x[i] - m; l[0] += d * d; }                                        \
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));                         \
}                                                                                                   \
static double dot_##sfx(const T *g, const T *x, int64_t n, double m) {   /* sum g * (x - m) */     \
  double l[8] = {0}; int64_t i = 0;                                                                 \
  for (; i + 8 <= n; i += 8) for (int k = 0; k < 8; k++) l[k] += (double)g[i + k] * (x[i + k] - m); \
  for (; i < n; i++) l[0] += (double)g[i] * (x[i] - m);                                             \
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));                         \
}
SUMS(float, f32)
SUMS(double, f64)

/* ---- batch norm: x [N, C, S] ---- */

struct bn_job {
  int64_t N, C, S;
  int batch_stats, update;
  double eps, momentum;
  const void *x, *w, *b, *gy;
  void *y, *mean, *invstd, *gx, *gw, *gb;
  void *rmean, *rvar;          /* running stats, with their element strides */
  int64_t rms, rvs;
};

#define BATCH_NORM(T, sfx)                                                                          \
static void bn_forward_##sfx(void *ctx, int64_t begin, int64_t end) {                               \
  const struct bn_job *j = ctx;                                                                     \
  int64_t N = j->N, C = j->C, S = j->S;                                                             \
  const T *x = j->x, *w = j->w, *b = j->b;                                                          \
  T *y = j->y, *rm = j->rmean, *rv = j->rvar;                                                       \
  for (int64_t c = begin; c < end; c++) {                                                           \
    double mean, invstd;                                                                            \
    if (j->batch_stats) {                                                                           \
      double s = 0, q = 0, M = (double)(N * S);                                                     \
      for (int64_t n = 0; n < N; n++) s += sum_##sfx(x + (n * C + c) * S, S);                       \
      mean = M > 0 ? s / M : 0;   /* an empty batch: 0 and 1/sqrt(eps), as layer norm's rows */   \
      for (int64_t n = 0; n < N; n++) q += sumsq_##sfx(x + (n * C + c) * S, S, mean);               \
      double var = M > 0 ? q / M : 0;                                                               \
      invstd = 1.0 / sqrt(var + j->eps);                                                            \
      if (j->update) {                                                                              \
        double m = j->momentum, unbiased = M > 1 ? q / (M - 1) : var;                               \
        rm[c * j->rms] = (T)((1 - m) * rm[c * j->rms] + m * mean);                                  \
        rv[c * j->rvs] = (T)((1 - m) * rv[c * j->rvs] + m * unbiased);                              \
      }                                                                                             \
    } else {                                                                                        \
      mean = rm[c * j->rms];                                                                        \
      invstd = 1.0 / sqrt((double)rv[c * j->rvs] + j->eps);                                         \
    }                                                                                               \
    ((T *)j->mean)[c] = (T)mean;                                                                    \
    ((T *)j->invstd)[c] = (T)invstd;                                                                \
    double a = invstd * (w ? w[c] : 1);                                                             \
    T scale = (T)a, shift = (T)((b ? b[c] : 0) - mean * a);                                         \
    for (int64_t n = 0; n < N; n++) {                                                               \
      const T *xs = x + (n * C + c) * S;                                                            \
      T *ys = y + (n * C + c) * S;                                                                  \
      for (int64_t s = 0; s < S; s++) ys[s] = xs[s] * scale + shift;                                \
    }                                                                                               \
  }                                                                                                 \
}                                                                                                   \
static void bn_backward_##sfx(void *ctx, int64_t begin, int64_t end) {                              \
  const struct bn_job *j = ctx;                                                                     \
  int64_t N = j->N, C = j->C, S = j->S;                                                             \
  const T *x = j->x, *w = j->w, *gy = j->gy;                                                        \
  for (int64_t c = begin; c < end; c++) {                                                           \
    double mean = ((const T *)j->mean)[c], invstd = ((const T *)j->invstd)[c], M = (double)(N * S);  \
    double sg = 0, sgx = 0;                                                                         \
    for (int64_t n = 0; n < N; n++) {                                                               \
      sg += sum_##sfx(gy + (n * C + c) * S, S);                                                     \
      sgx += dot_##sfx(gy + (n * C + c) * S, x + (n * C + c) * S, S, mean);                         \
    }                                                                                               \
    if (j->gw) ((T *)j->gw)[c] = (T)(sgx * invstd);                                                 \
    if (j->gb) ((T *)j->gb)[c] = (T)sg;                                                             \
    if (!j->gx) continue;                                                                           \
    double a = invstd * (w ? w[c] : 1);                                                             \
    /* gx = a * (gy - sg/M - (x - mean) * invstd^2 * sgx/M) = k1 * gy + k2 * x + k3 */             \
    double k1 = a, k2 = j->batch_stats ? -a * invstd * invstd * sgx / M : 0;                        \
    double k3 = j->batch_stats ? -a * sg / M - k2 * mean : 0;                                       \
    T t1 = (T)k1, t2 = (T)k2, t3 = (T)k3;                                                           \
    for (int64_t n = 0; n < N; n++) {                                                               \
      const T *xs = x + (n * C + c) * S, *gs = gy + (n * C + c) * S;                                \
      T *o = (T *)j->gx + (n * C + c) * S;                                                          \
      for (int64_t s = 0; s < S; s++) o[s] = t1 * gs[s] + t2 * xs[s] + t3;                          \
    }                                                                                               \
  }                                                                                                 \
}
BATCH_NORM(float, f32)
BATCH_NORM(double, f64)

static void bn_shape(const struct kiln_tensor *x, struct bn_job *j) {
  j->N = x->sizes[0]; j->C = x->ndim > 1 ? x->sizes[1] : 1; j->S = 1;
  for (int d = 2; d < x->ndim; d++) j->S *= x->sizes[d];
}

static void *data_or_null(const struct kiln_tensor *t) { return t ? kiln_tensor_data(t) : NULL; }

int cpu_batch_norm(const struct kiln_call *c) {
  const struct kiln_norm_stats *st = c->extra;
  if (float_dtype("batch_norm", c->in[0])) return kiln_error_code();
  struct kiln_tensor *x = kiln_cpu_contiguous(c->in[0]), *w = c->in[1] ? kiln_cpu_contiguous(c->in[1]) : NULL;
  struct kiln_tensor *b = c->in[2] ? kiln_cpu_contiguous(c->in[2]) : NULL;
  int rc = KILN_OK;
  if (!x || (c->in[1] && !w) || (c->in[2] && !b)) { rc = kiln_error_code(); goto done; }
  struct bn_job j = {.batch_stats = (int)c->ints[0], .update = (int)c->ints[1], .eps = c->scalar[0], .momentum = c->scalar[1]};
  bn_shape(x, &j);
  j.x = kiln_tensor_data(x); j.w = data_or_null(w); j.b = data_or_null(b);
  j.y = kiln_tensor_data(c->out); j.mean = kiln_tensor_data(st->mean); j.invstd = kiln_tensor_data(st->invstd);
  j.rmean = data_or_null(st->running_mean); j.rvar = data_or_null(st->running_var);
  j.rms = st->running_mean ? st->running_mean->strides[0] : 0;
  j.rvs = st->running_var ? st->running_var->strides[0] : 0;
  int64_t per = j.N * j.S;
  kiln_parallel_for(j.C, per >= 4096 ? 1 : 4096 / (per ? per : 1), x->dtype == KILN_F32 ? bn_forward_f32 : bn_forward_f64, &j);
done:
  kiln_tensor_release(x); kiln_tensor_release(w); kiln_tensor_release(b);
  return rc;
}

int cpu_batch_norm_backward(const struct kiln_call *c) {
  const struct kiln_norm_grads *gr = c->extra;
  if (float_dtype("batch_norm_backward", c->in[0])) return kiln_error_code();
  struct kiln_tensor *gy = kiln_cpu_contiguous(c->in[0]), *x = kiln_cpu_contiguous(c->in[1]);
  struct kiln_tensor *w = c->in[2] ? kiln_cpu_contiguous(c->in[2]) : NULL;
  struct kiln_tensor *mean = kiln_cpu_contiguous(gr->mean), *invstd = kiln_cpu_contiguous(gr->invstd);
  int rc = KILN_OK;
  if (!gy || !x || (c->in[2] && !w) || !mean || !invstd) { rc = kiln_error_code(); goto done; }
  struct bn_job j = {.batch_stats = (int)c->ints[0]};
  bn_shape(x, &j);
  j.x = kiln_tensor_data(x); j.w = data_or_null(w); j.gy = kiln_tensor_data(gy);
  j.mean = kiln_tensor_data(mean); j.invstd = kiln_tensor_data(invstd);
  j.gx = data_or_null(gr->gx); j.gw = data_or_null(gr->gw); j.gb = data_or_null(gr->gb);
  int64_t per = j.N * j.S;
  kiln_parallel_for(j.C, per >= 4096 ? 1 : 4096 / (per ? per : 1), x->dtype == KILN_F32 ? bn_backward_f32 : bn_backward_f64, &j);
done:
  kiln_tensor_release(gy); kiln_tensor_release(x); kiln_tensor_release(w);
  kiln_tensor_release(mean); kiln_tensor_release(invstd);
  return rc;
}

/* ---- layer and group norm: rows of L contiguous elements; the affine params per column
   (layer norm: column d of D = L) or per channel (group norm: channel of S elements) ---- */

struct rn_job {
  int64_t rows, L;         /* rows and their length */
  int64_t C, G, S;         /* group norm: channels, groups, elements per channel; layer norm: C = L, G = 1, S = 1 */
  int group;               /* 1: group norm */
  double eps;
  const void *x, *w, *b, *gy;
  void *y, *mean, *invstd, *gx, *gw, *gb;
  int failed;
};

/* The channel of element i of row r: layer norm: i; group norm: (r % G) * (C / G) + i / S. */
#define ROW_NORM(T, sfx)                                                                            \
static void rn_forward_##sfx(void *ctx, int64_t begin, int64_t end) {                               \
  const struct rn_job *j = ctx;                                                                     \
  int64_t L = j->L;                                                                                 \
  const T *w = j->w, *b = j->b;                                                                     \
  for (int64_t r = begin; r < end; r++) {                                                           \
    const T *x = (const T *)j->x + r * L;                                                           \
    T *y = (T *)j->y + r * L;                                                                       \
    double mean = L ? sum_##sfx(x, L) / (double)L : 0;                                              \
    double invstd = 1.0 / sqrt((L ? sumsq_##sfx(x, L, mean) / (double)L : 0) + j->eps);            \
    ((T *)j->mean)[r] = (T)mean;                                                                    \
    ((T *)j->invstd)[r] = (T)invstd;                                                                \
    T m = (T)mean, is = (T)invstd;                                                                  \
    if (!j->group) {                                                                                \
      for (int64_t i = 0; i < L; i++) {                                                             \
        T v = (x[i] - m) * is;                                                                      \
        y[i] = v * (w ? w[i] : 1) + (b ? b[i] : 0);                                                 \
      }                                                                                             \
    } else {                                                                                        \
      int64_t Cg = j->C / j->G, c0 = (r % j->G) * Cg, S = j->S;                                     \
      for (int64_t c = 0; c < Cg; c++) {                                                            \
        double a = invstd * (w ? w[c0 + c] : 1);                                                    \
        T scale = (T)a, shift = (T)((b ? b[c0 + c] : 0) - mean * a);                                \
        for (int64_t s = 0; s < S; s++) y[c * S + s] = x[c * S + s] * scale + shift;                \
      }                                                                                             \
    }                                                                                               \
  }                                                                                                 \
}                                                                                                   \
static void rn_backward_rows_##sfx(void *ctx, int64_t begin, int64_t end) {                         \
  const struct rn_job *j = ctx;                                                                     \
  int64_t L = j->L, S = j->group ? j->S : 1, Cg = j->group ? j->C / j->G : L;                       \
  const T *w = j->w;                                                                                \
  for (int64_t r = begin; r < end; r++) {                                                           \
    const T *x = (const T *)j->x + r * L, *gy = (const T *)j->gy + r * L;                           \
    T *gx = (T *)j->gx + r * L;                                                                     \
    double mean = ((const T *)j->mean)[r], invstd = ((const T *)j->invstd)[r];                      \
    int64_t c0 = j->group ? (r % j->G) * Cg : 0;                                                    \
    double a = 0, bs = 0;       /* sum of gy*w, and of gy*w*(x - mean) */                           \
    for (int64_t c = 0; c < Cg; c++) {                                                              \
      double wc = w ? w[c0 + c] : 1;                                                                \
      a += wc * sum_##sfx(gy + c * S, S);                                                           \
      bs += wc * dot_##sfx(gy + c * S, x + c * S, S, mean);                                         \
    }                                                                                               \
    double k2 = -invstd * invstd * invstd * bs / (double)L;                                         \
    double k3 = -invstd * a / (double)L - k2 * mean;                                                \
    T t2 = (T)k2, t3 = (T)k3;                                                                       \
    for (int64_t c = 0; c < Cg; c++) {                                                              \
      T t1 = (T)(invstd * (w ? w[c0 + c] : 1));                                                     \
      const T *xs = x + c * S, *gs = gy + c * S;                                                    \
      T *o = gx + c * S;                                                                            \
      for (int64_t s = 0; s < S; s++) o[s] = t1 * gs[s] + t2 * xs[s] + t3;                          \
    }                                                                                               \
  }                                                                                                 \
}                                                                                                   \
/* Layer norm's weight and bias grads: columns [begin, end), rows in order. */                     \
static void ln_backward_cols_##sfx(void *ctx, int64_t begin, int64_t end) {                         \
  const struct rn_job *j = ctx;                                                                     \
  int64_t L = j->L, n = end - begin;                                                                \
  double *acc = calloc((size_t)(2 * n), sizeof(double)), *accb = acc + n;                           \
  if (!acc) { __atomic_store_n((int *)&j->failed, 1, __ATOMIC_RELAXED); return; }                   \
  for (int64_t r = 0; r < j->rows; r++) {                                                           \
    const T *x = (const T *)j->x + r * L + begin, *gy = (const T *)j->gy + r * L + begin;           \
    double mean = ((const T *)j->mean)[r], invstd = ((const T *)j->invstd)[r];                      \
    for (int64_t i = 0; i < n; i++) { acc[i] += gy[i] * ((x[i] - mean) * invstd); accb[i] += gy[i]; } \
  }                                                                                                 \
  for (int64_t i = 0; i < n; i++) {                                                                 \
    if (j->gw) ((T *)j->gw)[begin + i] = (T)acc[i];                                                 \
    if (j->gb) ((T *)j->gb)[begin + i] = (T)accb[i];                                                \
  }                                                                                                 \
  free(acc);                                                                                        \
}                                                                                                   \
/* Group norm's weight and bias grads: channels [begin, end), images in order. */                  \
static void gn_backward_channels_##sfx(void *ctx, int64_t begin, int64_t end) {                     \
  const struct rn_job *j = ctx;                                                                     \
  int64_t C = j->C, S = j->S, Cg = C / j->G, N = j->rows / j->G;                                    \
  for (int64_t c = begin; c < end; c++) {                                                           \
    double sw = 0, sb = 0;                                                                          \
    for (int64_t n = 0; n < N; n++) {                                                               \
      int64_t r = n * j->G + c / Cg;                                                                \
      double mean = ((const T *)j->mean)[r], invstd = ((const T *)j->invstd)[r];                    \
      const T *x = (const T *)j->x + (n * C + c) * S, *gy = (const T *)j->gy + (n * C + c) * S;     \
      sw += invstd * dot_##sfx(gy, x, S, mean);                                                     \
      sb += sum_##sfx(gy, S);                                                                       \
    }                                                                                               \
    if (j->gw) ((T *)j->gw)[c] = (T)sw;                                                             \
    if (j->gb) ((T *)j->gb)[c] = (T)sb;                                                             \
  }                                                                                                 \
}
ROW_NORM(float, f32)
ROW_NORM(double, f64)

/* Rows and their layout for layer norm (ints[0] = normalized_ndim) or group norm (ints[0] = groups). */
static void rn_shape(const struct kiln_call *c, const struct kiln_tensor *x, struct rn_job *j) {
  j->group = c->op == KILN_OP_GROUP_NORM || c->op == KILN_OP_GROUP_NORM_BACKWARD;
  if (j->group) {
    j->G = c->ints[0];
    j->C = x->sizes[1];
    j->S = 1;
    for (int d = 2; d < x->ndim; d++) j->S *= x->sizes[d];
    j->rows = x->sizes[0] * j->G;
    j->L = j->C / j->G * j->S;
  } else {
    int k = (int)c->ints[0];
    j->L = 1;
    for (int d = x->ndim - k; d < x->ndim; d++) j->L *= x->sizes[d];
    j->rows = j->L ? x->numel / j->L : 1;
    for (int d = 0; d < x->ndim - k && j->L == 0; d++) j->rows *= x->sizes[d];
    j->C = j->L; j->G = 1; j->S = 1;
  }
}

int cpu_row_norm(const struct kiln_call *c) {
  const struct kiln_norm_stats *st = c->extra;
  const char *name = kiln_op_name(c->op);
  if (float_dtype(name, c->in[0])) return kiln_error_code();
  struct kiln_tensor *x = kiln_cpu_contiguous(c->in[0]), *w = c->in[1] ? kiln_cpu_contiguous(c->in[1]) : NULL;
  struct kiln_tensor *b = c->in[2] ? kiln_cpu_contiguous(c->in[2]) : NULL;
  int rc = KILN_OK;
  if (!x || (c->in[1] && !w) || (c->in[2] && !b)) { rc = kiln_error_code(); goto done; }
  struct rn_job j = {.eps = c->scalar[0]};
  rn_shape(c, x, &j);
  j.x = kiln_tensor_data(x); j.w = data_or_null(w); j.b = data_or_null(b);
  j.y = kiln_tensor_data(c->out); j.mean = kiln_tensor_data(st->mean); j.invstd = kiln_tensor_data(st->invstd);
  if (j.rows > 0)
    kiln_parallel_for(j.rows, j.L >= 4096 ? 1 : 4096 / (j.L ? j.L : 1), x->dtype == KILN_F32 ? rn_forward_f32 : rn_forward_f64, &j);
done:
  kiln_tensor_release(x); kiln_tensor_release(w); kiln_tensor_release(b);
  return rc;
}

int cpu_row_norm_backward(const struct kiln_call *c) {
  const struct kiln_norm_grads *gr = c->extra;
  const char *name = kiln_op_name(c->op);
  if (float_dtype(name, c->in[0])) return kiln_error_code();
  struct kiln_tensor *gy = kiln_cpu_contiguous(c->in[0]), *x = kiln_cpu_contiguous(c->in[1]);
  struct kiln_tensor *w = c->in[2] ? kiln_cpu_contiguous(c->in[2]) : NULL;
  struct kiln_tensor *mean = kiln_cpu_contiguous(gr->mean), *invstd = kiln_cpu_contiguous(gr->invstd);
  int rc = KILN_OK;
  if (!gy || !x || (c->in[2] && !w) || !mean || !invstd) { rc = kiln_error_code(); goto done; }
  struct rn_job j = {0};
  rn_shape(c, x, &j);
  j.x = kiln_tensor_data(x); j.w = data_or_null(w); j.gy = kiln_tensor_data(gy);
  j.mean = kiln_tensor_data(mean); j.invstd = kiln_tensor_data(invstd);
  j.gx = data_or_null(gr->gx); j.gw = data_or_null(gr->gw); j.gb = data_or_null(gr->gb);
  int f32 = x->dtype == KILN_F32;
  if (j.gx && j.rows > 0)
    kiln_parallel_for(j.rows, j.L >= 4096 ? 1 : 4096 / (j.L ? j.L : 1), f32 ? rn_backward_rows_f32 : rn_backward_rows_f64, &j);
  if ((j.gw || j.gb) && j.group)
    kiln_parallel_for(j.C, 1, f32 ? gn_backward_channels_f32 : gn_backward_channels_f64, &j);
  else if (j.gw || j.gb) {
    int es = kiln_dtype_size(x->dtype);
    if (j.rows == 0) {   /* no rows: the grads are zero */
      if (j.gw) memset(j.gw, 0, (size_t)(j.L * es));
      if (j.gb) memset(j.gb, 0, (size_t)(j.L * es));
    } else {
      kiln_parallel_for(j.L, 256, f32 ? ln_backward_cols_f32 : ln_backward_cols_f64, &j);
      if (j.failed) rc = kiln_fail(KILN_ERR_MEMORY, "%s: out of memory", name);
    }
  }
done:
  kiln_tensor_release(gy); kiln_tensor_release(x); kiln_tensor_release(w);
  kiln_tensor_release(mean); kiln_tensor_release(invstd);
  return rc;
}
