/* cpu/optim.c: the optimizer updates on the CPU. All parameters of a call are seen as one range
   of elements, cut into chunks for the thread pool; each chunk runs the update loop on the
   contiguous pieces of the parameters it covers. The loops follow PyTorch's single-tensor
   algorithms operation by operation, in the parameter's dtype, and are written to vectorise:
   choices that change which buffers are read or written are hoisted out of the loops. */
#include "cpu.h"
#include "dtype_math.h"
#include "optim_calls.h"
#include <math.h>

/* The loops vectorise (gcc -O3 -march=native) when sqrt need not set errno: Adam, RMSprop and
   Adagrad run ~4x faster built with -fno-math-errno, which a pragma or attribute cannot give. */

enum { GRAIN = 32768 };

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Each update is one body over dt (cpu/dtype_math.h: f32 arithmetic stays f32) with a named
   wrapper per dtype, cpu_<op>_f32 and cpu_<op>_f64, that the driver calls. A choice that changes
   which buffers are read or written is a constant argument; a value the job's settings choose
   inside the loop is met with dt_select. */

/* PyTorch's lerp: start + w * (end - start) for a small weight, else end - (end - start) * (1 - w). */
ALWAYS_INLINE double lerp(int dt, double start, double end, double w, int small) {
  return dt_select(dt, small, dt_add(dt, start, dt_mul(dt, w, dt_sub(dt, end, start))),
                   dt_sub(dt, end, dt_mul(dt, dt_sub(dt, end, start), dt_sub(dt, 1, w))));
}

/* ---- SGD: kind 0 without momentum, 1 the first step (buf = d), 2 later steps ---- */

ALWAYS_INLINE void sgd_loop(int dt, int64_t n, void *restrict p, const void *restrict g, void *restrict buf,
                            const struct kiln_optim_job *j, const int kind) {
  const double nlr = dt_round(dt, -j->lr), wd = dt_round(dt, j->weight_decay), mom = dt_round(dt, j->momentum);
  const double damp1 = dt_round(dt, 1.0 - j->dampening);
  const int has_wd = j->weight_decay != 0, nesterov = j->nesterov;
  for (int64_t i = 0; i < n; i++) {
    double d = dt_load(g, dt, i);
    d = dt_select(dt, has_wd, dt_add(dt, d, dt_mul(dt, wd, dt_load(p, dt, i))), d);
    if (kind == 1) dt_store(buf, dt, i, d);
    if (kind == 2) { double b = dt_mul(dt, dt_load(buf, dt, i), mom); dt_store(buf, dt, i, dt_add(dt, b, dt_mul(dt, damp1, d))); }
    if (kind != 0) d = dt_select(dt, nesterov, dt_add(dt, d, dt_mul(dt, mom, dt_load(buf, dt, i))), dt_load(buf, dt, i));
    dt_store(p, dt, i, dt_add(dt, dt_load(p, dt, i), dt_mul(dt, nlr, d)));
  }
}
ALWAYS_INLINE void sgd(int dt, int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  void *p = dt_at(e->param, dt, at), *buf = e->state[0] ? dt_at(e->state[0], dt, at) : NULL;
  const void *g = dt_at(e->grad, dt, at);
  if (j->momentum == 0) sgd_loop(dt, n, p, g, NULL, j, 0);
  else if (j->first_step) sgd_loop(dt, n, p, g, buf, j, 1);
  else sgd_loop(dt, n, p, g, buf, j, 2);
}
static void cpu_sgd_f32(int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  sgd(KILN_F32, n, e, at, j);
}
static void cpu_sgd_f64(int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  sgd(KILN_F64, n, e, at, j);
}

/* ---- Adam and AdamW ---- */

