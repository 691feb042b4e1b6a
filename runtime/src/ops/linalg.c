/* linalg.c: the front end of matrix products. Every product becomes one GEMM call on
   3-d views out[B,n,m] = alpha * a[B,n,k] @ b[B,k,m] + beta * out (batch strides may be 0). */
#include "internal.h"
#include "autograd/derivative.h"
#include <math.h>
#include <string.h>

static int check_pair(const char *op, const struct kiln_tensor *a, const struct kiln_tensor *b) {
  if (kiln_check_live(op, a) || kiln_check_live(op, b) || kiln_check_same_device(op, a, b)) return kiln_error_code();
  if (a->dtype != b->dtype)
    return kiln_fail(KILN_ERR_DTYPE, "%s: %s %s @ %s %s: dtypes differ (convert one with :to())", op, kiln_shape_string(a),
                     kiln_dtype_name(a->dtype), kiln_shape_string(b), kiln_dtype_name(b->dtype));
  if (a->dtype == KILN_BOOL) return kiln_fail(KILN_ERR_DTYPE, "%s: not defined for bool tensors", op);
  return KILN_OK;
}

/* out (already holding beta's operand) = alpha * a @ b + beta * out, all 3-d. */
static int gemm(struct kiln_tensor *out, const struct kiln_tensor *a, const struct kiln_tensor *b, double alpha, double beta) {
  struct kiln_call call = {.op = KILN_OP_GEMM, .out = out, .in = {a, b}, .nin = 2, .scalar = {alpha, beta}};
  return kiln_dispatch(out->device, &call);
}

static struct kiln_tensor *as3d(const struct kiln_tensor *t) {
  if (t->ndim == 3) return kiln_alias(t);
  return kiln_unsqueeze(t, 0);
}

KILN_API struct kiln_tensor *kiln_mm(const struct kiln_tensor *a, const struct kiln_tensor *b) {
  struct kiln_tensor *ac[2];
  switch (kiln_autocast_inputs(KILN_OP_GEMM, 2, (const struct kiln_tensor *[]){a, b}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_mm(ac[0], ac[1]);
    kiln_autocast_release(2, ac);
    return r;
  }
  default: return NULL;
  }
  if (check_pair("mm", a, b)) return NULL;
  if (a->ndim != 2 || b->ndim != 2 || a->sizes[1] != b->sizes[0]) {
    kiln_fail(KILN_ERR_SHAPE, "mm: %s @ %s: %s", kiln_shape_string(a), kiln_shape_string(b),
              a->ndim != 2 || b->ndim != 2 ? "both must be 2-d" : "inner sizes differ");
    if (a->ndim == 2 && b->ndim == 2)
      kiln_fail(KILN_ERR_SHAPE, "mm: %s @ %s: inner sizes differ (%lld vs %lld)", kiln_shape_string(a), kiln_shape_string(b),
                (long long)a->sizes[1], (long long)b->sizes[0]);
    return NULL;
  }
  return kiln_matmul(a, b);
}

KILN_API struct kiln_tensor *kiln_bmm(const struct kiln_tensor *a, const struct kiln_tensor *b) {
  struct kiln_tensor *ac[2];
  switch (kiln_autocast_inputs(KILN_OP_GEMM, 2, (const struct kiln_tensor *[]){a, b}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_bmm(ac[0], ac[1]);
    kiln_autocast_release(2, ac);
    return r;
  }
  default: return NULL;
  }
  if (check_pair("bmm", a, b)) return NULL;
  if (a->ndim != 3 || b->ndim != 3 || a->sizes[0] != b->sizes[0] || a->sizes[2] != b->sizes[1]) {
    kiln_fail(KILN_ERR_SHAPE, "bmm: %s @ %s: %s", kiln_shape_string(a), kiln_shape_string(b),
              a->ndim != 3 || b->ndim != 3 ? "both must be 3-d" : a->sizes[0] != b->sizes[0] ? "batch sizes differ" : "inner sizes differ");
    return NULL;
  }
  return kiln_matmul(a, b);
}

