/* cuda/rnn_cudnn_desc.c: the cuDNN descriptors of one recurrent layer (rnn_cudnn_desc.h). */
#include "rnn_cudnn_desc.h"
#include "rnn_cudnn.h"
#include "internal.h"
#include <string.h>

#define TRY(expr, name)                                                                                            \
  do {                                                                                                             \
    cudnnStatus_t s_ = (expr);                                                                                     \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                                                              \
      d->call = name;                                                                                              \
      return s_;                                                                                                   \
    }                                                                                                              \
  } while (0)

cudnnStatus_t kiln_rnn_cudnn_describe(struct kiln_rnn_cudnn_desc *d, cudnnHandle_t handle, int mode, int dtype, int T, int B,
                                      int I, int H, const int32_t *lengths) {
  memset(d, 0, sizeof *d);
  cudnnDataType_t type = dtype == KILN_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  int cell = kiln_rnn_cudnn_cell_mode(mode);
  if (cell < 0 || (dtype != KILN_F32 && dtype != KILN_F64)) {
    d->call = "cudnnSetRNNDescriptor_v8 (mode or dtype)";
    return CUDNN_STATUS_BAD_PARAM;
  }
  TRY(cudnnCreateRNNDescriptor(&d->rnn), "cudnnCreateRNNDescriptor");
  TRY(cudnnCreateDropoutDescriptor(&d->drop), "cudnnCreateDropoutDescriptor");
  TRY(cudnnCreateRNNDataDescriptor(&d->x), "cudnnCreateRNNDataDescriptor");
  TRY(cudnnCreateRNNDataDescriptor(&d->y), "cudnnCreateRNNDataDescriptor");
  TRY(cudnnCreateTensorDescriptor(&d->state), "cudnnCreateTensorDescriptor");
  if (handle) TRY(cudnnSetDropoutDescriptor(d->drop, handle, 0.0f, NULL, 0, 0), "cudnnSetDropoutDescriptor");
  /* f32 stays exact: CUDNN_DEFAULT_MATH lets f32 run on TF32 tensor cores from Ampere on */
  cudnnMathType_t math = dtype == KILN_F64 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  TRY(cudnnSetRNNDescriptor_v8(d->rnn, CUDNN_RNN_ALGO_STANDARD, (cudnnRNNMode_t)cell, CUDNN_RNN_DOUBLE_BIAS, CUDNN_UNIDIRECTIONAL,
                               CUDNN_LINEAR_INPUT, type, type, math, I, H, H, 1, d->drop,
                               CUDNN_RNN_PADDED_IO_ENABLED),
      "cudnnSetRNNDescriptor_v8");
  double fill64 = 0.0;
  float fill32 = 0.0f;
  void *fill = dtype == KILN_F64 ? (void *)&fill64 : (void *)&fill32;
  TRY(cudnnSetRNNDataDescriptor(d->x, type, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, I, lengths, fill),
      "cudnnSetRNNDataDescriptor (input)");
  TRY(cudnnSetRNNDataDescriptor(d->y, type, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, H, lengths, fill),
      "cudnnSetRNNDataDescriptor (output)");
  int dims[3] = {1, B, H}, strides[3] = {B * H, H, 1};
  TRY(cudnnSetTensorNdDescriptor(d->state, type, 3, dims, strides), "cudnnSetTensorNdDescriptor (states)");
  return CUDNN_STATUS_SUCCESS;
}

void kiln_rnn_cudnn_desc_release(struct kiln_rnn_cudnn_desc *d) {
  if (d->rnn) cudnnDestroyRNNDescriptor(d->rnn);
  if (d->drop) cudnnDestroyDropoutDescriptor(d->drop);
  if (d->x) cudnnDestroyRNNDataDescriptor(d->x);
  if (d->y) cudnnDestroyRNNDataDescriptor(d->y);
  if (d->state) cudnnDestroyTensorDescriptor(d->state);
  memset(d, 0, sizeof *d);
}
