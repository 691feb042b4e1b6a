/* cuda/nn.cuh: per-position and per-element code of the fused nn kernels, as __host__ __device__
   functions with the arithmetic of the CPU kernels (cpu/softmax.c's nll positions, cpu/dropout.c's
   Philox words): softmax.cu, loss.cu and dropout.cu call them, tests/c/test_cuda_kernels.cu runs
   them on the CPU against libkiln. */
#ifndef KILN_CUDA_NN_CUH
#define KILN_CUDA_NN_CUH
#include "elements.cuh"

namespace kiln_nn {
using namespace kiln_el;

/* exp in the line's dtype, as the CPU's EXP (expf for f32). */
KILN_EL float exp_t(float x) { return expf(x); }
KILN_EL double exp_t(double x) { return exp(x); }

/* The loss at position q of input [N, C, S] (logp: the input, or log_softmax of the logits). */
template <class T>
KILN_EL T nll_position(const T *logp, const int64_t *target, const T *w, int64_t q, int64_t C, int64_t S, int64_t ignore,
                       double eps) {
  int64_t n = q / S, s = q % S, t = target[q];
  const T *lp = logp + n * C * S + s;
  double l = 0;
  if (t != ignore) {
    l = -(w ? (double)w[t] : 1.0) * lp[t * S];
    if (eps != 0) {
      double sm = 0;
      for (int64_t c = 0; c < C; c++) sm -= (w ? (double)w[c] : 1.0) * lp[c * S];
      l = (1 - eps) * l + eps / (double)C * sm;
    }
  }
  return (T)l;
}

/* The input's grad at position q: the C entries gx[n, :, s]. g: the loss's grad (one value per
   position for reduction none, else g[0]); weight_sum: the sum of the weights (C without). */
template <class T>
KILN_EL void nll_grad_position(T *gx, const T *g, const int64_t *target, const T *w, const T *logp, int64_t q, int64_t C,
                               int64_t S, int64_t ignore, int reduction, int fused, double eps, double total_weight,
                               double weight_sum) {
  int64_t n = q / S, s = q % S, t = target[q];
  T *o = gx + n * C * S + s;
  double gv = reduction == KILN_REDUCTION_NONE ? (double)g[q] : (double)g[0];
  if (reduction == KILN_REDUCTION_MEAN) gv /= total_weight;
  if (t == ignore) { for (int64_t c = 0; c < C; c++) o[c * S] = 0; return; }
  double wt = w ? (double)w[t] : 1.0;
  if (!fused) {
    for (int64_t c = 0; c < C; c++) o[c * S] = 0;
    o[t * S] = (T)(-wt * gv);
    return;
  }
  const T *lp = logp + n * C * S + s;
  double a = (1 - eps) * wt + eps / (double)C * weight_sum, e = eps / (double)C;
  for (int64_t c = 0; c < C; c++) {
    double p = exp((double)lp[c * S]);
    o[c * S] = (T)(gv * (a * p - e * (w ? (double)w[c] : 1.0)));
  }
  o[t * S] = (T)((double)o[t * S] - gv * (1 - eps) * wt);
}

/* Dropout's element i: the mask value (0 or scale) from word i % 4 of Philox block offset + i / 4. */
template <class T>
KILN_EL T dropout_mask(uint64_t seed, uint64_t offset, int64_t i, uint64_t threshold, double scale) {
  uint32_t r[4];
  philox(offset + (uint64_t)(i / 4), seed, r);
  return (uint64_t)r[i % 4] >= threshold ? (T)scale : (T)0;
}

}  // namespace kiln_nn

#endif
