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

/* The kernel of op in a backend: its table's entry, else the backend's elementwise kernel for an op
   of the elementwise families, else NULL. */
static kiln_kernel kernel_of(const struct kiln_backend *be, int op) {
  if (be->kernel[op]) return be->kernel[op];
  int family = kiln_ops[op].family;
  if (family == KILN_FAMILY_UNARY || family == KILN_FAMILY_BINARY || family == KILN_FAMILY_TERNARY) return be->elementwise;
  return NULL;
}

KILN_API int kiln_op_supported(int op, int device_type) {
  if (op < 0 || op >= KILN_OP_COUNT || device_type < 0 || device_type >= KILN_DEVICE_TYPE_COUNT) return 0;
  const struct kiln_backend *be = device_type == KILN_CUDA ? cuda_backend() : backends[device_type];
  return be && kernel_of(be, op) != NULL;
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
  kiln_kernel k = call->op >= 0 && call->op < KILN_OP_COUNT ? kernel_of(be, call->op) : NULL;
  if (!k) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: not implemented on %s", name, kiln_device_name(device));
  kiln_kernel_enter();   /* ops that kernels run internally record no history */
  int rc = k(call);
  kiln_kernel_leave();
  return rc;
}

KILN_API int kiln_device_available(struct kiln_device device) {
  if (device.type == KILN_CPU) return device.index == 0;
  if (device.type == KILN_CUDA) return cuda_backend() && device.index >= 0 && device.index < cuda_device_count;
  return 0;
}

/* The process's f32 matmul precision (kiln/ops.h), read by the CUDA backend at each GEMM through
   kiln_cuda_host (cuda_loader.c): a setting of the dispatch, beside the backends it reaches; the CPU kernels never look at it. */
static int float32_matmul_precision = KILN_MATMUL_HIGHEST;

KILN_API int kiln_set_float32_matmul_precision(int precision) {
  if (precision != KILN_MATMUL_HIGHEST && precision != KILN_MATMUL_HIGH && precision != KILN_MATMUL_MEDIUM)
    return kiln_fail(KILN_ERR_ARGUMENT,
                     "set_float32_matmul_precision: %d is not a precision: KILN_MATMUL_HIGHEST (0, exact f32), "
                     "KILN_MATMUL_HIGH (1, TF32) or KILN_MATMUL_MEDIUM (2, BF16)",
                     precision);
  __atomic_store_n(&float32_matmul_precision, precision, __ATOMIC_RELAXED);
  return KILN_OK;
}

KILN_API int kiln_get_float32_matmul_precision(void) {
  return __atomic_load_n(&float32_matmul_precision, __ATOMIC_RELAXED);
}

/* ---- device memory for the core's storages ---- */

static int memory_usable(struct kiln_device device, const char *op) { return kiln_backend_for(device, op) != NULL; }
static void *memory_alloc(int64_t nbytes, struct kiln_device device) {
  return kiln_backend_for(device, "empty")->alloc(nbytes, device.index);
}
static void memory_free(void *data, int64_t nbytes, struct kiln_device device) {
  const struct kiln_backend *be = kiln_backend_for(device, "free");
  if (be) be->free(data, nbytes, device.index);
}
static int host_usable(const char *op) { return kiln_pinned_backend(op) != NULL; }
static void *host_alloc(int64_t nbytes) { return kiln_pinned_backend("pin_memory")->host_alloc(nbytes); }
static void host_free(void *data, int64_t nbytes) {
  /* only a loaded CUDA backend makes pinned storages; it tracks the copies still reading them */
  const struct kiln_backend *be = kiln_pinned_backend("free");
  if (be) be->host_free(data, nbytes);
}

static const struct kiln_device_memory device_memory = {
  .usable = memory_usable, .alloc = memory_alloc, .free = memory_free,
  .host_usable = host_usable, .host_alloc = host_alloc, .host_free = host_free,
};

__attribute__((constructor)) static void dispatch_init(void) { kiln_storage_set_memory(&device_memory); }
