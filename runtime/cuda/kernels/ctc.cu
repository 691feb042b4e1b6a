/* cuda/ctc.cu: connectionist temporal classification on CUDA, with the semantics of cpu/ctc.c and
   its calls (nn_calls.h), so that the front end (nn.c: checks, packing of the labels, the
   infeasible-sample error) and autograd run unchanged. One block per sample: its threads take the
   2S + 1 positions of the extended target, one time step after another with a barrier between
   (alpha forward, beta backward); the gradient of a step is one thread per class. alpha lives in
   the forward's log_alpha (dtype of log_probs, [N,T,W]), beta in two rows of doubles per sample.
   Per-position arithmetic is ctc.cuh's, in double. The reduced loss is summed by one thread in the
   order of the samples, as the CPU does. */
#include "kernels.cuh"
#include "ctc.cuh"
#include "nn_calls.h"

using namespace kiln_k;
using kiln_ctc::problem;

/* ---- kernels: a block per sample (striding over samples when there are more than blocks) ---- */

/* alpha of every step, then the nll (and, without reduction, the loss) of the sample. */
template <class T> __global__ void ctc_forward_kernel(problem<T> p, T *loss) {
  for (int64_t n = blockIdx.x; n < p.N; n += gridDim.x) {
    int64_t Tn = kiln_ctc::input_length(p, n), E = 2 * kiln_ctc::target_length(p, n) + 1;
    for (int64_t t = 0; t < Tn; t++) {
      for (int64_t s = threadIdx.x; s < E; s += blockDim.x) kiln_ctc::alpha_at<T>(p, n, t, s);
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      p.nll[n] = (T)kiln_ctc::nll_of<T>(p, n);
      if (loss) loss[n] = (T)kiln_ctc::loss_of<T>(p, n);
    }
  }
}

/* out[0]: the mean or sum of the losses, by one thread. */
template <class T> __global__ void ctc_reduce_kernel(problem<T> p, T *out) { out[0] = (T)kiln_ctc::reduced_loss<T>(p); }

/* Zeros past the sample's input length (everywhere when its gradient is zero), then beta and the
   gradient of each step, last first. */
template <class T> __global__ void ctc_backward_kernel(problem<T> p) {
  for (int64_t n = blockIdx.x; n < p.N; n += gridDim.x) {
    int64_t Tn = kiln_ctc::input_length(p, n), E = 2 * kiln_ctc::target_length(p, n) + 1;
    bool zero = kiln_ctc::grad_is_zero<T>(p, n);
    int64_t from = zero ? 0 : Tn;
    for (int64_t i = threadIdx.x; i < (p.T_ - from) * p.C; i += blockDim.x)
      p.grad[((from + i / p.C) * p.N + n) * p.C + i % p.C] = (T)0;
    if (zero) continue;
    for (int64_t t = Tn - 1; t >= 0; t--) {
      for (int64_t s = threadIdx.x; s < E; s += blockDim.x) kiln_ctc::beta_at<T>(p, n, t, s);
      __syncthreads();
      for (int64_t c = threadIdx.x; c < p.C; c += blockDim.x) kiln_ctc::grad_at<T>(p, n, t, c);
      /* the next step overwrites the row this one read (beta_{t+1}) */
      __syncthreads();
    }
  }
}

/* ---- on the host ---- */

