/* cuda/backend.c: the CUDA backend table and libkiln_cuda's one entry, kiln_cuda_backend_open;
   the per-device state (streams, caching allocator, cuBLAS, cuDNN), page-locked host memory, memory moves
   between host and device, synchronisation, and turning CUDA errors into kiln errors. C, for the table's designated
   initializers: every op has a kernel or an explicit NULL ("not implemented on cuda:0"). */
#include "common.h"
#include "allocator.h"
#include "pinned.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct kiln_cuda_host *cuda_host;
int cuda_sync_launches;
static int poison_allocations;   /* KILN_CUDA_POISON=1: fresh blocks are filled with 0xff bytes (NaN, -1) */

static struct cuda_device *devices;
static int ndevices;
static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int current_device = -1;   /* what this thread last made current */

/* ---- errors ---- */

/* Errors a kernel leaves behind, reported by whichever call comes next. */
static int from_a_kernel(cudaError_t e) {
  return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure || e == cudaErrorMisalignedAddress ||
         e == cudaErrorIllegalInstruction || e == cudaErrorAssert || e == cudaErrorHardwareStackError ||
         e == cudaErrorInvalidPc || e == cudaErrorLaunchTimeout || e == cudaErrorInvalidAddressSpace;
}

int cuda_check(cudaError_t e, const char *op, const char *call) {
  if (e == cudaSuccess) return KILN_OK;
  cudaGetLastError();   /* clear a non-sticky error so the next call starts clean */
  return cuda_fail(e == cudaErrorMemoryAllocation ? KILN_ERR_MEMORY : KILN_ERR_DEVICE, "%s: %s: %s (%s)%s", op, call,
                   cudaGetErrorString(e), cudaGetErrorName(e),
                   !cuda_sync_launches && from_a_kernel(e)
                     ? "; an earlier kernel may have caused it: run with KILN_SYNC=1 to find which" : "");
}

int cuda_launched(const char *op, const char *kernel) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_check(e, op, kernel);
  if (cuda_sync_launches) {
    e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      char call[128];
      snprintf(call, sizeof call, "%s (KILN_SYNC=1: cudaDeviceSynchronize after it)", kernel);
      return cuda_check(e, op, call);
    }
  }
  return KILN_OK;
}

/* ---- devices ---- */

static int raw_alloc(void *ctx, int64_t nbytes, void **out, char *err, size_t errlen) {
  struct cuda_device *dev = ctx;
  cudaError_t e = cudaMalloc(out, (size_t)nbytes);
  if (e == cudaSuccess) return 0;
  cudaGetLastError();
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  cudaGetLastError();
  snprintf(err, errlen, "cudaMalloc: %s; cuda:%d has %.2f GiB free of %.2f GiB", cudaGetErrorString(e), dev->index,
           (double)free_b / (double)(1 << 30), (double)total_b / (double)(1 << 30));
  return (int)e;
}

static void raw_free(void *ctx, void *ptr, int64_t nbytes) {
  (void)ctx; (void)nbytes;
  cudaFree(ptr);   /* waits for the device: the block's last users have finished */
  cudaGetLastError();
}

