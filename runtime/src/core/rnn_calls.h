/* rnn_calls.h: how rnn.c hands one recurrent layer to its kernels (kiln/rnn.h says what the
   layer computes). Every tensor here is contiguous and of one float dtype; lengths is i64 [B]. */
#ifndef KILN_RNN_CALLS_H
#define KILN_RNN_CALLS_H
#include "internal.h"

struct kiln_rnn_tensors {
  const struct kiln_tensor *x;                 /* [T,B,I] */
  const struct kiln_tensor *h0, *c0;           /* [B,H] or NULL */
  const struct kiln_tensor *w_ih, *w_hh;       /* [G*H,I], [G*H,H] */
  const struct kiln_tensor *b_ih, *b_hh;       /* [G*H] or NULL */
  const struct kiln_tensor *lengths;           /* [B] or NULL */
  const struct kiln_tensor *index;             /* i64 [T,B]: x is a table [V,G*H] of projected rows it
                                                  picks (w_ih NULL), or NULL */
};

/* What a step keeps for the backward, per (t, b), in units of H: LSTM i,f,g,o (activated) and c;
   GRU r,z,n and hn = w_hn h + b_hn; the plain RNN reads its outputs and keeps nothing. */
static inline int kiln_rnn_gates(int mode) { return mode == KILN_RNN_LSTM ? 4 : mode == KILN_RNN_GRU ? 3 : 1; }
static inline int kiln_rnn_reserve(int mode) { return mode == KILN_RNN_LSTM ? 5 : mode == KILN_RNN_GRU ? 4 : 0; }
static inline int kiln_rnn_states(int mode) { return mode == KILN_RNN_LSTM ? 2 : 1; }

/* AUTO on the CPU (rnn.c, kiln_rnn_choose_algo): the persistent path for batches up to
   KILN_RNN_PERSISTENT_MAX_BATCH: always at 1 thread, and from 2 (above batch 16 only from hidden
   KILN_RNN_PERSISTENT_MIN_HIDDEN_ABOVE_16) when each thread has enough of a step's products to pay
   for a barrier per step: G * (hidden / threads) * hidden * batch multiply-adds (docs/rnn.md has
   the measurements). A layer of one step (the cells) runs GEMM. */
enum { KILN_RNN_PERSISTENT_MAX_BATCH = 128, KILN_RNN_PERSISTENT_MIN_HIDDEN_ABOVE_16 = 256 };

/* RNN: out Z [T+S,B,H]; extra: struct kiln_rnn_forward. ints: mode, reverse, algo (GEMM,
   PERSISTENT or CUDNN, already chosen). GEMM and PERSISTENT write the reserve rnn.c made in this
   layout; CUDNN has a reserve of cuDNN's own size and layout instead, which only the kernel knows
   before it runs: rnn.c passes reserve NULL and the kernel makes cudnn_reserve (a u8 tensor on
   the device, a new reference the caller takes over) for the backward to hand back. */
struct kiln_rnn_forward {
  struct kiln_rnn_tensors t;
  struct kiln_tensor *reserve;                 /* [T,B,R*H] written, or NULL when R = 0 or CUDNN */
  struct kiln_tensor *cudnn_reserve;           /* CUDNN: out, cuDNN's reserve space; else NULL */
  int inference;                               /* no backward will follow (no grad wanted): CUDNN
                                                  runs cuDNN's inference mode and keeps no reserve */
};

/* RNN_BACKWARD: extra: struct kiln_rnn_backward; ints as the forward. The kernel overwrites the
   grads that are not NULL. */
struct kiln_rnn_backward {
  struct kiln_rnn_tensors t;
  const struct kiln_tensor *z, *reserve, *gz;  /* the forward's output and reserve (CUDNN: its
                                                  cudnn_reserve); gz like z */
  struct kiln_tensor *gx, *gh0, *gc0, *gw_ih, *gw_hh, *gb_ih, *gb_hh;
};

#endif
