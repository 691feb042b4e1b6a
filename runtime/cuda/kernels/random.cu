/* cuda/random.cu: the random fills on CUDA. Element i is Philox block (offset + i) under the
   seed, mapped exactly as cpu/random.c maps it (elements.cuh), so uniform (f32, f64, f16, bf16)
   and randint give the CPU's values bit for bit; normal differs in the last bits of log and cos.
   The front end (random.c) hands over a contiguous tensor and advances the offset. */
#include "common.h"
#include "elements.cuh"
#include "geometry.h"

using namespace kiln_el;

enum { THREADS = 256 };

__global__ void random_kernel(int op, char *data, int dtype, uint64_t seed, uint64_t offset, double p0, double p1,
                              int64_t lo, int64_t hi, int64_t n) {
  int es = dtype_size(dtype);
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    random_element(op, data + i * es, dtype, seed, offset, i, p0, p1, lo, hi);
}

extern "C" int cuda_random(const struct kiln_call *c) {
  struct kiln_tensor *t = c->out;
  const char *name = kiln_op_name(c->op);
  struct cuda_device *dev = cuda_device_enter(t->device.index, name);
  if (!dev) return kiln_error_code();
  if (t->numel == 0) return KILN_OK;
  if (!kiln_is_contiguous(t)) return cuda_fail(KILN_ERR_ARGUMENT, "%s: the kernel fills contiguous tensors only", name);
  struct kiln_cuda_launch g = kiln_cuda_launch_1d(t->numel, THREADS, kiln_cuda_max_blocks(dev->sm_count, THREADS));
  random_kernel<<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(c->op, (char *)kiln_tensor_data(t), t->dtype,
                                                                   (uint64_t)c->ints[0], (uint64_t)c->ints[1], c->scalar[0],
                                                                   c->scalar[1], c->ints[2], c->ints[3], t->numel);
  return cuda_launched(name, "random_kernel");
}
