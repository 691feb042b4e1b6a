/* tensor.c: storages and headers, creation, views, and element access. */
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* ---- storage ---- */

/* Small CPU storages share one allocation with their header: a tensor op on small data then
   costs two mallocs (header, storage) instead of three. */
enum { INLINE_BYTES = 4096, INLINE_HEADER = 64 };

static struct kiln_storage *storage_new(int64_t nbytes, struct kiln_device device, const char *op) {
  const struct kiln_backend *be = kiln_backend_for(device, op);
  if (!be) return NULL;
  struct kiln_storage *s;
  if (device.type == KILN_CPU && nbytes <= INLINE_BYTES) {
    _Static_assert(sizeof(struct kiln_storage) <= INLINE_HEADER, "storage header too large to inline");
    s = malloc((size_t)(INLINE_HEADER + nbytes));
    if (!s) { kiln_fail(KILN_ERR_MEMORY, "%s: out of memory allocating %lld bytes", op, (long long)nbytes); return NULL; }
    memset(s, 0, sizeof *s);
    s->data = (char *)s + INLINE_HEADER;
    s->flags = KILN_STORAGE_INLINE;
  } else {
    s = calloc(1, sizeof *s);
    if (!s) { kiln_fail(KILN_ERR_MEMORY, "%s: out of memory for a storage header", op); return NULL; }
    kiln_error_clear();
    s->data = be->alloc(nbytes, device.index);
    if (!s->data) {
      free(s);
      /* a device allocator explains itself (request, memory in use and reserved, the retry); keep it */
      if (kiln_error_message()[0]) kiln_fail(KILN_ERR_MEMORY, "%s: %s", op, kiln_error_message());
      else kiln_fail(KILN_ERR_MEMORY, "%s: out of memory allocating %lld bytes on %s (%lld bytes in use)", op,
                     (long long)nbytes, kiln_device_name(device), (long long)kiln_memory_stats(device.type)->live_bytes);
      return NULL;
    }
  }
  s->nbytes = nbytes;
  s->device = device;
  s->refcount = 1;
  kiln_memory_count_alloc(device.type, nbytes);
  return s;
}

/* A CPU storage in page-locked memory of the CUDA backend (never inline: the block is the backend's). */
static struct kiln_storage *storage_new_pinned(int64_t nbytes, const char *op) {
  const struct kiln_backend *be = kiln_pinned_backend(op);
  if (!be) return NULL;
  struct kiln_storage *s = calloc(1, sizeof *s);
  if (!s) { kiln_fail(KILN_ERR_MEMORY, "%s: out of memory for a storage header", op); return NULL; }
  kiln_error_clear();
  s->data = be->host_alloc(nbytes);
  if (!s->data) {
    free(s);
    if (kiln_error_message()[0]) kiln_fail(KILN_ERR_MEMORY, "%s: %s", op, kiln_error_message());
    else kiln_fail(KILN_ERR_MEMORY, "%s: out of pinned memory allocating %lld bytes", op, (long long)nbytes);
    return NULL;
  }
  s->nbytes = nbytes;
  s->device = (struct kiln_device){KILN_CPU, 0};
  s->refcount = 1;
  s->flags = KILN_STORAGE_PINNED;
  kiln_memory_count_alloc(KILN_CPU, nbytes);
  return s;
}

/* A storage over memory lent by an owner: the header is followed by the owner's release hook. */
struct external_storage {
  struct kiln_storage s;
  void (*release)(void *ctx);
  void *ctx;
};

static void storage_free_data(struct kiln_storage *s) {
  if (s->data && !(s->flags & (KILN_STORAGE_FREED | KILN_STORAGE_BORROWED))) {
    if (s->flags & KILN_STORAGE_EXTERNAL) {
      struct external_storage *e = (struct external_storage *)s;
      e->release(e->ctx);
    } else if (s->flags & KILN_STORAGE_PINNED) {
      /* only a loaded CUDA backend makes pinned storages; it tracks the copies still reading them */
      const struct kiln_backend *be = kiln_pinned_backend("free");
      if (be) be->host_free(s->data, s->nbytes);
    } else if (!(s->flags & KILN_STORAGE_INLINE)) {
      const struct kiln_backend *be = kiln_backend_for(s->device, "free");
      if (be) be->free(s->data, s->nbytes, s->device.index);
    }
    kiln_memory_count_free(s->device.type, s->nbytes);
  }
  s->data = NULL;
  s->flags |= KILN_STORAGE_FREED;
}

static void storage_release(struct kiln_storage *s) {
  if (s && __atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    storage_free_data(s);
    free(s);
  }
}

