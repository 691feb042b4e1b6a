/* tensor.c: storages and headers, empty tensors, element reads, and the views kernels use. */
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* ---- storage ---- */

/* Small CPU storages share one allocation with their header: a tensor op on small data then
   costs two mallocs (header, storage) instead of three. */
enum { INLINE_BYTES = 4096, INLINE_HEADER = 64 };

/* Device memory, as dispatch gives it (kiln_storage_set_memory, from its constructor): the storages
   here know no backend. */
static const struct kiln_device_memory *memory;

void kiln_storage_set_memory(const struct kiln_device_memory *m) { memory = m; }

static struct kiln_storage *storage_new(int64_t nbytes, struct kiln_device device, const char *op) {
  if (!memory->usable(device, op)) return NULL;
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
    s->data = memory->alloc(nbytes, device);
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
  if (!memory->host_usable(op)) return NULL;
  struct kiln_storage *s = calloc(1, sizeof *s);
  if (!s) { kiln_fail(KILN_ERR_MEMORY, "%s: out of memory for a storage header", op); return NULL; }
  kiln_error_clear();
  s->data = memory->host_alloc(nbytes);
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
      memory->host_free(s->data, s->nbytes);
    } else if (!(s->flags & KILN_STORAGE_INLINE)) {
      memory->free(s->data, s->nbytes, s->device);
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
    struct kiln_tensor *base = t->base;   /* never a view itself: this recursion is one level deep */
    free(t);
    kiln_tensor_release(base);
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

char *kiln_element_at(const char *op, const struct kiln_tensor *t, int64_t storage_offset) {
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
  const char *p = kiln_element_at("get", t, storage_offset);   /* the bindings check first: NaN is the last line */
  return p ? kiln_load_f64(p, t->dtype) : NAN;
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
KILN_API int kiln_tensor_is_pinned(const struct kiln_tensor *t) {
  return t && t->storage && (t->storage->flags & KILN_STORAGE_PINNED) && !(t->storage->flags & KILN_STORAGE_FREED);
}
