/* cuda/scan.cu: cumsum, cumprod (and cumprod's backward) and the stable argsort on CUDA, as
   cpu/scan.c has them: the front end (ops/scan.c) gives contiguous operands in the compute dtype
   (f32, f64 or i64) and the dim in ints[0]; a tensor is seen as [outer, n, inner], and one thread
   runs the CPU's loop over each of the outer * inner lines, so that results are the CPU's bit for
   bit. Simple rather than fast: a long line is one thread's work (a sort of 50k elements takes a
   few milliseconds); many lines fill the device. */
#include "kernels.cuh"

using namespace kiln_k;

struct scan_lines {
  int64_t outer, n, inner;
};

static struct scan_lines lines_of(const struct kiln_tensor *t, int d) {
  struct scan_lines l = {1, 1, 1};
  for (int k = 0; k < t->ndim; k++) {
    if (k < d) l.outer *= t->sizes[k];
    else if (k == d) l.n = t->sizes[k];
    else l.inner *= t->sizes[k];
  }
  return l;
}

/* ---- cumsum, cumprod: T the element, A the accumulator (double for f32 and f64, uint64_t for
   i64: integers wrap as on the CPU) ---- */

template <class T, class A, bool SUM> __global__ void scan_kernel(struct scan_lines l, T *o, const T *a) {
  KILN_GRID_LOOP(t, l.outer * l.inner) {
    int64_t base = (t / l.inner) * l.n * l.inner + t % l.inner;
    A acc = SUM ? (A)0 : (A)1;
    for (int64_t i = 0; i < l.n; i++) {
      int64_t k = base + i * l.inner;
      acc = SUM ? (A)(acc + (A)a[k]) : (A)(acc * (A)a[k]);
      o[k] = (T)acc;
    }
  }
}

template <class T, class A>
static void launch_scan(struct cuda_device *dev, int sum, struct scan_lines l, void *o, const void *a) {
  struct kiln_cuda_launch g = grid_for(dev, l.outer * l.inner);
  if (sum) scan_kernel<T, A, true><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(l, (T *)o, (const T *)a);
  else scan_kernel<T, A, false><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(l, (T *)o, (const T *)a);
}

extern "C" int cuda_scan(const struct kiln_call *c) {
  const char *op = kiln_op_name(c->op);
  const struct kiln_tensor *a = c->in[0];
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, op);
  if (!dev) return kiln_error_code();
  struct scan_lines l = lines_of(a, (int)c->ints[0]);
  if (l.outer * l.inner * l.n == 0) return KILN_OK;
  int sum = c->op == KILN_OP_CUMSUM;
  void *o = kiln_tensor_data(c->out);
  const void *x = kiln_tensor_data(a);
  switch (a->dtype) {
  case KILN_F32: launch_scan<float, double>(dev, sum, l, o, x); break;
  case KILN_F64: launch_scan<double, double>(dev, sum, l, o, x); break;
  case KILN_I64: launch_scan<int64_t, uint64_t>(dev, sum, l, o, x); break;
  default: return cuda_fail(KILN_ERR_DTYPE, "%s: no CUDA kernel for %s", op, kiln_dtype_name(a->dtype));
  }
  return cuda_launched(op, "scan_kernel");
}

/* gx[i] = prod(x[0..i-1]) * S[i], S[i] = g[i] + x[i+1] * S[i+1]: no division, exact through zeros;
   in T, as the CPU computes it. */
template <class T> __global__ void cumprod_backward_kernel(struct scan_lines l, T *gx, const T *g, const T *x) {
  KILN_GRID_LOOP(t, l.outer * l.inner) {
    int64_t base = (t / l.inner) * l.n * l.inner + t % l.inner;
    T s = 0;
    for (int64_t i = l.n - 1; i >= 0; i--) {
      int64_t k = base + i * l.inner;
      s = i == l.n - 1 ? g[k] : g[k] + x[k + l.inner] * s;
      gx[k] = s;
    }
    T prefix = 1;
    for (int64_t i = 0; i < l.n; i++) {
      int64_t k = base + i * l.inner;
      gx[k] *= prefix;
      prefix *= x[k];
    }
  }
}

