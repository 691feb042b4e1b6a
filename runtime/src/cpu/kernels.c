/* cpu/kernels.c: the CPU kernels of one instruction-set level, as the op table's entries. Compiled
   once per level like the kernels themselves (cpu/cpu.h names each copy); cpu/backend.c picks one
   when libkiln is loaded. Every op has a CPU kernel; test_ops checks the table is full. */
#include "cpu.h"

const struct kiln_backend kiln_cpu_kernels = {
  .elementwise = cpu_elementwise,   /* every op of the elementwise families */
  .kernel = {
    [KILN_OP_COPY] = cpu_copy, [KILN_OP_FILL] = cpu_fill,
    [KILN_OP_SUM] = cpu_reduce, [KILN_OP_MEAN] = cpu_reduce, [KILN_OP_PROD] = cpu_reduce, [KILN_OP_MAX] = cpu_reduce,
    [KILN_OP_MIN] = cpu_reduce, [KILN_OP_ARGMAX] = cpu_reduce, [KILN_OP_ARGMIN] = cpu_reduce, [KILN_OP_VAR] = cpu_reduce,
    [KILN_OP_STD] = cpu_reduce, [KILN_OP_NORM] = cpu_reduce, [KILN_OP_LOGSUMEXP] = cpu_reduce,
    [KILN_OP_GEMM] = cpu_gemm, [KILN_OP_LINEAR] = cpu_linear,
    [KILN_OP_CAT] = cpu_cat, [KILN_OP_INDEX_SELECT] = cpu_index_select, [KILN_OP_GATHER] = cpu_gather,
    [KILN_OP_SCATTER_ADD] = cpu_scatter_add, [KILN_OP_MASKED_FILL] = cpu_masked_fill,
    [KILN_OP_MASKED_SELECT] = cpu_masked_select,
    [KILN_OP_UNIFORM] = cpu_random, [KILN_OP_NORMAL] = cpu_random, [KILN_OP_RANDINT] = cpu_random,
    [KILN_OP_CONV2D] = cpu_conv2d, [KILN_OP_CONV2D_BACKWARD] = cpu_conv2d_backward,
    [KILN_OP_CONV2D_RELU_MAX_POOL2D] = cpu_conv2d_relu_pool, [KILN_OP_CONV2D_RELU_MAX_POOL2D_BACKWARD] = cpu_conv2d_relu_pool_backward,
    [KILN_OP_MAX_POOL2D] = cpu_max_pool2d, [KILN_OP_MAX_POOL2D_BACKWARD] = cpu_max_pool2d_backward,
    [KILN_OP_AVG_POOL2D] = cpu_avg_pool2d, [KILN_OP_AVG_POOL2D_BACKWARD] = cpu_avg_pool2d_backward,
    [KILN_OP_BATCH_NORM] = cpu_batch_norm, [KILN_OP_BATCH_NORM_BACKWARD] = cpu_batch_norm_backward,
    [KILN_OP_LAYER_NORM] = cpu_row_norm, [KILN_OP_LAYER_NORM_BACKWARD] = cpu_row_norm_backward,
    [KILN_OP_GROUP_NORM] = cpu_row_norm, [KILN_OP_GROUP_NORM_BACKWARD] = cpu_row_norm_backward,
    [KILN_OP_SOFTMAX] = cpu_softmax, [KILN_OP_SOFTMAX_BACKWARD] = cpu_softmax_backward,
    [KILN_OP_LOG_SOFTMAX] = cpu_softmax, [KILN_OP_LOG_SOFTMAX_BACKWARD] = cpu_softmax_backward,
    [KILN_OP_NLL_LOSS] = cpu_nll_loss, [KILN_OP_NLL_LOSS_BACKWARD] = cpu_nll_loss_backward,
    [KILN_OP_DROPOUT] = cpu_dropout,
    [KILN_OP_SGD_STEP] = cpu_optim_step, [KILN_OP_ADAM_STEP] = cpu_optim_step, [KILN_OP_RMSPROP_STEP] = cpu_optim_step,
    [KILN_OP_ADAGRAD_STEP] = cpu_optim_step,
    [KILN_OP_RNN] = cpu_rnn, [KILN_OP_RNN_BACKWARD] = cpu_rnn_backward,
    [KILN_OP_CTC_LOSS] = cpu_ctc_loss, [KILN_OP_CTC_LOSS_BACKWARD] = cpu_ctc_loss_backward,
    [KILN_OP_ARGSORT] = cpu_argsort, [KILN_OP_CUMSUM] = cpu_scan, [KILN_OP_CUMPROD] = cpu_scan,
    [KILN_OP_CUMPROD_BACKWARD] = cpu_cumprod_backward,
  },
};