struct kiln_tensor *kiln_tensor_external(int ndim, const int64_t *sizes, int dtype, void *data,
                                         void (*release)(void *ctx), void *ctx) {
  struct external_storage *e = calloc(1, sizeof *e);
  if (!e) { kiln_fail(KILN_ERR_MEMORY, "out of memory for a storage header"); return NULL; }
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= sizes[d];
  e->s.data = data;
  e->s.nbytes = numel * kiln_dtype_size(dtype);
  e->s.device = (struct kiln_device){KILN_CPU, 0};
  e->s.refcount = 1;
  e->s.flags = KILN_STORAGE_EXTERNAL;
  e->release = release;
  e->ctx = ctx;
  struct kiln_tensor *t = kiln_tensor_header(ndim, sizes, NULL, 0, dtype, e->s.device, &e->s);
  if (!t) { free(e); return NULL; }   /* the caller still owns the memory */
  kiln_memory_count_alloc(KILN_CPU, e->s.nbytes);
  storage_release(&e->s);             /* the header holds it now */
  return t;
}

/* ---- headers ---- */

void kiln_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides) {
  int64_t st = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    strides[d] = st;
    st *= sizes[d] > 1 ? sizes[d] : 1;
  }
}

struct kiln_tensor *kiln_tensor_header(int ndim, const int64_t *sizes, const int64_t *strides, int64_t offset,
                                       int dtype, struct kiln_device device, struct kiln_storage *storage) {
  struct kiln_tensor *t = malloc(sizeof *t);
  if (!t) { kiln_fail(KILN_ERR_MEMORY, "out of memory for a tensor header"); return NULL; }
  memset(t, 0, sizeof *t);
  t->ndim = ndim;
  t->numel = 1;
  for (int d = 0; d < ndim; d++) {
    t->sizes[d] = sizes[d];
    if (__builtin_mul_overflow(t->numel, sizes[d], &t->numel)) {   /* e.g. a view expanded past 2^63 elements */
      free(t);
      kiln_fail(KILN_ERR_SHAPE, "a tensor of sizes %s would have more than 2^63 elements", kiln_sizes_string(ndim, sizes));
      return NULL;
    }
  }
  if (strides) memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
  else kiln_contiguous_strides(ndim, sizes, t->strides);
  t->offset = offset;
  t->dtype = dtype;
  t->device = device;
  t->refcount = 1;
  t->storage = storage;
  if (storage) __atomic_add_fetch(&storage->refcount, 1, __ATOMIC_RELAXED);
  return t;
}

KILN_API void kiln_tensor_retain(struct kiln_tensor *t) {
  if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
}

/* How a tensor lets go of its grad_fn: set by autograd before it makes the first node, so that the
   tensor code knows nothing of graphs. */
static void (*grad_fn_release)(void *node);

void kiln_tensor_set_grad_fn_release(void (*release)(void *node)) {
  __atomic_store_n(&grad_fn_release, release, __ATOMIC_RELEASE);
}

KILN_API void kiln_tensor_release(struct kiln_tensor *t) {
  if (t && __atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    kiln_tensor_release(t->grad);
    if (t->grad_fn) __atomic_load_n(&grad_fn_release, __ATOMIC_ACQUIRE)(t->grad_fn);
    storage_release(t->storage);
    free(t);
  }
}

KILN_API void kiln_ref_release(struct kiln_ref *ref) {
  if (ref) {
    kiln_tensor_release(ref->p);
    ref->p = NULL;
  }
}

KILN_API void kiln_tensor_free(struct kiln_tensor *t) {
  if (t && t->storage) storage_free_data(t->storage);
}

KILN_API int kiln_tensor_is_freed(const struct kiln_tensor *t) {
  return t && t->storage && (t->storage->flags & KILN_STORAGE_FREED) != 0;
}

void kiln_tensor_bump_version(struct kiln_tensor *t) { t->storage->version++; }

const char *kiln_sizes_string(int ndim, const int64_t *sizes) {
  static _Thread_local char bufs[4][160];
  static _Thread_local int next;
  char *b = bufs[next++ & 3];
  int n = snprintf(b, 160, "[");
  for (int d = 0; d < ndim && n < 150; d++) n += snprintf(b + n, (size_t)(160 - n), d ? ",%lld" : "%lld", (long long)sizes[d]);
  snprintf(b + n, (size_t)(160 - n), "]");
  return b;
}

KILN_API const char *kiln_shape_string(const struct kiln_tensor *t) {
  if (!t) return "(null)";
  return kiln_sizes_string(t->ndim, t->sizes);
}

