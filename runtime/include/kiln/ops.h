/* kiln/ops.h: the ops (an append-only enum; the facts of each are its row in the op table) and the functions that run ops.
   Every op is checked here, then dispatched to the kernel of its inputs' device. */
#ifndef KILN_OPS_H
#define KILN_OPS_H
#include <stdint.h>
#include <kiln/tensor.h>

enum kiln_op {
  /* data movement */
  KILN_OP_COPY = 0, KILN_OP_FILL,
  /* unary elementwise */
  KILN_OP_NEG, KILN_OP_ABS, KILN_OP_SIGN, KILN_OP_SQRT, KILN_OP_RSQRT, KILN_OP_EXP, KILN_OP_LOG,
  KILN_OP_LOG1P, KILN_OP_EXPM1, KILN_OP_SIN, KILN_OP_COS, KILN_OP_TANH, KILN_OP_SIGMOID,
  KILN_OP_RELU, KILN_OP_FLOOR, KILN_OP_CEIL, KILN_OP_ROUND, KILN_OP_TRUNC, KILN_OP_RECIPROCAL,
  KILN_OP_SQUARE, KILN_OP_ERF, KILN_OP_LOGICAL_NOT,
  /* binary elementwise, with broadcasting */
  KILN_OP_ADD, KILN_OP_SUB, KILN_OP_MUL, KILN_OP_DIV, KILN_OP_POW, KILN_OP_MAXIMUM, KILN_OP_MINIMUM,
  KILN_OP_REMAINDER, KILN_OP_EQ, KILN_OP_NE, KILN_OP_LT, KILN_OP_LE, KILN_OP_GT, KILN_OP_GE,
  KILN_OP_LOGICAL_AND, KILN_OP_LOGICAL_OR,
  /* ternary elementwise */
  KILN_OP_WHERE, KILN_OP_CLAMP,
  /* reductions */
  KILN_OP_SUM, KILN_OP_MEAN, KILN_OP_PROD, KILN_OP_MAX, KILN_OP_MIN, KILN_OP_ARGMAX, KILN_OP_ARGMIN,
  KILN_OP_VAR, KILN_OP_STD, KILN_OP_NORM, KILN_OP_LOGSUMEXP,
  /* linear algebra */
  KILN_OP_GEMM,
  /* joining and indexing */
  KILN_OP_CAT, KILN_OP_INDEX_SELECT, KILN_OP_GATHER, KILN_OP_SCATTER_ADD, KILN_OP_MASKED_FILL,
  KILN_OP_MASKED_SELECT,
  /* random fills */
  KILN_OP_UNIFORM, KILN_OP_NORMAL, KILN_OP_RANDINT,
  /* fused neural-network ops (kiln/nn.h), each forward with its backward */
  KILN_OP_CONV2D, KILN_OP_CONV2D_BACKWARD, KILN_OP_MAX_POOL2D, KILN_OP_MAX_POOL2D_BACKWARD,
  KILN_OP_AVG_POOL2D, KILN_OP_AVG_POOL2D_BACKWARD, KILN_OP_BATCH_NORM, KILN_OP_BATCH_NORM_BACKWARD,
  KILN_OP_LAYER_NORM, KILN_OP_LAYER_NORM_BACKWARD, KILN_OP_GROUP_NORM, KILN_OP_GROUP_NORM_BACKWARD,
  KILN_OP_SOFTMAX, KILN_OP_SOFTMAX_BACKWARD, KILN_OP_LOG_SOFTMAX, KILN_OP_LOG_SOFTMAX_BACKWARD,
  KILN_OP_NLL_LOSS, KILN_OP_NLL_LOSS_BACKWARD, KILN_OP_DROPOUT,
  /* optimizer updates over a list of parameters (kiln/optim.h) */
  KILN_OP_SGD_STEP, KILN_OP_ADAM_STEP, KILN_OP_RMSPROP_STEP, KILN_OP_ADAGRAD_STEP,
  /* recurrent layers (kiln/rnn.h) */
  KILN_OP_RNN, KILN_OP_RNN_BACKWARD,
  /* connectionist temporal classification (kiln/nn.h) */
  KILN_OP_CTC_LOSS, KILN_OP_CTC_LOSS_BACKWARD,
  /* added since; the enum only grows at its end, and an op's family is its row in the op table */
  KILN_OP_ISNAN, KILN_OP_ISINF, KILN_OP_ISFINITE,
  KILN_OP_ERFINV, KILN_OP_ATAN2, KILN_OP_ARGSORT, KILN_OP_CUMSUM, KILN_OP_CUMPROD, KILN_OP_CUMPROD_BACKWARD,
  KILN_OP_RELU_BACKWARD,
  KILN_OP_CONV2D_RELU_MAX_POOL2D, KILN_OP_CONV2D_RELU_MAX_POOL2D_BACKWARD,
  KILN_OP_LINEAR,
  KILN_OP_COUNT
};

