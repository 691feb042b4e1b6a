/* op_table.c: the op table. One row per op of enum kiln_op (kiln/ops.h), with designated
   initializers: its name, family, arity, flags, what its derivative saves and which inputs get
   gradients, the derivative (beside the family's front end in ops/), the dtypes each backend's
   kernel accepts, and its class under mixed precision. docs/ops.md is generated from it
   (tools/ops_doc.lua). Adding an op: its enum value in kiln/ops.h, its row here, its kernels in
   the backends' tables, its help line; see docs/architecture.md. */
#include "internal.h"
#include <stddef.h>

const struct kiln_op_info kiln_ops[] = {
  [KILN_OP_COPY] = {.name = "copy", .family = KILN_FAMILY_COPY, .arity = 1, .flags = 0, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_FILL] = {.name = "fill", .family = KILN_FAMILY_COPY, .arity = 0, .flags = 0, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_NEG] = {.name = "neg", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE | KILN_OPF_KEEPS_INTEGERS, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL & ~KILN_DT(KILN_BOOL), .dtypes_cuda = KILN_DT_ALL & ~KILN_DT(KILN_BOOL), .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_ABS] = {.name = "abs", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE | KILN_OPF_KEEPS_INTEGERS, .saves = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_SIGN] = {.name = "sign", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_KEEPS_INTEGERS, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_SQRT] = {.name = "sqrt", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_RSQRT] = {.name = "rsqrt", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_EXP] = {.name = "exp", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_LOG] = {.name = "log", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_LOG1P] = {.name = "log1p", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_EXPM1] = {.name = "expm1", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_SIN] = {.name = "sin", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_COS] = {.name = "cos", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_TANH] = {.name = "tanh", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_SIGMOID] = {.name = "sigmoid", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_RELU] = {.name = "relu", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE | KILN_OPF_KEEPS_INTEGERS, .saves = KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_FLOOR] = {.name = "floor", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_KEEPS_INTEGERS, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_CEIL] = {.name = "ceil", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_KEEPS_INTEGERS, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_ROUND] = {.name = "round", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_KEEPS_INTEGERS, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_TRUNC] = {.name = "trunc", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_KEEPS_INTEGERS, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_RECIPROCAL] = {.name = "reciprocal", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_SQUARE] = {.name = "square", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE | KILN_OPF_KEEPS_INTEGERS, .saves = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_ERF] = {.name = "erf", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_LOGICAL_NOT] = {.name = "logical_not", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_ADD] = {.name = "add", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_binary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_SUB] = {.name = "sub", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_binary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_MUL] = {.name = "mul", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_IN1, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_binary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_DIV] = {.name = "div", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE | KILN_OPF_NEEDS_FLOAT, .saves = KILN_SAVE_IN0 | KILN_SAVE_IN1, .saves_rscalar = KILN_SAVE_OUT | KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_binary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_POW] = {.name = "pow", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_IN1 | KILN_SAVE_OUT, .saves_scalar = KILN_SAVE_IN0 | KILN_SAVE_OUT, .saves_rscalar = KILN_SAVE_IN0 | KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_binary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_MAXIMUM] = {.name = "maximum", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_IN1, .saves_scalar = KILN_SAVE_IN0, .saves_rscalar = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_binary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_MINIMUM] = {.name = "minimum", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_IN1, .saves_scalar = KILN_SAVE_IN0, .saves_rscalar = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_binary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_REMAINDER] = {.name = "remainder", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_IN1, .saves_scalar = KILN_SAVE_IN0, .saves_rscalar = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_binary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_EQ] = {.name = "eq", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_NE] = {.name = "ne", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_LT] = {.name = "lt", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_LE] = {.name = "le", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_GT] = {.name = "gt", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_GE] = {.name = "ge", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_LOGICAL_AND] = {.name = "logical_and", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_LOGICAL_OR] = {.name = "logical_or", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_WHERE] = {.name = "where", .family = KILN_FAMILY_TERNARY, .arity = 3, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0, .grad_inputs = KILN_DT(1) | KILN_DT(2), KILN_DERIVATIVE(kiln_ternary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_CLAMP] = {.name = "clamp", .family = KILN_FAMILY_TERNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE | KILN_OPF_KEEPS_INTEGERS, .saves = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_ternary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_SUM] = {.name = "sum", .family = KILN_FAMILY_REDUCE, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_reduce_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_MEAN] = {.name = "mean", .family = KILN_FAMILY_REDUCE, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_reduce_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_PROD] = {.name = "prod", .family = KILN_FAMILY_REDUCE, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_reduce_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_MAX] = {.name = "max", .family = KILN_FAMILY_REDUCE, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_reduce_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_MIN] = {.name = "min", .family = KILN_FAMILY_REDUCE, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_reduce_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_ARGMAX] = {.name = "argmax", .family = KILN_FAMILY_REDUCE, .arity = 1, .flags = 0, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_ARGMIN] = {.name = "argmin", .family = KILN_FAMILY_REDUCE, .arity = 1, .flags = 0, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_VAR] = {.name = "var", .family = KILN_FAMILY_REDUCE, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_reduce_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_STD] = {.name = "std", .family = KILN_FAMILY_REDUCE, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_reduce_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_NORM] = {.name = "norm", .family = KILN_FAMILY_REDUCE, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_reduce_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_LOGSUMEXP] = {.name = "logsumexp", .family = KILN_FAMILY_REDUCE, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_reduce_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_GEMM] = {.name = "gemm", .family = KILN_FAMILY_LINALG, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN0 | KILN_SAVE_IN1, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_gemm_derivative), .dtypes_cpu = KILN_DT_ALL & ~KILN_DT(KILN_BOOL), .dtypes_cuda = KILN_DT_FLOAT, .autocast = KILN_AUTOCAST_LOWER},
  [KILN_OP_CAT] = {.name = "cat", .family = KILN_FAMILY_INDEX, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE | KILN_OPF_VARIADIC, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_cat_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_INDEX_SELECT] = {.name = "index_select", .family = KILN_FAMILY_INDEX, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN1, .grad_inputs = KILN_DT(0), KILN_DERIVATIVE(kiln_index_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_GATHER] = {.name = "gather", .family = KILN_FAMILY_INDEX, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN1, .grad_inputs = KILN_DT(0), KILN_DERIVATIVE(kiln_index_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_SCATTER_ADD] = {.name = "scatter_add", .family = KILN_FAMILY_INDEX, .arity = 3, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN1, .grad_inputs = KILN_DT(0) | KILN_DT(2), KILN_DERIVATIVE(kiln_index_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
  [KILN_OP_MASKED_FILL] = {.name = "masked_fill", .family = KILN_FAMILY_INDEX, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN1, .grad_inputs = KILN_DT(0), KILN_DERIVATIVE(kiln_index_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_MASKED_SELECT] = {.name = "masked_select", .family = KILN_FAMILY_INDEX, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN1, .grad_inputs = KILN_DT(0), KILN_DERIVATIVE(kiln_index_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_UNIFORM] = {.name = "uniform", .family = KILN_FAMILY_RANDOM, .arity = 1, .flags = 0, .dtypes_cpu = KILN_DT_FLOAT, .dtypes_cuda = KILN_DT_FLOAT, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_NORMAL] = {.name = "normal", .family = KILN_FAMILY_RANDOM, .arity = 1, .flags = 0, .dtypes_cpu = KILN_DT_FLOAT, .dtypes_cuda = KILN_DT_FLOAT, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_RANDINT] = {.name = "randint", .family = KILN_FAMILY_RANDOM, .arity = 1, .flags = 0, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_CONV2D] = {.name = "conv2d", .family = KILN_FAMILY_CONV, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_conv_derivative), .dtypes_cpu = KILN_DT_F32_F64 | KILN_DT(KILN_BF16), .dtypes_cuda = KILN_DT_FLOAT, .autocast = KILN_AUTOCAST_LOWER},
  [KILN_OP_CONV2D_BACKWARD] = {.name = "conv2d_backward", .family = KILN_FAMILY_CONV, .arity = 2, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64 | KILN_DT(KILN_BF16), .dtypes_cuda = KILN_DT_FLOAT, .autocast = KILN_AUTOCAST_LOWER},
  [KILN_OP_CONV2D_RELU_MAX_POOL2D] = {.name = "conv2d_relu_max_pool2d", .family = KILN_FAMILY_CONV, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_conv_pool_derivative), .dtypes_cpu = KILN_DT(KILN_F32) | KILN_DT(KILN_BF16), .dtypes_cuda = 0, .autocast = KILN_AUTOCAST_LOWER},
  [KILN_OP_CONV2D_RELU_MAX_POOL2D_BACKWARD] = {.name = "conv2d_relu_max_pool2d_backward", .family = KILN_FAMILY_CONV, .arity = 2, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT(KILN_F32) | KILN_DT(KILN_BF16), .dtypes_cuda = 0, .autocast = KILN_AUTOCAST_LOWER},
  [KILN_OP_LINEAR] = {.name = "linear", .family = KILN_FAMILY_LINALG, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_linear_derivative), .dtypes_cpu = KILN_DT(KILN_F32) | KILN_DT(KILN_F64), .dtypes_cuda = 0, .autocast = KILN_AUTOCAST_LOWER},
  [KILN_OP_MAX_POOL2D] = {.name = "max_pool2d", .family = KILN_FAMILY_POOL, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_pool_derivative), .dtypes_cpu = KILN_DT_F32_F64 | KILN_DT(KILN_BF16), .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_MAX_POOL2D_BACKWARD] = {.name = "max_pool2d_backward", .family = KILN_FAMILY_POOL, .arity = 1, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64 | KILN_DT(KILN_BF16), .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_AVG_POOL2D] = {.name = "avg_pool2d", .family = KILN_FAMILY_POOL, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_pool_derivative), .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_AVG_POOL2D_BACKWARD] = {.name = "avg_pool2d_backward", .family = KILN_FAMILY_POOL, .arity = 1, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_BATCH_NORM] = {.name = "batch_norm", .family = KILN_FAMILY_NORM, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_norm_derivative), .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_BATCH_NORM_BACKWARD] = {.name = "batch_norm_backward", .family = KILN_FAMILY_NORM, .arity = 1, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_LAYER_NORM] = {.name = "layer_norm", .family = KILN_FAMILY_NORM, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_norm_derivative), .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_LAYER_NORM_BACKWARD] = {.name = "layer_norm_backward", .family = KILN_FAMILY_NORM, .arity = 1, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_GROUP_NORM] = {.name = "group_norm", .family = KILN_FAMILY_NORM, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_norm_derivative), .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_GROUP_NORM_BACKWARD] = {.name = "group_norm_backward", .family = KILN_FAMILY_NORM, .arity = 1, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_SOFTMAX] = {.name = "softmax", .family = KILN_FAMILY_SOFTMAX, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_softmax_derivative), .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_SOFTMAX_BACKWARD] = {.name = "softmax_backward", .family = KILN_FAMILY_SOFTMAX, .arity = 1, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_LOG_SOFTMAX] = {.name = "log_softmax", .family = KILN_FAMILY_SOFTMAX, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_softmax_derivative), .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_LOG_SOFTMAX_BACKWARD] = {.name = "log_softmax_backward", .family = KILN_FAMILY_SOFTMAX, .arity = 1, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_NLL_LOSS] = {.name = "nll_loss", .family = KILN_FAMILY_LOSS, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_nll_derivative), .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_NLL_LOSS_BACKWARD] = {.name = "nll_loss_backward", .family = KILN_FAMILY_LOSS, .arity = 2, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_DROPOUT] = {.name = "dropout", .family = KILN_FAMILY_DROPOUT, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_dropout_derivative), .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_SGD_STEP] = {.name = "sgd_step", .family = KILN_FAMILY_OPTIM, .arity = 1, .flags = KILN_OPF_VARIADIC, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_ADAM_STEP] = {.name = "adam_step", .family = KILN_FAMILY_OPTIM, .arity = 1, .flags = KILN_OPF_VARIADIC, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_RMSPROP_STEP] = {.name = "rmsprop_step", .family = KILN_FAMILY_OPTIM, .arity = 1, .flags = KILN_OPF_VARIADIC, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_ADAGRAD_STEP] = {.name = "adagrad_step", .family = KILN_FAMILY_OPTIM, .arity = 1, .flags = KILN_OPF_VARIADIC, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_RNN] = {.name = "rnn", .family = KILN_FAMILY_RNN, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_rnn_derivative), .dtypes_cpu = KILN_DT_F32_F64 | KILN_DT(KILN_BF16), .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_LOWER},
  [KILN_OP_RNN_BACKWARD] = {.name = "rnn_backward", .family = KILN_FAMILY_RNN, .arity = 1, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64 | KILN_DT(KILN_BF16), .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_LOWER},
  [KILN_OP_CTC_LOSS] = {.name = "ctc_loss", .family = KILN_FAMILY_CTC, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_ctc_derivative), .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_CTC_LOSS_BACKWARD] = {.name = "ctc_loss_backward", .family = KILN_FAMILY_CTC, .arity = 1, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_ISNAN] = {.name = "isnan", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = 0, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_ISINF] = {.name = "isinf", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = 0, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_ISFINITE] = {.name = "isfinite", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_COMPARISON, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = 0, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_ERFINV] = {.name = "erfinv", .family = KILN_FAMILY_UNARY, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_OUT, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_unary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_ATAN2] = {.name = "atan2", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE | KILN_OPF_NEEDS_FLOAT, .saves = KILN_SAVE_IN0 | KILN_SAVE_IN1, .saves_scalar = KILN_SAVE_IN0, .saves_rscalar = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_binary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_ARGSORT] = {.name = "argsort", .family = KILN_FAMILY_SCAN, .arity = 1, .flags = 0, .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_KEEP},
  [KILN_OP_CUMSUM] = {.name = "cumsum", .family = KILN_FAMILY_SCAN, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE | KILN_OPF_KEEPS_INTEGERS, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_scan_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_CUMPROD] = {.name = "cumprod", .family = KILN_FAMILY_SCAN, .arity = 1, .flags = KILN_OPF_DIFFERENTIABLE | KILN_OPF_KEEPS_INTEGERS, .saves = KILN_SAVE_IN0, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_scan_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_F32},
  [KILN_OP_CUMPROD_BACKWARD] = {.name = "cumprod_backward", .family = KILN_FAMILY_SCAN, .arity = 2, .flags = KILN_OPF_BACKWARD, .dtypes_cpu = KILN_DT_F32_F64, .dtypes_cuda = KILN_DT_F32_F64, .autocast = KILN_AUTOCAST_F32},
  /* relu's derivative in one pass: g where y > 0 (or NaN), else 0; differentiable in g (y's derivative is 0) */
  [KILN_OP_RELU_BACKWARD] = {.name = "relu_backward", .family = KILN_FAMILY_BINARY, .arity = 2, .flags = KILN_OPF_DIFFERENTIABLE, .saves = KILN_SAVE_IN1, .grad_inputs = ~0u, KILN_DERIVATIVE(kiln_binary_derivative), .dtypes_cpu = KILN_DT_ALL, .dtypes_cuda = KILN_DT_ALL, .autocast = KILN_AUTOCAST_PROMOTE},
};
_Static_assert(sizeof kiln_ops / sizeof kiln_ops[0] == KILN_OP_COUNT, "the op table must have one row per op");

