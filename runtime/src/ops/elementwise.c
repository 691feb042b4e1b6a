/* elementwise.c: the front end of unary, binary and ternary elementwise ops: result dtypes,
   broadcasting, in-place rules. Kernels get call->ints[0] = the dtype to compute in. */
#include "internal.h"
#include "autograd/derivative.h"
#include <math.h>
#include <string.h>

/* The dtype arithmetic runs in: f64 for f64, f32 for the other floats, i64 for the rest. */
static int compute_dtype(int dt) {
  if (dt == KILN_F64) return KILN_F64;
  if (kiln_dtype_is_float(dt)) return KILN_F32;
  return KILN_I64;
}

static int is_unary(int op) { const struct kiln_op_info *i = kiln_op_info(op); return i && i->family == KILN_FAMILY_UNARY; }
static int is_binary(int op) { const struct kiln_op_info *i = kiln_op_info(op); return i && i->family == KILN_FAMILY_BINARY; }

static int unary_dtypes(int op, int dt, int *result, int *ctype) {
  if (!is_unary(op)) return kiln_fail(KILN_ERR_ARGUMENT, "unary: %s is not a unary op", kiln_op_name(op));
  if (kiln_op_has(op, KILN_OPF_COMPARISON)) { *result = KILN_BOOL; *ctype = compute_dtype(dt); return KILN_OK; }
  if (op == KILN_OP_NEG && dt == KILN_BOOL) return kiln_fail(KILN_ERR_DTYPE, "neg: not defined for bool tensors (use logical_not)");
  *result = kiln_op_has(op, KILN_OPF_KEEPS_INTEGERS) || kiln_dtype_is_float(dt) ? dt : KILN_F32;
  *ctype = compute_dtype(*result);
  return KILN_OK;
}

static int binary_dtypes(int op, int da, int db, int *result, int *ctype) {
  if (!is_binary(op)) return kiln_fail(KILN_ERR_ARGUMENT, "binary: %s is not a binary op", kiln_op_name(op));
  int p = kiln_promote_types(da, db);
  if (kiln_op_has(op, KILN_OPF_COMPARISON)) { *result = KILN_BOOL; *ctype = compute_dtype(p); return KILN_OK; }
  if (kiln_op_has(op, KILN_OPF_NEEDS_FLOAT) && !kiln_dtype_is_float(p)) p = KILN_F32;
  *result = p;
  *ctype = compute_dtype(p);
  return KILN_OK;
}

/* A scalar from Lua is weak (kiln_scalar_type). */
static int scalar_dtype(const struct kiln_tensor *a, double s) { return kiln_scalar_type(a->dtype, s); }

static struct kiln_tensor *new_like_shape(int ndim, const int64_t *sizes, int dtype, struct kiln_device dev) {
  return kiln_tensor_empty(ndim, sizes, dtype, dev);
}

KILN_API struct kiln_tensor *kiln_unary(int op, const struct kiln_tensor *a) {
  struct kiln_tensor *ac[1];
  switch (kiln_autocast_inputs(op, 1, (const struct kiln_tensor *[]){a}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_unary(op, ac[0]);
    kiln_autocast_release(1, ac);
    return r;
  }
  default: return NULL;
  }
  const char *name = kiln_op_name(op);
  int result, ctype;
  if (kiln_check_live(name, a) || unary_dtypes(op, a->dtype, &result, &ctype)) return NULL;
  struct kiln_tensor *out = new_like_shape(a->ndim, a->sizes, result, a->device);
  if (!out) return NULL;
  struct kiln_call call = {.op = op, .out = out, .in = {a}, .nin = 1, .ints = {ctype}, .nints = 1};
  if (kiln_dispatch(a->device, &call) || kiln_autograd_record_call(&call, out)) { kiln_tensor_release(out); return NULL; }
  return out;
}

