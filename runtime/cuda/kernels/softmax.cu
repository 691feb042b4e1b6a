/* cuda/softmax.cu: softmax and log_softmax along one dim, forward and backward, on CUDA. As in
   cpu/softmax.c a tensor is [outer, D, inner]; one block takes one line of D elements (stride
   inner): its maximum (NaN wins), exp in the line's dtype, sums in double in the block's fixed
   order. */
#include "kernels.cuh"
#include "nn.cuh"

using namespace kiln_nn;
using namespace kiln_k;

template <class T>
__global__ void softmax_kernel(const T *x, T *y, int64_t outer, int64_t D, int64_t inner, int want_log) {
  extern __shared__ double red[];   /* blockDim.x */
  for (int64_t l = blockIdx.x; l < outer * inner; l += gridDim.x) {
    int64_t off = (l / inner) * D * inner + l % inner;
    const T *xl = x + off;
    T *yl = y + off;
    double m = -INFINITY;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      double v = (double)xl[d * inner];
      if (v > m || v != v) m = v;
    }
    T mt = (T)block_max(m, red);
    double s = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      T e = exp_t((T)(xl[d * inner] - mt));
      if (!want_log) yl[d * inner] = e;
      s += (double)e;
    }
    s = block_sum(s, red);
    if (want_log) {
      T ls = (T)log(s) + mt;
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x) yl[d * inner] = xl[d * inner] - ls;
    } else {
      T inv = (T)(1.0 / s);
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x) yl[d * inner] *= inv;   /* this thread's own writes */
    }
  }
}

/* softmax: gx = y * (gy - sum(gy * y)); log_softmax: gx = gy - exp(y) * sum(gy). */
template <class T>
__global__ void softmax_backward_kernel(const T *gy, const T *y, T *gx, int64_t outer, int64_t D, int64_t inner, int want_log) {
  extern __shared__ double red[];
  for (int64_t l = blockIdx.x; l < outer * inner; l += gridDim.x) {
    int64_t off = (l / inner) * D * inner + l % inner;
    double s = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      int64_t k = off + d * inner;
      s += want_log ? (double)gy[k] : (double)gy[k] * y[k];
    }
    T ts = (T)block_sum(s, red);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      int64_t k = off + d * inner;
      gx[k] = want_log ? gy[k] - exp_t(y[k]) * ts : y[k] * (gy[k] - ts);
    }
  }
}

extern "C" int cuda_softmax_lines(struct cuda_device *dev, int want_log, const struct kiln_tensor *x, struct kiln_tensor *y,
                                  int dim, const char *op) {
  int64_t outer, D, inner;
  kiln_cuda_lines(x->ndim, x->sizes, dim, &outer, &D, &inner);
  if (x->numel == 0) return KILN_OK;
  int threads = kiln_cuda_pow2_threads(D, 32, 256);
  unsigned blocks = blocks_for(dev, outer * inner, threads);
  size_t shared = sizeof(double) * (size_t)threads;
  if (x->dtype == KILN_F32)
    softmax_kernel<float><<<blocks, threads, shared, dev->stream>>>((const float *)kiln_tensor_data(x),
                                                                    (float *)kiln_tensor_data(y), outer, D, inner, want_log);
  else
    softmax_kernel<double><<<blocks, threads, shared, dev->stream>>>((const double *)kiln_tensor_data(x),
                                                                     (double *)kiln_tensor_data(y), outer, D, inner, want_log);
  return cuda_launched(op, "softmax_kernel");
}

static int float_only(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_F32 || t->dtype == KILN_F64) return KILN_OK;
  return cuda_fail(KILN_ERR_DTYPE, "%s: %s tensors are not supported on cuda (f32 or f64; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

extern "C" int cuda_softmax(const struct kiln_call *c) {
  const char *op = kiln_op_name(c->op);
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, c->in[0])) return kiln_error_code();
  if (c->out->numel == 0) return KILN_OK;
  struct kiln_tensor *x = cuda_contiguous_as(c->in[0], c->in[0]->dtype, op);
  if (!x) return kiln_error_code();
  int rc = cuda_softmax_lines(dev, c->op == KILN_OP_LOG_SOFTMAX, x, c->out, (int)c->ints[0], op);
  kiln_tensor_release(x);
  return rc;
}

extern "C" int cuda_softmax_backward(const struct kiln_call *c) {
  const char *op = kiln_op_name(c->op);
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, c->in[0])) return kiln_error_code();
  if (c->out->numel == 0) return KILN_OK;
  int dt = c->out->dtype;
  struct kiln_tensor *gy = cuda_contiguous_as(c->in[0], dt, op), *y = gy ? cuda_contiguous_as(c->in[1], dt, op) : NULL;
  int rc = KILN_OK;
  if (!gy || !y) rc = kiln_error_code();
  if (!rc) {
    int64_t outer, D, inner;
    kiln_cuda_lines(y->ndim, y->sizes, (int)c->ints[0], &outer, &D, &inner);
    int threads = kiln_cuda_pow2_threads(D, 32, 256), want_log = c->op == KILN_OP_LOG_SOFTMAX_BACKWARD;
    unsigned blocks = blocks_for(dev, outer * inner, threads);
    size_t shared = sizeof(double) * (size_t)threads;
    if (dt == KILN_F32)
      softmax_backward_kernel<float><<<blocks, threads, shared, dev->stream>>>(
          (const float *)kiln_tensor_data(gy), (const float *)kiln_tensor_data(y), (float *)kiln_tensor_data(c->out), outer,
          D, inner, want_log);
    else
      softmax_backward_kernel<double><<<blocks, threads, shared, dev->stream>>>(
          (const double *)kiln_tensor_data(gy), (const double *)kiln_tensor_data(y), (double *)kiln_tensor_data(c->out),
          outer, D, inner, want_log);
    rc = cuda_launched(op, "softmax_backward_kernel");
  }
  kiln_tensor_release(gy);
  kiln_tensor_release(y);
  return rc;
}