const char *const kiln_op_family_names[KILN_FAMILY_COUNT] = {
  [KILN_FAMILY_COPY] = "copy", [KILN_FAMILY_UNARY] = "unary", [KILN_FAMILY_BINARY] = "binary",
  [KILN_FAMILY_TERNARY] = "ternary", [KILN_FAMILY_REDUCE] = "reduce", [KILN_FAMILY_LINALG] = "linalg",
  [KILN_FAMILY_INDEX] = "index", [KILN_FAMILY_RANDOM] = "random", [KILN_FAMILY_CONV] = "conv",
  [KILN_FAMILY_POOL] = "pool", [KILN_FAMILY_NORM] = "norm", [KILN_FAMILY_SOFTMAX] = "softmax",
  [KILN_FAMILY_LOSS] = "loss", [KILN_FAMILY_DROPOUT] = "dropout", [KILN_FAMILY_OPTIM] = "optim",
  [KILN_FAMILY_RNN] = "rnn", [KILN_FAMILY_CTC] = "ctc", [KILN_FAMILY_SCAN] = "scan",
};

const struct kiln_op_info *kiln_op_info(int op) {
  return op >= 0 && op < KILN_OP_COUNT && kiln_ops[op].name ? &kiln_ops[op] : NULL;
}

int kiln_op_has(int op, unsigned flag) {
  const struct kiln_op_info *i = kiln_op_info(op);
  return i && (i->flags & flag) != 0;
}