ALWAYS_INLINE void adam_loop(int dt, int64_t n, void *restrict p, const void *restrict g, void *restrict m,
                             void *restrict v, void *restrict vmax, const struct kiln_optim_job *j,
                             const int amsgrad) {
  const double wd = dt_round(dt, j->weight_decay), decay = dt_round(dt, j->decay), w1 = dt_round(dt, 1.0 - j->beta1);
  const double beta2 = dt_round(dt, j->beta2), c2 = dt_round(dt, 1.0 - j->beta2);
  const double bc2 = dt_round(dt, j->bias_correction2_sqrt), eps = dt_round(dt, j->eps), nstep = dt_round(dt, -j->lr);
  const int l2 = j->weight_decay != 0 && !j->decoupled, decoupled = j->weight_decay != 0 && j->decoupled;
  const int small = fabs(w1) < 0.5;
  for (int64_t i = 0; i < n; i++) {
    double x = dt_load(p, dt, i), d = dt_load(g, dt, i);
    x = dt_select(dt, decoupled, dt_mul(dt, x, decay), x);
    d = dt_select(dt, l2, dt_add(dt, d, dt_mul(dt, wd, x)), d);
    double mi = lerp(dt, dt_load(m, dt, i), d, w1, small);
    dt_store(m, dt, i, mi);
    double vi = dt_mul(dt, dt_load(v, dt, i), beta2);
    vi = dt_add(dt, vi, dt_mul(dt, dt_mul(dt, c2, d), d));
    dt_store(v, dt, i, vi);
    if (amsgrad) { double a = dt_load(vmax, dt, i); vi = dt_select(dt, a != a || a > vi, a, vi); dt_store(vmax, dt, i, vi); }
    double den = dt_add(dt, dt_div(dt, dt_sqrt(dt, vi), bc2), eps);
    dt_store(p, dt, i, dt_add(dt, x, dt_div(dt, dt_mul(dt, nstep, mi), den)));
  }
}
ALWAYS_INLINE void adam(int dt, int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  void *p = dt_at(e->param, dt, at), *m = dt_at(e->state[0], dt, at), *v = dt_at(e->state[1], dt, at);
  void *vmax = j->amsgrad ? dt_at(e->state[2], dt, at) : NULL;
  const void *g = dt_at(e->grad, dt, at);
  if (j->amsgrad) adam_loop(dt, n, p, g, m, v, vmax, j, 1);
  else adam_loop(dt, n, p, g, m, v, NULL, j, 0);
}
static void cpu_adam_f32(int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  adam(KILN_F32, n, e, at, j);
}
static void cpu_adam_f64(int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  adam(KILN_F64, n, e, at, j);
}

/* ---- RMSprop: alpha travels as beta2 ---- */

ALWAYS_INLINE void rmsprop_loop(int dt, int64_t n, void *restrict p, const void *restrict g, void *restrict sq,
                                void *restrict buf, void *restrict ga, const struct kiln_optim_job *j,
                                const int has_momentum, const int centered) {
  const double nlr = dt_round(dt, -j->lr), wd = dt_round(dt, j->weight_decay), alpha = dt_round(dt, j->beta2);
  const double c = dt_round(dt, 1.0 - j->beta2), eps = dt_round(dt, j->eps), mom = dt_round(dt, j->momentum);
  const int has_wd = j->weight_decay != 0, small = fabs(1.0 - j->beta2) < 0.5;
  for (int64_t i = 0; i < n; i++) {
    double x = dt_load(p, dt, i), d = dt_load(g, dt, i);
    d = dt_select(dt, has_wd, dt_add(dt, d, dt_mul(dt, wd, x)), d);
    double s = dt_mul(dt, dt_load(sq, dt, i), alpha);
    s = dt_add(dt, s, dt_mul(dt, dt_mul(dt, c, d), d));
    dt_store(sq, dt, i, s);
    double avg;
    if (centered) {
      double a = lerp(dt, dt_load(ga, dt, i), d, c, small);
      dt_store(ga, dt, i, a);
      avg = dt_sqrt(dt, dt_sub(dt, s, dt_mul(dt, a, a)));   /* s + (-1 * a) * a, exactly */
    } else {
      avg = dt_sqrt(dt, s);
    }
    avg = dt_add(dt, avg, eps);
    if (has_momentum) {
      double b = dt_mul(dt, dt_load(buf, dt, i), mom);
      b = dt_add(dt, b, dt_div(dt, d, avg));
      dt_store(buf, dt, i, b);
      dt_store(p, dt, i, dt_add(dt, x, dt_mul(dt, nlr, b)));
    } else {
      dt_store(p, dt, i, dt_add(dt, x, dt_div(dt, dt_mul(dt, nlr, d), avg)));
    }
  }
}
ALWAYS_INLINE void rmsprop(int dt, int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  void *p = dt_at(e->param, dt, at), *sq = dt_at(e->state[0], dt, at);
  void *buf = e->state[1] ? dt_at(e->state[1], dt, at) : NULL, *ga = e->state[2] ? dt_at(e->state[2], dt, at) : NULL;
  const void *g = dt_at(e->grad, dt, at);
  int mom = j->momentum > 0;
  if (mom && j->centered) rmsprop_loop(dt, n, p, g, sq, buf, ga, j, 1, 1);
  else if (mom) rmsprop_loop(dt, n, p, g, sq, buf, NULL, j, 1, 0);
  else if (j->centered) rmsprop_loop(dt, n, p, g, sq, NULL, ga, j, 0, 1);
  else rmsprop_loop(dt, n, p, g, sq, NULL, NULL, j, 0, 0);
}
static void cpu_rmsprop_f32(int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  rmsprop(KILN_F32, n, e, at, j);
}
static void cpu_rmsprop_f64(int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  rmsprop(KILN_F64, n, e, at, j);
}

