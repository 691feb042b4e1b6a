/* cuda/rnn_cudnn_desc.h: the cuDNN descriptors of one recurrent layer (rnn_cudnn.cu), built on the
   host without a device so that tests/c/test_cuda_rnn_cudnn.c can read them back through cuDNN
   in CI: the network (cudnnSetRNNDescriptor_v8), the input and output sequences
   (cudnnSetRNNDataDescriptor) and the hidden and cell states. Built with cuDNN only. */
#ifndef KILN_CUDA_RNN_CUDNN_DESC_H
#define KILN_CUDA_RNN_CUDNN_DESC_H
#include <cudnn.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kiln_rnn_cudnn_desc {
  cudnnRNNDescriptor_t rnn;
  cudnnDropoutDescriptor_t drop;   /* no dropout: one layer */
  cudnnRNNDataDescriptor_t x, y;   /* [T,B,I] and [T,B,H], sequence-major, padded with zeros */
  cudnnTensorDescriptor_t state;   /* [1,B,H]: h0, h_n, c0, c_n */
  const char *call;                /* after a failure: the cuDNN call that failed */
};

/* Describe a layer of kiln mode (enum kiln_rnn_mode) in dtype (KILN_F32 or KILN_F64) over T steps
   of B sequences of lengths[b] steps (1..T), I input features and H hidden units: the standard
   algorithm, one layer and direction, linear input, two bias vectors, data and math in dtype,
   CUDNN_FMA_MATH for f32 (no TF32 tensor cores) and CUDNN_DEFAULT_MATH for f64, padded IO. handle (or NULL, e.g. on a machine without a
   device) sets the dropout descriptor to no dropout first. On failure d->call names the call;
   release d either way. */
cudnnStatus_t kiln_rnn_cudnn_describe(struct kiln_rnn_cudnn_desc *d, cudnnHandle_t handle, int mode, int dtype, int T, int B,
                                      int I, int H, const int32_t *lengths);
void kiln_rnn_cudnn_desc_release(struct kiln_rnn_cudnn_desc *d);

#ifdef __cplusplus
}
#endif
#endif
