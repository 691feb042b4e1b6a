/* cuda/copy.cu: COPY (src broadcast to dst's shape, strided, converted between dtypes exactly as
   kiln_convert does) and FILL (the value in dst's dtype, written to a possibly strided view). */
#include "common.h"
#include "elements.cuh"
#include "geometry.h"

using namespace kiln_el;

enum { THREADS = 256 };

#define GRID_STRIDE_LOOP(i, n)                                                                             \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i##_stride = (int64_t)gridDim.x * blockDim.x; \
       i < (n); i += i##_stride)

/* Same dtype: move elements of sizeof(T) bytes. */
template <class T>
__global__ void copy_move_kernel(struct kiln_cuda_iter it, char *dst, const char *src, int fits32) {
  GRID_STRIDE_LOOP(i, it.numel) {
    int64_t off[KILN_CUDA_MAX_OPERANDS];
    if (fits32) kiln_cuda_iter_offsets32(&it, (uint32_t)i, off);
    else kiln_cuda_iter_offsets(&it, i, off);
    *(T *)(dst + off[0] * (int64_t)sizeof(T)) = *(const T *)(src + off[1] * (int64_t)sizeof(T));
  }
}

__global__ void copy_convert_kernel(struct kiln_cuda_iter it, char *dst, int dd, const char *src, int sd, int fits32) {
  int ds = dtype_size(dd), ss = dtype_size(sd);
  GRID_STRIDE_LOOP(i, it.numel) {
    int64_t off[KILN_CUDA_MAX_OPERANDS];
    if (fits32) kiln_cuda_iter_offsets32(&it, (uint32_t)i, off);
    else kiln_cuda_iter_offsets(&it, i, off);
    convert(dst + off[0] * ds, dd, src + off[1] * ss, sd);
  }
}

template <class T> __global__ void fill_flat_kernel(T *dst, T v, int64_t n) {
  GRID_STRIDE_LOOP(i, n) dst[i] = v;
}

template <class T> __global__ void fill_kernel(struct kiln_cuda_iter it, char *dst, T v, int fits32) {
  GRID_STRIDE_LOOP(i, it.numel) {
    int64_t off[KILN_CUDA_MAX_OPERANDS];
    if (fits32) kiln_cuda_iter_offsets32(&it, (uint32_t)i, off);
    else kiln_cuda_iter_offsets(&it, i, off);
    *(T *)(dst + off[0] * (int64_t)sizeof(T)) = v;
  }
}

static struct kiln_cuda_launch grid(const struct cuda_device *dev, int64_t n) {
  return kiln_cuda_launch_1d(n, THREADS, kiln_cuda_max_blocks(dev->sm_count, THREADS));
}

static int same_shape(const struct kiln_tensor *a, const struct kiln_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] != b->sizes[d]) return 0;
  return 1;
}

template <class T> static void launch_move(const struct cuda_device *dev, const struct kiln_cuda_iter *it, char *dst,
                                           const char *src) {
  struct kiln_cuda_launch g = grid(dev, it->numel);
  copy_move_kernel<T><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(*it, dst, src, kiln_cuda_iter_fits32(it));
}

extern "C" int cuda_copy(const struct kiln_call *c) {
  struct kiln_tensor *dst = c->out;
  const struct kiln_tensor *src = c->in[0];
  struct cuda_device *dev = cuda_device_enter(dst->device.index, "copy");
  if (!dev) return kiln_error_code();
  if (dst->numel == 0) return KILN_OK;
  char *d = (char *)kiln_tensor_data(dst);
  const char *s = (const char *)kiln_tensor_data(src);
  if (dst->dtype == src->dtype && kiln_is_contiguous(dst) && kiln_is_contiguous(src) && same_shape(dst, src)) {
    if (d == s) return KILN_OK;
    return cuda_check(cudaMemcpyAsync(d, s, (size_t)(dst->numel * kiln_dtype_size(dst->dtype)), cudaMemcpyDeviceToDevice,
                                      dev->stream),
                      "copy", "cudaMemcpyAsync (device to device)");
  }
  struct kiln_cuda_iter it;
  const struct kiln_tensor *in[1] = {src};
  kiln_cuda_iter_build(&it, dst, 1, in);
  if (dst->dtype == src->dtype) {
    switch (kiln_dtype_size(dst->dtype)) {
    case 1: launch_move<uint8_t>(dev, &it, d, s); break;
    case 2: launch_move<uint16_t>(dev, &it, d, s); break;
    case 4: launch_move<uint32_t>(dev, &it, d, s); break;
    default: launch_move<uint64_t>(dev, &it, d, s); break;
    }
    return cuda_launched("copy", "copy_move_kernel");
  }
  struct kiln_cuda_launch g = grid(dev, it.numel);
  copy_convert_kernel<<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(it, d, dst->dtype, s, src->dtype,
                                                                         kiln_cuda_iter_fits32(&it));
  return cuda_launched("copy", "copy_convert_kernel");
}

