/* cpu/optim.c: the optimizer updates on the CPU. All parameters of a call are seen as one range
   of elements, cut into chunks for the thread pool; each chunk runs the update loop on the
   contiguous pieces of the parameters it covers. The loops follow PyTorch's single-tensor
   algorithms operation by operation, in the parameter's dtype, and are written to vectorise:
   choices that change which buffers are read or written are hoisted out of the loops. */
#include "cpu.h"
#include "optim_calls.h"
#include <math.h>

/* The loops vectorise (gcc -O3 -march=native) when sqrt need not set errno: Adam, RMSprop and
   Adagrad run ~4x faster built with -fno-math-errno, which a pragma or attribute cannot give. */

enum { GRAIN = 32768 };

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* PyTorch's lerp: start + w * (end - start) for a small weight, else end - (end - start) * (1 - w). */
#define LERP(start, end, w, small) ((small) ? (start) + (w) * ((end) - (start)) : (end) - ((end) - (start)) * (1 - (w)))

/* ---- SGD: kind 0 without momentum, 1 the first step (buf = d), 2 later steps ---- */

#define SGD_LOOPS(T, sfx)                                                                                 \
ALWAYS_INLINE void sgd_loop_##sfx(int64_t n, T *restrict p, const T *restrict g, T *restrict buf,         \
                                  const struct kiln_optim_job *j, const int kind) {                       \
  const T lr = (T)j->lr, wd = (T)j->weight_decay, mom = (T)j->momentum, damp1 = (T)(1.0 - j->dampening);  \
  const int has_wd = j->weight_decay != 0, nesterov = j->nesterov;                                        \
  for (int64_t i = 0; i < n; i++) {                                                                       \
    T d = g[i];                                                                                           \
    if (has_wd) d = d + wd * p[i];                                                                        \
    if (kind == 1) buf[i] = d;                                                                            \
    if (kind == 2) { T b = buf[i] * mom; buf[i] = b + damp1 * d; }                                        \
    if (kind != 0) d = nesterov ? d + mom * buf[i] : buf[i];                                              \
    p[i] = p[i] + (-lr) * d;                                                                              \
  }                                                                                                       \
}                                                                                                         \
static void cpu_sgd_##sfx(int64_t n, const struct kiln_optim_entry *e, int64_t at,                        \
                          const struct kiln_optim_job *j) {                                               \
  T *p = (T *)e->param + at, *buf = e->state[0] ? (T *)e->state[0] + at : NULL;                           \
  const T *g = (const T *)e->grad + at;                                                                   \
  if (j->momentum == 0) sgd_loop_##sfx(n, p, g, NULL, j, 0);                                              \
  else if (j->first_step) sgd_loop_##sfx(n, p, g, buf, j, 1);                                             \
  else sgd_loop_##sfx(n, p, g, buf, j, 2);                                                                \
}
SGD_LOOPS(float, f32)
SGD_LOOPS(double, f64)

/* ---- Adam and AdamW ---- */

#define ADAM_LOOPS(T, sfx, SQRT)                                                                          \
ALWAYS_INLINE void adam_loop_##sfx(int64_t n, T *restrict p, const T *restrict g, T *restrict m,          \
                                   T *restrict v, T *restrict vmax, const struct kiln_optim_job *j,       \
                                   const int amsgrad) {                                                   \
  const T wd = (T)j->weight_decay, decay = (T)j->decay, w1 = (T)(1.0 - j->beta1), beta2 = (T)j->beta2;    \
  const T c2 = (T)(1.0 - j->beta2), bc2 = (T)j->bias_correction2_sqrt, eps = (T)j->eps;                   \
  const T nstep = (T)(-j->lr);                                                                            \
  const int l2 = j->weight_decay != 0 && !j->decoupled, decoupled = j->weight_decay != 0 && j->decoupled; \
  const int small = fabs((double)w1) < 0.5;                                                               \
  for (int64_t i = 0; i < n; i++) {                                                                       \
    T x = p[i], d = g[i];                                                                                 \
    if (decoupled) x = x * decay;                                                                         \
    if (l2) d = d + wd * x;                                                                               \
    T mi = LERP(m[i], d, w1, small);                                                                      \
    m[i] = mi;                                                                                            \
    T vi = v[i] * beta2;                                                                                  \
    vi = vi + c2 * d * d;                                                                                 \
    v[i] = vi;                                                                                            \
    if (amsgrad) { T a = vmax[i]; vi = (a != a || a > vi) ? a : vi; vmax[i] = vi; }                       \
    T den = SQRT(vi) / bc2 + eps;                                                                         \
    p[i] = x + nstep * mi / den;                                                                          \
  }                                                                                                       \
}                                                                                                         \
static void cpu_adam_##sfx(int64_t n, const struct kiln_optim_entry *e, int64_t at,                       \
                           const struct kiln_optim_job *j) {                                              \
  T *p = (T *)e->param + at, *m = (T *)e->state[0] + at, *v = (T *)e->state[1] + at;                      \
  const T *g = (const T *)e->grad + at;                                                                   \
  if (j->amsgrad) adam_loop_##sfx(n, p, g, m, v, (T *)e->state[2] + at, j, 1);                            \
  else adam_loop_##sfx(n, p, g, m, v, NULL, j, 0);                                                        \
}
ADAM_LOOPS(float, f32, sqrtf)
ADAM_LOOPS(double, f64, sqrt)

