/* cuda/rnn_cudnn.cu: one recurrent layer (kiln/rnn.h) through cuDNN 9's RNN API, the algorithm
   KILN_RNN_CUDNN, with the semantics of the CPU path: the same Z [T+S,B,H] (zeros past each
   sequence's end), the same grads of x, h0, c0, w_ih, w_hh, b_ih and b_hh.
   The network: cudnnSetRNNDescriptor_v8 with the standard algorithm, one layer, one direction,
   linear input, two bias vectors (b_ih and b_hh, as PyTorch), data and math in the tensors'
   dtype (f32 or f64), CUDNN_FMA_MATH for f32 (no TF32 tensor cores: f32 stays exact), padded IO; the
   sequences in CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED ([T,B,N], kiln's layout) with their
   lengths (any order) and padding filled with 0.
   The weights: w_ih, w_hh, b_ih and b_hh are copied gate by gate into cuDNN's weight space at
   the addresses cudnnGetRNNWeightParams gives for each linLayerID (rnn_cudnn.h maps PyTorch's
   gates to them); their grads come back the same way from a zeroed weight-space grad that
   cudnnRNNBackwardWeights_v8 adds into.
   The reserve: cuDNN's reserve space has its own size, known here only: the forward makes one
   u8 tensor holding the packed weight space (at 0) and the reserve space (at an aligned offset),
   hands it to rnn.c as the layer's reserve (rnn_calls.h's cudnn_reserve), and the backward runs
   on exactly those weights and that reserve. When no grad is wanted the forward runs in cuDNN's
   inference mode and hands nothing back.
   Reverse layers: cuDNN runs this direction forward on the input with every sequence reversed
   within its own length (rnn_gather_kernel; the map is its own inverse), and the outputs (and
   in the backward their grads and the grad of x) are reversed back; the final states need no
   reversal. One cuDNN handle per device for these layers, on the device's stream; workspaces
   come from the caching allocator. Built only when CMake found cuDNN (KILN_HAVE_CUDNN). */
#include "kernels.cuh"
#include "rnn_calls.h"
#include "rnn_cudnn.h"
#include "rnn_cudnn_desc.h"
#include <cudnn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

using namespace kiln_k;

enum { RESERVE_ALIGN = 256 };   /* the offset of cuDNN's reserve space in the saved tensor */

static const char *const mode_names[] = {"rnn_tanh", "rnn_relu", "gru", "lstm"};

/* [T,B,N] gathered from [T,B,N]: every sequence reversed within its length (reverse), the
   padding copied (kiln_rnn_cudnn_reversed_index) or zeroed (zero_padding: the output grads as
   cuDNN reads them, kiln_rnn_cudnn_grad_index); len: [B] or NULL (all T). */
template <class T> __global__ void rnn_gather_kernel(T *dst, const T *src, int64_t steps, int64_t B, int64_t N, const int64_t *len,
                                                     int reverse, int zero_padding) {
  KILN_GRID_LOOP(i, steps * B * N) {
    int64_t k = zero_padding ? kiln_rnn_cudnn_grad_index(i, steps, B, N, len, reverse)
                             : reverse ? kiln_rnn_cudnn_reversed_index(i, steps, B, N, len) : i;
    dst[i] = k < 0 ? T(0) : src[k];
  }
}

/* One call's descriptors, sizes and buffers. */
struct plan {
  char op[64];                    /* "rnn (lstm, cudnn)": the op in every message */
  struct cuda_device *dev;
  cudnnHandle_t h;
  struct kiln_device where;
  int mode, reverse, dtype;
  int64_t T_, B, I, H, G;
  size_t es;
  struct kiln_rnn_cudnn_desc d;   /* the network, the sequences and the states (rnn_cudnn_desc.h) */
  cudnnTensorDescriptor_t md, bd;   /* what cudnnGetRNNWeightParams describes */
  struct kiln_tensor *len32;      /* int32 [B] on the device (cuDNN's devSeqLengths) */
  struct kiln_tensor *len64;      /* i64 [B] on the device (the gather kernels), or NULL: all T */
  size_t weight_bytes, work_bytes, reserve_bytes, reserve_offset;
};

static int dnn_check(const struct plan *p, cudnnStatus_t s, const char *call) {
  if (s == CUDNN_STATUS_SUCCESS) return KILN_OK;
  int code = s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED || s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
               ? KILN_ERR_MEMORY
               : CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_NOT_SUPPORTED ? KILN_ERR_UNSUPPORTED   /* cuDNN 9: _SHAPE, _LAYOUT, ... */
               : KILN_ERR_DEVICE;
  return cuda_fail(code, "%s: %s: %s (cuDNN status %d)", p->op, call, cudnnGetErrorString(s), (int)s);
}

