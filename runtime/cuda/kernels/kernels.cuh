/* cuda/kernels.cuh: what the op-family kernels (reduce.cu, index.cu, softmax.cu, ...) share: the
   grid-stride loop, the 1-d launch over n items, and float/double atomics. */
#ifndef KILN_CUDA_KERNELS_CUH
#define KILN_CUDA_KERNELS_CUH
#include "common.h"
#include "elements.cuh"
#include "geometry.h"

#define KILN_GRID_LOOP(i, n)                                                                                      \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i##_step = (int64_t)gridDim.x * blockDim.x; \
       i < (n); i += i##_step)

namespace kiln_k {
enum { THREADS = 256 };

/* A grid of THREADS-thread blocks striding over n items. */
static inline struct kiln_cuda_launch grid_for(const struct cuda_device *dev, int64_t n) {
  return kiln_cuda_launch_1d(n, THREADS, kiln_cuda_max_blocks(dev->sm_count, THREADS));
}

/* Blocks that each take whole items (rows, planes) in a grid-stride loop over n of them. */
static inline unsigned blocks_for(const struct cuda_device *dev, int64_t n, int threads) {
  int64_t most = kiln_cuda_max_blocks(dev->sm_count, threads);
  return (unsigned)(n < most ? (n > 0 ? n : 1) : most);
}

template <class T> __device__ __forceinline__ void atomic_add(T *p, T v) { atomicAdd(p, v); }

/* Sum over the block of one double per thread (blockDim.x a power of two, shared holds
   blockDim.x doubles); every thread gets the total. The order is fixed by the block size. */
__device__ __forceinline__ double block_sum(double v, double *shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  double r = shared[0];
  __syncthreads();
  return r;
}

/* The NaN-propagating maximum over the block (as the CPU's `x > m || x != x`). */
__device__ __forceinline__ double block_max(double v, double *shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      double a = shared[threadIdx.x], b = shared[threadIdx.x + s];
      if (a == a && (b > a || b != b)) shared[threadIdx.x] = b;
    }
    __syncthreads();
  }
  double r = shared[0];
  __syncthreads();
  return r;
}
}  // namespace kiln_k

#endif
