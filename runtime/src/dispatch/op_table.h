/* op_table.h: every fact about an op, in one row per op (op_table.c): its name, family, arity, flags,
   what backward saves and which inputs get gradients, its derivative, the dtypes each backend's
   kernel accepts, and its class under mixed precision. Nothing else in the runtime repeats them. */
#ifndef KILN_OP_TABLE_H
#define KILN_OP_TABLE_H

struct kiln_node;
struct kiln_tensor;

/* What kind of front end runs an op (ops/<family>.c). */
enum kiln_op_family {
  KILN_FAMILY_COPY, KILN_FAMILY_UNARY, KILN_FAMILY_BINARY, KILN_FAMILY_TERNARY, KILN_FAMILY_REDUCE,
  KILN_FAMILY_LINALG, KILN_FAMILY_INDEX, KILN_FAMILY_RANDOM, KILN_FAMILY_CONV, KILN_FAMILY_POOL, KILN_FAMILY_NORM,
  KILN_FAMILY_SOFTMAX, KILN_FAMILY_LOSS, KILN_FAMILY_DROPOUT, KILN_FAMILY_OPTIM, KILN_FAMILY_RNN, KILN_FAMILY_CTC,
  KILN_FAMILY_SCAN, KILN_FAMILY_COUNT
};

enum kiln_op_flag {
  KILN_OPF_DIFFERENTIABLE = 1 << 0,  /* autograd records it when an input requires grad */
  KILN_OPF_KEEPS_INTEGERS = 1 << 1,  /* an integer input gives an integer result (else f32) */
  KILN_OPF_COMPARISON = 1 << 2,      /* the result is bool (comparisons and logical ops) */
  KILN_OPF_NEEDS_FLOAT = 1 << 3,     /* integer operands give an f32 result (div) */
  KILN_OPF_BACKWARD = 1 << 4,        /* the backward kernel of a fused op, run by its derivative */
  KILN_OPF_VARIADIC = 1 << 5         /* takes a list of tensors (cat, the optimizer steps) */
};

/* The tensors a derivative reads: bits 0-2 the inputs, bit 4 the output. */
enum { KILN_SAVE_IN0 = 1, KILN_SAVE_IN1 = 2, KILN_SAVE_IN2 = 4, KILN_SAVE_OUT = 16 };

/* What mixed precision (autocast) does with an op's float inputs. */
enum kiln_autocast_class {
  KILN_AUTOCAST_KEEP = 0,   /* runs in its inputs' dtype (copies, indexing, comparisons, steps) */
  KILN_AUTOCAST_LOWER,      /* runs in bf16/f16: matrix products, convolutions, recurrent layers */
  KILN_AUTOCAST_F32,        /* runs in f32: exp, log, pow, sums, norms, softmax, losses */
  KILN_AUTOCAST_PROMOTE     /* runs in the widest of its inputs' dtypes */
};

/* Dtype masks: bit d for dtype d. */
#define KILN_DT(d) (1u << (d))
#define KILN_DT_FLOAT (KILN_DT(KILN_F32) | KILN_DT(KILN_F64) | KILN_DT(KILN_F16) | KILN_DT(KILN_BF16))
#define KILN_DT_F32_F64 (KILN_DT(KILN_F32) | KILN_DT(KILN_F64))
#define KILN_DT_ALL (KILN_DT_FLOAT | KILN_DT(KILN_I64) | KILN_DT(KILN_I32) | KILN_DT(KILN_U8) | KILN_DT(KILN_BOOL))

/* A row's derivative: the function and its name (for docs/ops.md). */
#define KILN_DERIVATIVE(fn) .derivative = fn, .derivative_name = #fn

/* gin[k] (new references, or NULL for a zero grad) from the output grad g of node n. */
typedef int (*kiln_derivative_fn)(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);

struct kiln_op_info {
  const char *name;
  int family;                    /* enum kiln_op_family */
  int arity;                     /* tensor inputs (the least, for VARIADIC) */
  unsigned flags;                /* enum kiln_op_flag */
  unsigned saves;                /* KILN_SAVE_*: with tensor operands */
  unsigned saves_scalar;         /* binary ops with a number on the right (x op s) */
  unsigned saves_rscalar;        /* and on the left (s op x) */
  unsigned grad_inputs;          /* bit k: input k can carry a gradient (not indices, masks, conditions) */
  kiln_derivative_fn derivative; /* beside the family's front end in ops/ */
  const char *derivative_name;   /* set by KILN_DERIVATIVE */
  unsigned dtypes_cpu, dtypes_cuda;   /* what each backend's kernel accepts (KILN_DT masks) */
  int autocast;                  /* enum kiln_autocast_class */
};

extern const struct kiln_op_info kiln_ops[];
extern const char *const kiln_op_family_names[KILN_FAMILY_COUNT];

/* The row of op, or NULL for a value outside the enum. */
const struct kiln_op_info *kiln_op_info(int op);
/* 1 when op has flag (0 for a bad op). */
int kiln_op_has(int op, unsigned flag);

/* The derivatives the table names, by family (ops/). */
int kiln_unary_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_binary_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_ternary_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_reduce_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_gemm_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_cat_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_index_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_conv_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_pool_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_conv_pool_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_linear_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_norm_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_softmax_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_nll_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_dropout_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_rnn_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_ctc_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);
int kiln_scan_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin);

#endif
