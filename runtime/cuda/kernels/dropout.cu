/* cuda/dropout.cu: dropout on CUDA. Element i keeps its value, scaled by 1/(1-p), when word i % 4
   of Philox block (offset + i / 4) under the seed is at least p * 2^32 (nn.cuh): the mask is the
   CPU's bit for bit. */
#include "kernels.cuh"
#include "nn.cuh"

using namespace kiln_nn;

template <class T>
__global__ void dropout_kernel(const T *x, T *y, T *mask, int64_t n, uint64_t seed, uint64_t offset, uint64_t threshold,
                               double scale) {
  KILN_GRID_LOOP(i, n) {
    T m = dropout_mask<T>(seed, offset, i, threshold, scale);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

extern "C" int cuda_dropout(const struct kiln_call *c) {
  struct kiln_tensor *mask = (struct kiln_tensor *)c->extra;
  const struct kiln_tensor *in = c->in[0];
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, "dropout");
  if (!dev) return kiln_error_code();
  if (in->dtype != KILN_F32 && in->dtype != KILN_F64)
    return cuda_fail(KILN_ERR_DTYPE, "dropout: %s tensors are not supported on cuda (f32 or f64; got %s)",
                     kiln_dtype_name(in->dtype), kiln_shape_string(in));
  if (c->out->numel == 0) return KILN_OK;
  struct kiln_tensor *x = cuda_contiguous_as(in, in->dtype, "dropout");
  if (!x) return kiln_error_code();
  double p = c->scalar[0];
  uint64_t seed = (uint64_t)c->ints[0], offset = (uint64_t)c->ints[1], threshold = (uint64_t)(p * 4294967296.0);
  double scale = 1.0 / (1.0 - p);
  struct kiln_cuda_launch g = kiln_k::grid_for(dev, x->numel);
  if (x->dtype == KILN_F32)
    dropout_kernel<float><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(
        (const float *)kiln_tensor_data(x), (float *)kiln_tensor_data(c->out), (float *)kiln_tensor_data(mask), x->numel, seed,
        offset, threshold, scale);
  else
    dropout_kernel<double><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(
        (const double *)kiln_tensor_data(x), (double *)kiln_tensor_data(c->out), (double *)kiln_tensor_data(mask), x->numel,
        seed, offset, threshold, scale);
  kiln_tensor_release(x);
  return cuda_launched("dropout", "dropout_kernel");
}