/* ---- RMSprop: alpha travels as beta2 ---- */

#define RMSPROP_LOOPS(T, sfx, SQRT)                                                                       \
ALWAYS_INLINE void rmsprop_loop_##sfx(int64_t n, T *restrict p, const T *restrict g, T *restrict sq,      \
                                      T *restrict buf, T *restrict ga, const struct kiln_optim_job *j,    \
                                      const int has_momentum, const int centered) {                       \
  const T lr = (T)j->lr, wd = (T)j->weight_decay, alpha = (T)j->beta2, c = (T)(1.0 - j->beta2);           \
  const T eps = (T)j->eps, mom = (T)j->momentum;                                                          \
  const int has_wd = j->weight_decay != 0, small = fabs(1.0 - j->beta2) < 0.5;                            \
  for (int64_t i = 0; i < n; i++) {                                                                       \
    T x = p[i], d = g[i];                                                                                 \
    if (has_wd) d = d + wd * x;                                                                           \
    T s = sq[i] * alpha;                                                                                  \
    s = s + c * d * d;                                                                                    \
    sq[i] = s;                                                                                            \
    T avg;                                                                                                \
    if (centered) {                                                                                       \
      T a = LERP(ga[i], d, c, small);                                                                     \
      ga[i] = a;                                                                                          \
      avg = SQRT(s + (T)-1 * a * a);                                                                      \
    } else {                                                                                              \
      avg = SQRT(s);                                                                                      \
    }                                                                                                     \
    avg = avg + eps;                                                                                      \
    if (has_momentum) {                                                                                   \
      T b = buf[i] * mom;                                                                                 \
      b = b + d / avg;                                                                                    \
      buf[i] = b;                                                                                         \
      p[i] = x + (-lr) * b;                                                                               \
    } else {                                                                                              \
      p[i] = x + (-lr) * d / avg;                                                                         \
    }                                                                                                     \
  }                                                                                                       \
}                                                                                                         \
static void cpu_rmsprop_##sfx(int64_t n, const struct kiln_optim_entry *e, int64_t at,                    \
                              const struct kiln_optim_job *j) {                                           \
  T *p = (T *)e->param + at, *sq = (T *)e->state[0] + at;                                                 \
  T *buf = e->state[1] ? (T *)e->state[1] + at : NULL, *ga = e->state[2] ? (T *)e->state[2] + at : NULL;  \
  const T *g = (const T *)e->grad + at;                                                                   \
  int mom = j->momentum > 0;                                                                              \
  if (mom && j->centered) rmsprop_loop_##sfx(n, p, g, sq, buf, ga, j, 1, 1);                              \
  else if (mom) rmsprop_loop_##sfx(n, p, g, sq, buf, NULL, j, 1, 0);                                      \
  else if (j->centered) rmsprop_loop_##sfx(n, p, g, sq, NULL, ga, j, 0, 1);                               \
  else rmsprop_loop_##sfx(n, p, g, sq, NULL, NULL, j, 0, 0);                                              \
}
RMSPROP_LOOPS(float, f32, sqrtf)
RMSPROP_LOOPS(double, f64, sqrt)

/* ---- Adagrad: j->lr is already decayed ---- */

#define ADAGRAD_LOOPS(T, sfx, SQRT)                                                                       \
static void cpu_adagrad_##sfx(int64_t n, const struct kiln_optim_entry *e, int64_t at,                    \
                              const struct kiln_optim_job *j) {                                           \
  T *restrict p = (T *)e->param + at, *restrict sum = (T *)e->state[0] + at;                              \
  const T *restrict g = (const T *)e->grad + at;                                                          \
  const T nlr = (T)(-j->lr), wd = (T)j->weight_decay, eps = (T)j->eps;                                    \
  const int has_wd = j->weight_decay != 0;                                                                \
  for (int64_t i = 0; i < n; i++) {                                                                       \
    T x = p[i], d = g[i];                                                                                 \
    if (has_wd) d = d + wd * x;                                                                           \
    T s = sum[i] + (T)1 * d * d;                                                                          \
    sum[i] = s;                                                                                           \
    T std = SQRT(s) + eps;                                                                                \
    p[i] = x + nlr * d / std;                                                                             \
  }                                                                                                       \
}
ADAGRAD_LOOPS(float, f32, sqrtf)
ADAGRAD_LOOPS(double, f64, sqrt)

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