KILN_API struct kiln_tensor *kiln_matmul(const struct kiln_tensor *a, const struct kiln_tensor *b) {
  struct kiln_tensor *ac[2];
  switch (kiln_autocast_inputs(KILN_OP_GEMM, 2, (const struct kiln_tensor *[]){a, b}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_matmul(ac[0], ac[1]);
    kiln_autocast_release(2, ac);
    return r;
  }
  default: return NULL;
  }
  if (check_pair("matmul", a, b)) return NULL;
  if (a->ndim == 0 || b->ndim == 0) {
    kiln_fail(KILN_ERR_SHAPE, "matmul: %s @ %s: both arguments need at least 1 dim", kiln_shape_string(a), kiln_shape_string(b));
    return NULL;
  }
  /* Promote 1-d operands to matrices; their added dim is dropped from the result. */
  struct kiln_tensor *A = a->ndim == 1 ? kiln_unsqueeze(a, 0) : kiln_alias(a);
  struct kiln_tensor *B = b->ndim == 1 ? kiln_unsqueeze(b, 1) : kiln_alias(b);
  struct kiln_tensor *out = NULL, *A3 = NULL, *B3 = NULL, *O3 = NULL;
  if (!A || !B) goto done;
  int64_t n = A->sizes[A->ndim - 2], k = A->sizes[A->ndim - 1], k2 = B->sizes[B->ndim - 2], m = B->sizes[B->ndim - 1];
  if (k != k2) {
    kiln_fail(KILN_ERR_SHAPE, "matmul: %s @ %s: inner sizes differ (%lld vs %lld)", kiln_shape_string(a), kiln_shape_string(b),
              (long long)k, (long long)k2);
    goto done;
  }
  int nb;
  int64_t batch[KILN_MAX_DIMS], osz[KILN_MAX_DIMS];
  if (kiln_broadcast_shapes("matmul", A->ndim - 2, A->sizes, B->ndim - 2, B->sizes, &nb, batch)) goto done;
  int64_t nbatch = 1;
  for (int i = 0; i < nb; i++) nbatch *= batch[i];
  /* Batch dims broadcast, then flatten to one (a copy only when a view cannot do it). */
  int64_t ea[KILN_MAX_DIMS], eb[KILN_MAX_DIMS];
  memcpy(ea, batch, sizeof(int64_t) * (size_t)nb); ea[nb] = n; ea[nb + 1] = k;
  memcpy(eb, batch, sizeof(int64_t) * (size_t)nb); eb[nb] = k; eb[nb + 1] = m;
  struct kiln_tensor *Ae = kiln_expand(A, nb + 2, ea), *Be = kiln_expand(B, nb + 2, eb);
  if (!Ae || !Be) { kiln_tensor_release(Ae); kiln_tensor_release(Be); goto done; }
  if (nb == 0) { A3 = as3d(Ae); B3 = as3d(Be); }
  else {
    A3 = kiln_reshape(Ae, 3, (int64_t[]){nbatch, n, k});
    B3 = kiln_reshape(Be, 3, (int64_t[]){nbatch, k, m});
  }
  kiln_tensor_release(Ae); kiln_tensor_release(Be);
  if (!A3 || !B3) goto done;
  O3 = kiln_tensor_empty(3, (int64_t[]){nbatch, n, m}, a->dtype, a->device);
  if (!O3 || gemm(O3, A3, B3, 1.0, 0.0)) goto done;
  const struct kiln_tensor *ins[2] = {A3, B3};
  if (kiln_autograd_record(KILN_OP_GEMM, O3, 2, ins, (double[4]){1.0, 0.0}, NULL, 0, NULL)) goto done;
  int no = 0;
  for (int i = 0; i < nb; i++) osz[no++] = batch[i];
  if (a->ndim > 1) osz[no++] = n;
  if (b->ndim > 1) osz[no++] = m;
  out = kiln_view(O3, no, osz);
done:
  kiln_tensor_release(A); kiln_tensor_release(B); kiln_tensor_release(A3); kiln_tensor_release(B3); kiln_tensor_release(O3);
  return out;
}

