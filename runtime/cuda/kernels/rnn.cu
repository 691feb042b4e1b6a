/* cuda/rnn.cu: one recurrent layer on CUDA (kiln/rnn.h), forward and backward through time, with
   the semantics of cpu/rnn_impl.h's GEMM path and the same calls (rnn_calls.h), reserve and
   outputs, so that rnn.c and autograd run unchanged. The input projection of every step is one
   cuBLAS product; each step a product of the states with w_hh, then one fused kernel over [B,H]
   for the gates (rnn.cuh). Backward: per step (last first) a fused kernel for the gates' grads
   and a product with w_hh for the grad of the state before it; then the grads of x, w_ih and
   w_hh as single products and the bias grads as column sums. f32 products are exact (the
   handle's default math: no TF32), f64 computes in f64. The persistent algorithm is a CPU one;
   the algorithm KILN_RNN_CUDNN goes to rnn_cudnn.cu (cuDNN's RNN API) instead, every other layer
   runs this path. Lengths arrive on the CPU and are copied once per call. */
#include "kernels.cuh"
#include "rnn.cuh"
#include "rnn_calls.h"
#include <cublas_v2.h>
#include <limits.h>

using namespace kiln_k;
using kiln_rnn::layer;

/* ---- kernels: one thread per (b, j) of a step, or per element of a whole buffer ---- */

template <class T> __global__ void rnn_step_kernel(layer<T> L, int64_t s) {
  KILN_GRID_LOOP(i, L.B * L.H) kiln_rnn::forward_at<T>(L, s, i / L.H, i % L.H);
}

template <class T> __global__ void rnn_step_backward_kernel(layer<T> L, int64_t s) {
  KILN_GRID_LOOP(i, L.B * L.H) kiln_rnn::backward_at<T>(L, s, i / L.H, i % L.H);
}

template <class T> __global__ void rnn_carry_kernel(layer<T> L, int64_t s) {
  KILN_GRID_LOOP(i, L.B * L.H) kiln_rnn::carry_at<T>(L, s, i / L.H, i % L.H);
}

/* xp rows = b_ih (or zeros), before the projection adds to them */
template <class T> __global__ void rnn_bias_rows_kernel(T *xp, const T *b, int64_t n, int64_t GH) {
  KILN_GRID_LOOP(i, n) xp[i] = b ? b[i % GH] : (T)0;
}

/* hprev [T,B,H]: the state each step read */
template <class T> __global__ void rnn_hprev_kernel(layer<T> L, T *hprev) {
  int64_t BH = L.B * L.H;
  KILN_GRID_LOOP(i, L.T_ * BH) {
    int64_t t = i / BH, r = i - t * BH;
    hprev[i] = kiln_rnn::hprev_at<T>(L, t, r / L.H, r % L.H);
  }
}

template <class T> __global__ void rnn_column_sum_kernel(const T *m, int64_t rows, int64_t n, T *out) {
  KILN_GRID_LOOP(q, n) out[q] = kiln_rnn::column_sum<T>(m, rows, n, q);
}

/* ---- the pieces on the host ---- */

struct ctx {
  struct cuda_device *dev;
  cublasHandle_t blas;
  const char *op;
  struct kiln_device where;
  int dtype;
};

static int blas_failed(const struct ctx *x, cublasStatus_t s, const char *call) {
  return cuda_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? KILN_ERR_MEMORY : KILN_ERR_DEVICE, "%s: %s: %s (%s)", x->op, call,
                   cublasGetStatusString(s), cublasGetStatusName(s));
}

/* Row-major C[M,N] = alpha op(A) op(B) + beta C, op(A) [M,K], op(B) [K,N], as kiln_cpu_gemm_raw
   takes it (rnn.cuh's blas_call_of turns it into cuBLAS's column-major call). */
