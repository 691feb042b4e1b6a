/* autograd.c: graph nodes, the backward walk, and the derivative of every differentiable op.
   Derivatives are written with kiln's own ops (grad mode off), so they run on any device. */
#include "internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local int grad_off;      /* no_grad depth */
static _Thread_local int kernel_depth;  /* inside a kernel: record nothing */

void kiln_kernel_enter(void) { kernel_depth++; }
void kiln_kernel_leave(void) { kernel_depth--; }

KILN_API int kiln_set_grad_enabled(int enabled) {
  int prev = !grad_off;
  grad_off = !enabled;
  return prev;
}
KILN_API int kiln_grad_enabled(void) { return !grad_off; }
int kiln_autograd_active(void) { return !grad_off && kernel_depth == 0; }

/* ---- nodes ---- */

static void node_release(struct kiln_node *n);

static void node_free_saved(struct kiln_node *n) {
  for (int i = 0; i < MAX_SAVED; i++) { kiln_tensor_release(n->saved[i]); n->saved[i] = NULL; }
}

static void node_release(struct kiln_node *n) {
  while (n && __atomic_sub_fetch(&n->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    node_free_saved(n);
    kiln_tensor_release(n->grad);
    struct kiln_node *tail = NULL;
    for (int i = 0; i < n->nin; i++) {
      kiln_tensor_release(n->in[i].leaf);
      if (n->in[i].node) {
        if (!tail) tail = n->in[i].node;       /* released iteratively below, to keep deep graphs off the C stack */
        else node_release(n->in[i].node);
      }
    }
    free(n->in);
    free(n);
    n = tail;
  }
}

void kiln_node_release(void *node) { node_release(node); }

static const char *kind_name(int kind) {
  switch (kind) {
  case KILN_VIEW_RESHAPE: return "View";
  case KILN_VIEW_TRANSPOSE: return "Transpose";
  case KILN_VIEW_PERMUTE: return "Permute";
  case KILN_VIEW_NARROW: return "Narrow";
  case KILN_VIEW_SELECT: return "Select";
  case KILN_VIEW_EXPAND: return "Expand";
  case KILN_VIEW_ALIAS: return "Alias";
  case KILN_GRAD_CLONE: return "Copy";
  default: return kiln_op_name(kind);
  }
}

KILN_API const char *kiln_grad_fn_name(const struct kiln_tensor *t) {
  static _Thread_local char buf[64];
  if (!t || !t->grad_fn) return NULL;
  const char *k = kind_name(((struct kiln_node *)t->grad_fn)->kind);
  snprintf(buf, sizeof buf, "%c%sBackward", k[0] >= 'a' && k[0] <= 'z' ? k[0] - 32 : k[0], k + 1);
  return buf;
}

KILN_API int kiln_is_leaf(const struct kiln_tensor *t) { return t && t->grad_fn == NULL; }

KILN_API int kiln_requires_grad_(struct kiln_tensor *t, int requires_grad) {
  if (kiln_check_live("requires_grad", t)) return kiln_error_code();
  if (t->grad_fn && !requires_grad)
    return kiln_fail(KILN_ERR_STATE, "requires_grad: %s is the result of an op; use detach() to cut it from the graph",
                     kiln_shape_string(t));
  if (requires_grad && !kiln_dtype_is_float(t->dtype))
    return kiln_fail(KILN_ERR_DTYPE, "requires_grad: only float tensors can require grad (got %s %s)",
                     kiln_dtype_name(t->dtype), kiln_shape_string(t));
  t->requires_grad = requires_grad != 0;
  return KILN_OK;
}

int kiln_autograd_wanted(int n, const struct kiln_tensor *const *inputs) {
  if (!kiln_autograd_active()) return 0;
  for (int i = 0; i < n; i++)
    if (inputs[i] && inputs[i]->requires_grad) return 1;
  return 0;
}

int kiln_autograd_check_inplace(const char *op, const struct kiln_tensor *target, const struct kiln_tensor *src) {
  if (!kiln_autograd_active()) return KILN_OK;
  size_t len = strlen(op);
  if (target->requires_grad || (src && src->requires_grad))
    return kiln_fail(KILN_ERR_STATE,
                     "%s%s: in-place change of %s, which %s grad; use an out-of-place op, or run it under no_grad",
                     op, len && op[len - 1] == '_' ? "" : "_", kiln_shape_string(target),
                     target->requires_grad ? "requires" : "would then need");
  return KILN_OK;
}

static struct kiln_tensor *save(const struct kiln_tensor *t) {
  return t ? kiln_detach(t) : NULL;
}

/* Which tensors a kind's derivative reads: bit 0..3 = inputs, bit 4 = the output. */
enum { S_IN0 = 1, S_IN1 = 2, S_IN2 = 4, S_OUT = 16 };
static int saved_for(int kind, int scalar_rhs, int reverse) {
  switch (kind) {
  case KILN_OP_ABS: case KILN_OP_LOG: case KILN_OP_LOG1P: case KILN_OP_SIN: case KILN_OP_COS:
  case KILN_OP_SQUARE: case KILN_OP_ERF: case KILN_OP_CLAMP:
    return S_IN0;
  case KILN_OP_SQRT: case KILN_OP_RSQRT: case KILN_OP_EXP: case KILN_OP_EXPM1: case KILN_OP_TANH:
  case KILN_OP_SIGMOID: case KILN_OP_RELU: case KILN_OP_RECIPROCAL:
    return S_OUT;
  case KILN_OP_MUL: return scalar_rhs ? 0 : S_IN0 | S_IN1;
  case KILN_OP_DIV: return scalar_rhs ? (reverse ? S_OUT | S_IN0 : 0) : S_IN0 | S_IN1;
  case KILN_OP_POW: return scalar_rhs ? S_IN0 | S_OUT : S_IN0 | S_IN1 | S_OUT;
  case KILN_OP_MAXIMUM: case KILN_OP_MINIMUM: case KILN_OP_REMAINDER: return scalar_rhs ? S_IN0 : S_IN0 | S_IN1;
  case KILN_OP_WHERE: return S_IN0;
  case KILN_OP_PROD: case KILN_OP_MAX: case KILN_OP_MIN: case KILN_OP_VAR: case KILN_OP_STD: case KILN_OP_NORM:
  case KILN_OP_LOGSUMEXP:
    return S_IN0 | S_OUT;
  case KILN_OP_GEMM: return S_IN0 | S_IN1;
  case KILN_OP_INDEX_SELECT: case KILN_OP_GATHER: return S_IN1;
  case KILN_OP_SCATTER_ADD: case KILN_OP_MASKED_FILL: case KILN_OP_MASKED_SELECT: return S_IN1;
  }
  return 0;
}

static int differentiable(int kind) {
  switch (kind) {
  case KILN_OP_SIGN: case KILN_OP_FLOOR: case KILN_OP_CEIL: case KILN_OP_ROUND: case KILN_OP_TRUNC:
  case KILN_OP_LOGICAL_NOT: case KILN_OP_EQ: case KILN_OP_NE: case KILN_OP_LT: case KILN_OP_LE:
  case KILN_OP_GT: case KILN_OP_GE: case KILN_OP_LOGICAL_AND: case KILN_OP_LOGICAL_OR:
  case KILN_OP_ARGMAX: case KILN_OP_ARGMIN: case KILN_OP_FILL: case KILN_OP_UNIFORM: case KILN_OP_NORMAL:
  case KILN_OP_RANDINT: case KILN_OP_COPY:
    return 0;
  }
  return 1;
}

/* Which inputs of a kind can carry grad: indices, masks and conditions cannot. */
static int grad_input(int kind, int k) {
  switch (kind) {
  case KILN_OP_WHERE: return k != 0;
  case KILN_OP_INDEX_SELECT: case KILN_OP_GATHER: case KILN_OP_MASKED_FILL: case KILN_OP_MASKED_SELECT: return k == 0;
  case KILN_OP_SCATTER_ADD: return k != 1;
  }
  return 1;
}

int kiln_autograd_record(int kind, struct kiln_tensor *out, int n, const struct kiln_tensor *const *inputs,
                         const double *scalars, const int64_t *ints, int nints, const struct kiln_tensor *extra) {
  if (!kiln_autograd_wanted(n, inputs)) return KILN_OK;
  if (!kiln_dtype_is_float(out->dtype) || (kind < KILN_VIEW_BASE && !differentiable(kind))) return KILN_OK;
  int any = 0;
  for (int k = 0; k < n; k++) any |= inputs[k] && inputs[k]->requires_grad && grad_input(kind, k);
  if (!any) return KILN_OK;
  struct kiln_node *node = calloc(1, sizeof *node);
  struct edge *edges = calloc((size_t)(n > 0 ? n : 1), sizeof *edges);
  if (!node || !edges) { free(node); free(edges); return kiln_fail(KILN_ERR_MEMORY, "autograd: out of memory for a node"); }
  node->refcount = 1;
  node->kind = kind;
  node->nin = n;
  node->in = edges;
  for (int k = 0; k < n; k++) {
    const struct kiln_tensor *t = inputs[k];
    struct edge *e = &edges[k];
    if (!t) continue;
    e->ndim = t->ndim;
    e->dtype = t->dtype;
    e->device = t->device;
    memcpy(e->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
    e->needs = t->requires_grad && grad_input(kind, k);
    if (!e->needs) continue;
    if (t->grad_fn) {
      e->node = t->grad_fn;
      __atomic_add_fetch(&e->node->refcount, 1, __ATOMIC_RELAXED);
    } else {
      e->leaf = (struct kiln_tensor *)t;
      kiln_tensor_retain(e->leaf);
    }
  }
  if (scalars) memcpy(node->scalar, scalars, sizeof node->scalar);
  if (ints && nints > 0) memcpy(node->ints, ints, sizeof(int64_t) * (size_t)nints);
  node->nints = nints;
  node->out_ndim = out->ndim;
  memcpy(node->out_sizes, out->sizes, sizeof(int64_t) * (size_t)out->ndim);
  int scalar_rhs = kind < KILN_VIEW_BASE && n == 1 && (kind >= KILN_OP_ADD && kind <= KILN_OP_LOGICAL_OR);
  int which = kind < KILN_VIEW_BASE ? saved_for(kind, scalar_rhs, ints && nints > 1 && ints[1]) : 0;
  int slot = 0;
  for (int k = 0; k < 3; k++)
    if (which & (1 << k)) node->saved[k] = save(k < n ? inputs[k] : NULL);
  if (which & S_OUT) node->saved[3] = save(out);
  if (extra) node->saved[2] = save(extra);
  (void)slot;
  for (int k = 0; k < MAX_SAVED; k++)
    if (node->saved[k]) node->saved_version[k] = node->saved[k]->storage->version;
  out->grad_fn = node;
  out->requires_grad = 1;
  return KILN_OK;
}

int kiln_autograd_record_saved(int kind, struct kiln_tensor *out, int n, const struct kiln_tensor *const *inputs,
                               const double *scalars, const int64_t *ints, int nints,
                               const struct kiln_tensor *const *saved, int nsaved) {
  if (!kiln_autograd_wanted(n, inputs) || !kiln_dtype_is_float(out->dtype)) return KILN_OK;
  int rc = kiln_autograd_record(kind, out, n, inputs, scalars, ints, nints, NULL);
  struct kiln_node *node = out->grad_fn;
  if (rc || !node || node->kind != kind) return rc;
  node_free_saved(node);
  for (int k = 0; k < nsaved && k < MAX_SAVED; k++) {
    if (!saved[k]) continue;
    /* the output itself is saved detached, like every saved tensor, so it holds no cycle */
    node->saved[k] = kiln_detach(saved[k]);
    if (!node->saved[k]) return kiln_error_code();
    node->saved_version[k] = node->saved[k]->storage->version;
  }
  return KILN_OK;
}

int kiln_autograd_record_call(const struct kiln_call *c, struct kiln_tensor *out) {
  const struct kiln_tensor *ins[4] = {0};
  int n = 0;
  for (int k = 0; k < c->nin && k < 4; k++)
    if (c->in[k]) ins[n++] = c->in[k];
  return kiln_autograd_record(c->op, out, n, ins, c->scalar, c->ints, c->nints, NULL);
}

KILN_API struct kiln_tensor *kiln_detach(const struct kiln_tensor *t) {
  if (kiln_check_live("detach", t)) return NULL;
  return kiln_tensor_header(t->ndim, t->sizes, t->strides, t->offset, t->dtype, t->device, t->storage);
}

KILN_API int kiln_set_grad(struct kiln_tensor *t, const struct kiln_tensor *grad) {
  if (kiln_check_live("set_grad", t)) return kiln_error_code();
  if (grad) {
    if (kiln_check_live("set_grad", grad)) return kiln_error_code();
    if (grad->ndim != t->ndim || memcmp(grad->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim) != 0)
      return kiln_fail(KILN_ERR_SHAPE, "set_grad: grad %s does not match tensor %s", kiln_shape_string(grad), kiln_shape_string(t));
    kiln_tensor_retain((struct kiln_tensor *)grad);
  }
  kiln_tensor_release(t->grad);
  t->grad = (struct kiln_tensor *)grad;
  return KILN_OK;
}

/* ---- derivatives ---- */

/* Temporaries of one derivative: released together; the first failure stops the rest. */
struct scope {
  struct kiln_tensor *items[48];
  int n, failed;
};

static struct kiln_tensor *keep(struct scope *s, struct kiln_tensor *t) {
  if (!t) { s->failed = 1; return NULL; }
  if (s->n == (int)(sizeof s->items / sizeof s->items[0])) { kiln_tensor_release(t); s->failed = 1; kiln_fail(KILN_ERR_MEMORY, "autograd: too many temporaries"); return NULL; }
  s->items[s->n++] = t;
  return t;
}
static void scope_end(struct scope *s) { for (int i = 0; i < s->n; i++) kiln_tensor_release(s->items[i]); }
#define OK2(a, b) (!s->failed && (a) && (b))

static struct kiln_tensor *U(struct scope *s, int op, const struct kiln_tensor *a) {
  return !s->failed && a ? keep(s, kiln_unary(op, a)) : (s->failed = 1, NULL);
}
static struct kiln_tensor *B(struct scope *s, int op, const struct kiln_tensor *a, const struct kiln_tensor *b) {
  return OK2(a, b) ? keep(s, kiln_binary(op, a, b)) : (s->failed = 1, NULL);
}
static struct kiln_tensor *BS(struct scope *s, int op, const struct kiln_tensor *a, double v) {
  return !s->failed && a ? keep(s, kiln_binary_scalar(op, a, v, 0)) : (s->failed = 1, NULL);
}
static struct kiln_tensor *SB(struct scope *s, int op, double v, const struct kiln_tensor *a) {
  return !s->failed && a ? keep(s, kiln_binary_scalar(op, a, v, 1)) : (s->failed = 1, NULL);
}
static struct kiln_tensor *zeros(struct scope *s, int ndim, const int64_t *sizes, int dtype, struct kiln_device dev) {
  return !s->failed ? keep(s, kiln_tensor_full(ndim, sizes, 0, dtype, dev)) : NULL;
}

/* Sum g over the dims that broadcasting added or stretched, down to sizes. */
static struct kiln_tensor *sum_to(struct scope *s, const struct kiln_tensor *g, int ndim, const int64_t *sizes) {
  if (s->failed || !g) { s->failed = 1; return NULL; }
  int lead = g->ndim - ndim, dims[KILN_MAX_DIMS], nd = 0;
  for (int d = 0; d < g->ndim; d++)
    if (d < lead || (sizes[d - lead] == 1 && g->sizes[d] != 1)) dims[nd++] = d;
  if (nd == 0 && g->ndim == ndim) return (struct kiln_tensor *)g;
  struct kiln_tensor *r = keep(s, kiln_reduce(KILN_OP_SUM, g, nd, dims, 1, 0));
  if (!r) return NULL;
  return keep(s, kiln_reshape(r, ndim, sizes));
}

/* g shaped like the output of a reduction, brought back to the input's rank (for broadcasting). */
static struct kiln_tensor *unreduce(struct scope *s, const struct kiln_tensor *g, const struct kiln_node *n) {
  if (s->failed || !g) { s->failed = 1; return NULL; }
  const struct edge *e = &n->in[0];
  int64_t mask = n->ints[0], keepdim = n->ints[1];
  if (keepdim || e->ndim == 0) return (struct kiln_tensor *)g;
  int64_t sizes[KILN_MAX_DIMS];
  for (int d = 0; d < e->ndim; d++) sizes[d] = (mask & (1 << d)) ? 1 : e->sizes[d];
  return keep(s, kiln_reshape(g, e->ndim, sizes));
}

static int64_t reduced_count(const struct kiln_node *n) {
  int64_t c = 1;
  for (int d = 0; d < n->in[0].ndim; d++) if (n->ints[0] & (1 << d)) c *= n->in[0].sizes[d];
  return c;
}

/* A 3-d tensor whose matrices are stored transposed (column-major), like a view made by t(). */
static int column_major(const struct kiln_tensor *t) {
  return t && t->ndim == 3 && t->sizes[1] > 1 && t->sizes[2] > 1 && t->strides[1] == 1 && t->strides[2] == t->sizes[1];
}

/* The derivative of node n: gin[k] (new references, or NULL for zero) from the output grad g. */
static int derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct scope sc = {0}, *s = &sc;
  struct kiln_tensor *x = n->saved[0], *y = n->saved[1], *out = n->saved[3];
  struct kiln_tensor *r[4] = {0};
  int scalar_rhs = n->kind >= KILN_OP_ADD && n->kind <= KILN_OP_LOGICAL_OR && n->nin == 1;
  double sv = n->scalar[0];
  int reverse = n->nints > 1 && n->ints[1];
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
  /* relu's output is 0 or positive, so its sign is the mask (and stays in g's dtype: no bool pass) */
  case KILN_OP_RELU: r[0] = B(s, KILN_OP_MUL, g, U(s, KILN_OP_SIGN, out)); break;
  case KILN_OP_RECIPROCAL: r[0] = B(s, KILN_OP_MUL, U(s, KILN_OP_NEG, g), U(s, KILN_OP_SQUARE, out)); break;
  case KILN_OP_SQUARE: r[0] = B(s, KILN_OP_MUL, g, BS(s, KILN_OP_MUL, x, 2)); break;
  case KILN_OP_ERF:
    r[0] = B(s, KILN_OP_MUL, g, BS(s, KILN_OP_MUL, U(s, KILN_OP_EXP, U(s, KILN_OP_NEG, U(s, KILN_OP_SQUARE, x))), 2 / sqrt(M_PI)));
    break;
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
  case KILN_OP_CAT: {
    int d = (int)n->ints[0];
    int64_t start = 0;
    for (int k = 0; k < n->nin; k++) {
      const struct edge *e = &n->in[k];
      if (e->ndim == 1 && e->sizes[0] == 0 && n->out_ndim != 1) continue;
      if (e->needs && !s->failed) {
        struct kiln_tensor *part = keep(s, kiln_narrow(g, d, start, e->sizes[d]));
        if (part) gin[k] = kiln_contiguous(part);
      }
      start += e->sizes[d];
    }
    scope_end(s);
    for (int k = 0; k < n->nin; k++) if (n->in[k].needs && !gin[k]) { for (int j = 0; j < n->nin; j++) { kiln_tensor_release(gin[j]); gin[j] = NULL; } return kiln_error_code() ? kiln_error_code() : KILN_ERR_MEMORY; }
    return KILN_OK;
  }
  case KILN_OP_INDEX_SELECT: {   /* scatter the rows back: index expanded along the other dims */
    const struct edge *e = &n->in[0];
    int d = (int)n->ints[0];
    struct kiln_tensor *z = zeros(s, e->ndim, e->sizes, g->dtype, g->device);
    if (e->ndim == 0) { r[0] = g; break; }
    int64_t shp[KILN_MAX_DIMS];
    for (int k = 0; k < g->ndim; k++) shp[k] = k == d ? g->sizes[k] : 1;
    struct kiln_tensor *iv = !s->failed ? keep(s, kiln_reshape(y, g->ndim, shp)) : NULL;
    struct kiln_tensor *ie = !s->failed ? keep(s, kiln_expand(iv, g->ndim, g->sizes)) : NULL;
    if (!s->failed && kiln_scatter_add_(z, d, ie, g)) s->failed = 1;
    r[0] = z;
    break;
  }
  case KILN_OP_GATHER: {
    const struct edge *e = &n->in[0];
    struct kiln_tensor *z = zeros(s, e->ndim, e->sizes, g->dtype, g->device);
    if (!s->failed && kiln_scatter_add_(z, (int)n->ints[0], y, g)) s->failed = 1;
    r[0] = z;
    break;
  }
  case KILN_OP_SCATTER_ADD:   /* out = a + scatter(src): d a = g, d src = gather(g) */
    r[0] = g;
    if (n->nin > 2 && n->in[2].needs) r[2] = !s->failed ? keep(s, kiln_gather(g, (int)n->ints[0], y)) : NULL;
    break;
  case KILN_OP_MASKED_FILL:
    r[0] = !s->failed ? keep(s, kiln_masked_fill(g, y, 0)) : NULL;
    break;
  case KILN_OP_MASKED_SELECT: {  /* put g back where the (broadcast) mask is true */
    const struct edge *e = &n->in[0];
    int nd;
    int64_t shape[KILN_MAX_DIMS];
    if (kiln_broadcast_shapes("masked_select", e->ndim, e->sizes, y->ndim, y->sizes, &nd, shape)) { s->failed = 1; break; }
    struct kiln_tensor *z = zeros(s, nd, shape, g->dtype, g->device);
    struct kiln_tensor *m = !s->failed ? keep(s, kiln_expand(y, nd, shape)) : NULL;
    struct kiln_tensor *mi = !s->failed ? keep(s, kiln_to_dtype(m, KILN_I64)) : NULL;
    struct kiln_tensor *flat_m = !s->failed ? keep(s, kiln_reshape(mi, 1, (int64_t[]){-1})) : NULL;
    struct kiln_tensor *flat_z = !s->failed ? keep(s, kiln_reshape(z, 1, (int64_t[]){-1})) : NULL;
    if (!s->failed) {
      /* positions of the true elements, in order: where(mask, arange, -1) then masked_select */
      struct kiln_tensor *pos = keep(s, kiln_tensor_arange(0, (double)flat_m->numel, 1, KILN_I64, g->device));
      struct kiln_tensor *mb = keep(s, kiln_to_dtype(flat_m, KILN_BOOL));
      struct kiln_tensor *sel = OK2(pos, mb) ? keep(s, kiln_masked_select(pos, mb)) : NULL;
      if (sel && kiln_scatter_add_(flat_z, 0, sel, g)) s->failed = 1;
    }
    r[0] = sum_to(s, z, e->ndim, e->sizes);
    break;
  }
  case KILN_VIEW_RESHAPE: r[0] = !s->failed ? keep(s, kiln_reshape(g, n->in[0].ndim, n->in[0].sizes)) : NULL; break;
  case KILN_VIEW_TRANSPOSE: r[0] = !s->failed ? keep(s, kiln_transpose(g, (int)n->ints[0], (int)n->ints[1])) : NULL; break;
  case KILN_VIEW_PERMUTE: {
    int inv[KILN_MAX_DIMS];
    for (int k = 0; k < n->nints; k++) inv[n->ints[k]] = k;
    r[0] = !s->failed ? keep(s, kiln_permute(g, n->nints, inv)) : NULL;
    break;
  }
  case KILN_VIEW_NARROW: case KILN_VIEW_SELECT: {
    const struct edge *e = &n->in[0];
    struct kiln_tensor *z = zeros(s, e->ndim, e->sizes, g->dtype, g->device);
    struct kiln_tensor *part = NULL;
    if (!s->failed)
      part = keep(s, n->kind == KILN_VIEW_NARROW ? kiln_narrow(z, (int)n->ints[0], n->ints[1], n->ints[2])
                                                 : kiln_select(z, (int)n->ints[0], n->ints[1]));
    if (part && kiln_copy_(part, g)) s->failed = 1;
    r[0] = z;
    break;
  }
  case KILN_VIEW_EXPAND: r[0] = sum_to(s, g, n->in[0].ndim, n->in[0].sizes); break;
  case KILN_VIEW_ALIAS: r[0] = g; break;
  case KILN_GRAD_CLONE: {
    const struct edge *e = &n->in[0];
    struct kiln_tensor *gd = !s->failed ? keep(s, kiln_to_device(g, e->device)) : NULL;
    r[0] = !s->failed ? keep(s, kiln_to_dtype(gd, e->dtype)) : NULL;
    break;
  }
  default:
    scope_end(s);
    /* the fused ops (nn.c, optim.c) keep their derivatives beside their front ends */
    if (n->kind >= KILN_OP_CONV2D && n->kind < KILN_OP_COUNT) return kiln_nn_derivative(n, g, gin);
    return kiln_fail(KILN_ERR_UNSUPPORTED, "backward: no derivative for %s", kind_name(n->kind));
  }
  int rc = KILN_OK;
  if (s->failed) rc = kiln_error_code() ? kiln_error_code() : KILN_ERR_STATE;
  for (int k = 0; k < n->nin && k < 4 && !rc; k++) {
    if (!n->in[k].needs || !r[k]) continue;
    /* elementwise ops broadcast: bring the grad back to the input's shape and dtype */
    struct kiln_tensor *t = sum_to(s, r[k], n->in[k].ndim, n->in[k].sizes);
    if (t && t->dtype != n->in[k].dtype) t = keep(s, kiln_to_dtype(t, n->in[k].dtype));
    if (!t) { rc = kiln_error_code(); break; }
    kiln_tensor_retain(t);
    gin[k] = t;
  }
  if (rc) for (int k = 0; k < 4; k++) { kiln_tensor_release(gin[k]); gin[k] = NULL; }
  scope_end(s);
  return rc;
}

