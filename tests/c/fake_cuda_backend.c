/* fake_cuda_backend.c: stand-ins for libkiln_cuda.so, loaded through $KILN_CUDA_LIB.
   Built as is (fake_kiln_cuda): a backend that speaks another API version, so that test_cuda_loader
   can check the loader refuses it with a clear message instead of crashing.
   Built with FAKE_CUDA_DEVICE (fake_kiln_cuda_device): one pretend device whose "device memory" is
   host memory (no kernels but a GEMM that records the matmul precision it is handed, then refuses:
   only allocation and copies), with the pinned host memory entries served by the real pinned cache
   (runtime/cuda/pinned.c) over malloc, streams and events as tokens, and counters of every call, so
   that test_pinned and tests/lua/fake_cuda_device.lua can check which paths the runtime took
   (fake_cuda_counters). */
#include <stdio.h>
#include <stddef.h>

#ifndef FAKE_CUDA_DEVICE

struct kiln_backend;
struct kiln_cuda_host;

__attribute__((visibility("default"))) int kiln_cuda_backend_open(int api_version, const struct kiln_cuda_host *host,
                                                                  const struct kiln_backend **out, int *device_count,
                                                                  char *err, size_t errlen) {
  (void)host;
  *out = NULL;
  *device_count = 0;
  snprintf(err, errlen, "libkiln_cuda.so speaks kiln API 999, libkiln %d: build them from the same sources", api_version);
  return 9;
}

#else

#include "internal.h"
#include "fake_cuda_backend.h"
#include "pinned.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static struct fake_cuda_counters counters;
static const struct kiln_cuda_host *host;
static struct kiln_pinned_cache *pinned;

#define COUNT(field) __atomic_add_fetch(&counters.field, 1, __ATOMIC_RELAXED)

__attribute__((visibility("default"))) struct fake_cuda_counters *fake_cuda_counters(void) { return &counters; }

/* $FAKE_CUDA_CAPACITY: device bytes the fake holds at most (0: no limit), to play out of memory */
static int64_t capacity, live;

static void *fake_alloc(int64_t nbytes, int device_index) {
  COUNT(device_allocs);
  if (capacity && __atomic_load_n(&live, __ATOMIC_RELAXED) + nbytes > capacity) {
    COUNT(device_ooms);
    host->fail(KILN_ERR_MEMORY, "out of memory: cannot allocate %lld bytes on cuda:%d: the fake device holds %lld of "
               "%lld bytes", (long long)nbytes, device_index, (long long)live, (long long)capacity);
    return NULL;
  }
  __atomic_add_fetch(&live, nbytes, __ATOMIC_RELAXED);
  void *p = malloc((size_t)(nbytes > 0 ? nbytes : 1));
  if (!p) host->fail(KILN_ERR_MEMORY, "out of memory: fake cuda:%d cannot allocate %lld bytes", device_index, (long long)nbytes);
  return p;
}

static void fake_free(void *data, int64_t nbytes, int device_index) {
  (void)device_index;
  COUNT(device_frees);
  __atomic_sub_fetch(&live, nbytes, __ATOMIC_RELAXED);
  free(data);
}

static int fake_to_host(void *dst, const void *src, int64_t nbytes, int device_index) {
  (void)device_index;
  COUNT(copies_to_host);
  memcpy(dst, src, (size_t)nbytes);
  return KILN_OK;
}

static int fake_from_host(void *dst, const void *src, int64_t nbytes, int device_index) {
  (void)device_index;
  COUNT(copies_from_host);
  memcpy(dst, src, (size_t)nbytes);
  return KILN_OK;
}

static int fake_from_host_async(void *dst, const void *src, int64_t nbytes, int device_index) {
  (void)device_index;
  COUNT(async_copies_from_host);
  memcpy(dst, src, (size_t)nbytes);
  char err[256];
  if (kiln_pinned_record(pinned, src, 1, err, sizeof err) != 0) COUNT(async_copies_untracked);
  return KILN_OK;
}

static int fake_synchronize(int device_index) {
  (void)device_index;
  COUNT(synchronizes);
  return KILN_OK;
}

static int fake_memory_stats(int device_index, struct kiln_cuda_memory *out) {
  (void)device_index;
  memset(out, 0, sizeof *out);
  out->allocated = out->reserved = __atomic_load_n(&live, __ATOMIC_RELAXED);
  struct kiln_pinned_stats ps;
  kiln_pinned_stats(pinned, &ps);
  out->pinned_allocated = ps.allocated;
  out->pinned_reserved = ps.reserved;
  return KILN_OK;
}

