/* cuda/ctc.cuh: what ctc.cu's kernels compute for one sample n, as __host__ __device__ functions
   with the semantics of cpu/ctc.c: the forward variable alpha_t(s) at one (t, s) of the extended
   target, the sample's nll, the reduced loss, the backward variable beta_t(s), and the gradient
   w.r.t. log_probs at one (t, class). Arithmetic in double for f32 and f64; alpha, nll and the
   gradient are stored in the dtype of log_probs, beta stays in double (as on the CPU), and every
   log-add runs in the CPU's order. tests/c/test_cuda_ctc.cu runs them on the CPU against libkiln. */
#ifndef KILN_CUDA_CTC_CUH
#define KILN_CUDA_CTC_CUH
#include "elements.cuh"

namespace kiln_ctc {

KILN_EL double log_add(double a, double b) {
  if (a < b) { double t = a; a = b; b = t; }
  if (a == -INFINITY) return a;
  return a + log1p(exp(b - a));
}

/* One call's buffers, on the device (or the host, in the test); layouts of nn_calls.h. */
template <class T> struct problem {
  int64_t T_, N, C, S, W;       /* S: the longest target; W = 2S + 1 */
  int64_t blank;
  int reduction, zero_infinity; /* enum kiln_reduction; 0 or 1 */
  const T *lp;                  /* [T,N,C], contiguous */
  const int64_t *labels;        /* [N, 2 + S]: input length, target length, target */
  T *nll;                       /* [N] */
  T *alpha;                     /* [N,T,W] */
  /* backward */
  const T *g;                   /* the loss's grad: [N] (no reduction) or 0-d */
  T *grad;                      /* [T,N,C] */
  double *beta;                 /* [N,2,W]: two rows of beta per sample, in turn */
};

template <class T> KILN_EL const int64_t *row_of(const problem<T> &p, int64_t n) { return p.labels + n * (2 + p.S); }
template <class T> KILN_EL int64_t input_length(const problem<T> &p, int64_t n) { return row_of(p, n)[0]; }
template <class T> KILN_EL int64_t target_length(const problem<T> &p, int64_t n) { return row_of(p, n)[1]; }

/* The class at position s of the extended target l' of sample n: blank for even s. */
template <class T> KILN_EL int64_t ext(const problem<T> &p, int64_t n, int64_t s) {
  return s & 1 ? row_of(p, n)[2 + (s >> 1)] : p.blank;
}

/* Threads per block of a kernel over W positions or C classes per step: a warp at least, 256 at
   most, else the power of two that covers the wider. Host code. */
static inline int threads_for(int64_t W, int64_t C) {
  int64_t widest = W > C ? W : C;
  int t = 32;
  while (t < widest && t < 256) t *= 2;
  return t;
}

/* ---- forward ---- */

/* Writes alpha_t(s) of sample n (t < input length, s < 2L + 1) from row t - 1, written before. */
template <class T> KILN_EL void alpha_at(const problem<T> &p, int64_t n, int64_t t, int64_t s) {
  int64_t W = p.W, base = n * p.T_ * W, c = ext(p, n, s);
  if (t == 0) {
    p.alpha[base + s] = s < 2 ? p.lp[n * p.C + c] : (T)-INFINITY;
    return;
  }
  int64_t prev = base + (t - 1) * W;
  double a = (double)p.alpha[prev + s];
  if (s >= 1) a = log_add(a, (double)p.alpha[prev + s - 1]);
  if (s >= 2 && c != p.blank && c != ext(p, n, s - 2)) a = log_add(a, (double)p.alpha[prev + s - 2]);
  p.alpha[base + t * W + s] = (T)(a == -INFINITY ? -INFINITY : a + (double)p.lp[(t * p.N + n) * p.C + c]);
}

/* -log p(target | input) of sample n once its alpha rows are written: 0 or inf without input. */
template <class T> KILN_EL double nll_of(const problem<T> &p, int64_t n) {
  int64_t Tn = input_length(p, n), L = target_length(p, n), E = 2 * L + 1;
  if (Tn == 0) return L == 0 ? 0 : INFINITY;
  const T *last = p.alpha + n * p.T_ * p.W + (Tn - 1) * p.W;
  double lp = (double)last[E - 1];
  if (L > 0) lp = log_add(lp, (double)last[E - 2]);
  return -lp;
}

/* Sample n's loss from its stored nll: an infinite one is 0 under zero_infinity. */
template <class T> KILN_EL double loss_of(const problem<T> &p, int64_t n) {
  double v = (double)p.nll[n];
  if (p.zero_infinity && v == INFINITY) v = 0;
  return v;
}

/* The mean (each loss over its target length, at least 1, then over the batch) or the sum, in
   the order of the samples. */
template <class T> KILN_EL double reduced_loss(const problem<T> &p) {
  double sum = 0;
  for (int64_t n = 0; n < p.N; n++) {
    int64_t L = target_length(p, n);
    double v = loss_of(p, n);
    sum += p.reduction == KILN_REDUCTION_MEAN ? v / (double)(L > 1 ? L : 1) : v;
  }
  return p.reduction == KILN_REDUCTION_MEAN ? sum / (double)p.N : sum;
}

/* ---- backward ---- */

/* Whether sample n's gradient is all zeros: no input, or an infinite nll under zero_infinity. */
template <class T> KILN_EL bool grad_is_zero(const problem<T> &p, int64_t n) {
  return input_length(p, n) == 0 || (p.zero_infinity && (double)p.nll[n] == INFINITY);
}

/* d loss / d nll_n: the incoming grad, over N and the target length for the mean. */
template <class T> KILN_EL double grad_scale(const problem<T> &p, int64_t n) {
  double gn = (double)p.g[p.reduction == KILN_REDUCTION_NONE ? n : 0];
  if (p.reduction == KILN_REDUCTION_MEAN) {
    int64_t L = target_length(p, n);
    gn /= (double)p.N * (double)(L > 1 ? L : 1);
  }
  return gn;
}

/* The row of beta that step t of sample n writes (the other holds step t + 1). */
template <class T> KILN_EL double *beta_row(const problem<T> &p, int64_t n, int64_t t) {
  return p.beta + (n * 2 + (t & 1)) * p.W;
}

/* Writes beta_t(s) of sample n (s < 2L + 1) from beta_{t+1}, written before unless t is the last step. */
template <class T> KILN_EL void beta_at(const problem<T> &p, int64_t n, int64_t t, int64_t s) {
  int64_t Tn = input_length(p, n), E = 2 * target_length(p, n) + 1, c = ext(p, n, s);
  double lpc = (double)p.lp[(t * p.N + n) * p.C + c], *cur = beta_row(p, n, t);
  if (t == Tn - 1) {
    cur[s] = s >= E - 2 ? lpc : -INFINITY;
    return;
  }
  const double *next = beta_row(p, n, t + 1);
  double b = next[s];
  if (s + 1 < E) b = log_add(b, next[s + 1]);
  if (s + 2 < E && c != p.blank && c != ext(p, n, s + 2)) b = log_add(b, next[s + 2]);
  cur[s] = b == -INFINITY ? -INFINITY : b + lpc;
}

/* Writes d loss / d log_probs[t, n, c] once beta_t is written: the log-sum over the positions of
   class c, in ascending s as the CPU adds them. */
template <class T> KILN_EL void grad_at(const problem<T> &p, int64_t n, int64_t t, int64_t c) {
  int64_t L = target_length(p, n), E = 2 * L + 1, lt = (t * p.N + n) * p.C + c;
  const T *a = p.alpha + n * p.T_ * p.W + t * p.W;
  const double *b = beta_row(p, n, t);
  const int64_t *l = row_of(p, n) + 2;
  double acc = -INFINITY;
  if (c == p.blank) {
    for (int64_t s = 0; s < E; s += 2) acc = log_add(acc, (double)a[s] + b[s]);
  } else {
    for (int64_t i = 0; i < L; i++)
      if (l[i] == c) acc = log_add(acc, (double)a[2 * i + 1] + b[2 * i + 1]);
  }
  p.grad[lt] = (T)(acc == -INFINITY ? 0 : -exp(acc + (double)p.nll[n] - (double)p.lp[lt]) * grad_scale(p, n));
}

}  // namespace kiln_ctc

#endif