/* The device's cuDNN handle for recurrent layers, on its stream: made at the first layer and kept
   for the process, like the convolutions' (conv.cu), but apart from theirs so that neither file
   depends on the other's handle, lock or algorithm table. */
static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;

static int rnn_handle(struct plan *p) {
  int rc = KILN_OK;
  pthread_mutex_lock(&handle_lock);
  if (!p->dev->dnn_rnn) {
    cudnnHandle_t h = NULL;
    rc = dnn_check(p, cudnnCreate(&h), "cudnnCreate");
    if (!rc) rc = dnn_check(p, cudnnSetStream(h, p->dev->stream), "cudnnSetStream");
    if (rc && h) cudnnDestroy(h);
    if (!rc) p->dev->dnn_rnn = (void *)h;
  }
  p->h = (cudnnHandle_t)p->dev->dnn_rnn;
  pthread_mutex_unlock(&handle_lock);
  return rc;
}

static void plan_release(struct plan *p) {
  kiln_rnn_cudnn_desc_release(&p->d);
  if (p->md) cudnnDestroyTensorDescriptor(p->md);
  if (p->bd) cudnnDestroyTensorDescriptor(p->bd);
  kiln_tensor_release(p->len32);
  kiln_tensor_release(p->len64);
}

static int copy_d2d(const struct plan *p, void *dst, const void *src, size_t bytes, const char *what) {
  if (!bytes) return KILN_OK;
  return cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, p->dev->stream), p->op, what);
}

static int zero(const struct plan *p, void *dst, size_t bytes, const char *what) {
  if (!bytes) return KILN_OK;
  return cuda_check(cudaMemsetAsync(dst, 0, bytes, p->dev->stream), p->op, what);
}

/* The lengths: int32 on the host (for the data descriptors) and on the device; i64 on the
   device for the gather kernels. */
static int lengths(struct plan *p, const struct kiln_tensor *len, int32_t *host) {
  const int64_t *l = len ? (const int64_t *)kiln_tensor_data(len) : NULL;
  for (int64_t b = 0; b < p->B; b++) host[b] = (int32_t)(l ? l[b] : p->T_);
  int64_t B = p->B;
  if (!(p->len32 = kiln_tensor_empty(1, &B, KILN_I32, p->where))) return kiln_error_code();
  int rc = cuda_check(cudaMemcpyAsync(kiln_tensor_data(p->len32), host, sizeof(int32_t) * (size_t)B, cudaMemcpyHostToDevice,
                                      p->dev->stream), p->op, "cudaMemcpyAsync (lengths to the device)");
  /* host is pageable: the copy has read it when the call returns */
  if (rc || !l) return rc;
  if (!(p->len64 = kiln_tensor_empty(1, &B, KILN_I64, p->where))) return kiln_error_code();
  return cuda_upload(p->dev, kiln_tensor_data(p->len64), l, sizeof(int64_t) * (size_t)B, p->op,
                     "cudaMemcpyAsync (lengths to the device)");   /* the lengths tensor may be pinned */
}

