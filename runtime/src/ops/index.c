/* index.c: the front end of joining and indexing ops (cat, stack, index_select, gather,
   scatter_add, masked_fill, masked_select). Index values are checked by the kernels. */
#include "internal.h"
#include "autograd/derivative.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int check_index_tensor(const char *op, const struct kiln_tensor *idx) {
  if (kiln_check_live(op, idx)) return kiln_error_code();
  if (idx->dtype != KILN_I64 && idx->dtype != KILN_I32)
    return kiln_fail(KILN_ERR_DTYPE, "%s: index %s has dtype %s (expected i64 or i32)", op, kiln_shape_string(idx), kiln_dtype_name(idx->dtype));
  return KILN_OK;
}

KILN_API struct kiln_tensor *kiln_cat(int n, struct kiln_tensor *const *ts, int dim) {
  if (n <= 0 || !ts) { kiln_fail(KILN_ERR_ARGUMENT, "cat: no tensors given"); return NULL; }
  for (int i = 0; i < n; i++) if (kiln_check_live("cat", ts[i])) return NULL;
  /* Like PyTorch, 1-d empty tensors are skipped whatever the other shapes. */
  const struct kiln_tensor *ref = NULL;
  int dtype = ts[0]->dtype;
  for (int i = 0; i < n; i++) {
    dtype = kiln_promote_types(dtype, ts[i]->dtype);
    if (!(ts[i]->ndim == 1 && ts[i]->numel == 0) && !ref) ref = ts[i];
  }
  if (!ref) ref = ts[0];
  int d = 0;
  if (ref->ndim == 0) { kiln_fail(KILN_ERR_SHAPE, "cat: cannot join 0-dim tensors (use stack)"); return NULL; }
  if (kiln_normalize_dim("cat", dim, ref->ndim, &d)) return NULL;
  int64_t sizes[KILN_MAX_DIMS];
  memcpy(sizes, ref->sizes, sizeof sizes);
  sizes[d] = 0;
  for (int i = 0; i < n; i++) {
    const struct kiln_tensor *t = ts[i];
    if (t->ndim == 1 && t->numel == 0) continue;
    if (kiln_check_same_device("cat", ref, t)) return NULL;
    int ok = t->ndim == ref->ndim;
    for (int k = 0; ok && k < t->ndim; k++) ok = k == d || t->sizes[k] == ref->sizes[k];
    if (!ok) {
      kiln_fail(KILN_ERR_SHAPE, "cat: tensor %d has shape %s, tensor 1 has %s: sizes must match except in dim %d", i + 1,
                kiln_shape_string(t), kiln_shape_string(ref), d);
      return NULL;
    }
    sizes[d] += t->sizes[d];
  }
  struct kiln_tensor *out = kiln_tensor_empty(ref->ndim, sizes, dtype, ref->device);
  if (!out) return NULL;
  struct kiln_call call = {.op = KILN_OP_CAT, .out = out, .in = {ref}, .nin = 1, .ints = {d, n}, .nints = 2, .extra = ts};
  if (kiln_dispatch(ref->device, &call) ||
      kiln_autograd_record(KILN_OP_CAT, out, n, (const struct kiln_tensor *const *)ts, NULL, (int64_t[]){d}, 1, NULL)) {
    kiln_tensor_release(out);
    return NULL;
  }
  return out;
}

KILN_API struct kiln_tensor *kiln_stack(int n, struct kiln_tensor *const *ts, int dim) {
  if (n <= 0 || !ts) { kiln_fail(KILN_ERR_ARGUMENT, "stack: no tensors given"); return NULL; }
  for (int i = 0; i < n; i++) {
    if (kiln_check_live("stack", ts[i])) return NULL;
    if (ts[i]->ndim != ts[0]->ndim || memcmp(ts[i]->sizes, ts[0]->sizes, sizeof(int64_t) * (size_t)ts[0]->ndim) != 0) {
      kiln_fail(KILN_ERR_SHAPE, "stack: tensor %d has shape %s, tensor 1 has %s: all must match", i + 1,
                kiln_shape_string(ts[i]), kiln_shape_string(ts[0]));
      return NULL;
    }
  }
  int d = 0;
  if (kiln_normalize_dim("stack", dim, ts[0]->ndim + 1, &d)) return NULL;
  struct kiln_tensor **us = calloc((size_t)n, sizeof *us);
  if (!us) { kiln_fail(KILN_ERR_MEMORY, "stack: out of memory"); return NULL; }
  struct kiln_tensor *out = NULL;
  int i;
  for (i = 0; i < n; i++) if (!(us[i] = kiln_unsqueeze(ts[i], d))) break;
  if (i == n) out = kiln_cat(n, us, d);
  for (int k = 0; k < n; k++) kiln_tensor_release(us[k]);
  free(us);
  return out;
}

