/* cuda/loss.cu: the negative log-likelihood loss on CUDA, alone or fused with log_softmax as
   cross entropy (label smoothing, class weights, ignore_index), forward and backward, with
   cpu/softmax.c's arithmetic per position (nn.cuh). The targets are checked and the total weight
   summed by one block before anything is computed; both come back to the host (the front end
   keeps the total for the backward). Reduced losses sum in double in the block's fixed order. */
#include "kernels.cuh"
#include "nn.cuh"
#include "nn_calls.h"

using namespace kiln_nn;
using namespace kiln_k;

extern "C" int cuda_softmax_lines(struct cuda_device *dev, int want_log, const struct kiln_tensor *x, struct kiln_tensor *y,
                                  int dim, const char *op);

enum { BLOCK = 256 };

struct nll_check { double total; unsigned long long first_bad; };

/* One block: the first target outside [0, C) that is not ignored, and the sum of weight[t]. */
template <class T>
__global__ void nll_check_kernel(const int64_t *target, const T *w, int64_t P, int64_t C, int64_t ignore,
                                 struct nll_check *out) {
  __shared__ double red[BLOCK];
  __shared__ unsigned long long bad;
  if (threadIdx.x == 0) bad = ~0ull;
  __syncthreads();
  double s = 0;
  for (int64_t q = threadIdx.x; q < P; q += blockDim.x) {
    int64_t t = target[q];
    if (t == ignore) continue;
    if (t < 0 || t >= C) { atomicMin(&bad, (unsigned long long)q); continue; }
    s += w ? (double)w[t] : 1.0;
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) { out->total = s; out->first_bad = bad; }
}

template <class T>
__global__ void nll_loss_kernel(const T *logp, const int64_t *target, const T *w, T *loss, int64_t P, int64_t C, int64_t S,
                                int64_t ignore, double eps) {
  KILN_GRID_LOOP(q, P) loss[q] = nll_position<T>(logp, target, w, q, C, S, ignore, eps);
}

/* out[0] = the sum of the losses (divided by the total weight for the mean), by one block. */
template <class T>
__global__ void nll_reduce_kernel(const T *loss, int64_t P, int mean, double total, T *out) {
  __shared__ double red[BLOCK];
  double s = 0;
  for (int64_t q = threadIdx.x; q < P; q += blockDim.x) s += (double)loss[q];
  s = block_sum(s, red);
  if (threadIdx.x == 0) out[0] = (T)(mean ? s / total : s);
}

template <class T> __global__ void weight_sum_kernel(const T *w, int64_t C, double *out) {
  double s = 0;
  for (int64_t c = 0; c < C; c++) s += (double)w[c];   /* one thread: the CPU's order */
  *out = s;
}

template <class T>
__global__ void nll_backward_kernel(T *gx, const T *g, const int64_t *target, const T *w, const T *logp, int64_t P,
                                    int64_t C, int64_t S, int64_t ignore, int reduction, int fused, double eps,
                                    double total_weight, const double *weight_sum) {
  double ws = weight_sum ? *weight_sum : (double)C;
  KILN_GRID_LOOP(q, P)
    nll_grad_position<T>(gx, g, target, w, logp, q, C, S, ignore, reduction, fused, eps, total_weight, ws);
}

static void nll_shape(const struct kiln_tensor *input, int64_t *N, int64_t *C, int64_t *S) {
  *N = input->sizes[0];
  *C = input->sizes[1];
  *S = 1;
  for (int d = 2; d < input->ndim; d++) *S *= input->sizes[d];
}

template <class T>
static int nll_forward(struct cuda_device *dev, const struct kiln_call *c, const struct kiln_tensor *input,
                       const struct kiln_tensor *target, const struct kiln_tensor *weight, const char *op) {
  struct kiln_nll_extra *ex = (struct kiln_nll_extra *)c->extra;
  int reduction = (int)c->ints[0], fused = (int)c->ints[2];
  int64_t ignore = c->ints[1], N, C, S;
  nll_shape(input, &N, &C, &S);
  int64_t P = N * S;
  const int64_t *t = (const int64_t *)kiln_tensor_data(target);
  const T *w = weight ? (const T *)kiln_tensor_data(weight) : NULL;
  struct kiln_tensor *scratch = cuda_scratch((int64_t)sizeof(struct nll_check) + 8 * P, input->device);
  if (!scratch) return kiln_error_code();
  struct nll_check *chk = (struct nll_check *)kiln_tensor_data(scratch), host;
  T *losses = (T *)(chk + 1);
  nll_check_kernel<T><<<1, BLOCK, 0, dev->stream>>>(t, w, P, C, ignore, chk);
  int rc = cuda_launched(op, "nll_check_kernel");
  if (!rc) rc = cuda_check(cudaMemcpyAsync(&host, chk, sizeof host, cudaMemcpyDeviceToHost, dev->stream), op, "cudaMemcpyAsync (targets)");
  if (!rc) rc = cuda_check(cudaStreamSynchronize(dev->stream), op, "cudaStreamSynchronize (targets)");
  if (!rc && host.first_bad != ~0ull) {
    int64_t v = 0;
    rc = cuda_check(cudaMemcpyAsync(&v, t + host.first_bad, 8, cudaMemcpyDeviceToHost, dev->stream), op,
                    "cudaMemcpyAsync (targets)");
    if (!rc) rc = cuda_check(cudaStreamSynchronize(dev->stream), op, "cudaStreamSynchronize (targets)");
    if (!rc)
      rc = cuda_fail(KILN_ERR_INDEX, "%s: target index %lld out of range for %lld classes (target %s; C counts from 0)",
                     fused ? "cross_entropy" : "nll_loss", (long long)v, (long long)C, kiln_shape_string(target));
  }
  if (rc) { kiln_tensor_release(scratch); return rc; }
  ex->total_weight = host.total;
  const T *logp = (const T *)kiln_tensor_data(input);
  if (fused) {
    if ((rc = cuda_softmax_lines(dev, 1, input, ex->logp, 1, op))) { kiln_tensor_release(scratch); return rc; }
    logp = (const T *)kiln_tensor_data(ex->logp);
  }
  T *per = reduction == KILN_REDUCTION_NONE ? (T *)kiln_tensor_data(c->out) : losses;
  if (P > 0) {
    struct kiln_cuda_launch g = grid_for(dev, P);
    nll_loss_kernel<T><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(logp, t, w, per, P, C, S, ignore, c->scalar[0]);
    rc = cuda_launched(op, "nll_loss_kernel");
  }
  if (!rc && reduction != KILN_REDUCTION_NONE) {
    nll_reduce_kernel<T><<<1, BLOCK, 0, dev->stream>>>(losses, P, reduction == KILN_REDUCTION_MEAN, host.total,
                                                      (T *)kiln_tensor_data(c->out));
    rc = cuda_launched(op, "nll_reduce_kernel");
  }
  kiln_tensor_release(scratch);
  return rc;
}

