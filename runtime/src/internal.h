/* internal.h: what the runtime's C files share and the bindings never see: the error helper,
   the backend table, the call record a kernel receives, and the thread pool. */
#ifndef KILN_INTERNAL_H
#define KILN_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus   /* the CUDA backend's .cu files include this header (the public headers, */
extern "C" {         /* fed to ffi.cdef as they are, cannot carry the guard themselves) */
#endif
#include <kiln/kiln.h>
#include "dispatch/op_table.h"

#define KILN_API __attribute__((visibility("default")))

/* Write "fmt..." to this thread's error buffer and return code. */
int kiln_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefix the current message with "op: " when it lacks one. */

/* The BLAS's GEMM, loaded by system.c (OpenBLAS, reloaded with the right kernels where it chose generic
   ones): C[m,n] = alpha * op(A) op(B) + beta * C, row-major; ta and tb are KILN_BLAS_NO_TRANS or
   KILN_BLAS_TRANS (CBLAS's values). */
enum { KILN_BLAS_ROW_MAJOR = 101, KILN_BLAS_NO_TRANS = 111, KILN_BLAS_TRANS = 112 };
typedef void (*kiln_sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                              const float *b, int ldb, float beta, float *c, int ldc);
typedef void (*kiln_dgemm_fn)(int order, int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda,
                              const double *b, int ldb, double beta, double *c, int ldc);
void kiln_sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                float beta, float *c, int ldc);
void kiln_dgemm(int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda, const double *b, int ldb,
                double beta, double *c, int ldc);

/* The record a kernel receives. The front end has checked shapes, dtypes and devices and
   allocated the outputs; a kernel only computes. */
struct kiln_call {
  int op;
  struct kiln_tensor *out;
  const struct kiln_tensor *in[4];
  int nin;
  double scalar[4];
  int64_t ints[KILN_MAX_DIMS + 4];
  int nints;
  const void *extra;               /* op-specific: e.g. the tensor list of cat */
};

typedef int (*kiln_kernel)(const struct kiln_call *call);

/* A device's table of kernels and memory functions. */
struct kiln_backend {
  const char *name;
  void *(*alloc)(int64_t nbytes, int device_index);
  void (*free)(void *data, int64_t nbytes, int device_index);
  /* Copy nbytes between host and device memory (CPU backend: memcpy). */
  int (*memcpy_to_host)(void *dst, const void *src, int64_t nbytes, int device_index);
  int (*memcpy_from_host)(void *dst, const void *src, int64_t nbytes, int device_index);
  kiln_kernel kernel[KILN_OP_COUNT];
  /* CUDA only (NULL for the CPU): wait for a device's work (-1: every device), the caching
     allocator's statistics, and giving its unused blocks back to the driver. */
  int (*synchronize)(int device_index);
  int (*memory_stats)(int device_index, struct kiln_cuda_memory *out);
  int (*empty_cache)(void);
  /* CUDA only: page-locked host memory for CPU storages flagged KILN_STORAGE_PINNED (NULL with an
     error when refused), and the upload from it that does not wait: queued on the device's stream,
     the block is tracked until the copy has finished, so host_free may come at any time after. */
  void *(*host_alloc)(int64_t nbytes);
  void (*host_free)(void *data, int64_t nbytes);
  int (*memcpy_from_host_async)(void *dst, const void *src, int64_t nbytes, int device_index);
  /* CUDA only: streams and events (kiln/cuda.h); a NULL stream is the device's default one. */
  int (*stream_new)(int device_index, void **out);
  int (*stream_free)(int device_index, void *stream);
  int (*set_stream)(int device_index, void *stream);
  void *(*current_stream)(int device_index);
  int (*stream_synchronize)(int device_index, void *stream);
  int (*stream_query)(int device_index, void *stream, int *done);
  int (*stream_wait_event)(int device_index, void *stream, void *event);
  int (*event_new)(int device_index, int timing, void **out);
  int (*event_free)(int device_index, void *event);
  int (*event_record)(int device_index, void *event, void *stream);
  int (*event_synchronize)(int device_index, void *event);
  int (*event_query)(int device_index, void *event, int *done);
  int (*event_elapsed)(int device_index, void *start, void *end, float *ms);
  int (*record_stream)(int device_index, void *data, void *stream);
  /* CUDA only: 1 when the backend was built with cuDNN (convolutions, and the cuDNN algorithm of
     the recurrent layers, KILN_RNN_CUDNN). */
  int has_cudnn;
  /* The kernel of every op of the elementwise families (unary, binary, ternary) that kernel[] leaves
     NULL, or NULL: a new elementwise op then needs no entry in the table (API version 3). */
  kiln_kernel elementwise;
};

