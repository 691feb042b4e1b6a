/* cuda/elementwise.cuh: the CUDA elementwise engine, shared by unary.cu, binary.cu and
   elementwise.cu. As on the CPU, kernels compute in call->ints[0]'s dtype (f32, f64 or i64);
   inputs of other dtypes are converted as they are read and results as they are written.
   Two kernels per (op, compute dtype): a flat one when every operand is contiguous over the same
   shape in the compute dtype, and a strided N-d one over a coalesced iteration (geometry.h) for
   the rest: broadcasting, views, mixed dtypes, a scalar operand. */
#ifndef KILN_CUDA_ELEMENTWISE_CUH
#define KILN_CUDA_ELEMENTWISE_CUH
#include "common.h"
#include "elements.cuh"
#include "geometry.h"
#include "vector.cuh"

namespace kiln_ew {
using namespace kiln_el;

enum { THREADS = 256 };

/* Functors over an array of NIN compute-dtype inputs. */
template <int OP, class C> struct unary_fn {
  using out_t = result_t<OP, C>;
  static constexpr int nin = 1;
  KILN_EL out_t operator()(const C *x) const { return unary<OP, C>(x[0]); }
};
template <int OP, class C> struct binary_fn {
  using out_t = result_t<OP, C>;
  static constexpr int nin = 2;
  KILN_EL out_t operator()(const C *x) const { return binary<OP, C>(x[0], x[1]); }
};
template <class C> struct where_fn {
  using out_t = C;
  static constexpr int nin = 3;
  KILN_EL out_t operator()(const C *x) const { return where(x[0], x[1], x[2]); }
};
template <class C> struct clamp_fn {
  using out_t = C;
  static constexpr int nin = 1;
  C lo, hi;
  KILN_EL out_t operator()(const C *x) const { return clamp(x[0], lo, hi); }
};

/* Operand k + 1 is input k of the functor; a NULL pointer is the call's scalar. */
struct operands {
  char *ptr[KILN_CUDA_MAX_OPERANDS];
  int dtype[KILN_CUDA_MAX_OPERANDS];
  int size[KILN_CUDA_MAX_OPERANDS];
};

template <class C, class Fn>
__global__ void elementwise_kernel(struct kiln_cuda_iter it, struct operands ops, Fn fn, C scalar, int fits32) {
  using O = typename Fn::out_t;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < it.numel; i += stride) {
    int64_t off[KILN_CUDA_MAX_OPERANDS];
    if (fits32) kiln_cuda_iter_offsets32(&it, (uint32_t)i, off);
    else kiln_cuda_iter_offsets(&it, i, off);
    C x[Fn::nin];
#pragma unroll
    for (int j = 0; j < Fn::nin; j++)
      x[j] = ops.ptr[j + 1] ? load_as<C>(ops.ptr[j + 1] + off[j + 1] * ops.size[j + 1], ops.dtype[j + 1]) : scalar;
    store_as<O>(ops.ptr[0] + off[0] * ops.size[0], ops.dtype[0], fn(x));
  }
}

template <class C, class Fn>
__global__ void elementwise_flat_kernel(typename Fn::out_t *out, flat_inputs<C> p, Fn fn, C scalar, int64_t n) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) flat_element(out, p, fn, scalar, i);
}

/* The same over whole aligned W-element words, then the last n % W elements one by one. */
template <class C, class Fn, int W>
__global__ void elementwise_vector_kernel(typename Fn::out_t *out, flat_inputs<C> p, Fn fn, C scalar, int64_t n) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x, id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t words = n / W;
  for (int64_t i = id; i < words; i += stride) flat_vector<C, Fn, W>(out, p, fn, scalar, i);
  for (int64_t i = words * W + id; i < n; i += stride) flat_element(out, p, fn, scalar, i);
}

template <class T> constexpr int dtype_of() {
  return std::is_same<T, float>::value ? KILN_F32 : std::is_same<T, double>::value ? KILN_F64
         : std::is_same<T, uint8_t>::value ? KILN_BOOL : KILN_I64;
}

