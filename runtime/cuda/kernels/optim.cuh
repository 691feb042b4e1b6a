/* cuda/optim.cuh: one element of each optimizer update, as __host__ __device__ functions that
   follow cpu/optim.c's loops operation by operation in the parameter's dtype (PyTorch's
   single-tensor algorithms). optim.cu's fused kernel calls them over every parameter of a step;
   tests/c/test_cuda_kernels.cu runs them on the CPU against libkiln. */
#ifndef KILN_CUDA_OPTIM_CUH
#define KILN_CUDA_OPTIM_CUH
#include "elements.cuh"
#include "optim_calls.h"

namespace kiln_opt {

KILN_EL float sqrt_t(float x) { return sqrtf(x); }
KILN_EL double sqrt_t(double x) { return sqrt(x); }

/* PyTorch's lerp: start + w * (end - start) for a small weight, else end - (end - start) * (1 - w). */
template <class T> KILN_EL T lerp(T start, T end, T w, bool small) {
  return small ? start + w * (end - start) : end - (end - start) * (1 - w);
}

/* Element i of entry e (state pointers already at the entry's start). */
template <class T> KILN_EL void sgd(const struct kiln_optim_job *j, const struct kiln_optim_entry *e, int64_t i) {
  T *p = (T *)e->param, *buf = (T *)e->state[0];
  const T *g = (const T *)e->grad;
  const T lr = (T)j->lr, wd = (T)j->weight_decay, mom = (T)j->momentum, damp1 = (T)(1.0 - j->dampening);
  int kind = j->momentum == 0 ? 0 : j->first_step ? 1 : 2;
  T d = g[i];
  if (j->weight_decay != 0) d = d + wd * p[i];
  if (kind == 1) buf[i] = d;
  if (kind == 2) { T b = buf[i] * mom; buf[i] = b + damp1 * d; }
  if (kind != 0) d = j->nesterov ? d + mom * buf[i] : buf[i];
  p[i] = p[i] + (-lr) * d;
}

template <class T> KILN_EL void adam(const struct kiln_optim_job *j, const struct kiln_optim_entry *e, int64_t i) {
  T *p = (T *)e->param, *m = (T *)e->state[0], *v = (T *)e->state[1], *vmax = (T *)e->state[2];
  const T *g = (const T *)e->grad;
  const T wd = (T)j->weight_decay, decay = (T)j->decay, w1 = (T)(1.0 - j->beta1), beta2 = (T)j->beta2;
  const T c2 = (T)(1.0 - j->beta2), bc2 = (T)j->bias_correction2_sqrt, eps = (T)j->eps, nstep = (T)(-j->lr);
  bool l2 = j->weight_decay != 0 && !j->decoupled, decoupled = j->weight_decay != 0 && j->decoupled;
  bool small = fabs((double)w1) < 0.5;
  T x = p[i], d = g[i];
  if (decoupled) x = x * decay;
  if (l2) d = d + wd * x;
  T mi = lerp<T>(m[i], d, w1, small);
  m[i] = mi;
  T vi = v[i] * beta2;
  vi = vi + c2 * d * d;
  v[i] = vi;
  if (j->amsgrad) { T a = vmax[i]; vi = (a != a || a > vi) ? a : vi; vmax[i] = vi; }
  T den = sqrt_t(vi) / bc2 + eps;
  p[i] = x + nstep * mi / den;
}

/* RMSprop: alpha travels as beta2. */
template <class T> KILN_EL void rmsprop(const struct kiln_optim_job *j, const struct kiln_optim_entry *e, int64_t i) {
  T *p = (T *)e->param, *sq = (T *)e->state[0], *buf = (T *)e->state[1], *ga = (T *)e->state[2];
  const T *g = (const T *)e->grad;
  const T lr = (T)j->lr, wd = (T)j->weight_decay, alpha = (T)j->beta2, c = (T)(1.0 - j->beta2);
  const T eps = (T)j->eps, mom = (T)j->momentum;
  bool small = fabs(1.0 - j->beta2) < 0.5;
  T x = p[i], d = g[i];
  if (j->weight_decay != 0) d = d + wd * x;
  T s = sq[i] * alpha;
  s = s + c * d * d;
  sq[i] = s;
  T avg;
  if (j->centered) {
    T a = lerp<T>(ga[i], d, c, small);
    ga[i] = a;
    avg = sqrt_t(s + (T)-1 * a * a);
  } else {
    avg = sqrt_t(s);
  }
  avg = avg + eps;
  if (j->momentum > 0) {
    T b = buf[i] * mom;
    b = b + d / avg;
    buf[i] = b;
    p[i] = x + (-lr) * b;
  } else {
    p[i] = x + (-lr) * d / avg;
  }
}

/* Adagrad: j->lr is already decayed. */
template <class T> KILN_EL void adagrad(const struct kiln_optim_job *j, const struct kiln_optim_entry *e, int64_t i) {
  T *p = (T *)e->param, *sum = (T *)e->state[0];
  const T *g = (const T *)e->grad;
  const T nlr = (T)(-j->lr), wd = (T)j->weight_decay, eps = (T)j->eps;
  T x = p[i], d = g[i];
  if (j->weight_decay != 0) d = d + wd * x;
  T s = sum[i] + (T)1 * d * d;
  sum[i] = s;
  T std = sqrt_t(s) + eps;
  p[i] = x + nlr * d / std;
}

template <class T> KILN_EL void step(int op, const struct kiln_optim_job *j, const struct kiln_optim_entry *e, int64_t i) {
  switch (op) {
  case KILN_OP_SGD_STEP: sgd<T>(j, e, i); break;
  case KILN_OP_ADAM_STEP: adam<T>(j, e, i); break;
  case KILN_OP_RMSPROP_STEP: rmsprop<T>(j, e, i); break;
  default: adagrad<T>(j, e, i); break;
  }
}

/* The entry holding element `at` of the concatenated parameters: the last k with starts[k] <= at. */
KILN_EL int entry_of(const int64_t *starts, int n, int64_t at) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (starts[mid] <= at) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace kiln_opt

#endif
