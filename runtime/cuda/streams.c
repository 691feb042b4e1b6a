/* cuda/streams.c: streams and events. Each device has a default stream (made with the device's
   state) and a current stream, dev->stream, which every kernel, copy, cuBLAS and cuDNN call and
   the caching allocator's pools follow; kiln.cuda.Stream makes more, and set_stream switches. The
   current stream is per device, for the whole process (kiln's Lua runs on one thread).
   Workspaces are per stream: cuBLAS's and cuDNN's scratch memory must not be shared by work that
   may run at the same time, so switching streams also switches them (dev->blas_workspace,
   dev->dnn_workspace mirror the current stream's) and rebinds the handles. Events back
   t:record_stream: the allocator keeps a block used on other streams until their work is done. */
#include "common.h"
#include "allocator.h"
#include <cublas_v2.h>
#ifdef KILN_HAVE_CUDNN
#include <cudnn.h>
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct cuda_stream_state {
  cudaStream_t stream;
  void *blas_workspace;
  void *dnn_workspace;
  size_t dnn_workspace_bytes;
};

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;

/* The device's stream states; [0] is the default stream. Lock held. */
static struct cuda_stream_state *state_of(struct cuda_device *dev, cudaStream_t s) {
  for (int i = 0; i < dev->nstreams; i++)
    if (dev->streams[i].stream == s) return &dev->streams[i];
  return NULL;
}

static int add_state(struct cuda_device *dev, cudaStream_t s) {
  if (dev->nstreams == dev->streams_cap) {
    int cap = dev->streams_cap ? 2 * dev->streams_cap : 4;
    struct cuda_stream_state *v = realloc(dev->streams, sizeof *v * (size_t)cap);
    if (!v) return -1;
    dev->streams = v;
    dev->streams_cap = cap;
  }
  memset(&dev->streams[dev->nstreams], 0, sizeof dev->streams[0]);
  dev->streams[dev->nstreams++].stream = s;
  return 0;
}

/* The device with its default stream listed (done once). Lock held. */
static struct cuda_device *enter(int device_index, const char *op) {
  struct cuda_device *dev = cuda_device_enter(device_index, op);
  if (dev && dev->nstreams == 0 && add_state(dev, dev->default_stream)) {
    cuda_fail(KILN_ERR_MEMORY, "%s: out of host memory", op);
    return NULL;
  }
  return dev;
}

static cudaStream_t stream_or_default(struct cuda_device *dev, void *stream) {
  return stream ? (cudaStream_t)stream : dev->default_stream;
}

static int not_ours(const char *op, struct cuda_device *dev, void *stream) {
  return cuda_fail(KILN_ERR_ARGUMENT, "%s: %p is not a stream of cuda:%d (freed, or made for another device)", op, stream,
                   dev->index);
}

int cuda_stream_new(int device_index, void **out) {
  *out = NULL;
  pthread_mutex_lock(&streams_lock);
  struct cuda_device *dev = enter(device_index, "Stream");
  int rc = dev ? KILN_OK : kiln_error_code();
  cudaStream_t s = NULL;
  if (!rc) rc = cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "Stream", "cudaStreamCreateWithFlags");
  if (!rc && add_state(dev, s)) {
    cudaStreamDestroy(s);
    rc = cuda_fail(KILN_ERR_MEMORY, "Stream: out of host memory");
  }
  if (!rc) *out = s;
  pthread_mutex_unlock(&streams_lock);
  return rc;
}

int cuda_stream_free(int device_index, void *stream) {
  pthread_mutex_lock(&streams_lock);
  struct cuda_device *dev = enter(device_index, "Stream:free");
  int rc = dev ? KILN_OK : kiln_error_code();
  struct cuda_stream_state *st = rc || !stream ? NULL : state_of(dev, (cudaStream_t)stream);
  if (!rc && (!stream || (cudaStream_t)stream == dev->default_stream))
    rc = cuda_fail(KILN_ERR_STATE, "Stream:free: the default stream of cuda:%d is never freed", device_index);
  else if (!rc && !st)
    rc = not_ours("Stream:free", dev, stream);
  else if (!rc && st->stream == dev->stream)
    rc = cuda_fail(KILN_ERR_STATE, "Stream:free: the stream is cuda:%d's current stream; switch back first", device_index);
  if (!rc) {
    /* its work and its workspaces' users finish first; its cached blocks then serve anyone */
    rc = cuda_check(cudaStreamSynchronize(st->stream), "Stream:free", "cudaStreamSynchronize");
    /* blocks that noted it as a user (record_stream) need not wait for it, nor record on it, again */
    kiln_caching_forget_stream(dev->allocator, (uintptr_t)st->stream);
    if (st->blas_workspace) cudaFree(st->blas_workspace);
    if (st->dnn_workspace) kiln_caching_free(dev->allocator, st->dnn_workspace);   /* a block of the allocator (conv.cu) */
    cudaStreamDestroy(st->stream);
    cudaGetLastError();
    *st = dev->streams[--dev->nstreams];
  }
  pthread_mutex_unlock(&streams_lock);
  return rc;
}

