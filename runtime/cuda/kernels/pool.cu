/* cuda/pool.cu: 2-d max and average pooling on CUDA, forward and backward, with cpu/pool.c's
   semantics (pool.cuh). One thread per output element forward; one thread per input element
   backward, gathering the grads of the outputs that reach it in the CPU's order: deterministic,
   and the same bits as the CPU's scatter. */
#include "kernels.cuh"
#include "pool.cuh"

using namespace kiln_pool;
using namespace kiln_k;

template <class T>
__global__ void max_pool2d_kernel(const T *x, T *y, int64_t *idx, int64_t n, struct geom g) {
  int64_t ohw = g.OH * g.OW;
  KILN_GRID_LOOP(i, n) {
    int64_t p = i / ohw, o = i - p * ohw;
    max_pool_at<T>(x + p * g.H * g.W, g, o / g.OW, o % g.OW, &y[i], &idx[i]);
  }
}

template <class T>
__global__ void max_pool2d_backward_kernel(const T *gy, const int64_t *idx, T *gx, int64_t n, struct geom g) {
  int64_t hw = g.H * g.W, ohw = g.OH * g.OW;
  KILN_GRID_LOOP(i, n) {
    int64_t p = i / hw, q = i - p * hw;
    gx[i] = max_pool_grad_at<T>(gy + p * ohw, idx + p * ohw, g, q / g.W, q % g.W);
  }
}

template <class T> __global__ void avg_pool2d_kernel(const T *x, T *y, int64_t n, struct geom g) {
  int64_t ohw = g.OH * g.OW;
  KILN_GRID_LOOP(i, n) {
    int64_t p = i / ohw, o = i - p * ohw;
    y[i] = avg_pool_at<T>(x + p * g.H * g.W, g, o / g.OW, o % g.OW);
  }
}

template <class T> __global__ void avg_pool2d_backward_kernel(const T *gy, T *gx, int64_t n, struct geom g) {
  int64_t hw = g.H * g.W, ohw = g.OH * g.OW;
  KILN_GRID_LOOP(i, n) {
    int64_t p = i / hw, q = i - p * hw;
    gx[i] = avg_pool_grad_at<T>(gy + p * ohw, g, q / g.W, q % g.W);
  }
}

static int float_only(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_F32 || t->dtype == KILN_F64) return KILN_OK;
  return cuda_fail(KILN_ERR_DTYPE, "%s: %s tensors are not supported on cuda (f32 or f64; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

/* The plane geometry of input-shaped x and output-shaped y. */
static struct geom plane_geom(const struct kiln_call *c, const struct kiln_tensor *x, const struct kiln_tensor *y) {
  int nd = x->ndim;
  return geom_of(c->op, c->ints, x->sizes[nd - 2], x->sizes[nd - 1], y->sizes[nd - 2], y->sizes[nd - 1]);
}

template <class T> static const T *cp(const struct kiln_tensor *t) { return (const T *)kiln_tensor_data(t); }
template <class T> static T *mp(struct kiln_tensor *t) { return (T *)kiln_tensor_data(t); }

/* MAX_POOL2D, AVG_POOL2D: out y; in x; max: extra = the indices. */
extern "C" int cuda_pool2d(const struct kiln_call *c) {
  const char *op = kiln_op_name(c->op);
  struct kiln_tensor *y = c->out;
  struct cuda_device *dev = cuda_device_enter(y->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, c->in[0])) return kiln_error_code();
  if (y->numel == 0) return KILN_OK;
  struct kiln_tensor *x = cuda_contiguous_as(c->in[0], c->in[0]->dtype, op);
  if (!x) return kiln_error_code();
  struct geom g = plane_geom(c, x, y);
  struct kiln_cuda_launch l = grid_for(dev, y->numel);
  bool f32 = x->dtype == KILN_F32;
  if (c->op == KILN_OP_MAX_POOL2D) {
    int64_t *idx = (int64_t *)kiln_tensor_data((const struct kiln_tensor *)c->extra);
    if (f32) max_pool2d_kernel<float><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(cp<float>(x), mp<float>(y), idx, y->numel, g);
    else max_pool2d_kernel<double><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(cp<double>(x), mp<double>(y), idx, y->numel, g);
  } else {
    if (f32) avg_pool2d_kernel<float><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(cp<float>(x), mp<float>(y), y->numel, g);
    else avg_pool2d_kernel<double><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(cp<double>(x), mp<double>(y), y->numel, g);
  }
  int rc = cuda_launched(op, c->op == KILN_OP_MAX_POOL2D ? "max_pool2d_kernel" : "avg_pool2d_kernel");
  kiln_tensor_release(x);
  return rc;
}

/* MAX_POOL2D_BACKWARD: out gx; in gy, indices. AVG_POOL2D_BACKWARD: out gx; in gy. */
extern "C" int cuda_pool2d_backward(const struct kiln_call *c) {
  const char *op = kiln_op_name(c->op);
  struct kiln_tensor *gx = c->out;
  struct cuda_device *dev = cuda_device_enter(gx->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, c->in[0])) return kiln_error_code();
  if (gx->numel == 0) return KILN_OK;
  bool max = c->op == KILN_OP_MAX_POOL2D_BACKWARD;
  struct kiln_tensor *gy = cuda_contiguous_as(c->in[0], gx->dtype, op);
  struct kiln_tensor *ind = gy && max ? cuda_contiguous_as(c->in[1], KILN_I64, op) : NULL;
  int rc = KILN_OK;
  if (!gy || (max && !ind)) rc = kiln_error_code();
  if (!rc) {
    struct geom g = plane_geom(c, gx, gy);
    struct kiln_cuda_launch l = grid_for(dev, gx->numel);
    bool f32 = gx->dtype == KILN_F32;
    if (max) {
      const int64_t *idx = (const int64_t *)kiln_tensor_data(ind);
      if (f32) max_pool2d_backward_kernel<float><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(cp<float>(gy), idx, mp<float>(gx), gx->numel, g);
      else max_pool2d_backward_kernel<double><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(cp<double>(gy), idx, mp<double>(gx), gx->numel, g);
    } else {
      if (f32) avg_pool2d_backward_kernel<float><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(cp<float>(gy), mp<float>(gx), gx->numel, g);
      else avg_pool2d_backward_kernel<double><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(cp<double>(gy), mp<double>(gx), gx->numel, g);
    }
    rc = cuda_launched(op, max ? "max_pool2d_backward_kernel" : "avg_pool2d_backward_kernel");
  }
  kiln_tensor_release(gy);
  kiln_tensor_release(ind);
  return rc;
}