int kiln_check_live(const char *op, const struct kiln_tensor *t) {
  if (!t) return kiln_fail(KILN_ERR_ARGUMENT, "%s: a tensor argument is missing (NULL)", op);
  if (t->storage && (t->storage->flags & KILN_STORAGE_FREED))
    return kiln_fail(KILN_ERR_STATE, "%s: tensor %s %s was freed", op, kiln_shape_string(t), kiln_dtype_name(t->dtype));
  return KILN_OK;
}

int kiln_check_same_device(const char *op, const struct kiln_tensor *a, const struct kiln_tensor *b) {
  if (a->device.type != b->device.type || a->device.index != b->device.index) {
    char da[32];
    snprintf(da, sizeof da, "%s", kiln_device_name(a->device));
    return kiln_fail(KILN_ERR_DEVICE, "%s: tensors on different devices (%s %s on %s, %s %s on %s)", op,
                     kiln_shape_string(a), kiln_dtype_name(a->dtype), da, kiln_shape_string(b),
                     kiln_dtype_name(b->dtype), kiln_device_name(b->device));
  }
  return KILN_OK;
}

int kiln_normalize_dim(const char *op, int dim, int ndim, int *out) {
  int n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n)
    return kiln_fail(KILN_ERR_INDEX, "%s: dim %d out of range for a tensor of %d dims (C counts from 0)", op, dim, ndim);
  *out = dim < 0 ? dim + n : dim;
  return KILN_OK;
}

static int check_sizes(const char *op, int ndim, const int64_t *sizes) {
  if (ndim < 0 || ndim > KILN_MAX_DIMS)
    return kiln_fail(KILN_ERR_SHAPE, "%s: %d dims (at most %d)", op, ndim, KILN_MAX_DIMS);
  if (ndim > 0 && !sizes) return kiln_fail(KILN_ERR_ARGUMENT, "%s: the sizes are NULL for %d dims", op, ndim);
  for (int d = 0; d < ndim; d++)
    if (sizes[d] < 0) return kiln_fail(KILN_ERR_SHAPE, "%s: negative size in %s", op, kiln_sizes_string(ndim, sizes));
  return KILN_OK;
}

/* ---- creation ---- */

KILN_API struct kiln_tensor *kiln_tensor_empty(int ndim, const int64_t *sizes, int dtype, struct kiln_device device) {
  if (check_sizes("empty", ndim, sizes)) return NULL;
  if (dtype < 0 || dtype >= KILN_DTYPE_COUNT) { kiln_fail(KILN_ERR_DTYPE, "empty: unknown dtype %d", dtype); return NULL; }
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (sizes[d] && numel > INT64_MAX / 16 / sizes[d]) {
      kiln_fail(KILN_ERR_MEMORY, "empty: %s elements of %s do not fit in memory", kiln_sizes_string(ndim, sizes), kiln_dtype_name(dtype));
      return NULL;
    }
    numel *= sizes[d];
  }
  struct kiln_storage *s = storage_new(numel * kiln_dtype_size(dtype), device, "empty");
  if (!s) return NULL;
  struct kiln_tensor *t = kiln_tensor_header(ndim, sizes, NULL, 0, dtype, device, s);
  storage_release(s);   /* the header holds it now */
  return t;
}

struct kiln_tensor *kiln_tensor_empty_pinned(int ndim, const int64_t *sizes, int dtype, const char *op) {
  if (check_sizes(op, ndim, sizes)) return NULL;
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (sizes[d] && numel > INT64_MAX / 16 / sizes[d]) {
      kiln_fail(KILN_ERR_MEMORY, "%s: %s elements of %s do not fit in memory", op, kiln_sizes_string(ndim, sizes), kiln_dtype_name(dtype));
      return NULL;
    }
    numel *= sizes[d];
  }
  struct kiln_storage *s = storage_new_pinned(numel * kiln_dtype_size(dtype), op);
  if (!s) return NULL;
  struct kiln_tensor *t = kiln_tensor_header(ndim, sizes, NULL, 0, dtype, s->device, s);
  storage_release(s);   /* the header holds it now */
  return t;
}

KILN_API struct kiln_tensor *kiln_tensor_full(int ndim, const int64_t *sizes, double value, int dtype, struct kiln_device device) {
  struct kiln_tensor *t = kiln_tensor_empty(ndim, sizes, dtype, device);
  if (t && kiln_fill_(t, value)) { kiln_tensor_release(t); return NULL; }
  return t;
}

