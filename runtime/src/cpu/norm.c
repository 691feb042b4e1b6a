/* cpu/norm.c: batch, layer and group normalisation on the CPU, forward and backward.
   Statistics accumulate in double, each over a fixed order of elements, so that results do not
   depend on the thread count. Batch norm runs one task per channel, layer and group norm one
   per row; the weight and bias grads of layer and group norm run per column / channel. */
#include "cpu.h"
#include "dtype_math.h"
#include "nn_calls.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int float_dtype(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_F32 || t->dtype == KILN_F64) return KILN_OK;
  return kiln_fail(KILN_ERR_DTYPE, "%s: %s tensors are not supported on cpu (f32 or f64; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

/* Each kernel is one body over dt (cpu/dtype_math.h), with a named function per dtype that
   kiln_parallel_for calls; the statistics are double whatever the dtype. */

/* Sums in double over eight lanes (the loops vectorise; the order is fixed): of x, of (x - m)^2,
   or of g * (x - m). */
enum lane_term { TERM_X, TERM_SQUARE, TERM_DOT };

static inline __attribute__((always_inline)) double lane_value(int dt, int term, const void *g, const void *x, int64_t i,
                                                             double m) {
  if (term == TERM_X) return dt_load(x, dt, i);
  if (term == TERM_SQUARE) return (dt_load(x, dt, i) - m) * (dt_load(x, dt, i) - m);
  return dt_load(g, dt, i) * (dt_load(x, dt, i) - m);
}
static inline __attribute__((always_inline)) double lanes(int dt, int term, const void *g, const void *x, int64_t n, double m) {
  double l[8] = {0}; int64_t i = 0;
  for (; i + 8 <= n; i += 8) for (int k = 0; k < 8; k++) l[k] += lane_value(dt, term, g, x, i + k, m);
  for (; i < n; i++) l[0] += lane_value(dt, term, g, x, i, m);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
static double sum_f32(const float *x, int64_t n) { return lanes(KILN_F32, TERM_X, NULL, x, n, 0); }
static double sum_f64(const double *x, int64_t n) { return lanes(KILN_F64, TERM_X, NULL, x, n, 0); }
static double sumsq_f32(const float *x, int64_t n, double m) { return lanes(KILN_F32, TERM_SQUARE, NULL, x, n, m); }
static double sumsq_f64(const double *x, int64_t n, double m) { return lanes(KILN_F64, TERM_SQUARE, NULL, x, n, m); }
static double dot_f32(const float *g, const float *x, int64_t n, double m) { return lanes(KILN_F32, TERM_DOT, g, x, n, m); }
static double dot_f64(const double *g, const double *x, int64_t n, double m) { return lanes(KILN_F64, TERM_DOT, g, x, n, m); }

/* sum x, sum (x - m)^2 and sum g * (x - m) of n elements from element at of x (and g). */
static inline __attribute__((always_inline)) double sum(int dt, const void *x, int64_t at, int64_t n) {
  return dt == KILN_F32 ? sum_f32(dt_at(x, dt, at), n) : sum_f64(dt_at(x, dt, at), n);
}
static inline __attribute__((always_inline)) double sumsq(int dt, const void *x, int64_t at, int64_t n, double m) {
  return dt == KILN_F32 ? sumsq_f32(dt_at(x, dt, at), n, m) : sumsq_f64(dt_at(x, dt, at), n, m);
}
static inline __attribute__((always_inline)) double dot(int dt, const void *g, const void *x, int64_t at, int64_t n, double m) {
  return dt == KILN_F32 ? dot_f32(dt_at(g, dt, at), dt_at(x, dt, at), n, m) : dot_f64(dt_at(g, dt, at), dt_at(x, dt, at), n, m);
}

/* out[i] = x[i] * scale + shift, and out[i] = t1 * g[i] + t2 * x[i] + t3, in the dtype (the scalars
   rounded to it) for n elements from element at. */
static inline __attribute__((always_inline)) void scale_shift(int dt, void *out, const void *x, int64_t at, int64_t n,
                                                              double scale, double shift) {
  void *o = dt_at(out, dt, at);
  const void *xs = dt_at(x, dt, at);
  scale = dt_round(dt, scale); shift = dt_round(dt, shift);
  for (int64_t i = 0; i < n; i++) dt_store(o, dt, i, dt_add(dt, dt_mul(dt, dt_load(xs, dt, i), scale), shift));
}
static inline __attribute__((always_inline)) void input_grad(int dt, void *gx, const void *g, const void *x, int64_t at, int64_t n,
                                                             double t1, double t2, double t3) {
  void *o = dt_at(gx, dt, at);
  const void *gs = dt_at(g, dt, at), *xs = dt_at(x, dt, at);
  t1 = dt_round(dt, t1); t2 = dt_round(dt, t2); t3 = dt_round(dt, t3);
  for (int64_t i = 0; i < n; i++) {
    /* the products in this order: gcc fuses the first into an FMA with the add */
    double a = dt_mul(dt, t1, dt_load(gs, dt, i));
    double b = dt_mul(dt, t2, dt_load(xs, dt, i));
    dt_store(o, dt, i, dt_add(dt, dt_add(dt, a, b), t3));
  }
}

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

static inline __attribute__((always_inline)) void bn_forward(int dt, const struct bn_job *j, int64_t begin, int64_t end) {
  int64_t N = j->N, C = j->C, S = j->S;
  for (int64_t c = begin; c < end; c++) {
    double mean, invstd;
    if (j->batch_stats) {
      double s = 0, q = 0, M = (double)(N * S);
      for (int64_t n = 0; n < N; n++) s += sum(dt, j->x, (n * C + c) * S, S);
      mean = M > 0 ? s / M : 0;   /* an empty batch: 0 and 1/sqrt(eps), as layer norm's rows */
      for (int64_t n = 0; n < N; n++) q += sumsq(dt, j->x, (n * C + c) * S, S, mean);
      double var = M > 0 ? q / M : 0;
      invstd = 1.0 / sqrt(var + j->eps);
      if (j->update) {
        double m = j->momentum, unbiased = M > 1 ? q / (M - 1) : var;
        dt_store(j->rmean, dt, c * j->rms, (1 - m) * dt_load(j->rmean, dt, c * j->rms) + m * mean);
        dt_store(j->rvar, dt, c * j->rvs, (1 - m) * dt_load(j->rvar, dt, c * j->rvs) + m * unbiased);
      }
    } else {
      mean = dt_load(j->rmean, dt, c * j->rms);
      invstd = 1.0 / sqrt(dt_load(j->rvar, dt, c * j->rvs) + j->eps);
    }
    dt_store(j->mean, dt, c, mean);
    dt_store(j->invstd, dt, c, invstd);
    double a = invstd * (j->w ? dt_load(j->w, dt, c) : 1);
    double shift = (j->b ? dt_load(j->b, dt, c) : 0) - mean * a;
    for (int64_t n = 0; n < N; n++) scale_shift(dt, j->y, j->x, (n * C + c) * S, S, a, shift);
  }
}
static void bn_forward_f32(void *ctx, int64_t begin, int64_t end) { bn_forward(KILN_F32, ctx, begin, end); }
static void bn_forward_f64(void *ctx, int64_t begin, int64_t end) { bn_forward(KILN_F64, ctx, begin, end); }

static inline __attribute__((always_inline)) void bn_backward(int dt, const struct bn_job *j, int64_t begin, int64_t end) {
  int64_t N = j->N, C = j->C, S = j->S;
  for (int64_t c = begin; c < end; c++) {
    double mean = dt_load(j->mean, dt, c), invstd = dt_load(j->invstd, dt, c), M = (double)(N * S);
    double sg = 0, sgx = 0;
    for (int64_t n = 0; n < N; n++) {
      sg += sum(dt, j->gy, (n * C + c) * S, S);
      sgx += dot(dt, j->gy, j->x, (n * C + c) * S, S, mean);
    }
    if (j->gw) dt_store(j->gw, dt, c, sgx * invstd);
    if (j->gb) dt_store(j->gb, dt, c, sg);
    if (!j->gx) continue;
    double a = invstd * (j->w ? dt_load(j->w, dt, c) : 1);
    /* gx = a * (gy - sg/M - (x - mean) * invstd^2 * sgx/M) = k1 * gy + k2 * x + k3 */
    double k1 = a, k2 = j->batch_stats ? -a * invstd * invstd * sgx / M : 0;
    double k3 = j->batch_stats ? -a * sg / M - k2 * mean : 0;
    for (int64_t n = 0; n < N; n++) input_grad(dt, j->gx, j->gy, j->x, (n * C + c) * S, S, k1, k2, k3);
  }
}
static void bn_backward_f32(void *ctx, int64_t begin, int64_t end) { bn_backward(KILN_F32, ctx, begin, end); }
static void bn_backward_f64(void *ctx, int64_t begin, int64_t end) { bn_backward(KILN_F64, ctx, begin, end); }

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
static inline __attribute__((always_inline)) void rn_forward(int dt, const struct rn_job *j, int64_t begin, int64_t end) {
  int64_t L = j->L;
  for (int64_t r = begin; r < end; r++) {
    const void *x = dt_at(j->x, dt, r * L);
    void *y = dt_at(j->y, dt, r * L);
    double mean = L ? sum(dt, x, 0, L) / (double)L : 0;
    double invstd = 1.0 / sqrt((L ? sumsq(dt, x, 0, L, mean) / (double)L : 0) + j->eps);
    dt_store(j->mean, dt, r, mean);
    dt_store(j->invstd, dt, r, invstd);
    double m = dt_round(dt, mean), is = dt_round(dt, invstd);
    if (!j->group) {
      for (int64_t i = 0; i < L; i++) {
        double v = dt_mul(dt, dt_sub(dt, dt_load(x, dt, i), m), is);
        dt_store(y, dt, i, dt_add(dt, dt_mul(dt, v, dt_load_or(j->w, dt, i, 1)), dt_load_or(j->b, dt, i, 0)));
      }
    } else {
      int64_t Cg = j->C / j->G, c0 = (r % j->G) * Cg, S = j->S;
      for (int64_t c = 0; c < Cg; c++) {
        double a = invstd * (j->w ? dt_load(j->w, dt, c0 + c) : 1);
        scale_shift(dt, y, x, c * S, S, a, (j->b ? dt_load(j->b, dt, c0 + c) : 0) - mean * a);
      }
    }
  }
}
static void rn_forward_f32(void *ctx, int64_t begin, int64_t end) { rn_forward(KILN_F32, ctx, begin, end); }
static void rn_forward_f64(void *ctx, int64_t begin, int64_t end) { rn_forward(KILN_F64, ctx, begin, end); }

static inline __attribute__((always_inline)) void rn_backward_rows(int dt, const struct rn_job *j, int64_t begin, int64_t end) {
  int64_t L = j->L, S = j->group ? j->S : 1, Cg = j->group ? j->C / j->G : L;
  for (int64_t r = begin; r < end; r++) {
    const void *x = dt_at(j->x, dt, r * L), *gy = dt_at(j->gy, dt, r * L);
    void *gx = dt_at(j->gx, dt, r * L);
    double mean = dt_load(j->mean, dt, r), invstd = dt_load(j->invstd, dt, r);
    int64_t c0 = j->group ? (r % j->G) * Cg : 0;
    double a = 0, bs = 0;       /* sum of gy*w, and of gy*w*(x - mean) */
    for (int64_t c = 0; c < Cg; c++) {
      double wc = j->w ? dt_load(j->w, dt, c0 + c) : 1;
      a += wc * sum(dt, gy, c * S, S);
      bs += wc * dot(dt, gy, x, c * S, S, mean);
    }
    double k2 = -invstd * invstd * invstd * bs / (double)L;
    double k3 = -invstd * a / (double)L - k2 * mean;
    for (int64_t c = 0; c < Cg; c++)
      input_grad(dt, gx, gy, x, c * S, S, invstd * (j->w ? dt_load(j->w, dt, c0 + c) : 1), k2, k3);
  }
}
static void rn_backward_rows_f32(void *ctx, int64_t begin, int64_t end) { rn_backward_rows(KILN_F32, ctx, begin, end); }
static void rn_backward_rows_f64(void *ctx, int64_t begin, int64_t end) { rn_backward_rows(KILN_F64, ctx, begin, end); }

/* Layer norm's weight and bias grads: columns [begin, end), rows in order. */
static inline __attribute__((always_inline)) void ln_backward_cols(int dt, const struct rn_job *j, int64_t begin, int64_t end) {
  int64_t L = j->L, n = end - begin;
  double *acc = calloc((size_t)(2 * n), sizeof(double)), *accb = acc + n;
  if (!acc) { __atomic_store_n((int *)&j->failed, 1, __ATOMIC_RELAXED); return; }
  for (int64_t r = 0; r < j->rows; r++) {
    const void *x = dt_at(j->x, dt, r * L + begin), *gy = dt_at(j->gy, dt, r * L + begin);
    double mean = dt_load(j->mean, dt, r), invstd = dt_load(j->invstd, dt, r);
    for (int64_t i = 0; i < n; i++) {
      double g = dt_load(gy, dt, i);
      acc[i] += g * ((dt_load(x, dt, i) - mean) * invstd);
      accb[i] += g;
    }
  }
  for (int64_t i = 0; i < n; i++) {
    if (j->gw) dt_store(j->gw, dt, begin + i, acc[i]);
    if (j->gb) dt_store(j->gb, dt, begin + i, accb[i]);
  }
  free(acc);
}
static void ln_backward_cols_f32(void *ctx, int64_t begin, int64_t end) { ln_backward_cols(KILN_F32, ctx, begin, end); }
static void ln_backward_cols_f64(void *ctx, int64_t begin, int64_t end) { ln_backward_cols(KILN_F64, ctx, begin, end); }

/* Group norm's weight and bias grads: channels [begin, end), images in order. */
static inline __attribute__((always_inline)) void gn_backward_channels(int dt, const struct rn_job *j, int64_t begin, int64_t end) {
  int64_t C = j->C, S = j->S, Cg = C / j->G, N = j->rows / j->G;
  for (int64_t c = begin; c < end; c++) {
    double sw = 0, sb = 0;
    for (int64_t n = 0; n < N; n++) {
      int64_t r = n * j->G + c / Cg;
      double mean = dt_load(j->mean, dt, r), invstd = dt_load(j->invstd, dt, r);
      sw += invstd * dot(dt, j->gy, j->x, (n * C + c) * S, S, mean);
      sb += sum(dt, j->gy, (n * C + c) * S, S);
    }
    if (j->gw) dt_store(j->gw, dt, c, sw);
    if (j->gb) dt_store(j->gb, dt, c, sb);
  }
}
static void gn_backward_channels_f32(void *ctx, int64_t begin, int64_t end) { gn_backward_channels(KILN_F32, ctx, begin, end); }
static void gn_backward_channels_f64(void *ctx, int64_t begin, int64_t end) { gn_backward_channels(KILN_F64, ctx, begin, end); }

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