KILN_API int kiln_matmul_out(struct kiln_tensor *out, const struct kiln_tensor *a, const struct kiln_tensor *b) {
  if (check_pair("matmul", a, b) || kiln_check_live("matmul", out) || kiln_check_same_device("matmul", out, a))
    return kiln_error_code();
  int nd = a->ndim;
  if ((nd != 2 && nd != 3) || b->ndim != nd || a->sizes[nd - 1] != b->sizes[nd - 2] || (nd == 3 && a->sizes[0] != b->sizes[0]))
    return kiln_fail(KILN_ERR_SHAPE, "matmul: %s @ %s: out= takes 2-d or batched 3-d operands with matching sizes",
                     kiln_shape_string(a), kiln_shape_string(b));
  int64_t want[3] = {a->sizes[0], a->sizes[nd - 2], b->sizes[nd - 1]};
  const int64_t *ws = nd == 3 ? want : want + 1;
  if (kiln_autograd_check_inplace("matmul", out, a) || kiln_autograd_check_inplace("matmul", out, b)) return kiln_error_code();
  if (out->ndim != nd || memcmp(out->sizes, ws, sizeof(int64_t) * (size_t)nd) != 0 || out->dtype != a->dtype)
    return kiln_fail(KILN_ERR_SHAPE, "matmul: out %s %s does not fit %s @ %s (expected %s %s)", kiln_shape_string(out),
                     kiln_dtype_name(out->dtype), kiln_shape_string(a), kiln_shape_string(b), kiln_sizes_string(nd, ws),
                     kiln_dtype_name(a->dtype));
  struct kiln_tensor *O3 = as3d(out), *A3 = as3d(a), *B3 = as3d(b);
  int rc = !O3 || !A3 || !B3 ? kiln_error_code() : gemm(O3, A3, B3, 1.0, 0.0);
  kiln_tensor_release(O3); kiln_tensor_release(A3); kiln_tensor_release(B3);
  if (!rc) kiln_tensor_bump_version(out);
  return rc;
}

KILN_API struct kiln_tensor *kiln_addmm(const struct kiln_tensor *c, const struct kiln_tensor *a, const struct kiln_tensor *b,
                                        double beta, double alpha) {
  struct kiln_tensor *ac[3];
  switch (kiln_autocast_inputs(KILN_OP_GEMM, 3, (const struct kiln_tensor *[]){c, a, b}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_addmm(ac[0], ac[1], ac[2], beta, alpha);
    kiln_autocast_release(3, ac);
    return r;
  }
  default: return NULL;
  }
  if (check_pair("addmm", a, b) || kiln_check_live("addmm", c) || kiln_check_same_device("addmm", c, a)) return NULL;
  if (a->ndim != 2 || b->ndim != 2 || a->sizes[1] != b->sizes[0]) {
    kiln_fail(KILN_ERR_SHAPE, "addmm: %s @ %s: %s", kiln_shape_string(a), kiln_shape_string(b),
              a->ndim != 2 || b->ndim != 2 ? "both must be 2-d" : "inner sizes differ");
    return NULL;
  }
  int64_t n = a->sizes[0], m = b->sizes[1];
  const struct kiln_tensor *ins[3] = {c, a, b};
  if (kiln_autograd_wanted(3, ins)) {
    /* With a graph to record: beta * c + alpha * (a @ b) from differentiable ops. */
    struct kiln_tensor *mm = kiln_matmul(a, b);
    struct kiln_tensor *am = mm && alpha != 1 ? kiln_binary_scalar(KILN_OP_MUL, mm, alpha, 0) : (kiln_tensor_retain(mm), mm);
    struct kiln_tensor *bc = beta != 1 ? kiln_binary_scalar(KILN_OP_MUL, c, beta, 0) : kiln_alias(c);
    struct kiln_tensor *r = am && bc ? kiln_binary(KILN_OP_ADD, bc, am) : NULL;
    if (r && (r->ndim != 2 || r->sizes[0] != n || r->sizes[1] != m)) {
      kiln_fail(KILN_ERR_SHAPE, "addmm: bias %s does not broadcast to the product's shape [%lld,%lld]", kiln_shape_string(c),
                (long long)n, (long long)m);
      kiln_tensor_release(r);
      r = NULL;
    }
    kiln_tensor_release(mm); kiln_tensor_release(am); kiln_tensor_release(bc);
    return r;
  }
  struct kiln_tensor *out = kiln_tensor_empty(2, (int64_t[]){n, m}, a->dtype, a->device);
  if (!out) return NULL;
  if (beta != 0 && kiln_copy_(out, c)) {
    kiln_tensor_release(out);
    kiln_fail(KILN_ERR_SHAPE, "addmm: bias %s does not broadcast to the product's shape [%lld,%lld]", kiln_shape_string(c),
              (long long)n, (long long)m);
    return NULL;
  }
  struct kiln_tensor *O3 = kiln_unsqueeze(out, 0), *A3 = kiln_unsqueeze(a, 0), *B3 = kiln_unsqueeze(b, 0);
  int rc = !O3 || !A3 || !B3 || gemm(O3, A3, B3, alpha, beta);
  kiln_tensor_release(O3); kiln_tensor_release(A3); kiln_tensor_release(B3);
  if (rc) { kiln_tensor_release(out); return NULL; }
  return out;
}

