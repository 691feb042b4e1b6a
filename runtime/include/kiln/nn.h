/* kiln/nn.h: the fused neural-network ops (convolution, pooling, normalisation, softmax, losses,
   dropout, CTC), each a forward kernel with its own backward. Dims and class indices count from 0. */
#ifndef KILN_NN_H
#define KILN_NN_H
#include <stdint.h>
#include <kiln/tensor.h>

/* Reductions of the losses. */
enum kiln_reduction { KILN_REDUCTION_NONE = 0, KILN_REDUCTION_MEAN = 1, KILN_REDUCTION_SUM = 2 };

/* input [N,C,H,W], weight [O,C/groups,kh,kw], bias [O] or NULL -> [N,O,OH,OW]. */
struct kiln_tensor *kiln_conv2d(const struct kiln_tensor *input, const struct kiln_tensor *weight,
                                const struct kiln_tensor *bias, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                                int64_t pad_w, int64_t dil_h, int64_t dil_w, int64_t groups);
/* max_pool2d(relu(conv2d(...)), 2): 2x2 windows at stride 2 -> [N,O,OH/2,OW/2]. One kernel where the
   CPU has one (f32, bf16), the three ops elsewhere; the same result either way. */
struct kiln_tensor *kiln_conv2d_relu_max_pool2d(const struct kiln_tensor *input, const struct kiln_tensor *weight,
                                                const struct kiln_tensor *bias, int64_t stride_h, int64_t stride_w,
                                                int64_t pad_h, int64_t pad_w, int64_t dil_h, int64_t dil_w, int64_t groups);
/* The input-gradient of conv2d as an op: input [N,C,H,W], weight [C,O/groups,kh,kw], bias [O] or NULL
   -> [N,O,(H-1)*stride-2*pad+dil*(k-1)+out_pad+1,...]. */
struct kiln_tensor *kiln_conv_transpose2d(const struct kiln_tensor *input, const struct kiln_tensor *weight,
                                          const struct kiln_tensor *bias, int64_t stride_h, int64_t stride_w,
                                          int64_t pad_h, int64_t pad_w, int64_t out_pad_h, int64_t out_pad_w,
                                          int64_t dil_h, int64_t dil_w, int64_t groups);

/* Pooling over the last two dims of [N,C,H,W] or [C,H,W]. */
struct kiln_tensor *kiln_max_pool2d(const struct kiln_tensor *input, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                    int64_t ph, int64_t pw, int64_t dil_h, int64_t dil_w, int ceil_mode);
struct kiln_tensor *kiln_avg_pool2d(const struct kiln_tensor *input, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                    int64_t ph, int64_t pw, int ceil_mode, int count_include_pad);
struct kiln_tensor *kiln_adaptive_avg_pool2d(const struct kiln_tensor *input, int64_t out_h, int64_t out_w);

/* input [N,C,...]; weight, bias, running_mean, running_var [C] or NULL. Training (or no running
   stats) normalises with the batch statistics, and training updates the running stats in place
   (unbiased variance; not recorded by autograd); eval uses the running stats. */
struct kiln_tensor *kiln_batch_norm(const struct kiln_tensor *input, const struct kiln_tensor *weight,
                                    const struct kiln_tensor *bias, struct kiln_tensor *running_mean,
                                    struct kiln_tensor *running_var, int training, double momentum, double eps);
/* Normalise over the last normalized_ndim dims; weight and bias have those dims' shape, or are NULL. */
struct kiln_tensor *kiln_layer_norm(const struct kiln_tensor *input, int normalized_ndim,
                                    const struct kiln_tensor *weight, const struct kiln_tensor *bias, double eps);
/* input [N,C,...] normalised over groups of C/groups channels; weight, bias [C] or NULL. */
struct kiln_tensor *kiln_group_norm(const struct kiln_tensor *input, int64_t groups, const struct kiln_tensor *weight,
                                    const struct kiln_tensor *bias, double eps);

struct kiln_tensor *kiln_softmax(const struct kiln_tensor *input, int dim);
struct kiln_tensor *kiln_log_softmax(const struct kiln_tensor *input, int dim);

/* logp [N,C] or [N,C,d1,...]; target i64 class indices [N] or [N,d1,...]; weight [C] or NULL.
   Targets equal to ignore_index add nothing; mean divides by the weight of the other targets.
   reduction: enum kiln_reduction. */
struct kiln_tensor *kiln_nll_loss(const struct kiln_tensor *logp, const struct kiln_tensor *target,
                                  const struct kiln_tensor *weight, int64_t ignore_index, int reduction);
/* log_softmax over dim 1 and nll_loss in one op, with label smoothing as PyTorch defines it. */
struct kiln_tensor *kiln_cross_entropy(const struct kiln_tensor *logits, const struct kiln_tensor *target,
                                       const struct kiln_tensor *weight, int64_t ignore_index,
                                       double label_smoothing, int reduction);

/* Connectionist temporal classification (Graves et al. 2006) with PyTorch's semantics.
   log_probs [T,N,C] f32 or f64 (log-softmaxed over C; the gradient is taken w.r.t. log_probs as
   free values); targets i64 (or i32) labels, [N,S] padded (S >= every target length; entries past
   a sample's length are ignored) or 1-d, the targets of the batch concatenated; input_lengths,
   target_lengths i64 (or i32) [N], CPU tensors. Labels lie in [0,C) and differ from blank. Returns
   the loss: [N] for KILN_REDUCTION_NONE, else 0-d (mean: each loss divided by its target length
   (at least 1), then averaged over the batch). A sample whose input is shorter than its target
   needs (target length plus the number of repeated neighbours) is an error unless zero_infinity
   is set; zero_infinity gives infinite losses (and their gradients) the value 0. Time steps past
   a sample's input length get zero gradient. */
struct kiln_tensor *kiln_ctc_loss(const struct kiln_tensor *log_probs, const struct kiln_tensor *targets,
                                  const struct kiln_tensor *input_lengths, const struct kiln_tensor *target_lengths,
                                  int64_t blank, int reduction, int zero_infinity);

/* Zero each element with probability p (from the generator of kiln/random.h) and scale the rest
   by 1/(1-p); p = 0 or training = 0 gives the input unchanged (a new reference). */
struct kiln_tensor *kiln_dropout(const struct kiln_tensor *input, double p, int training);

#endif