template <class T> static int launch_fill(const struct cuda_device *dev, struct kiln_tensor *t, const double *bits) {
  T v;
  memcpy(&v, bits, sizeof v);
  char *d = (char *)kiln_tensor_data(t);
  if (kiln_is_contiguous(t)) {
    const unsigned char *b = (const unsigned char *)&v;
    int uniform = 1;
    for (size_t k = 1; k < sizeof v; k++) uniform &= b[k] == b[0];
    if (uniform)   /* 0, -1, NaN of all ones, any u8/bool: a memset */
      return cuda_check(cudaMemsetAsync(d, b[0], (size_t)t->numel * sizeof v, dev->stream), "fill", "cudaMemsetAsync");
    struct kiln_cuda_launch g = grid(dev, t->numel);
    fill_flat_kernel<T><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>((T *)d, v, t->numel);
    return cuda_launched("fill", "fill_flat_kernel");
  }
  struct kiln_cuda_iter it;
  kiln_cuda_iter_build(&it, t, 0, NULL);
  struct kiln_cuda_launch g = grid(dev, it.numel);
  fill_kernel<T><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(it, d, v, kiln_cuda_iter_fits32(&it));
  return cuda_launched("fill", "fill_kernel");
}

extern "C" int cuda_fill(const struct kiln_call *c) {
  struct kiln_tensor *t = c->out;
  struct cuda_device *dev = cuda_device_enter(t->device.index, "fill");
  if (!dev) return kiln_error_code();
  if (t->numel == 0) return KILN_OK;
  double bits = 0;   /* the value in the tensor's dtype, carried in the bytes of a double (as cpu_fill) */
  store_f64(&bits, t->dtype, c->scalar[0]);
  switch (kiln_dtype_size(t->dtype)) {
  case 1: return launch_fill<uint8_t>(dev, t, &bits);
  case 2: return launch_fill<uint16_t>(dev, t, &bits);
  case 4: return launch_fill<uint32_t>(dev, t, &bits);
  default: return launch_fill<uint64_t>(dev, t, &bits);
  }
}

extern "C" struct kiln_tensor *cuda_contiguous_as(const struct kiln_tensor *t, int dtype, const char *op) {
  if (t->dtype == dtype && kiln_is_contiguous(t)) {
    kiln_tensor_retain((struct kiln_tensor *)t);
    return (struct kiln_tensor *)t;
  }
  struct kiln_tensor *r = kiln_tensor_empty(t->ndim, t->sizes, dtype, t->device);
  if (!r) return NULL;
  struct kiln_call call;
  memset(&call, 0, sizeof call);
  call.op = KILN_OP_COPY;
  call.out = r;
  call.in[0] = t;
  call.nin = 1;
  if (cuda_copy(&call)) {
    kiln_tensor_release(r);
    return NULL;
  }
  return r;
}

extern "C" struct kiln_tensor *cuda_scratch(int64_t nbytes, struct kiln_device device) {
  int64_t n = nbytes > 0 ? nbytes : 1;
  return kiln_tensor_empty(1, &n, KILN_U8, device);
}

extern "C" int cuda_upload(struct cuda_device *dev, void *dst, const void *src, size_t bytes, const char *op, const char *what) {
  if (!bytes) return KILN_OK;
  void *staged = malloc(bytes);
  if (!staged) return cuda_fail(KILN_ERR_MEMORY, "%s: out of host memory for %zu bytes (%s)", op, bytes, what);
  memcpy(staged, src, bytes);
  int rc = cuda_check(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, dev->stream), op, what);
  free(staged);   /* pageable: the copy has read it when cudaMemcpyAsync returns */
  return rc;
}