/* "add", "argmax"; "?" for a bad value. */
const char *kiln_op_name(int op);

/* One row of the op table, as kiln reports it (docs/ops.md is generated from these). saves and
   grad_inputs are bit sets: bit k for input k, bit 4 for the output; the dtype sets have bit d for
   dtype d; autocast is "keep", "lower" (runs in bf16/f16), "f32" or "promote". */
struct kiln_op_desc {
  const char *name;
  const char *family;
  int arity;
  int differentiable;
  int keeps_integers;
  int comparison;
  int backward_kernel;      /* the backward half of a fused op, run by its derivative */
  int variadic;
  unsigned saves;
  unsigned grad_inputs;
  unsigned dtypes_cpu;
  unsigned dtypes_cuda;
  const char *autocast;
  const char *derivative;   /* the derivative's function name, "" when none */
  int needs_float;          /* integer operands give an f32 result (div) */
};
/* KILN_ERR_ARGUMENT for an op outside the enum. */
int kiln_op_describe(int op, struct kiln_op_desc *out);
/* 1 when the backend of that device type has a kernel for op. */
int kiln_op_supported(int op, int device_type);

/* Mixed precision (autocast), per thread. While it is on (dtype KILN_BF16 or KILN_F16), each op
   converts its f32, f16 and bf16 inputs by its op-table class: "lower" to the autocast dtype, "f32"
   to f32, "keep" and "promote" leave them; a dtype the device's kernel does not take becomes f32.
   f64 and integer inputs are never converted. kiln_autocast_set gives the previous dtype (-1: off);
   -1 turns autocast off. */
int kiln_autocast_set(int dtype);
int kiln_autocast_get(void);
/* The dtype an input of dtype `dtype` gets in op on a device of type device_type, under autocast to
   `lower` (KILN_BF16 or KILN_F16); -1 for a bad op or lower. */
int kiln_autocast_dtype(int op, int dtype, int device_type, int lower);

/* Elementwise. Results take the promoted dtype of the inputs; ops that need a float
   (sqrt, exp, div, ...) give f32 for integer inputs; comparisons give bool. */
struct kiln_tensor *kiln_unary(int op, const struct kiln_tensor *a);
struct kiln_tensor *kiln_binary(int op, const struct kiln_tensor *a, const struct kiln_tensor *b);
/* a op s, or s op a when reverse is 1. An integer tensor with a non-integer scalar gives f32. */
struct kiln_tensor *kiln_binary_scalar(int op, const struct kiln_tensor *a, double s, int reverse);
/* In place: a = op(a), a = a op b, a = a op s. a keeps its dtype and shape. */
int kiln_unary_(int op, struct kiln_tensor *a);
int kiln_binary_(int op, struct kiln_tensor *a, const struct kiln_tensor *b);
int kiln_binary_scalar_(int op, struct kiln_tensor *a, double s);
struct kiln_tensor *kiln_where(const struct kiln_tensor *cond, const struct kiln_tensor *a, const struct kiln_tensor *b);
/* Clamp to [lo, hi]; has_lo / has_hi say which bounds apply. */
struct kiln_tensor *kiln_clamp(const struct kiln_tensor *a, double lo, double hi, int has_lo, int has_hi);

/* Reductions over ndims dims (all dims when ndims is 0). p is the norm's order for NORM and
   the correction (1: unbiased) for VAR and STD. ARGMAX/ARGMIN take one dim or none (then the
   index is into the flattened tensor) and give i64 indices counted from 0. */
struct kiln_tensor *kiln_reduce(int op, const struct kiln_tensor *a, int ndims, const int *dims, int keepdim, double p);

/* Along one dim, keeping its length. cumsum and cumprod: integers and bool give i64, floats keep
   their dtype. argsort: i64 indices counted from 0 that sort each line ascending (descending when
   descending is 1), stable (equal elements keep their order), NaN above every number. */