template <class T>
static int gemm(const struct ctx *x, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const T *A, int64_t lda,
                const T *B, int64_t ldb, double beta, T *C, int64_t ldc) {
  if (M == 0 || N == 0) return KILN_OK;
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
    return cuda_fail(KILN_ERR_UNSUPPORTED, "%s: a product of [%lld,%lld] x [%lld,%lld] is beyond cuBLAS's 32-bit sizes",
                     x->op, (long long)M, (long long)K, (long long)K, (long long)N);
  const bool f64 = sizeof(T) == 8;
  double a64 = alpha, b64 = beta;
  float a32 = (float)alpha, b32 = (float)beta;
  cudaDataType_t type = f64 ? CUDA_R_64F : CUDA_R_32F;
  struct kiln_rnn::blas_call b = kiln_rnn::blas_call_of(ta, tb, M, N, K, lda, ldb, ldc);
  cublasStatus_t s = cublasGemmEx(x->blas, b.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N, b.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  (int)b.m, (int)b.n, (int)b.k, f64 ? (const void *)&a64 : (const void *)&a32, B, type,
                                  (int)b.ld_first, A, type, (int)b.ld_second, f64 ? (const void *)&b64 : (const void *)&b32,
                                  C, type, (int)b.ldc, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) return blas_failed(x, s, "cublasGemmEx");
  return cuda_launched(x->op, "cublasGemmEx");
}

/* A device buffer of n elements of the layer's dtype (at least one), owned by the caller. */
static struct kiln_tensor *buffer(const struct ctx *x, int64_t n, struct kiln_tensor **keep) {
  int64_t m = n > 0 ? n : 1;
  *keep = kiln_tensor_empty(1, &m, x->dtype, x->where);
  return *keep;
}

template <class T> static T *data(const struct kiln_tensor *t) { return t ? (T *)kiln_tensor_data(t) : NULL; }

static int zero(const struct ctx *x, void *p, int64_t bytes, const char *what) {
  if (bytes <= 0) return KILN_OK;
  return cuda_check(cudaMemsetAsync(p, 0, (size_t)bytes, x->dev->stream), x->op, what);
}

static int copy_d2d(const struct ctx *x, void *dst, const void *src, int64_t bytes, const char *what) {
  if (bytes <= 0) return KILN_OK;
  return cuda_check(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, x->dev->stream), x->op, what);
}

/* The lengths (i64 [B] on the CPU, contiguous, maybe pinned) on the device, or NULL for none. */
static int lengths_on_device(const struct ctx *x, const struct kiln_tensor *len, struct kiln_tensor **out) {
  *out = NULL;
  if (!len) return KILN_OK;
  int64_t B = len->sizes[0];
  if (!(*out = kiln_tensor_empty(1, &B, KILN_I64, x->where))) return kiln_error_code();
  return cuda_upload(x->dev, kiln_tensor_data(*out), kiln_tensor_data(len), sizeof(int64_t) * (size_t)B, x->op,
                     "cudaMemcpyAsync (lengths to the device)");
}

static int enter(struct ctx *x, const struct kiln_rnn_tensors *t, const char *op) {
  x->op = op;
  x->where = t->x->device;
  x->dtype = t->x->dtype;
  if (!(x->dev = cuda_device_enter(x->where.index, op))) return kiln_error_code();
  if (x->dtype != KILN_F32 && x->dtype != KILN_F64)
    return cuda_fail(KILN_ERR_DTYPE, "%s: input %s is %s (expected f32 or f64)", op, kiln_shape_string(t->x),
                     kiln_dtype_name(x->dtype));
  void *h = NULL;
  if (cuda_blas_handle(x->dev, &h)) return kiln_error_code();
  x->blas = (cublasHandle_t)h;
  return KILN_OK;
}

