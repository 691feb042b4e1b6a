/* views.c: the views and copies of a tensor: views share its storage and record how their grad
   goes back; copies, conversions and moves between devices dispatch to a device's kernels. */
#include "internal.h"
#include <string.h>

/* ---- views ---- */

/* Every view knows its base (the tensor that is not a view whose storage it shares), so that an
   in-place op on the view can change the base's history too (autograd.c, kiln_autograd_assign). */
static struct kiln_tensor *view_of(const struct kiln_tensor *t, int ndim, const int64_t *sizes, const int64_t *strides, int64_t offset) {
  struct kiln_tensor *v = kiln_tensor_header(ndim, sizes, strides, offset, t->dtype, t->device, t->storage);
  if (v) kiln_view_set_base(v, t);
  return v;
}

/* A view records how its grad goes back to its base. */
static struct kiln_tensor *recorded(struct kiln_tensor *v, int kind, const struct kiln_tensor *t, const int64_t *ints, int nints) {
  if (v && kiln_autograd_record(kind, v, 1, &t, NULL, ints, nints, NULL)) { kiln_tensor_release(v); return NULL; }
  return v;
}

KILN_API struct kiln_tensor *kiln_alias(const struct kiln_tensor *t) {
  if (kiln_check_live("alias", t)) return NULL;
  return recorded(view_of(t, t->ndim, t->sizes, t->strides, t->offset), KILN_VIEW_ALIAS, t, NULL, 0);
}

static int infer_sizes(const char *op, const struct kiln_tensor *t, int ndim, const int64_t *in, int64_t *out) {
  if (ndim < 0 || ndim > KILN_MAX_DIMS) return kiln_fail(KILN_ERR_SHAPE, "%s: %d dims (at most %d)", op, ndim, KILN_MAX_DIMS);
  if (ndim > 0 && !in) return kiln_fail(KILN_ERR_ARGUMENT, "%s: the sizes are NULL for %d dims", op, ndim);
  int infer = -1;
  int64_t prod = 1;
  for (int d = 0; d < ndim; d++) {
    out[d] = in[d];
    if (in[d] == -1) {
      if (infer >= 0) return kiln_fail(KILN_ERR_SHAPE, "%s: only one size may be -1 in %s", op, kiln_sizes_string(ndim, in));
      infer = d;
    } else if (in[d] < 0) {
      return kiln_fail(KILN_ERR_SHAPE, "%s: negative size in %s", op, kiln_sizes_string(ndim, in));
    } else {
      prod *= in[d];
    }
  }
  if (infer >= 0) {
    if (prod == 0 || t->numel % prod != 0)
      return kiln_fail(KILN_ERR_SHAPE, "%s: shape %s is invalid for %s (%lld elements)", op, kiln_sizes_string(ndim, in),
                       kiln_shape_string(t), (long long)t->numel);
    out[infer] = t->numel / prod;
    prod *= out[infer];
  }
  if (prod != t->numel)
    return kiln_fail(KILN_ERR_SHAPE, "%s: shape %s is invalid for %s (%lld elements)", op, kiln_sizes_string(ndim, in),
                     kiln_shape_string(t), (long long)t->numel);
  return KILN_OK;
}

