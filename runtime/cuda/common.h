/* cuda/common.h: what the CUDA backend's files share: the host services libkiln passed in, the
   per-device state (stream, allocator, cuBLAS, cuDNN), error helpers, and the kernels of the table.
   Included from C (backend.c) and from CUDA C++ (the .cu files). */
#ifndef KILN_CUDA_COMMON_H
#define KILN_CUDA_COMMON_H
#include "internal.h"
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* kiln_fail of the libkiln that opened us (libkiln does not export it). */
extern const struct kiln_cuda_host *cuda_host;
#define cuda_fail(...) (cuda_host->fail(__VA_ARGS__))

/* KILN_SYNC=1: every launch is followed by cudaDeviceSynchronize and an error check, so a fault
   is reported at the op that caused it. */
extern int cuda_sync_launches;

struct cuda_stream_state;

struct cuda_device {
  int index;
  int ready;
  int sm_count;
  cudaStream_t stream;                       /* the current stream: every kernel, copy, cuBLAS and cuDNN call */
  cudaStream_t default_stream;               /* made with the device's state (streams.c switches dev->stream) */
  struct cuda_stream_state *streams;         /* streams.c: per stream, its workspaces while it is not current */
  int nstreams, streams_cap;
  struct kiln_caching_allocator *allocator;
  void *blas;                                /* cublasHandle_t, made at the first GEMM */
  void *blas_lt;                             /* cublasLtHandle_t, made with blas */
  void *blas_workspace;                      /* the current stream's (KILN_CUBLAS_WORKSPACE_BYTES): cuBLAS and cuBLASLt
                                                share it, as every product on a stream runs after the one before */
  void *dnn;                                 /* cudnnHandle_t, made at the first convolution */
  void *dnn_workspace;                       /* the current stream's cuDNN workspace, grown to the largest request */
  size_t dnn_workspace_bytes;
  void *dnn_rnn;                             /* cudnnHandle_t of the recurrent layers (rnn_cudnn.cu) */
};

/* cuBLAS's workspace per stream: what it asks for on Hopper. */
#define KILN_CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

/* Streams and events (streams.c): the table's entries, and the caching allocator's events. */
int cuda_stream_new(int device_index, void **out);
int cuda_stream_free(int device_index, void *stream);
int cuda_set_stream(int device_index, void *stream);
void *cuda_current_stream(int device_index);
int cuda_stream_synchronize(int device_index, void *stream);
int cuda_stream_query(int device_index, void *stream, int *done);
int cuda_stream_wait_event(int device_index, void *stream, void *event);
int cuda_event_new(int device_index, int timing, void **out);
int cuda_event_free(int device_index, void *event);
int cuda_event_record(int device_index, void *event, void *stream);
int cuda_event_synchronize(int device_index, void *event);
int cuda_event_query(int device_index, void *event, int *done);
int cuda_event_elapsed(int device_index, void *start, void *end, float *ms);
int cuda_record_stream(int device_index, void *data, void *stream);
void *cuda_alloc_event_record(void *ctx, uintptr_t stream);
int cuda_alloc_event_done(void *ctx, void *event);
void cuda_alloc_event_wait(void *ctx, void *event);

/* Make device current on this thread and return its state (streams made on first use), or NULL
   with an error naming op. */
struct cuda_device *cuda_device_enter(int index, const char *op);

/* A CUDA error as a kiln error: "op: call: message (cudaErrorName)"; KILN_OK for cudaSuccess. */
int cuda_check(cudaError_t e, const char *op, const char *call);
/* After a launch: the launch error, and with KILN_SYNC=1 the kernel's own. */
int cuda_launched(const char *op, const char *kernel);

/* Device tensors the kernels work on (copy.cu). A contiguous tensor holding t converted to dtype
   (t itself, retained, when it is one already), or NULL with an error naming op. */