/* ---- the backward walk ---- */

struct nodelist { struct kiln_node **items; int n, cap; };
static int push(struct nodelist *l, struct kiln_node *x) {
  if (l->n == l->cap) {
    int cap = l->cap ? l->cap * 2 : 64;
    struct kiln_node **p = realloc(l->items, sizeof *p * (size_t)cap);
    if (!p) return kiln_fail(KILN_ERR_MEMORY, "backward: out of memory");
    l->items = p;
    l->cap = cap;
  }
  l->items[l->n++] = x;
  return KILN_OK;
}

/* Add g into *acc. A node's grad is only ever replaced (out-of-place sums), so it takes g as it
   is; a leaf's grad is added to in place later, so it takes g only when nothing else holds g. */
static int accumulate(struct kiln_tensor **acc, struct kiln_tensor *g, int in_place) {
  if (!*acc) {
    if (!in_place || (g->refcount == 1 && g->storage->refcount == 1 && kiln_is_contiguous(g))) {
      kiln_tensor_retain(g);
      *acc = g;
      return KILN_OK;
    }
    *acc = kiln_clone(g);
    return *acc ? KILN_OK : kiln_error_code();
  }
  if (in_place) return kiln_binary_(KILN_OP_ADD, *acc, g);
  struct kiln_tensor *sum = kiln_binary(KILN_OP_ADD, *acc, g);
  if (!sum) return kiln_error_code();
  kiln_tensor_release(*acc);
  *acc = sum;
  return KILN_OK;
}