KILN_API struct kiln_tensor *kiln_index_select(const struct kiln_tensor *a, int dim, const struct kiln_tensor *index) {
  int d = 0;
  if (kiln_check_live("index_select", a) || check_index_tensor("index_select", index) ||
      kiln_check_same_device("index_select", a, index))
    return NULL;
  if (kiln_normalize_dim("index_select", dim, a->ndim, &d)) return NULL;
  if (index->ndim > 1) {
    kiln_fail(KILN_ERR_SHAPE, "index_select: index %s must be 1-d (tensor %s)", kiln_shape_string(index), kiln_shape_string(a));
    return NULL;
  }
  int64_t sizes[KILN_MAX_DIMS];
  memcpy(sizes, a->sizes, sizeof sizes);
  int nd = a->ndim;
  if (nd == 0) { nd = 0; } else sizes[d] = index->numel;
  struct kiln_tensor *out = kiln_tensor_empty(nd, sizes, a->dtype, a->device);
  if (!out) return NULL;
  struct kiln_call call = {.op = KILN_OP_INDEX_SELECT, .out = out, .in = {a, index}, .nin = 2, .ints = {d}, .nints = 1};
  if (kiln_dispatch(a->device, &call) || kiln_autograd_record_call(&call, out)) { kiln_tensor_release(out); return NULL; }
  return out;
}

static int check_gather_shapes(const char *op, const struct kiln_tensor *a, int d, const struct kiln_tensor *index,
                               const struct kiln_tensor *src) {
  if (index->ndim != a->ndim)
    return kiln_fail(KILN_ERR_SHAPE, "%s: index %s and input %s must have the same number of dims", op,
                     kiln_shape_string(index), kiln_shape_string(a));
  for (int k = 0; k < a->ndim; k++) {
    if (k != d && index->sizes[k] > a->sizes[k])
      return kiln_fail(KILN_ERR_SHAPE, "%s: index %s is larger than input %s in dim %d", op, kiln_shape_string(index),
                       kiln_shape_string(a), k);
    if (src && index->sizes[k] > src->sizes[k])
      return kiln_fail(KILN_ERR_SHAPE, "%s: index %s is larger than src %s in dim %d", op, kiln_shape_string(index),
                       kiln_shape_string(src), k);
  }
  if (src && src->ndim != a->ndim)
    return kiln_fail(KILN_ERR_SHAPE, "%s: src %s and input %s must have the same number of dims", op,
                     kiln_shape_string(src), kiln_shape_string(a));
  return KILN_OK;
}

KILN_API struct kiln_tensor *kiln_gather(const struct kiln_tensor *a, int dim, const struct kiln_tensor *index) {
  int d = 0;
  if (kiln_check_live("gather", a) || check_index_tensor("gather", index) || kiln_check_same_device("gather", a, index) ||
      kiln_normalize_dim("gather", dim, a->ndim, &d) || check_gather_shapes("gather", a, d, index, NULL))
    return NULL;
  struct kiln_tensor *out = kiln_tensor_empty(index->ndim, index->sizes, a->dtype, a->device);
  if (!out) return NULL;
  struct kiln_call call = {.op = KILN_OP_GATHER, .out = out, .in = {a, index}, .nin = 2, .ints = {d}, .nints = 1};
  if (kiln_dispatch(a->device, &call) || kiln_autograd_record_call(&call, out)) { kiln_tensor_release(out); return NULL; }
  return out;
}

KILN_API int kiln_scatter_add_(struct kiln_tensor *a, int dim, const struct kiln_tensor *index, const struct kiln_tensor *src) {
  int d = 0;
  if (kiln_check_live("scatter_add", a) || kiln_check_live("scatter_add", src) || check_index_tensor("scatter_add", index) ||
      kiln_check_same_device("scatter_add", a, index) || kiln_check_same_device("scatter_add", a, src) ||
      kiln_normalize_dim("scatter_add", dim, a->ndim, &d) || check_gather_shapes("scatter_add", a, d, index, src) ||
      kiln_autograd_check_inplace("scatter_add_", a, src))
    return kiln_error_code();
  struct kiln_call call = {.op = KILN_OP_SCATTER_ADD, .out = a, .in = {a, index, src}, .nin = 3, .ints = {d}, .nints = 1};
  int rc = kiln_dispatch(a->device, &call);
  if (!rc) kiln_tensor_bump_version(a);
  return rc;
}

