/* scan.c: the front ends of the ops along one dim that keep its length: cumsum, cumprod
   (scans) and argsort, with the scans' derivatives. The kernels get a contiguous input in the
   dtype they compute in (f64 for f64, f32 for the other floats, i64 for integers and bool),
   call->ints[0] = the dim; argsort also ints[1] = descending and ints[2] = k, the indices it keeps
   of each line (the output's size along the dim). */
#include "internal.h"
#include "autograd/derivative.h"
#include <string.h>

static int work_dtype(int dt) {
  if (dt == KILN_F64) return KILN_F64;
  if (kiln_dtype_is_float(dt)) return KILN_F32;
  return KILN_I64;
}

/* a, converted to dtype and contiguous, with nothing recorded (a new reference). */
static struct kiln_tensor *plain(const struct kiln_tensor *a, int dtype) {
  int prev = kiln_set_grad_enabled(0);
  struct kiln_tensor *c = kiln_to_dtype(a, dtype), *r = c ? kiln_contiguous(c) : NULL;
  kiln_tensor_release(c);
  kiln_set_grad_enabled(prev);
  return r;
}

/* The dim of a (a 0-d tensor has one element along dim 0 or -1, as in PyTorch). */
static int scan_dim(const char *op, const struct kiln_tensor *a, int dim, int *d) {
  return kiln_normalize_dim(op, dim, a->ndim > 0 ? a->ndim : 1, d);
}

/* kind(x) along d into a fresh tensor of x's shape (with k along d, for argsort) in dtype
   out_dtype; x is contiguous. */
static struct kiln_tensor *run_along(int kind, const struct kiln_tensor *x, int d, int out_dtype, int64_t flag, int64_t k) {
  int64_t sizes[KILN_MAX_DIMS];
  memcpy(sizes, x->sizes, sizeof(int64_t) * (size_t)x->ndim);
  if (x->ndim > 0) sizes[d] = k;
  struct kiln_tensor *out = kiln_tensor_empty(x->ndim, sizes, out_dtype, x->device);
  if (!out) return NULL;
  struct kiln_call call = {.op = kind, .out = out, .in = {x}, .nin = 1, .ints = {d, flag, k}, .nints = 3};
  if (kiln_dispatch(x->device, &call)) { kiln_tensor_release(out); return NULL; }
  return out;
}

static struct kiln_tensor *scan(int kind, const struct kiln_tensor *a, int dim) {
  const char *op = kiln_op_name(kind);
  int d;
  if (kiln_check_live(op, a) || scan_dim(op, a, dim, &d)) return NULL;
  /* integers and bool sum to i64, as in PyTorch; floats keep their dtype */
  int result = kiln_dtype_is_float(a->dtype) ? a->dtype : KILN_I64, work = work_dtype(result);
  struct kiln_tensor *x = plain(a, work);
  if (!x) return NULL;
  struct kiln_tensor *out = run_along(kind, x, d, work, 0, a->ndim > 0 ? a->sizes[d] : 1);
  kiln_tensor_release(x);
  if (out && work != result) {
    int prev = kiln_set_grad_enabled(0);
    struct kiln_tensor *r = kiln_to_dtype(out, result);
    kiln_set_grad_enabled(prev);
    kiln_tensor_release(out);
    out = r;
  }
  if (!out) return NULL;
  int64_t ints[1] = {d};
  const struct kiln_tensor *saved[1] = {a};
  if (kiln_autograd_record_saved(kind, out, 1, &a, NULL, ints, 1, saved, kind == KILN_OP_CUMPROD ? 1 : 0)) {
    kiln_tensor_release(out);
    return NULL;
  }
  return out;
}

KILN_API struct kiln_tensor *kiln_cumsum(const struct kiln_tensor *a, int dim) { return scan(KILN_OP_CUMSUM, a, dim); }
KILN_API struct kiln_tensor *kiln_cumprod(const struct kiln_tensor *a, int dim) { return scan(KILN_OP_CUMPROD, a, dim); }

KILN_API struct kiln_tensor *kiln_argsort_k(const struct kiln_tensor *a, int dim, int descending, int64_t k) {
  int d;
  if (kiln_check_live("argsort", a) || scan_dim("argsort", a, dim, &d)) return NULL;
  int64_t n = a->ndim > 0 ? a->sizes[d] : 1;
  if (k < 0 || k > n) {
    kiln_fail(KILN_ERR_ARGUMENT, "argsort: k = %lld is out of range for dim %d of size %lld (tensor %s)", (long long)k, d,
              (long long)n, kiln_shape_string(a));
    return NULL;
  }
  struct kiln_tensor *x = plain(a, work_dtype(a->dtype));
  if (!x) return NULL;
  struct kiln_tensor *out = run_along(KILN_OP_ARGSORT, x, d, KILN_I64, descending != 0, k);
  kiln_tensor_release(x);
  return out;
}

KILN_API struct kiln_tensor *kiln_argsort(const struct kiln_tensor *a, int dim, int descending) {
  int d;
  if (kiln_check_live("argsort", a) || scan_dim("argsort", a, dim, &d)) return NULL;
  return kiln_argsort_k(a, dim, descending, a->ndim > 0 ? a->sizes[d] : 1);
}

/* ---- derivatives (named by the op table) ---- */

int kiln_scan_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct scope sc = {0}, *s = &sc;
  struct kiln_tensor *r[4] = {0};
  int d = (int)n->ints[0];
  switch (n->kind) {
  case KILN_OP_CUMSUM:   /* the sums from the end: sum(g) - cumsum(g) + g */
    if (g->ndim == 0) { r[0] = g; break; }
    r[0] = B(s, KILN_OP_ADD, B(s, KILN_OP_SUB, !s->failed ? keep(s, kiln_reduce(KILN_OP_SUM, g, 1, &d, 1, 0)) : NULL,
                                 !s->failed ? keep(s, kiln_cumsum(g, d)) : NULL), g);
    break;
  case KILN_OP_CUMPROD: {  /* a kernel of its own: exact where x has zeros (no division by x) */
    int work = work_dtype(g->dtype);
    struct kiln_tensor *gc = keep(s, plain(g, work));
    struct kiln_tensor *xc = !s->failed ? keep(s, plain(n->saved[0], work)) : NULL;
    struct kiln_tensor *gx = !s->failed ? keep(s, kiln_tensor_empty(xc->ndim, xc->sizes, work, xc->device)) : NULL;
    if (!s->failed) {
      struct kiln_call call = {.op = KILN_OP_CUMPROD_BACKWARD, .out = gx, .in = {gc, xc}, .nin = 2, .ints = {d}, .nints = 1};
      if (kiln_dispatch(g->device, &call)) s->failed = 1;
    }
    r[0] = gx;
    break;
  }
  default:
    scope_end(s);
    return kiln_no_derivative(n);
  }
  return kiln_grad_finish(n, s, r, gin);
}