KILN_API int kiln_backward(struct kiln_tensor *root, const struct kiln_tensor *grad, int retain_graph) {
  if (kiln_check_live("backward", root)) return kiln_error_code();
  if (!root->requires_grad)
    return kiln_fail(KILN_ERR_STATE, "backward: tensor %s does not require grad (no op on it recorded a graph)", kiln_shape_string(root));
  struct kiln_tensor *g0 = NULL;
  if (grad) {
    if (kiln_check_live("backward", grad)) return kiln_error_code();
    if (grad->ndim != root->ndim || memcmp(grad->sizes, root->sizes, sizeof(int64_t) * (size_t)root->ndim) != 0)
      return kiln_fail(KILN_ERR_SHAPE, "backward: grad %s does not match the output %s", kiln_shape_string(grad), kiln_shape_string(root));
    g0 = kiln_to_dtype(grad, root->dtype);
  } else {
    if (root->numel != 1)
      return kiln_fail(KILN_ERR_SHAPE, "backward: output %s has %lld elements; give the grad of a non-scalar output",
                       kiln_shape_string(root), (long long)root->numel);
    g0 = kiln_tensor_full(root->ndim, root->sizes, 1.0, root->dtype, root->device);
  }
  if (!g0) return kiln_error_code();
  int prev = kiln_set_grad_enabled(0);
  int rc = KILN_OK;
  if (!root->grad_fn) {   /* a leaf: its grad is the given grad */
    rc = accumulate(&root->grad, g0, 1);
    kiln_tensor_release(g0);
    kiln_set_grad_enabled(prev);
    return rc;
  }
  /* Count, for each reachable node, the edges that lead into it. */
  struct nodelist all = {0}, ready = {0};
  struct kiln_node *start = root->grad_fn;
  rc = push(&all, start);
  start->visited = 1;
  for (int i = 0; i < all.n && !rc; i++) {
    struct kiln_node *n = all.items[i];
    for (int k = 0; k < n->nin; k++) {
      struct kiln_node *m = n->in[k].node;
      if (!m) continue;
      m->pending++;
      if (!m->visited) { m->visited = 1; rc = push(&all, m); if (rc) break; }
    }
  }
  if (!rc) { start->grad = g0; g0 = NULL; rc = push(&ready, start); }
  while (!rc && ready.n > 0) {
    struct kiln_node *n = ready.items[--ready.n];
    if (n->released) {
      rc = kiln_fail(KILN_ERR_STATE, "backward: the graph through %s was already used and its saved tensors freed; "
                     "pass retain_graph to the first backward", kind_name(n->kind));
      break;
    }
    for (int k = 0; k < MAX_SAVED; k++)
      if (n->saved[k] && n->saved[k]->storage->version != n->saved_version[k]) {
        rc = kiln_fail(KILN_ERR_STATE, "backward: a tensor %s saved by %s was changed in place after it was used",
                       kiln_shape_string(n->saved[k]), kind_name(n->kind));
        break;
      }
    if (rc) break;
    struct kiln_tensor *gin_small[4] = {0}, **gin = gin_small;
    if (n->nin > 4) {
      gin = calloc((size_t)n->nin, sizeof *gin);
      if (!gin) { rc = kiln_fail(KILN_ERR_MEMORY, "backward: out of memory"); break; }
    }
    struct kiln_tensor *g = n->grad;
    rc = g ? derivative(n, g, gin) : KILN_OK;
    kiln_tensor_release(n->grad);
    n->grad = NULL;
    for (int k = 0; k < n->nin; k++) {
      struct edge *e = &n->in[k];
      if (!rc && gin[k]) {
        if (e->node) rc = accumulate(&e->node->grad, gin[k], 0);
        else if (e->leaf) rc = accumulate(&e->leaf->grad, gin[k], 1);
      }
      kiln_tensor_release(gin[k]);
      if (e->node && --e->node->pending == 0 && !rc) rc = push(&ready, e->node);
    }
    if (gin != gin_small) free(gin);
    if (!retain_graph) { node_free_saved(n); n->released = 1; }
  }
  for (int i = 0; i < all.n; i++) {
    all.items[i]->visited = 0;
    all.items[i]->pending = 0;
    kiln_tensor_release(all.items[i]->grad);
    all.items[i]->grad = NULL;
  }
  free(all.items);
  free(ready.items);
  kiln_tensor_release(g0);
  kiln_set_grad_enabled(prev);
  return rc;
}