/* LINEAR where a CPU kernel runs it (f32, f64: cpu/gemm.c); else matmul, add and relu, whose
   arithmetic the kernel repeats element by element. Leading dims of x are flattened into one
   product (as PyTorch's linear), not a batch of products as matmul of an N-d x would be. */
KILN_API struct kiln_tensor *kiln_linear(const struct kiln_tensor *x, const struct kiln_tensor *w, const struct kiln_tensor *b,
                                         int relu) {
  struct kiln_tensor *ac[3];
  /* cast as matmul's (and addmm's) inputs are, on every device: the bias too, as PyTorch's autocast
     casts linear's; bf16/f16 then run as the three ops */
  switch (kiln_autocast_inputs(KILN_OP_GEMM, 3, (const struct kiln_tensor *[]){x, w, b}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_linear(ac[0], ac[1], ac[2], relu);
    kiln_autocast_release(3, ac);
    return r;
  }
  default: return NULL;
  }
  if (kiln_check_live("linear", x) || kiln_check_live("linear", w) || (b && kiln_check_live("linear", b)) ||
      kiln_check_same_device("linear", x, w) || (b && kiln_check_same_device("linear", x, b)))
    return NULL;
  if (w->ndim != 2) { kiln_fail(KILN_ERR_SHAPE, "linear: weight %s must be 2-d [out, in]", kiln_shape_string(w)); return NULL; }
  int64_t O = w->sizes[0], I = w->sizes[1];
  if (x->ndim < 1 || x->sizes[x->ndim - 1] != I) {
    if (x->ndim < 1) kiln_fail(KILN_ERR_SHAPE, "linear: input %s has no dims; weight %s expects %lld features", kiln_shape_string(x),
                               kiln_shape_string(w), (long long)I);
    else kiln_fail(KILN_ERR_SHAPE, "linear: input %s has %lld features in its last dim but weight %s expects %lld",
                   kiln_shape_string(x), (long long)x->sizes[x->ndim - 1], kiln_shape_string(w), (long long)I);
    return NULL;
  }
  if (b && (b->ndim != 1 || b->sizes[0] != O)) {
    kiln_fail(KILN_ERR_SHAPE, "linear: bias %s does not fit weight %s (expected [%lld])", kiln_shape_string(b), kiln_shape_string(w),
              (long long)O);
    return NULL;
  }
  int dt = x->dtype;
  if (w->dtype != dt || (b && b->dtype != dt)) {
    const struct kiln_tensor *o = w->dtype != dt ? w : b;
    kiln_fail(KILN_ERR_DTYPE, "linear: input %s %s, %s %s %s: dtypes differ (convert one with :to())", kiln_shape_string(x),
              kiln_dtype_name(dt), o == w ? "weight" : "bias", kiln_shape_string(o), kiln_dtype_name(o->dtype));
    return NULL;
  }
  if (dt == KILN_BOOL) { kiln_fail(KILN_ERR_DTYPE, "linear: not defined for bool tensors"); return NULL; }
  int64_t N = 1, osz[KILN_MAX_DIMS];
  for (int d = 0; d + 1 < x->ndim; d++) { N *= x->sizes[d]; osz[d] = x->sizes[d]; }
  osz[x->ndim - 1] = O;
  struct kiln_tensor *x2 = kiln_reshape(x, 2, (int64_t[]){N, I}), *r = NULL;
  if (x2 && (x->device.type != KILN_CPU || (dt != KILN_F32 && dt != KILN_F64))) {   /* the three ops, on x2 as well */
    struct kiln_tensor *wt = kiln_transpose(w, 0, 1), *y = wt ? kiln_matmul(x2, wt) : NULL;
    kiln_tensor_release(wt);
    kiln_tensor_release(x2);
    if (y && b) { struct kiln_tensor *t = kiln_binary(KILN_OP_ADD, y, b); kiln_tensor_release(y); y = t; }
    if (y && relu) { struct kiln_tensor *t = kiln_unary(KILN_OP_RELU, y); kiln_tensor_release(y); y = t; }
    if (y && x->ndim != 2) { struct kiln_tensor *t = kiln_view(y, x->ndim, osz); kiln_tensor_release(y); y = t; }
    return y;
  }
  struct kiln_tensor *bc = x2 && b ? kiln_contiguous(b) : NULL;
  struct kiln_tensor *out = x2 && (bc || !b) ? kiln_tensor_empty(2, (int64_t[]){N, O}, dt, x->device) : NULL;
  if (out) {
    int64_t ints[1] = {relu ? 1 : 0};
    struct kiln_call call = {.op = KILN_OP_LINEAR, .out = out, .in = {x2, w, bc}, .nin = 3, .nints = 1, .ints = {ints[0]}};
    const struct kiln_tensor *inputs[3] = {x2, w, bc}, *saved[3] = {x2, w, relu ? out : NULL};
    if (!kiln_dispatch(x->device, &call) && !kiln_autograd_record_saved(KILN_OP_LINEAR, out, 3, inputs, NULL, ints, 1, saved, 3))
      r = x->ndim == 2 ? (kiln_tensor_retain(out), out) : kiln_view(out, x->ndim, osz);
  }
  kiln_tensor_release(x2); kiln_tensor_release(bc); kiln_tensor_release(out);
  return r;
}