/* The CUDA backend (cuda_loader.c). libkiln_cuda.so exports one entry, kiln_cuda_backend_open
   (type kiln_cuda_open_fn). It gets the host's API version and layout sizes (a mismatch is an
   error, not a crash), kiln_fail, which libkiln does not export, and the getter of the f32 matmul
   precision; it returns its table even when *device_count is 0 (err then says why), and non-zero
   with err set when it cannot serve this libkiln at all. */
struct kiln_cuda_host {
  int api_version;
  int op_count;                  /* KILN_OP_COUNT */
  int call_size, backend_size;   /* sizeof(struct kiln_call), sizeof(struct kiln_backend) */
  int (*fail)(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
  int (*float32_matmul_precision)(void);   /* KILN_MATMUL_*, read at each f32 GEMM (API version 2) */
};
typedef int (*kiln_cuda_open_fn)(int api_version, const struct kiln_cuda_host *host, const struct kiln_backend **out,
                                 int *device_count, char *err, size_t errlen);
/* Open the backend once per process (later calls return at once); fills dispatch.c's CUDA slot
   when a device is usable. */
void kiln_cuda_load(void);
/* The loader's result, for dispatch.c: the backend (NULL until a device is usable) and its devices. */
void kiln_dispatch_set_cuda(const struct kiln_backend *backend, int device_count);

/* The CPU backend: its kernels are those of the instruction-set level chosen when libkiln is loaded
   (cpu/backend.c, docs/cpu.md). */
extern struct kiln_backend kiln_cpu_backend;
/* The backend of a device, or NULL with an error that names op and the device. */
const struct kiln_backend *kiln_backend_for(struct kiln_device device, const char *op);
/* The CUDA backend for page-locked host memory, or NULL with "op: no CUDA device: <why>". */
const struct kiln_backend *kiln_pinned_backend(const char *op);
/* Run call on the device of its first tensor; "op: not implemented on cuda:0" when missing. */
int kiln_dispatch(struct kiln_device device, const struct kiln_call *call);

/* Memory accounting (memory.c). */
void kiln_memory_count_alloc(int device_type, int64_t nbytes);
void kiln_memory_count_free(int device_type, int64_t nbytes);

/* Tensors (tensor.c). */
/* Files (file.c): the kind of a file mode ("a directory", "a FIFO (named pipe)", ...), and a regular
   file opened for reading without blocking on anything else: the fd, or -1 with the error naming
   op, the path and what it is; *size gets the file's size when size is not NULL. */
const char *kiln_file_kind(unsigned mode);
int kiln_open_regular(const char *op, const char *path, int64_t *size);
/* The offset of the first byte of s[0..n) that is not valid UTF-8, or -1 (file.c). */
int64_t kiln_utf8_invalid_at(const unsigned char *s, int64_t n);

/* The address of one element of a live cpu tensor at a storage offset inside it; else NULL and the
   error naming op (tensor.c). */
char *kiln_element_at(const char *op, const struct kiln_tensor *t, int64_t storage_offset);

/* Device memory for the storages of core/tensor.c, given by dispatch: usable says (and sets the
   error naming op) whether a device's backend is there; the pinned host memory of the CUDA backend
   likewise. alloc returns NULL with the error set. */
struct kiln_device_memory {
  int (*usable)(struct kiln_device device, const char *op);
  void *(*alloc)(int64_t nbytes, struct kiln_device device);
  void (*free)(void *data, int64_t nbytes, struct kiln_device device);
  int (*host_usable)(const char *op);
  void *(*host_alloc)(int64_t nbytes);
  void (*host_free)(void *data, int64_t nbytes);
};
void kiln_storage_set_memory(const struct kiln_device_memory *memory);

/* Views for kernels, which record nothing and whose arguments the front end has checked
   (tensor.c): t itself, t broadcast to sizes (as kiln_expand), t's dims in the order perm. */
struct kiln_tensor *kiln_layout_alias(const struct kiln_tensor *t);
struct kiln_tensor *kiln_layout_expand(const struct kiln_tensor *t, int ndim, const int64_t *sizes);
struct kiln_tensor *kiln_layout_permute(const struct kiln_tensor *t, int ndim, const int *perm);
struct kiln_tensor *kiln_tensor_header(int ndim, const int64_t *sizes, const int64_t *strides, int64_t offset,
                                       int dtype, struct kiln_device device, struct kiln_storage *storage);
void kiln_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides);
/* A contiguous CPU tensor in page-locked memory (kiln_tensor_is_pinned); op names the caller in errors. */
struct kiln_tensor *kiln_tensor_empty_pinned(int ndim, const int64_t *sizes, int dtype, const char *op);
/* A contiguous CPU tensor over memory someone else owns (a mapped file): release(ctx) runs once,
   when the last view lets go or kiln_tensor_free() frees early. On failure (NULL) it never runs. */