struct kiln_tensor *kiln_cumsum(const struct kiln_tensor *a, int dim);
struct kiln_tensor *kiln_cumprod(const struct kiln_tensor *a, int dim);
struct kiln_tensor *kiln_argsort(const struct kiln_tensor *a, int dim, int descending);
/* The first k of argsort's indices along dim (the result has k there): topk's, without sorting
   whole lines when k is small. */
struct kiln_tensor *kiln_argsort_k(const struct kiln_tensor *a, int dim, int descending, int64_t k);

/* Matrix products through BLAS (f32, f64; f16 and bf16 compute in f32). */
struct kiln_tensor *kiln_mm(const struct kiln_tensor *a, const struct kiln_tensor *b);     /* [n,k] @ [k,m] */
struct kiln_tensor *kiln_bmm(const struct kiln_tensor *a, const struct kiln_tensor *b);    /* [b,n,k] @ [b,k,m] */
struct kiln_tensor *kiln_matmul(const struct kiln_tensor *a, const struct kiln_tensor *b); /* NumPy matmul rules */
/* out = a @ b into an existing tensor: 2-d [n,k] @ [k,m] or batched 3-d; out has the result's
   shape and dtype (no allocation, for hot loops). */
int kiln_matmul_out(struct kiln_tensor *out, const struct kiln_tensor *a, const struct kiln_tensor *b);
/* beta * c + alpha * (a @ b), c broadcast to [n,m]. */
struct kiln_tensor *kiln_addmm(const struct kiln_tensor *c, const struct kiln_tensor *a, const struct kiln_tensor *b,
                               double beta, double alpha);
/* x [*, in] @ weight^T + bias (weight [out, in], bias [out] or NULL) -> [*, out], then relu when relu is
   1: nn.Linear, and a ReLU after it, as one op. On the CPU in f32 and f64 one product whose stores
   add the bias and clamp; matmul, add and relu elsewhere. The same bits either way. */
struct kiln_tensor *kiln_linear(const struct kiln_tensor *x, const struct kiln_tensor *weight, const struct kiln_tensor *bias,
                                int relu);

/* How f32 matrix products may compute on a GPU, as PyTorch's set_float32_matmul_precision:
   HIGHEST (the default) in exact f32; HIGH may use TF32 tensor cores (inputs rounded to 10
   mantissa bits, f32 accumulation); MEDIUM may use BF16 (inputs rounded to 7 bits, or TF32
   where the library prefers). One setting for the process, read at each product. The CPU always
   computes in f32, and f64, f16 and bf16 products ignore the setting. */
enum kiln_matmul_precision {
  KILN_MATMUL_HIGHEST = 0,
  KILN_MATMUL_HIGH = 1,
  KILN_MATMUL_MEDIUM = 2
};
/* KILN_ERR_ARGUMENT (and the setting unchanged) for a value outside the enum. */
int kiln_set_float32_matmul_precision(int precision);
int kiln_get_float32_matmul_precision(void);

/* Joining. */
struct kiln_tensor *kiln_cat(int n, struct kiln_tensor *const *tensors, int dim);
struct kiln_tensor *kiln_stack(int n, struct kiln_tensor *const *tensors, int dim);

/* Indexing. Indices are i64 (or i32) tensors counted from 0; a negative index is an error. */
struct kiln_tensor *kiln_index_select(const struct kiln_tensor *a, int dim, const struct kiln_tensor *index);
struct kiln_tensor *kiln_gather(const struct kiln_tensor *a, int dim, const struct kiln_tensor *index);
/* A copy of a with src added at index along dim. */
struct kiln_tensor *kiln_scatter_add(const struct kiln_tensor *a, int dim, const struct kiln_tensor *index,
                                     const struct kiln_tensor *src);
int kiln_scatter_add_(struct kiln_tensor *a, int dim, const struct kiln_tensor *index, const struct kiln_tensor *src);
struct kiln_tensor *kiln_masked_fill(const struct kiln_tensor *a, const struct kiln_tensor *mask, double value);
int kiln_masked_fill_(struct kiln_tensor *a, const struct kiln_tensor *mask, double value);
/* The elements of a where mask (broadcast) is true, as a 1-d tensor. */
struct kiln_tensor *kiln_masked_select(const struct kiln_tensor *a, const struct kiln_tensor *mask);

#endif