KILN_API int kiln_unary_(int op, struct kiln_tensor *a) {
  const char *name = kiln_op_name(op);
  int result, ctype;
  if (kiln_check_live(name, a) || unary_dtypes(op, a->dtype, &result, &ctype) || kiln_autograd_check_inplace(name, a, NULL))
    return kiln_error_code();
  if (result != a->dtype && result != KILN_BOOL)
    return kiln_fail(KILN_ERR_DTYPE, "%s_: the result (%s) cannot be stored in place in a %s tensor %s", name,
                     kiln_dtype_name(result), kiln_dtype_name(a->dtype), kiln_shape_string(a));
  struct kiln_call call = {.op = op, .out = a, .in = {a}, .nin = 1, .ints = {compute_dtype(result == KILN_BOOL ? a->dtype : result)}, .nints = 1};
  int rc = kiln_dispatch(a->device, &call);
  if (!rc) kiln_tensor_bump_version(a);
  return rc;
}

/* Integer remainder by zero has no value (PyTorch raises too): find a zero divisor before the
   kernel runs. divisor is the tensor operand, or NULL with the scalar s. */
static int check_integer_divisor(int op, int ctype, const struct kiln_tensor *divisor, double s) {
  if (op != KILN_OP_REMAINDER || ctype != KILN_I64) return KILN_OK;
  if (!divisor) {
    if (s == 0) return kiln_fail(KILN_ERR_ARGUMENT, "remainder: integer division by zero (the divisor is 0)");
    return KILN_OK;
  }
  int prev = kiln_set_grad_enabled(0);
  struct kiln_tensor *zero = kiln_binary_scalar(KILN_OP_EQ, divisor, 0, 0);
  struct kiln_tensor *count = zero ? kiln_reduce(KILN_OP_SUM, zero, 0, NULL, 0, 0) : NULL;
  double n = 0;
  int rc = count ? kiln_tensor_item(count, &n) : kiln_error_code();
  kiln_tensor_release(zero);
  kiln_tensor_release(count);
  kiln_set_grad_enabled(prev);
  if (rc) return rc;
  if (n > 0)
    return kiln_fail(KILN_ERR_ARGUMENT, "remainder: integer division by zero (%.0f of the %lld divisors in %s are 0)", n,
                     (long long)divisor->numel, kiln_shape_string(divisor));
  return KILN_OK;
}

KILN_API struct kiln_tensor *kiln_binary(int op, const struct kiln_tensor *a, const struct kiln_tensor *b) {
  struct kiln_tensor *ac[2];
  switch (kiln_autocast_inputs(op, 2, (const struct kiln_tensor *[]){a, b}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_binary(op, ac[0], ac[1]);
    kiln_autocast_release(2, ac);
    return r;
  }
  default: return NULL;
  }
  const char *name = kiln_op_name(op);
  int result, ctype, nd;
  int64_t shape[KILN_MAX_DIMS];
  if (kiln_check_live(name, a) || kiln_check_live(name, b) || kiln_check_same_device(name, a, b) ||
      binary_dtypes(op, a->dtype, b->dtype, &result, &ctype) ||
      kiln_broadcast_shapes(name, a->ndim, a->sizes, b->ndim, b->sizes, &nd, shape) ||
      check_integer_divisor(op, ctype, b, 0))
    return NULL;
  struct kiln_tensor *out = new_like_shape(nd, shape, result, a->device);
  if (!out) return NULL;
  struct kiln_call call = {.op = op, .out = out, .in = {a, b}, .nin = 2, .ints = {ctype}, .nints = 1};
  if (kiln_dispatch(a->device, &call) || kiln_autograd_record_call(&call, out)) { kiln_tensor_release(out); return NULL; }
  return out;
}