struct kiln_tensor *kiln_tensor_external(int ndim, const int64_t *sizes, int dtype, void *data,
                                         void (*release)(void *ctx), void *ctx);
/* NULL with "op: argument k was freed" etc. when a tensor cannot be read. */
int kiln_check_live(const char *op, const struct kiln_tensor *t);
int kiln_check_same_device(const char *op, const struct kiln_tensor *a, const struct kiln_tensor *b);
int kiln_normalize_dim(const char *op, int dim, int ndim, int *out);
/* Broadcast the shapes of a and b into out (ndim in *out_ndim); error names both shapes. */
int kiln_broadcast_shapes(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb,
                          int *out_ndim, int64_t *out);
const char *kiln_sizes_string(int ndim, const int64_t *sizes);
static inline void *kiln_tensor_data(const struct kiln_tensor *t) {
  return (char *)t->storage->data + t->offset * kiln_dtype_size(t->dtype);
}
void kiln_tensor_bump_version(struct kiln_tensor *t);

/* The thread pool (parallel.c). fn(ctx, begin, end) covers [0, n) in chunks of at least grain;
   runs inline when n <= grain or the pool has one thread. */
typedef void (*kiln_range_fn)(void *ctx, int64_t begin, int64_t end);
void kiln_parallel_for(int64_t n, int64_t grain, kiln_range_fn fn, void *ctx);
int kiln_in_parallel_region(void);
/* Run fn(ctx, id, nteam) for id in [0, nteam) with every part on its own thread at the same time
   (the caller runs id 0), so that the parts may wait for each other at spinning barriers. nteam is
   the pool's thread count, or 1 (fn runs inline) inside a parallel region or when the pool is busy.
   kiln_parallel_team_size says which, as far as it can be known before the call. */
typedef void (*kiln_team_fn)(void *ctx, int id, int nteam);
void kiln_parallel_team(kiln_team_fn fn, void *ctx);
int kiln_parallel_team_size(void);

/* Element conversion between a dtype and double (dtype.c). */
double kiln_load_f64(const void *p, int dtype);
void kiln_store_f64(void *p, int dtype, double v);
/* Convert n contiguous elements. */
void kiln_convert(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n);

/* Autograd (autograd.c). Front ends call kiln_autograd_record after computing a fresh output;
   in-place front ends call kiln_autograd_check_inplace first. Nothing is recorded inside kernels. */
enum kiln_view_kind {
  KILN_VIEW_BASE = 1000,
  KILN_VIEW_RESHAPE = KILN_VIEW_BASE, KILN_VIEW_TRANSPOSE, KILN_VIEW_PERMUTE, KILN_VIEW_NARROW,
  KILN_VIEW_SELECT, KILN_VIEW_EXPAND, KILN_VIEW_ALIAS,
  KILN_GRAD_CLONE,    /* clone, contiguous, to_dtype, to_device: the grad goes back converted */
  KILN_GRAD_ADDMM_UNUSED,
  KILN_FUNCTION,        /* a custom function: its derivative runs above C (kiln_backward_step stops at it) */
  KILN_FUNCTION_OUTPUT, /* output ints[0] of the KILN_FUNCTION node its one edge leads to */
  KILN_VIEW_AS_STRIDED, /* a view given its base's history again after an in-place op (node->strided) */
  KILN_COPY_SLICES      /* an in-place op on a view, as its base sees it: edge 0 the base's history
                           before, edge 1 the written value's (node->strided: where the view lies) */
};
/* A view v taken from tensor t: v's base is t's base, or t (internal overlap aside); v follows its
   base's history when grad mode is on (autograd.c). Called by the views of ops/views.c. */
void kiln_view_set_base(struct kiln_tensor *v, const struct kiln_tensor *t);
int kiln_autograd_active(void);
int kiln_autograd_wanted(int n, const struct kiln_tensor *const *inputs);
/* t converted to dtype, a transposed matrix in its own layout (ops/views.c; autocast's casts and
   the grad of a cast). */
