/* factories.c: tensors made from values (full, arange, linspace, eye, from f64) and read back to
   f64 or set by element (an in-place change autograd must know of). */
#include "internal.h"
#include <math.h>
#include <stdlib.h>

KILN_API struct kiln_tensor *kiln_tensor_full(int ndim, const int64_t *sizes, double value, int dtype, struct kiln_device device) {
  struct kiln_tensor *t = kiln_tensor_empty(ndim, sizes, dtype, device);
  if (t && kiln_fill_(t, value)) { kiln_tensor_release(t); return NULL; }
  return t;
}

/* Fill a fresh CPU f64 buffer through fn, then convert to the requested dtype and device. */
static struct kiln_tensor *from_values(int ndim, const int64_t *sizes, const double *values, int dtype, struct kiln_device device) {
  struct kiln_tensor *t = kiln_tensor_from_f64(ndim, sizes, values, dtype, device);
  return t;
}

KILN_API struct kiln_tensor *kiln_tensor_arange(double start, double end, double step, int dtype, struct kiln_device device) {
  if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step)) {
    kiln_fail(KILN_ERR_ARGUMENT, "arange: start %g, end %g, step %g (step must be non-zero and all finite)", start, end, step);
    return NULL;
  }
  double count = ceil((end - start) / step);
  if (count < 0) count = 0;
  if (count > 1e12) { kiln_fail(KILN_ERR_ARGUMENT, "arange: %g elements is too many", count); return NULL; }
  int64_t n = (int64_t)count;
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  if (!v) { kiln_fail(KILN_ERR_MEMORY, "arange: out of memory"); return NULL; }
  for (int64_t i = 0; i < n; i++) v[i] = start + (double)i * step;
  struct kiln_tensor *t = from_values(1, &n, v, dtype, device);
  free(v);
  return t;
}

KILN_API struct kiln_tensor *kiln_tensor_linspace(double start, double end, int64_t steps, int dtype, struct kiln_device device) {
  if (steps < 0) { kiln_fail(KILN_ERR_ARGUMENT, "linspace: steps %lld is negative", (long long)steps); return NULL; }
  double *v = malloc(sizeof(double) * (size_t)(steps ? steps : 1));
  if (!v) { kiln_fail(KILN_ERR_MEMORY, "linspace: out of memory"); return NULL; }
  double step = steps > 1 ? (end - start) / (double)(steps - 1) : 0;
  /* Like PyTorch: the first half counts up from start, the second down from end, so both ends are exact. */
  for (int64_t i = 0; i < steps; i++) v[i] = i < steps / 2 || steps == 1 ? start + step * (double)i : end - step * (double)(steps - 1 - i);
  struct kiln_tensor *t = from_values(1, &steps, v, dtype, device);
  free(v);
  return t;
}

KILN_API struct kiln_tensor *kiln_tensor_eye(int64_t n, int64_t m, int dtype, struct kiln_device device) {
  if (m < 0) m = n;
  int64_t sizes[2] = {n, m};
  struct kiln_tensor *t = kiln_tensor_full(2, sizes, 0, dtype, device);
  if (!t) return NULL;
  if (device.type == KILN_CPU) {
    int es = kiln_dtype_size(dtype);
    char *p = kiln_tensor_data(t);
    for (int64_t i = 0; i < n && i < m; i++) kiln_store_f64(p + (i * m + i) * es, dtype, 1.0);
  } else {
    struct kiln_tensor *diag = kiln_tensor_header(1, (int64_t[]){n < m ? n : m}, (int64_t[]){m + 1}, 0, dtype, device, t->storage);
    if (!diag || kiln_fill_(diag, 1.0)) { kiln_tensor_release(diag); kiln_tensor_release(t); return NULL; }
    kiln_tensor_release(diag);
  }
  return t;
}

KILN_API struct kiln_tensor *kiln_tensor_from_f64(int ndim, const int64_t *sizes, const double *data, int dtype, struct kiln_device device) {
  struct kiln_device cpu = {KILN_CPU, 0};
  struct kiln_tensor *t = kiln_tensor_empty(ndim, sizes, dtype, cpu);
  if (!t) return NULL;
  if (t->numel && !data) { kiln_tensor_release(t); kiln_fail(KILN_ERR_ARGUMENT, "from_f64: data is NULL"); return NULL; }
  kiln_convert(t->storage->data, dtype, data, KILN_F64, t->numel);
  if (device.type == KILN_CPU) return t;
  struct kiln_tensor *d = kiln_to_device(t, device);
  kiln_tensor_release(t);
  return d;
}

KILN_API int kiln_tensor_to_f64(const struct kiln_tensor *t, double *out) {
  if (kiln_check_live("to_f64", t)) return kiln_error_code();
  if (t->numel && !out) return kiln_fail(KILN_ERR_ARGUMENT, "to_f64: out is NULL for %s", kiln_shape_string(t));
  struct kiln_tensor *c = NULL;
  if (t->device.type != KILN_CPU) {
    c = kiln_to_device(t, (struct kiln_device){KILN_CPU, 0});
    if (!c) return kiln_error_code();
    t = c;
  }
  struct kiln_tensor *dst = kiln_tensor_header(t->ndim, t->sizes, NULL, 0, KILN_F64, t->device, NULL);
  if (!dst) { kiln_tensor_release(c); return kiln_error_code(); }
  struct kiln_storage s = {.data = out, .nbytes = t->numel * 8, .device = t->device, .refcount = 1, .flags = KILN_STORAGE_BORROWED};
  dst->storage = &s;
  int rc = kiln_cpu_copy(dst, t);
  dst->storage = NULL;
  kiln_tensor_release(dst);
  kiln_tensor_release(c);
  return rc;
}

/* The address of one element for get and set: a live cpu tensor and an offset inside its storage;
   else NULL and the error naming op. */
KILN_API int kiln_tensor_set(struct kiln_tensor *t, int64_t storage_offset, double value) {
  char *p = kiln_element_at("set", t, storage_offset);
  if (!p || kiln_autograd_check_inplace("set", t, NULL)) return kiln_error_code();
  kiln_store_f64(p, t->dtype, value);
  t->storage->version++;
  return KILN_OK;
}

KILN_API int kiln_tensor_item(const struct kiln_tensor *t, double *out) {
  if (kiln_check_live("item", t)) return kiln_error_code();
  if (t->numel != 1)
    return kiln_fail(KILN_ERR_SHAPE, "item: tensor %s has %lld elements (expected 1)", kiln_shape_string(t), (long long)t->numel);
  return kiln_tensor_to_f64(t, out);
}
