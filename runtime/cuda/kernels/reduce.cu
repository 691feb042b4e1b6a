/* cuda/reduce.cu: the reductions (sum, mean, prod, max, min, argmax, argmin, var, std, norm,
   logsumexp) on CUDA, with cpu/reduce.c's semantics (reduce.cuh). As on the CPU, the input is
   copied into rows [M, R] (kept dims first, reduced dims last) of the row dtype: f32, f64, or i64
   for the exact integer path. Each row is cut into chunks (geometry.c's plan); a block reduces a
   chunk into one partial result, then one thread per row folds its chunks in order and writes. */
#include "kernels.cuh"
#include "reduce.cuh"

using namespace kiln_red;
using namespace kiln_k;

template <class T>
__global__ void reduce_chunks_kernel(const T *rows, int64_t R, int64_t chunk, int64_t nchunks, int64_t nblocks, int op,
                                     double p, struct acc *partial) {
  extern __shared__ struct acc part[];   /* blockDim.x */
  constexpr bool ints = std::is_same<T, int64_t>::value;
  for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    int64_t row = b / nchunks, r0 = (b % nchunks) * chunk, r1 = r0 + chunk < R ? r0 + chunk : R;
    const T *x = rows + row * R;
    struct acc a = acc_init(op);
    for (int64_t i = r0 + threadIdx.x; i < r1; i += blockDim.x) {
      if constexpr (ints) acc_push_int(op, &a, x[i], i);
      else acc_push(op, &a, (double)x[i], i, p);
    }
    part[threadIdx.x] = a;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) acc_combine(op, ints, &part[threadIdx.x], &part[threadIdx.x + s], p);
      __syncthreads();
    }
    if (threadIdx.x == 0) partial[b] = part[0];
    __syncthreads();
  }
}

__global__ void reduce_finish_kernel(const struct acc *partial, int64_t M, int64_t nchunks, int op, bool ints, double p,
                                     char *out, int od) {
  KILN_GRID_LOOP(m, M) {
    struct acc total = acc_init(op);
    for (int64_t k = 0; k < nchunks; k++) acc_combine(op, ints, &total, &partial[m * nchunks + k], p);
    acc_store(op, ints, &total, p, out, od, m);
  }
}

template <class T>
static void launch_chunks(const struct cuda_device *dev, const struct kiln_cuda_reduce_plan *pl, const void *rows, int op,
                          double p, struct acc *partial) {
  int64_t nblocks = pl->M * pl->nchunks;
  reduce_chunks_kernel<T><<<blocks_for(dev, nblocks, pl->threads), pl->threads, sizeof(struct acc) * pl->threads,
                            dev->stream>>>((const T *)rows, pl->R, pl->chunk, pl->nchunks, nblocks, op, p, partial);
}

extern "C" int cuda_reduce(const struct kiln_call *c) {
  const struct kiln_tensor *a = c->in[0];
  struct kiln_tensor *out = c->out;
  int op = c->op;
  const char *name = kiln_op_name(op);
  struct cuda_device *dev = cuda_device_enter(out->device.index, name);
  if (!dev) return kiln_error_code();
  if (out->numel == 0) return KILN_OK;
  double p = c->scalar[0];
  struct kiln_cuda_reduce_plan pl;
  kiln_cuda_reduce_plan(a->ndim, a->sizes, c->ints[0], kiln_cuda_max_blocks(dev->sm_count, 256), &pl);
  bool ints = takes_ints(op, a->dtype);
  int rd = row_dtype(op, a->dtype);
  struct kiln_tensor *pv = kiln_permute(a, a->ndim, pl.perm);
  if (!pv) return kiln_error_code();
  struct kiln_tensor *rows = cuda_contiguous_as(pv, rd, name);
  kiln_tensor_release(pv);
  if (!rows) return kiln_error_code();
  struct kiln_tensor *scratch = cuda_scratch((int64_t)sizeof(struct acc) * pl.M * pl.nchunks, out->device);
  int rc = KILN_OK;
  if (!scratch) rc = kiln_error_code();
  struct acc *partial = scratch ? (struct acc *)kiln_tensor_data(scratch) : NULL;
  if (!rc && pl.nchunks > 0) {
    const void *x = kiln_tensor_data(rows);
    if (rd == KILN_F32) launch_chunks<float>(dev, &pl, x, op, p, partial);
    else if (rd == KILN_F64) launch_chunks<double>(dev, &pl, x, op, p, partial);
    else launch_chunks<int64_t>(dev, &pl, x, op, p, partial);
    rc = cuda_launched(name, "reduce_chunks_kernel");
  }
  if (!rc) {
    struct kiln_cuda_launch g = grid_for(dev, pl.M);
    reduce_finish_kernel<<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(partial, pl.M, pl.nchunks, op, ints, p,
                                                                           (char *)kiln_tensor_data(out), out->dtype);
    rc = cuda_launched(name, "reduce_finish_kernel");
  }
  kiln_tensor_release(scratch);
  kiln_tensor_release(rows);
  return rc;
}