extern "C" int cuda_cumprod_backward(const struct kiln_call *c) {
  const struct kiln_tensor *g = c->in[0], *x = c->in[1];
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, "cumprod_backward");
  if (!dev) return kiln_error_code();
  struct scan_lines l = lines_of(x, (int)c->ints[0]);
  if (l.outer * l.inner * l.n == 0) return KILN_OK;
  struct kiln_cuda_launch k = grid_for(dev, l.outer * l.inner);
  if (x->dtype == KILN_F64)
    cumprod_backward_kernel<double><<<(unsigned)k.blocks, k.threads, 0, dev->stream>>>(
        l, (double *)kiln_tensor_data(c->out), (const double *)kiln_tensor_data(g), (const double *)kiln_tensor_data(x));
  else if (x->dtype == KILN_F32)
    cumprod_backward_kernel<float><<<(unsigned)k.blocks, k.threads, 0, dev->stream>>>(
        l, (float *)kiln_tensor_data(c->out), (const float *)kiln_tensor_data(g), (const float *)kiln_tensor_data(x));
  else return cuda_fail(KILN_ERR_DTYPE, "cumprod_backward: no CUDA kernel for %s", kiln_dtype_name(x->dtype));
  return cuda_launched("cumprod_backward", "cumprod_backward_kernel");
}

/* ---- argsort: each thread a bottom-up merge sort of its line's positions, the left run first on
   ties (stable); NaN above every number ---- */

template <class T> __device__ __forceinline__ bool sorts_before(T a, T b, int desc) {
  if constexpr (std::is_same<T, int64_t>::value) return desc ? a > b : a < b;
  else {
    if (desc) return a > b || (a != a && b == b);
    return a < b || (a == a && b != b);
  }
}

template <class T>
__global__ void argsort_kernel(struct scan_lines l, int64_t k, int64_t *out, int64_t *scratch, const T *a, int desc) {
  KILN_GRID_LOOP(t, l.outer * l.inner) {
    int64_t base = (t / l.inner) * l.n * l.inner + t % l.inner, n = l.n, step = l.inner;
    const T *key = a + base;
    int64_t *idx = scratch + t * 2 * n, *tmp = idx + n;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    for (int64_t w = 1; w < n; w *= 2) {
      for (int64_t lo = 0; lo < n; lo += 2 * w) {
        int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
        int64_t i = lo, j = mid, k = lo;
        while (i < mid && j < hi) tmp[k++] = sorts_before(key[idx[j] * step], key[idx[i] * step], desc) ? idx[j++] : idx[i++];
        while (i < mid) tmp[k++] = idx[i++];
        while (j < hi) tmp[k++] = idx[j++];
      }
      int64_t *swap = idx;
      idx = tmp;
      tmp = swap;
    }
    int64_t out_base = (t / l.inner) * k * l.inner + t % l.inner;   /* the first k of the line */
    for (int64_t i = 0; i < k; i++) out[out_base + i * step] = idx[i];
  }
}

extern "C" int cuda_argsort(const struct kiln_call *c) {
  const struct kiln_tensor *a = c->in[0];
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, "argsort");
  if (!dev) return kiln_error_code();
  struct scan_lines l = lines_of(a, (int)c->ints[0]);
  int64_t lines = l.outer * l.inner;
  int64_t k = c->ints[2];
  if (lines * l.n == 0 || k == 0) return KILN_OK;
  struct kiln_tensor *scratch = cuda_scratch(lines * 2 * l.n * (int64_t)sizeof(int64_t), c->out->device);
  if (!scratch) return kiln_error_code();
  int64_t *s = (int64_t *)kiln_tensor_data(scratch), *o = (int64_t *)kiln_tensor_data(c->out);
  int desc = (int)c->ints[1];
  struct kiln_cuda_launch g = grid_for(dev, lines);
  int rc = KILN_OK;
  switch (a->dtype) {
  case KILN_F32:
    argsort_kernel<float><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(l, k, o, s, (const float *)kiln_tensor_data(a), desc);
    break;
  case KILN_F64:
    argsort_kernel<double><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(l, k, o, s, (const double *)kiln_tensor_data(a), desc);
    break;
  case KILN_I64:
    argsort_kernel<int64_t><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(l, k, o, s, (const int64_t *)kiln_tensor_data(a), desc);
    break;
  default: rc = cuda_fail(KILN_ERR_DTYPE, "argsort: no CUDA kernel for %s", kiln_dtype_name(a->dtype));
  }
  if (!rc) rc = cuda_launched("argsort", "argsort_kernel");
  kiln_tensor_release(scratch);   /* the allocator hands the block out again in stream order */
  return rc;
}