KILN_API struct kiln_tensor *kiln_scatter_add(const struct kiln_tensor *a, int dim, const struct kiln_tensor *index,
                                              const struct kiln_tensor *src) {
  int prev = kiln_set_grad_enabled(0);   /* the copy and the in-place add are one recorded op */
  struct kiln_tensor *out = kiln_clone(a);
  if (out && kiln_scatter_add_(out, dim, index, src)) { kiln_tensor_release(out); out = NULL; }
  kiln_set_grad_enabled(prev);
  if (!out) return NULL;
  int d = 0;
  kiln_normalize_dim("scatter_add", dim, a->ndim, &d);
  const struct kiln_tensor *ins[3] = {a, index, src};
  if (out && kiln_autograd_record(KILN_OP_SCATTER_ADD, out, 3, ins, NULL, (int64_t[]){d}, 1, NULL)) { kiln_tensor_release(out); return NULL; }
  return out;
}

static int check_mask(const char *op, const struct kiln_tensor *a, const struct kiln_tensor *mask, int must_fit_a) {
  if (kiln_check_live(op, a) || kiln_check_live(op, mask) || kiln_check_same_device(op, a, mask)) return kiln_error_code();
  if (mask->dtype != KILN_BOOL && mask->dtype != KILN_U8)
    return kiln_fail(KILN_ERR_DTYPE, "%s: mask %s has dtype %s (expected bool)", op, kiln_shape_string(mask), kiln_dtype_name(mask->dtype));
  int nd;
  int64_t shape[KILN_MAX_DIMS];
  if (kiln_broadcast_shapes(op, a->ndim, a->sizes, mask->ndim, mask->sizes, &nd, shape)) return kiln_error_code();
  if (must_fit_a && (nd != a->ndim || memcmp(shape, a->sizes, sizeof(int64_t) * (size_t)nd) != 0))
    return kiln_fail(KILN_ERR_SHAPE, "%s: mask %s does not broadcast to the input %s", op, kiln_shape_string(mask), kiln_shape_string(a));
  return KILN_OK;
}

KILN_API int kiln_masked_fill_(struct kiln_tensor *a, const struct kiln_tensor *mask, double value) {
  if (check_mask("masked_fill", a, mask, 1) || kiln_autograd_check_inplace("masked_fill_", a, NULL)) return kiln_error_code();
  struct kiln_call call = {.op = KILN_OP_MASKED_FILL, .out = a, .in = {a, mask}, .nin = 2, .scalar = {value}};
  int rc = kiln_dispatch(a->device, &call);
  if (!rc) kiln_tensor_bump_version(a);
  return rc;
}

KILN_API struct kiln_tensor *kiln_masked_fill(const struct kiln_tensor *a, const struct kiln_tensor *mask, double value) {
  if (check_mask("masked_fill", a, mask, 1)) return NULL;
  int prev = kiln_set_grad_enabled(0);
  struct kiln_tensor *out = kiln_clone(a);
  if (out && kiln_masked_fill_(out, mask, value)) { kiln_tensor_release(out); out = NULL; }
  kiln_set_grad_enabled(prev);
  const struct kiln_tensor *ins[2] = {a, mask};
  if (out && kiln_autograd_record(KILN_OP_MASKED_FILL, out, 2, ins, (double[4]){value}, NULL, 0, NULL)) { kiln_tensor_release(out); return NULL; }
  return out;
}

KILN_API struct kiln_tensor *kiln_masked_select(const struct kiln_tensor *a, const struct kiln_tensor *mask) {
  if (check_mask("masked_select", a, mask, 0)) return NULL;
  /* The kernel counts the selected elements and allocates the result itself. */
  struct kiln_call call = {.op = KILN_OP_MASKED_SELECT, .out = NULL, .in = {a, mask}, .nin = 2};
  struct kiln_tensor *result = NULL;
  call.extra = &result;
  const struct kiln_tensor *ins[2] = {a, mask};
  if (kiln_dispatch(a->device, &call) || kiln_autograd_record(KILN_OP_MASKED_SELECT, result, 2, ins, NULL, NULL, 0, NULL)) {
    kiln_tensor_release(result);
    return NULL;
  }
  return result;
}

/* ---- derivatives (named by the op table) ---- */

int kiln_cat_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct scope sc = {0}, *s = &sc;
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

int kiln_index_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct scope sc = {0}, *s = &sc;
  struct kiln_tensor *y = n->saved[1];
  struct kiln_tensor *r[4] = {0};
  switch (n->kind) {
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
  default:
    scope_end(s);
    return kiln_no_derivative(n);
  }
  return kiln_grad_finish(n, s, r, gin);
}
