/* reduce.c: the front end of reductions: which dims, the result's shape and dtype.
   Kernels get call->ints[0] = a bit mask of the reduced dims; scalar[0] = p or the correction. */
#include "internal.h"
#include <math.h>

static int reduce_dtype(int op, int dt) {
  switch (op) {
  case KILN_OP_ARGMAX: case KILN_OP_ARGMIN: return KILN_I64;
  case KILN_OP_SUM: case KILN_OP_PROD: return kiln_dtype_is_float(dt) ? dt : KILN_I64;
  case KILN_OP_MAX: case KILN_OP_MIN: return dt;
  default: return kiln_dtype_is_float(dt) ? dt : KILN_F32;
  }
}

KILN_API struct kiln_tensor *kiln_reduce(int op, const struct kiln_tensor *a, int ndims, const int *dims, int keepdim, double p) {
  if (op < KILN_OP_SUM || op > KILN_OP_LOGSUMEXP) {
    kiln_fail(KILN_ERR_ARGUMENT, "reduce: %s is not a reduction", kiln_op_name(op));
    return NULL;
  }
  const char *name = kiln_op_name(op);
  if (kiln_check_live(name, a)) return NULL;
  if (ndims < 0 || ndims > KILN_MAX_DIMS || (ndims > 0 && !dims)) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: %d dims given", name, ndims);
    return NULL;
  }
  int64_t mask = 0;
  for (int i = 0; i < ndims; i++) {
    int d = 0;
    if (kiln_normalize_dim(name, dims[i], a->ndim, &d)) return NULL;
    if (mask & (1 << d)) { kiln_fail(KILN_ERR_ARGUMENT, "%s: dim %d given twice (tensor %s)", name, d, kiln_shape_string(a)); return NULL; }
    mask |= 1 << d;
  }
  if (ndims == 0) mask = (1 << a->ndim) - 1;
  if ((op == KILN_OP_ARGMAX || op == KILN_OP_ARGMIN) && ndims > 1) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: takes one dim or none, got %d", name, ndims);
    return NULL;
  }
  int64_t sizes[KILN_MAX_DIMS], reduced = 1;
  int n = 0;
  for (int d = 0; d < a->ndim; d++) {
    if (mask & (1 << d)) {
      reduced *= a->sizes[d];
      if (keepdim) sizes[n++] = 1;
    } else {
      sizes[n++] = a->sizes[d];
    }
  }
  if (ndims == 0 && (op == KILN_OP_ARGMAX || op == KILN_OP_ARGMIN) && keepdim) {
    for (int d = 0; d < a->ndim; d++) sizes[d] = 1;
  }
  if (reduced == 0 && a->numel == 0 &&
      (op == KILN_OP_MAX || op == KILN_OP_MIN || op == KILN_OP_ARGMAX || op == KILN_OP_ARGMIN ||
       (op == KILN_OP_NORM && p == -INFINITY))) {
    kiln_fail(KILN_ERR_SHAPE, "%s: cannot reduce over an empty dim (tensor %s)", name, kiln_shape_string(a));
    return NULL;
  }
  if (op == KILN_OP_NORM && !(p >= 0 || p == -INFINITY)) {
    kiln_fail(KILN_ERR_ARGUMENT, "norm: order p = %g (expected p >= 0, or -inf for the smallest magnitude)", p);
    return NULL;
  }
  struct kiln_tensor *out = kiln_tensor_empty(n, sizes, reduce_dtype(op, a->dtype), a->device);
  if (!out) return NULL;
  struct kiln_call call = {.op = op, .out = out, .in = {a}, .nin = 1, .ints = {mask, keepdim}, .nints = 2, .scalar = {p}};
  if (kiln_dispatch(a->device, &call) || kiln_autograd_record_call(&call, out)) { kiln_tensor_release(out); return NULL; }
  return out;
}
