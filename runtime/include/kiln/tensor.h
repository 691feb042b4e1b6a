/* kiln/tensor.h: the tensor header over a reference-counted storage, creation and views.
   The structs are public so that bindings read sizes and strides without a call. */
#ifndef KILN_TENSOR_H
#define KILN_TENSOR_H
#include <stdint.h>
#include <kiln/device.h>

enum { KILN_MAX_DIMS = 8 };

enum kiln_storage_flags {
  KILN_STORAGE_FREED = 1,     /* kiln_tensor_free() released the memory early */
  KILN_STORAGE_BORROWED = 2,  /* the memory belongs to someone else and is not freed */
  KILN_STORAGE_INLINE = 4,    /* a small CPU storage: the data follows the header in one block */
  KILN_STORAGE_EXTERNAL = 8,  /* the memory is lent by an owner (a mapped file) told when it is let go */
  KILN_STORAGE_PINNED = 16    /* a CPU storage in page-locked memory of the CUDA backend */
};

struct kiln_storage {
  void *data;
  int64_t nbytes;
  struct kiln_device device;
  int32_t refcount;
  int32_t flags;              /* enum kiln_storage_flags */
  int64_t version;            /* bumped by every in-place write */
};

struct kiln_tensor {
  int64_t sizes[KILN_MAX_DIMS];
  int64_t strides[KILN_MAX_DIMS];  /* in elements */
  int64_t offset;                  /* in elements, into storage */
  int64_t numel;
  int32_t ndim;
  int32_t dtype;                   /* enum kiln_dtype */
  struct kiln_device device;
  int32_t refcount;
  int32_t requires_grad;
  struct kiln_storage *storage;
  void *grad_fn;                   /* autograd node that made this tensor, or NULL */
  struct kiln_tensor *grad;        /* accumulated gradient of a leaf, or NULL */
  /* A view (narrow, select, view, transpose, ...): the tensor whose storage it views, held, never
     itself a view (the view of a view names the first one's base); NULL for a tensor that is not
     a view. An in-place op on a view changes its base's values and so its history (autograd.c). */
  struct kiln_tensor *base;
  /* Not a view: how many times an in-place op replaced its history. A view: its base's count
     when its own history was last derived from the base's (a view is brought up to date before
     autograd reads it), or -1 for a view taken with grad mode off, which never follows it. */
  int64_t history_version;
};

/* References. Every function returning a tensor returns a new reference (or NULL on failure). */
void kiln_tensor_retain(struct kiln_tensor *t);
void kiln_tensor_release(struct kiln_tensor *t);

/* The handle LuaJIT holds a tensor by: a struct, because LuaJIT gives bare pointers built-in
   arithmetic and indexing that a tensor's metatype could not override. Its finalizer releases p. */
struct kiln_ref {
  struct kiln_tensor *p;
};
void kiln_ref_release(struct kiln_ref *ref);
/* Release the storage's memory now; later use of any view of it is an error. */
void kiln_tensor_free(struct kiln_tensor *t);
int kiln_tensor_is_freed(const struct kiln_tensor *t);

/* Creation. sizes has ndim entries (ndim may be 0: a scalar). */
struct kiln_tensor *kiln_tensor_empty(int ndim, const int64_t *sizes, int dtype, struct kiln_device device);
struct kiln_tensor *kiln_tensor_full(int ndim, const int64_t *sizes, double value, int dtype, struct kiln_device device);
struct kiln_tensor *kiln_tensor_arange(double start, double end, double step, int dtype, struct kiln_device device);
struct kiln_tensor *kiln_tensor_linspace(double start, double end, int64_t steps, int dtype, struct kiln_device device);
struct kiln_tensor *kiln_tensor_eye(int64_t n, int64_t m, int dtype, struct kiln_device device);
/* Copies n = prod(sizes) doubles (row-major) into a new tensor of dtype. */
struct kiln_tensor *kiln_tensor_from_f64(int ndim, const int64_t *sizes, const double *data, int dtype, struct kiln_device device);
/* Copies every element, in row-major order, converted to double, into out (numel entries). */
int kiln_tensor_to_f64(const struct kiln_tensor *t, double *out);
/* One element at a storage offset (in elements), converted from/to double; the bindings check
   the index against the tensor's sizes first, these only that the offset lies in the storage. No
   tensor, a freed one, one off the cpu or an offset outside: NaN (get) or an error (set), with the
   error message set. */
