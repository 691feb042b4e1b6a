/* cuda/optim.cu: the optimizer updates (SGD, Adam/AdamW, RMSprop, Adagrad) on CUDA as one fused
   kernel over every parameter of a step: the job's entry table and starts go to the device, and
   each thread finds its parameter by binary search over the starts, then runs optim.cuh's update
   of that element (the CPU's operations, in the parameter's dtype). */
#include "kernels.cuh"
#include "optim.cuh"

using namespace kiln_opt;

template <class T>
__global__ void optim_step_kernel(int op, struct kiln_optim_job j, const struct kiln_optim_entry *entries,
                                  const int64_t *starts, int64_t total) {
  KILN_GRID_LOOP(at, total) {
    int k = entry_of(starts, j.n, at);
    step<T>(op, &j, &entries[k], at - starts[k]);
  }
}

extern "C" int cuda_optim_step(const struct kiln_call *c) {
  const struct kiln_optim_job *j = (const struct kiln_optim_job *)c->extra;
  const char *op = kiln_op_name(c->op);
  if (c->op < KILN_OP_SGD_STEP || c->op > KILN_OP_ADAGRAD_STEP)
    return cuda_fail(KILN_ERR_ARGUMENT, "%s: not an optimizer op", op);
  if (j->n <= 0 || j->starts[j->n] == 0) return KILN_OK;
  if (j->dtype != KILN_F32 && j->dtype != KILN_F64)
    return cuda_fail(KILN_ERR_DTYPE, "%s: %s parameters are not supported on cuda (f32 or f64)", op, kiln_dtype_name(j->dtype));
  /* The call names no tensor: the device is the one holding the first parameter. */
  struct cudaPointerAttributes attr;
  int rc = cuda_check(cudaPointerGetAttributes(&attr, j->entries[0].param), op, "cudaPointerGetAttributes");
  if (rc) return rc;
  struct cuda_device *dev = cuda_device_enter(attr.device, op);
  if (!dev) return kiln_error_code();
  size_t eb = sizeof(struct kiln_optim_entry) * (size_t)j->n, sb = sizeof(int64_t) * (size_t)(j->n + 1);
  struct kiln_device where = {KILN_CUDA, attr.device};
  struct kiln_tensor *table = cuda_scratch((int64_t)(eb + sb), where);
  if (!table) return kiln_error_code();
  struct kiln_optim_entry *entries = (struct kiln_optim_entry *)kiln_tensor_data(table);
  int64_t *starts = (int64_t *)((char *)entries + eb);   /* eb is a multiple of 8 */
  /* From pageable memory: the call returns once the host buffers have been read. */
  rc = cuda_check(cudaMemcpyAsync(entries, j->entries, eb, cudaMemcpyHostToDevice, dev->stream), op, "cudaMemcpyAsync (entries)");
  if (!rc) rc = cuda_check(cudaMemcpyAsync(starts, j->starts, sb, cudaMemcpyHostToDevice, dev->stream), op, "cudaMemcpyAsync (starts)");
  if (!rc) {
    int64_t total = j->starts[j->n];
    struct kiln_cuda_launch g = kiln_k::grid_for(dev, total);
    struct kiln_optim_job job = *j;
    job.entries = NULL;
    job.starts = NULL;
    if (j->dtype == KILN_F32)
      optim_step_kernel<float><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(c->op, job, entries, starts, total);
    else
      optim_step_kernel<double><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(c->op, job, entries, starts, total);
    rc = cuda_launched(op, "optim_step_kernel");
  }
  kiln_tensor_release(table);
  return rc;
}