static inline int same_shape(const struct kiln_tensor *a, const struct kiln_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] != b->sizes[d]) return 0;
  return 1;
}

/* out = fn(in...) where in[j] NULL stands for the scalar (converted to C as the CPU does). */
template <class C, class Fn>
int launch(const struct kiln_call *c, struct cuda_device *dev, Fn fn, const struct kiln_tensor *const *in, double scalar) {
  using O = typename Fn::out_t;
  const struct kiln_tensor *out = c->out;
  if (out->numel == 0) return KILN_OK;
  C sc = scalar_as<C>(scalar);
  struct kiln_cuda_launch g = kiln_cuda_launch_1d(out->numel, THREADS, kiln_cuda_max_blocks(dev->sm_count, THREADS));
  int flat = out->dtype == dtype_of<O>() && kiln_is_contiguous(out);
  for (int j = 0; j < Fn::nin && flat; j++)
    if (in[j]) flat = in[j]->dtype == dtype_of<C>() && kiln_is_contiguous(in[j]) && same_shape(in[j], out);
  if (flat) {
    flat_inputs<C> p = {{NULL, NULL, NULL}};
    uintptr_t addr[4] = {(uintptr_t)kiln_tensor_data(out)};
    int size[4] = {(int)sizeof(O)}, count = 1;
    for (int j = 0; j < Fn::nin; j++) {
      p.in[j] = in[j] ? (const C *)kiln_tensor_data(in[j]) : NULL;
      if (p.in[j]) { addr[count] = (uintptr_t)p.in[j]; size[count++] = (int)sizeof(C); }
    }
    constexpr int W = vector_lanes<C>();
    if (W > 1 && kiln_cuda_vector_width(out->numel, count, addr, size) >= W) {
      struct kiln_cuda_launch gv = kiln_cuda_launch_1d(out->numel / W, THREADS, kiln_cuda_max_blocks(dev->sm_count, THREADS));
      elementwise_vector_kernel<C, Fn, W><<<(unsigned)gv.blocks, gv.threads, 0, dev->stream>>>((O *)kiln_tensor_data(out), p,
                                                                                               fn, sc, out->numel);
      return cuda_launched(kiln_op_name(c->op), "elementwise_vector_kernel");
    }
    elementwise_flat_kernel<C, Fn><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>((O *)kiln_tensor_data(out), p, fn,
                                                                                      sc, out->numel);
    return cuda_launched(kiln_op_name(c->op), "elementwise_flat_kernel");
  }
  struct kiln_tensor scalar_shape;   /* a 0-dim stand-in: it broadcasts with stride 0 */
  memset(&scalar_shape, 0, sizeof scalar_shape);
  scalar_shape.numel = 1;
  const struct kiln_tensor *ins[3] = {NULL, NULL, NULL};
  struct operands ops;
  memset(&ops, 0, sizeof ops);
  ops.ptr[0] = (char *)kiln_tensor_data(out);
  ops.dtype[0] = out->dtype;
  ops.size[0] = kiln_dtype_size(out->dtype);
  for (int j = 0; j < Fn::nin; j++) {
    ins[j] = in[j] ? in[j] : &scalar_shape;
    ops.ptr[j + 1] = in[j] ? (char *)kiln_tensor_data(in[j]) : NULL;
    ops.dtype[j + 1] = in[j] ? in[j]->dtype : dtype_of<C>();
    ops.size[j + 1] = kiln_dtype_size(ops.dtype[j + 1]);
  }
  struct kiln_cuda_iter it;
  kiln_cuda_iter_build(&it, out, Fn::nin, ins);
  elementwise_kernel<C, Fn><<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(it, ops, fn, sc, kiln_cuda_iter_fits32(&it));
  return cuda_launched(kiln_op_name(c->op), "elementwise_kernel");
}

static inline int not_defined(const struct kiln_call *c) {
  return cuda_fail(KILN_ERR_DTYPE, "%s: not defined for %s", kiln_op_name(c->op), kiln_dtype_name((int)c->ints[0]));
}

}  // namespace kiln_ew

#endif