double kiln_tensor_get(const struct kiln_tensor *t, int64_t storage_offset);
int kiln_tensor_set(struct kiln_tensor *t, int64_t storage_offset, double value);
/* The value of a one-element tensor. */
int kiln_tensor_item(const struct kiln_tensor *t, double *out);

/* Views: they share the storage. Dims count from 0; a negative dim counts from the end. */
struct kiln_tensor *kiln_view(const struct kiln_tensor *t, int ndim, const int64_t *sizes);  /* one size may be -1 */
struct kiln_tensor *kiln_reshape(const struct kiln_tensor *t, int ndim, const int64_t *sizes); /* a view when possible, else a copy */
struct kiln_tensor *kiln_transpose(const struct kiln_tensor *t, int dim0, int dim1);
struct kiln_tensor *kiln_permute(const struct kiln_tensor *t, int ndim, const int *dims);
struct kiln_tensor *kiln_narrow(const struct kiln_tensor *t, int dim, int64_t start, int64_t length);
struct kiln_tensor *kiln_select(const struct kiln_tensor *t, int dim, int64_t index);
struct kiln_tensor *kiln_squeeze(const struct kiln_tensor *t, int dim);
struct kiln_tensor *kiln_squeeze_all(const struct kiln_tensor *t);
struct kiln_tensor *kiln_unsqueeze(const struct kiln_tensor *t, int dim);
struct kiln_tensor *kiln_expand(const struct kiln_tensor *t, int ndim, const int64_t *sizes); /* -1 keeps a size */
struct kiln_tensor *kiln_flatten(const struct kiln_tensor *t, int start_dim, int end_dim);
struct kiln_tensor *kiln_alias(const struct kiln_tensor *t);     /* a new header over the same view */
struct kiln_tensor *kiln_contiguous(const struct kiln_tensor *t); /* t itself (a new reference) when already contiguous */
int kiln_is_contiguous(const struct kiln_tensor *t);

/* Copies and conversion. */
int kiln_copy_(struct kiln_tensor *dst, const struct kiln_tensor *src);   /* src broadcast to dst, converted */
int kiln_fill_(struct kiln_tensor *t, double value);
struct kiln_tensor *kiln_clone(const struct kiln_tensor *t);
struct kiln_tensor *kiln_to_dtype(const struct kiln_tensor *t, int dtype);  /* t itself when dtype matches */
struct kiln_tensor *kiln_to_device(const struct kiln_tensor *t, struct kiln_device device);
/* The same, not waiting when it can: an upload from a contiguous pinned CPU tensor to a CUDA device
   is queued on the device's stream and the call returns at once (later work on that device sees
   the data; the host must not write the source before kiln_cuda_synchronize). Any other move waits,
   as kiln_to_device does. */
struct kiln_tensor *kiln_to_device_non_blocking(const struct kiln_tensor *t, struct kiln_device device);

/* Page-locked ("pinned") host memory, for uploads that do not wait. A contiguous copy of a CPU
   tensor in pinned memory (t itself, a new reference, when it is pinned already); without a usable
   CUDA device: "pin_memory: no CUDA device: <why>". */
struct kiln_tensor *kiln_tensor_pin_memory(const struct kiln_tensor *t);
/* 1 when t's storage is pinned. */
int kiln_tensor_is_pinned(const struct kiln_tensor *t);

/* "[2,3]" for error messages (a per-thread rotating buffer, valid for a few calls). */
const char *kiln_shape_string(const struct kiln_tensor *t);

#endif
