/* cuda/norm.cuh: the per-row, per-channel and per-element code of norm.cu's kernels, as
   __host__ __device__ functions with cpu/norm.c's arithmetic: statistics in double, two passes
   (the mean, then the squared deviations from it), the affine step and the gradient coefficients
   rounded to the tensor's dtype where the CPU rounds them. norm.cu's kernels call them and sum
   with the block's fixed tree (kernels.cuh); tests/c/test_cuda_kernels.cu plays that order on the
   CPU with these very functions against libkiln. */
#ifndef KILN_CUDA_NORM_CUH
#define KILN_CUDA_NORM_CUH
#include "elements.cuh"

namespace kiln_norm {

/* Layer and group norm (cpu/norm.c's rn_shape): rows of L contiguous elements. Layer norm: the
   affine params per column (C = L, G = 1, S = 1); group norm: row r is group r % G of image
   r / G, and element i of it belongs to channel (r % G) * (C / G) + i / S. */
struct rn_geom {
  int64_t rows, L, C, G, S;
  int group;
};

/* op: LAYER_NORM(_BACKWARD) with param = normalized_ndim, or GROUP_NORM(_BACKWARD) with param =
   groups; x's sizes. Host code. */
static inline struct rn_geom rn_geom_of(int op, int64_t param, int ndim, const int64_t *sizes, int64_t numel) {
  struct rn_geom g;
  g.group = op == KILN_OP_GROUP_NORM || op == KILN_OP_GROUP_NORM_BACKWARD;
  if (g.group) {
    g.G = param;
    g.C = sizes[1];
    g.S = 1;
    for (int d = 2; d < ndim; d++) g.S *= sizes[d];
    g.rows = sizes[0] * g.G;
    g.L = g.C / g.G * g.S;
  } else {
    int k = (int)param;
    g.L = 1;
    for (int d = ndim - k; d < ndim; d++) g.L *= sizes[d];
    g.rows = g.L ? numel / g.L : 1;
    for (int d = 0; d < ndim - k && g.L == 0; d++) g.rows *= sizes[d];
    g.C = g.L;
    g.G = 1;
    g.S = 1;
  }
  return g;
}

/* The channel (the index into weight and bias) of element i of row r. */
KILN_EL int64_t rn_channel(const struct rn_geom &g, int64_t r, int64_t i) {
  return g.group ? (r % g.G) * (g.C / g.G) + i / g.S : i;
}

/* A row's mean from its sum, and its invstd from the sum of squared deviations (L = 0: 0 and
   1/sqrt(eps), as the CPU). */
KILN_EL double rn_mean(double sum, int64_t L) { return L ? sum / (double)L : 0; }
KILN_EL double rn_invstd(double sq, int64_t L, double eps) { return 1.0 / sqrt((L ? sq / (double)L : 0) + eps); }

/* y at element i of row r (mean and invstd of the row, as computed in double). */
template <class T>
KILN_EL T rn_forward_element(T x, const struct rn_geom &g, int64_t r, int64_t i, double mean, double invstd, const T *w,
                             const T *b) {
  if (!g.group) {
    T v = (x - (T)mean) * (T)invstd;
    return v * (w ? w[i] : (T)1) + (b ? b[i] : (T)0);
  }
  int64_t c = rn_channel(g, r, i);
  double a = invstd * (w ? (double)w[c] : 1.0);
  T scale = (T)a, shift = (T)((b ? (double)b[c] : 0.0) - mean * a);
  return x * scale + shift;
}

/* The grad of a row: with a = sum of gy*w and bs = sum of gy*w*(x - mean) over the row,
   gx = t1 * gy + t2 * x + t3 where t1 = invstd * w of the element's channel. */
KILN_EL void rn_backward_coefs(double mean, double invstd, double a, double bs, int64_t L, double *k2, double *k3) {
  *k2 = -invstd * invstd * invstd * bs / (double)L;
  *k3 = -invstd * a / (double)L - *k2 * mean;
}
template <class T>
KILN_EL T rn_backward_element(T gy, T x, const struct rn_geom &g, int64_t r, int64_t i, double invstd, const T *w, T t2,
                              T t3) {
  T t1 = (T)(invstd * (w ? (double)w[rn_channel(g, r, i)] : 1.0));
  return t1 * gy + t2 * x + t3;
}

/* Layer norm's weight and bias grads of column j over the rows first, first + step, ... (< end),
   in that order, in double: the part of the sums one thread of ln_grads_partial_kernel takes
   (all the rows in order, first = 0 and step = 1, is the CPU's order). */
template <class T>
KILN_EL void ln_param_partial(const T *x, const T *gy, const T *mean, const T *invstd, int64_t L, int64_t j, int64_t first,
                              int64_t end, int64_t step, double *gw, double *gb) {
  double sw = 0, sb = 0;
  for (int64_t r = first; r < end; r += step) {
    double m = (double)mean[r], is = (double)invstd[r];
    T g = gy[r * L + j];
    sw += g * (((double)x[r * L + j] - m) * is);
    sb += (double)g;
  }
  *gw = sw;
  *gb = sb;
}

/* Partial sums kept chunk by chunk, partial[p * n + j] for chunk p of column or channel j (of n):
   the total adds the chunks in order (batch norm's statistics and grads, the norms' param grads). */
KILN_EL double fold_chunks(const double *partial, int64_t j, int64_t n, int64_t nchunks) {
  double s = 0;
  for (int64_t p = 0; p < nchunks; p++) s += partial[p * n + j];
  return s;
}

/* Group norm's weight grad term of element k of channel c (k over the N * S elements the channel
   has in the batch, image by image): invstd * gy * (x - mean) of its row. Its gb term is gy. */
template <class T>
KILN_EL double gn_weight_term(const T *x, const T *gy, const T *mean, const T *invstd, const struct rn_geom &g, int64_t c,
                              int64_t k, int64_t *at) {
  int64_t n = k / g.S, s = k % g.S, r = n * g.G + c / (g.C / g.G);
  *at = (n * g.C + c) * g.S + s;
  return (double)invstd[r] * ((double)gy[*at] * ((double)x[*at] - (double)mean[r]));
}

/* ---- batch norm: x [N, C, S], statistics per channel over its M = N * S elements ---- */

/* Element k of channel c (k over the channel's N * S elements, image by image). */
KILN_EL int64_t bn_at(int64_t k, int64_t c, int64_t C, int64_t S) { return ((k / S) * C + c) * S + k % S; }

/* The same walk without a 64-bit division per element: a thread's k = first, first + step, ...
   kept as (image n, offset s) of k; a division only when s passes S (once per S / step elements
   when S >= step). bn_cursor_at(q, c, C, S) == bn_at(q.k, c, C, S) all along. */
struct bn_cursor {
  int64_t k, n, s;
};
KILN_EL struct bn_cursor bn_cursor_start(int64_t first, int64_t S) {
  struct bn_cursor q = {first, first / S, first % S};
  return q;
}
KILN_EL void bn_cursor_next(struct bn_cursor *q, int64_t step, int64_t S) {
  q->k += step;
  q->s += step;
  if (q->s >= S) {
    q->n += q->s / S;
    q->s %= S;
  }
}
KILN_EL int64_t bn_cursor_at(const struct bn_cursor *q, int64_t c, int64_t C, int64_t S) { return (q->n * C + c) * S + q->s; }

/* The batch-norm kernels cut each channel's N * S elements into nchunks chunks (geometry.c's
   kiln_cuda_chunk_rows), one block a chunk, into partial sums folded as the param grads' are
   (fold_chunks, partial[p * C + c]); every block of a channel folds them in the same order. */

/* Calls f(at) for the elements k = first, first + step, ... (< end) of channel c, in that order:
   a block's thread walks its part of a chunk so. Four addresses at a time, so that their loads are
   in flight together on the device. */
#ifdef __CUDACC__
#pragma nv_exec_check_disable   /* f is a host lambda in tests/c/test_cuda_kernels.cu, a device one in norm.cu */
#endif
template <class F>
KILN_EL void bn_walk(int64_t c, int64_t C, int64_t S, int64_t first, int64_t end, int64_t step, F f) {
  struct bn_cursor q = bn_cursor_start(first, S);
  while (q.k + 3 * step < end) {
    int64_t a[4];
    for (int i = 0; i < 4; i++) {
      a[i] = bn_cursor_at(&q, c, C, S);
      bn_cursor_next(&q, step, S);
    }
    f(a[0]);
    f(a[1]);
    f(a[2]);
    f(a[3]);
  }
  for (; q.k < end; bn_cursor_next(&q, step, S)) f(bn_cursor_at(&q, c, C, S));
}

/* The batch statistics of a channel: mean from the sum, invstd from the sum q of squared
   deviations from that mean (biased variance q / M; 0 and 0 for an empty batch); with update, the running stats move by
   momentum toward the mean and the unbiased variance q / (M - 1) (the biased one when M <= 1),
   in place, as cpu/norm.c does. */
KILN_EL double bn_mean(double sum, double M) { return M > 0 ? sum / M : 0; }
template <class T>
KILN_EL double bn_batch_invstd(double mean, double q, double M, double eps, int update, double momentum, T *rm, T *rv) {
  double var = M > 0 ? q / M : 0;   /* an empty batch: 0 and 1/sqrt(eps), as layer norm's rows */
  if (update) {
    double unbiased = M > 1 ? q / (M - 1) : var;
    *rm = (T)((1 - momentum) * (double)*rm + momentum * mean);
    *rv = (T)((1 - momentum) * (double)*rv + momentum * unbiased);
  }
  return 1.0 / sqrt(var + eps);
}
/* Evaluation: the running stats. */
template <class T> KILN_EL double bn_running_invstd(const T *rv, double eps) { return 1.0 / sqrt((double)*rv + eps); }

/* y = x * scale + shift over channel c. */
template <class T>
KILN_EL void bn_affine(double mean, double invstd, const T *w, const T *b, int64_t c, T *scale, T *shift) {
  double a = invstd * (w ? (double)w[c] : 1.0);
  *scale = (T)a;
  *shift = (T)((b ? (double)b[c] : 0.0) - mean * a);
}

/* The channel's grad gx = k[0] * gy + k[1] * x + k[2] from sg = sum gy and sgx = sum gy * (x - mean)
   (with the running stats the statistics are constants: only k[0]). */
KILN_EL void bn_backward_coefs(int batch_stats, double mean, double invstd, double wc, double sg, double sgx, double M,
                               double *k) {
  double a = invstd * wc;
  k[0] = a;
  k[1] = batch_stats ? -a * invstd * invstd * sgx / M : 0;
  k[2] = batch_stats ? -a * sg / M - k[1] * mean : 0;
}

}  // namespace kiln_norm

#endif