/* Everything both passes need: the device, the handle, the descriptors and cuDNN's sizes. */
static int plan_make(struct plan *p, const struct kiln_call *c, const struct kiln_rnn_tensors *t, cudnnForwardMode_t fwd) {
  memset(p, 0, sizeof *p);
  p->mode = (int)c->ints[0];
  p->reverse = (int)c->ints[1];
  snprintf(p->op, sizeof p->op, "%s (%s, cudnn)", kiln_op_name(c->op),
           p->mode >= 0 && p->mode <= 3 ? mode_names[p->mode] : "?");
  p->where = t->x->device;
  p->dtype = t->x->dtype;
  p->T_ = t->x->sizes[0];
  p->B = t->x->sizes[1];
  p->I = t->x->sizes[2];
  p->H = t->w_hh->sizes[1];
  p->G = kiln_rnn_gates(p->mode);
  if (!(p->dev = cuda_device_enter(p->where.index, p->op))) return kiln_error_code();
  if (p->dtype != KILN_F32 && p->dtype != KILN_F64)
    return cuda_fail(KILN_ERR_DTYPE, "%s: input %s is %s (cuDNN's RNN here runs f32 and f64)", p->op,
                     kiln_shape_string(t->x), kiln_dtype_name(p->dtype));
  if (p->T_ > INT_MAX || p->B > INT_MAX || p->I > INT_MAX || p->H > INT_MAX || p->I < 1 ||
      p->T_ * p->B * (p->I > p->H ? p->I : p->H) > INT_MAX)
    return cuda_fail(KILN_ERR_UNSUPPORTED, "%s: input %s with hidden size %lld is beyond cuDNN's 32-bit sizes (or has no features)",
                     p->op, kiln_shape_string(t->x), (long long)p->H);
  p->es = kiln_dtype_size(p->dtype);
  if (rnn_handle(p)) return kiln_error_code();

  int32_t *host = (int32_t *)malloc(sizeof(int32_t) * (size_t)p->B);
  if (!host) return cuda_fail(KILN_ERR_MEMORY, "%s: out of host memory for %lld lengths", p->op, (long long)p->B);
  int rc = lengths(p, t->lengths, host);
  if (!rc) {
    cudnnStatus_t s = kiln_rnn_cudnn_describe(&p->d, p->h, p->mode, p->dtype, (int)p->T_, (int)p->B, (int)p->I, (int)p->H, host);
    rc = dnn_check(p, s, p->d.call ? p->d.call : "kiln_rnn_cudnn_describe");
  }
  if (!rc) rc = dnn_check(p, cudnnCreateTensorDescriptor(&p->md), "cudnnCreateTensorDescriptor");
  if (!rc) rc = dnn_check(p, cudnnCreateTensorDescriptor(&p->bd), "cudnnCreateTensorDescriptor");
  free(host);
  if (!rc) rc = dnn_check(p, cudnnGetRNNWeightSpaceSize(p->h, p->d.rnn, &p->weight_bytes), "cudnnGetRNNWeightSpaceSize");
  if (!rc)
    rc = dnn_check(p, cudnnGetRNNTempSpaceSizes(p->h, p->d.rnn, fwd, p->d.x, &p->work_bytes, &p->reserve_bytes),
                   "cudnnGetRNNTempSpaceSizes");
  p->reserve_offset = (p->weight_bytes + RESERVE_ALIGN - 1) / RESERVE_ALIGN * RESERVE_ALIGN;
  return rc;
}

/* The shape a weight or bias descriptor of cudnnGetRNNWeightParams describes: its last two dims
   (a matrix is {1, rows, cols}, a bias {1, rows, 1}) and its element count; 0 when unreadable. */
static int desc_shape(cudnnTensorDescriptor_t d, int64_t *rows, int64_t *cols, int64_t *numel) {
  cudnnDataType_t type;
  int nb = 0, dims[8], strides[8];
  *rows = *cols = *numel = -1;
  if (cudnnGetTensorNdDescriptor(d, 8, &type, &nb, dims, strides) != CUDNN_STATUS_SUCCESS || nb < 2 || nb > 8) return 0;
  *numel = 1;
  for (int k = 0; k < nb; k++) *numel *= dims[k];
  *rows = dims[nb - 2];
  *cols = dims[nb - 1];
  return 1;
}

/* Between kiln's weights and cuDNN's weight space at space: pack (w, b -> space; a NULL bias is
   zeros) or unpack (space -> w, b; NULL: not wanted). w[0], w[1]: w_ih [G*H,I], w_hh [G*H,H];
   b[0], b[1]: b_ih, b_hh [G*H]. Each gate's rows of a matrix are one row-major [H, cols] block,
   the layout cuDNN keeps a linear layer's matrix in. */