/* The fields every pass fills in from the call. */
template <class T> static layer<T> layer_of(int mode, int reverse, const struct kiln_rnn_tensors *t, const int64_t *len) {
  layer<T> L;
  memset(&L, 0, sizeof L);
  L.mode = mode;
  L.reverse = reverse;
  L.T_ = t->x->sizes[0];
  L.B = t->x->sizes[1];
  L.H = t->w_hh->sizes[1];
  L.GH = kiln_rnn_gates(mode) * L.H;
  L.RS = kiln_rnn_reserve(mode);
  L.len = len;
  L.h0 = data<T>(t->h0);
  L.c0 = data<T>(t->c0);
  L.b_hh = data<T>(t->b_hh);
  return L;
}

/* ---- forward ---- */

template <class T> static int forward(const struct ctx *x, const struct kiln_call *c) {
  const struct kiln_rnn_forward *f = (const struct kiln_rnn_forward *)c->extra;
  const struct kiln_rnn_tensors *t = &f->t;
  int mode = (int)c->ints[0];
  struct kiln_tensor *len = NULL, *xp = NULL, *hh = NULL, *h = NULL, *hn = NULL, *cs = NULL;
  int rc = lengths_on_device(x, t->lengths, &len);
  layer<T> L = layer_of<T>(mode, (int)c->ints[1], t, data<int64_t>(len));
  int64_t T_ = L.T_, B = L.B, H = L.H, GH = L.GH, I = t->x->sizes[2], BH = B * H;
  size_t es = sizeof(T);
  if (!rc && (!buffer(x, T_ * B * GH, &xp) || !buffer(x, B * GH, &hh) || !buffer(x, BH, &h) || !buffer(x, BH, &hn) ||
              !buffer(x, BH, &cs)))
    rc = kiln_error_code();
  if (rc) goto done;
  L.xp = data<T>(xp); L.hh = data<T>(hh); L.h = data<T>(h); L.hnext = data<T>(hn); L.c = data<T>(cs);
  L.z = data<T>(c->out); L.res = data<T>(f->reserve);
  rc = zero(x, L.z, c->out->numel * (int64_t)es, "cudaMemsetAsync (Z)");
  if (!rc) {   /* the input projection of every step: one product onto b_ih */
    struct kiln_cuda_launch l = grid_for(x->dev, T_ * B * GH);
    rnn_bias_rows_kernel<T><<<(unsigned)l.blocks, l.threads, 0, x->dev->stream>>>(data<T>(xp), data<T>(t->b_ih), T_ * B * GH, GH);
    rc = cuda_launched(x->op, "rnn_bias_rows_kernel");
  }
  if (!rc && I > 0) rc = gemm<T>(x, 0, 1, T_ * B, GH, I, 1.0, data<T>(t->x), I, data<T>(t->w_ih), I, 1.0, data<T>(xp), GH);
  if (!rc) rc = L.h0 ? copy_d2d(x, L.h, L.h0, BH * (int64_t)es, "cudaMemcpyAsync (h0)") : zero(x, L.h, BH * (int64_t)es, "cudaMemsetAsync (h0)");
  if (!rc) rc = L.c0 ? copy_d2d(x, L.c, L.c0, BH * (int64_t)es, "cudaMemcpyAsync (c0)") : zero(x, L.c, BH * (int64_t)es, "cudaMemsetAsync (c0)");
  for (int64_t s = 0; !rc && s < T_; s++) {
    rc = gemm<T>(x, 0, 1, B, GH, H, 1.0, L.h, H, data<T>(t->w_hh), H, 0.0, (T *)L.hh, GH);
    if (rc) break;
    struct kiln_cuda_launch l = grid_for(x->dev, BH);
    rnn_step_kernel<T><<<(unsigned)l.blocks, l.threads, 0, x->dev->stream>>>(L, s);
    rc = cuda_launched(x->op, "rnn_step_kernel");
    T *swap = L.h; L.h = L.hnext; L.hnext = swap;
  }
  if (!rc) rc = copy_d2d(x, L.z + T_ * BH, L.h, BH * (int64_t)es, "cudaMemcpyAsync (final state)");
  if (!rc && mode == KILN_RNN_LSTM) rc = copy_d2d(x, L.z + (T_ + 1) * BH, L.c, BH * (int64_t)es, "cudaMemcpyAsync (final cell)");
done:
  kiln_tensor_release(len); kiln_tensor_release(xp); kiln_tensor_release(hh);
  kiln_tensor_release(h); kiln_tensor_release(hn); kiln_tensor_release(cs);
  return rc;
}