/* ---- derivatives (named by the op table) ---- */

int kiln_gemm_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct scope sc = {0}, *s = &sc;
  struct kiln_tensor *x = n->saved[0], *y = n->saved[1];
  struct kiln_tensor *r[4] = {0};
  switch (n->kind) {
  case KILN_OP_GEMM: {   /* out = alpha * x @ y (3-d): dx = alpha g y^T, dy = alpha x^T g */
    double alpha = n->scalar[0];
    struct kiln_tensor *yt = !s->failed ? keep(s, kiln_transpose(y, 1, 2)) : NULL;
    struct kiln_tensor *xt = !s->failed ? keep(s, kiln_transpose(x, 1, 2)) : NULL;
    /* A grad comes out in its input's layout: for a transposed operand (Linear's weight:t())
       the product is computed transposed, so the weight's grad needs no strided copy later. */
    struct kiln_tensor *gt = !s->failed ? keep(s, kiln_transpose(g, 1, 2)) : NULL;
    if (n->in[0].needs && !s->failed) {
      if (column_major(x)) r[0] = keep(s, kiln_transpose(keep(s, kiln_matmul(y, gt)), 1, 2));
      else r[0] = keep(s, kiln_matmul(g, yt));
    }
    if (n->in[1].needs && !s->failed) {
      if (column_major(y)) r[1] = keep(s, kiln_transpose(keep(s, kiln_matmul(gt, x)), 1, 2));
      else r[1] = keep(s, kiln_matmul(xt, g));
    }
    /* a batch stride of 0 (one matrix for every batch) sums over the batch */
    for (int k = 0; k < 2; k++)
      if (r[k] && n->in[k].sizes[0] == 1 && r[k]->sizes[0] != 1) r[k] = sum_to(s, r[k], 3, n->in[k].sizes);
    if (alpha != 1) for (int k = 0; k < 2; k++) if (r[k]) r[k] = BS(s, KILN_OP_MUL, r[k], alpha);
    break;
  }
  default:
    scope_end(s);
    return kiln_no_derivative(n);
  }
  return kiln_grad_finish(n, s, r, gin);
}

/* out = relu?(x w^T + b): g through relu (relu_backward on the saved output, as the relu op's
   derivative), then the products and the bias's sum that matmul's and add's derivatives compute,
   the same calls: the grads of the three ops, bit for bit. */
int kiln_linear_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct scope sc = {0}, *s = &sc;
  struct kiln_tensor *x = n->saved[0], *w = n->saved[1], *r[4] = {0};
  struct kiln_tensor *gp = n->ints[0] ? B(s, KILN_OP_RELU_BACKWARD, g, n->saved[2]) : g;
  if (n->in[0].needs && !s->failed) r[0] = keep(s, kiln_matmul(gp, w));
  if (n->in[1].needs && !s->failed) {
    struct kiln_tensor *gt = keep(s, kiln_transpose(gp, 0, 1));
    r[1] = gt ? keep(s, kiln_matmul(gt, x)) : NULL;
  }
  if (n->nin > 2 && n->in[2].needs && !s->failed) r[2] = gp;   /* summed over the rows to the bias's shape */
  return kiln_grad_finish(n, s, r, gin);
}
