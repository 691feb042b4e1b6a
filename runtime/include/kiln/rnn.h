/* kiln/rnn.h: one layer of a recurrent network in one direction, as one op with its own backward.
   Layers, directions and dropout between layers are put together by kiln.nn (lua/kiln/nn/rnn.lua).
   Weights are laid out as PyTorch lays them out: w_ih [G*H, I], w_hh [G*H, H], b_ih, b_hh [G*H],
   gates in the order i,f,g,o (LSTM) and r,z,n (GRU). */
#ifndef KILN_RNN_H
#define KILN_RNN_H
#include <stddef.h>
#include <stdint.h>
#include <kiln/tensor.h>

enum kiln_rnn_mode { KILN_RNN_TANH = 0, KILN_RNN_RELU = 1, KILN_RNN_GRU = 2, KILN_RNN_LSTM = 3 };

/* How the recurrence runs on the CPU. GEMM: one matrix product per timestep over the batch, then
   one fused kernel for the gates. PERSISTENT: the pool's threads stay in the op for the whole
   sequence, each owning a slice of the hidden units and its rows of w_hh (kept in that core's
   cache), and meet at a spinning barrier once per timestep. AUTO picks PERSISTENT when the
   batch is small and the weights fit in the cores' caches.
   On CUDA: GEMM runs kiln's own kernels (one cuBLAS product per step and a fused gate kernel);
   CUDNN runs cuDNN's RNN API (cudnnRNNForward and its backward), and is what AUTO picks there
   when the CUDA backend was built with cuDNN. PERSISTENT is CPU-only and CUDNN CUDA-only. */
enum kiln_rnn_algo { KILN_RNN_AUTO = 0, KILN_RNN_GEMM = 1, KILN_RNN_PERSISTENT = 2, KILN_RNN_CUDNN = 3 };

/* x [T,B,I]; h0 [B,H] or NULL (zeros); c0 [B,H] or NULL (LSTM only); b_ih, b_hh or NULL;
   lengths: i64 [B] on the CPU with 1 <= lengths[b] <= T, or NULL (every sequence has T steps).
   Steps t >= lengths[b] neither change sequence b's state nor write its output (zeros there).
   reverse: run each sequence from its last valid step to its first.
   Returns Z [T+S, B, H]: Z[0..T-1] the outputs, Z[T] the final hidden state, and for LSTM
   (S = 2) Z[T+1] the final cell state; S = 1 otherwise. */
struct kiln_tensor *kiln_rnn_layer(int mode, const struct kiln_tensor *x, const struct kiln_tensor *h0,
                                   const struct kiln_tensor *c0, const struct kiln_tensor *w_ih,
                                   const struct kiln_tensor *w_hh, const struct kiln_tensor *b_ih,
                                   const struct kiln_tensor *b_hh, const struct kiln_tensor *lengths, int reverse,
                                   int algo);

/* kiln_rnn_layer with its projected input looked up: table [V, G*H] holds x w_ih^T for V inputs
   (an Embedding's table projected once), index i64 [T,B] on the CPU (counting from 0) names each
   step's row; the steps read the rows where they lie, and the table's grad is the sum of each
   step's pre-activation grads in its row. The CPU, f32 or f64 (a bf16 layer under bf16 autocast,
   reading the table in f32). */
struct kiln_tensor *kiln_rnn_layer_lookup(int mode, const struct kiln_tensor *table, const struct kiln_tensor *index,
                                          const struct kiln_tensor *h0, const struct kiln_tensor *c0,
                                          const struct kiln_tensor *w_hh, const struct kiln_tensor *b_ih,
                                          const struct kiln_tensor *b_hh, const struct kiln_tensor *lengths, int reverse,
                                          int algo);

/* The algorithm kiln_rnn_layer would run for this layer (never AUTO), and in why (when not NULL)
   the reason in words, e.g. why PERSISTENT cannot be used. Asking for PERSISTENT or CUDNN where it
   cannot run (PERSISTENT off the CPU, CUDNN off CUDA or without cuDNN) returns GEMM. A layer with
   no input features (input_size 0) runs GEMM on CUDA whatever this says: cuDNN needs one. */
int kiln_rnn_choose_algo(int mode, int64_t batch, int64_t hidden, int dtype, struct kiln_device device, int algo,
                         char *why, size_t whylen);

#endif