/* ---- Adagrad: j->lr is already decayed ---- */

ALWAYS_INLINE void adagrad(int dt, int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  void *restrict p = dt_at(e->param, dt, at), *restrict sum = dt_at(e->state[0], dt, at);
  const void *restrict g = dt_at(e->grad, dt, at);
  const double nlr = dt_round(dt, -j->lr), wd = dt_round(dt, j->weight_decay), eps = dt_round(dt, j->eps);
  const int has_wd = j->weight_decay != 0;
  for (int64_t i = 0; i < n; i++) {
    double x = dt_load(p, dt, i), d = dt_load(g, dt, i);
    d = dt_select(dt, has_wd, dt_add(dt, d, dt_mul(dt, wd, x)), d);
    double s = dt_add(dt, dt_load(sum, dt, i), dt_mul(dt, dt_mul(dt, 1, d), d));
    dt_store(sum, dt, i, s);
    double std = dt_add(dt, dt_sqrt(dt, s), eps);
    dt_store(p, dt, i, dt_add(dt, x, dt_div(dt, dt_mul(dt, nlr, d), std)));
  }
}
static void cpu_adagrad_f32(int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  adagrad(KILN_F32, n, e, at, j);
}
static void cpu_adagrad_f64(int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j) {
  adagrad(KILN_F64, n, e, at, j);
}

/* ---- the driver ---- */

typedef void (*piece_fn)(int64_t n, const struct kiln_optim_entry *e, int64_t at, const struct kiln_optim_job *j);

struct run {
  const struct kiln_optim_job *job;
  piece_fn fn;
};

/* Elements [begin, end) of the concatenated parameters. */
static void run_range(void *ctx, int64_t begin, int64_t end) {
  const struct run *r = ctx;
  const struct kiln_optim_job *j = r->job;
  const int64_t *starts = j->starts;
  int lo = 0, hi = j->n - 1;               /* the last entry whose start is <= begin */
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (starts[mid] <= begin) lo = mid; else hi = mid - 1;
  }
  for (int k = lo; k < j->n && starts[k] < end; k++) {
    int64_t a = begin > starts[k] ? begin : starts[k];
    int64_t b = end < starts[k + 1] ? end : starts[k + 1];
    if (b > a) r->fn(b - a, &j->entries[k], a - starts[k], j);
  }
}

int cpu_optim_step(const struct kiln_call *c) {
  const struct kiln_optim_job *j = c->extra;
  int f64 = j->dtype == KILN_F64;
  piece_fn fn = NULL;
  switch (c->op) {
  case KILN_OP_SGD_STEP: fn = f64 ? cpu_sgd_f64 : cpu_sgd_f32; break;
  case KILN_OP_ADAM_STEP: fn = f64 ? cpu_adam_f64 : cpu_adam_f32; break;
  case KILN_OP_RMSPROP_STEP: fn = f64 ? cpu_rmsprop_f64 : cpu_rmsprop_f32; break;
  case KILN_OP_ADAGRAD_STEP: fn = f64 ? cpu_adagrad_f64 : cpu_adagrad_f32; break;
  default: return kiln_fail(KILN_ERR_ARGUMENT, "%s: not an optimizer op", kiln_op_name(c->op));
  }
  if (j->n <= 0) return KILN_OK;
  struct run r = {j, fn};
  kiln_parallel_for(j->starts[j->n], GRAIN, run_range, &r);
  return KILN_OK;
}