/* Strides for viewing t as sizes without a copy, if possible (the algorithm of NumPy/PyTorch). */
static int view_strides(const struct kiln_tensor *t, int ndim, const int64_t *sizes, int64_t *strides) {
  if (t->numel == 0 || t->ndim == 0) { kiln_contiguous_strides(ndim, sizes, strides); return 1; }
  int view_d = ndim - 1;
  int64_t chunk_base_stride = t->strides[t->ndim - 1];
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    tensor_numel *= t->sizes[d];
    if (d == 0 || (t->sizes[d - 1] != 1 && t->strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || sizes[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= sizes[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return 0;
      if (d > 0) {
        chunk_base_stride = t->strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

KILN_API struct kiln_tensor *kiln_view(const struct kiln_tensor *t, int ndim, const int64_t *sizes) {
  int64_t sz[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
  if (kiln_check_live("view", t) || infer_sizes("view", t, ndim, sizes, sz)) return NULL;
  if (!view_strides(t, ndim, sz, st)) {
    kiln_fail(KILN_ERR_SHAPE, "view: %s with strides %s cannot be viewed as %s without a copy (use reshape)",
              kiln_shape_string(t), kiln_sizes_string(t->ndim, t->strides), kiln_sizes_string(ndim, sz));
    return NULL;
  }
  return recorded(view_of(t, ndim, sz, st, t->offset), KILN_VIEW_RESHAPE, t, NULL, 0);
}

KILN_API struct kiln_tensor *kiln_reshape(const struct kiln_tensor *t, int ndim, const int64_t *sizes) {
  int64_t sz[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
  if (kiln_check_live("reshape", t) || infer_sizes("reshape", t, ndim, sizes, sz)) return NULL;
  if (view_strides(t, ndim, sz, st)) return recorded(view_of(t, ndim, sz, st, t->offset), KILN_VIEW_RESHAPE, t, NULL, 0);
  struct kiln_tensor *c = kiln_contiguous(t);
  if (!c) return NULL;
  struct kiln_tensor *v = recorded(view_of(c, ndim, sz, NULL, c->offset), KILN_VIEW_RESHAPE, c, NULL, 0);
  kiln_tensor_release(c);
  return v;
}

KILN_API struct kiln_tensor *kiln_transpose(const struct kiln_tensor *t, int dim0, int dim1) {
  int a = 0, b = 0;
  if (kiln_check_live("transpose", t) || kiln_normalize_dim("transpose", dim0, t->ndim, &a) ||
      kiln_normalize_dim("transpose", dim1, t->ndim, &b))
    return NULL;
  struct kiln_tensor *v = view_of(t, t->ndim, t->sizes, t->strides, t->offset);
  if (v && t->ndim > 0) {
    int64_t s = v->sizes[a]; v->sizes[a] = v->sizes[b]; v->sizes[b] = s;
    s = v->strides[a]; v->strides[a] = v->strides[b]; v->strides[b] = s;
  }
  return recorded(v, KILN_VIEW_TRANSPOSE, t, (int64_t[]){a, b}, 2);
}

KILN_API struct kiln_tensor *kiln_permute(const struct kiln_tensor *t, int ndim, const int *dims) {
  if (kiln_check_live("permute", t)) return NULL;
  if (ndim != t->ndim) {
    kiln_fail(KILN_ERR_SHAPE, "permute: %d dims given for tensor %s of %d dims", ndim, kiln_shape_string(t), t->ndim);
    return NULL;
  }
  if (ndim > 0 && !dims) {
    kiln_fail(KILN_ERR_ARGUMENT, "permute: the dims are NULL for %d dims", ndim);
    return NULL;
  }
  int seen[KILN_MAX_DIMS] = {0};
  int64_t sz[KILN_MAX_DIMS], st[KILN_MAX_DIMS], perm[KILN_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    int d = 0;
    if (kiln_normalize_dim("permute", dims[i], ndim, &d)) return NULL;
    if (seen[d]++) { kiln_fail(KILN_ERR_ARGUMENT, "permute: dim %d repeated (tensor %s)", d, kiln_shape_string(t)); return NULL; }
    sz[i] = t->sizes[d];
    st[i] = t->strides[d];
    perm[i] = d;
  }
  return recorded(view_of(t, ndim, sz, st, t->offset), KILN_VIEW_PERMUTE, t, perm, ndim);
}

KILN_API struct kiln_tensor *kiln_narrow(const struct kiln_tensor *t, int dim, int64_t start, int64_t length) {
  int d = 0;
  if (kiln_check_live("narrow", t)) return NULL;
  if (t->ndim == 0) { kiln_fail(KILN_ERR_SHAPE, "narrow: cannot narrow a 0-dim tensor"); return NULL; }
  if (kiln_normalize_dim("narrow", dim, t->ndim, &d)) return NULL;
  if (start < 0) start += t->sizes[d];
  if (start < 0 || length < 0 || start + length > t->sizes[d]) {
    kiln_fail(KILN_ERR_INDEX, "narrow: start %lld, length %lld out of range for dim %d of size %lld (tensor %s)",
              (long long)start, (long long)length, d, (long long)t->sizes[d], kiln_shape_string(t));
    return NULL;
  }
  int64_t sz[KILN_MAX_DIMS];
  memcpy(sz, t->sizes, sizeof sz);
  sz[d] = length;
  struct kiln_tensor *v = view_of(t, t->ndim, sz, t->strides, t->offset + start * t->strides[d]);
  return recorded(v, KILN_VIEW_NARROW, t, (int64_t[]){d, start, length}, 3);
}

KILN_API struct kiln_tensor *kiln_select(const struct kiln_tensor *t, int dim, int64_t index) {
  int d = 0;
  if (kiln_check_live("select", t)) return NULL;
  if (t->ndim == 0) { kiln_fail(KILN_ERR_SHAPE, "select: cannot index a 0-dim tensor"); return NULL; }
  if (kiln_normalize_dim("select", dim, t->ndim, &d)) return NULL;
  int64_t i = index < 0 ? index + t->sizes[d] : index;
  if (i < 0 || i >= t->sizes[d]) {
    kiln_fail(KILN_ERR_INDEX, "select: index %lld out of range for dim %d of size %lld (tensor %s; C counts from 0)",
              (long long)index, d, (long long)t->sizes[d], kiln_shape_string(t));
    return NULL;
  }
  int64_t sz[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
  int n = 0;
  for (int k = 0; k < t->ndim; k++)
    if (k != d) { sz[n] = t->sizes[k]; st[n] = t->strides[k]; n++; }
  return recorded(view_of(t, n, sz, st, t->offset + i * t->strides[d]), KILN_VIEW_SELECT, t, (int64_t[]){d, i}, 2);
}

KILN_API struct kiln_tensor *kiln_squeeze(const struct kiln_tensor *t, int dim) {
  int d = 0;
  if (kiln_check_live("squeeze", t) || kiln_normalize_dim("squeeze", dim, t->ndim, &d)) return NULL;
  if (t->ndim == 0 || t->sizes[d] != 1) return kiln_alias(t);
  return kiln_select(t, d, 0);
}

KILN_API struct kiln_tensor *kiln_squeeze_all(const struct kiln_tensor *t) {
  if (kiln_check_live("squeeze", t)) return NULL;
  int64_t sz[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
  int n = 0;
  for (int k = 0; k < t->ndim; k++)
    if (t->sizes[k] != 1) { sz[n] = t->sizes[k]; st[n] = t->strides[k]; n++; }
  return recorded(view_of(t, n, sz, st, t->offset), KILN_VIEW_RESHAPE, t, NULL, 0);
}

KILN_API struct kiln_tensor *kiln_unsqueeze(const struct kiln_tensor *t, int dim) {
  int d = 0;
  if (kiln_check_live("unsqueeze", t) || kiln_normalize_dim("unsqueeze", dim, t->ndim + 1, &d)) return NULL;
  if (t->ndim >= KILN_MAX_DIMS) { kiln_fail(KILN_ERR_SHAPE, "unsqueeze: tensor %s already has %d dims", kiln_shape_string(t), KILN_MAX_DIMS); return NULL; }
  int64_t sz[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
  for (int k = 0, j = 0; k <= t->ndim; k++) {
    if (k == d) {
      sz[k] = 1;
      st[k] = d < t->ndim ? t->strides[d] * t->sizes[d] : 1;
    } else {
      sz[k] = t->sizes[j];
      st[k] = t->strides[j];
      j++;
    }
  }
  return recorded(view_of(t, t->ndim + 1, sz, st, t->offset), KILN_VIEW_RESHAPE, t, NULL, 0);
}

KILN_API struct kiln_tensor *kiln_expand(const struct kiln_tensor *t, int ndim, const int64_t *sizes) {
  if (kiln_check_live("expand", t)) return NULL;
  if (ndim > 0 && !sizes) {
    kiln_fail(KILN_ERR_ARGUMENT, "expand: the sizes are NULL for %d dims", ndim);
    return NULL;
  }
  if (ndim < t->ndim || ndim > KILN_MAX_DIMS) {
    kiln_fail(KILN_ERR_SHAPE, "expand: cannot expand %s to %s", kiln_shape_string(t), kiln_sizes_string(ndim, sizes));
    return NULL;
  }
  int64_t sz[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
  int lead = ndim - t->ndim;
  for (int d = 0; d < ndim; d++) {
    int64_t want = sizes[d];
    if (d < lead) {
      if (want < 0) { kiln_fail(KILN_ERR_SHAPE, "expand: size -1 not allowed for a new leading dim (%s to %s)", kiln_shape_string(t), kiln_sizes_string(ndim, sizes)); return NULL; }
      sz[d] = want; st[d] = 0;
      continue;
    }
    int64_t have = t->sizes[d - lead];
    if (want == -1 || want == have) { sz[d] = have; st[d] = t->strides[d - lead]; }
    else if (have == 1 && want >= 0) { sz[d] = want; st[d] = 0; }
    else {
      kiln_fail(KILN_ERR_SHAPE, "expand: cannot expand %s to %s (dim %d: %lld vs %lld)", kiln_shape_string(t),
                kiln_sizes_string(ndim, sizes), d, (long long)have, (long long)want);
      return NULL;
    }
  }
  int64_t n = 1;
  for (int d = 0; d < ndim; d++)
    if (__builtin_mul_overflow(n, sz[d], &n)) {
      kiln_fail(KILN_ERR_SHAPE, "expand: %s to %s would have more than 2^63 elements", kiln_shape_string(t),
                kiln_sizes_string(ndim, sizes));
      return NULL;
    }
  return recorded(view_of(t, ndim, sz, st, t->offset), KILN_VIEW_EXPAND, t, NULL, 0);
}

KILN_API struct kiln_tensor *kiln_flatten(const struct kiln_tensor *t, int start_dim, int end_dim) {
  int s = 0, e = 0;
  if (kiln_check_live("flatten", t)) return NULL;
  if (t->ndim == 0) return kiln_reshape(t, 1, (int64_t[]){1});
  if (kiln_normalize_dim("flatten", start_dim, t->ndim, &s) || kiln_normalize_dim("flatten", end_dim, t->ndim, &e)) return NULL;
  if (s > e) { kiln_fail(KILN_ERR_ARGUMENT, "flatten: start dim %d after end dim %d", s, e); return NULL; }
  int64_t sz[KILN_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < s; d++) sz[n++] = t->sizes[d];
  int64_t p = 1;
  for (int d = s; d <= e; d++) p *= t->sizes[d];
  sz[n++] = p;
  for (int d = e + 1; d < t->ndim; d++) sz[n++] = t->sizes[d];
  return kiln_reshape(t, n, sz);
}

KILN_API struct kiln_tensor *kiln_contiguous(const struct kiln_tensor *t) {
  if (kiln_check_live("contiguous", t)) return NULL;
  if (kiln_is_contiguous(t)) { kiln_tensor_retain((struct kiln_tensor *)t); return (struct kiln_tensor *)t; }
  return kiln_clone(t);
}

/* ---- copies ---- */

KILN_API int kiln_copy_(struct kiln_tensor *dst, const struct kiln_tensor *src) {
  if (kiln_check_live("copy", dst) || kiln_check_live("copy", src)) return kiln_error_code();
  int nd;
  int64_t shape[KILN_MAX_DIMS];
  if (kiln_broadcast_shapes("copy", dst->ndim, dst->sizes, src->ndim, src->sizes, &nd, shape)) return kiln_error_code();
  if (nd != dst->ndim || memcmp(shape, dst->sizes, sizeof(int64_t) * (size_t)nd) != 0)
    return kiln_fail(KILN_ERR_SHAPE, "copy: source %s does not broadcast to destination %s", kiln_shape_string(src), kiln_shape_string(dst));
  if (dst->device.type != src->device.type || dst->device.index != src->device.index) {
    /* Between devices: the bytes go through a contiguous buffer of dst's dtype. */
    struct kiln_tensor *s = kiln_to_device(src, dst->device);
    if (!s) return kiln_error_code();
    int rc = kiln_copy_(dst, s);
    kiln_tensor_release(s);
    return rc;
  }
  if (kiln_autograd_check_inplace("copy_", dst, src)) return kiln_error_code();
  struct kiln_call call = {.op = KILN_OP_COPY, .out = dst, .in = {src}, .nin = 1};
  int rc = kiln_dispatch(dst->device, &call);
  if (!rc) dst->storage->version++;
  return rc;
}

KILN_API int kiln_fill_(struct kiln_tensor *t, double value) {
  if (kiln_check_live("fill", t) || kiln_autograd_check_inplace("fill_", t, NULL)) return kiln_error_code();
  struct kiln_call call = {.op = KILN_OP_FILL, .out = t, .scalar = {value}};
  int rc = kiln_dispatch(t->device, &call);
  if (!rc) t->storage->version++;
  return rc;
}

/* A copy into a fresh tensor: the caller records it as one op. */
static int copy_untracked(struct kiln_tensor *dst, const struct kiln_tensor *src) {
  int prev = kiln_set_grad_enabled(0);
  int rc = kiln_copy_(dst, src);
  kiln_set_grad_enabled(prev);
  return rc;
}

KILN_API struct kiln_tensor *kiln_clone(const struct kiln_tensor *t) {
  if (kiln_check_live("clone", t)) return NULL;
  struct kiln_tensor *c = kiln_tensor_empty(t->ndim, t->sizes, t->dtype, t->device);
  if (c && copy_untracked(c, t)) { kiln_tensor_release(c); return NULL; }
  return recorded(c, KILN_GRAD_CLONE, t, NULL, 0);
}

KILN_API struct kiln_tensor *kiln_to_dtype(const struct kiln_tensor *t, int dtype) {
  if (kiln_check_live("to", t)) return NULL;
  if (dtype < 0 || dtype >= KILN_DTYPE_COUNT) { kiln_fail(KILN_ERR_DTYPE, "to: unknown dtype %d", dtype); return NULL; }
  if (dtype == t->dtype) { kiln_tensor_retain((struct kiln_tensor *)t); return (struct kiln_tensor *)t; }
  struct kiln_tensor *c = kiln_tensor_empty(t->ndim, t->sizes, dtype, t->device);
  if (c && copy_untracked(c, t)) { kiln_tensor_release(c); return NULL; }
  return recorded(c, KILN_GRAD_CLONE, t, NULL, 0);
}

/* t in dtype; a matrix stored transposed (a weight's w:t(), or the grad of one) is converted in
   its own layout, a contiguous pass instead of a strided gather, and the result is that layout
   again. Recorded as kiln_to_dtype. */
struct kiln_tensor *kiln_to_dtype_in_layout(const struct kiln_tensor *t, int dtype) {
  if (t->ndim >= 2 && t->dtype != dtype && !kiln_is_contiguous(t)) {
    struct kiln_tensor *back = kiln_transpose(t, t->ndim - 2, t->ndim - 1);
    if (back && kiln_is_contiguous(back)) {
      struct kiln_tensor *c = kiln_to_dtype(back, dtype);
      struct kiln_tensor *r = c ? kiln_transpose(c, t->ndim - 2, t->ndim - 1) : NULL;
      kiln_tensor_release(back); kiln_tensor_release(c);
      return r;
    }
    kiln_tensor_release(back);
  }
  return kiln_to_dtype(t, dtype);
}

KILN_API struct kiln_tensor *kiln_tensor_pin_memory(const struct kiln_tensor *t) {
  if (kiln_check_live("pin_memory", t)) return NULL;
  if (t->device.type != KILN_CPU) {
    kiln_fail(KILN_ERR_DEVICE, "pin_memory: tensor %s %s is on %s (only cpu tensors can be pinned)", kiln_shape_string(t),
              kiln_dtype_name(t->dtype), kiln_device_name(t->device));
    return NULL;
  }
  if (kiln_tensor_is_pinned(t)) { kiln_tensor_retain((struct kiln_tensor *)t); return (struct kiln_tensor *)t; }
  struct kiln_tensor *c = kiln_tensor_empty_pinned(t->ndim, t->sizes, t->dtype, "pin_memory");
  if (c && copy_untracked(c, t)) { kiln_tensor_release(c); return NULL; }
  return recorded(c, KILN_GRAD_CLONE, t, NULL, 0);
}

static struct kiln_tensor *to_device(const struct kiln_tensor *t, struct kiln_device device, int non_blocking) {
  if (kiln_check_live("to", t)) return NULL;
  if (t->device.type == device.type && t->device.index == device.index) {
    kiln_tensor_retain((struct kiln_tensor *)t);
    return (struct kiln_tensor *)t;
  }
  const struct kiln_backend *src_be = kiln_backend_for(t->device, "to");
  const struct kiln_backend *dst_be = kiln_backend_for(device, "to");
  if (!src_be || !dst_be) return NULL;
  struct kiln_tensor *c = kiln_contiguous(t);
  if (!c) return NULL;
  struct kiln_tensor *out = kiln_tensor_empty(c->ndim, c->sizes, c->dtype, device);
  int64_t nbytes = c->numel * kiln_dtype_size(c->dtype);
  int rc = out ? KILN_OK : kiln_error_code();
  if (!rc && nbytes) {
    if (device.type == KILN_CPU) rc = src_be->memcpy_to_host(kiln_tensor_data(out), kiln_tensor_data(c), nbytes, c->device.index);
    else if (c->device.type == KILN_CPU && non_blocking && kiln_tensor_is_pinned(c) && dst_be->memcpy_from_host_async)
      rc = dst_be->memcpy_from_host_async(kiln_tensor_data(out), kiln_tensor_data(c), nbytes, device.index);
    else if (c->device.type == KILN_CPU) rc = dst_be->memcpy_from_host(kiln_tensor_data(out), kiln_tensor_data(c), nbytes, device.index);
    else rc = kiln_fail(KILN_ERR_UNSUPPORTED, "to: copies between %s and another GPU go through the cpu for now", kiln_device_name(c->device));
  }
  kiln_tensor_release(c);
  if (rc) { kiln_tensor_release(out); return NULL; }
  return recorded(out, KILN_GRAD_CLONE, t, NULL, 0);
}

KILN_API struct kiln_tensor *kiln_to_device(const struct kiln_tensor *t, struct kiln_device device) {
  return to_device(t, device, 0);
}

KILN_API struct kiln_tensor *kiln_to_device_non_blocking(const struct kiln_tensor *t, struct kiln_device device) {
  return to_device(t, device, 1);
}