KILN_API int kiln_binary_(int op, struct kiln_tensor *a, const struct kiln_tensor *b) {
  const char *name = kiln_op_name(op);
  int result, ctype, nd;
  int64_t shape[KILN_MAX_DIMS];
  if (kiln_check_live(name, a) || kiln_check_live(name, b) || kiln_check_same_device(name, a, b) ||
      binary_dtypes(op, a->dtype, b->dtype, &result, &ctype) ||
      kiln_broadcast_shapes(name, a->ndim, a->sizes, b->ndim, b->sizes, &nd, shape) ||
      check_integer_divisor(op, ctype, b, 0))
    return kiln_error_code();
  if (nd != a->ndim || memcmp(shape, a->sizes, sizeof(int64_t) * (size_t)nd) != 0)
    return kiln_fail(KILN_ERR_SHAPE, "%s_: %s does not broadcast to the in-place target %s", name, kiln_shape_string(b), kiln_shape_string(a));
  if (kiln_autograd_check_inplace(name, a, b)) return kiln_error_code();
  if (kiln_dtype_is_float(result) && !kiln_dtype_is_float(a->dtype))
    return kiln_fail(KILN_ERR_DTYPE, "%s_: the result (%s) cannot be stored in place in a %s tensor %s", name,
                     kiln_dtype_name(result), kiln_dtype_name(a->dtype), kiln_shape_string(a));
  struct kiln_call call = {.op = op, .out = a, .in = {a, b}, .nin = 2, .ints = {ctype}, .nints = 1};
  int rc = kiln_dispatch(a->device, &call);
  if (!rc) kiln_tensor_bump_version(a);
  return rc;
}

/* A scalar operand travels as call->scalar[0]; in[1] stays NULL and ints[1] says on which side. */
KILN_API struct kiln_tensor *kiln_binary_scalar(int op, const struct kiln_tensor *a, double s, int reverse) {
  struct kiln_tensor *ac[1];
  switch (kiln_autocast_inputs(op, 1, (const struct kiln_tensor *[]){a}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_binary_scalar(op, ac[0], s, reverse);
    kiln_autocast_release(1, ac);
    return r;
  }
  default: return NULL;
  }
  const char *name = kiln_op_name(op);
  int result, ctype;
  if (kiln_check_live(name, a)) return NULL;
  int sd = scalar_dtype(a, s);
  if (binary_dtypes(op, a->dtype, sd, &result, &ctype) || check_integer_divisor(op, ctype, reverse ? a : NULL, s))
    return NULL;
  struct kiln_tensor *out = new_like_shape(a->ndim, a->sizes, result, a->device);
  if (!out) return NULL;
  struct kiln_call call = {.op = op, .out = out, .in = {a}, .nin = 2, .scalar = {s}, .ints = {ctype, reverse != 0}, .nints = 2};
  if (kiln_dispatch(a->device, &call) || kiln_autograd_record_call(&call, out)) { kiln_tensor_release(out); return NULL; }
  return out;
}

KILN_API int kiln_binary_scalar_(int op, struct kiln_tensor *a, double s) {
  const char *name = kiln_op_name(op);
  int result, ctype;
  if (kiln_check_live(name, a)) return kiln_error_code();
  int sd = scalar_dtype(a, s);
  if (binary_dtypes(op, a->dtype, sd, &result, &ctype) || check_integer_divisor(op, ctype, NULL, s) ||
      kiln_autograd_check_inplace(name, a, NULL))
    return kiln_error_code();
  if (kiln_dtype_is_float(result) && !kiln_dtype_is_float(a->dtype))
    return kiln_fail(KILN_ERR_DTYPE, "%s_: the result (%s) cannot be stored in place in a %s tensor %s", name,
                     kiln_dtype_name(result), kiln_dtype_name(a->dtype), kiln_shape_string(a));
  struct kiln_call call = {.op = op, .out = a, .in = {a}, .nin = 2, .scalar = {s}, .ints = {ctype, 0}, .nints = 2};
  int rc = kiln_dispatch(a->device, &call);
  if (!rc) kiln_tensor_bump_version(a);
  return rc;
}

KILN_API struct kiln_tensor *kiln_where(const struct kiln_tensor *cond, const struct kiln_tensor *a, const struct kiln_tensor *b) {
  int nd, nd2;
  int64_t s1[KILN_MAX_DIMS], shape[KILN_MAX_DIMS];
  if (kiln_check_live("where", cond) || kiln_check_live("where", a) || kiln_check_live("where", b) ||
      kiln_check_same_device("where", cond, a) || kiln_check_same_device("where", a, b) ||
      kiln_broadcast_shapes("where", a->ndim, a->sizes, b->ndim, b->sizes, &nd, s1) ||
      kiln_broadcast_shapes("where", cond->ndim, cond->sizes, nd, s1, &nd2, shape))
    return NULL;
  int result = kiln_promote_types(a->dtype, b->dtype);
  struct kiln_tensor *out = new_like_shape(nd2, shape, result, a->device);
  if (!out) return NULL;
  struct kiln_call call = {.op = KILN_OP_WHERE, .out = out, .in = {cond, a, b}, .nin = 3, .ints = {compute_dtype(result)}, .nints = 1};
  if (kiln_dispatch(a->device, &call) || kiln_autograd_record_call(&call, out)) { kiln_tensor_release(out); return NULL; }
  return out;
}

