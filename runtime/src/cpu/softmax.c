/* cpu/softmax.c: softmax and log_softmax along one dim, and the negative log-likelihood loss
   (alone, or fused with log_softmax as cross entropy, with label smoothing), forward and
   backward. A tensor is seen as [outer, D, inner]: each of the outer*inner lines along the dim is
   independent; sums run in double in a fixed order: element d of a line goes to lane d % SM_LANES
   and the lanes fold in a fixed tree (whatever the layout or the thread count), which keeps
   SM_LANES adds in flight instead of one. */
#include "cpu.h"
#include "dtype_math.h"
#include "nn_calls.h"
#include "vexp.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int float_dtype(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_F32 || t->dtype == KILN_F64) return KILN_OK;
  return kiln_fail(KILN_ERR_DTYPE, "%s: %s tensors are not supported on cpu (f32 or f64; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

struct sm_job {
  int log;                    /* log_softmax */
  int64_t outer, D, inner;
  const void *x, *gy;         /* forward: x; backward: gy and y (in x) */
  void *y;
};

/* Each kernel is one body over dt (cpu/dtype_math.h), with a named function per dtype that
   kiln_parallel_for calls. */

/* exp in the dtype: f32 through kiln_vexpf, within 3e-7 of exp (cpu/vexp.h), so that loops over it
   vectorise. */
static inline __attribute__((always_inline)) double sm_exp(int dt, double v) {
  return dt == KILN_F32 ? (double)kiln_vexpf((float)v) : exp(v);
}

enum { SM_LANES = 16 };
enum sm_term { SM_V, SM_EXP, SM_DOT };
/* The lane sums of a line of D elements at stride st: of v = x[d], of exp(v - c) (v - c in the
   dtype), or of x[d] * z[d] (the softmax backward's sum of gy * y). */
static inline __attribute__((always_inline)) double sm_value(int dt, int term, const void *x, const void *z, int64_t i,
                                                           double cr) {
  if (term == SM_V) return dt_load(x, dt, i);
  if (term == SM_EXP) return sm_exp(dt, dt_sub(dt, dt_load(x, dt, i), cr));
  return dt_load(x, dt, i) * dt_load(z, dt, i);
}
static inline __attribute__((always_inline)) double sm_lanes(int dt, int term, const void *x, const void *z, int64_t D,
                                                            int64_t st, double c) {
  double l[SM_LANES] = {0};
  const double cr = dt_round(dt, c);
  int64_t d = 0;
  for (; d + SM_LANES <= D; d += SM_LANES)
    for (int k = 0; k < SM_LANES; k++) l[k] += sm_value(dt, term, x, z, (d + k) * st, cr);
  for (int k = 0; d < D; d++, k++) l[k] += sm_value(dt, term, x, z, d * st, cr);
  return kiln_fold_lanes(l, SM_LANES);
}
static double sm_sum_f32(const float *x, int64_t D, int64_t st) { return sm_lanes(KILN_F32, SM_V, x, NULL, D, st, 0); }
static double sm_sum_f64(const double *x, int64_t D, int64_t st) { return sm_lanes(KILN_F64, SM_V, x, NULL, D, st, 0); }
static double sm_sumexp_f32(const float *x, int64_t D, int64_t st, double c) { return sm_lanes(KILN_F32, SM_EXP, x, NULL, D, st, c); }
static double sm_sumexp_f64(const double *x, int64_t D, int64_t st, double c) { return sm_lanes(KILN_F64, SM_EXP, x, NULL, D, st, c); }
static double sm_dot_f32(const float *x, const float *z, int64_t D, int64_t st) { return sm_lanes(KILN_F32, SM_DOT, x, z, D, st, 0); }
static double sm_dot_f64(const double *x, const double *z, int64_t D, int64_t st) { return sm_lanes(KILN_F64, SM_DOT, x, z, D, st, 0); }

/* The max of a line (NaN if it holds one), carried in the dtype's own type: gcc does not narrow a
   value carried across a loop in double, so one function per dtype. */
static inline __attribute__((always_inline)) float line_max_f32(const float *x, int64_t D, int64_t st) {
  float m = -INFINITY;
  for (int64_t d = 0; d < D; d++) if (x[d * st] > m || x[d * st] != x[d * st]) m = x[d * st];
  return m;
}
static inline __attribute__((always_inline)) double line_max_f64(const double *x, int64_t D, int64_t st) {
  double m = -INFINITY;
  for (int64_t d = 0; d < D; d++) if (x[d * st] > m || x[d * st] != x[d * st]) m = x[d * st];
  return m;
}

/* One line: D elements at stride st. */
static inline __attribute__((always_inline)) void softmax_line(int dt, int want_log, const void *x, void *y, int64_t D, int64_t st) {
  double m = dt == KILN_F32 ? line_max_f32(x, D, st) : line_max_f64(x, D, st);
  double s = dt == KILN_F32 ? sm_sumexp_f32(x, D, st, m) : sm_sumexp_f64(x, D, st, m);
  if (want_log) {
    double ls = dt_add(dt, dt_round(dt, log(s)), m);
    for (int64_t d = 0; d < D; d++) dt_store(y, dt, d * st, dt_sub(dt, dt_load(x, dt, d * st), ls));
  } else {
    for (int64_t d = 0; d < D; d++) dt_store(y, dt, d * st, sm_exp(dt, dt_sub(dt, dt_load(x, dt, d * st), m)));
    double inv = dt_round(dt, 1.0 / s);
    for (int64_t d = 0; d < D; d++) dt_store(y, dt, d * st, dt_mul(dt, dt_load(y, dt, d * st), inv));
  }
}
static inline __attribute__((always_inline)) void softmax_lines(int dt, const struct sm_job *j, int64_t begin, int64_t end) {
  for (int64_t l = begin; l < end; l++) {
    int64_t o = l / j->inner, i = l % j->inner, off = o * j->D * j->inner + i;
    softmax_line(dt, j->log, dt_at(j->x, dt, off), dt_at(j->y, dt, off), j->D, j->inner);
  }
}
static void softmax_lines_f32(void *ctx, int64_t begin, int64_t end) { softmax_lines(KILN_F32, ctx, begin, end); }
static void softmax_lines_f64(void *ctx, int64_t begin, int64_t end) { softmax_lines(KILN_F64, ctx, begin, end); }

/* softmax: gx = y * (gy - sum(gy * y)); log_softmax: gx = gy - exp(y) * sum(gy). */
static inline __attribute__((always_inline)) void softmax_back_lines(int dt, const struct sm_job *j, int64_t begin, int64_t end) {
  int64_t D = j->D, st = j->inner;
  for (int64_t l = begin; l < end; l++) {
    int64_t o = l / j->inner, i = l % j->inner, off = o * D * st + i;
    const void *y = dt_at(j->x, dt, off), *gy = dt_at(j->gy, dt, off);
    void *gx = dt_at(j->y, dt, off);
    if (j->log) {
      double ts = dt_round(dt, dt == KILN_F32 ? sm_sum_f32(gy, D, st) : sm_sum_f64(gy, D, st));
      for (int64_t d = 0; d < D; d++)
        dt_store(gx, dt, d * st, dt_sub(dt, dt_load(gy, dt, d * st), dt_mul(dt, sm_exp(dt, dt_load(y, dt, d * st)), ts)));
    } else {
      double ts = dt_round(dt, dt == KILN_F32 ? sm_dot_f32(gy, y, D, st) : sm_dot_f64(gy, y, D, st));
      for (int64_t d = 0; d < D; d++)
        dt_store(gx, dt, d * st, dt_mul(dt, dt_load(y, dt, d * st), dt_sub(dt, dt_load(gy, dt, d * st), ts)));
    }
  }
}
static void softmax_back_lines_f32(void *ctx, int64_t begin, int64_t end) { softmax_back_lines(KILN_F32, ctx, begin, end); }
static void softmax_back_lines_f64(void *ctx, int64_t begin, int64_t end) { softmax_back_lines(KILN_F64, ctx, begin, end); }

/* An f32 line of stride 1 (the class dim of cross entropy, the last dim): the same exps as above,
   vectorised a block at a time, then summed in double in order as above. */
static void softmax_line_f32_contig(int want_log, const float *x, float *y, int64_t D) {
  enum { BLOCK = 256 };
  _Static_assert(BLOCK % SM_LANES == 0, "a block holds whole rounds of lanes");
  float e[BLOCK];
  /* the max in vector lanes (NaNs skipped: one makes the sum, and so every output, NaN, as in the
     general lines) */
  _Static_assert(SM_LANES == 16, "kiln_vf16 holds the lanes");
  kiln_vf16 ml = (kiln_vf16){0} - INFINITY;
  int64_t d1 = 0;
  for (; d1 + SM_LANES <= D; d1 += SM_LANES) {
    kiln_vf16 v;
    memcpy(&v, x + d1, sizeof v);
    kiln_vi16 up = v > ml;                            /* all ones where v is larger */
    ml = (kiln_vf16)(((kiln_vi16)v & up) | ((kiln_vi16)ml & ~up));
  }
  float m = -INFINITY;
  for (; d1 < D; d1++) if (x[d1] > m) m = x[d1];
  for (int k = 0; k < SM_LANES; k++) if (ml[k] > m) m = ml[k];
  double l[SM_LANES] = {0};
  for (int64_t d0 = 0; d0 < D; d0 += BLOCK) {
    int64_t n = D - d0 < BLOCK ? D - d0 : BLOCK;
    for (int64_t d = 0; d < n; d++) e[d] = kiln_vexpf(x[d0 + d] - m);
    if (!want_log) memcpy(y + d0, e, sizeof(float) * (size_t)n);
    int64_t d = 0;
    for (; d + SM_LANES <= n; d += SM_LANES)
      for (int k = 0; k < SM_LANES; k++) l[k] += e[d + k];
    for (int k = 0; d < n; d++, k++) l[k] += e[d];
  }
  double s = kiln_fold_lanes(l, SM_LANES);
  if (want_log) {
    float ls = (float)log(s) + m;
    for (int64_t d = 0; d < D; d++) y[d] = x[d] - ls;
  } else {
    float inv = (float)(1.0 / s);
    for (int64_t d = 0; d < D; d++) y[d] *= inv;
  }
}

static void softmax_lines_f32_fast(void *ctx, int64_t begin, int64_t end) {
  const struct sm_job *j = ctx;
  if (j->inner != 1) { softmax_lines_f32(ctx, begin, end); return; }
  for (int64_t l = begin; l < end; l++)
    softmax_line_f32_contig(j->log, (const float *)j->x + l * j->D, (float *)j->y + l * j->D, j->D);
}

static void lines_of(const struct kiln_tensor *t, int dim, struct sm_job *j) {
  j->outer = 1; j->inner = 1;
  j->D = t->ndim ? t->sizes[dim] : 1;
  for (int d = 0; d < dim; d++) j->outer *= t->sizes[d];
  for (int d = dim + 1; d < t->ndim; d++) j->inner *= t->sizes[d];
}

static int64_t line_grain(int64_t D) { return D >= 2048 ? 1 : 2048 / (D ? D : 1); }

int cpu_softmax(const struct kiln_call *c) {
  if (float_dtype(kiln_op_name(c->op), c->in[0])) return kiln_error_code();
  if (c->out->numel == 0) return KILN_OK;
  struct kiln_tensor *x = kiln_cpu_contiguous(c->in[0]);
  if (!x) return kiln_error_code();
  struct sm_job j = {.log = c->op == KILN_OP_LOG_SOFTMAX, .x = kiln_tensor_data(x), .y = kiln_tensor_data(c->out)};
  lines_of(x, (int)c->ints[0], &j);
  kiln_parallel_for(j.outer * j.inner, line_grain(j.D), x->dtype == KILN_F32 ? softmax_lines_f32_fast : softmax_lines_f64, &j);
  kiln_tensor_release(x);
  return KILN_OK;
}

int cpu_softmax_backward(const struct kiln_call *c) {
  if (float_dtype(kiln_op_name(c->op), c->in[0])) return kiln_error_code();
  if (c->out->numel == 0) return KILN_OK;
  struct kiln_tensor *gy = kiln_cpu_contiguous(c->in[0]), *y = kiln_cpu_contiguous(c->in[1]);
  int rc = KILN_OK;
  if (!gy || !y) { rc = kiln_error_code(); goto done; }
  struct sm_job j = {.log = c->op == KILN_OP_LOG_SOFTMAX_BACKWARD, .x = kiln_tensor_data(y), .gy = kiln_tensor_data(gy),
                     .y = kiln_tensor_data(c->out)};
  lines_of(y, (int)c->ints[0], &j);
  kiln_parallel_for(j.outer * j.inner, line_grain(j.D), y->dtype == KILN_F32 ? softmax_back_lines_f32 : softmax_back_lines_f64, &j);
done:
  kiln_tensor_release(gy); kiln_tensor_release(y);
  return rc;
}

/* ---- negative log-likelihood, and cross entropy ---- */

/* input [N, C, S]; target [N, S]; one position per (n, s). */
struct nll_job {
  int64_t N, C, S;
  int reduction, fused;
  int64_t ignore;
  double smoothing, total_weight, weight_sum;
  const int64_t *target;
  const void *weight;
  const void *logp;       /* [N, C, S]: the input, or the log_softmax of the fused input */
  const void *g;          /* backward: the loss's grad */
  void *loss;             /* forward: [N, S] per position */
  void *gx;
};

static inline __attribute__((always_inline)) void nll_positions(int dt, const struct nll_job *j, int64_t begin, int64_t end) {
  int64_t C = j->C, S = j->S;
  const void *w = j->weight;
  double eps = j->smoothing;
  for (int64_t q = begin; q < end; q++) {
    int64_t n = q / S, s = q % S, t = j->target[q];
    const void *lp = dt_at(j->logp, dt, n * C * S + s);
    double l = 0;
    if (t != j->ignore) {
      l = -(w ? dt_load(w, dt, t) : 1.0) * dt_load(lp, dt, t * S);
      if (eps != 0) {
        double sm = 0;
        for (int64_t c = 0; c < C; c++) sm -= (w ? dt_load(w, dt, c) : 1.0) * dt_load(lp, dt, c * S);
        l = (1 - eps) * l + eps / (double)C * sm;
      }
    }
    dt_store(j->loss, dt, q, l);
  }
}
static void nll_positions_f32(void *ctx, int64_t begin, int64_t end) { nll_positions(KILN_F32, ctx, begin, end); }
static void nll_positions_f64(void *ctx, int64_t begin, int64_t end) { nll_positions(KILN_F64, ctx, begin, end); }

static inline __attribute__((always_inline)) void nll_back_positions(int dt, const struct nll_job *j, int64_t begin, int64_t end) {
  int64_t C = j->C, S = j->S;
  const void *w = j->weight;
  double eps = j->smoothing;
  for (int64_t q = begin; q < end; q++) {
    int64_t n = q / S, s = q % S, t = j->target[q];
    void *gx = dt_at(j->gx, dt, n * C * S + s);
    double g = j->reduction == KILN_REDUCTION_NONE ? dt_load(j->g, dt, q) : dt_load(j->g, dt, 0);
    if (j->reduction == KILN_REDUCTION_MEAN) g /= j->total_weight;
    if (t == j->ignore) { for (int64_t c = 0; c < C; c++) dt_store(gx, dt, c * S, 0); continue; }
    double wt = w ? dt_load(w, dt, t) : 1.0;
    if (!j->fused) {
      for (int64_t c = 0; c < C; c++) dt_store(gx, dt, c * S, 0);
      dt_store(gx, dt, t * S, -wt * g);
      continue;
    }
    /* d/dz_c = (1-eps) wt (p_c - [c = t]) + eps/C (p_c W - w_c), W = sum of the weights */
    const void *lp = dt_at(j->logp, dt, n * C * S + s);
    double a = (1 - eps) * wt + eps / (double)C * j->weight_sum, e = eps / (double)C;
    if (S == 1 && !w && eps == 0) {   /* the common case, in the dtype so that it vectorises */
      double ga = dt_round(dt, g * a);
      for (int64_t c = 0; c < C; c++) dt_store(gx, dt, c, dt_mul(dt, ga, sm_exp(dt, dt_load(lp, dt, c))));
      dt_store(gx, dt, t, dt_load(gx, dt, t) - g * wt);
      continue;
    }
    for (int64_t c = 0; c < C; c++) {
      double p = sm_exp(dt, dt_load(lp, dt, c * S));
      dt_store(gx, dt, c * S, g * (a * p - e * (w ? dt_load(w, dt, c) : 1.0)));
    }
    dt_store(gx, dt, t * S, dt_load(gx, dt, t * S) - g * (1 - eps) * wt);
  }
}
static void nll_back_positions_f32(void *ctx, int64_t begin, int64_t end) { nll_back_positions(KILN_F32, ctx, begin, end); }
static void nll_back_positions_f64(void *ctx, int64_t begin, int64_t end) { nll_back_positions(KILN_F64, ctx, begin, end); }

static void nll_shape(const struct kiln_tensor *input, struct nll_job *j) {
  j->N = input->sizes[0]; j->C = input->sizes[1]; j->S = 1;
  for (int d = 2; d < input->ndim; d++) j->S *= input->sizes[d];
}

int cpu_nll_loss(const struct kiln_call *c) {
  struct kiln_nll_extra *ex = (struct kiln_nll_extra *)c->extra;
  if (float_dtype(kiln_op_name(c->op), c->in[0])) return kiln_error_code();
  struct kiln_tensor *input = kiln_cpu_contiguous(c->in[0]), *target = kiln_cpu_contiguous(c->in[1]);
  struct kiln_tensor *weight = c->in[2] ? kiln_cpu_contiguous(c->in[2]) : NULL, *losses = NULL;
  int rc = KILN_OK;
  if (!input || !target || (c->in[2] && !weight)) { rc = kiln_error_code(); goto done; }
  struct nll_job j = {.reduction = (int)c->ints[0], .ignore = c->ints[1], .fused = (int)c->ints[2],
                      .smoothing = c->scalar[0], .target = kiln_tensor_data(target),
                      .weight = weight ? kiln_tensor_data(weight) : NULL};
  nll_shape(input, &j);
  int f32 = input->dtype == KILN_F32;
  /* Check every target before computing anything. */
  int64_t P = j.N * j.S;
  double total = 0;
  for (int64_t q = 0; q < P; q++) {
    int64_t t = j.target[q];
    if (t == j.ignore) continue;
    if (t < 0 || t >= j.C) {
      rc = kiln_fail(KILN_ERR_INDEX, "%s: target index %lld out of range for %lld classes (target %s; C counts from 0)",
                     c->ints[2] ? "cross_entropy" : "nll_loss", (long long)t, (long long)j.C, kiln_shape_string(target));
      goto done;
    }
    total += j.weight ? (f32 ? ((const float *)j.weight)[t] : ((const double *)j.weight)[t]) : 1.0;
  }
  ex->total_weight = total;
  if (j.fused) {
    struct sm_job sj = {.log = 1, .x = kiln_tensor_data(input), .y = kiln_tensor_data(ex->logp)};
    lines_of(input, 1, &sj);
    if (input->numel)
      kiln_parallel_for(sj.outer * sj.inner, line_grain(sj.D), f32 ? softmax_lines_f32_fast : softmax_lines_f64, &sj);
    j.logp = kiln_tensor_data(ex->logp);
  } else {
    j.logp = kiln_tensor_data(input);
  }
  if (j.reduction == KILN_REDUCTION_NONE) {
    j.loss = kiln_tensor_data(c->out);
    kiln_parallel_for(P, 1024, f32 ? nll_positions_f32 : nll_positions_f64, &j);
  } else {
    losses = kiln_tensor_empty(1, &P, input->dtype, input->device);
    if (!losses) { rc = kiln_error_code(); goto done; }
    j.loss = kiln_tensor_data(losses);
    kiln_parallel_for(P, 1024, f32 ? nll_positions_f32 : nll_positions_f64, &j);
    double s = 0;
    for (int64_t q = 0; q < P; q++) s += f32 ? ((const float *)j.loss)[q] : ((const double *)j.loss)[q];
    if (j.reduction == KILN_REDUCTION_MEAN) s /= total;   /* 0/0 = NaN when every target is ignored, as in PyTorch */
    kiln_store_f64(kiln_tensor_data(c->out), c->out->dtype, s);
  }
done:
  kiln_tensor_release(input); kiln_tensor_release(target); kiln_tensor_release(weight); kiln_tensor_release(losses);
  return rc;
}

int cpu_nll_loss_backward(const struct kiln_call *c) {
  if (float_dtype(kiln_op_name(c->op), c->out)) return kiln_error_code();
  struct kiln_tensor *g = kiln_cpu_contiguous(c->in[0]), *target = kiln_cpu_contiguous(c->in[1]);
  struct kiln_tensor *weight = c->in[2] ? kiln_cpu_contiguous(c->in[2]) : NULL;
  struct kiln_tensor *logp = c->in[3] ? kiln_cpu_contiguous(c->in[3]) : NULL;
  int rc = KILN_OK;
  if (!g || !target || (c->in[2] && !weight) || (c->in[3] && !logp)) { rc = kiln_error_code(); goto done; }
  struct nll_job j = {.reduction = (int)c->ints[0], .ignore = c->ints[1], .fused = (int)c->ints[2],
                      .smoothing = c->scalar[0], .total_weight = c->scalar[1], .target = kiln_tensor_data(target),
                      .weight = weight ? kiln_tensor_data(weight) : NULL, .logp = logp ? kiln_tensor_data(logp) : NULL,
                      .g = kiln_tensor_data(g), .gx = kiln_tensor_data(c->out)};
  nll_shape(c->out, &j);
  int f32 = c->out->dtype == KILN_F32;
  j.weight_sum = (double)j.C;
  if (j.weight) {
    j.weight_sum = 0;
    for (int64_t k = 0; k < j.C; k++) j.weight_sum += f32 ? ((const float *)j.weight)[k] : ((const double *)j.weight)[k];
  }
  if (j.fused && !j.logp) { rc = kiln_fail(KILN_ERR_ARGUMENT, "cross_entropy_backward: the saved log_softmax is missing"); goto done; }
  if (c->out->numel)
    kiln_parallel_for(j.N * j.S, 256, f32 ? nll_back_positions_f32 : nll_back_positions_f64, &j);
done:
  kiln_tensor_release(g); kiln_tensor_release(target); kiln_tensor_release(weight); kiln_tensor_release(logp);
  return rc;
}
