/* kiln/optim.h: fused optimizer updates (SGD, Adam/AdamW, RMSprop, Adagrad) over a list of
   parameters, one call per parameter group, and gradient clipping. */
#ifndef KILN_OPTIM_H
#define KILN_OPTIM_H
#include <stdint.h>
#include <kiln/tensor.h>

/* The updates follow PyTorch's single-tensor algorithms exactly, with the arithmetic in the
   parameter's dtype (f32 or f64). Arrays have n entries, entry i belonging to params[i]:
   - grads[i] NULL: parameter i has no grad this step and is skipped (its state is not read);
   - every grad and state tensor has its parameter's shape, dtype and device; state tensors
     are contiguous (a non-contiguous parameter or grad is fine, only slower);
   - the parameters and state tensors are updated in place, without recording autograd history,
     and their versions are bumped.
   Every tensor is checked before any is written: on failure (a message naming the op, the
   parameter's index counted from 0, and the shapes) nothing has changed.
   State arrays that an option does not use may be NULL or hold NULL entries. */

/* momentum_bufs: used when momentum != 0; first_step: the buffers are set to the grad (with
   weight decay) rather than updated, as PyTorch does when a parameter has no buffer yet. */
int kiln_sgd_step(int n, struct kiln_tensor *const *params, struct kiln_tensor *const *grads,
                  struct kiln_tensor *const *momentum_bufs, double lr, double momentum, double dampening,
                  double weight_decay, int nesterov, int first_step);

/* step counts from 1 (the step being taken, after the increment). decoupled: AdamW's decay
   (param *= 1 - lr * weight_decay) instead of Adam's L2 term; max_exp_avg_sqs used when amsgrad. */
int kiln_adam_step(int n, struct kiln_tensor *const *params, struct kiln_tensor *const *grads,
                   struct kiln_tensor *const *exp_avgs, struct kiln_tensor *const *exp_avg_sqs,
                   struct kiln_tensor *const *max_exp_avg_sqs, int64_t step, double lr, double beta1, double beta2,
                   double eps, double weight_decay, int decoupled, int amsgrad);

/* momentum_bufs used when momentum > 0, grad_avgs when centered. */
int kiln_rmsprop_step(int n, struct kiln_tensor *const *params, struct kiln_tensor *const *grads,
                      struct kiln_tensor *const *square_avgs, struct kiln_tensor *const *momentum_bufs,
                      struct kiln_tensor *const *grad_avgs, double lr, double alpha, double eps, double weight_decay,
                      double momentum, int centered);

/* step counts from 1; the learning rate is lr / (1 + (step - 1) * lr_decay). */
int kiln_adagrad_step(int n, struct kiln_tensor *const *params, struct kiln_tensor *const *grads,
                      struct kiln_tensor *const *sums, int64_t step, double lr, double lr_decay, double weight_decay,
                      double eps);

/* The norm of order norm_type (> 0, or inf) of all grads together, computed in double and
   independent of the thread count, written to *total_norm_out (may be NULL). When it exceeds
   max_norm, every grad is scaled in place by max_norm / (total + 1e-6). NULL entries are skipped. */
int kiln_clip_grad_norm(int n, struct kiln_tensor *const *grads, double max_norm, double norm_type,
                        double *total_norm_out);
/* Clamp every grad in place to [-clip, clip]. NULL entries are skipped. */
int kiln_clip_grad_value(int n, struct kiln_tensor *const *grads, double clip);

#endif
