/* nn_calls.h: how the front ends of nn.c hand the fused nn ops to their kernels: what each call's
   in[], ints[], scalar[] hold, and the structs `extra` points to when a kernel writes several outputs. */
#ifndef KILN_NN_CALLS_H
#define KILN_NN_CALLS_H
#include "internal.h"

/* CONV2D: out y [N,O,OH,OW]; in x [N,C,H,W], w [O,C/groups,kh,kw], bias [O] or NULL.
   ints: stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups.
   CONV2D_BACKWARD: in gy [N,O,OH,OW], x (NULL unless gw is wanted), w, bias added to gx or NULL
   (conv_transpose2d's forward is this kernel); same ints; extra: struct kiln_conv_grads. Sizes
   come from the tensors, so gx may be larger than the conv of its own size would give. */
struct kiln_conv_grads {
  struct kiln_tensor *gx, *gw, *gb;   /* each NULL when not wanted; the kernel overwrites them */
};
enum { KILN_CONV_INTS = 7 };

/* CONV2D_RELU_MAX_POOL2D: conv2d, relu and max_pool2d of 2x2 windows at stride 2 as one call; out
   the pooled y [N,O,OH/2,OW/2]; in x, w, bias as CONV2D; ints: CONV2D's, then OH, OW (the conv's
   output), then the layout the kernel took (0 in the forward's call); extra: struct
   kiln_conv_pool. A CPU kernel may decline the call (taken stays 0, nothing written): the front
   end then runs the three ops. When taken, codes holds what the backward reads (the kernel's own
   layout). CONV2D_RELU_MAX_POOL2D_BACKWARD: in the pooled gy, x, w, codes; the same ints; extra:
   struct kiln_conv_grads. */
struct kiln_conv_pool {
  int input_grad;              /* given: the input's grad will be asked for */
  struct kiln_tensor *codes;   /* made by the kernel */
  int taken, layout;           /* layout: which layout codes is in, the backward's last int */
};
enum { KILN_CONV_POOL_INTS = KILN_CONV_INTS + 3 };

/* MAX_POOL2D: out y; in x ([N,C,H,W] or [C,H,W]); extra: the i64 indices tensor (shaped like y,
   h * W + w into each plane). ints: kh, kw, sh, sw, ph, pw, dil_h, dil_w.
   MAX_POOL2D_BACKWARD: out gx (shaped like x); in gy, indices.
   AVG_POOL2D: out y; in x. ints: kh, kw, sh, sw, ph, pw, count_include_pad, adaptive (windows
   [floor(i*H/OH), ceil((i+1)*H/OH)), the other ints unused). AVG_POOL2D_BACKWARD: out gx; in gy. */

/* BATCH_NORM: out y; in x [N,C,...], w, b ([C] or NULL); extra: struct kiln_norm_stats.
   ints: batch_stats (1: normalise with the batch's statistics, else with the running ones),
   update (1: update the running stats). scalar: eps, momentum.
   LAYER_NORM: rows are the leading dims, ints[0] = normalized_ndim; scalar[0] = eps.
   GROUP_NORM: rows are (n, group), ints[0] = groups; scalar[0] = eps.
   *_BACKWARD: in gy, x, w (or NULL); ints as the forward; extra: struct kiln_norm_grads. */
struct kiln_norm_stats {
  struct kiln_tensor *mean, *invstd;          /* written: per channel / row, dtype of x */
  struct kiln_tensor *running_mean, *running_var;
};
struct kiln_norm_grads {
  const struct kiln_tensor *mean, *invstd;    /* as the forward saved them */
  struct kiln_tensor *gx, *gw, *gb;           /* each NULL when not wanted */
};

/* SOFTMAX, LOG_SOFTMAX: out y; in x; ints[0] = dim (normalised).
   *_BACKWARD: out gx; in gy, y; ints[0] = dim. */

/* NLL_LOSS: out loss ([N,d1,...] for no reduction, else 0-d); in input, target (i64), weight or NULL.
   ints: reduction, ignore_index, fused (1: input is logits; log_softmax over dim 1 comes first).
   scalar[0] = label smoothing (fused only). extra: struct kiln_nll_extra.
   NLL_LOSS_BACKWARD: out gx (shaped like input); in g (shaped like loss), target, weight, logp
   (fused only); same ints; scalar: smoothing, total weight. */
struct kiln_nll_extra {
  struct kiln_tensor *logp;   /* fused: written with log_softmax(input) */
  double total_weight;        /* written: the sum of weight[target] over non-ignored targets */
};

/* CTC_LOSS: out loss ([N] for no reduction, else 0-d); in log_probs [T,N,C], labels: a contiguous
   i64 [N, 2 + S] on the device of log_probs, row n = input length, target length, then the target
   (classes from 0, blank excluded) padded to S, the longest target. ints: blank, reduction,
   zero_infinity. extra: struct kiln_ctc_extra, written. A sample with no alignment gets an
   infinite nll (the front end has refused it unless zero_infinity is set).
   CTC_LOSS_BACKWARD: out grad [T,N,C] (of log_probs); in g (shaped like loss), log_probs, labels,
   nll; extra: the forward's log_alpha; same ints. */
struct kiln_ctc_extra {
  struct kiln_tensor *nll;         /* [N]: -log p(target | input) of every sample, dtype of log_probs */
  struct kiln_tensor *log_alpha;   /* [N, T, 2S+1]: the forward variables (read for t < input length only) */
};

/* DROPOUT: out y; in x; extra: the mask tensor (0 or 1/(1-p), dtype of x). scalar[0] = p.
   ints: seed, offset: element i takes word i % 4 of Philox block offset + i / 4. */

#endif
