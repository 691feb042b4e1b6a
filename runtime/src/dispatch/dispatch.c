/* dispatch.c: devices, and the route from an op to its device's kernel (the ops themselves: op_table.c). */
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Backends by device type. The CUDA entry is filled when libkiln_cuda is loaded. */
static const struct kiln_backend *backends[KILN_DEVICE_TYPE_COUNT] = {[KILN_CPU] = &kiln_cpu_backend};
static int cuda_device_count = 0;

/* Set once by cuda_loader.c, under its pthread_once. */
void kiln_dispatch_set_cuda(const struct kiln_backend *backend, int device_count) {
  cuda_device_count = device_count;
  __atomic_store_n(&backends[KILN_CUDA], backend, __ATOMIC_RELEASE);
}

/* The CUDA slot, after the one attempt per process to load the backend. */
static const struct kiln_backend *cuda_backend(void) {
  const struct kiln_backend *be = __atomic_load_n(&backends[KILN_CUDA], __ATOMIC_ACQUIRE);
  if (be) return be;
  kiln_cuda_load();
  return __atomic_load_n(&backends[KILN_CUDA], __ATOMIC_ACQUIRE);
}

KILN_API int kiln_op_supported(int op, int device_type) {
  if (op < 0 || op >= KILN_OP_COUNT || device_type < 0 || device_type >= KILN_DEVICE_TYPE_COUNT) return 0;
  const struct kiln_backend *be = device_type == KILN_CUDA ? cuda_backend() : backends[device_type];
  return be && be->kernel[op] != NULL;
}

const struct kiln_backend *kiln_backend_for(struct kiln_device device, const char *op) {
  if (device.type == KILN_CPU && device.index == 0) return &kiln_cpu_backend;
  if (device.type == KILN_CUDA) {
    if (!cuda_backend()) {
      kiln_fail(KILN_ERR_DEVICE, "%s: %s (asked for %s)", op, kiln_cuda_unavailable_reason(), kiln_device_name(device));
      return NULL;
    }
    if (device.index < 0 || device.index >= cuda_device_count) {
      kiln_fail(KILN_ERR_DEVICE, "%s: no CUDA device %s (%d devices)", op, kiln_device_name(device), cuda_device_count);
      return NULL;
    }
    return backends[KILN_CUDA];
  }
  kiln_fail(KILN_ERR_DEVICE, "%s: unknown device %s", op, kiln_device_name(device));
  return NULL;
}

const struct kiln_backend *kiln_pinned_backend(const char *op) {
  const struct kiln_backend *be = cuda_backend();
  if (!be) {
    kiln_fail(KILN_ERR_DEVICE, "%s: %s", op, kiln_cuda_unavailable_reason());
    return NULL;
  }
  if (!be->host_alloc || !be->host_free) {
    kiln_fail(KILN_ERR_UNSUPPORTED, "%s: the CUDA backend has no pinned host memory", op);
    return NULL;
  }
  return be;
}

int kiln_dispatch(struct kiln_device device, const struct kiln_call *call) {
  const char *name = kiln_op_name(call->op);
  const struct kiln_backend *be = kiln_backend_for(device, name);
  if (!be) return kiln_error_code();
  kiln_kernel k = be->kernel[call->op];
  if (!k) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: not implemented on %s", name, kiln_device_name(device));
  kiln_kernel_enter();   /* ops that kernels run internally record no history */
  int rc = k(call);
  kiln_kernel_leave();
  return rc;
}

KILN_API int kiln_device_parse(const char *name, struct kiln_device *out) {
  if (!name || !out) return kiln_fail(KILN_ERR_ARGUMENT, "device: no name given");
  if (strcmp(name, "cpu") == 0) { *out = (struct kiln_device){KILN_CPU, 0}; return KILN_OK; }
  if (strncmp(name, "cuda", 4) == 0) {
    const char *rest = name + 4;
    if (*rest == 0) { *out = (struct kiln_device){KILN_CUDA, 0}; return KILN_OK; }
    if (*rest == ':' && rest[1]) {
      char *end;
      long idx = strtol(rest + 1, &end, 10);
      if (*end == 0 && idx >= 0 && idx < 1024) { *out = (struct kiln_device){KILN_CUDA, (int32_t)idx}; return KILN_OK; }
    }
  }
  return kiln_fail(KILN_ERR_ARGUMENT, "device: unknown device \"%s\" (expected \"cpu\", \"cuda\" or \"cuda:N\")", name);
}

KILN_API const char *kiln_device_name(struct kiln_device device) {
  static _Thread_local char bufs[2][32];
  static _Thread_local int next;
  char *b = bufs[next++ & 1];
  if (device.type == KILN_CPU) snprintf(b, 32, "cpu");
  else if (device.type == KILN_CUDA) snprintf(b, 32, "cuda:%d", (int)device.index);
  else snprintf(b, 32, "device(%d:%d)", (int)device.type, (int)device.index);
  return b;
}

KILN_API int kiln_device_available(struct kiln_device device) {
  if (device.type == KILN_CPU) return device.index == 0;
  if (device.type == KILN_CUDA) return cuda_backend() && device.index >= 0 && device.index < cuda_device_count;
  return 0;
}

int kiln_broadcast_shapes(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb, int *out_ndim, int64_t *out) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int64_t x = i < n - na ? 1 : sa[i - (n - na)];
    int64_t y = i < n - nb ? 1 : sb[i - (n - nb)];
    if (x == y || y == 1) out[i] = x;
    else if (x == 1) out[i] = y;
    else
      return kiln_fail(KILN_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
                       kiln_sizes_string(na, sa), kiln_sizes_string(nb, sb), i, (long long)x, (long long)y);
  }
  *out_ndim = n;
  return KILN_OK;
}