/* Fill a fresh CPU f64 buffer through fn, then convert to the requested dtype and device. */
static struct kiln_tensor *from_values(int ndim, const int64_t *sizes, const double *values, int dtype, struct kiln_device device) {
  struct kiln_tensor *t = kiln_tensor_from_f64(ndim, sizes, values, dtype, device);
  return t;
}

KILN_API struct kiln_tensor *kiln_tensor_arange(double start, double end, double step, int dtype, struct kiln_device device) {
  if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step)) {
    kiln_fail(KILN_ERR_ARGUMENT, "arange: start %g, end %g, step %g (step must be non-zero and all finite)", start, end, step);
    return NULL;
  }
  double count = ceil((end - start) / step);
  if (count < 0) count = 0;
  if (count > 1e12) { kiln_fail(KILN_ERR_ARGUMENT, "arange: %g elements is too many", count); return NULL; }
  int64_t n = (int64_t)count;
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  if (!v) { kiln_fail(KILN_ERR_MEMORY, "arange: out of memory"); return NULL; }
  for (int64_t i = 0; i < n; i++) v[i] = start + (double)i * step;
  struct kiln_tensor *t = from_values(1, &n, v, dtype, device);
  free(v);
  return t;
}

KILN_API struct kiln_tensor *kiln_tensor_linspace(double start, double end, int64_t steps, int dtype, struct kiln_device device) {
  if (steps < 0) { kiln_fail(KILN_ERR_ARGUMENT, "linspace: steps %lld is negative", (long long)steps); return NULL; }
  double *v = malloc(sizeof(double) * (size_t)(steps ? steps : 1));
  if (!v) { kiln_fail(KILN_ERR_MEMORY, "linspace: out of memory"); return NULL; }
  double step = steps > 1 ? (end - start) / (double)(steps - 1) : 0;
  /* Like PyTorch: the first half counts up from start, the second down from end, so both ends are exact. */
  for (int64_t i = 0; i < steps; i++) v[i] = i < steps / 2 || steps == 1 ? start + step * (double)i : end - step * (double)(steps - 1 - i);
  struct kiln_tensor *t = from_values(1, &steps, v, dtype, device);
  free(v);
  return t;
}

KILN_API struct kiln_tensor *kiln_tensor_eye(int64_t n, int64_t m, int dtype, struct kiln_device device) {
  if (m < 0) m = n;
  int64_t sizes[2] = {n, m};
  struct kiln_tensor *t = kiln_tensor_full(2, sizes, 0, dtype, device);
  if (!t) return NULL;
  if (device.type == KILN_CPU) {
    int es = kiln_dtype_size(dtype);
    char *p = kiln_tensor_data(t);
    for (int64_t i = 0; i < n && i < m; i++) kiln_store_f64(p + (i * m + i) * es, dtype, 1.0);
  } else {
    struct kiln_tensor *diag = kiln_tensor_header(1, (int64_t[]){n < m ? n : m}, (int64_t[]){m + 1}, 0, dtype, device, t->storage);
    if (!diag || kiln_fill_(diag, 1.0)) { kiln_tensor_release(diag); kiln_tensor_release(t); return NULL; }
    kiln_tensor_release(diag);
  }
  return t;
}

KILN_API struct kiln_tensor *kiln_tensor_from_f64(int ndim, const int64_t *sizes, const double *data, int dtype, struct kiln_device device) {
  struct kiln_device cpu = {KILN_CPU, 0};
  struct kiln_tensor *t = kiln_tensor_empty(ndim, sizes, dtype, cpu);
  if (!t) return NULL;
  if (t->numel && !data) { kiln_tensor_release(t); kiln_fail(KILN_ERR_ARGUMENT, "from_f64: data is NULL"); return NULL; }
  kiln_convert(t->storage->data, dtype, data, KILN_F64, t->numel);
  if (device.type == KILN_CPU) return t;
  struct kiln_tensor *d = kiln_to_device(t, device);
  kiln_tensor_release(t);
  return d;
}

KILN_API int kiln_tensor_to_f64(const struct kiln_tensor *t, double *out) {
  if (kiln_check_live("to_f64", t)) return kiln_error_code();
  if (t->numel && !out) return kiln_fail(KILN_ERR_ARGUMENT, "to_f64: out is NULL for %s", kiln_shape_string(t));
  struct kiln_tensor *c = NULL;
  if (t->device.type != KILN_CPU) {
    c = kiln_to_device(t, (struct kiln_device){KILN_CPU, 0});
    if (!c) return kiln_error_code();
    t = c;
  }
  struct kiln_tensor *dst = kiln_tensor_header(t->ndim, t->sizes, NULL, 0, KILN_F64, t->device, NULL);
  if (!dst) { kiln_tensor_release(c); return kiln_error_code(); }
  struct kiln_storage s = {.data = out, .nbytes = t->numel * 8, .device = t->device, .refcount = 1, .flags = KILN_STORAGE_BORROWED};
  dst->storage = &s;
  int rc = kiln_cpu_copy(dst, t);
  dst->storage = NULL;
  kiln_tensor_release(dst);
  kiln_tensor_release(c);
  return rc;
}

