/* optim.c: the front ends of the optimizer steps and of gradient clipping. A step checks every
   tensor of every parameter before it writes anything, then runs one kernel call per device and
   dtype over all the parameters; a non-contiguous parameter or grad goes through a contiguous copy. */
#include "internal.h"
#include "optim_calls.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NSTATE = 3, STACK_PARAMS = 64 };

struct step_spec {
  const char *name;                                /* "sgd_step" */
  int op;
  int n;
  struct kiln_tensor *const *params, *const *grads;
  struct kiln_tensor *const *state[NSTATE];        /* per-parameter lists; NULL when unused */
  const char *state_name[NSTATE];                  /* what the messages call them; NULL: unused */
};

static int same_shape(const struct kiln_tensor *a, const struct kiln_tensor *b) {
  return a->ndim == b->ndim && memcmp(a->sizes, b->sizes, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

static int is_freed(const struct kiln_tensor *t) { return t->storage && (t->storage->flags & KILN_STORAGE_FREED); }

/* A grad or state tensor of parameter i: live, and shaped, typed and placed like it. */
static int check_companion(const char *op, int i, const char *what, const struct kiln_tensor *param,
                           const struct kiln_tensor *t, int need_contiguous) {
  if (!t) return kiln_fail(KILN_ERR_ARGUMENT, "%s: parameter %d %s has a grad but no %s", op, i, kiln_shape_string(param), what);
  if (is_freed(t)) return kiln_fail(KILN_ERR_STATE, "%s: parameter %d: its %s %s was freed", op, i, what, kiln_shape_string(t));
  if (!same_shape(t, param))
    return kiln_fail(KILN_ERR_SHAPE, "%s: parameter %d: %s %s does not match the parameter's shape %s", op, i, what,
                     kiln_shape_string(t), kiln_shape_string(param));
  if (t->dtype != param->dtype)
    return kiln_fail(KILN_ERR_DTYPE, "%s: parameter %d: %s %s is %s, the parameter is %s", op, i, what,
                     kiln_shape_string(t), kiln_dtype_name(t->dtype), kiln_dtype_name(param->dtype));
  if (t->device.type != param->device.type || t->device.index != param->device.index) {
    char dev[32];
    snprintf(dev, sizeof dev, "%s", kiln_device_name(t->device));
    return kiln_fail(KILN_ERR_DEVICE, "%s: parameter %d: %s %s is on %s, the parameter on %s", op, i, what,
                     kiln_shape_string(t), dev, kiln_device_name(param->device));
  }
  if (t->storage == param->storage && t->numel > 0)
    return kiln_fail(KILN_ERR_ARGUMENT, "%s: parameter %d: %s %s shares memory with the parameter", op, i, what,
                     kiln_shape_string(t));
  if (need_contiguous && !kiln_is_contiguous(t))
    return kiln_fail(KILN_ERR_ARGUMENT, "%s: parameter %d: %s %s is not contiguous (optimizer state must be; "
                     "give it a contiguous clone)", op, i, what, kiln_shape_string(t));
  return KILN_OK;
}

static int check_all(const struct step_spec *s, int *any) {
  *any = 0;
  if (s->n < 0) return kiln_fail(KILN_ERR_ARGUMENT, "%s: %d parameters", s->name, s->n);
  if (s->n == 0) return KILN_OK;
  if (!s->params || !s->grads) return kiln_fail(KILN_ERR_ARGUMENT, "%s: the params and grads arrays are required", s->name);
  for (int i = 0; i < s->n; i++) {
    const struct kiln_tensor *p = s->params[i], *g = s->grads[i];
    if (!p) return kiln_fail(KILN_ERR_ARGUMENT, "%s: parameter %d is NULL", s->name, i);
    if (is_freed(p)) return kiln_fail(KILN_ERR_STATE, "%s: parameter %d %s was freed", s->name, i, kiln_shape_string(p));
    if (!g) continue;
    if (p->dtype != KILN_F32 && p->dtype != KILN_F64)
      return kiln_fail(KILN_ERR_DTYPE, "%s: parameter %d %s is %s (optimizers update f32 and f64 parameters)", s->name,
                       i, kiln_shape_string(p), kiln_dtype_name(p->dtype));
    if (check_companion(s->name, i, "grad", p, g, 0)) return kiln_error_code();
    for (int k = 0; k < NSTATE; k++) {
      if (!s->state_name[k]) continue;
      const struct kiln_tensor *t = s->state[k] ? s->state[k][i] : NULL;
      if (check_companion(s->name, i, s->state_name[k], p, t, 1)) return kiln_error_code();
    }
    const struct kiln_backend *be = kiln_backend_for(p->device, s->name);
    if (!be) return kiln_error_code();
    if (!be->kernel[s->op]) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: not implemented on %s", s->name, kiln_device_name(p->device));
    *any = 1;
  }
  return KILN_OK;
}

/* Run job (its scalars filled in) over every parameter that has a grad. */
static int run_step(const struct step_spec *s, struct kiln_optim_job *job) {
  int any;
  if (check_all(s, &any)) return kiln_error_code();
  if (!any) return KILN_OK;
  int n = s->n;
  struct kiln_optim_entry stack_entries[STACK_PARAMS];
  int64_t stack_starts[STACK_PARAMS + 1];
  struct kiln_tensor *stack_temps[2 * STACK_PARAMS];
  char stack_done[STACK_PARAMS];
  struct kiln_optim_entry *entries = stack_entries;
  int64_t *starts = stack_starts;
  struct kiln_tensor **temps = stack_temps;     /* [2n]: contiguous copies of param i, grad i */
  char *done = stack_done;
  void *block = NULL;
  if (n > STACK_PARAMS) {
    size_t bytes = sizeof *entries * (size_t)n + sizeof *starts * (size_t)(n + 1) + sizeof *temps * 2 * (size_t)n + (size_t)n;
    block = malloc(bytes);
    if (!block) return kiln_fail(KILN_ERR_MEMORY, "%s: out of memory for %d parameters", s->name, n);
    entries = block;
    starts = (int64_t *)(entries + n);
    temps = (struct kiln_tensor **)(starts + n + 1);
    done = (char *)(temps + 2 * n);
  }
  memset(temps, 0, sizeof *temps * 2 * (size_t)n);
  int prev = kiln_set_grad_enabled(0);
  int rc = KILN_OK;
  /* Contiguous copies first, so that a failure leaves every parameter as it was. */
  for (int i = 0; i < n && !rc; i++) {
    done[i] = s->grads[i] == NULL;
    if (done[i]) continue;
    if (!kiln_is_contiguous(s->params[i]) && !(temps[2 * i] = kiln_contiguous(s->params[i]))) rc = kiln_error_code();
    else if (!kiln_is_contiguous(s->grads[i]) && !(temps[2 * i + 1] = kiln_contiguous(s->grads[i]))) rc = kiln_error_code();
  }
  /* One kernel call per (device, dtype); nearly always one in all. */
  for (int first = 0; first < n && !rc; first++) {
    if (done[first]) continue;
    const struct kiln_tensor *p0 = s->params[first];
    int m = 0;
    starts[0] = 0;
    for (int i = first; i < n; i++) {
      const struct kiln_tensor *p = s->params[i];
      if (done[i] || p->dtype != p0->dtype || p->device.type != p0->device.type || p->device.index != p0->device.index) continue;
      done[i] = 1;
      struct kiln_optim_entry *e = &entries[m];
      e->param = kiln_tensor_data(temps[2 * i] ? temps[2 * i] : p);
      e->grad = kiln_tensor_data(temps[2 * i + 1] ? temps[2 * i + 1] : s->grads[i]);
      for (int k = 0; k < NSTATE; k++)
        e->state[k] = s->state_name[k] ? kiln_tensor_data(s->state[k][i]) : NULL;
      starts[m + 1] = starts[m] + p->numel;
      m++;
    }
    job->op = s->op;
    job->dtype = p0->dtype;
    job->n = m;
    job->entries = entries;
    job->starts = starts;
    struct kiln_call call = {.op = s->op, .extra = job};
    rc = kiln_dispatch(p0->device, &call);
  }
  for (int i = 0; i < n && !rc; i++) {
    if (!s->grads[i]) continue;
    if (temps[2 * i]) rc = kiln_copy_(s->params[i], temps[2 * i]);
    kiln_tensor_bump_version(s->params[i]);
    for (int k = 0; k < NSTATE; k++)
      if (s->state_name[k]) kiln_tensor_bump_version(s->state[k][i]);
  }
  kiln_set_grad_enabled(prev);
  for (int i = 0; i < 2 * n; i++) kiln_tensor_release(temps[i]);
  free(block);
  return rc;
}

static int check_scalar(const char *op, const char *what, double v, double lo, int lo_open, double hi, int hi_open) {
  int ok = v == v && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (!ok) {
    return kiln_fail(KILN_ERR_ARGUMENT, "%s: %s = %g (expected %s%g, %g%s)", op, what, v, lo_open ? "(" : "[", lo, hi,
                     hi_open ? ")" : "]");
  }
  return KILN_OK;
}

KILN_API int kiln_sgd_step(int n, struct kiln_tensor *const *params, struct kiln_tensor *const *grads,
                           struct kiln_tensor *const *momentum_bufs, double lr, double momentum, double dampening,
                           double weight_decay, int nesterov, int first_step) {
  const char *op = "sgd_step";
  if (check_scalar(op, "lr", lr, 0, 0, INFINITY, 1) || check_scalar(op, "momentum", momentum, 0, 0, INFINITY, 1) ||
      check_scalar(op, "weight_decay", weight_decay, 0, 0, INFINITY, 1) || check_scalar(op, "dampening", dampening, -INFINITY, 1, INFINITY, 1))
    return kiln_error_code();
  if (nesterov && (momentum <= 0 || dampening != 0))
    return kiln_fail(KILN_ERR_ARGUMENT, "%s: nesterov momentum needs momentum > 0 and dampening = 0 (got %g and %g)", op,
                     momentum, dampening);
  struct step_spec s = {op, KILN_OP_SGD_STEP, n, params, grads, {momentum_bufs}, {momentum != 0 ? "momentum buffer" : NULL}};
  struct kiln_optim_job job = {.lr = lr, .momentum = momentum, .dampening = dampening, .weight_decay = weight_decay,
                               .nesterov = nesterov != 0, .first_step = first_step != 0};
  return run_step(&s, &job);
}

KILN_API int kiln_adam_step(int n, struct kiln_tensor *const *params, struct kiln_tensor *const *grads,
                            struct kiln_tensor *const *exp_avgs, struct kiln_tensor *const *exp_avg_sqs,
                            struct kiln_tensor *const *max_exp_avg_sqs, int64_t step, double lr, double beta1,
                            double beta2, double eps, double weight_decay, int decoupled, int amsgrad) {
  const char *op = "adam_step";
  if (step < 1) return kiln_fail(KILN_ERR_ARGUMENT, "%s: step = %lld (steps count from 1)", op, (long long)step);
  if (check_scalar(op, "lr", lr, 0, 0, INFINITY, 1) || check_scalar(op, "beta1", beta1, 0, 0, 1, 1) ||
      check_scalar(op, "beta2", beta2, 0, 0, 1, 1) || check_scalar(op, "eps", eps, 0, 0, INFINITY, 1) ||
      check_scalar(op, "weight_decay", weight_decay, 0, 0, INFINITY, 1))
    return kiln_error_code();
  struct step_spec s = {op, KILN_OP_ADAM_STEP, n, params, grads, {exp_avgs, exp_avg_sqs, max_exp_avg_sqs},
                        {"exp_avg", "exp_avg_sq", amsgrad ? "max_exp_avg_sq" : NULL}};
  double bias_correction1 = 1 - pow(beta1, (double)step);
  double bias_correction2 = 1 - pow(beta2, (double)step);
  struct kiln_optim_job job = {.lr = lr / bias_correction1, .weight_decay = weight_decay, .beta1 = beta1, .beta2 = beta2,
                               .eps = eps, .bias_correction2_sqrt = sqrt(bias_correction2),
                               .decay = 1 - lr * weight_decay, .decoupled = decoupled != 0, .amsgrad = amsgrad != 0};
  return run_step(&s, &job);
}

KILN_API int kiln_rmsprop_step(int n, struct kiln_tensor *const *params, struct kiln_tensor *const *grads,
                               struct kiln_tensor *const *square_avgs, struct kiln_tensor *const *momentum_bufs,
                               struct kiln_tensor *const *grad_avgs, double lr, double alpha, double eps,
                               double weight_decay, double momentum, int centered) {
  const char *op = "rmsprop_step";
  if (check_scalar(op, "lr", lr, 0, 0, INFINITY, 1) || check_scalar(op, "alpha", alpha, 0, 0, INFINITY, 1) ||
      check_scalar(op, "eps", eps, 0, 0, INFINITY, 1) || check_scalar(op, "weight_decay", weight_decay, 0, 0, INFINITY, 1) ||
      check_scalar(op, "momentum", momentum, 0, 0, INFINITY, 1))
    return kiln_error_code();
  struct step_spec s = {op, KILN_OP_RMSPROP_STEP, n, params, grads, {square_avgs, momentum_bufs, grad_avgs},
                        {"square_avg", momentum > 0 ? "momentum buffer" : NULL, centered ? "grad_avg" : NULL}};
  struct kiln_optim_job job = {.lr = lr, .beta2 = alpha, .eps = eps, .weight_decay = weight_decay, .momentum = momentum,
                               .centered = centered != 0};
  return run_step(&s, &job);
}

KILN_API int kiln_adagrad_step(int n, struct kiln_tensor *const *params, struct kiln_tensor *const *grads,
                               struct kiln_tensor *const *sums, int64_t step, double lr, double lr_decay,
                               double weight_decay, double eps) {
  const char *op = "adagrad_step";
  if (step < 1) return kiln_fail(KILN_ERR_ARGUMENT, "%s: step = %lld (steps count from 1)", op, (long long)step);
  if (check_scalar(op, "lr", lr, 0, 0, INFINITY, 1) || check_scalar(op, "lr_decay", lr_decay, 0, 0, INFINITY, 1) ||
      check_scalar(op, "eps", eps, 0, 0, INFINITY, 1) || check_scalar(op, "weight_decay", weight_decay, 0, 0, INFINITY, 1))
    return kiln_error_code();
  struct step_spec s = {op, KILN_OP_ADAGRAD_STEP, n, params, grads, {sums}, {"sum"}};
  struct kiln_optim_job job = {.lr = lr / (1 + (double)(step - 1) * lr_decay), .weight_decay = weight_decay, .eps = eps};
  return run_step(&s, &job);
}

/* ---- gradient clipping ---- */

static int check_grads(const char *op, int n, struct kiln_tensor *const *grads) {
  if (n < 0) return kiln_fail(KILN_ERR_ARGUMENT, "%s: %d grads", op, n);
  if (n > 0 && !grads) return kiln_fail(KILN_ERR_ARGUMENT, "%s: the grads array is required", op);
  for (int i = 0; i < n; i++) {
    const struct kiln_tensor *g = grads[i];
    if (!g) continue;
    if (is_freed(g)) return kiln_fail(KILN_ERR_STATE, "%s: grad %d %s was freed", op, i, kiln_shape_string(g));
    if (!kiln_dtype_is_float(g->dtype))
      return kiln_fail(KILN_ERR_DTYPE, "%s: grad %d %s is %s (expected a float dtype)", op, i, kiln_shape_string(g),
                       kiln_dtype_name(g->dtype));
  }
  return KILN_OK;
}

KILN_API int kiln_clip_grad_norm(int n, struct kiln_tensor *const *grads, double max_norm, double norm_type,
                                 double *total_norm_out) {
  const char *op = "clip_grad_norm";
  if (!(norm_type > 0)) return kiln_fail(KILN_ERR_ARGUMENT, "%s: norm_type = %g (expected > 0, or inf)", op, norm_type);
  if (!(max_norm >= 0)) return kiln_fail(KILN_ERR_ARGUMENT, "%s: max_norm = %g (expected >= 0)", op, max_norm);
  if (check_grads(op, n, grads)) return kiln_error_code();
  /* Each grad's norm in double (the reduction kernel accumulates in double and writes the f64
     result), then the norm of those norms, in order: the same for any thread count. */
  struct kiln_tensor *out = NULL;
  double total = 0;
  int rc = KILN_OK;
  for (int i = 0; i < n && !rc; i++) {
    struct kiln_tensor *g = grads[i];
    if (!g) continue;
    if (!out || out->device.type != g->device.type || out->device.index != g->device.index) {
      kiln_tensor_release(out);
      if (!(out = kiln_tensor_empty(0, NULL, KILN_F64, g->device))) return kiln_error_code();
    }
    struct kiln_call call = {.op = KILN_OP_NORM, .out = out, .in = {g}, .nin = 1,
                             .ints = {((int64_t)1 << g->ndim) - 1, 0}, .nints = 2, .scalar = {norm_type}};
    double v = 0;
    if ((rc = kiln_dispatch(g->device, &call)) || (rc = kiln_tensor_item(out, &v))) break;
    if (isinf(norm_type)) total = (v > total || v != v) ? v : total;
    else if (norm_type == 2) total += v * v;
    else if (norm_type == 1) total += v;
    else total += pow(v, norm_type);
  }
  kiln_tensor_release(out);
  if (rc) return rc;
  if (!isinf(norm_type)) total = norm_type == 2 ? sqrt(total) : norm_type == 1 ? total : pow(total, 1 / norm_type);
  if (total_norm_out) *total_norm_out = total;
  double coef = max_norm / (total + 1e-6);
  if (coef >= 1) return KILN_OK;          /* NaN scales too, as PyTorch's clamp(max=1) keeps it */
  int prev = kiln_set_grad_enabled(0);
  for (int i = 0; i < n && !rc; i++)
    if (grads[i]) rc = kiln_binary_scalar_(KILN_OP_MUL, grads[i], coef);
  kiln_set_grad_enabled(prev);
  return rc;
}

KILN_API int kiln_clip_grad_value(int n, struct kiln_tensor *const *grads, double clip) {
  const char *op = "clip_grad_value";
  if (!(clip >= 0)) return kiln_fail(KILN_ERR_ARGUMENT, "%s: clip = %g (expected >= 0)", op, clip);
  if (check_grads(op, n, grads)) return kiln_error_code();
  int prev = kiln_set_grad_enabled(0);
  int rc = KILN_OK;
  for (int i = 0; i < n && !rc; i++) {
    if (!grads[i]) continue;
    rc = kiln_binary_scalar_(KILN_OP_MINIMUM, grads[i], clip);
    if (!rc) rc = kiln_binary_scalar_(KILN_OP_MAXIMUM, grads[i], -clip);
  }
  kiln_set_grad_enabled(prev);
  return rc;
}