KILN_API struct kiln_tensor *kiln_clamp(const struct kiln_tensor *a, double lo, double hi, int has_lo, int has_hi) {
  if (kiln_check_live("clamp", a)) return NULL;
  if (!has_lo && !has_hi) { kiln_fail(KILN_ERR_ARGUMENT, "clamp: give a lower bound, an upper bound or both"); return NULL; }
  if (a->dtype == KILN_BOOL) { kiln_fail(KILN_ERR_DTYPE, "clamp: not defined for bool tensors"); return NULL; }
  int result = a->dtype;
  if (!kiln_dtype_is_float(result) && ((has_lo && lo != floor(lo)) || (has_hi && hi != floor(hi)))) result = KILN_F32;
  struct kiln_tensor *out = new_like_shape(a->ndim, a->sizes, result, a->device);
  if (!out) return NULL;
  struct kiln_call call = {.op = KILN_OP_CLAMP, .out = out, .in = {a}, .nin = 1,
                           .scalar = {has_lo ? lo : -INFINITY, has_hi ? hi : INFINITY}, .ints = {compute_dtype(result)}, .nints = 1};
  if (kiln_dispatch(a->device, &call) || kiln_autograd_record_call(&call, out)) { kiln_tensor_release(out); return NULL; }
  return out;
}

/* ---- derivatives (named by the op table) ---- */

int kiln_unary_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct scope sc = {0}, *s = &sc;
  struct kiln_tensor *x = n->saved[0], *out = n->saved[3];
  struct kiln_tensor *r[4] = {0};
  switch (n->kind) {
  case KILN_OP_NEG: r[0] = U(s, KILN_OP_NEG, g); break;
  case KILN_OP_ABS: r[0] = B(s, KILN_OP_MUL, g, U(s, KILN_OP_SIGN, x)); break;
  case KILN_OP_SQRT: r[0] = B(s, KILN_OP_DIV, BS(s, KILN_OP_MUL, g, 0.5), out); break;
  case KILN_OP_RSQRT: r[0] = B(s, KILN_OP_MUL, BS(s, KILN_OP_MUL, g, -0.5), B(s, KILN_OP_MUL, out, U(s, KILN_OP_SQUARE, out))); break;
  case KILN_OP_EXP: r[0] = B(s, KILN_OP_MUL, g, out); break;
  case KILN_OP_LOG: r[0] = B(s, KILN_OP_DIV, g, x); break;
  case KILN_OP_LOG1P: r[0] = B(s, KILN_OP_DIV, g, BS(s, KILN_OP_ADD, x, 1)); break;
  case KILN_OP_EXPM1: r[0] = B(s, KILN_OP_MUL, g, BS(s, KILN_OP_ADD, out, 1)); break;
  case KILN_OP_SIN: r[0] = B(s, KILN_OP_MUL, g, U(s, KILN_OP_COS, x)); break;
  case KILN_OP_COS: r[0] = B(s, KILN_OP_MUL, g, U(s, KILN_OP_NEG, U(s, KILN_OP_SIN, x))); break;
  case KILN_OP_TANH: r[0] = B(s, KILN_OP_MUL, g, SB(s, KILN_OP_SUB, 1, U(s, KILN_OP_SQUARE, out))); break;
  case KILN_OP_SIGMOID: r[0] = B(s, KILN_OP_MUL, g, B(s, KILN_OP_MUL, out, SB(s, KILN_OP_SUB, 1, out))); break;
  /* g where the output is positive, in one pass (relu_backward: a 0 there even where g is inf or NaN) */
  case KILN_OP_RELU: r[0] = B(s, KILN_OP_RELU_BACKWARD, g, out); break;
  case KILN_OP_RECIPROCAL: r[0] = B(s, KILN_OP_MUL, U(s, KILN_OP_NEG, g), U(s, KILN_OP_SQUARE, out)); break;
  case KILN_OP_SQUARE: r[0] = B(s, KILN_OP_MUL, g, BS(s, KILN_OP_MUL, x, 2)); break;
  case KILN_OP_ERF:
    r[0] = B(s, KILN_OP_MUL, g, BS(s, KILN_OP_MUL, U(s, KILN_OP_EXP, U(s, KILN_OP_NEG, U(s, KILN_OP_SQUARE, x))), 2 / sqrt(M_PI)));
    break;
  case KILN_OP_ERFINV:   /* d erfinv(x) = sqrt(pi)/2 exp(erfinv(x)^2) */
    r[0] = B(s, KILN_OP_MUL, g, BS(s, KILN_OP_MUL, U(s, KILN_OP_EXP, U(s, KILN_OP_SQUARE, out)), sqrt(M_PI) / 2));
    break;
  default:
    scope_end(s);
    return kiln_no_derivative(n);
  }
  return kiln_grad_finish(n, s, r, gin);
}

