/* cuda/binary.cu: the binary elementwise ops on CUDA, with broadcasting and a scalar operand
   (call->in[1] NULL: call->scalar[0] is the right operand, or the left one when ints[1] is 1). */
#include "elementwise.cuh"

using namespace kiln_ew;

template <int OP> static int run_binary(const struct kiln_call *c, struct cuda_device *dev) {
  int scalar = c->nin == 2 && c->in[1] == NULL;
  int reverse = scalar && c->ints[1] != 0;
  const struct kiln_tensor *in[2] = {reverse ? NULL : c->in[0], reverse ? c->in[0] : c->in[1]};
  double s = scalar ? c->scalar[0] : 0;
  switch ((int)c->ints[0]) {
  case KILN_F32: return launch<float>(c, dev, binary_fn<OP, float>(), in, s);
  case KILN_F64: return launch<double>(c, dev, binary_fn<OP, double>(), in, s);
  case KILN_I64:
    if constexpr (takes_integers<OP>()) return launch<int64_t>(c, dev, binary_fn<OP, int64_t>(), in, s);
    break;
  }
  return not_defined(c);
}

extern "C" int cuda_binary(const struct kiln_call *c, struct cuda_device *dev) {
  switch (c->op) {
  case KILN_OP_ADD: return run_binary<KILN_OP_ADD>(c, dev);
  case KILN_OP_SUB: return run_binary<KILN_OP_SUB>(c, dev);
  case KILN_OP_MUL: return run_binary<KILN_OP_MUL>(c, dev);
  case KILN_OP_DIV: return run_binary<KILN_OP_DIV>(c, dev);
  case KILN_OP_POW: return run_binary<KILN_OP_POW>(c, dev);
  case KILN_OP_MAXIMUM: return run_binary<KILN_OP_MAXIMUM>(c, dev);
  case KILN_OP_MINIMUM: return run_binary<KILN_OP_MINIMUM>(c, dev);
  case KILN_OP_REMAINDER: return run_binary<KILN_OP_REMAINDER>(c, dev);
  case KILN_OP_EQ: return run_binary<KILN_OP_EQ>(c, dev);
  case KILN_OP_NE: return run_binary<KILN_OP_NE>(c, dev);
  case KILN_OP_LT: return run_binary<KILN_OP_LT>(c, dev);
  case KILN_OP_LE: return run_binary<KILN_OP_LE>(c, dev);
  case KILN_OP_GT: return run_binary<KILN_OP_GT>(c, dev);
  case KILN_OP_GE: return run_binary<KILN_OP_GE>(c, dev);
  case KILN_OP_LOGICAL_AND: return run_binary<KILN_OP_LOGICAL_AND>(c, dev);
  case KILN_OP_LOGICAL_OR: return run_binary<KILN_OP_LOGICAL_OR>(c, dev);
  case KILN_OP_ATAN2: return run_binary<KILN_OP_ATAN2>(c, dev);
  case KILN_OP_RELU_BACKWARD: return run_binary<KILN_OP_RELU_BACKWARD>(c, dev);
  }
  return cuda_fail(KILN_ERR_ARGUMENT, "%s: not a binary op", kiln_op_name(c->op));
}