static int float_only(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_F32 || t->dtype == KILN_F64) return KILN_OK;
  return cuda_fail(KILN_ERR_DTYPE, "%s: %s tensors are not supported on cuda (f32 or f64; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

extern "C" int cuda_nll_loss(const struct kiln_call *c) {
  const char *op = c->ints[2] ? "cross_entropy" : "nll_loss";
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, c->in[0])) return kiln_error_code();
  int dt = c->in[0]->dtype;
  struct kiln_tensor *input = cuda_contiguous_as(c->in[0], dt, op);
  struct kiln_tensor *target = input ? cuda_contiguous_as(c->in[1], KILN_I64, op) : NULL;
  struct kiln_tensor *weight = target && c->in[2] ? cuda_contiguous_as(c->in[2], dt, op) : NULL;
  int rc = KILN_OK;
  if (!input || !target || (c->in[2] && !weight)) rc = kiln_error_code();
  else if (dt == KILN_F32) rc = nll_forward<float>(dev, c, input, target, weight, op);
  else rc = nll_forward<double>(dev, c, input, target, weight, op);
  kiln_tensor_release(input);
  kiln_tensor_release(target);
  kiln_tensor_release(weight);
  return rc;
}

template <class T>
static int nll_backward(struct cuda_device *dev, const struct kiln_call *c, const struct kiln_tensor *g,
                        const struct kiln_tensor *target, const struct kiln_tensor *weight, const struct kiln_tensor *logp,
                        const char *op) {
  int64_t N, C, S;
  nll_shape(c->out, &N, &C, &S);
  int64_t P = N * S;
  if (c->out->numel == 0) return KILN_OK;
  const T *w = weight ? (const T *)kiln_tensor_data(weight) : NULL;
  struct kiln_tensor *scratch = NULL;
  double *wsum = NULL;
  int rc = KILN_OK;
  if (w) {
    if (!(scratch = cuda_scratch(8, c->out->device))) return kiln_error_code();
    wsum = (double *)kiln_tensor_data(scratch);
    weight_sum_kernel<T><<<1, 1, 0, dev->stream>>>(w, C, wsum);
    rc = cuda_launched(op, "weight_sum_kernel");
  }
  if (!rc) {
    struct kiln_cuda_launch l = grid_for(dev, P);
    nll_backward_kernel<T><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(
        (T *)kiln_tensor_data(c->out), (const T *)kiln_tensor_data(g), (const int64_t *)kiln_tensor_data(target), w,
        logp ? (const T *)kiln_tensor_data(logp) : NULL, P, C, S, c->ints[1], (int)c->ints[0], (int)c->ints[2],
        c->scalar[0], c->scalar[1], wsum);
    rc = cuda_launched(op, "nll_backward_kernel");
  }
  kiln_tensor_release(scratch);
  return rc;
}

extern "C" int cuda_nll_loss_backward(const struct kiln_call *c) {
  const char *op = kiln_op_name(c->op);
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, c->out)) return kiln_error_code();
  if (c->ints[2] && !c->in[3])
    return cuda_fail(KILN_ERR_ARGUMENT, "cross_entropy_backward: the saved log_softmax is missing");
  int dt = c->out->dtype;
  struct kiln_tensor *g = cuda_contiguous_as(c->in[0], dt, op);
  struct kiln_tensor *target = g ? cuda_contiguous_as(c->in[1], KILN_I64, op) : NULL;
  struct kiln_tensor *weight = target && c->in[2] ? cuda_contiguous_as(c->in[2], dt, op) : NULL;
  struct kiln_tensor *logp = target && c->in[3] ? cuda_contiguous_as(c->in[3], dt, op) : NULL;
  int rc = KILN_OK;
  if (!g || !target || (c->in[2] && !weight) || (c->in[3] && !logp)) rc = kiln_error_code();
  else if (dt == KILN_F32) rc = nll_backward<float>(dev, c, g, target, weight, logp, op);
  else rc = nll_backward<double>(dev, c, g, target, weight, logp, op);
  kiln_tensor_release(g);
  kiln_tensor_release(target);
  kiln_tensor_release(weight);
  kiln_tensor_release(logp);
  return rc;
}
