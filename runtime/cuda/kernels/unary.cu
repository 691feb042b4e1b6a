/* cuda/unary.cu: the unary elementwise ops on CUDA (semantics in elements.cuh, engine in
   elementwise.cuh). Ops the CPU defines for f32 and f64 only are refused for i64 as there. */
#include "elementwise.cuh"

using namespace kiln_ew;

template <int OP> static int run_unary(const struct kiln_call *c, struct cuda_device *dev) {
  const struct kiln_tensor *in[1] = {c->in[0]};
  switch ((int)c->ints[0]) {
  case KILN_F32: return launch<float>(c, dev, unary_fn<OP, float>(), in, 0);
  case KILN_F64: return launch<double>(c, dev, unary_fn<OP, double>(), in, 0);
  case KILN_I64:
    if constexpr (takes_integers<OP>()) return launch<int64_t>(c, dev, unary_fn<OP, int64_t>(), in, 0);
    break;
  }
  return not_defined(c);
}

extern "C" int cuda_unary(const struct kiln_call *c, struct cuda_device *dev) {
  switch (c->op) {
  case KILN_OP_NEG: return run_unary<KILN_OP_NEG>(c, dev);
  case KILN_OP_ABS: return run_unary<KILN_OP_ABS>(c, dev);
  case KILN_OP_SIGN: return run_unary<KILN_OP_SIGN>(c, dev);
  case KILN_OP_SQRT: return run_unary<KILN_OP_SQRT>(c, dev);
  case KILN_OP_RSQRT: return run_unary<KILN_OP_RSQRT>(c, dev);
  case KILN_OP_EXP: return run_unary<KILN_OP_EXP>(c, dev);
  case KILN_OP_LOG: return run_unary<KILN_OP_LOG>(c, dev);
  case KILN_OP_LOG1P: return run_unary<KILN_OP_LOG1P>(c, dev);
  case KILN_OP_EXPM1: return run_unary<KILN_OP_EXPM1>(c, dev);
  case KILN_OP_SIN: return run_unary<KILN_OP_SIN>(c, dev);
  case KILN_OP_COS: return run_unary<KILN_OP_COS>(c, dev);
  case KILN_OP_TANH: return run_unary<KILN_OP_TANH>(c, dev);
  case KILN_OP_SIGMOID: return run_unary<KILN_OP_SIGMOID>(c, dev);
  case KILN_OP_RELU: return run_unary<KILN_OP_RELU>(c, dev);
  case KILN_OP_FLOOR: return run_unary<KILN_OP_FLOOR>(c, dev);
  case KILN_OP_CEIL: return run_unary<KILN_OP_CEIL>(c, dev);
  case KILN_OP_ROUND: return run_unary<KILN_OP_ROUND>(c, dev);
  case KILN_OP_TRUNC: return run_unary<KILN_OP_TRUNC>(c, dev);
  case KILN_OP_RECIPROCAL: return run_unary<KILN_OP_RECIPROCAL>(c, dev);
  case KILN_OP_SQUARE: return run_unary<KILN_OP_SQUARE>(c, dev);
  case KILN_OP_ERF: return run_unary<KILN_OP_ERF>(c, dev);
  case KILN_OP_ERFINV: return run_unary<KILN_OP_ERFINV>(c, dev);
  case KILN_OP_LOGICAL_NOT: return run_unary<KILN_OP_LOGICAL_NOT>(c, dev);
  }
  return cuda_fail(KILN_ERR_ARGUMENT, "%s: not a unary op", kiln_op_name(c->op));
}