static int weights(const struct plan *p, void *space, int pack, void *const w[2], void *const b[2]) {
  for (int side = 0; side < 2; side++) {
    int64_t cols = side ? p->H : p->I;
    size_t mbytes = (size_t)(p->H * cols) * p->es, bbytes = (size_t)p->H * p->es;
    for (int g = 0; g < p->G; g++) {
      int id = kiln_rnn_cudnn_lin_layer(p->mode, side, g);
      void *maddr = NULL, *baddr = NULL;
      int rc = dnn_check(p, cudnnGetRNNWeightParams(p->h, p->d.rnn, 0, p->weight_bytes, space, id, p->md, &maddr, p->bd, &baddr),
                         "cudnnGetRNNWeightParams");
      if (rc) return rc;
      int64_t mr = -1, mc = -1, mn = -1, br = -1, bc = -1, bn = -1;
      int ok = desc_shape(p->md, &mr, &mc, &mn) && desc_shape(p->bd, &br, &bc, &bn);
      if (!maddr || !baddr || !ok || mr != p->H || mc != cols || mn != p->H * cols || bn != p->H)
        return cuda_fail(KILN_ERR_DEVICE, "%s: cudnnGetRNNWeightParams: linLayerID %d is a [%lld,%lld] matrix (%lld elements) "
                                          "with %lld bias elements, expected [%lld,%lld] and %lld",
                         p->op, id, (long long)mr, (long long)mc, (long long)mn, (long long)bn, (long long)p->H,
                         (long long)cols, (long long)p->H);
      char *wg = w[side] ? (char *)w[side] + (size_t)g * mbytes : NULL;
      char *bg = b[side] ? (char *)b[side] + (size_t)g * bbytes : NULL;
      if (pack) {
        rc = copy_d2d(p, maddr, wg, mbytes, "cudaMemcpyAsync (weights into cuDNN's weight space)");
        if (!rc) rc = bg ? copy_d2d(p, baddr, bg, bbytes, "cudaMemcpyAsync (biases into cuDNN's weight space)")
                         : zero(p, baddr, bbytes, "cudaMemsetAsync (no bias)");
      } else {
        if (wg) rc = copy_d2d(p, wg, maddr, mbytes, "cudaMemcpyAsync (weight grads from cuDNN's weight space)");
        if (!rc && bg) rc = copy_d2d(p, bg, baddr, bbytes, "cudaMemcpyAsync (bias grads from cuDNN's weight space)");
      }
      if (rc) return rc;
    }
  }
  return KILN_OK;
}

/* dst [T,B,N] from src through rnn_gather_kernel. */
static int gather_into(const struct plan *p, void *dst, const void *src, int64_t N, int reverse, int zero_padding) {
  int64_t n = p->T_ * p->B * N;
  if (!n) return KILN_OK;
  struct kiln_cuda_launch l = grid_for(p->dev, n);
  const int64_t *len = p->len64 ? (const int64_t *)kiln_tensor_data(p->len64) : NULL;
  if (p->dtype == KILN_F64)
    rnn_gather_kernel<double><<<(unsigned)l.blocks, l.threads, 0, p->dev->stream>>>((double *)dst, (const double *)src, p->T_, p->B,
                                                                                   N, len, reverse, zero_padding);
  else
    rnn_gather_kernel<float><<<(unsigned)l.blocks, l.threads, 0, p->dev->stream>>>((float *)dst, (const float *)src, p->T_, p->B,
                                                                                 N, len, reverse, zero_padding);
  return cuda_launched(p->op, "rnn_gather_kernel");
}

/* Every sequence reversed within its length (the padding as it is). */
static int reverse_into(const struct plan *p, void *dst, const void *src, int64_t N) { return gather_into(p, dst, src, N, 1, 0); }

/* The output grads as cuDNN's backward reads them: reversed for a reverse layer, zeros in the padding. */
static int grads_into(const struct plan *p, void *dst, const void *src) { return gather_into(p, dst, src, p->H, p->reverse, 1); }

/* A device buffer of bytes (at least one), owned by the caller. */
static void *scratch(const struct plan *p, size_t bytes, struct kiln_tensor **keep) {
  *keep = cuda_scratch((int64_t)bytes, p->where);
  return *keep ? kiln_tensor_data(*keep) : NULL;
}

/* The input as cuDNN reads it: x, or x with each sequence reversed (into *keep). */
static const void *input_of(const struct plan *p, const struct kiln_tensor *x, struct kiln_tensor **keep, int *rc) {
  *keep = NULL;
  if (!p->reverse) return kiln_tensor_data(x);
  void *r = scratch(p, (size_t)(p->T_ * p->B * p->I) * p->es, keep);
  if (!r) { *rc = kiln_error_code(); return NULL; }
  *rc = reverse_into(p, r, kiln_tensor_data(x), p->I);
  return r;
}