/* Point the device's handles at its current stream and that stream's workspaces. Lock held. */
static int bind_handles(struct cuda_device *dev, const char *op) {
  int rc = KILN_OK;
  if (dev->blas) {
    if (!dev->blas_workspace)
      rc = cuda_check(cudaMalloc(&dev->blas_workspace, KILN_CUBLAS_WORKSPACE_BYTES), op, "cudaMalloc (cuBLAS workspace)");
    if (!rc && cublasSetStream((cublasHandle_t)dev->blas, dev->stream) != CUBLAS_STATUS_SUCCESS)
      rc = cuda_fail(KILN_ERR_DEVICE, "%s: cublasSetStream failed", op);
    if (!rc && cublasSetWorkspace((cublasHandle_t)dev->blas, dev->blas_workspace, KILN_CUBLAS_WORKSPACE_BYTES) !=
                 CUBLAS_STATUS_SUCCESS)
      rc = cuda_fail(KILN_ERR_DEVICE, "%s: cublasSetWorkspace failed", op);
  }
#ifdef KILN_HAVE_CUDNN
  void *dnn[2] = {dev->dnn, dev->dnn_rnn};   /* the convolutions' and the recurrent layers' handles */
  for (int i = 0; i < 2 && !rc; i++) {
    if (!dnn[i]) continue;
    cudnnStatus_t s = cudnnSetStream((cudnnHandle_t)dnn[i], dev->stream);
    if (s != CUDNN_STATUS_SUCCESS) rc = cuda_fail(KILN_ERR_DEVICE, "%s: cudnnSetStream: %s", op, cudnnGetErrorString(s));
  }
#endif
  return rc;
}

int cuda_set_stream(int device_index, void *stream) {
  pthread_mutex_lock(&streams_lock);
  struct cuda_device *dev = enter(device_index, "set_stream");
  int rc = dev ? KILN_OK : kiln_error_code();
  cudaStream_t s = rc ? NULL : stream_or_default(dev, stream);
  struct cuda_stream_state *to = rc ? NULL : state_of(dev, s), *from = rc ? NULL : state_of(dev, dev->stream);
  if (!rc && !to) rc = not_ours("set_stream", dev, stream);
  if (!rc && to != from) {
    from->blas_workspace = dev->blas_workspace;
    from->dnn_workspace = dev->dnn_workspace;
    from->dnn_workspace_bytes = dev->dnn_workspace_bytes;
    dev->stream = to->stream;
    dev->blas_workspace = to->blas_workspace;
    dev->dnn_workspace = to->dnn_workspace;
    dev->dnn_workspace_bytes = to->dnn_workspace_bytes;
    rc = bind_handles(dev, "set_stream");
    to->blas_workspace = dev->blas_workspace;
    if (rc) {
      /* Switch back: every kernel and copy follows dev->stream, so it must stay the stream the
         handles are bound to, with its workspace; the first failure is the status returned. */
      dev->stream = from->stream;
      dev->blas_workspace = from->blas_workspace;
      dev->dnn_workspace = from->dnn_workspace;
      dev->dnn_workspace_bytes = from->dnn_workspace_bytes;
      bind_handles(dev, "set_stream");
    }
  }
  pthread_mutex_unlock(&streams_lock);
  return rc;
}

void *cuda_current_stream(int device_index) {
  pthread_mutex_lock(&streams_lock);
  struct cuda_device *dev = enter(device_index, "current_stream");
  void *s = dev && dev->stream != dev->default_stream ? (void *)dev->stream : NULL;
  pthread_mutex_unlock(&streams_lock);
  return s;
}

/* The stream a call names (NULL: the default one), checked to be the device's. */
static int lookup(int device_index, void *stream, const char *op, struct cuda_device **dev, cudaStream_t *s) {
  pthread_mutex_lock(&streams_lock);
  int rc = KILN_OK;
  *dev = enter(device_index, op);
  if (!*dev) {
    rc = kiln_error_code();
  } else {
    *s = stream_or_default(*dev, stream);
    if (!state_of(*dev, *s)) rc = not_ours(op, *dev, stream);
  }
  pthread_mutex_unlock(&streams_lock);
  return rc;
}

int cuda_stream_synchronize(int device_index, void *stream) {
  struct cuda_device *dev;
  cudaStream_t s;
  int rc = lookup(device_index, stream, "Stream:synchronize", &dev, &s);
  if (!rc) rc = cuda_check(cudaStreamSynchronize(s), "Stream:synchronize", "cudaStreamSynchronize");
  return rc;
}

