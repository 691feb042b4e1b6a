/* cuda/vector.cuh: whole aligned vectors for the flat elementwise kernels. A thread loads W
   elements of each input as one aligned word (16 bytes for f32 x 4 or f64 x 2), applies the
   functor to each lane and stores W results as one word; kiln_cuda_vector_width (geometry.h) says
   when every operand is aligned for it. __host__ __device__, so that the host tests replay it. */
#ifndef KILN_CUDA_VECTOR_CUH
#define KILN_CUDA_VECTOR_CUH
#include "elements.cuh"

namespace kiln_ew {

template <class T, int W> struct alignas(sizeof(T) * W) pack {
  T v[W];
};

template <class C> struct flat_inputs {
  const C *in[3];   /* NULL: the scalar */
};

/* Element i of a flat elementwise op. */
template <class C, class Fn>
KILN_EL void flat_element(typename Fn::out_t *out, const flat_inputs<C> &p, const Fn &fn, C scalar, int64_t i) {
  C x[Fn::nin];
  for (int j = 0; j < Fn::nin; j++) x[j] = p.in[j] ? p.in[j][i] : scalar;
  out[i] = fn(x);
}

/* Vector i (elements i*W .. i*W + W - 1) of a flat elementwise op whose operands are all aligned
   to their W-element word. */
template <class C, class Fn, int W>
KILN_EL void flat_vector(typename Fn::out_t *out, const flat_inputs<C> &p, const Fn &fn, C scalar, int64_t i) {
  using O = typename Fn::out_t;
  pack<C, W> in[Fn::nin];
  for (int j = 0; j < Fn::nin; j++) {
    if (p.in[j]) {
      in[j] = reinterpret_cast<const pack<C, W> *>(p.in[j])[i];
    } else {
      for (int k = 0; k < W; k++) in[j].v[k] = scalar;
    }
  }
  pack<O, W> r;
  for (int k = 0; k < W; k++) {
    C x[Fn::nin];
    for (int j = 0; j < Fn::nin; j++) x[j] = in[j].v[k];
    r.v[k] = fn(x);
  }
  reinterpret_cast<pack<O, W> *>(out)[i] = r;
}

/* The lanes per word for compute type C: 16 bytes. */
template <class C> constexpr int vector_lanes() { return (int)(16 / sizeof(C)) > 1 ? (int)(16 / sizeof(C)) : 1; }

}  // namespace kiln_ew

#endif