struct cuda_device *cuda_device_enter(int index, const char *op) {
  if (index < 0 || index >= ndevices) {
    cuda_fail(KILN_ERR_DEVICE, "%s: no CUDA device cuda:%d (%d devices)", op, index, ndevices);
    return NULL;
  }
  if (current_device != index) {
    if (cuda_check(cudaSetDevice(index), op, "cudaSetDevice")) return NULL;
    current_device = index;
  }
  struct cuda_device *dev = &devices[index];
  if (__atomic_load_n(&dev->ready, __ATOMIC_ACQUIRE)) return dev;
  /* First use of the device: its stream and allocator (its context starts here, not at load). */
  pthread_mutex_lock(&devices_lock);
  int rc = KILN_OK;
  if (!dev->ready) {
    cudaStream_t stream = NULL;
    int sms = 0;
    rc = cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), op, "cudaStreamCreateWithFlags");
    if (!rc) rc = cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index), op, "cudaDeviceGetAttribute");
    struct kiln_caching_allocator *a = NULL;
    if (!rc) {
      a = kiln_caching_new(index, (struct kiln_alloc_backing){dev, raw_alloc, raw_free, cuda_alloc_event_record,
                                                               cuda_alloc_event_done, cuda_alloc_event_wait});
      if (!a) rc = cuda_fail(KILN_ERR_MEMORY, "%s: out of host memory for cuda:%d's allocator", op, index);
    }
    if (rc) {
      if (stream) cudaStreamDestroy(stream);
    } else {
      dev->stream = dev->default_stream = stream;
      dev->sm_count = sms;
      dev->allocator = a;
      __atomic_store_n(&dev->ready, 1, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&devices_lock);
  return rc ? NULL : dev;
}

/* ---- memory ---- */

static void *cuda_alloc(int64_t nbytes, int device_index) {
  struct cuda_device *dev = cuda_device_enter(device_index, "alloc");
  if (!dev) return NULL;
  void *p = NULL;
  char err[512];
  if (kiln_caching_alloc(dev->allocator, (uintptr_t)dev->stream, nbytes, &p, err, sizeof err)) {
    cuda_fail(KILN_ERR_MEMORY, "%s", err);
    return NULL;
  }
  if (poison_allocations && nbytes > 0 && cuda_check(cudaMemsetAsync(p, 0xff, (size_t)nbytes, dev->stream), "alloc", "cudaMemsetAsync (poison)")) {
    kiln_caching_free(dev->allocator, p);
    return NULL;
  }
  return p;
}

static void cuda_free(void *data, int64_t nbytes, int device_index) {
  (void)nbytes;
  if (device_index >= 0 && device_index < ndevices && devices[device_index].allocator)
    kiln_caching_free(devices[device_index].allocator, data);   /* stream-ordered reuse: no sync needed */
}

static int cuda_memcpy_to_host(void *dst, const void *src, int64_t nbytes, int device_index) {
  struct cuda_device *dev = cuda_device_enter(device_index, "to");
  if (!dev) return kiln_error_code();
  int rc = cuda_check(cudaMemcpyAsync(dst, src, (size_t)nbytes, cudaMemcpyDeviceToHost, dev->stream), "to",
                      "cudaMemcpyAsync (device to host)");
  if (!rc) rc = cuda_check(cudaStreamSynchronize(dev->stream), "to", "cudaStreamSynchronize (after a copy to the host)");
  return rc;
}

static int cuda_memcpy_from_host(void *dst, const void *src, int64_t nbytes, int device_index) {
  struct cuda_device *dev = cuda_device_enter(device_index, "to");
  if (!dev) return kiln_error_code();
  int rc = cuda_check(cudaMemcpyAsync(dst, src, (size_t)nbytes, cudaMemcpyHostToDevice, dev->stream), "to",
                      "cudaMemcpyAsync (host to device)");
  /* src may be freed or changed as soon as we return. From pageable memory cudaMemcpyAsync returns
     once it has staged all of src (CUDA's "API synchronization behavior"), so the stream need not be
     waited for (the copy stays ordered before the kernels that read dst); from page-locked memory
     the DMA reads src later, so then we wait. */
  struct cudaPointerAttributes at;
  if (!rc && (cudaPointerGetAttributes(&at, src) != cudaSuccess || at.type != cudaMemoryTypeUnregistered)) {
    cudaGetLastError();   /* a failed query is not the copy's error */
    rc = cuda_check(cudaStreamSynchronize(dev->stream), "to", "cudaStreamSynchronize (after a copy from the host)");
  }
  return rc;
}

/* ---- pinned host memory ---- */

/* One cache for the process: cudaHostAllocPortable blocks serve every device. Each upload from a
   block records an event on the stream that reads it (see pinned.h). */