int kiln_binary_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct scope sc = {0}, *s = &sc;
  struct kiln_tensor *x = n->saved[0], *y = n->saved[1], *out = n->saved[3];
  struct kiln_tensor *r[4] = {0};
  int scalar_rhs = n->nin == 1;   /* x op s, or s op x when reverse */
  double sv = n->scalar[0];
  int reverse = n->nints > 1 && n->ints[1];
  switch (n->kind) {
  case KILN_OP_ADD:
    r[0] = g;
    if (!scalar_rhs) r[1] = g;
    break;
  case KILN_OP_SUB:
    if (scalar_rhs) r[0] = reverse ? U(s, KILN_OP_NEG, g) : g;
    else { r[0] = g; r[1] = U(s, KILN_OP_NEG, g); }
    break;
  case KILN_OP_MUL:
    if (scalar_rhs) r[0] = BS(s, KILN_OP_MUL, g, sv);
    else { r[0] = B(s, KILN_OP_MUL, g, y); r[1] = B(s, KILN_OP_MUL, g, x); }
    break;
  case KILN_OP_DIV:
    if (scalar_rhs) r[0] = reverse ? B(s, KILN_OP_MUL, U(s, KILN_OP_NEG, g), B(s, KILN_OP_DIV, out, x)) : BS(s, KILN_OP_DIV, g, sv);
    else {
      r[0] = B(s, KILN_OP_DIV, g, y);
      r[1] = B(s, KILN_OP_MUL, U(s, KILN_OP_NEG, g), B(s, KILN_OP_DIV, x, U(s, KILN_OP_SQUARE, y)));
    }
    break;
  case KILN_OP_POW:
    if (scalar_rhs) {
      if (reverse) r[0] = BS(s, KILN_OP_MUL, B(s, KILN_OP_MUL, g, out), log(sv));           /* d(s^x) = s^x log s */
      else r[0] = B(s, KILN_OP_MUL, g, BS(s, KILN_OP_MUL, BS(s, KILN_OP_POW, x, sv - 1), sv)); /* d(x^s) = s x^(s-1) */
    } else {
      r[0] = B(s, KILN_OP_MUL, g, B(s, KILN_OP_MUL, y, B(s, KILN_OP_POW, x, BS(s, KILN_OP_SUB, y, 1))));
      /* d/dy x^y = x^y log x; 0 where x = 0 and y > 0, as PyTorch has it */
      struct kiln_tensor *lg = B(s, KILN_OP_MUL, out, U(s, KILN_OP_LOG, x));
      r[1] = B(s, KILN_OP_MUL, g, !s->failed ? keep(s, kiln_masked_fill(lg, BS(s, KILN_OP_EQ, x, 0), 0)) : NULL);
    }
    break;
  case KILN_OP_MAXIMUM: case KILN_OP_MINIMUM: {
    int cmp = n->kind == KILN_OP_MAXIMUM ? KILN_OP_GT : KILN_OP_LT;
    if (scalar_rhs) {
      /* ties share the grad evenly, as in PyTorch */
      struct kiln_tensor *w = B(s, KILN_OP_ADD, BS(s, cmp, x, sv), BS(s, KILN_OP_MUL, BS(s, KILN_OP_EQ, x, sv), 0.5));
      r[0] = B(s, KILN_OP_MUL, g, w);
    } else {
      struct kiln_tensor *half_eq = BS(s, KILN_OP_MUL, B(s, KILN_OP_EQ, x, y), 0.5);
      struct kiln_tensor *wa = B(s, KILN_OP_ADD, B(s, cmp, x, y), half_eq);
      struct kiln_tensor *wb = B(s, KILN_OP_ADD, B(s, cmp, y, x), half_eq);
      r[0] = B(s, KILN_OP_MUL, g, wa);
      r[1] = B(s, KILN_OP_MUL, g, wb);
    }
    break;
  }
  case KILN_OP_REMAINDER:
    if (scalar_rhs) r[0] = reverse ? zeros(s, g->ndim, g->sizes, g->dtype, g->device) : g;
    else {
      r[0] = g;
      r[1] = B(s, KILN_OP_MUL, U(s, KILN_OP_NEG, g), U(s, KILN_OP_FLOOR, B(s, KILN_OP_DIV, x, y)));
    }
    if (scalar_rhs && reverse) r[0] = B(s, KILN_OP_MUL, U(s, KILN_OP_NEG, g), U(s, KILN_OP_FLOOR, SB(s, KILN_OP_DIV, sv, x)));
    break;
  case KILN_OP_RELU_BACKWARD:   /* relu_backward(x, y) is x masked by y > 0: linear in x; 0 in y (no grad) */
    if (!reverse) r[0] = scalar_rhs ? BS(s, KILN_OP_RELU_BACKWARD, g, sv) : B(s, KILN_OP_RELU_BACKWARD, g, y);
    break;
  case KILN_OP_ATAN2:   /* atan2(x, y): d/dx = y / (x^2 + y^2), d/dy = -x / (x^2 + y^2) */
    if (scalar_rhs) {
      struct kiln_tensor *r2 = BS(s, KILN_OP_ADD, U(s, KILN_OP_SQUARE, x), sv * sv);
      r[0] = B(s, KILN_OP_DIV, BS(s, KILN_OP_MUL, g, reverse ? -sv : sv), r2);   /* reverse: atan2(s, x) */
    } else {
      struct kiln_tensor *r2 = B(s, KILN_OP_ADD, U(s, KILN_OP_SQUARE, x), U(s, KILN_OP_SQUARE, y));
      r[0] = B(s, KILN_OP_DIV, B(s, KILN_OP_MUL, g, y), r2);
      r[1] = B(s, KILN_OP_DIV, B(s, KILN_OP_MUL, U(s, KILN_OP_NEG, g), x), r2);
    }
    break;
  default:
    scope_end(s);
    return kiln_no_derivative(n);
  }
  return kiln_grad_finish(n, s, r, gin);
}

int kiln_ternary_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct scope sc = {0}, *s = &sc;
  struct kiln_tensor *x = n->saved[0];
  struct kiln_tensor *r[4] = {0};
  switch (n->kind) {
  case KILN_OP_WHERE: {
    struct kiln_tensor *zero = zeros(s, 0, NULL, g->dtype, g->device);
    r[1] = !s->failed ? keep(s, kiln_where(x, g, zero)) : NULL;
    r[2] = !s->failed ? keep(s, kiln_where(x, zero, g)) : NULL;
    break;
  }
  case KILN_OP_CLAMP: {
    struct kiln_tensor *in = B(s, KILN_OP_LOGICAL_AND, BS(s, KILN_OP_GE, x, n->scalar[0]), BS(s, KILN_OP_LE, x, n->scalar[1]));
    r[0] = B(s, KILN_OP_MUL, g, in);
    break;
  }
  default:
    scope_end(s);
    return kiln_no_derivative(n);
  }
  return kiln_grad_finish(n, s, r, gin);
}
