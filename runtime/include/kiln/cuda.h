/* kiln/cuda.h: CUDA devices as libkiln sees them: the CUDA backend (libkiln_cuda.so) is loaded on
   first use, and on a machine without a GPU every function here answers cleanly, never crashes. */
#ifndef KILN_CUDA_H
#define KILN_CUDA_H
#include <stdint.h>

/* The caching device allocator of one device. Bytes are counted in the allocator's rounded
   block sizes (multiples of 512). */
struct kiln_cuda_memory {
  int64_t allocated;        /* bytes in blocks that tensors hold now */
  int64_t reserved;         /* bytes taken from the driver (cudaMalloc) and not given back */
  int64_t peak_allocated;   /* highest allocated so far */
  int64_t peak_reserved;    /* highest reserved so far */
  int64_t requests;         /* allocations asked of the allocator */
  int64_t cache_hits;       /* allocations served from cached blocks, without cudaMalloc */
  int64_t device_allocs;    /* cudaMalloc calls */
  int64_t device_frees;     /* cudaFree calls (empty_cache, out-of-memory retries) */
  int64_t oom_retries;      /* failed cudaMallocs retried after giving the cache back */
  int64_t pinned_allocated; /* page-locked host bytes that pinned tensors hold (all devices share them) */
  int64_t pinned_reserved;  /* page-locked host bytes, held and cached */
};

/* Load the CUDA backend now (kiln also does it on the first use of a cuda device). Tried once
   per process: KILN_OK when at least one device is usable, else KILN_ERR_DEVICE and a message
   "no CUDA device: <why>". $KILN_CUDA_LIB names the library to load instead of the one next to
   libkiln. */
int kiln_cuda_init(void);
/* Devices usable now; 0 (and no error) when there is no GPU, driver or backend. */
int kiln_cuda_device_count(void);
int kiln_cuda_is_available(void);
/* 1 when libkiln_cuda.so was found and opened, with or without a device. */
int kiln_cuda_backend_loaded(void);
/* "no CUDA device: <why>" when no device is usable, NULL when one is. */
const char *kiln_cuda_unavailable_reason(void);
/* 1 when the CUDA backend has a kernel for op, whether or not a device is present (0 when the
   backend is absent); kiln_op_supported(op, KILN_CUDA) answers for a usable device. */
int kiln_cuda_op_supported(int op);
/* 1 when the CUDA backend was built with cuDNN 9 (whether or not a device is present). */
int kiln_cuda_has_cudnn(void);

/* Wait until the work queued on device (-1: every device) has finished, and report its errors. */
int kiln_cuda_synchronize(int device);
/* The allocator's statistics of device; all zero when no device is usable. */
int kiln_cuda_memory_stats(int device, struct kiln_cuda_memory *out);
/* Give the cached blocks no tensor holds back to the driver (every device), pinned host blocks too. */
int kiln_cuda_empty_cache(void);

/* Streams and events. Each device has a default stream and a current stream that every kernel,
   copy, cuBLAS and cuDNN call of that device goes to (the default one until set_stream), and the
   caching allocator keeps its free blocks per stream. Streams are opaque handles; NULL names the
   device's default stream. The current stream is the process's, not a thread's.
   kiln_cuda_stream_free waits for the stream's work and refuses the current stream. */
int kiln_cuda_stream_new(int device, void **out);
int kiln_cuda_stream_free(int device, void *stream);
int kiln_cuda_set_stream(int device, void *stream);
/* NULL when the default stream is current (or there is no device). */
void *kiln_cuda_current_stream(int device);
int kiln_cuda_stream_synchronize(int device, void *stream);
/* *done: 1 when all the work queued on the stream has finished. */
int kiln_cuda_stream_query(int device, void *stream, int *done);
/* Work queued on stream from now on waits for event's recorded work. */
int kiln_cuda_stream_wait_event(int device, void *stream, void *event);
/* Events mark a point in a stream's work; enable_timing allows elapsed_time. */
int kiln_cuda_event_new(int device, int enable_timing, void **out);
int kiln_cuda_event_free(int device, void *event);
int kiln_cuda_event_record(int device, void *event, void *stream);
int kiln_cuda_event_synchronize(int device, void *event);
int kiln_cuda_event_query(int device, void *event, int *done);
/* Milliseconds between two recorded timing events, the end one complete. */
int kiln_cuda_event_elapsed_time(int device, void *start, void *end, float *ms);
/* t's memory is also used by work queued on stream: when t's storage is freed, the caching
   allocator does not hand the block out again until that work has finished. */
struct kiln_tensor;
int kiln_tensor_record_stream(const struct kiln_tensor *t, void *stream);

#endif