static int fake_empty_cache(void) {
  COUNT(empty_caches);
  kiln_pinned_empty(pinned);
  return KILN_OK;
}

/* the pinned cache over malloc; an event completes when it is first asked about (the copies are memcpy) */
static int raw_alloc(void *ctx, int64_t nbytes, void **out, char *err, size_t errlen) {
  (void)ctx;
  COUNT(raw_host_allocs);
  *out = malloc((size_t)nbytes);
  if (!*out) snprintf(err, errlen, "malloc refused %lld bytes", (long long)nbytes);
  return *out ? 0 : 2;
}
static void raw_free(void *ctx, void *p, int64_t nbytes) { (void)ctx; (void)nbytes; free(p); }
static int event_record(void *ctx, uintptr_t stream, void **event, char *err, size_t errlen) {
  (void)ctx; (void)stream; (void)err; (void)errlen;
  COUNT(events_recorded);
  *event = (void *)1;
  return 0;
}
static int event_query(void *ctx, void *e) { (void)ctx; (void)e; return 1; }
static void event_wait(void *ctx, void *e) { (void)ctx; (void)e; }
static void event_release(void *ctx, void *e) { (void)ctx; (void)e; }

static void *fake_host_alloc(int64_t nbytes) {
  COUNT(host_allocs);
  void *p = NULL;
  char err[512];
  if (kiln_pinned_alloc(pinned, nbytes, &p, err, sizeof err)) {
    host->fail(KILN_ERR_MEMORY, "%s", err);
    return NULL;
  }
  return p;
}

static void fake_host_free(void *data, int64_t nbytes) {
  (void)nbytes;
  COUNT(host_frees);
  if (kiln_pinned_free(pinned, data)) COUNT(bad_host_frees);
}

/* Streams and events: tokens. A stream is known until freed (others are refused as the real
   backend refuses them), the current one cannot be freed, events complete at once and 0.25 ms
   pass between any two. */
enum { FAKE_STREAMS = 64 };
static void *streams[FAKE_STREAMS];
static void *current;   /* NULL: the default stream */

static int known(void *s) {
  if (!s) return 1;
  for (int i = 0; i < FAKE_STREAMS; i++)
    if (streams[i] == s) return 1;
  return 0;
}
static int unknown(const char *op, void *s) {
  return host->fail(KILN_ERR_ARGUMENT, "%s: %p is not a stream of cuda:0 (freed, or made for another device)", op, s);
}
static int fake_stream_new(int device_index, void **out) {
  (void)device_index;
  for (int i = 0; i < FAKE_STREAMS; i++)
    if (!streams[i]) {
      streams[i] = *out = malloc(1);
      COUNT(streams_made);
      return KILN_OK;
    }
  return host->fail(KILN_ERR_MEMORY, "Stream: the fake device has no more streams");
}
static int fake_stream_free(int device_index, void *s) {
  (void)device_index;
  if (!s) return host->fail(KILN_ERR_STATE, "Stream:free: the default stream of cuda:0 is never freed");
  if (s == current) return host->fail(KILN_ERR_STATE, "Stream:free: the stream is cuda:0's current stream; switch back first");
  for (int i = 0; i < FAKE_STREAMS; i++)
    if (streams[i] == s) {
      streams[i] = NULL;
      free(s);
      COUNT(streams_freed);
      return KILN_OK;
    }
  return unknown("Stream:free", s);
}
static int fake_set_stream(int device_index, void *s) {
  (void)device_index;
  if (!known(s)) return unknown("set_stream", s);
  if (s != current) COUNT(stream_switches);
  current = s;
  return KILN_OK;
}
static void *fake_current_stream(int device_index) { (void)device_index; return current; }
static int fake_stream_synchronize(int device_index, void *s) {
  (void)device_index;
  return known(s) ? KILN_OK : unknown("Stream:synchronize", s);
}
static int fake_stream_query(int device_index, void *s, int *done) {
  (void)device_index;
  *done = 1;
  return known(s) ? KILN_OK : unknown("Stream:query", s);
}
static int fake_stream_wait_event(int device_index, void *s, void *e) {
  (void)device_index; (void)e;
  if (!known(s)) return unknown("Stream:wait_event", s);
  COUNT(stream_waits);
  return KILN_OK;
}
static int fake_event_new(int device_index, int timing, void **out) {
  (void)device_index;
  *out = malloc(timing ? 2 : 1);
  COUNT(events_made);
  return KILN_OK;
}
static int fake_event_free(int device_index, void *e) {
  (void)device_index;
  free(e);
  COUNT(events_freed);
  return KILN_OK;
}
static int fake_event_record(int device_index, void *e, void *s) {
  (void)device_index; (void)e;
  if (!known(s)) return unknown("Event:record", s);
  COUNT(events_on_streams);
  return KILN_OK;
}
static int fake_event_synchronize(int device_index, void *e) { (void)device_index; (void)e; return KILN_OK; }
static int fake_event_query(int device_index, void *e, int *done) { (void)device_index; (void)e; *done = 1; return KILN_OK; }
static int fake_event_elapsed(int device_index, void *a, void *b, float *ms) {
  (void)device_index; (void)a; (void)b;
  *ms = 0.25f;
  return KILN_OK;
}
static int fake_record_stream(int device_index, void *data, void *s) {
  (void)device_index; (void)data;
  if (!known(s)) return unknown("record_stream", s);
  COUNT(records_on_streams);
  return KILN_OK;
}