static struct kiln_pinned_cache *pinned;
static pthread_once_t pinned_once = PTHREAD_ONCE_INIT;

static int pinned_raw_alloc(void *ctx, int64_t nbytes, void **out, char *err, size_t errlen) {
  (void)ctx;
  /* cudaHostAlloc needs a context: the one of this thread's device, or cuda:0's */
  if (!cuda_device_enter(current_device >= 0 ? current_device : 0, "pin_memory")) {
    snprintf(err, errlen, "%s", kiln_error_message());
    return 1;
  }
  cudaError_t e = cudaHostAlloc(out, (size_t)nbytes, cudaHostAllocPortable);
  if (e == cudaSuccess) return 0;
  cudaGetLastError();
  snprintf(err, errlen, "cudaHostAlloc: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
  return (int)e;
}

static void pinned_raw_free(void *ctx, void *ptr, int64_t nbytes) {
  (void)ctx; (void)nbytes;
  cudaFreeHost(ptr);
  cudaGetLastError();
}

static int pinned_event_record(void *ctx, uintptr_t stream, void **event, char *err, size_t errlen) {
  (void)ctx;
  cudaEvent_t e = NULL;
  cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (r == cudaSuccess) {
    r = cudaEventRecord(e, (cudaStream_t)stream);
    if (r != cudaSuccess) cudaEventDestroy(e);
  }
  if (r != cudaSuccess) {
    cudaGetLastError();
    snprintf(err, errlen, "cudaEventRecord: %s (%s)", cudaGetErrorString(r), cudaGetErrorName(r));
    return KILN_ERR_DEVICE;
  }
  *event = e;
  return 0;
}

static int pinned_event_query(void *ctx, void *event) {
  (void)ctx;
  cudaError_t r = cudaEventQuery((cudaEvent_t)event);
  if (r == cudaSuccess) return 1;
  if (r == cudaErrorNotReady) return 0;
  cudaGetLastError();
  return -1;
}

static void pinned_event_wait(void *ctx, void *event) {
  (void)ctx;
  if (cudaEventSynchronize((cudaEvent_t)event) != cudaSuccess) cudaGetLastError();
}

static void pinned_event_release(void *ctx, void *event) {
  (void)ctx;
  cudaEventDestroy((cudaEvent_t)event);
}

static void pinned_init(void) {
  pinned = kiln_pinned_new((struct kiln_pinned_backing){NULL, pinned_raw_alloc, pinned_raw_free, pinned_event_record,
                                                        pinned_event_query, pinned_event_wait, pinned_event_release});
}

static void *cuda_host_alloc(int64_t nbytes) {
  pthread_once(&pinned_once, pinned_init);
  if (!pinned) {
    cuda_fail(KILN_ERR_MEMORY, "out of host memory for the pinned memory cache");
    return NULL;
  }
  void *p = NULL;
  char err[512];
  if (kiln_pinned_alloc(pinned, nbytes, &p, err, sizeof err)) {
    cuda_fail(KILN_ERR_MEMORY, "%s", err);
    return NULL;
  }
  return p;
}

static void cuda_host_free(void *data, int64_t nbytes) {
  (void)nbytes;
  if (pinned) kiln_pinned_free(pinned, data);   /* reused once the copies reading it have finished */
}

static int cuda_memcpy_from_host_async(void *dst, const void *src, int64_t nbytes, int device_index) {
  struct cuda_device *dev = cuda_device_enter(device_index, "to");
  if (!dev) return kiln_error_code();
  int rc = cuda_check(cudaMemcpyAsync(dst, src, (size_t)nbytes, cudaMemcpyHostToDevice, dev->stream), "to",
                      "cudaMemcpyAsync (pinned host to device)");
  if (rc) return rc;
  char err[256] = "";
  if (pinned && kiln_pinned_record(pinned, src, (uintptr_t)dev->stream, err, sizeof err) == 0) return KILN_OK;
  /* not a block of the cache, or no event: wait for the copy here instead */
  return cuda_check(cudaStreamSynchronize(dev->stream), "to", "cudaStreamSynchronize (after a copy from the host)");
}

static int cuda_synchronize(int device_index) {
  for (int d = device_index < 0 ? 0 : device_index; d < (device_index < 0 ? ndevices : device_index + 1); d++) {
    if (!__atomic_load_n(&devices[d].ready, __ATOMIC_ACQUIRE)) continue;   /* nothing ever ran there */
    if (!cuda_device_enter(d, "synchronize")) return kiln_error_code();
    /* every stream of the device */
    if (cuda_check(cudaDeviceSynchronize(), "synchronize", "cudaDeviceSynchronize")) return kiln_error_code();
  }
  return KILN_OK;
}

static int cuda_memory_stats(int device_index, struct kiln_cuda_memory *out) {
  memset(out, 0, sizeof *out);
  if (device_index < 0 || device_index >= ndevices)
    return cuda_fail(KILN_ERR_DEVICE, "memory_stats: no CUDA device cuda:%d (%d devices)", device_index, ndevices);
  if (__atomic_load_n(&devices[device_index].ready, __ATOMIC_ACQUIRE)) kiln_caching_stats(devices[device_index].allocator, out);
  if (pinned) {
    struct kiln_pinned_stats ps;
    kiln_pinned_stats(pinned, &ps);
    out->pinned_allocated = ps.allocated;
    out->pinned_reserved = ps.reserved;
  }
  return KILN_OK;
}

static int cuda_empty_cache(void) {
  for (int d = 0; d < ndevices; d++) {
    if (!__atomic_load_n(&devices[d].ready, __ATOMIC_ACQUIRE)) continue;
    if (!cuda_device_enter(d, "empty_cache")) return kiln_error_code();
    kiln_caching_empty(devices[d].allocator);
  }
  if (pinned) kiln_pinned_empty(pinned);   /* waits for the copies still reading the blocks it frees */
  return KILN_OK;
}

/* ---- the table ---- */

/* An op without an entry here is "not implemented on cuda:N" (docs/ops.md shows which). */

#define EW(op) [op] = cuda_elementwise
static const struct kiln_backend cuda_backend = {
  .name = "cuda",
  .alloc = cuda_alloc,
  .free = cuda_free,
  .memcpy_to_host = cuda_memcpy_to_host,
  .memcpy_from_host = cuda_memcpy_from_host,
  .synchronize = cuda_synchronize,
  .memory_stats = cuda_memory_stats,
  .empty_cache = cuda_empty_cache,
  .host_alloc = cuda_host_alloc,
  .host_free = cuda_host_free,
  .memcpy_from_host_async = cuda_memcpy_from_host_async,
  .stream_new = cuda_stream_new,
  .stream_free = cuda_stream_free,
  .set_stream = cuda_set_stream,
  .current_stream = cuda_current_stream,
  .stream_synchronize = cuda_stream_synchronize,
  .stream_query = cuda_stream_query,
  .stream_wait_event = cuda_stream_wait_event,
  .event_new = cuda_event_new,
  .event_free = cuda_event_free,
  .event_record = cuda_event_record,
  .event_synchronize = cuda_event_synchronize,
  .event_query = cuda_event_query,
  .event_elapsed = cuda_event_elapsed,
  .record_stream = cuda_record_stream,
#ifdef KILN_HAVE_CUDNN
  .has_cudnn = 1,
#endif
  .kernel = {
    [KILN_OP_COPY] = cuda_copy, [KILN_OP_FILL] = cuda_fill,
    EW(KILN_OP_NEG), EW(KILN_OP_ABS), EW(KILN_OP_SIGN), EW(KILN_OP_SQRT), EW(KILN_OP_RSQRT), EW(KILN_OP_EXP),
    EW(KILN_OP_LOG), EW(KILN_OP_LOG1P), EW(KILN_OP_EXPM1), EW(KILN_OP_SIN), EW(KILN_OP_COS), EW(KILN_OP_TANH),
    EW(KILN_OP_SIGMOID), EW(KILN_OP_RELU), EW(KILN_OP_FLOOR), EW(KILN_OP_CEIL), EW(KILN_OP_ROUND),
    EW(KILN_OP_TRUNC), EW(KILN_OP_RECIPROCAL), EW(KILN_OP_SQUARE), EW(KILN_OP_ERF), EW(KILN_OP_LOGICAL_NOT),
    EW(KILN_OP_ADD), EW(KILN_OP_SUB), EW(KILN_OP_MUL), EW(KILN_OP_DIV), EW(KILN_OP_POW), EW(KILN_OP_MAXIMUM),
    EW(KILN_OP_MINIMUM), EW(KILN_OP_REMAINDER), EW(KILN_OP_EQ), EW(KILN_OP_NE), EW(KILN_OP_LT), EW(KILN_OP_LE),
    EW(KILN_OP_GT), EW(KILN_OP_GE), EW(KILN_OP_LOGICAL_AND), EW(KILN_OP_LOGICAL_OR), EW(KILN_OP_WHERE),
    EW(KILN_OP_CLAMP), EW(KILN_OP_ERFINV), EW(KILN_OP_ATAN2), EW(KILN_OP_RELU_BACKWARD),
    [KILN_OP_ARGSORT] = cuda_argsort, [KILN_OP_CUMSUM] = cuda_scan, [KILN_OP_CUMPROD] = cuda_scan,
    [KILN_OP_CUMPROD_BACKWARD] = cuda_cumprod_backward,
    [KILN_OP_SUM] = cuda_reduce, [KILN_OP_MEAN] = cuda_reduce, [KILN_OP_PROD] = cuda_reduce,
    [KILN_OP_MAX] = cuda_reduce, [KILN_OP_MIN] = cuda_reduce, [KILN_OP_ARGMAX] = cuda_reduce,
    [KILN_OP_ARGMIN] = cuda_reduce, [KILN_OP_VAR] = cuda_reduce, [KILN_OP_STD] = cuda_reduce,
    [KILN_OP_NORM] = cuda_reduce, [KILN_OP_LOGSUMEXP] = cuda_reduce,
    [KILN_OP_GEMM] = cuda_gemm,
    [KILN_OP_CAT] = cuda_cat, [KILN_OP_INDEX_SELECT] = cuda_index_select, [KILN_OP_GATHER] = cuda_gather,
    [KILN_OP_SCATTER_ADD] = cuda_scatter_add, [KILN_OP_MASKED_FILL] = cuda_masked_fill,
    [KILN_OP_MASKED_SELECT] = cuda_masked_select,
    [KILN_OP_UNIFORM] = cuda_random, [KILN_OP_NORMAL] = cuda_random, [KILN_OP_RANDINT] = cuda_random,
    /* nn ops: convolution through cuDNN 9 (NULL when the build found no cuDNN); pooling and
       normalisation are our own kernels */
#ifdef KILN_HAVE_CUDNN
    [KILN_OP_CONV2D] = cuda_conv2d, [KILN_OP_CONV2D_BACKWARD] = cuda_conv2d_backward,
#else
    [KILN_OP_CONV2D] = NULL, [KILN_OP_CONV2D_BACKWARD] = NULL,
#endif
    [KILN_OP_MAX_POOL2D] = cuda_pool2d, [KILN_OP_MAX_POOL2D_BACKWARD] = cuda_pool2d_backward,
    [KILN_OP_AVG_POOL2D] = cuda_pool2d, [KILN_OP_AVG_POOL2D_BACKWARD] = cuda_pool2d_backward,
    [KILN_OP_BATCH_NORM] = cuda_batch_norm, [KILN_OP_BATCH_NORM_BACKWARD] = cuda_batch_norm_backward,
    [KILN_OP_LAYER_NORM] = cuda_row_norm, [KILN_OP_LAYER_NORM_BACKWARD] = cuda_row_norm_backward,
    [KILN_OP_GROUP_NORM] = cuda_row_norm, [KILN_OP_GROUP_NORM_BACKWARD] = cuda_row_norm_backward,
    [KILN_OP_SOFTMAX] = cuda_softmax, [KILN_OP_SOFTMAX_BACKWARD] = cuda_softmax_backward,
    [KILN_OP_LOG_SOFTMAX] = cuda_softmax, [KILN_OP_LOG_SOFTMAX_BACKWARD] = cuda_softmax_backward,
    [KILN_OP_NLL_LOSS] = cuda_nll_loss, [KILN_OP_NLL_LOSS_BACKWARD] = cuda_nll_loss_backward,
    [KILN_OP_DROPOUT] = cuda_dropout,
    [KILN_OP_SGD_STEP] = cuda_optim_step, [KILN_OP_ADAM_STEP] = cuda_optim_step,
    [KILN_OP_RMSPROP_STEP] = cuda_optim_step, [KILN_OP_ADAGRAD_STEP] = cuda_optim_step,
    /* recurrent layers (rnn.cu); CTC (ctc.cu) */
    [KILN_OP_RNN] = cuda_rnn, [KILN_OP_RNN_BACKWARD] = cuda_rnn_backward,
    [KILN_OP_CTC_LOSS] = cuda_ctc_loss, [KILN_OP_CTC_LOSS_BACKWARD] = cuda_ctc_loss_backward,
  },
};

/* ---- the entry ---- */

static int env_flag(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

KILN_API int kiln_cuda_backend_open(int api_version, const struct kiln_cuda_host *host, const struct kiln_backend **out,
                                    int *device_count, char *err, size_t errlen) {
  *out = NULL;
  *device_count = 0;
  if (api_version != KILN_API_VERSION) {
    snprintf(err, errlen, "libkiln_cuda.so speaks kiln API %d, libkiln %d: build them from the same sources",
             KILN_API_VERSION, api_version);
    return KILN_ERR_UNSUPPORTED;
  }
  if (!host || host->op_count != KILN_OP_COUNT || host->call_size != (int)sizeof(struct kiln_call) ||
      host->backend_size != (int)sizeof(struct kiln_backend) || !host->fail ||
      !host->float32_matmul_precision) {
    snprintf(err, errlen,
             "libkiln_cuda.so was built from other sources than libkiln (ops %d vs %d, call %d vs %d bytes, table %d vs "
             "%d bytes): rebuild both",
             KILN_OP_COUNT, host ? host->op_count : -1, (int)sizeof(struct kiln_call), host ? host->call_size : -1,
             (int)sizeof(struct kiln_backend), host ? host->backend_size : -1);
    return KILN_ERR_UNSUPPORTED;
  }
  cuda_host = host;
  cuda_sync_launches = env_flag("KILN_SYNC");
  poison_allocations = env_flag("KILN_CUDA_POISON");
  *out = &cuda_backend;   /* the table, for coverage questions, even without a device */
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    int driver = 0;
    cudaDriverGetVersion(&driver);
    snprintf(err, errlen, "%s (cudaGetDeviceCount: %s)%s", cudaGetErrorString(e), cudaGetErrorName(e),
             driver == 0 ? "; no NVIDIA driver is loaded on this machine" : "");
    return KILN_OK;
  }
  if (n <= 0) {
    snprintf(err, errlen, "the driver reports no CUDA device");
    return KILN_OK;
  }
  devices = calloc((size_t)n, sizeof *devices);
  if (!devices) {
    snprintf(err, errlen, "out of host memory for %d devices' state", n);
    return KILN_OK;
  }
  for (int d = 0; d < n; d++) devices[d].index = d;
  ndevices = n;
  *device_count = n;
  return KILN_OK;
}
