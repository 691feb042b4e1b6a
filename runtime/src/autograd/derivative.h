/* derivative.h: what the derivatives beside each family's front end (ops/) share: a scope of
   temporaries released together, short forms of the ops they are written with, and the shape
   helpers for broadcasting and reductions. Derivatives run with grad mode off, on any device. */
#ifndef KILN_DERIVATIVE_H
#define KILN_DERIVATIVE_H
#include "internal.h"

/* Temporaries of one derivative: released together; the first failure stops the rest. */
struct scope {
  struct kiln_tensor *items[48];
  int n, failed;
};

static inline struct kiln_tensor *keep(struct scope *s, struct kiln_tensor *t) {
  if (!t) { s->failed = 1; return NULL; }
  if (s->n == (int)(sizeof s->items / sizeof s->items[0])) { kiln_tensor_release(t); s->failed = 1; kiln_fail(KILN_ERR_MEMORY, "autograd: too many temporaries"); return NULL; }
  s->items[s->n++] = t;
  return t;
}
static inline void scope_end(struct scope *s) { for (int i = 0; i < s->n; i++) kiln_tensor_release(s->items[i]); }
#define OK2(a, b) (!s->failed && (a) && (b))

static inline struct kiln_tensor *U(struct scope *s, int op, const struct kiln_tensor *a) {
  return !s->failed && a ? keep(s, kiln_unary(op, a)) : (s->failed = 1, NULL);
}
static inline struct kiln_tensor *B(struct scope *s, int op, const struct kiln_tensor *a, const struct kiln_tensor *b) {
  return OK2(a, b) ? keep(s, kiln_binary(op, a, b)) : (s->failed = 1, NULL);
}
static inline struct kiln_tensor *BS(struct scope *s, int op, const struct kiln_tensor *a, double v) {
  return !s->failed && a ? keep(s, kiln_binary_scalar(op, a, v, 0)) : (s->failed = 1, NULL);
}
static inline struct kiln_tensor *SB(struct scope *s, int op, double v, const struct kiln_tensor *a) {
  return !s->failed && a ? keep(s, kiln_binary_scalar(op, a, v, 1)) : (s->failed = 1, NULL);
}
static inline struct kiln_tensor *zeros(struct scope *s, int ndim, const int64_t *sizes, int dtype, struct kiln_device dev) {
  return !s->failed ? keep(s, kiln_tensor_full(ndim, sizes, 0, dtype, dev)) : NULL;
}

/* Sum g over the dims that broadcasting added or stretched, down to sizes. */
static inline struct kiln_tensor *sum_to(struct scope *s, const struct kiln_tensor *g, int ndim, const int64_t *sizes) {
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
static inline struct kiln_tensor *unreduce(struct scope *s, const struct kiln_tensor *g, const struct kiln_node *n) {
  if (s->failed || !g) { s->failed = 1; return NULL; }
  const struct edge *e = &n->in[0];
  int64_t mask = n->ints[0], keepdim = n->ints[1];
  if (keepdim || e->ndim == 0) return (struct kiln_tensor *)g;
  int64_t sizes[KILN_MAX_DIMS];
  for (int d = 0; d < e->ndim; d++) sizes[d] = (mask & (1 << d)) ? 1 : e->sizes[d];
  return keep(s, kiln_reshape(g, e->ndim, sizes));
}

static inline int64_t reduced_count(const struct kiln_node *n) {
  int64_t c = 1;
  for (int d = 0; d < n->in[0].ndim; d++) if (n->ints[0] & (1 << d)) c *= n->in[0].sizes[d];
  return c;
}

/* A 3-d tensor whose matrices are stored transposed (column-major), like a view made by t(). */
static inline int column_major(const struct kiln_tensor *t) {
  return t && t->ndim == 3 && t->sizes[1] > 1 && t->sizes[2] > 1 && t->strides[1] == 1 && t->strides[2] == t->sizes[1];
}


/* The common end of a derivative: r[k] brought back to input k's shape (broadcasting) and dtype,
   into gin[k]; the scope released. */
int kiln_grad_finish(struct kiln_node *n, struct scope *s, struct kiln_tensor **r, struct kiln_tensor **gin);
/* The error for a node whose kind has no derivative. */
int kiln_no_derivative(const struct kiln_node *n);

#endif
