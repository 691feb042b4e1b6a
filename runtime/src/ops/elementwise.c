/* elementwise.c: the front end of unary, binary and ternary elementwise ops: result dtypes,
   broadcasting, in-place rules. Kernels get call->ints[0] = the dtype to compute in. */
#include "internal.h"
#include <math.h>
#include <string.h>

static int is_comparison(int op) {
  return op == KILN_OP_EQ || op == KILN_OP_NE || op == KILN_OP_LT || op == KILN_OP_LE || op == KILN_OP_GT ||
         op == KILN_OP_GE || op == KILN_OP_LOGICAL_AND || op == KILN_OP_LOGICAL_OR;
}

/* Unary ops that keep an integer dtype; the others need a float. */
static int keeps_integers(int op) {
  switch (op) {
  case KILN_OP_NEG: case KILN_OP_ABS: case KILN_OP_SIGN: case KILN_OP_SQUARE: case KILN_OP_RELU:
  case KILN_OP_FLOOR: case KILN_OP_CEIL: case KILN_OP_ROUND: case KILN_OP_TRUNC:
    return 1;
  }
  return 0;
}

/* The dtype arithmetic runs in: f64 for f64, f32 for the other floats, i64 for the rest. */
static int compute_dtype(int dt) {
  if (dt == KILN_F64) return KILN_F64;
  if (kiln_dtype_is_float(dt)) return KILN_F32;
  return KILN_I64;
}

static int is_unary(int op) { return op >= KILN_OP_NEG && op <= KILN_OP_LOGICAL_NOT; }
static int is_binary(int op) { return op >= KILN_OP_ADD && op <= KILN_OP_LOGICAL_OR; }

static int unary_dtypes(int op, int dt, int *result, int *ctype) {
  if (!is_unary(op)) return kiln_fail(KILN_ERR_ARGUMENT, "unary: %s is not a unary op", kiln_op_name(op));
  if (op == KILN_OP_LOGICAL_NOT) { *result = KILN_BOOL; *ctype = compute_dtype(dt); return KILN_OK; }
  if (op == KILN_OP_NEG && dt == KILN_BOOL) return kiln_fail(KILN_ERR_DTYPE, "neg: not defined for bool tensors (use logical_not)");
  *result = keeps_integers(op) || kiln_dtype_is_float(dt) ? dt : KILN_F32;
  *ctype = compute_dtype(*result);
  return KILN_OK;
}

static int binary_dtypes(int op, int da, int db, int *result, int *ctype) {
  if (!is_binary(op)) return kiln_fail(KILN_ERR_ARGUMENT, "binary: %s is not a binary op", kiln_op_name(op));
  int p = kiln_promote_types(da, db);
  if (is_comparison(op)) { *result = KILN_BOOL; *ctype = compute_dtype(p); return KILN_OK; }
  if (op == KILN_OP_DIV && !kiln_dtype_is_float(p)) p = KILN_F32;
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