struct kiln_tensor *cuda_contiguous_as(const struct kiln_tensor *t, int dtype, const char *op);
/* Scratch memory: a u8 tensor of nbytes on device. Release it once the kernels that use it are
   queued: the caching allocator reuses blocks in stream order. */
struct kiln_tensor *cuda_scratch(int64_t nbytes, struct kiln_device device);
/* Host memory to the device on dev's current stream, read before the call returns: through a
   pageable copy of src, since src may be pinned (a loader's batch), and a copy from pinned memory
   reads it only when the stream gets there, after its block may have been handed out again. */
int cuda_upload(struct cuda_device *dev, void *dst, const void *src, size_t bytes, const char *op, const char *what);

/* The device's cuBLAS handle (a cublasHandle_t, made at its first use, on dev->stream), for
   products outside KILN_OP_GEMM. */
int cuda_blas_handle(struct cuda_device *dev, void **handle);

/* The kernels (one per op family; call->op says which op). */
int cuda_copy(const struct kiln_call *c);
int cuda_fill(const struct kiln_call *c);
int cuda_elementwise(const struct kiln_call *c);   /* unary, binary, where, clamp */
int cuda_unary(const struct kiln_call *c, struct cuda_device *dev);
int cuda_binary(const struct kiln_call *c, struct cuda_device *dev);
int cuda_ternary(const struct kiln_call *c, struct cuda_device *dev);   /* where, clamp */
int cuda_random(const struct kiln_call *c);
int cuda_gemm(const struct kiln_call *c);
int cuda_reduce(const struct kiln_call *c);        /* sum ... logsumexp */
int cuda_cat(const struct kiln_call *c);
int cuda_index_select(const struct kiln_call *c);
int cuda_gather(const struct kiln_call *c);
int cuda_scatter_add(const struct kiln_call *c);
int cuda_masked_fill(const struct kiln_call *c);
int cuda_masked_select(const struct kiln_call *c);
int cuda_softmax(const struct kiln_call *c);            /* softmax, log_softmax */
int cuda_softmax_backward(const struct kiln_call *c);
int cuda_nll_loss(const struct kiln_call *c);
int cuda_nll_loss_backward(const struct kiln_call *c);
int cuda_dropout(const struct kiln_call *c);
int cuda_pool2d(const struct kiln_call *c);             /* max_pool2d, avg_pool2d */
int cuda_pool2d_backward(const struct kiln_call *c);
int cuda_batch_norm(const struct kiln_call *c);
int cuda_batch_norm_backward(const struct kiln_call *c);
int cuda_row_norm(const struct kiln_call *c);            /* layer_norm, group_norm */
int cuda_row_norm_backward(const struct kiln_call *c);
int cuda_rnn(const struct kiln_call *c);                 /* one recurrent layer (rnn.cu) */
int cuda_rnn_backward(const struct kiln_call *c);
int cuda_ctc_loss(const struct kiln_call *c);            /* ctc.cu */
int cuda_ctc_loss_backward(const struct kiln_call *c);
int cuda_scan(const struct kiln_call *c);               /* cumsum, cumprod (scan.cu) */
int cuda_cumprod_backward(const struct kiln_call *c);
int cuda_argsort(const struct kiln_call *c);
int cuda_optim_step(const struct kiln_call *c);         /* sgd, adam, rmsprop, adagrad */
int cuda_conv2d(const struct kiln_call *c);             /* cuDNN; built when CMake finds it (KILN_HAVE_CUDNN) */
int cuda_conv2d_backward(const struct kiln_call *c);
/* Built with cuDNN only (KILN_HAVE_CUDNN): one recurrent layer through cuDNN's RNN API
   (rnn_cudnn.cu), which cuda_rnn and cuda_rnn_backward call for the algorithm KILN_RNN_CUDNN. */
int cuda_rnn_cudnn(const struct kiln_call *c);
int cuda_rnn_cudnn_backward(const struct kiln_call *c);

#ifdef __cplusplus
}
#endif
#endif