int cuda_stream_query(int device_index, void *stream, int *done) {
  struct cuda_device *dev;
  cudaStream_t s;
  *done = 0;
  int rc = lookup(device_index, stream, "Stream:query", &dev, &s);
  if (rc) return rc;
  cudaError_t e = cudaStreamQuery(s);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return KILN_OK;
  }
  rc = cuda_check(e, "Stream:query", "cudaStreamQuery");
  *done = rc == KILN_OK;
  return rc;
}

int cuda_stream_wait_event(int device_index, void *stream, void *event) {
  struct cuda_device *dev;
  cudaStream_t s;
  int rc = lookup(device_index, stream, "Stream:wait_event", &dev, &s);
  if (!rc) rc = cuda_check(cudaStreamWaitEvent(s, (cudaEvent_t)event, 0), "Stream:wait_event", "cudaStreamWaitEvent");
  return rc;
}

int cuda_event_new(int device_index, int timing, void **out) {
  *out = NULL;
  if (!cuda_device_enter(device_index, "Event")) return kiln_error_code();
  cudaEvent_t e = NULL;
  int rc = cuda_check(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming), "Event",
                      "cudaEventCreateWithFlags");
  if (!rc) *out = e;
  return rc;
}

int cuda_event_free(int device_index, void *event) {
  if (!cuda_device_enter(device_index, "Event:free")) return kiln_error_code();
  return cuda_check(cudaEventDestroy((cudaEvent_t)event), "Event:free", "cudaEventDestroy");
}

int cuda_event_record(int device_index, void *event, void *stream) {
  struct cuda_device *dev;
  cudaStream_t s;
  int rc = lookup(device_index, stream, "Event:record", &dev, &s);
  if (!rc) rc = cuda_check(cudaEventRecord((cudaEvent_t)event, s), "Event:record", "cudaEventRecord");
  return rc;
}

int cuda_event_synchronize(int device_index, void *event) {
  if (!cuda_device_enter(device_index, "Event:synchronize")) return kiln_error_code();
  return cuda_check(cudaEventSynchronize((cudaEvent_t)event), "Event:synchronize", "cudaEventSynchronize");
}

int cuda_event_query(int device_index, void *event, int *done) {
  *done = 0;
  if (!cuda_device_enter(device_index, "Event:query")) return kiln_error_code();
  cudaError_t e = cudaEventQuery((cudaEvent_t)event);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return KILN_OK;
  }
  int rc = cuda_check(e, "Event:query", "cudaEventQuery");
  *done = rc == KILN_OK;
  return rc;
}

int cuda_event_elapsed(int device_index, void *start, void *end, float *ms) {
  *ms = 0;
  if (!cuda_device_enter(device_index, "Event:elapsed_time")) return kiln_error_code();
  return cuda_check(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end), "Event:elapsed_time",
                    "cudaEventElapsedTime (both events recorded, made with enable_timing, the end one complete?)");
}

int cuda_record_stream(int device_index, void *data, void *stream) {
  struct cuda_device *dev;
  cudaStream_t s;
  int rc = lookup(device_index, stream, "record_stream", &dev, &s);
  if (rc) return rc;
  int r = kiln_caching_record_stream(dev->allocator, data, (uintptr_t)s);
  if (r == -1)
    return cuda_fail(KILN_ERR_ARGUMENT, "record_stream: the tensor's memory was not handed out by cuda:%d's allocator",
                     device_index);
  if (r) return cuda_fail(KILN_ERR_MEMORY, "record_stream: out of host memory");
  return KILN_OK;
}

/* ---- the allocator's events (struct kiln_alloc_backing) ---- */

void *cuda_alloc_event_record(void *ctx, uintptr_t stream) {
  (void)ctx;
  cudaEvent_t e = NULL;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess &&
      cudaEventRecord(e, (cudaStream_t)stream) == cudaSuccess)
    return e;
  /* no event: wait for the stream's work here instead, so the block is free to reuse at once */
  if (e) cudaEventDestroy(e);
  cudaStreamSynchronize((cudaStream_t)stream);
  cudaGetLastError();
  return NULL;
}

int cuda_alloc_event_done(void *ctx, void *event) {
  (void)ctx;
  cudaError_t e = cudaEventQuery((cudaEvent_t)event);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return 0;
  }
  /* done, or the device failed (then nothing will run again on it): either way, let go */
  cudaEventDestroy((cudaEvent_t)event);
  cudaGetLastError();
  return 1;
}

void cuda_alloc_event_wait(void *ctx, void *event) {
  (void)ctx;
  cudaEventSynchronize((cudaEvent_t)event);
  cudaEventDestroy((cudaEvent_t)event);
  cudaGetLastError();
}
