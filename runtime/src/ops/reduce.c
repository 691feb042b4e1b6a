/* reduce.c: the front end of reductions: which dims, the result's shape and dtype.
   Kernels get call->ints[0] = a bit mask of the reduced dims; scalar[0] = p or the correction. */
#include "internal.h"
#include "autograd/derivative.h"
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
  struct kiln_tensor *ac[1];
  switch (kiln_autocast_inputs(op, 1, (const struct kiln_tensor *[]){a}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_reduce(op, ac[0], ndims, dims, keepdim, p);
    kiln_autocast_release(1, ac);
    return r;
  }
  default: return NULL;
  }
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

/* ---- derivatives (named by the op table) ---- */

int kiln_reduce_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct scope sc = {0}, *s = &sc;
  struct kiln_tensor *x = n->saved[0], *out = n->saved[3];
  struct kiln_tensor *r[4] = {0};
  switch (n->kind) {
  case KILN_OP_SUM: {
    struct kiln_tensor *gu = unreduce(s, g, n);
    r[0] = !s->failed ? keep(s, kiln_expand(gu, n->in[0].ndim, n->in[0].sizes)) : NULL;
    break;
  }
  case KILN_OP_MEAN: {
    struct kiln_tensor *gu = BS(s, KILN_OP_DIV, unreduce(s, g, n), (double)reduced_count(n));
    r[0] = !s->failed ? keep(s, kiln_expand(gu, n->in[0].ndim, n->in[0].sizes)) : NULL;
    break;
  }
  case KILN_OP_PROD:   /* out / x: exact when no element is zero */
    r[0] = B(s, KILN_OP_MUL, unreduce(s, g, n), B(s, KILN_OP_DIV, unreduce(s, out, n), x));
    break;
  case KILN_OP_MAX: case KILN_OP_MIN: {
    /* the grad goes to the elements equal to the extreme, shared among ties */
    int dims[KILN_MAX_DIMS], nd = 0;
    for (int d = 0; d < n->in[0].ndim; d++) if (n->ints[0] & (1 << d)) dims[nd++] = d;
    struct kiln_tensor *hit = B(s, KILN_OP_EQ, x, unreduce(s, out, n));
    struct kiln_tensor *hitf = !s->failed ? keep(s, kiln_to_dtype(hit, g->dtype)) : NULL;
    struct kiln_tensor *count = !s->failed ? keep(s, kiln_reduce(KILN_OP_SUM, hitf, nd, dims, 1, 0)) : NULL;
    r[0] = B(s, KILN_OP_MUL, B(s, KILN_OP_DIV, hitf, count), unreduce(s, g, n));
    break;
  }
  case KILN_OP_VAR: case KILN_OP_STD: {
    int dims[KILN_MAX_DIMS], nd = 0;
    for (int d = 0; d < n->in[0].ndim; d++) if (n->ints[0] & (1 << d)) dims[nd++] = d;
    struct kiln_tensor *mean = !s->failed ? keep(s, kiln_reduce(KILN_OP_MEAN, x, nd, dims, 1, 0)) : NULL;
    struct kiln_tensor *dev = B(s, KILN_OP_SUB, x, mean);
    double denom = (double)reduced_count(n) - n->scalar[0];
    if (n->kind == KILN_OP_VAR) r[0] = B(s, KILN_OP_MUL, unreduce(s, g, n), BS(s, KILN_OP_MUL, dev, 2 / denom));
    else r[0] = B(s, KILN_OP_MUL, B(s, KILN_OP_DIV, unreduce(s, g, n), unreduce(s, out, n)), BS(s, KILN_OP_DIV, dev, denom));
    break;
  }
  case KILN_OP_NORM: {
    double p = n->scalar[0];
    struct kiln_tensor *nu = unreduce(s, out, n), *gu = unreduce(s, g, n), *w;
    if (p == 2) w = B(s, KILN_OP_DIV, x, nu);
    else if (p == 1) w = U(s, KILN_OP_SIGN, x);
    else if (isinf(p)) {
      struct kiln_tensor *hit = B(s, KILN_OP_EQ, U(s, KILN_OP_ABS, x), nu);
      struct kiln_tensor *hitf = !s->failed ? keep(s, kiln_to_dtype(hit, g->dtype)) : NULL;
      int dims[KILN_MAX_DIMS], nd = 0;
      for (int d = 0; d < n->in[0].ndim; d++) if (n->ints[0] & (1 << d)) dims[nd++] = d;
      struct kiln_tensor *cnt = !s->failed ? keep(s, kiln_reduce(KILN_OP_SUM, hitf, nd, dims, 1, 0)) : NULL;
      w = B(s, KILN_OP_MUL, U(s, KILN_OP_SIGN, x), B(s, KILN_OP_DIV, hitf, cnt));
    } else if (p == 0) w = zeros(s, x->ndim, x->sizes, g->dtype, g->device);
    else w = B(s, KILN_OP_DIV, B(s, KILN_OP_MUL, U(s, KILN_OP_SIGN, x), BS(s, KILN_OP_POW, U(s, KILN_OP_ABS, x), p - 1)),
               BS(s, KILN_OP_POW, nu, p - 1));
    /* a zero norm has no direction: its grad is zero, not NaN */
    if (p != 0 && !isinf(p) && !s->failed) w = keep(s, kiln_masked_fill(w, BS(s, KILN_OP_EQ, nu, 0), 0));
    r[0] = B(s, KILN_OP_MUL, gu, w);
    break;
  }
  case KILN_OP_LOGSUMEXP:
    r[0] = B(s, KILN_OP_MUL, unreduce(s, g, n), U(s, KILN_OP_EXP, B(s, KILN_OP_SUB, x, unreduce(s, out, n))));
    break;
  default:
    scope_end(s);
    return kiln_no_derivative(n);
  }
  return kiln_grad_finish(n, s, r, gin);
}
