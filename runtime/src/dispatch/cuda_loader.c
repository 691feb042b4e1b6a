/* cuda_loader.c: finds and opens the CUDA backend (libkiln_cuda.so) on the first use of a CUDA
   device, once per process, and answers kiln/cuda.h. libkiln itself never links CUDA: a machine
   without a GPU, a driver or the backend gets "no CUDA device: <why>", never a failure to start. */
#define _GNU_SOURCE
#include "internal.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const struct kiln_backend *table;   /* the backend's table, even with no device */
static int device_count;
static int library_opened;
static char reason[768];                   /* "no CUDA device: ..." while none is usable */

static const struct kiln_cuda_host host = {
  .api_version = KILN_API_VERSION,
  .op_count = KILN_OP_COUNT,
  .call_size = (int)sizeof(struct kiln_call),
  .backend_size = (int)sizeof(struct kiln_backend),
  .fail = kiln_fail,
  .float32_matmul_precision = kiln_get_float32_matmul_precision,
};

/* The folder libkiln was loaded from ("" when dladdr cannot tell). */
static void library_dir(char *out, size_t n) {
  Dl_info info;
  out[0] = 0;
  if (dladdr((void *)kiln_cuda_init, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
    snprintf(out, n, "%s", info.dli_fname);
    *strrchr(out, '/') = 0;
  }
}

static void *open_library(void) {
  const char *env = getenv("KILN_CUDA_LIB");
  if (env && *env) {
    void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(reason, sizeof reason, "no CUDA device: cannot load $KILN_CUDA_LIB: %s", dlerror());
    return h;
  }
  char dir[512], path[600];
  library_dir(dir, sizeof dir);
  if (dir[0]) {
    snprintf(path, sizeof path, "%s/libkiln_cuda.so", dir);
    if (access(path, F_OK) == 0) {
      /* It is there: a failure now is a missing CUDA runtime or cuBLAS, worth naming exactly. */
      void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (!h) snprintf(reason, sizeof reason, "no CUDA device: cannot load %s: %s", path, dlerror());
      return h;
    }
  }
  void *h = dlopen("libkiln_cuda.so", RTLD_NOW | RTLD_LOCAL);
  if (h) return h;
#ifdef KILN_HAVE_CUDA_BACKEND
  snprintf(reason, sizeof reason, "no CUDA device: libkiln_cuda.so not found next to libkiln (%s) or on the library path",
           dir[0] ? dir : "folder unknown");
#else
  snprintf(reason, sizeof reason,
           "no CUDA device: kiln was built without its CUDA backend (libkiln_cuda.so not found next to libkiln or on "
           "the library path)");
#endif
  return NULL;
}

static void load(void) {
  void *h = open_library();
  if (!h) return;
  kiln_cuda_open_fn open_fn;
  void *sym = dlsym(h, "kiln_cuda_backend_open");
  memcpy(&open_fn, &sym, sizeof open_fn);   /* object pointer to function pointer, as POSIX allows */
  if (!open_fn) {
    snprintf(reason, sizeof reason, "no CUDA device: the CUDA backend library has no kiln_cuda_backend_open (%s)", dlerror());
    return;
  }
  char err[512] = "";
  const struct kiln_backend *be = NULL;
  int count = 0;
  int rc = open_fn(KILN_API_VERSION, &host, &be, &count, err, sizeof err);
  if (rc || !be) {
    snprintf(reason, sizeof reason, "no CUDA device: %s", err[0] ? err : "the CUDA backend did not open");
    return;
  }
  library_opened = 1;
  table = be;
  if (count <= 0) {
    snprintf(reason, sizeof reason, "no CUDA device: %s", err[0] ? err : "the driver reports no CUDA device");
    return;
  }
  device_count = count;
  reason[0] = 0;
  kiln_dispatch_set_cuda(be, count);
}

void kiln_cuda_load(void) { pthread_once(&load_once, load); }

KILN_API int kiln_cuda_init(void) {
  kiln_cuda_load();
  if (device_count > 0) return KILN_OK;
  return kiln_fail(KILN_ERR_DEVICE, "%s", reason);
}

KILN_API int kiln_cuda_device_count(void) {
  kiln_cuda_load();
  return device_count;
}

KILN_API int kiln_cuda_is_available(void) { return kiln_cuda_device_count() > 0; }

KILN_API int kiln_cuda_backend_loaded(void) {
  kiln_cuda_load();
  return library_opened;
}

KILN_API const char *kiln_cuda_unavailable_reason(void) {
  kiln_cuda_load();
  return device_count > 0 ? NULL : reason;
}

KILN_API int kiln_cuda_op_supported(int op) {
  kiln_cuda_load();
  return table && op >= 0 && op < KILN_OP_COUNT && table->kernel[op] != NULL;
}

KILN_API int kiln_cuda_has_cudnn(void) {
  kiln_cuda_load();
  return table && table->has_cudnn;
}

KILN_API int kiln_cuda_synchronize(int device) {
  kiln_cuda_load();
  if (device_count == 0) return kiln_fail(KILN_ERR_DEVICE, "synchronize: %s", reason);
  if (device < -1 || device >= device_count)
    return kiln_fail(KILN_ERR_DEVICE, "synchronize: no CUDA device cuda:%d (%d devices)", device, device_count);
  return table->synchronize ? table->synchronize(device) : KILN_OK;
}

KILN_API int kiln_cuda_memory_stats(int device, struct kiln_cuda_memory *out) {
  if (!out) return kiln_fail(KILN_ERR_ARGUMENT, "memory_stats: out is NULL");
  memset(out, 0, sizeof *out);
  kiln_cuda_load();
  if (device_count == 0) return KILN_OK;   /* nothing was ever allocated */
  if (device < 0 || device >= device_count)
    return kiln_fail(KILN_ERR_DEVICE, "memory_stats: no CUDA device cuda:%d (%d devices)", device, device_count);
  return table->memory_stats ? table->memory_stats(device, out) : KILN_OK;
}

KILN_API int kiln_cuda_empty_cache(void) {
  kiln_cuda_load();
  if (device_count == 0 || !table->empty_cache) return KILN_OK;
  return table->empty_cache();
}

/* ---- streams and events ---- */

/* The table for a stream or event call on device, or NULL with "op: no CUDA device: ..." */
static const struct kiln_backend *streams_of(int device, const char *op) {
  kiln_cuda_load();
  if (device_count == 0) {
    kiln_fail(KILN_ERR_DEVICE, "%s: %s", op, reason);
    return NULL;
  }
  if (device < 0 || device >= device_count) {
    kiln_fail(KILN_ERR_DEVICE, "%s: no CUDA device cuda:%d (%d devices)", op, device, device_count);
    return NULL;
  }
  if (!table->stream_new) {
    kiln_fail(KILN_ERR_UNSUPPORTED, "%s: this CUDA backend has no streams", op);
    return NULL;
  }
  return table;
}

static int null_arg(const char *op, const char *what) { return kiln_fail(KILN_ERR_ARGUMENT, "%s: %s is NULL", op, what); }

KILN_API int kiln_cuda_stream_new(int device, void **out) {
  if (!out) return null_arg("Stream", "out");
  *out = NULL;
  const struct kiln_backend *be = streams_of(device, "Stream");
  return be ? be->stream_new(device, out) : kiln_error_code();
}

KILN_API int kiln_cuda_stream_free(int device, void *stream) {
  const struct kiln_backend *be = streams_of(device, "Stream:free");
  return be ? be->stream_free(device, stream) : kiln_error_code();
}

KILN_API int kiln_cuda_set_stream(int device, void *stream) {
  const struct kiln_backend *be = streams_of(device, "set_stream");
  return be ? be->set_stream(device, stream) : kiln_error_code();
}

KILN_API void *kiln_cuda_current_stream(int device) {
  kiln_cuda_load();
  if (device < 0 || device >= device_count || !table->current_stream) return NULL;
  return table->current_stream(device);
}

KILN_API int kiln_cuda_stream_synchronize(int device, void *stream) {
  const struct kiln_backend *be = streams_of(device, "Stream:synchronize");
  return be ? be->stream_synchronize(device, stream) : kiln_error_code();
}

KILN_API int kiln_cuda_stream_query(int device, void *stream, int *done) {
  if (!done) return null_arg("Stream:query", "done");
  *done = 0;
  const struct kiln_backend *be = streams_of(device, "Stream:query");
  return be ? be->stream_query(device, stream, done) : kiln_error_code();
}

KILN_API int kiln_cuda_stream_wait_event(int device, void *stream, void *event) {
  if (!event) return null_arg("Stream:wait_event", "event");
  const struct kiln_backend *be = streams_of(device, "Stream:wait_event");
  return be ? be->stream_wait_event(device, stream, event) : kiln_error_code();
}

KILN_API int kiln_cuda_event_new(int device, int enable_timing, void **out) {
  if (!out) return null_arg("Event", "out");
  *out = NULL;
  const struct kiln_backend *be = streams_of(device, "Event");
  return be ? be->event_new(device, enable_timing, out) : kiln_error_code();
}

KILN_API int kiln_cuda_event_free(int device, void *event) {
  if (!event) return KILN_OK;
  const struct kiln_backend *be = streams_of(device, "Event:free");
  return be ? be->event_free(device, event) : kiln_error_code();
}

KILN_API int kiln_cuda_event_record(int device, void *event, void *stream) {
  if (!event) return null_arg("Event:record", "event");
  const struct kiln_backend *be = streams_of(device, "Event:record");
  return be ? be->event_record(device, event, stream) : kiln_error_code();
}

KILN_API int kiln_cuda_event_synchronize(int device, void *event) {
  if (!event) return null_arg("Event:synchronize", "event");
  const struct kiln_backend *be = streams_of(device, "Event:synchronize");
  return be ? be->event_synchronize(device, event) : kiln_error_code();
}

KILN_API int kiln_cuda_event_query(int device, void *event, int *done) {
  if (!event || !done) return null_arg("Event:query", !event ? "event" : "done");
  *done = 0;
  const struct kiln_backend *be = streams_of(device, "Event:query");
  return be ? be->event_query(device, event, done) : kiln_error_code();
}

KILN_API int kiln_cuda_event_elapsed_time(int device, void *start, void *end, float *ms) {
  if (!start || !end || !ms) return null_arg("Event:elapsed_time", !start ? "start" : !end ? "end" : "ms");
  *ms = 0;
  const struct kiln_backend *be = streams_of(device, "Event:elapsed_time");
  return be ? be->event_elapsed(device, start, end, ms) : kiln_error_code();
}

KILN_API int kiln_tensor_record_stream(const struct kiln_tensor *t, void *stream) {
  if (kiln_check_live("record_stream", t)) return kiln_error_code();
  if (t->device.type != KILN_CUDA)
    return kiln_fail(KILN_ERR_DEVICE, "record_stream: tensor %s %s is on %s (only cuda tensors use streams)",
                     kiln_shape_string(t), kiln_dtype_name(t->dtype), kiln_device_name(t->device));
  const struct kiln_backend *be = streams_of(t->device.index, "record_stream");
  if (!be) return kiln_error_code();
  if (!t->storage->data) return KILN_OK;   /* an empty tensor holds no block */
  return be->record_stream(t->device.index, t->storage->data, stream);
}
