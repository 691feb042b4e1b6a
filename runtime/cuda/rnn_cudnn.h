/* cuda/rnn_cudnn.h: the host-side bookkeeping of the cuDNN path of one recurrent layer
   (rnn_cudnn.cu), as plain C that tests/c/test_cuda_rnn_cudnn.c checks without a GPU: kiln's
   modes as cuDNN's cell modes, which cuDNN weight matrix (linLayerID) each gate of PyTorch's
   layout goes to, and the per-sequence time reversal that runs a reverse layer forward. */
#ifndef KILN_CUDA_RNN_CUDNN_H
#define KILN_CUDA_RNN_CUDNN_H
#include <stdint.h>

#ifdef __CUDACC__
#define KILN_RNN_HD __host__ __device__
#else
#define KILN_RNN_HD
#endif

/* cudnnRNNMode_t's values (cudnn_adv.h): CUDNN_RNN_RELU 0, CUDNN_RNN_TANH 1, CUDNN_LSTM 2,
   CUDNN_GRU 3. kiln's enum kiln_rnn_mode has tanh 0, relu 1, GRU 2, LSTM 3. */
enum { KILN_CUDNN_RNN_RELU = 0, KILN_CUDNN_RNN_TANH = 1, KILN_CUDNN_LSTM = 2, KILN_CUDNN_GRU = 3 };

static inline int kiln_rnn_cudnn_cell_mode(int mode) {
  switch (mode) {
  case 0: return KILN_CUDNN_RNN_TANH;
  case 1: return KILN_CUDNN_RNN_RELU;
  case 2: return KILN_CUDNN_GRU;
  case 3: return KILN_CUDNN_LSTM;
  default: return -1;
  }
}

/* The linLayerID (cudnnGetRNNWeightParams) of gate g of PyTorch's layout, for the input-side
   matrix and bias (w_ih, b_ih rows g*H..(g+1)*H-1) or the recurrent one (w_hh, b_hh); -1 for a
   gate the mode does not have. cuDNN numbers the input-side matrices first, then the recurrent
   ones, each in its own gate order: LSTM 0-3 input, forget, new memory (g), output, 4-7 the
   same on the recurrent side; GRU 0-2 reset (r), update (z), new memory (n), 3-5 the same; the
   plain RNN 0 input, 1 recurrent. Those orders are PyTorch's (i,f,g,o and r,z,n), and cuDNN's
   GRU applies r after the recurrent product (h' = tanh(W x + b_W + r * (R h + b_R))) as
   PyTorch's n does, so the map is the position in the gate order, offset by the gate count
   for the recurrent side. */
static inline int kiln_rnn_cudnn_lin_layer(int mode, int recurrent, int gate) {
  int G = mode == 3 ? 4 : mode == 2 ? 3 : mode == 0 || mode == 1 ? 1 : 0;
  if (gate < 0 || gate >= G) return -1;
  return (recurrent ? G : 0) + gate;
}

/* Where step t of sequence b (length len, 1 <= len <= T) is read from when the sequence is
   reversed within its own length: len-1-t for t < len, t itself in the padding. The map is its
   own inverse, so the same gather reverses the input before cuDNN and its output after. */
static inline KILN_RNN_HD int64_t kiln_rnn_cudnn_reversed_time(int64_t t, int64_t len) { return t < len ? len - 1 - t : t; }

/* Element i of a [T,B,N] buffer gathered from [T,B,N] with every sequence reversed in its length
   (lengths [B] or NULL: all T): the source's linear index. */
static inline KILN_RNN_HD int64_t kiln_rnn_cudnn_reversed_index(int64_t i, int64_t T, int64_t B, int64_t N, const int64_t *lengths) {
  int64_t row = i / N, col = i - row * N, t = row / B, b = row - t * B;
  int64_t src = kiln_rnn_cudnn_reversed_time(t, lengths ? lengths[b] : T);
  return (src * B + b) * N + col;
}

/* Element i of the output grads as cuDNN's backward reads them: gathered from the grads of the
   layer's output (reversed within each length when the layer runs backwards), or -1, a zero, in a
   sequence's padding: the CPU path never reads the grads there, and cuDNN's documentation does
   not say that it ignores them. */
static inline KILN_RNN_HD int64_t kiln_rnn_cudnn_grad_index(int64_t i, int64_t T, int64_t B, int64_t N, const int64_t *lengths,
                                                            int reverse) {
  int64_t row = i / N, t = row / B, b = row - t * B;
  if (lengths && t >= lengths[b]) return -1;
  return reverse ? kiln_rnn_cudnn_reversed_index(i, T, B, N, lengths) : i;
}

#endif
