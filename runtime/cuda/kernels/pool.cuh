/* cuda/pool.cuh: what pool.cu's kernels compute for one output element (forward) or one input
   element (backward), as __host__ __device__ functions with cpu/pool.c's semantics: max pooling's
   windows in the CPU's order (the 2x2 stride-2 fast path compares its four elements without
   stopping, the general path stops at the first NaN), the index h * W + w into the plane;
   average pooling's windows (count_include_pad, adaptive). The backward passes gather: each
   input element adds the grads of the outputs whose window holds it (max: whose index names it)
   in increasing output order, in the tensor's dtype from 0, which is the order and arithmetic of
   the CPU's scatter. Deterministic, no atomics. tests/c/test_cuda_kernels.cu runs them on the
   CPU against libkiln. */
#ifndef KILN_CUDA_POOL_CUH
#define KILN_CUDA_POOL_CUH
#include "elements.cuh"

namespace kiln_pool {

struct geom {
  int64_t H, W, OH, OW;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int count_include_pad, adaptive, fast;
  int empty;   /* max pooling: some window has no tap inside the plane (its index is 0) */
};

/* Whether some output along a dim of n (on outputs) has a window whose taps all fall outside
   the input: padding with a dilation past the input can leave one. Host code. */
static inline int has_empty_window(int64_t n, int64_t on, int64_t k, int64_t s, int64_t p, int64_t d) {
  for (int64_t o = 0; o < on; o++) {
    int64_t t = 0, start = o * s - p;
    while (t < k && (start + t * d < 0 || start + t * d >= n)) t++;
    if (t == k) return 1;
  }
  return 0;
}

/* From the call's ints (nn_calls.h) and the plane sizes of the input and the output. Host code. */
static inline struct geom geom_of(int op, const int64_t *ints, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  struct geom g;
  g.H = H; g.W = W; g.OH = OH; g.OW = OW;
  g.kh = ints[0]; g.kw = ints[1]; g.sh = ints[2]; g.sw = ints[3]; g.ph = ints[4]; g.pw = ints[5];
  g.count_include_pad = 0; g.adaptive = 0; g.empty = 0;
  if (op == KILN_OP_MAX_POOL2D || op == KILN_OP_MAX_POOL2D_BACKWARD) {
    g.dh = ints[6]; g.dw = ints[7];
    g.empty = has_empty_window(H, OH, g.kh, g.sh, g.ph, g.dh) || has_empty_window(W, OW, g.kw, g.sw, g.pw, g.dw);
  } else {
    g.dh = g.dw = 1;
    g.count_include_pad = (int)ints[6];
    g.adaptive = (int)ints[7];
  }
  g.fast = g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0 && g.dh == 1 && g.dw == 1 &&
           2 * OH <= H && 2 * OW <= W;
  return g;
}

/* ---- max pooling ---- */

/* Output (oh, ow) of plane x: its value and index. */
template <class T>
KILN_EL void max_pool_at(const T *x, const struct geom &g, int64_t oh, int64_t ow, T *y, int64_t *idx) {
  if (g.fast) {
    const T *r0 = x + 2 * oh * g.W, *r1 = r0 + g.W;
    int64_t w0 = 2 * ow;
    T best = r0[w0];
    int64_t bi = 2 * oh * g.W + w0;
    if (r0[w0 + 1] > best || r0[w0 + 1] != r0[w0 + 1]) { best = r0[w0 + 1]; bi = 2 * oh * g.W + w0 + 1; }
    if (r1[w0] > best || r1[w0] != r1[w0]) { best = r1[w0]; bi = (2 * oh + 1) * g.W + w0; }
    if (r1[w0 + 1] > best || r1[w0 + 1] != r1[w0 + 1]) { best = r1[w0 + 1]; bi = (2 * oh + 1) * g.W + w0 + 1; }
    *y = best;
    *idx = bi;
    return;
  }
  int64_t hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
  T best = (T)-INFINITY;
  int64_t bi = -1;
  for (int64_t ki = 0; ki < g.kh; ki++) {
    int64_t ih = hs + ki * g.dh;
    if (ih < 0 || ih >= g.H) continue;
    for (int64_t kj = 0; kj < g.kw; kj++) {
      int64_t iw = ws + kj * g.dw;
      if (iw < 0 || iw >= g.W) continue;
      T v = x[ih * g.W + iw];
      if (bi < 0 || v > best || v != v) { best = v; bi = ih * g.W + iw; }
      if (v != v) goto found;   /* NaN wins */
    }
  }
found:
  *y = best;
  *idx = bi < 0 ? 0 : bi;
}

/* The outputs o in [*lo, *hi] along one dim whose window (start o * s - p, k taps d apart) can
   reach input i; empty when *lo > *hi. */
KILN_EL void reaching(int64_t i, int64_t on, int64_t k, int64_t s, int64_t p, int64_t d, int64_t *lo, int64_t *hi) {
  int64_t first = i + p - (k - 1) * d;   /* o * s >= first */
  *lo = first <= 0 ? 0 : (first + s - 1) / s;
  int64_t last = (i + p) / s;            /* o * s <= i + p */
  *hi = last < on - 1 ? last : on - 1;
}

/* The grad of input (ih, iw) of a plane: the sum, in output order, of gy where idx names it.
   An empty window's index is 0 wherever the window lies, so input 0 then looks at every output. */
template <class T>
KILN_EL T max_pool_grad_at(const T *gy, const int64_t *idx, const struct geom &g, int64_t ih, int64_t iw) {
  int64_t h0, h1, w0, w1, me = ih * g.W + iw;
  reaching(ih, g.OH, g.kh, g.sh, g.ph, g.dh, &h0, &h1);
  reaching(iw, g.OW, g.kw, g.sw, g.pw, g.dw, &w0, &w1);
  if (g.empty && me == 0) { h0 = 0; h1 = g.OH - 1; w0 = 0; w1 = g.OW - 1; }
  T s = 0;
  for (int64_t oh = h0; oh <= h1; oh++)
    for (int64_t ow = w0; ow <= w1; ow++)
      if (idx[oh * g.OW + ow] == me) s += gy[oh * g.OW + ow];
  return s;
}

/* ---- average pooling ---- */

/* Window [*s, *e) of output o along a dim of n (on outputs), and the count its divisor uses
   (cpu/pool.c's window). */
KILN_EL int64_t window(const struct geom &g, int64_t o, int64_t on, int64_t n, int64_t k, int64_t st, int64_t pad, int64_t *s,
                       int64_t *e) {
  if (g.adaptive) {
    *s = o * n / on;
    *e = ((o + 1) * n + on - 1) / on;
    return *e - *s;
  }
  int64_t a = o * st - pad, b = a + k < n + pad ? a + k : n + pad, padded = b - a;
  *s = a < 0 ? 0 : a;
  *e = b > n ? n : b;
  return g.count_include_pad ? padded : *e - *s;
}

KILN_EL int64_t avg_count(const struct geom &g, int64_t ch, int64_t cw, int64_t hs, int64_t he, int64_t ws, int64_t we) {
  return g.count_include_pad || g.adaptive ? ch * cw : (he - hs) * (we - ws);
}

template <class T> KILN_EL T avg_pool_at(const T *x, const struct geom &g, int64_t oh, int64_t ow) {
  int64_t hs, he, ws, we;
  int64_t ch = window(g, oh, g.OH, g.H, g.kh, g.sh, g.ph, &hs, &he);
  int64_t cw = window(g, ow, g.OW, g.W, g.kw, g.sw, g.pw, &ws, &we);
  int64_t count = avg_count(g, ch, cw, hs, he, ws, we);
  T s = 0;
  for (int64_t ih = hs; ih < he; ih++)
    for (int64_t iw = ws; iw < we; iw++) s += x[ih * g.W + iw];
  return count > 0 ? s / (T)count : (T)0;
}

/* The outputs along one dim whose window may hold input i (a superset for adaptive windows:
   avg_pool_grad_at checks each). */
KILN_EL void avg_reaching(const struct geom &g, int64_t i, int64_t on, int64_t n, int64_t k, int64_t s, int64_t p, int64_t *lo,
                          int64_t *hi) {
  if (g.adaptive) {
    *lo = i * on / n;                     /* the windows ending after i */
    *hi = ((i + 1) * on - 1) / n;         /* the windows starting at or before i */
    if (*hi > on - 1) *hi = on - 1;
    return;
  }
  reaching(i, on, k, s, p, 1, lo, hi);
}

template <class T> KILN_EL T avg_pool_grad_at(const T *gy, const struct geom &g, int64_t ih, int64_t iw) {
  int64_t h0, h1, w0, w1;
  avg_reaching(g, ih, g.OH, g.H, g.kh, g.sh, g.ph, &h0, &h1);
  avg_reaching(g, iw, g.OW, g.W, g.kw, g.sw, g.pw, &w0, &w1);
  T s = 0;
  for (int64_t oh = h0; oh <= h1; oh++) {
    int64_t hs, he, ch = window(g, oh, g.OH, g.H, g.kh, g.sh, g.ph, &hs, &he);
    if (ih < hs || ih >= he) continue;
    for (int64_t ow = w0; ow <= w1; ow++) {
      int64_t ws, we, cw = window(g, ow, g.OW, g.W, g.kw, g.sw, g.pw, &ws, &we);
      if (iw < ws || iw >= we) continue;
      int64_t count = avg_count(g, ch, cw, hs, he, ws, we);
      if (count > 0) s += gy[oh * g.OW + ow] / (T)count;
    }
  }
  return s;
}

}  // namespace kiln_pool

#endif
