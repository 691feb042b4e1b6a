/* optim_calls.h: how the front ends of optim.c hand an optimizer step to its kernel: the call's
   extra points to a struct kiln_optim_job listing every parameter's contiguous buffers. */
#ifndef KILN_OPTIM_CALLS_H
#define KILN_OPTIM_CALLS_H
#include "internal.h"

/* One parameter: contiguous buffers of numel elements, all of the job's dtype. */
struct kiln_optim_entry {
  void *param;
  const void *grad;
  void *state[3];        /* per op: SGD momentum; Adam exp_avg, exp_avg_sq, max_exp_avg_sq;
                            RMSprop square_avg, momentum, grad_avg; Adagrad sum. NULL when unused */
};

/* SGD_STEP, ADAM_STEP, RMSPROP_STEP, ADAGRAD_STEP: call->extra. The front end has checked
   everything and derived the per-step scalars; the kernel only computes. */
struct kiln_optim_job {
  int op;
  int dtype;                            /* KILN_F32 or KILN_F64 */
  int n;
  const struct kiln_optim_entry *entries;
  const int64_t *starts;                /* [n + 1]: entry k covers [starts[k], starts[k+1]) */
  double lr;                            /* Adam: lr / bias_correction1; Adagrad: the decayed lr */
  double weight_decay;
  double momentum, dampening;           /* SGD, RMSprop (momentum) */
  double beta1, beta2, eps;             /* Adam; RMSprop: alpha is beta2; Adagrad: eps */
  double bias_correction2_sqrt;         /* Adam */
  double decay;                         /* AdamW: 1 - lr * weight_decay */
  int nesterov, first_step;             /* SGD */
  int decoupled, amsgrad;               /* Adam */
  int centered;                         /* RMSprop */
};

#endif