extern "C" int cuda_rnn_cudnn(const struct kiln_call *c) {
  struct kiln_rnn_forward *f = (struct kiln_rnn_forward *)c->extra;
  const struct kiln_rnn_tensors *t = &f->t;
  struct plan p;
  struct kiln_tensor *saved = NULL, *work = NULL, *xr = NULL, *yr = NULL;
  f->cudnn_reserve = NULL;
  cudnnForwardMode_t fwd = f->inference ? CUDNN_FWD_MODE_INFERENCE : CUDNN_FWD_MODE_TRAINING;
  int rc = plan_make(&p, c, t, fwd);
  int64_t BH = p.B * p.H;
  char *z = (char *)kiln_tensor_data(c->out);
  const void *x = NULL;
  void *y = NULL, *wspace = NULL, *reserve = NULL, *ws = NULL;
  if (rc) goto done;
  {
    int64_t n = (int64_t)(p.reserve_offset + p.reserve_bytes);
    if (!(saved = kiln_tensor_empty(1, &n, KILN_U8, p.where))) { rc = kiln_error_code(); goto done; }
    wspace = kiln_tensor_data(saved);
    reserve = p.reserve_bytes ? (char *)wspace + p.reserve_offset : NULL;
    void *w[2] = {kiln_tensor_data(t->w_ih), kiln_tensor_data(t->w_hh)};
    void *b[2] = {t->b_ih ? kiln_tensor_data(t->b_ih) : NULL, t->b_hh ? kiln_tensor_data(t->b_hh) : NULL};
    rc = zero(&p, wspace, p.weight_bytes, "cudaMemsetAsync (cuDNN's weight space)");
    if (!rc) rc = weights(&p, wspace, 1, w, b);
  }
  if (!rc && !(ws = scratch(&p, p.work_bytes, &work))) rc = kiln_error_code();
  if (!rc) x = input_of(&p, t->x, &xr, &rc);
  /* Z: zeros past every sequence's end, whatever cuDNN leaves there */
  if (!rc) rc = zero(&p, z, (size_t)c->out->numel * p.es, "cudaMemsetAsync (Z)");
  if (!rc) y = p.reverse ? scratch(&p, (size_t)(p.T_ * BH) * p.es, &yr) : (void *)z;
  if (!rc && !y) rc = kiln_error_code();
  if (!rc && p.reverse) rc = zero(&p, y, (size_t)(p.T_ * BH) * p.es, "cudaMemsetAsync (outputs)");
  if (!rc)
    rc = dnn_check(&p, cudnnRNNForward(p.h, p.d.rnn, fwd, (const int32_t *)kiln_tensor_data(p.len32), p.d.x, x, p.d.y,
                                       y, p.d.state, t->h0 ? kiln_tensor_data(t->h0) : NULL, z + (size_t)(p.T_ * BH) * p.es, p.d.state,
                                       p.mode == KILN_RNN_LSTM && t->c0 ? kiln_tensor_data(t->c0) : NULL,
                                       p.mode == KILN_RNN_LSTM ? z + (size_t)((p.T_ + 1) * BH) * p.es : NULL, p.weight_bytes,
                                       wspace, p.work_bytes, ws, p.reserve_bytes, reserve),
                   "cudnnRNNForward");
  if (!rc && p.reverse) rc = reverse_into(&p, z, y, p.H);
done:
  if (!rc && !f->inference) f->cudnn_reserve = saved;
  else kiln_tensor_release(saved);
  kiln_tensor_release(work); kiln_tensor_release(xr); kiln_tensor_release(yr);
  plan_release(&p);
  return rc;
}

