/* autograd.c: graph nodes, the backward walk, and the derivative of every differentiable op.
   Derivatives are written with kiln's own ops (grad mode off), so they run on any device. */
#include "internal.h"
#include "derivative.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

/* ---- nodes ---- */

static void node_release(struct kiln_node *n);

static void node_free_saved(struct kiln_node *n) {
  for (int i = 0; i < MAX_SAVED; i++) { kiln_tensor_release(n->saved[i]); n->saved[i] = NULL; }
}

static void function_node_freed(struct kiln_node *n);

static void node_release(struct kiln_node *n) {
  while (n && __atomic_sub_fetch(&n->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    node_free_saved(n);
    kiln_tensor_release(n->grad);
    if (n->kind == KILN_FUNCTION) function_node_freed(n);
    struct kiln_node *tail = NULL;
    for (int i = 0; i < n->nin; i++) {
      kiln_tensor_release(n->in[i].leaf);
      if (n->in[i].node) {
        if (!tail) tail = n->in[i].node;       /* released iteratively below, to keep deep graphs off the C stack */
        else node_release(n->in[i].node);
      }
    }
    free(n->in);
    free(n->strided);
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
  case KILN_FUNCTION: case KILN_FUNCTION_OUTPUT: return "Function";
  case KILN_VIEW_AS_STRIDED: return "AsStrided";
  case KILN_COPY_SLICES: return "CopySlices";
  default: return kiln_op_name(kind);
  }
}

/* A node's name in messages: a custom function by the name it was given. */
static const char *node_name(const struct kiln_node *n) {
  if (n->kind == KILN_FUNCTION_OUTPUT && n->nin == 1 && n->in[0].node) n = n->in[0].node;
  if (n->kind == KILN_FUNCTION && n->function_name) return n->function_name;
  return kind_name(n->kind);
}

KILN_API const char *kiln_grad_fn_name(const struct kiln_tensor *t) {
  static _Thread_local char buf[64];
  if (t) kiln_autograd_refresh((struct kiln_tensor *)t);
  if (!t || !t->grad_fn) return NULL;
  const struct kiln_node *n = t->grad_fn;
  if (n->kind == KILN_COPY_SLICES) return "CopySlices";   /* PyTorch's name, without Backward */
  const char *k = node_name(n);
  snprintf(buf, sizeof buf, "%c%sBackward", k[0] >= 'a' && k[0] <= 'z' ? k[0] - 32 : k[0], k + 1);
  return buf;
}

KILN_API int kiln_is_leaf(const struct kiln_tensor *t) {
  if (t) kiln_autograd_refresh((struct kiln_tensor *)t);
  return t && t->grad_fn == NULL;
}

KILN_API int kiln_requires_grad_(struct kiln_tensor *t, int requires_grad) {
  if (kiln_check_live("requires_grad", t) || kiln_autograd_refresh(t)) return kiln_error_code();
  if (t->grad_fn && !requires_grad)
    return kiln_fail(KILN_ERR_STATE, "requires_grad: %s is the result of an op; use detach() to cut it from the graph",
                     kiln_shape_string(t));
  if (requires_grad && !kiln_dtype_is_float(t->dtype))
    return kiln_fail(KILN_ERR_DTYPE, "requires_grad: only float tensors can require grad (got %s %s)",
                     kiln_dtype_name(t->dtype), kiln_shape_string(t));
  if (requires_grad && !t->grad_fn && t->base) {
    /* a leaf of its own now: it no longer follows its base (nor holds it, so no graph holds it) */
    kiln_tensor_release(t->base);
    t->base = NULL;
    t->history_version = 0;
  }
  if (!t->base && t->requires_grad != (requires_grad != 0)) t->history_version++;   /* its views follow */
  t->requires_grad = requires_grad != 0;
  return KILN_OK;
}

/* ---- views: their bases, and in-place ops on them ---- */

/* Elements that share memory: a dim of more than one element with stride 0 (expand). */
static int overlapping(const struct kiln_tensor *t) {
  for (int d = 0; d < t->ndim; d++)
    if (t->sizes[d] > 1 && t->strides[d] == 0) return 1;
  return 0;
}

void kiln_view_set_base(struct kiln_tensor *v, const struct kiln_tensor *t) {
  struct kiln_tensor *b = t->base ? t->base : (struct kiln_tensor *)t;
  if (kiln_autograd_active()) {
    kiln_autograd_refresh((struct kiln_tensor *)t);   /* v's history will be derived from t's (a failure: v refreshes later) */
    v->history_version = t->base ? t->history_version : b->history_version;
  } else {
    v->history_version = -1;
  }
  kiln_tensor_retain(b);
  v->base = b;
}

/* A node of kind with nin edges (none set), and the geometry of a view when it needs one. */
static struct kiln_node *node_new(int kind, int nin, int strided) {
  kiln_tensor_set_grad_fn_release(kiln_node_release);   /* tensors let go of nodes through it */
  struct kiln_node *node = calloc(1, sizeof *node);
  struct edge *edges = calloc((size_t)(nin > 0 ? nin : 1), sizeof *edges);
  struct kiln_strided *g = strided ? calloc(1, sizeof *g) : NULL;
  if (!node || !edges || (strided && !g)) {
    free(node); free(edges); free(g);
    kiln_fail(KILN_ERR_MEMORY, "autograd: out of memory for a node");
    return NULL;
  }
  node->refcount = 1;
  node->kind = kind;
  node->nin = nin;
  node->in = edges;
  node->strided = g;
  return node;
}

static void strided_of(struct kiln_strided *g, const struct kiln_tensor *v, const struct kiln_tensor *b) {
  g->ndim = v->ndim;
  memcpy(g->sizes, v->sizes, sizeof(int64_t) * (size_t)v->ndim);
  memcpy(g->strides, v->strides, sizeof(int64_t) * (size_t)v->ndim);
  g->offset = v->offset - b->offset;
  g->base_ndim = b->ndim;
  memcpy(g->base_sizes, b->sizes, sizeof(int64_t) * (size_t)b->ndim);
  memcpy(g->base_strides, b->strides, sizeof(int64_t) * (size_t)b->ndim);
}

static void edge_init(struct edge *e, const struct kiln_tensor *t, int needs);

KILN_API int kiln_autograd_refresh(struct kiln_tensor *t) {
  struct kiln_tensor *b = t ? t->base : NULL;
  if (!b || t->history_version < 0 || t->history_version == b->history_version) return KILN_OK;
  /* A base whose elements share memory (a detached expand) has no layout a view's grad could be
     placed in: its views keep the history they have (and in-place ops on them are refused). */
  if (overlapping(b)) { t->history_version = b->history_version; return KILN_OK; }
  struct kiln_node *n = NULL;
  if (b->requires_grad) {   /* t's history: its base's, viewed */
    n = node_new(KILN_VIEW_AS_STRIDED, 1, 1);
    if (!n) return kiln_error_code();
    edge_init(&n->in[0], b, 1);
    strided_of(n->strided, t, b);
    n->out_ndim = t->ndim;
    memcpy(n->out_sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
  }
  if (t->grad_fn) node_release(t->grad_fn);
  t->grad_fn = n;
  t->requires_grad = n != NULL;
  t->history_version = b->history_version;
  return KILN_OK;
}

int kiln_autograd_wanted(int n, const struct kiln_tensor *const *inputs) {
  if (!kiln_autograd_active()) return 0;
  for (int i = 0; i < n; i++)   /* a view whose base an in-place op changed takes the base's history */
    if (inputs[i] && inputs[i]->base) kiln_autograd_refresh((struct kiln_tensor *)inputs[i]);
  for (int i = 0; i < n; i++)
    if (inputs[i] && inputs[i]->requires_grad) return 1;
  return 0;
}

/* A view taken under no_grad of a tensor that requires grad, changed in place with grad mode on:
   refused, as PyTorch does (its history could not say what the view's values were). */
static int no_grad_view(const char *op, const char *u, const struct kiln_tensor *t) {
  return kiln_fail(KILN_ERR_STATE,
                   "%s%s: in-place change of %s, a view taken under no_grad of a tensor that requires grad: "
                   "take the view with grad mode on, or make the change under no_grad too",
                   op, u, kiln_shape_string(t));
}

int kiln_autograd_check_inplace(const char *op, const struct kiln_tensor *target, const struct kiln_tensor *src) {
  if (!kiln_autograd_active()) return KILN_OK;
  size_t len = strlen(op);
  const char *u = len && op[len - 1] == '_' ? "" : "_";
  if ((target->base && kiln_autograd_refresh((struct kiln_tensor *)target)) ||
      (src && src->base && kiln_autograd_refresh((struct kiln_tensor *)src)))
    return kiln_error_code();
  if (target->base && target->history_version < 0 && target->base->requires_grad) return no_grad_view(op, u, target);
  if (target->requires_grad && !target->grad_fn)
    return kiln_fail(KILN_ERR_STATE,
                     "%s%s: in-place change of %s, a leaf that requires grad (a parameter): backward would lose the "
                     "value it had; update parameters under no_grad, as optimizers do, or change a clone()",
                     op, u, kiln_shape_string(target));
  if (target->requires_grad || (src && src->requires_grad))
    return kiln_fail(KILN_ERR_STATE,
                     "%s%s: in-place change of %s, which %s grad: this C call does not record it; use the out-of-place "
                     "op (the Lua methods record in-place ops: kiln_autograd_assign)",
                     op, u, kiln_shape_string(target), target->requires_grad ? "requires" : "would then need");
  return KILN_OK;
}

/* The in-place op on view t of base b, as b sees it (PyTorch's CopySlices): t's values become r's,
   b's history becomes a node whose edge 0 is b's old history (the grad outside t's region) and edge
   1 r's (the grad inside it), and t's history a view of b's. */
static int copy_slices(struct kiln_tensor *t, struct kiln_tensor *b, struct kiln_tensor *r, const char *op) {
  if (t->history_version < 0) return no_grad_view(op, "", t);
  if (b->requires_grad && !b->grad_fn)
    return kiln_fail(KILN_ERR_STATE,
                     "%s: in-place change of %s, a view of a leaf that requires grad (a parameter %s): backward would "
                     "lose the value it had; update parameters under no_grad, as optimizers do, or change a clone()",
                     op, kiln_shape_string(t), kiln_shape_string(b));
  if (overlapping(t) || overlapping(b))
    return kiln_fail(KILN_ERR_STATE,
                     "%s: in-place change of %s, a view of %s whose elements share memory (strides %s, an expand), "
                     "under autograd: use the out-of-place op, or change a contiguous() copy",
                     op, kiln_shape_string(t), kiln_shape_string(b),
                     kiln_sizes_string(overlapping(t) ? t->ndim : b->ndim, overlapping(t) ? t->strides : b->strides));
  int whole = t->numel == b->numel;   /* t covers b: b's old values, and their history, are gone */
  int need0 = b->requires_grad && !whole, need1 = r->requires_grad;
  struct kiln_node *cs = NULL;
  if (need0 || need1) {
    cs = node_new(KILN_COPY_SLICES, 2, 1);
    if (!cs) return kiln_error_code();
    edge_init(&cs->in[0], b, need0);
    edge_init(&cs->in[1], r, need1);
    strided_of(cs->strided, t, b);
    cs->out_ndim = b->ndim;
    memcpy(cs->out_sizes, b->sizes, sizeof(int64_t) * (size_t)b->ndim);
  }
  int prev = kiln_set_grad_enabled(0);
  int rc = kiln_copy_(t, r);
  kiln_set_grad_enabled(prev);
  if (rc) {
    if (cs) node_release(cs);
    return rc;
  }
  if (b->grad_fn) node_release(b->grad_fn);   /* cs holds it, when it still matters */
  b->grad_fn = cs;
  b->requires_grad = cs != NULL;
  b->history_version++;
  return kiln_autograd_refresh(t);   /* t: a view of b's new history */
}

KILN_API int kiln_autograd_assign(struct kiln_tensor *t, struct kiln_tensor *r, const char *op) {
  if (kiln_check_live("assign", t) || kiln_check_live("assign", r)) return kiln_error_code();
  if (!op) op = "in-place op";
  if (t->ndim != r->ndim || memcmp(t->sizes, r->sizes, sizeof(int64_t) * (size_t)t->ndim) != 0)
    return kiln_fail(KILN_ERR_SHAPE, "%s: the result %s does not fit in place into %s", op, kiln_shape_string(r),
                     kiln_shape_string(t));
  if (t->dtype != r->dtype)
    return kiln_fail(KILN_ERR_DTYPE, "%s: the result is %s, %s cannot hold it in place", op, kiln_dtype_name(r->dtype),
                     kiln_dtype_name(t->dtype));
  if (kiln_autograd_refresh(t) || kiln_autograd_refresh(r)) return kiln_error_code();
  int grad = kiln_grad_enabled();
  if (t->requires_grad && !t->grad_fn && grad)
    return kiln_fail(KILN_ERR_STATE,
                     "%s: in-place change of %s, a leaf that requires grad (a parameter): backward would lose the "
                     "value it had; update parameters under no_grad, as optimizers do, or change a clone()",
                     op, kiln_shape_string(t));
  struct kiln_node *n = r->grad_fn;
  int prev = kiln_set_grad_enabled(0);
  int rc = KILN_OK;
  /* what r's node saved from t's storage must keep its values: a copy */
  for (int k = 0; n && k < MAX_SAVED && !rc; k++) {
    struct kiln_tensor *sv = n->saved[k];
    if (!sv || sv->storage != t->storage) continue;
    struct kiln_tensor *copy = kiln_clone(sv);
    if (!copy) { rc = kiln_error_code(); break; }
    kiln_tensor_release(sv);
    n->saved[k] = copy;
    n->saved_version[k] = copy->storage->version;
  }
  kiln_set_grad_enabled(prev);
  if (rc) return rc;
  struct kiln_tensor *b = t->base;
  /* a view of a base nothing else sees (a temporary an op made, as matmul does): only t and the
     base hold the storage, and only t the base. t is changed like any tensor, and is a view no more */
  if (b && __atomic_load_n(&b->refcount, __ATOMIC_RELAXED) == 1 &&
      __atomic_load_n(&t->storage->refcount, __ATOMIC_RELAXED) == 2) {
    t->base = NULL;
    t->history_version = 0;
    kiln_tensor_release(b);
    b = NULL;
  }
  if (b && grad && (b->requires_grad || r->requires_grad)) return copy_slices(t, b, r, op);
  struct kiln_node *old = t->grad_fn;
  prev = kiln_set_grad_enabled(0);
  rc = kiln_copy_(t, r);
  kiln_set_grad_enabled(prev);
  if (rc) return rc;
  if (grad && !b && (n || old)) {   /* t's history becomes r's (none: t no longer depends on it) */
    if (n) __atomic_add_fetch(&n->refcount, 1, __ATOMIC_RELAXED);
    t->grad_fn = n;
    t->requires_grad = n != NULL;
    t->history_version++;            /* its views follow */
    if (old) node_release(old);
  }
  return KILN_OK;
}

static struct kiln_tensor *save(const struct kiln_tensor *t) {
  return t ? kiln_detach(t) : NULL;
}

/* Which tensors a kind's derivative reads (KILN_SAVE_* bits), from the op table. */
static unsigned saved_for(int kind, int scalar_rhs, int reverse) {
  const struct kiln_op_info *i = kiln_op_info(kind);
  if (!i) return 0;
  return scalar_rhs ? (reverse ? i->saves_rscalar : i->saves_scalar) : i->saves;
}

/* Which inputs of a kind can carry grad (indices, masks and conditions cannot); views pass it on. */
static int grad_input(int kind, int k) {
  if (kind >= KILN_VIEW_BASE) return 1;
  const struct kiln_op_info *i = kiln_op_info(kind);
  return i && k < 32 && (i->grad_inputs >> k & 1);
}

/* Edge e of a new node, to input t: its shape, and when it needs a grad, a reference to the node
   that made t or to t itself (a leaf). */
static void edge_init(struct edge *e, const struct kiln_tensor *t, int needs) {
  e->ndim = t->ndim;
  e->dtype = t->dtype;
  e->device = t->device;
  memcpy(e->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
  e->needs = needs;
  if (!needs) return;
  if (t->grad_fn) {
    e->node = t->grad_fn;
    __atomic_add_fetch(&e->node->refcount, 1, __ATOMIC_RELAXED);
  } else {
    e->leaf = (struct kiln_tensor *)t;
    kiln_tensor_retain(e->leaf);
  }
}

int kiln_autograd_record(int kind, struct kiln_tensor *out, int n, const struct kiln_tensor *const *inputs,
                         const double *scalars, const int64_t *ints, int nints, const struct kiln_tensor *extra) {
  if (!kiln_autograd_wanted(n, inputs)) return KILN_OK;
  if (!kiln_dtype_is_float(out->dtype) || (kind < KILN_VIEW_BASE && !kiln_op_has(kind, KILN_OPF_DIFFERENTIABLE))) return KILN_OK;
  int any = 0;
  for (int k = 0; k < n; k++) any |= inputs[k] && inputs[k]->requires_grad && grad_input(kind, k);
  if (!any) return KILN_OK;
  kiln_tensor_set_grad_fn_release(kiln_node_release);   /* tensors let go of nodes through it */
  struct kiln_node *node = calloc(1, sizeof *node);
  struct edge *edges = calloc((size_t)(n > 0 ? n : 1), sizeof *edges);
  if (!node || !edges) { free(node); free(edges); return kiln_fail(KILN_ERR_MEMORY, "autograd: out of memory for a node"); }
  node->refcount = 1;
  node->kind = kind;
  node->nin = n;
  node->in = edges;
  for (int k = 0; k < n; k++) {
    if (inputs[k]) edge_init(&edges[k], inputs[k], inputs[k]->requires_grad && grad_input(kind, k));
  }
  if (scalars) memcpy(node->scalar, scalars, sizeof node->scalar);
  if (ints && nints > 0) memcpy(node->ints, ints, sizeof(int64_t) * (size_t)nints);
  node->nints = nints;
  node->out_ndim = out->ndim;
  memcpy(node->out_sizes, out->sizes, sizeof(int64_t) * (size_t)out->ndim);
  int scalar_rhs = kind < KILN_VIEW_BASE && n == 1 && kiln_op_info(kind)->family == KILN_FAMILY_BINARY;
  unsigned which = kind < KILN_VIEW_BASE ? saved_for(kind, scalar_rhs, ints && nints > 1 && ints[1]) : 0;
  int slot = 0;
  for (int k = 0; k < 3; k++)
    if (which & (1u << k)) node->saved[k] = save(k < n ? inputs[k] : NULL);
  if (which & KILN_SAVE_OUT) node->saved[3] = save(out);
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
  node->explicit_saved = 1;
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

int kiln_no_derivative(const struct kiln_node *n) {
  return kiln_fail(KILN_ERR_UNSUPPORTED, "backward: no derivative for %s", kind_name(n->kind));
}

int kiln_grad_finish(struct kiln_node *n, struct scope *s, struct kiln_tensor **r, struct kiln_tensor **gin) {
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

/* Elements a tensor of these sizes and strides spans in its storage, from its first. */
static int64_t extent(int ndim, const int64_t *sizes, const int64_t *strides) {
  int64_t e = 1;
  for (int d = 0; d < ndim; d++) {
    if (sizes[d] == 0) return 0;
    e += (sizes[d] - 1) * strides[d];
  }
  return e;
}

/* A header over buf's storage at the given places (a gradient laid out like a base, or a view in it). */
static struct kiln_tensor *over(struct scope *s, const struct kiln_tensor *buf, int ndim, const int64_t *sizes,
                                const int64_t *strides, int64_t offset) {
  if (s->failed || !buf) { s->failed = 1; return NULL; }
  return keep(s, kiln_tensor_header(ndim, sizes, strides, offset, buf->dtype, buf->device, buf->storage));
}

/* A buffer laid out like p's base: zeros, or uninitialized when whoever writes it covers every element. */
static struct kiln_tensor *base_buffer(struct scope *s, const struct kiln_strided *p, const struct kiln_tensor *g, int covered) {
  int64_t n = extent(p->base_ndim, p->base_sizes, p->base_strides), numel = 1;
  for (int d = 0; d < p->base_ndim; d++) numel *= p->base_sizes[d];
  if (s->failed) return NULL;
  if (covered && n == numel) return keep(s, kiln_tensor_empty(1, &n, g->dtype, g->device));
  return zeros(s, 1, &n, g->dtype, g->device);
}

/* The grad of a base from the grad g of its view (KILN_VIEW_AS_STRIDED): g at the view's places,
   zero elsewhere; summed first over the dims an expand stretched, whose elements share memory. */
static struct kiln_tensor *strided_scatter(struct scope *s, const struct kiln_strided *p, const struct kiln_tensor *g) {
  int64_t sizes[KILN_MAX_DIMS];
  int dims[KILN_MAX_DIMS], nd = 0;
  memcpy(sizes, p->sizes, sizeof sizes);
  for (int d = 0; d < p->ndim; d++)
    if (p->sizes[d] > 1 && p->strides[d] == 0) { dims[nd++] = d; sizes[d] = 1; }
  const struct kiln_tensor *gv = g;
  if (nd && !s->failed) gv = keep(s, kiln_reduce(KILN_OP_SUM, g, nd, dims, 1, 0));
  struct kiln_tensor *buf = base_buffer(s, p, g, 0);
  struct kiln_tensor *region = over(s, buf, p->ndim, sizes, p->strides, p->offset);
  if (region && gv && kiln_copy_(region, gv)) s->failed = 1;
  return over(s, buf, p->base_ndim, p->base_sizes, p->base_strides, 0);
}

/* The grads of a KILN_COPY_SLICES node from the grad g of the base: inside the view's region they
   go to the written value (r[1], shaped as the view), outside it to the base's old history (r[0]). */
static void copy_slices_grads(struct scope *s, const struct kiln_node *n, const struct kiln_tensor *g, struct kiln_tensor **r) {
  const struct kiln_strided *p = n->strided;
  struct kiln_tensor *buf = base_buffer(s, p, g, 1);
  struct kiln_tensor *gb = over(s, buf, p->base_ndim, p->base_sizes, p->base_strides, 0);
  if (gb && kiln_copy_(gb, g)) s->failed = 1;
  struct kiln_tensor *region = over(s, buf, p->ndim, p->sizes, p->strides, p->offset);
  if (n->in[1].needs && region && !s->failed) r[1] = keep(s, kiln_clone(region));
  if (n->in[0].needs && region && !s->failed) {
    if (kiln_fill_(region, 0)) s->failed = 1;
    r[0] = gb;
  }
}

/* The derivatives of views and of the copies that convert (views are not ops: tensor.c makes them). */
static int view_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct scope sc = {0}, *s = &sc;
  struct kiln_tensor *r[4] = {0};
  switch (n->kind) {
  case KILN_VIEW_RESHAPE: r[0] = !s->failed ? keep(s, kiln_reshape(g, n->in[0].ndim, n->in[0].sizes)) : NULL; break;
  case KILN_VIEW_TRANSPOSE: r[0] = !s->failed ? keep(s, kiln_transpose(g, (int)n->ints[0], (int)n->ints[1])) : NULL; break;
  case KILN_VIEW_PERMUTE: {
    int inv[KILN_MAX_DIMS];
    for (int k = 0; k < n->nints; k++) inv[n->ints[k]] = k;
    r[0] = !s->failed ? keep(s, kiln_permute(g, n->nints, inv)) : NULL;
    break;
  }
  case KILN_VIEW_NARROW: case KILN_VIEW_SELECT: {
    /* the base's grad: g in the view's rows of dim d, zeros before and after them (each element
       written once: an RNN's output is most of its base) */
    const struct edge *e = &n->in[0];
    int d = (int)n->ints[0];
    int64_t start = n->ints[1], len = n->kind == KILN_VIEW_NARROW ? n->ints[2] : 1, after = e->sizes[d] - start - len;
    struct kiln_tensor *z = !s->failed ? keep(s, kiln_tensor_empty(e->ndim, e->sizes, g->dtype, g->device)) : NULL;
    struct kiln_tensor *part = NULL, *before = NULL, *rest = NULL;
    if (!s->failed)
      part = keep(s, n->kind == KILN_VIEW_NARROW ? kiln_narrow(z, d, start, len) : kiln_select(z, d, start));
    if (part && kiln_copy_(part, g)) s->failed = 1;
    if (!s->failed && start > 0 && (before = keep(s, kiln_narrow(z, d, 0, start))) && kiln_fill_(before, 0)) s->failed = 1;
    if (!s->failed && after > 0 && (rest = keep(s, kiln_narrow(z, d, start + len, after))) && kiln_fill_(rest, 0)) s->failed = 1;
    r[0] = z;
    break;
  }
  case KILN_VIEW_EXPAND: r[0] = sum_to(s, g, n->in[0].ndim, n->in[0].sizes); break;
  case KILN_VIEW_ALIAS: r[0] = g; break;
  case KILN_VIEW_AS_STRIDED: r[0] = strided_scatter(s, n->strided, g); break;
  case KILN_COPY_SLICES: copy_slices_grads(s, n, g, r); break;
  case KILN_GRAD_CLONE: {
    const struct edge *e = &n->in[0];
    struct kiln_tensor *gd = !s->failed ? keep(s, kiln_to_device(g, e->device)) : NULL;
    r[0] = !s->failed ? keep(s, kiln_to_dtype_in_layout(gd, e->dtype)) : NULL;
    break;
  }
  default:
    scope_end(s);
    return kiln_no_derivative(n);
  }
  return kiln_grad_finish(n, s, r, gin);
}

/* The derivative of node n: the op table names it (ops/); views have theirs here. */
static int derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  if (n->kind >= KILN_VIEW_BASE) return view_derivative(n, g, gin);
  const struct kiln_op_info *info = kiln_op_info(n->kind);
  if (!info || !info->derivative) return kiln_no_derivative(n);
  int rc = info->derivative(n, g, gin);
  if (rc) {
    for (int k = 0; k < n->nin; k++) { kiln_tensor_release(gin[k]); gin[k] = NULL; }
    if (!kiln_error_code()) rc = kiln_fail(rc, "backward of %s failed", kind_name(n->kind));
  }
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

/* Nothing but g reaches g's storage: no other tensor holds it, or only g's base, which only g
   holds (a grad that an op made as a view of its own temporary, as matmul does). */
static int held_by_g_alone(const struct kiln_tensor *g) {
  int storage_refs = __atomic_load_n(&g->storage->refcount, __ATOMIC_RELAXED);
  if (__atomic_load_n(&g->refcount, __ATOMIC_RELAXED) != 1) return 0;
  if (storage_refs == 1) return 1;
  return g->base && storage_refs == 2 && __atomic_load_n(&g->base->refcount, __ATOMIC_RELAXED) == 1 &&
         g->base->storage == g->storage;
}

/* Add g into *acc. A node's grad is only ever replaced (out-of-place sums), so it takes g as it
   is; a leaf's grad is added to in place later, so it takes g only when nothing else holds g. */
static int accumulate(struct kiln_tensor **acc, struct kiln_tensor *g, int in_place) {
  if (!*acc) {
    if (!in_place || (held_by_g_alone(g) && kiln_is_contiguous(g))) {
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

/* ---- listeners: when each leaf's grad is final ---- */

enum { MAX_HOOKS = 16 };
static struct kiln_backward_hooks hooks[MAX_HOOKS];
static int nhooks;

int kiln_backward_hooks_add(const struct kiln_backward_hooks *h) {
  if (nhooks == MAX_HOOKS) return kiln_fail(KILN_ERR_STATE, "backward: more than %d listeners", MAX_HOOKS);
  hooks[nhooks++] = *h;
  return KILN_OK;
}

void kiln_backward_hooks_remove(void *ctx) {
  for (int i = 0; i < nhooks; i++)
    if (hooks[i].ctx == ctx) { hooks[i] = hooks[--nhooks]; i--; }
}

/* Edges still to come into each leaf of one backward: open addressing on the leaf's address. */
struct leaf_counts {
  struct kiln_tensor **leaf;
  int *left;
  int cap, n;
};

static int *leaf_slot(struct leaf_counts *lc, struct kiln_tensor *t, int add) {
  if (add && 2 * (lc->n + 1) > lc->cap) {
    struct leaf_counts bigger = {calloc((size_t)(lc->cap ? 2 * lc->cap : 64), sizeof(void *)),
                                 calloc((size_t)(lc->cap ? 2 * lc->cap : 64), sizeof(int)), lc->cap ? 2 * lc->cap : 64, 0};
    if (!bigger.leaf || !bigger.left) { free(bigger.leaf); free(bigger.left); return NULL; }
    for (int i = 0; i < lc->cap; i++)
      if (lc->leaf[i]) *leaf_slot(&bigger, lc->leaf[i], 1) = lc->left[i];
    free(lc->leaf);
    free(lc->left);
    *lc = bigger;
  }
  if (!lc->cap) return NULL;
  unsigned i = (unsigned)(((uintptr_t)t >> 4) * 2654435761u) & (unsigned)(lc->cap - 1);
  while (lc->leaf[i] && lc->leaf[i] != t) i = (i + 1) & (unsigned)(lc->cap - 1);
  if (!lc->leaf[i]) {
    if (!add) return NULL;
    lc->leaf[i] = t;
    lc->n++;
  }
  return &lc->left[i];
}

static void tell_ready(struct kiln_tensor *leaf) {
  for (int i = 0; i < nhooks; i++) if (hooks[i].leaf_ready) hooks[i].leaf_ready(hooks[i].ctx, leaf);
}

static int tell_done(int rc) {
  for (int i = 0; i < nhooks; i++)
    if (hooks[i].done) {
      int r = hooks[i].done(hooks[i].ctx, rc);
      if (!rc) rc = r;
    }
  return rc;
}

/* ---- custom functions ---- */

static int64_t functions_live;
static pthread_mutex_t released_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t *released_ids;
static int released_n, released_cap;

static void function_node_freed(struct kiln_node *n) {
  for (int k = 0; k < n->nout; k++) kiln_tensor_release(n->out_grads[k]);
  free(n->out_grads);
  free(n->function_name);
  __atomic_sub_fetch(&functions_live, 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&released_lock);
  if (released_n == released_cap) {
    int cap = released_cap ? 2 * released_cap : 64;
    int64_t *p = realloc(released_ids, sizeof *p * (size_t)cap);
    if (p) { released_ids = p; released_cap = cap; }
  }
  if (released_n < released_cap) released_ids[released_n++] = n->function_id;   /* else lost: the caller keeps a little more */
  pthread_mutex_unlock(&released_lock);
}

KILN_API int64_t kiln_function_nodes_live(void) { return __atomic_load_n(&functions_live, __ATOMIC_RELAXED); }

KILN_API int kiln_function_released(int64_t *ids, int cap) {
  if (!ids || cap <= 0) return 0;
  pthread_mutex_lock(&released_lock);
  int n = released_n < cap ? released_n : cap;
  if (n > 0) memcpy(ids, released_ids + (released_n - n), sizeof *ids * (size_t)n);
  released_n -= n;
  pthread_mutex_unlock(&released_lock);
  return n;
}

KILN_API int kiln_function_record(int64_t id, const char *name, int nin, struct kiln_tensor *const *inputs, int nout,
                                  struct kiln_tensor *const *outputs) {
  if (nin < 0 || nout < 1 || (nin > 0 && !inputs) || !outputs || id <= 0)
    return kiln_fail(KILN_ERR_ARGUMENT, "function: bad arguments (%d inputs, %d outputs, id %lld)", nin, nout, (long long)id);
  for (int k = 0; k < nin; k++)
    if (inputs[k] && kiln_check_live("function", inputs[k])) return kiln_error_code();
  for (int k = 0; k < nout; k++) {
    if (!outputs[k]) continue;
    if (kiln_check_live("function", outputs[k])) return kiln_error_code();
    if (outputs[k]->grad_fn || outputs[k]->requires_grad)
      return kiln_fail(KILN_ERR_STATE, "function: output %d %s already has a history; give a fresh tensor (detach() it)",
                       k, kiln_shape_string(outputs[k]));
  }
  if (!kiln_autograd_wanted(nin, (const struct kiln_tensor *const *)inputs)) return KILN_OK;
  /* the node: an edge to each input, like an op's */
  kiln_tensor_set_grad_fn_release(kiln_node_release);
  struct kiln_node *node = calloc(1, sizeof *node);
  struct edge *edges = calloc((size_t)(nin > 0 ? nin : 1), sizeof *edges);
  struct kiln_tensor **grads = calloc((size_t)nout, sizeof *grads);
  char *label = strdup(name && *name ? name : "Function");
  if (!node || !edges || !grads || !label) {
    free(node); free(edges); free(grads); free(label);
    return kiln_fail(KILN_ERR_MEMORY, "function: out of memory for a node");
  }
  node->refcount = 1;
  node->kind = KILN_FUNCTION;
  node->nin = nin;
  node->in = edges;
  node->function_id = id;
  node->function_name = label;
  node->nout = nout;
  node->out_grads = grads;
  for (int k = 0; k < nin; k++) {
    if (inputs[k]) edge_init(&edges[k], inputs[k], inputs[k]->requires_grad && kiln_dtype_is_float(inputs[k]->dtype));
  }
  __atomic_add_fetch(&functions_live, 1, __ATOMIC_RELAXED);
  /* each differentiable output: a node of its own whose one edge leads to the function's node */
  int rc = KILN_OK;
  for (int k = 0; k < nout && !rc; k++) {
    struct kiln_tensor *out = outputs[k];
    if (!out || !kiln_dtype_is_float(out->dtype)) continue;
    struct kiln_node *o = calloc(1, sizeof *o);
    struct edge *oe = calloc(1, sizeof *oe);
    if (!o || !oe) { free(o); free(oe); rc = kiln_fail(KILN_ERR_MEMORY, "function: out of memory for a node"); break; }
    o->refcount = 1;
    o->kind = KILN_FUNCTION_OUTPUT;
    o->nin = 1;
    o->in = oe;
    o->ints[0] = k;
    o->nints = 1;
    o->out_ndim = out->ndim;
    memcpy(o->out_sizes, out->sizes, sizeof(int64_t) * (size_t)out->ndim);
    oe->node = node;
    oe->needs = 1;
    oe->ndim = out->ndim;
    oe->dtype = out->dtype;
    oe->device = out->device;
    memcpy(oe->sizes, out->sizes, sizeof(int64_t) * (size_t)out->ndim);
    __atomic_add_fetch(&node->refcount, 1, __ATOMIC_RELAXED);
    out->grad_fn = o;
    out->requires_grad = 1;
  }
  node_release(node);   /* the outputs' nodes hold it now (freed here when none is differentiable) */
  return rc;
}

/* ---- the backward walk ---- */

/* The error of a saved tensor changed in place: what was saved, by which op. */
static int saved_changed(const struct kiln_node *n, int k) {
  const char *what = kind_name(n->kind);
  char op[64];
  snprintf(op, sizeof op, "%s", n->kind == KILN_FUNCTION ? node_name(n) : what);
  char role[32] = "";
  if (!n->explicit_saved && n->kind < KILN_VIEW_BASE) {
    if (k == 3) snprintf(role, sizeof role, "its output ");
    else if (k < 2) snprintf(role, sizeof role, "its input %d ", k + 1);
  }
  return kiln_fail(KILN_ERR_STATE,
                   "backward: %s saved %s%s for its derivative, and it was changed in place afterwards (by an "
                   "in-place op such as relu_ or add_); use the out-of-place op there, or apply it to a clone()",
                   op, role, kiln_shape_string(n->saved[k]));
}

struct kiln_backward_walk {
  struct nodelist all, ready;
  struct leaf_counts leaves;
  struct kiln_tensor *g0;
  struct kiln_node *waiting;       /* a function node whose input grads the caller gives */
  struct kiln_tensor **given;      /* those grads, one per input */
  int retain_graph, prev_mode, started, finished, rc;
};

/* After node n ran (its input grads in gin): add them into the inputs, and queue the nodes that
   have all their grads. */
static int propagate(struct kiln_backward_walk *w, struct kiln_node *n, struct kiln_tensor **gin, int rc) {
  for (int k = 0; k < n->nin; k++) {
    struct edge *e = &n->in[k];
    if (!rc && gin[k]) {
      if (e->node && e->node->kind == KILN_FUNCTION && n->kind == KILN_FUNCTION_OUTPUT)
        rc = accumulate(&e->node->out_grads[n->ints[0]], gin[k], 0);
      else if (e->node) rc = accumulate(&e->node->grad, gin[k], 0);
      else if (e->leaf) rc = accumulate(&e->leaf->grad, gin[k], 1);
    }
    kiln_tensor_release(gin[k]);
    gin[k] = NULL;
    if (e->node && --e->node->pending == 0 && !rc) rc = push(&w->ready, e->node);
    if (nhooks && e->leaf && !rc) {
      int *left = leaf_slot(&w->leaves, e->leaf, 0);
      if (left && --*left == 0) tell_ready(e->leaf);
    }
  }
  if (!w->retain_graph) { node_free_saved(n); n->released = 1; }
  return rc;
}

static void walk_finish(struct kiln_backward_walk *w) {
  if (w->finished) return;
  w->finished = 1;
  if (w->waiting) {
    for (int k = 0; k < w->waiting->nin; k++) { kiln_tensor_release(w->given[k]); w->given[k] = NULL; }
    w->waiting = NULL;
  }
  free(w->given);
  w->given = NULL;
  for (int i = 0; i < w->all.n; i++) {
    struct kiln_node *n = w->all.items[i];
    n->visited = 0;
    n->pending = 0;
    kiln_tensor_release(n->grad);
    n->grad = NULL;
    for (int k = 0; k < n->nout; k++) { kiln_tensor_release(n->out_grads[k]); n->out_grads[k] = NULL; }
  }
  free(w->all.items);
  free(w->ready.items);
  free(w->leaves.leaf);
  free(w->leaves.left);
  w->all.items = w->ready.items = NULL;
  w->leaves.leaf = NULL;
  w->leaves.left = NULL;
  kiln_tensor_release(w->g0);
  w->g0 = NULL;
  if (w->started && nhooks) w->rc = tell_done(w->rc);
}

KILN_API struct kiln_backward_walk *kiln_backward_start(struct kiln_tensor *root, const struct kiln_tensor *grad,
                                                        int retain_graph) {
  if (kiln_check_live("backward", root) || kiln_autograd_refresh(root)) return NULL;
  if (!root->requires_grad) {
    kiln_fail(KILN_ERR_STATE, "backward: tensor %s does not require grad (no op on it recorded a graph)", kiln_shape_string(root));
    return NULL;
  }
  struct kiln_tensor *g0 = NULL;
  if (grad) {
    if (kiln_check_live("backward", grad)) return NULL;
    if (grad->ndim != root->ndim || memcmp(grad->sizes, root->sizes, sizeof(int64_t) * (size_t)root->ndim) != 0) {
      kiln_fail(KILN_ERR_SHAPE, "backward: grad %s does not match the output %s", kiln_shape_string(grad), kiln_shape_string(root));
      return NULL;
    }
    g0 = kiln_to_dtype(grad, root->dtype);
  } else {
    if (root->numel != 1) {
      kiln_fail(KILN_ERR_SHAPE, "backward: output %s has %lld elements; give the grad of a non-scalar output",
                kiln_shape_string(root), (long long)root->numel);
      return NULL;
    }
    g0 = kiln_tensor_full(root->ndim, root->sizes, 1.0, root->dtype, root->device);
  }
  if (!g0) return NULL;
  struct kiln_backward_walk *w = calloc(1, sizeof *w);
  if (!w) {
    kiln_tensor_release(g0);
    kiln_fail(KILN_ERR_MEMORY, "backward: out of memory");
    return NULL;
  }
  w->retain_graph = retain_graph;
  w->started = 1;
  int prev = kiln_set_grad_enabled(0);
  int rc = KILN_OK;
  if (!root->grad_fn) {   /* a leaf: its grad is the given grad */
    rc = accumulate(&root->grad, g0, 1);
    kiln_tensor_release(g0);
    if (!rc && nhooks) tell_ready(root);
    w->rc = rc;
    walk_finish(w);
    kiln_set_grad_enabled(prev);
    return w;
  }
  /* Count, for each reachable node, the edges that lead into it. */
  struct kiln_node *start = root->grad_fn;
  rc = push(&w->all, start);
  if (!rc) start->visited = 1;
  for (int i = 0; i < w->all.n && !rc; i++) {
    struct kiln_node *n = w->all.items[i];
    for (int k = 0; k < n->nin; k++) {
      struct kiln_node *m = n->in[k].node;
      if (nhooks && n->in[k].leaf) {
        int *left = leaf_slot(&w->leaves, n->in[k].leaf, 1);
        if (!left) { rc = kiln_fail(KILN_ERR_MEMORY, "backward: out of memory"); break; }
        ++*left;
      }
      if (!m) continue;
      m->pending++;
      if (!m->visited) { m->visited = 1; rc = push(&w->all, m); if (rc) break; }
    }
  }
  if (!rc) { start->grad = g0; rc = push(&w->ready, start); }
  else kiln_tensor_release(g0);
  w->rc = rc;
  if (rc) walk_finish(w);
  kiln_set_grad_enabled(prev);
  return w;
}

KILN_API int kiln_backward_step(struct kiln_backward_walk *w, int64_t *function_id) {
  if (function_id) *function_id = 0;
  if (!w) return kiln_fail(KILN_ERR_ARGUMENT, "backward: no walk");
  if (w->finished) {
    if (w->rc && !kiln_error_code()) kiln_fail(w->rc, "backward: failed");
    return w->rc;
  }
  int prev = kiln_set_grad_enabled(0);
  int rc = KILN_OK;
  if (w->waiting) {   /* the caller gave the input grads of a function node */
    struct kiln_node *n = w->waiting;
    w->waiting = NULL;
    rc = propagate(w, n, w->given, rc);
    for (int k = 0; k < n->nout; k++) { kiln_tensor_release(n->out_grads[k]); n->out_grads[k] = NULL; }
  }
  while (!rc && w->ready.n > 0) {
    struct kiln_node *n = w->ready.items[--w->ready.n];
    if (n->released) {
      rc = kiln_fail(KILN_ERR_STATE, "backward: the graph through %s was already used and its saved tensors freed; "
                     "keep it with retain_graph in the first backward (loss:backward{retain_graph = true})", node_name(n));
      break;
    }
    for (int k = 0; k < MAX_SAVED; k++)
      if (n->saved[k] && n->saved[k]->storage->version != n->saved_version[k]) {
        rc = saved_changed(n, k);
        break;
      }
    if (rc) break;
    if (n->kind == KILN_FUNCTION) {
      if (!function_id) {
        rc = kiln_fail(KILN_ERR_UNSUPPORTED, "backward: the graph holds %s, a function whose derivative runs in Lua; "
                       "call backward from Lua", node_name(n));
        break;
      }
      free(w->given);
      w->given = calloc((size_t)(n->nin > 0 ? n->nin : 1), sizeof *w->given);
      if (!w->given) { rc = kiln_fail(KILN_ERR_MEMORY, "backward: out of memory"); break; }
      w->waiting = n;
      *function_id = n->function_id;
      kiln_set_grad_enabled(prev);
      return KILN_OK;
    }
    struct kiln_tensor *gin_small[4] = {0}, **gin = gin_small;
    if (n->nin > 4) {
      gin = calloc((size_t)n->nin, sizeof *gin);
      if (!gin) { rc = kiln_fail(KILN_ERR_MEMORY, "backward: out of memory"); break; }
    }
    struct kiln_tensor *g = n->grad;
    if (n->kind == KILN_FUNCTION_OUTPUT) {
      if (g) { kiln_tensor_retain(g); gin[0] = g; }
    } else {
      rc = g ? derivative(n, g, gin) : KILN_OK;
    }
    kiln_tensor_release(n->grad);
    n->grad = NULL;
    rc = propagate(w, n, gin, rc);
    if (gin != gin_small) free(gin);
  }
  w->rc = rc;
  walk_finish(w);
  rc = w->rc;
  kiln_set_grad_enabled(prev);
  return rc;
}

KILN_API struct kiln_tensor *kiln_backward_output_grad(struct kiln_backward_walk *w, int k) {
  if (!w || !w->waiting || k < 0 || k >= w->waiting->nout) {
    kiln_fail(KILN_ERR_ARGUMENT, "backward: no function output %d waits for its grad", k);
    return NULL;
  }
  struct kiln_tensor *g = w->waiting->out_grads[k];
  if (g) kiln_tensor_retain(g);
  return g;
}

KILN_API int kiln_backward_input_grad(struct kiln_backward_walk *w, int k, const struct kiln_tensor *grad) {
  if (!w || !w->waiting || k < 0 || k >= w->waiting->nin)
    return kiln_fail(KILN_ERR_ARGUMENT, "backward: no function input %d waits for a grad", k);
  struct kiln_node *n = w->waiting;
  struct edge *e = &n->in[k];
  if (!grad || !e->needs) return KILN_OK;
  if (kiln_check_live("backward", grad)) return kiln_error_code();
  if (grad->ndim != e->ndim || memcmp(grad->sizes, e->sizes, sizeof(int64_t) * (size_t)e->ndim) != 0) {
    return kiln_fail(KILN_ERR_SHAPE, "backward of %s: the grad of input %d is %s, but the input is %s", node_name(n), k + 1,
                     kiln_shape_string(grad), kiln_sizes_string(e->ndim, e->sizes));
  }
  int prev = kiln_set_grad_enabled(0);
  struct kiln_tensor *g = grad->dtype != e->dtype ? kiln_to_dtype(grad, e->dtype) : kiln_detach(grad);
  kiln_set_grad_enabled(prev);
  if (!g) return kiln_error_code();
  kiln_tensor_release(w->given[k]);
  w->given[k] = g;
  return KILN_OK;
}

KILN_API void kiln_backward_end(struct kiln_backward_walk *w) {
  if (!w) return;
  int prev = kiln_set_grad_enabled(0);
  walk_finish(w);
  kiln_set_grad_enabled(prev);
  free(w);
}

KILN_API int kiln_backward(struct kiln_tensor *root, const struct kiln_tensor *grad, int retain_graph) {
  struct kiln_backward_walk *w = kiln_backward_start(root, grad, retain_graph);
  if (!w) return kiln_error_code();
  int rc = kiln_backward_step(w, NULL);
  kiln_backward_end(w);
  return rc;
}
