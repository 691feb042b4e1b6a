/* cuda/elementwise.cu: the table's elementwise kernel (it routes to unary.cu and binary.cu), and
   the ternary ops where and clamp. */
#include <string.h>
#include "elementwise.cuh"

using namespace kiln_ew;

template <class C> static int run_where(const struct kiln_call *c, struct cuda_device *dev) {
  const struct kiln_tensor *in[3] = {c->in[0], c->in[1], c->in[2]};
  return launch<C>(c, dev, where_fn<C>(), in, 0);
}

/* The bounds arrive as doubles (+-inf for a missing one) and are converted as the CPU does. */
template <class C> static int run_clamp(const struct kiln_call *c, struct cuda_device *dev) {
  const struct kiln_tensor *in[1] = {c->in[0]};
  clamp_fn<C> fn;
  fn.lo = clamp_bound<C>(c->scalar[0]);
  fn.hi = clamp_bound<C>(c->scalar[1]);
  return launch<C>(c, dev, fn, in, 0);
}

extern "C" int cuda_ternary(const struct kiln_call *c, struct cuda_device *dev) {
  int ct = (int)c->ints[0];
  if (c->op == KILN_OP_WHERE) {
    if (ct == KILN_F32) return run_where<float>(c, dev);
    if (ct == KILN_F64) return run_where<double>(c, dev);
    if (ct == KILN_I64) return run_where<int64_t>(c, dev);
  } else if (c->op == KILN_OP_CLAMP) {
    if (ct == KILN_F32) return run_clamp<float>(c, dev);
    if (ct == KILN_F64) return run_clamp<double>(c, dev);
    if (ct == KILN_I64) return run_clamp<int64_t>(c, dev);
  } else {
    return cuda_fail(KILN_ERR_ARGUMENT, "%s: not an elementwise op", kiln_op_name(c->op));
  }
  return not_defined(c);
}

extern "C" int cuda_elementwise(const struct kiln_call *c) {
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, kiln_op_name(c->op));
  if (!dev) return kiln_error_code();
  struct kiln_op_desc d;   /* the op's family, from libkiln's op table */
  if (kiln_op_describe(c->op, &d)) return kiln_error_code();
  if (strcmp(d.family, "unary") == 0) return cuda_unary(c, dev);
  if (strcmp(d.family, "binary") == 0) return cuda_binary(c, dev);
  return cuda_ternary(c, dev);
}