extern "C" int cuda_rnn_cudnn_backward(const struct kiln_call *c) {
  const struct kiln_rnn_backward *bw = (const struct kiln_rnn_backward *)c->extra;
  const struct kiln_rnn_tensors *t = &bw->t;
  struct plan p;
  struct kiln_tensor *work = NULL, *xr = NULL, *yr = NULL, *dyr = NULL, *dxr = NULL, *dw = NULL;
  int rc = plan_make(&p, c, t, CUDNN_FWD_MODE_TRAINING);
  int64_t BH = p.B * p.H;
  const char *z = (const char *)kiln_tensor_data(bw->z), *gz = (const char *)kiln_tensor_data(bw->gz);
  const void *x = NULL, *y = z, *dy = gz;
  void *dx = NULL, *ws = NULL, *wspace = NULL, *reserve = NULL;
  const void *h0 = t->h0 ? kiln_tensor_data(t->h0) : NULL;
  const void *c0 = p.mode == KILN_RNN_LSTM && t->c0 ? kiln_tensor_data(t->c0) : NULL;
  int wgrads = bw->gw_ih || bw->gw_hh || bw->gb_ih || bw->gb_hh;
  if (rc) goto done;
  if (!bw->reserve || bw->reserve->dtype != KILN_U8 || bw->reserve->numel != (int64_t)(p.reserve_offset + p.reserve_bytes)) {
    rc = cuda_fail(KILN_ERR_ARGUMENT, "%s: the saved reserve %s does not hold this layer's cuDNN weights and reserve (%lld bytes)",
                   p.op, bw->reserve ? kiln_shape_string(bw->reserve) : "(none)", (long long)(p.reserve_offset + p.reserve_bytes));
    goto done;
  }
  wspace = kiln_tensor_data(bw->reserve);
  reserve = p.reserve_bytes ? (char *)wspace + p.reserve_offset : NULL;
  if (!(ws = scratch(&p, p.work_bytes, &work))) { rc = kiln_error_code(); goto done; }
  x = input_of(&p, t->x, &xr, &rc);
  if (!rc && p.reverse) {   /* the outputs as cuDNN's forward ordered them */
    void *yy = scratch(&p, (size_t)(p.T_ * BH) * p.es, &yr);
    if (!yy) rc = kiln_error_code();
    if (!rc) rc = reverse_into(&p, yy, z, p.H);
    y = yy;
  }
  if (!rc && (p.reverse || p.len64)) {   /* their grads: in that order, zeros in the padding */
    void *dd = scratch(&p, (size_t)(p.T_ * BH) * p.es, &dyr);
    if (!dd) rc = kiln_error_code();
    if (!rc) rc = grads_into(&p, dd, gz);
    dy = dd;
  }
  if (!rc) {
    dx = bw->gx && !p.reverse ? kiln_tensor_data(bw->gx) : scratch(&p, (size_t)(p.T_ * p.B * p.I) * p.es, &dxr);
    if (!dx) rc = kiln_error_code();
    /* the grad of x past each sequence's end is zero, as on the CPU: cuDNN promises its padding
       fill for outputs only, and dx (described by xDesc) may keep whatever the buffer held */
    if (!rc && bw->gx && t->lengths) rc = zero(&p, dx, (size_t)(p.T_ * p.B * p.I) * p.es, "cudaMemsetAsync (grad of x)");
  }
  /* the data grads first: cuDNN's weight grads read what this leaves in the reserve */
  if (!rc)
    rc = dnn_check(&p, cudnnRNNBackwardData_v8(p.h, p.d.rnn, (const int32_t *)kiln_tensor_data(p.len32), p.d.y, y, dy, p.d.x, dx, p.d.state,
                                               h0, gz + (size_t)(p.T_ * BH) * p.es, bw->gh0 ? kiln_tensor_data(bw->gh0) : NULL,
                                               p.d.state, c0, p.mode == KILN_RNN_LSTM ? gz + (size_t)((p.T_ + 1) * BH) * p.es : NULL,
                                               p.mode == KILN_RNN_LSTM && bw->gc0 ? kiln_tensor_data(bw->gc0) : NULL,
                                               p.weight_bytes, wspace, p.work_bytes, ws, p.reserve_bytes, reserve),
                   "cudnnRNNBackwardData_v8");
  if (!rc && bw->gx && p.reverse) rc = reverse_into(&p, kiln_tensor_data(bw->gx), dx, p.I);
  if (!rc && wgrads) {
    void *d = scratch(&p, p.weight_bytes, &dw);
    if (!d) rc = kiln_error_code();
    if (!rc) rc = zero(&p, d, p.weight_bytes, "cudaMemsetAsync (cuDNN's weight-space grad)");
    if (!rc)
      rc = dnn_check(&p, cudnnRNNBackwardWeights_v8(p.h, p.d.rnn, CUDNN_WGRAD_MODE_ADD, (const int32_t *)kiln_tensor_data(p.len32),
                                                    p.d.x, x, p.d.state, h0, p.d.y, y, p.weight_bytes, d, p.work_bytes, ws, p.reserve_bytes,
                                                    reserve),
                     "cudnnRNNBackwardWeights_v8");
    void *w[2] = {bw->gw_ih ? kiln_tensor_data(bw->gw_ih) : NULL, bw->gw_hh ? kiln_tensor_data(bw->gw_hh) : NULL};
    void *b[2] = {bw->gb_ih ? kiln_tensor_data(bw->gb_ih) : NULL, bw->gb_hh ? kiln_tensor_data(bw->gb_hh) : NULL};
    if (!rc) rc = weights(&p, d, 0, w, b);
  }
done:
  kiln_tensor_release(work); kiln_tensor_release(xr); kiln_tensor_release(yr); kiln_tensor_release(dyr);
  kiln_tensor_release(dxr); kiln_tensor_release(dw);
  plan_release(&p);
  return rc;
}