static int float_only(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_F32 || t->dtype == KILN_F64) return KILN_OK;
  return cuda_fail(KILN_ERR_DTYPE, "%s: %s tensors are not supported on cuda (f32 or f64; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

template <class T>
static problem<T> problem_of(const struct kiln_call *c, const struct kiln_tensor *lp, const struct kiln_tensor *labels) {
  problem<T> p = {};
  p.T_ = lp->sizes[0]; p.N = lp->sizes[1]; p.C = lp->sizes[2];
  p.S = labels->sizes[1] - 2; p.W = 2 * p.S + 1;
  p.blank = c->ints[0]; p.reduction = (int)c->ints[1]; p.zero_infinity = (int)c->ints[2];
  p.lp = (const T *)kiln_tensor_data(lp);
  p.labels = (const int64_t *)kiln_tensor_data(labels);
  return p;
}

template <class T>
static int ctc_forward(struct cuda_device *dev, const struct kiln_call *c, const struct kiln_tensor *lp,
                       const struct kiln_tensor *labels, const char *op) {
  const struct kiln_ctc_extra *ex = (const struct kiln_ctc_extra *)c->extra;
  problem<T> p = problem_of<T>(c, lp, labels);
  p.nll = (T *)kiln_tensor_data(ex->nll);
  p.alpha = (T *)kiln_tensor_data(ex->log_alpha);
  int none = p.reduction == KILN_REDUCTION_NONE, rc = KILN_OK;
  if (p.N > 0) {
    int threads = kiln_ctc::threads_for(p.W, 1);
    ctc_forward_kernel<T><<<blocks_for(dev, p.N, threads), threads, 0, dev->stream>>>(
        p, none ? (T *)kiln_tensor_data(c->out) : NULL);
    rc = cuda_launched(op, "ctc_forward_kernel");
  }
  if (!rc && !none) {
    ctc_reduce_kernel<T><<<1, 1, 0, dev->stream>>>(p, (T *)kiln_tensor_data(c->out));
    rc = cuda_launched(op, "ctc_reduce_kernel");
  }
  return rc;
}

extern "C" int cuda_ctc_loss(const struct kiln_call *c) {
  const char *op = "ctc_loss";
  const struct kiln_ctc_extra *ex = (const struct kiln_ctc_extra *)c->extra;
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, c->in[0])) return kiln_error_code();
  int dt = c->in[0]->dtype;
  if (!ex || !ex->nll || !ex->log_alpha || ex->nll->dtype != dt || ex->log_alpha->dtype != dt || c->out->dtype != dt)
    return cuda_fail(KILN_ERR_ARGUMENT, "ctc_loss: the outputs do not match log_probs %s", kiln_shape_string(c->in[0]));
  struct kiln_tensor *lp = cuda_contiguous_as(c->in[0], dt, op);
  struct kiln_tensor *labels = lp ? cuda_contiguous_as(c->in[1], KILN_I64, op) : NULL;
  int rc;
  if (!lp || !labels) rc = kiln_error_code();
  else if (dt == KILN_F32) rc = ctc_forward<float>(dev, c, lp, labels, op);
  else rc = ctc_forward<double>(dev, c, lp, labels, op);
  kiln_tensor_release(lp);
  kiln_tensor_release(labels);
  return rc;
}

template <class T>
static int ctc_backward(struct cuda_device *dev, const struct kiln_call *c, const struct kiln_tensor *g,
                        const struct kiln_tensor *lp, const struct kiln_tensor *labels, const struct kiln_tensor *nll,
                        const struct kiln_tensor *alpha, const char *op) {
  problem<T> p = problem_of<T>(c, lp, labels);
  if (c->out->numel == 0) return KILN_OK;
  p.g = (const T *)kiln_tensor_data(g);
  p.nll = (T *)kiln_tensor_data(nll);      /* read only */
  p.alpha = (T *)kiln_tensor_data(alpha);  /* read only */
  p.grad = (T *)kiln_tensor_data(c->out);
  struct kiln_tensor *scratch = cuda_scratch((int64_t)sizeof(double) * p.N * 2 * p.W, c->out->device);
  if (!scratch) return kiln_error_code();
  p.beta = (double *)kiln_tensor_data(scratch);
  int threads = kiln_ctc::threads_for(p.W, p.C);
  ctc_backward_kernel<T><<<blocks_for(dev, p.N, threads), threads, 0, dev->stream>>>(p);
  int rc = cuda_launched(op, "ctc_backward_kernel");
  kiln_tensor_release(scratch);
  return rc;
}

extern "C" int cuda_ctc_loss_backward(const struct kiln_call *c) {
  const char *op = "ctc_loss_backward";
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, c->out)) return kiln_error_code();
  if (!c->extra) return cuda_fail(KILN_ERR_ARGUMENT, "ctc_loss_backward: the saved forward variables are missing");
  int dt = c->out->dtype;
  struct kiln_tensor *g = cuda_contiguous_as(c->in[0], dt, op);
  struct kiln_tensor *lp = g ? cuda_contiguous_as(c->in[1], dt, op) : NULL;
  struct kiln_tensor *labels = lp ? cuda_contiguous_as(c->in[2], KILN_I64, op) : NULL;
  struct kiln_tensor *nll = labels ? cuda_contiguous_as(c->in[3], dt, op) : NULL;
  struct kiln_tensor *alpha = nll ? cuda_contiguous_as((const struct kiln_tensor *)c->extra, dt, op) : NULL;
  int rc;
  if (!alpha) rc = kiln_error_code();
  else if (dt == KILN_F32) rc = ctc_backward<float>(dev, c, g, lp, labels, nll, alpha, op);
  else rc = ctc_backward<double>(dev, c, g, lp, labels, nll, alpha, op);
  kiln_tensor_release(g);
  kiln_tensor_release(lp);
  kiln_tensor_release(labels);
  kiln_tensor_release(nll);
  kiln_tensor_release(alpha);
  return rc;
}