/* The algorithm KILN_RNN_CUDNN goes to rnn_cudnn.cu, in a build with cuDNN. */
#ifndef KILN_HAVE_CUDNN
static int no_cudnn(const struct kiln_call *c) {
  return cuda_fail(KILN_ERR_UNSUPPORTED, "%s: the cudnn algorithm: this build of the CUDA backend has no cuDNN",
                   kiln_op_name(c->op));
}
#endif

extern "C" int cuda_rnn(const struct kiln_call *c) {
  const struct kiln_rnn_forward *f = (const struct kiln_rnn_forward *)c->extra;
#ifdef KILN_HAVE_CUDNN
  if (c->ints[2] == KILN_RNN_CUDNN) return cuda_rnn_cudnn(c);
#else
  if (c->ints[2] == KILN_RNN_CUDNN) return no_cudnn(c);
#endif
  struct ctx x;
  if (enter(&x, &f->t, kiln_op_name(c->op))) return kiln_error_code();
  return x.dtype == KILN_F32 ? forward<float>(&x, c) : forward<double>(&x, c);
}

/* ---- backward ---- */

template <class T> static int backward(const struct ctx *x, const struct kiln_call *c) {
  const struct kiln_rnn_backward *bw = (const struct kiln_rnn_backward *)c->extra;
  const struct kiln_rnn_tensors *t = &bw->t;
  int mode = (int)c->ints[0];
  struct kiln_tensor *len = NULL, *dgx = NULL, *dgh = NULL, *dgs = NULL, *dh = NULL, *dc = NULL, *prod = NULL, *hprev = NULL;
  int rc = lengths_on_device(x, t->lengths, &len);
  layer<T> L = layer_of<T>(mode, (int)c->ints[1], t, data<int64_t>(len));
  int64_t T_ = L.T_, B = L.B, H = L.H, GH = L.GH, I = t->x->sizes[2], BH = B * H, TB = T_ * B;
  int64_t es = (int64_t)sizeof(T);
  bool gru = mode == KILN_RNN_GRU;
  if (!rc && (!buffer(x, TB * GH, &dgx) || (gru && !buffer(x, TB * GH, &dgh)) || !buffer(x, B * GH, &dgs) ||
              !buffer(x, BH, &dh) || !buffer(x, BH, &dc) || !buffer(x, BH, &prod) || (bw->gw_hh && !buffer(x, TB * H, &hprev))))
    rc = kiln_error_code();
  if (rc) goto done;
  L.z = data<T>(bw->z); L.res = data<T>(bw->reserve); L.gz = data<T>(bw->gz);
  L.dgx = data<T>(dgx); L.dgh = gru ? data<T>(dgh) : L.dgx; L.dgs = data<T>(dgs);
  L.dh = data<T>(dh); L.dc = data<T>(dc); L.prod = data<T>(prod);
  /* rows of finished sequences are never written: zeros */
  rc = zero(x, L.dgx, TB * GH * es, "cudaMemsetAsync (gate grads)");
  if (!rc && gru) rc = zero(x, L.dgh, TB * GH * es, "cudaMemsetAsync (gate grads)");
  if (!rc) rc = copy_d2d(x, L.dh, L.gz + T_ * BH, BH * es, "cudaMemcpyAsync (grad of the final state)");
  if (!rc) rc = mode == KILN_RNN_LSTM ? copy_d2d(x, L.dc, L.gz + (T_ + 1) * BH, BH * es, "cudaMemcpyAsync (grad of the final cell)")
                                      : zero(x, L.dc, BH * es, "cudaMemsetAsync (cell grad)");
  for (int64_t s = T_ - 1; !rc && s >= 0; s--) {
    struct kiln_cuda_launch l = grid_for(x->dev, BH);
    rnn_step_backward_kernel<T><<<(unsigned)l.blocks, l.threads, 0, x->dev->stream>>>(L, s);
    rc = cuda_launched(x->op, "rnn_step_backward_kernel");
    if (!rc) rc = gemm<T>(x, 0, 0, B, H, GH, 1.0, L.dgs, GH, data<T>(t->w_hh), H, 0.0, data<T>(prod), H);
    if (!rc) {
      rnn_carry_kernel<T><<<(unsigned)l.blocks, l.threads, 0, x->dev->stream>>>(L, s);
      rc = cuda_launched(x->op, "rnn_carry_kernel");
    }
  }
  if (!rc && bw->gh0) rc = copy_d2d(x, kiln_tensor_data(bw->gh0), L.dh, BH * es, "cudaMemcpyAsync (grad of h0)");
  if (!rc && bw->gc0) rc = copy_d2d(x, kiln_tensor_data(bw->gc0), L.dc, BH * es, "cudaMemcpyAsync (grad of c0)");
  if (!rc && bw->gx && I > 0) rc = gemm<T>(x, 0, 0, TB, I, GH, 1.0, L.dgx, GH, data<T>(t->w_ih), I, 0.0, data<T>(bw->gx), I);
  if (!rc && bw->gw_ih && I > 0) rc = gemm<T>(x, 1, 0, GH, I, TB, 1.0, L.dgx, GH, data<T>(t->x), I, 0.0, data<T>(bw->gw_ih), I);
  if (!rc && bw->gw_hh) {
    struct kiln_cuda_launch l = grid_for(x->dev, TB * H);
    rnn_hprev_kernel<T><<<(unsigned)l.blocks, l.threads, 0, x->dev->stream>>>(L, data<T>(hprev));
    rc = cuda_launched(x->op, "rnn_hprev_kernel");
    if (!rc) rc = gemm<T>(x, 1, 0, GH, H, TB, 1.0, L.dgh, GH, data<T>(hprev), H, 0.0, data<T>(bw->gw_hh), H);
  }
  for (int k = 0; !rc && k < 2; k++) {
    struct kiln_tensor *gb = k ? bw->gb_hh : bw->gb_ih;
    if (!gb) continue;
    struct kiln_cuda_launch l = grid_for(x->dev, GH);
    rnn_column_sum_kernel<T><<<(unsigned)l.blocks, l.threads, 0, x->dev->stream>>>(k ? L.dgh : L.dgx, TB, GH, data<T>(gb));
    rc = cuda_launched(x->op, "rnn_column_sum_kernel");
  }
done:
  kiln_tensor_release(len); kiln_tensor_release(dgx); kiln_tensor_release(dgh); kiln_tensor_release(dgs);
  kiln_tensor_release(dh); kiln_tensor_release(dc); kiln_tensor_release(prod); kiln_tensor_release(hprev);
  return rc;
}

extern "C" int cuda_rnn_backward(const struct kiln_call *c) {
  const struct kiln_rnn_backward *bw = (const struct kiln_rnn_backward *)c->extra;
#ifdef KILN_HAVE_CUDNN
  if (c->ints[2] == KILN_RNN_CUDNN) return cuda_rnn_cudnn_backward(c);
#else
  if (c->ints[2] == KILN_RNN_CUDNN) return no_cudnn(c);
#endif
  struct ctx x;
  if (enter(&x, &bw->t, kiln_op_name(c->op))) return kiln_error_code();
  return x.dtype == KILN_F32 ? backward<float>(&x, c) : backward<double>(&x, c);
}