KILN_API const char *kiln_op_name(int op) {
  const struct kiln_op_info *i = kiln_op_info(op);
  return i ? i->name : "?";
}

KILN_API int kiln_op_describe(int op, struct kiln_op_desc *out) {
  static const char *const autocast[] = {[KILN_AUTOCAST_KEEP] = "keep", [KILN_AUTOCAST_LOWER] = "lower",
                                         [KILN_AUTOCAST_F32] = "f32", [KILN_AUTOCAST_PROMOTE] = "promote"};
  const struct kiln_op_info *i = kiln_op_info(op);
  if (!i) return kiln_fail(KILN_ERR_ARGUMENT, "op_describe: %d is not an op (0 to %d)", op, KILN_OP_COUNT - 1);
  if (!out) return kiln_fail(KILN_ERR_ARGUMENT, "op_describe: out is NULL");
  *out = (struct kiln_op_desc){
    .name = i->name, .family = kiln_op_family_names[i->family], .arity = i->arity,
    .differentiable = (i->flags & KILN_OPF_DIFFERENTIABLE) != 0, .keeps_integers = (i->flags & KILN_OPF_KEEPS_INTEGERS) != 0,
    .comparison = (i->flags & KILN_OPF_COMPARISON) != 0, .backward_kernel = (i->flags & KILN_OPF_BACKWARD) != 0,
    .variadic = (i->flags & KILN_OPF_VARIADIC) != 0, .saves = i->saves, .grad_inputs = i->grad_inputs,
    .dtypes_cpu = i->dtypes_cpu, .dtypes_cuda = i->dtypes_cuda, .autocast = autocast[i->autocast],
    .derivative = i->derivative_name ? i->derivative_name : "", .needs_float = (i->flags & KILN_OPF_NEEDS_FLOAT) != 0,
  };
  return KILN_OK;
}