/* GEMM: no arithmetic, only what the CUDA backend's GEMM reads before it picks cuBLAS's compute
   type: the f32 matmul precision, through kiln_cuda_host (test_cuda_gemm_plan fake). */
static int fake_gemm(const struct kiln_call *c) {
  (void)c;
  COUNT(gemm_calls);
  int precision = host->float32_matmul_precision();
  __atomic_store_n(&counters.gemm_precision, precision, __ATOMIC_RELAXED);
  return host->fail(KILN_ERR_UNSUPPORTED, "gemm: the fake CUDA device does not multiply (precision %d)", precision);
}

static struct kiln_backend table = {
  .name = "cuda",
  .alloc = fake_alloc,
  .free = fake_free,
  .memcpy_to_host = fake_to_host,
  .memcpy_from_host = fake_from_host,
  .synchronize = fake_synchronize,
  .memory_stats = fake_memory_stats,
  .empty_cache = fake_empty_cache,
  .host_alloc = fake_host_alloc,
  .host_free = fake_host_free,
  .memcpy_from_host_async = fake_from_host_async,
  .stream_new = fake_stream_new,
  .stream_free = fake_stream_free,
  .set_stream = fake_set_stream,
  .current_stream = fake_current_stream,
  .stream_synchronize = fake_stream_synchronize,
  .stream_query = fake_stream_query,
  .stream_wait_event = fake_stream_wait_event,
  .event_new = fake_event_new,
  .event_free = fake_event_free,
  .event_record = fake_event_record,
  .event_synchronize = fake_event_synchronize,
  .event_query = fake_event_query,
  .event_elapsed = fake_event_elapsed,
  .record_stream = fake_record_stream,
  .kernel = {[KILN_OP_GEMM] = fake_gemm},
};

__attribute__((visibility("default"))) int kiln_cuda_backend_open(int api_version, const struct kiln_cuda_host *h,
                                                                  const struct kiln_backend **out, int *device_count,
                                                                  char *err, size_t errlen) {
  *out = NULL;
  *device_count = 0;
  if (api_version != KILN_API_VERSION || !h || h->op_count != KILN_OP_COUNT || h->backend_size != (int)sizeof table ||
      h->call_size != (int)sizeof(struct kiln_call) || !h->float32_matmul_precision) {
    snprintf(err, errlen, "the fake CUDA backend was built from other sources than libkiln");
    return KILN_ERR_UNSUPPORTED;
  }
  host = h;
  const char *cap = getenv("FAKE_CUDA_CAPACITY");
  capacity = cap ? atoll(cap) : 0;
  const char *dnn = getenv("FAKE_CUDA_CUDNN");   /* pretend a build with cuDNN (no kernels all the same) */
  table.has_cudnn = dnn && strcmp(dnn, "1") == 0;
  pinned = kiln_pinned_new((struct kiln_pinned_backing){NULL, raw_alloc, raw_free, event_record, event_query, event_wait,
                                                        event_release});
  if (!pinned) {
    snprintf(err, errlen, "out of memory");
    return KILN_ERR_MEMORY;
  }
  *out = &table;
  *device_count = 1;
  return KILN_OK;
}

#endif