/* The address of one element for get and set: a live cpu tensor and an offset inside its storage;
   else NULL and the error naming op. */
static char *element_at(const char *op, const struct kiln_tensor *t, int64_t storage_offset) {
  if (kiln_check_live(op, t)) return NULL;
  if (t->device.type != KILN_CPU) {
    kiln_fail(KILN_ERR_DEVICE, "%s: element access on %s (copy to cpu first)", op, kiln_device_name(t->device));
    return NULL;
  }
  int64_t size = kiln_dtype_size(t->dtype);
  if (storage_offset < 0 || (storage_offset + 1) * size > t->storage->nbytes) {
    kiln_fail(KILN_ERR_INDEX, "%s: storage offset %lld outside the storage of %s", op, (long long)storage_offset,
              kiln_shape_string(t));
    return NULL;
  }
  return (char *)t->storage->data + storage_offset * size;
}

KILN_API double kiln_tensor_get(const struct kiln_tensor *t, int64_t storage_offset) {
  const char *p = element_at("get", t, storage_offset);   /* the bindings check first: NaN is the last line */
  return p ? kiln_load_f64(p, t->dtype) : NAN;
}

KILN_API int kiln_tensor_set(struct kiln_tensor *t, int64_t storage_offset, double value) {
  char *p = element_at("set", t, storage_offset);
  if (!p || kiln_autograd_check_inplace("set", t, NULL)) return kiln_error_code();
  kiln_store_f64(p, t->dtype, value);
  t->storage->version++;
  return KILN_OK;
}

KILN_API int kiln_tensor_item(const struct kiln_tensor *t, double *out) {
  if (kiln_check_live("item", t)) return kiln_error_code();
  if (t->numel != 1)
    return kiln_fail(KILN_ERR_SHAPE, "item: tensor %s has %lld elements (expected 1)", kiln_shape_string(t), (long long)t->numel);
  return kiln_tensor_to_f64(t, out);
}

/* ---- views for kernels ---- */

struct kiln_tensor *kiln_layout_alias(const struct kiln_tensor *t) {
  return kiln_tensor_header(t->ndim, t->sizes, t->strides, t->offset, t->dtype, t->device, t->storage);
}

struct kiln_tensor *kiln_layout_expand(const struct kiln_tensor *t, int ndim, const int64_t *sizes) {
  int64_t st[KILN_MAX_DIMS];
  int lead = ndim - t->ndim;
  for (int d = 0; d < ndim; d++)
    st[d] = d < lead || (t->sizes[d - lead] == 1 && sizes[d] != 1) ? 0 : t->strides[d - lead];
  return kiln_tensor_header(ndim, sizes, st, t->offset, t->dtype, t->device, t->storage);
}

struct kiln_tensor *kiln_layout_permute(const struct kiln_tensor *t, int ndim, const int *perm) {
  int64_t sz[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
  for (int i = 0; i < ndim; i++) { sz[i] = t->sizes[perm[i]]; st[i] = t->strides[perm[i]]; }
  return kiln_tensor_header(ndim, sz, st, t->offset, t->dtype, t->device, t->storage);
}

/* ---- views ---- */

static struct kiln_tensor *view_of(const struct kiln_tensor *t, int ndim, const int64_t *sizes, const int64_t *strides, int64_t offset) {
  struct kiln_tensor *v = kiln_tensor_header(ndim, sizes, strides, offset, t->dtype, t->device, t->storage);
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

KILN_API int kiln_is_contiguous(const struct kiln_tensor *t) {
  if (!t) return 0;              /* no tensor: nothing to read (the predicates answer, never crash) */
  if (t->numel == 0) return 1;   /* as in PyTorch: an empty tensor has no layout to break */
  int64_t st = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->sizes[d] != 1 && t->strides[d] != st) return 0;
    st *= t->sizes[d];
  }
  return 1;
}

/* Resolve one -1 and check that the element count is kept. */
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

KILN_API int kiln_tensor_is_pinned(const struct kiln_tensor *t) {
  return t && t->storage && (t->storage->flags & KILN_STORAGE_PINNED) && !(t->storage->flags & KILN_STORAGE_FREED);
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