struct kiln_tensor *kiln_to_dtype_in_layout(const struct kiln_tensor *t, int dtype);
/* Autocast at an op's front end (ops/autocast.c): 0 when no input of op needs converting under
   the thread's autocast; else 1 with out[i] the converted inputs (new references, NULL for NULL),
   or -1 on an error. The front end then calls itself with them (nothing left to convert) and
   releases them with kiln_autocast_release. */
int kiln_autocast_inputs(int op, int n, const struct kiln_tensor *const *in, struct kiln_tensor **out);
void kiln_autocast_release(int n, struct kiln_tensor **t);

/* out = kind(inputs...); ints/scalars as the kernel call had them. */
int kiln_autograd_record(int kind, struct kiln_tensor *out, int n, const struct kiln_tensor *const *inputs,
                         const double *scalars, const int64_t *ints, int nints, const struct kiln_tensor *extra);
int kiln_autograd_record_call(const struct kiln_call *call, struct kiln_tensor *out);
/* Like kiln_autograd_record, with the tensors the derivative reads given explicitly (up to 4;
   they are kept detached, so the output may be among them). */
int kiln_autograd_record_saved(int kind, struct kiln_tensor *out, int n, const struct kiln_tensor *const *inputs,
                               const double *scalars, const int64_t *ints, int nints,
                               const struct kiln_tensor *const *saved, int nsaved);

/* A recorded op: what its derivative needs. */
struct edge {
  struct kiln_node *node;      /* the node that made this input, or NULL */
  struct kiln_tensor *leaf;    /* the input itself when it is a leaf that requires grad */
  int needs;                   /* this input requires grad */
  int ndim, dtype;
  int64_t sizes[KILN_MAX_DIMS];
  struct kiln_device device;
};

enum { MAX_SAVED = 8 };

/* Where a view lies in its base's storage: its sizes and strides and its offset from the base's,
   and the base's own sizes and strides (a gradient buffer laid out like the base holds the view
   at the same places). */
struct kiln_strided {
  int ndim, base_ndim;
  int64_t sizes[KILN_MAX_DIMS], strides[KILN_MAX_DIMS], offset;
  int64_t base_sizes[KILN_MAX_DIMS], base_strides[KILN_MAX_DIMS];
};

struct kiln_node {
  int32_t refcount;
  int kind;
  int nin;
  struct edge *in;
  struct kiln_tensor *saved[MAX_SAVED];   /* detached aliases: inputs, output, indices */
  int64_t saved_version[MAX_SAVED];
  double scalar[4];
  int64_t ints[KILN_MAX_DIMS + 4];
  int nints;
  int out_ndim;
  int64_t out_sizes[KILN_MAX_DIMS];
  int released;
  int explicit_saved;          /* saved[] holds what the front end chose (kiln_autograd_record_saved) */
  /* backward walk state */
  int pending;
  int visited;
  struct kiln_tensor *grad;
  /* KILN_FUNCTION only: the caller's id, the name of its grad_fn, and one grad per output */
  int64_t function_id;
  char *function_name;
  int nout;
  struct kiln_tensor **out_grads;
  /* KILN_VIEW_AS_STRIDED and KILN_COPY_SLICES only */
  struct kiln_strided *strided;
};


int kiln_autograd_check_inplace(const char *op, const struct kiln_tensor *target, const struct kiln_tensor *src);
void kiln_node_release(void *node);
/* Listeners of backward (autograd.c), for the gradient reducer of data parallelism (dist/): during
   a backward, leaf_ready(ctx, leaf) when a leaf's grad is final (no edge left to add into it), and
   done(ctx, rc) at the end, whose non-zero status the backward returns. At most 16 at once. */
struct kiln_backward_hooks {
  void (*leaf_ready)(void *ctx, struct kiln_tensor *leaf);
  int (*done)(void *ctx, int rc);
  void *ctx;
};
int kiln_backward_hooks_add(const struct kiln_backward_hooks *hooks);
void kiln_backward_hooks_remove(void *ctx);

/* Set by autograd (before its first node): how kiln_tensor_release lets go of a grad_fn. */
void kiln_tensor_set_grad_fn_release(void (*release)(void *node));
void kiln_kernel_enter(void);
void kiln_kernel_leave(void);

/* Philox 4x32-10 (core/philox.h; cpu/backend.c): block ctr under key; every random draw of kiln comes from it. */
void kiln_philox(uint64_t ctr, uint64_t key, uint32_t out[4]);

/* A strided copy with conversion and broadcasting of src to dst's shape, on the CPU, without
   dispatch or autograd: the kernel of the level chosen at load (cpu/backend.c). */
int kiln_cpu_copy(struct kiln_tensor *dst, const struct kiln_tensor *src);

#ifdef __cplusplus
}
#endif
#endif
