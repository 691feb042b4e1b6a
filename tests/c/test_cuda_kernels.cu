/* test_cuda_kernels.cu: the CUDA kernels' per-element and per-row code, which is __host__
   __device__, played here on the CPU (no GPU needed) in the order the kernels run it (a block's
   threads striding over a chunk, then the tree over the block, then the chunks in order), with
   the launch plans of geometry.c, against libkiln's CPU kernels on the same inputs: reductions
   with NaN, infinities and ties; the loss and grad of each position of nll_loss and cross entropy;
   dropout's mask bit for bit; the recurrent layers' steps (rnn.cuh) in rnn.cu's order of kernels and
   products, forward and backward through time, against kiln_rnn_layer and its autograd backward. The device build may differ only where the device's math library
   does (exp, log, pow within an ulp or two); tests/gpu checks that part.
   Besides the fixed cases, randomized sweeps draw geometries, parameters and dtypes for pooling,
   reductions, the norms, the recurrent layers, nll_loss and cross entropy (forward, reduced, and
   backward) and dropout from a fixed seed (the same cases on every run). KILN_TEST_SWEEP=N runs
   N times as many, for a longer run by hand (N = 100: about 17 s). A failing sweep case prints
   its helper's arguments and seed. */
#include "sweep.h"
#include "reduce.cuh"
#include "nn.cuh"
#include "norm.cuh"
#include "pool.cuh"
#include "rnn.cuh"
extern "C" {
#include "internal.h"
#include "geometry.h"
#include "rnn_calls.h"
#include <kiln/rnn.h>
}
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static int checks, failures;
static void report(bool ok, int line, const char *what) {
  checks++;
  if (!ok) {
    failures++;
    fprintf(stderr, "test_cuda_kernels.cu:%d: FAILED: %s\n", line, what);
  }
}

static const struct kiln_device CPU = {KILN_CPU, 0};

static std::vector<double> values_of(const struct kiln_tensor *t) {
  std::vector<double> v((size_t)(t->numel > 0 ? t->numel : 1));
  if (kiln_tensor_to_f64(t, v.data())) v.assign(v.size(), NAN);
  v.resize((size_t)t->numel);
  return v;
}

/* got against want: NaN meets NaN, an infinity the same infinity, the rest within
   tol * max(1, |want|). Prints the first difference under what. */
static bool same_values(const struct kiln_tensor *got, const struct kiln_tensor *want, double tol, const char *what) {
  if (!got || !want || got->numel != want->numel || got->dtype != want->dtype) {
    fprintf(stderr, "%s: results differ in shape or dtype\n", what);
    return false;
  }
  std::vector<double> g = values_of(got), w = values_of(want);
  for (size_t i = 0; i < g.size(); i++) {
    bool ok;
    if (w[i] != w[i]) ok = g[i] != g[i];
    else if (isinf(w[i])) ok = g[i] == w[i];
    else ok = fabs(g[i] - w[i]) <= tol * fmax(1.0, fabs(w[i]));
    if (!ok) {
      fprintf(stderr, "%s: element %zu is %.17g, the CPU gives %.17g\n", what, i, g[i], w[i]);
      return false;
    }
  }
  return true;
}

/* A CPU tensor of dtype: deterministic pseudo-random values; `ties` rounds them to few distinct
   values, `specials` puts NaN, infinities and zeros of both signs at a few places. */
static struct kiln_tensor *make_input(int ndim, const int64_t *sizes, int dtype, bool ties, bool specials, uint64_t seed) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sizes[d];
  std::vector<double> v((size_t)(n > 0 ? n : 1));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    double u = (double)(s >> 11) * 0x1p-53;
    double x = (u - 0.5) * 6;
    if (ties || !kiln_dtype_is_float(dtype)) x = floor(x * 1.5);
    if (dtype == KILN_BOOL || dtype == KILN_U8) x = fabs(x) > 2 ? 0 : fabs(x);
    v[(size_t)i] = x;
  }
  if (specials && kiln_dtype_is_float(dtype)) {
    const double sp[] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, NAN};
    for (int k = 0; k < 6 && n > 0; k++) v[(size_t)((int64_t)(k * 7919 + 3) % n)] = sp[k];
  }
  return kiln_tensor_from_f64(ndim, sizes, v.data(), dtype, CPU);
}

template <class T> static T *data_of(const struct kiln_tensor *t) { return t ? (T *)kiln_tensor_data(t) : NULL; }

/* got against the grad autograd left in leaf (no leaf: nothing to compare). */
static bool grads_match(const struct kiln_tensor *got, const struct kiln_tensor *leaf, double tol, const char *what,
                        const char *which) {
  char w2[480];
  snprintf(w2, sizeof w2, "%s: %s", what, which);
  if (!leaf) return true;
  return leaf->grad && same_values(got, leaf->grad, tol, w2);
}

/* block_sum's tree over one partial sum per thread. */
static double tree_sum(std::vector<double> v) {
  for (size_t s = v.size() / 2; s > 0; s >>= 1)
    for (size_t t = 0; t < s; t++) v[t] += v[t + s];
  return v[0];
}

/* The sum over k in [0, n) of term(k) as a block of `threads` threads takes it: thread t strides
   from t, then the tree. */
template <class F> static double block_order_sum(int64_t n, int threads, F term) {
  std::vector<double> part((size_t)threads, 0.0);
  for (int t = 0; t < threads; t++)
    for (int64_t k = t; k < n; k += threads) part[(size_t)t] += term(k);
  return tree_sum(part);
}

/* The same over the chunk [k0, k1): thread t strides from k0 + t. */
template <class F> static double block_order_sum(int64_t k0, int64_t k1, int threads, F term) {
  return block_order_sum(k1 - k0, threads, [&](int64_t k) { return term(k0 + k); });
}

/* ---- reductions ---- */

using namespace kiln_red;

/* reduce.cu's two kernels, played on the CPU, into out (a fresh contiguous tensor). */
static bool play_reduce(int op, const struct kiln_tensor *a, int64_t mask, double p, int64_t max_blocks,
                        struct kiln_tensor *out, int64_t *nchunks_out) {
  struct kiln_cuda_reduce_plan pl;
  kiln_cuda_reduce_plan(a->ndim, a->sizes, mask, max_blocks, &pl);
  *nchunks_out = pl.nchunks;
  bool ints = takes_ints(op, a->dtype);
  int rd = row_dtype(op, a->dtype);
  struct kiln_tensor *pv = kiln_permute(a, a->ndim, pl.perm);
  struct kiln_tensor *cont = pv ? kiln_contiguous(pv) : NULL;
  struct kiln_tensor *rows = cont ? kiln_to_dtype(cont, rd) : NULL;
  kiln_tensor_release(pv);
  kiln_tensor_release(cont);
  if (!rows) return false;
  if (pl.M * (pl.R > 0 ? 1 : 0) > 0 && (pl.nchunks < 1 || (pl.nchunks - 1) * pl.chunk >= pl.R || pl.nchunks * pl.chunk < pl.R))
    return false;   /* the chunks must tile each row */
  std::vector<acc> partial((size_t)(pl.M * pl.nchunks + 1));
  std::vector<acc> part((size_t)pl.threads);
  const char *x0 = (const char *)kiln_tensor_data(rows);
  for (int64_t b = 0; b < pl.M * pl.nchunks; b++) {
    int64_t row = b / pl.nchunks, r0 = (b % pl.nchunks) * pl.chunk, r1 = r0 + pl.chunk < pl.R ? r0 + pl.chunk : pl.R;
    for (int t = 0; t < pl.threads; t++) {
      acc s = acc_init(op);
      for (int64_t i = r0 + t; i < r1; i += pl.threads) {
        int64_t at = row * pl.R + i;
        if (rd == KILN_I64) acc_push_int(op, &s, ((const int64_t *)x0)[at], i);
        else acc_push(op, &s, rd == KILN_F32 ? (double)((const float *)x0)[at] : ((const double *)x0)[at], i, p);
      }
      part[(size_t)t] = s;
    }
    for (int s = pl.threads / 2; s > 0; s >>= 1)
      for (int t = 0; t < s; t++) acc_combine(op, ints, &part[(size_t)t], &part[(size_t)(t + s)], p);
    partial[(size_t)b] = part[0];
  }
  for (int64_t m = 0; m < pl.M; m++) {
    acc total = acc_init(op);
    for (int64_t k = 0; k < pl.nchunks; k++) acc_combine(op, ints, &total, &partial[(size_t)(m * pl.nchunks + k)], p);
    acc_store(op, ints, &total, p, (char *)kiln_tensor_data(out), out->dtype, m);
  }
  kiln_tensor_release(rows);
  return true;
}

static void check_reduce(int op, int ndim, const int64_t *sizes, int dtype, int64_t mask, double p, bool ties,
                         bool specials, int64_t max_blocks, bool want_chunks, uint64_t seed = 0) {
  if (!seed) seed = (uint64_t)(op * 131 + mask * 7 + dtype);
  int dims[KILN_MAX_DIMS], nd = 0;
  for (int d = 0; d < ndim; d++)
    if (mask & ((int64_t)1 << d)) dims[nd++] = d;
  if (nd == ndim) nd = 0;   /* all dims: as the front end gives them */
  bool arg = op == KILN_OP_ARGMAX || op == KILN_OP_ARGMIN;
  if (arg && nd > 1) return;
  struct kiln_tensor *a = make_input(ndim, sizes, dtype, ties, specials, seed);
  struct kiln_tensor *want = kiln_reduce(op, a, nd, dims, 0, p);
  char what[256];
  snprintf(what, sizeof what, "%s %s %s mask %lld p %g%s%s, max_blocks %lld, seed %llu", kiln_op_name(op),
           kiln_dtype_name(dtype), kiln_shape_string(a), (long long)mask, p, ties ? " ties" : "", specials ? " specials" : "",
           (long long)max_blocks, (unsigned long long)seed);
  if (!want) {   /* refused on the CPU (max over an empty dim): nothing to compare */
    kiln_error_clear();
    kiln_tensor_release(a);
    return;
  }
  struct kiln_tensor *got = kiln_tensor_empty(want->ndim, want->sizes, want->dtype, CPU);
  int64_t nchunks = 0;
  bool ok = play_reduce(op, a, mask, p, max_blocks, got, &nchunks);
  /* The kernels add in another order than the CPU (threads striding over a chunk, the tree, the
     chunks; var and std by Welford and Chan's merge, the CPU in two passes): in f64 the rounding
     that leaves grows with the row, past 1e-13 of a result that cancels (a sum near 0 of 10^4
     values in [-3, 3]). */
  int64_t R = want->numel ? a->numel / want->numel : 0;
  double tol = 0;
  if (!arg && !takes_ints(op, dtype))
    tol = want->dtype == KILN_F64 ? 1e-13 * fmax(1.0, (double)R / 1024) : want->dtype == KILN_F32 ? 1e-6 : 1e-2;
  ok = ok && same_values(got, want, tol, what);
  if (want_chunks && nchunks < 2) {
    fprintf(stderr, "%s: one chunk only (%lld)\n", what, (long long)nchunks);
    ok = false;
  }
  report(ok, __LINE__, what);
  kiln_tensor_release(got);
  kiln_tensor_release(want);
  kiln_tensor_release(a);
}

static void test_reductions() {
  const int ops[] = {KILN_OP_SUM, KILN_OP_MEAN, KILN_OP_PROD, KILN_OP_MAX, KILN_OP_MIN, KILN_OP_ARGMAX, KILN_OP_ARGMIN,
                     KILN_OP_VAR, KILN_OP_STD, KILN_OP_NORM, KILN_OP_LOGSUMEXP};
  const int dtypes[] = {KILN_F32, KILN_F64, KILN_F16, KILN_I64, KILN_I32, KILN_BOOL};
  const int64_t s3[] = {7, 11, 13}, big[] = {3, 5000}, flat[] = {9001}, empty_r[] = {5, 0}, one[] = {1};
  for (int op : ops) {
    double ps[] = {op == KILN_OP_VAR || op == KILN_OP_STD ? 1.0 : 2.0, 0, 1, 3, INFINITY, -INFINITY};
    int np = op == KILN_OP_NORM ? 6 : (op == KILN_OP_VAR || op == KILN_OP_STD) ? 3 : 1;
    if (op == KILN_OP_VAR || op == KILN_OP_STD) { ps[1] = 0; ps[2] = 2; }
    for (int dt : dtypes)
      for (int k = 0; k < np; k++) {
        double p = ps[k];
        for (int64_t mask : {1, 2, 4, 5, 7}) {
          check_reduce(op, 3, s3, dt, mask, p, false, false, 1000, false);
          check_reduce(op, 3, s3, dt, mask, p, true, true, 1000, false);
        }
        check_reduce(op, 2, big, dt, 2, p, true, dt == KILN_F32, 1000, true);   /* several chunks per row */
        check_reduce(op, 2, big, dt, 1, p, false, false, 1000, false);
        check_reduce(op, 1, flat, dt, 1, p, false, dt == KILN_F64, 1 << 20, true);
        check_reduce(op, 1, flat, dt, 1, p, true, false, 1, false);              /* few blocks: one chunk */
        check_reduce(op, 2, empty_r, dt, 2, p, false, false, 1000, false);       /* rows of nothing */
        check_reduce(op, 1, one, dt, 1, p, false, false, 1000, false);
        check_reduce(op, 0, NULL, dt, 0, p, false, false, 1000, false);          /* 0-dim */
      }
  }
  /* The plan tiles each row and picks a power-of-two block. */
  struct kiln_cuda_reduce_plan pl;
  const int64_t sz[] = {2, 3, 4};
  kiln_cuda_reduce_plan(3, sz, 5, 100, &pl);
  report(pl.M == 3 && pl.R == 8 && pl.perm[0] == 1 && pl.perm[1] == 0 && pl.perm[2] == 2 && pl.threads == 32 &&
         pl.nchunks == 1 && pl.chunk == 8, __LINE__, "reduce plan of [2,3,4] over dims 0 and 2");
  const int64_t huge[] = {1, (int64_t)1 << 30};
  kiln_cuda_reduce_plan(2, huge, 2, 1056, &pl);
  report(pl.threads == 256 && pl.nchunks == 1056 && pl.chunk * pl.nchunks >= pl.R && (pl.nchunks - 1) * pl.chunk < pl.R,
         __LINE__, "reduce plan of one long row: a chunk per block");
  report(kiln_cuda_pow2_threads(0, 32, 256) == 32 && kiln_cuda_pow2_threads(33, 32, 256) == 64 &&
         kiln_cuda_pow2_threads(100000, 32, 256) == 256, __LINE__, "pow2 threads");
}

/* ---- nll_loss and cross entropy per position; dropout's mask ---- */

template <class T> static void check_nll(int dtype) {
  const int64_t shape[] = {6, 7, 5}, tshape[] = {6, 5};
  struct kiln_tensor *x = make_input(3, shape, dtype, false, false, 11);
  std::vector<double> tv(30), wv(7);
  for (int i = 0; i < 30; i++) tv[(size_t)i] = (double)((i * 5 + 1) % 7);
  for (int c = 0; c < 7; c++) wv[(size_t)c] = 0.5 + 0.25 * c;
  struct kiln_tensor *t = kiln_tensor_from_f64(2, tshape, tv.data(), KILN_I64, CPU);
  struct kiln_tensor *w = kiln_tensor_from_f64(1, shape + 1, wv.data(), dtype, CPU);
  struct kiln_tensor *lp = kiln_log_softmax(x, 1);
  for (double eps : {0.0, 0.2})
    for (int64_t ignore : {(int64_t)-100, (int64_t)3})
      for (bool weighted : {false, true}) {
        struct kiln_tensor *want = kiln_cross_entropy(x, t, weighted ? w : NULL, ignore, eps, KILN_REDUCTION_NONE);
        struct kiln_tensor *got = kiln_tensor_empty(2, tshape, dtype, CPU);
        for (int64_t q = 0; q < 30; q++)
          ((T *)kiln_tensor_data(got))[q] = kiln_nn::nll_position<T>((const T *)kiln_tensor_data(lp), (const int64_t *)kiln_tensor_data(t),
                                                                     weighted ? (const T *)kiln_tensor_data(w) : NULL, q, 7, 5,
                                                                     ignore, eps);
        char what[96];
        snprintf(what, sizeof what, "cross_entropy %s positions, eps %g, ignore %lld%s", kiln_dtype_name(dtype), eps,
                 (long long)ignore, weighted ? ", weights" : "");
        report(want && same_values(got, want, dtype == KILN_F32 ? 1e-6 : 1e-14, what), __LINE__, what);
        kiln_tensor_release(want);
        kiln_tensor_release(got);
      }
  kiln_tensor_release(x); kiln_tensor_release(t); kiln_tensor_release(w); kiln_tensor_release(lp);
}

template <class T> static void check_dropout(int dtype, double p) {
  const int64_t n = 4099;
  struct kiln_tensor *x = kiln_tensor_full(1, &n, 1.0, dtype, CPU);
  const uint64_t seed = 0xfeedbeefull, offset = 12345;
  kiln_random_set_state(seed, offset);
  struct kiln_tensor *y = kiln_dropout(x, p, 1);   /* y = mask */
  int bad = 0;
  for (int64_t i = 0; y && i < n; i++) {
    T m = kiln_nn::dropout_mask<T>(seed, offset, i, (uint64_t)(p * 4294967296.0), 1.0 / (1.0 - p));
    if (memcmp(&m, (const T *)kiln_tensor_data(y) + i, sizeof m) != 0) bad++;
  }
  char what[64];
  snprintf(what, sizeof what, "dropout %s p %g mask bit for bit", kiln_dtype_name(dtype), p);
  report(y && bad == 0, __LINE__, what);
  kiln_tensor_release(x);
  kiln_tensor_release(y);
}

/* nll_loss (fused: cross_entropy) on x [N, C, d1, ...] with targets drawn from the seed (one in
   `ignored` of them ignore when that is outside [0, C); every one when ignored is 1), forward and
   backward as loss.cu runs them: the total weight by one block, each position's loss, the reduced
   loss by one block, the input's grad per position with the total weight the forward found. The
   log_softmax of the fused op is the CPU's (softmax.cu is not replayed). */
template <class T>
static void check_loss(bool fused, int ndim, const int64_t *sizes, bool weighted, int64_t ignore, int ignored, double eps,
                       int reduction, int dtype, uint64_t seed) {
  using namespace kiln_nn;
  int64_t N = sizes[0], C = sizes[1], S = 1, tshape[KILN_MAX_DIMS];
  for (int d = 2; d < ndim; d++) S *= sizes[d];
  int tnd = 0;
  for (int d = 0; d < ndim; d++)
    if (d != 1) tshape[tnd++] = sizes[d];
  int64_t P = N * S;
  struct kiln_tensor *x = make_input(ndim, sizes, dtype, false, false, seed);
  std::vector<double> tv((size_t)(P > 0 ? P : 1)), wv((size_t)C);
  uint64_t h = seed * 0x9E3779B97F4A7C15ull + 3;
  auto draw = [&](uint64_t m) { h ^= h << 13; h ^= h >> 7; h ^= h << 17; return (int64_t)(h % m); };
  bool outside = ignore < 0 || ignore >= C;
  for (int64_t q = 0; q < P; q++)
    tv[(size_t)q] = (double)(outside && (ignored == 1 || (ignored > 1 && draw((uint64_t)ignored) == 0)) ? ignore : draw((uint64_t)C));
  for (int64_t c = 0; c < C; c++) wv[(size_t)c] = draw(9) == 0 ? 0.0 : 0.125 * (double)(1 + draw(16));
  struct kiln_tensor *t = kiln_tensor_from_f64(tnd, tshape, tv.data(), KILN_I64, CPU);
  struct kiln_tensor *w = weighted ? kiln_tensor_from_f64(1, &C, wv.data(), dtype, CPU) : NULL;
  struct kiln_tensor *gy = reduction == KILN_REDUCTION_NONE ? make_input(tnd, tshape, dtype, false, false, seed + 1)
                                                            : make_input(0, NULL, dtype, false, false, seed + 1);
  kiln_requires_grad_(x, 1);
  struct kiln_tensor *want = fused ? kiln_cross_entropy(x, t, w, ignore, eps, reduction) : kiln_nll_loss(x, t, w, ignore, reduction);
  bool ok = want && kiln_backward(want, gy, 0) == KILN_OK;
  struct kiln_tensor *lp = fused ? kiln_log_softmax(x, 1) : NULL;
  const T *logp = data_of<T>(fused ? lp : x), *wp = data_of<T>(w);
  const int64_t *tp = data_of<int64_t>(t);
  double total = block_order_sum(P, 256, [&](int64_t q) {   /* nll_check_kernel */
    return tp[q] == ignore ? 0.0 : wp ? (double)wp[tp[q]] : 1.0;
  });
  struct kiln_tensor *y = reduction == KILN_REDUCTION_NONE ? kiln_tensor_empty(tnd, tshape, dtype, CPU)
                                                           : kiln_tensor_empty(0, NULL, dtype, CPU);
  std::vector<T> per((size_t)(P > 0 ? P : 1));
  T *yv = reduction == KILN_REDUCTION_NONE ? data_of<T>(y) : per.data();
  for (int64_t q = 0; q < P; q++) yv[q] = nll_position<T>(logp, tp, wp, q, C, S, ignore, fused ? eps : 0.0);   /* nll_loss_kernel */
  double mag = 0;   /* the sum of the reduced losses' magnitudes */
  if (reduction != KILN_REDUCTION_NONE) {   /* nll_reduce_kernel */
    double sum = block_order_sum(P, 256, [&](int64_t q) { return (double)per[(size_t)q]; });
    for (int64_t q = 0; q < P; q++) mag += fabs((double)per[(size_t)q]);
    if (reduction == KILN_REDUCTION_MEAN) mag /= total;
    data_of<T>(y)[0] = (T)(reduction == KILN_REDUCTION_MEAN ? sum / total : sum);
  }
  struct kiln_tensor *gx = kiln_tensor_full(ndim, sizes, NAN, dtype, CPU);
  double ws = (double)C;   /* weight_sum_kernel: one thread, in order */
  if (wp) { ws = 0; for (int64_t c = 0; c < C; c++) ws += (double)wp[c]; }
  for (int64_t q = 0; q < P && x->numel > 0; q++)   /* nll_backward_kernel */
    nll_grad_position<T>(data_of<T>(gx), data_of<T>(gy), tp, wp, logp, q, C, S, ignore, reduction, fused, fused ? eps : 0.0,
                         total, ws);
  static const char *const reductions[] = {"none", "mean", "sum"};
  char what[256];
  snprintf(what, sizeof what, "%s %s %s, %s, ignore %lld%s, smoothing %g, reduction %s, seed %llu",
           fused ? "cross_entropy" : "nll_loss", kiln_dtype_name(dtype), kiln_shape_string(x), weighted ? "weights" : "no weights",
           (long long)ignore, ignored == 1 && outside ? " (every target)" : "", eps, reductions[reduction], (unsigned long long)seed);
  /* The reduced loss sums in the block's order, the CPU in order: where the sum of thousands of
     losses cancels (nll_loss of random log-probs, losses of both signs) the two are some ulps of
     the terms' magnitude apart, more than 1e-14 of the result in f64. The tolerance of the
     reduced loss grows to 16 double ulps of the sum of magnitudes; the total weight is exact here
     (weights in eighths). */
  double tol = dtype == KILN_F32 ? 1e-6 : 1e-14;
  ok = ok && same_values(y, want, fmax(tol, 16 * mag * 0x1p-53), what) && grads_match(gx, x, tol, what, "gx");
  report(ok, __LINE__, what);
  if (!want) fprintf(stderr, "  %s\n", kiln_error_message());
  kiln_error_clear();
  struct kiln_tensor *all[] = {x, t, w, gy, want, lp, y, gx};
  for (struct kiln_tensor *a : all) kiln_tensor_release(a);
}

/* dropout(x) in training on x of `sizes` (transposed when `strided`) at generator state (seed,
   offset): y and the mask (the grad of x for a grad of ones) against dropout.cu's elements, bit for bit. */
template <class T>
static void check_dropout_case(int ndim, const int64_t *sizes, bool strided, double p, uint64_t seed, uint64_t offset, int dtype,
                               uint64_t xseed) {
  struct kiln_tensor *base = make_input(ndim, sizes, dtype, false, false, xseed);
  struct kiln_tensor *x = strided && ndim > 1 ? kiln_transpose(base, 0, ndim - 1) : kiln_alias(base);
  kiln_requires_grad_(x, 1);
  kiln_random_set_state(seed, offset);
  struct kiln_tensor *y = kiln_dropout(x, p, 1);
  struct kiln_tensor *ones = y ? kiln_tensor_full(y->ndim, y->sizes, 1.0, dtype, CPU) : NULL;
  bool ok = y && kiln_backward(y, ones, 0) == KILN_OK && x->grad;
  struct kiln_tensor *xc = kiln_contiguous(x), *yc = y ? kiln_contiguous(y) : NULL, *gc = ok ? kiln_contiguous(x->grad) : NULL;
  ok = ok && xc && yc && gc;
  uint64_t threshold = (uint64_t)(p * 4294967296.0);   /* as dropout.cu */
  double scale = 1.0 / (1.0 - p);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; ok && i < x->numel; i++) {   /* dropout_kernel */
    T m = kiln_nn::dropout_mask<T>(seed, offset, i, threshold, scale), v = data_of<T>(xc)[i] * m;
    if (memcmp(&m, data_of<T>(gc) + i, sizeof m) != 0 || memcmp(&v, data_of<T>(yc) + i, sizeof v) != 0) {
      if (first < 0) first = i;
      bad++;
    }
  }
  char what[256];
  snprintf(what, sizeof what, "dropout %s %s%s, p %.17g, seed 0x%llx, offset %llu, input seed %llu", kiln_dtype_name(dtype),
           kiln_shape_string(x), strided && ndim > 1 ? " (transposed)" : "", p, (unsigned long long)seed,
           (unsigned long long)offset, (unsigned long long)xseed);
  if (bad) fprintf(stderr, "%s: %lld elements differ from the CPU's, the first %lld\n", what, (long long)bad, (long long)first);
  if (!ok) fprintf(stderr, "%s: %s\n", what, kiln_error_message());
  report(ok && bad == 0, __LINE__, what);
  kiln_error_clear();
  struct kiln_tensor *all[] = {base, x, y, ones, xc, yc, gc};
  for (struct kiln_tensor *a : all) kiln_tensor_release(a);
}

/* ---- layer, group and batch norm: the kernels' block order, against the CPU's forward and
   autograd backward ---- */

/* The norms' y = x * scale + shift and gx = t1 * gy + t2 * x + t3: the replay rounds each product,
   the CPU (gcc, -march=native) and the device (nvcc's default --fmad) may fuse a product with the
   add, half an ulp of the product apart. Where invstd is large (a group of one element:
   1/sqrt(eps)) the products are far larger than the result, and that half ulp passes the relative
   tolerance of the result: the tolerance grows to a few ulps of the largest product (mag). */
static double fused_tol(double tol, int dtype, double mag) {
  return fmax(tol, 4 * mag * (dtype == KILN_F32 ? 0x1p-24 : 0x1p-53));
}

template <class T>
static void check_row_norm(int op, int ndim, const int64_t *sizes, int64_t param, bool affine, int dtype, uint64_t seed,
                           int64_t max_blocks = 4224) {
  using namespace kiln_norm;
  struct kiln_tensor *x = make_input(ndim, sizes, dtype, false, false, seed);
  bool group = op == KILN_OP_GROUP_NORM;
  int pn = group ? 1 : (int)param;
  const int64_t *psizes = group ? sizes + 1 : sizes + (ndim - param);
  struct kiln_tensor *w = affine ? make_input(pn, psizes, dtype, false, false, seed + 1) : NULL;
  struct kiln_tensor *b = affine ? make_input(pn, psizes, dtype, false, false, seed + 2) : NULL;
  struct kiln_tensor *gy = make_input(ndim, sizes, dtype, false, false, seed + 3);
  kiln_requires_grad_(x, 1);
  if (w) { kiln_requires_grad_(w, 1); kiln_requires_grad_(b, 1); }
  const double eps = 1e-5;
  struct kiln_tensor *want = group ? kiln_group_norm(x, param, w, b, eps) : kiln_layer_norm(x, (int)param, w, b, eps);
  bool ok = want && kiln_backward(want, gy, 0) == KILN_OK;
  struct rn_geom g = rn_geom_of(op, param, ndim, sizes, x->numel);
  const T *xv = data_of<T>(x), *wv = data_of<T>(w), *bv = data_of<T>(b), *gv = data_of<T>(gy);
  std::vector<T> mean((size_t)g.rows + 1), invstd((size_t)g.rows + 1);
  struct kiln_tensor *y = kiln_tensor_empty(ndim, sizes, dtype, CPU), *gx = kiln_tensor_empty(ndim, sizes, dtype, CPU);
  struct kiln_tensor *gw = w ? kiln_tensor_empty(pn, psizes, dtype, CPU) : NULL, *gb = w ? kiln_tensor_empty(pn, psizes, dtype, CPU) : NULL;
  int threads = kiln_cuda_pow2_threads(g.L, 32, 256);
  double mag_y = 0, mag_gx = 0;   /* the largest products in y and gx (fused_tol) */
  for (int64_t r = 0; r < g.rows; r++) {   /* row_norm_kernel */
    const T *xr = xv + r * g.L;
    double m = rn_mean(block_order_sum(g.L, threads, [&](int64_t i) { return (double)xr[i]; }), g.L);
    double is = rn_invstd(block_order_sum(g.L, threads, [&](int64_t i) { double d = (double)xr[i] - m; return d * d; }), g.L, eps);
    mean[(size_t)r] = (T)m;
    invstd[(size_t)r] = (T)is;
    for (int64_t i = 0; i < g.L; i++) {
      data_of<T>(y)[r * g.L + i] = rn_forward_element<T>(xr[i], g, r, i, m, is, wv, bv);
      mag_y = fmax(mag_y, (fabs((double)xr[i]) + fabs(m)) * is * (wv ? fabs((double)wv[rn_channel(g, r, i)]) : 1.0));
    }
  }
  for (int64_t r = 0; r < g.rows && g.L > 0; r++) {   /* row_norm_backward_kernel */
    const T *xr = xv + r * g.L, *gr = gv + r * g.L;
    double m = (double)mean[(size_t)r], is = (double)invstd[(size_t)r];
    auto gw_of = [&](int64_t i) { return (double)gr[i] * (wv ? (double)wv[rn_channel(g, r, i)] : 1.0); };
    double a = block_order_sum(g.L, threads, gw_of);
    double bs = block_order_sum(g.L, threads, [&](int64_t i) { return gw_of(i) * ((double)xr[i] - m); });
    double k2, k3;
    rn_backward_coefs(m, is, a, bs, g.L, &k2, &k3);
    for (int64_t i = 0; i < g.L; i++) {
      data_of<T>(gx)[r * g.L + i] = rn_backward_element<T>(gr[i], xr[i], g, r, i, is, wv, (T)k2, (T)k3);
      double t1 = is * (wv ? (double)wv[rn_channel(g, r, i)] : 1.0);
      mag_gx = fmax(mag_gx, fabs(t1 * (double)gr[i]) + fabs(k2 * (double)xr[i]) + fabs(k3));
    }
  }
  if (w && group) {   /* gn_grads_partial_kernel (a chunk of a channel a block), fold_param_grads_kernel */
    int64_t per = g.rows / g.G * g.S, chunk, nchunks;
    int pt;
    kiln_cuda_chunk_rows(g.C, per, max_blocks, &chunk, &nchunks, &pt);
    if (nchunks == 0) nchunks = 1;
    std::vector<double> pw((size_t)(nchunks * g.C)), pb((size_t)(nchunks * g.C));
    for (int64_t c = 0; c < g.C; c++)
      for (int64_t p = 0; p < nchunks; p++) {
        int64_t k0 = p * chunk, k1 = k0 + chunk < per ? k0 + chunk : per;
        if (k1 < k0) k1 = k0;
        pw[(size_t)(p * g.C + c)] = block_order_sum(k0, k1, pt, [&](int64_t k) {
          int64_t at;
          return gn_weight_term<T>(xv, gv, mean.data(), invstd.data(), g, c, k, &at);
        });
        pb[(size_t)(p * g.C + c)] = block_order_sum(k0, k1, pt, [&](int64_t k) {
          int64_t at;
          gn_weight_term<T>(xv, gv, mean.data(), invstd.data(), g, c, k, &at);
          return (double)gv[at];
        });
      }
    for (int64_t c = 0; c < g.C; c++) {
      data_of<T>(gw)[c] = (T)fold_chunks(pw.data(), c, g.C, nchunks);
      data_of<T>(gb)[c] = (T)fold_chunks(pb.data(), c, g.C, nchunks);
    }
  } else if (w) {   /* ln_grads_partial_kernel (32 columns by 8 row lanes a block), fold_param_grads_kernel */
    int64_t tiles, chunk, nchunks;
    kiln_cuda_ln_grads_plan(g.rows, g.L, max_blocks, &tiles, &chunk, &nchunks);
    std::vector<double> pw((size_t)(nchunks * g.L)), pb((size_t)(nchunks * g.L));
    for (int64_t j = 0; j < g.L; j++)
      for (int64_t p = 0; p < nchunks; p++) {
        int64_t r0 = p * chunk, r1 = r0 + chunk < g.rows ? r0 + chunk : g.rows;
        std::vector<double> lw(8), lb(8);
        for (int rl = 0; rl < 8; rl++)
          ln_param_partial<T>(xv, gv, mean.data(), invstd.data(), g.L, j, r0 + rl, r1, 8, &lw[(size_t)rl], &lb[(size_t)rl]);
        pw[(size_t)(p * g.L + j)] = tree_sum(lw);
        pb[(size_t)(p * g.L + j)] = tree_sum(lb);
      }
    for (int64_t j = 0; j < g.L; j++) {
      data_of<T>(gw)[j] = (T)fold_chunks(pw.data(), j, g.L, nchunks);
      data_of<T>(gb)[j] = (T)fold_chunks(pb.data(), j, g.L, nchunks);
    }
  }
  char what[256];
  snprintf(what, sizeof what, "%s %s %s, param %lld%s, seed %llu", kiln_op_name(op), kiln_dtype_name(dtype),
           kiln_shape_string(x), (long long)param, affine ? ", weight and bias" : "", (unsigned long long)seed);
  double tol = dtype == KILN_F32 ? 2e-5 : 1e-12;
  ok = ok && same_values(y, want, fused_tol(tol, dtype, mag_y), what) &&
       grads_match(gx, x, fused_tol(tol, dtype, mag_gx), what, "gx");
  if (w) ok = ok && grads_match(gw, w, tol, what, "gw") && grads_match(gb, b, tol, what, "gb");
  report(ok, __LINE__, what);
  if (!ok && !want) fprintf(stderr, "  %s\n", kiln_error_message());
  kiln_error_clear();
  struct kiln_tensor *all[] = {x, w, b, gy, want, y, gx, gw, gb};
  for (struct kiln_tensor *t : all) kiln_tensor_release(t);
}

static void test_row_norms() {
  const int64_t s3[] = {5, 7, 9}, wide[] = {3, 1000}, one[] = {4, 1}, img[] = {4, 6, 5, 3}, plane[] = {3, 12}, big[] = {2, 4, 40, 30};
  for (int dt : {KILN_F32, KILN_F64})
    for (bool affine : {false, true}) {
      uint64_t seed = (uint64_t)(dt * 10 + affine);
      auto ln = [&](int nd, const int64_t *sz, int64_t k) {
        if (dt == KILN_F32) check_row_norm<float>(KILN_OP_LAYER_NORM, nd, sz, k, affine, dt, seed);
        else check_row_norm<double>(KILN_OP_LAYER_NORM, nd, sz, k, affine, dt, seed);
      };
      auto gn = [&](int nd, const int64_t *sz, int64_t groups) {
        if (dt == KILN_F32) check_row_norm<float>(KILN_OP_GROUP_NORM, nd, sz, groups, affine, dt, seed);
        else check_row_norm<double>(KILN_OP_GROUP_NORM, nd, sz, groups, affine, dt, seed);
      };
      ln(3, s3, 1); ln(3, s3, 2); ln(3, s3, 3); ln(2, wide, 1); ln(2, one, 1);
      gn(4, img, 1); gn(4, img, 2); gn(4, img, 3); gn(4, img, 6); gn(2, plane, 4); gn(4, big, 2);
      /* the param grads over several chunks (600 rows: five of 120; 6400 elements a channel: two),
         and over one when the columns or channels fill the blocks */
      const int64_t rows[] = {600, 40}, chans[] = {4, 6, 40, 40};
      for (int64_t mb : {(int64_t)4224, (int64_t)2}) {
        if (dt == KILN_F32) {
          check_row_norm<float>(KILN_OP_LAYER_NORM, 2, rows, 1, affine, dt, seed, mb);
          check_row_norm<float>(KILN_OP_GROUP_NORM, 4, chans, 3, affine, dt, seed, mb);
        } else {
          check_row_norm<double>(KILN_OP_LAYER_NORM, 2, rows, 1, affine, dt, seed, mb);
          check_row_norm<double>(KILN_OP_GROUP_NORM, 4, chans, 3, affine, dt, seed, mb);
        }
      }
    }
  int64_t tiles, chunk, nchunks;
  kiln_cuda_ln_grads_plan(600, 40, 4224, &tiles, &chunk, &nchunks);
  report(tiles == 2 && chunk == 120 && nchunks == 5, __LINE__, "layer norm grads: 600 rows of 40 are 2 tiles of 5 chunks");
  kiln_cuda_ln_grads_plan(600, 40, 2, &tiles, &chunk, &nchunks);
  report(nchunks == 1 && chunk == 600, __LINE__, "layer norm grads: one chunk when the tiles fill the blocks");
  kiln_cuda_ln_grads_plan(0, 40, 4224, &tiles, &chunk, &nchunks);
  report(nchunks == 1 && chunk == 0, __LINE__, "layer norm grads: no rows, one empty chunk");
  int threads;
  kiln_cuda_chunk_rows(6, 6400, 4224, &chunk, &nchunks, &threads);
  report(nchunks == 2, __LINE__, "group norm grads: 6400 elements a channel are two chunks");
}

/* Batch norm on x [N, C, ...]: training with running stats (updated in place, through a strided
   view when `strided`), training without, or evaluation with them. */
template <class T>
static void check_batch_norm(int ndim, const int64_t *sizes, bool affine, int mode, bool strided, int dtype, uint64_t seed,
                             int64_t max_blocks = 4224) {
  using namespace kiln_norm;
  const int64_t C = sizes[1], two[] = {C, 2};
  struct kiln_tensor *x = make_input(ndim, sizes, dtype, false, false, seed);
  struct kiln_tensor *w = affine ? make_input(1, &C, dtype, false, false, seed + 1) : NULL;
  struct kiln_tensor *b = affine ? make_input(1, &C, dtype, false, false, seed + 2) : NULL;
  struct kiln_tensor *gy = make_input(ndim, sizes, dtype, false, false, seed + 3);
  bool training = mode != 2, running = mode != 1;
  /* running stats: the CPU's (updated by the op) and the replay's, the same values */
  struct kiln_tensor *base[2] = {make_input(2, two, dtype, false, false, seed + 4), make_input(2, two, dtype, false, false, seed + 5)};
  for (int k = 0; k < 2; k++) {   /* variances must be positive */
    struct kiln_tensor *a = kiln_unary(KILN_OP_ABS, base[k]);
    kiln_tensor_release(base[k]);
    base[k] = a;
  }
  struct kiln_tensor *rm = NULL, *rv = NULL;
  if (running) {
    rm = kiln_select(base[0], 1, 1);
    rv = kiln_select(base[1], 1, 0);
    if (!strided) {
      struct kiln_tensor *a = kiln_clone(rm), *v = kiln_clone(rv);
      kiln_tensor_release(rm);
      kiln_tensor_release(rv);
      rm = a;
      rv = v;
    }
  }
  std::vector<T> rmv((size_t)C), rvv((size_t)C);
  for (int64_t c = 0; c < C && running; c++) {
    rmv[(size_t)c] = data_of<T>(rm)[c * rm->strides[0]];
    rvv[(size_t)c] = data_of<T>(rv)[c * rv->strides[0]];
  }
  kiln_requires_grad_(x, 1);
  if (w) { kiln_requires_grad_(w, 1); kiln_requires_grad_(b, 1); }
  const double eps = 1e-5, momentum = 0.1;
  struct kiln_tensor *want = kiln_batch_norm(x, w, b, rm, rv, training, momentum, eps);
  bool ok = want && kiln_backward(want, gy, 0) == KILN_OK;
  int64_t S = 1;
  for (int d = 2; d < ndim; d++) S *= sizes[d];
  int64_t per = sizes[0] * S;
  int batch_stats = training || !running, update = training && running && x->numel > 0;   /* as nn.c */
  /* norm.cu's plan: chunks of each channel, one block a chunk, partials folded in order */
  int64_t chunk, nchunks;
  int threads;
  kiln_cuda_chunk_rows(C, per, max_blocks, &chunk, &nchunks, &threads);
  if (nchunks == 0) nchunks = 1;
  std::vector<double> part((size_t)(C * nchunks));
  /* the channel's sum of term(k) as the kernels take it: a partial per chunk, then fold_chunks */
  auto chunked_sum = [&](int64_t c, auto term) {
    for (int64_t p = 0; p < nchunks; p++) {
      int64_t k0 = p * chunk, k1 = k0 + chunk < per ? k0 + chunk : per;
      part[(size_t)(p * C + c)] = block_order_sum(k0, k1 > k0 ? k1 : k0, threads, term);
    }
    return fold_chunks(part.data(), c, C, nchunks);
  };
  const T *xv = data_of<T>(x), *wv = data_of<T>(w), *bv = data_of<T>(b), *gv = data_of<T>(gy);
  struct kiln_tensor *y = kiln_tensor_empty(ndim, sizes, dtype, CPU), *gx = kiln_tensor_empty(ndim, sizes, dtype, CPU);
  struct kiln_tensor *gw = kiln_tensor_empty(1, &C, dtype, CPU), *gb = kiln_tensor_empty(1, &C, dtype, CPU);
  bool stats_ok = true;
  double mag_y = 0, mag_gx = 0;   /* the largest products in y and gx (fused_tol) */
  for (int64_t c = 0; c < C; c++) {
    double m, is, M = (double)per;   /* bn_stats_kernel twice, bn_apply_kernel */
    if (batch_stats) {
      m = bn_mean(chunked_sum(c, [&](int64_t k) { return (double)xv[bn_at(k, c, C, S)]; }), M);
      double q = chunked_sum(c, [&](int64_t k) { double d = (double)xv[bn_at(k, c, C, S)] - m; return d * d; });
      is = bn_batch_invstd<T>(m, q, M, eps, update, momentum, &rmv[(size_t)c], &rvv[(size_t)c]);
    } else {
      m = (double)rmv[(size_t)c];
      is = bn_running_invstd<T>(&rvv[(size_t)c], eps);
    }
    T scale, shift;
    bn_affine<T>(m, is, wv, bv, c, &scale, &shift);
    for (int64_t k = 0; k < per; k++) {
      data_of<T>(y)[bn_at(k, c, C, S)] = xv[bn_at(k, c, C, S)] * scale + shift;
      mag_y = fmax(mag_y, fabs((double)xv[bn_at(k, c, C, S)] * (double)scale) + fabs((double)shift));
    }
    if (running) {
      T a = data_of<T>(rm)[c * rm->strides[0]], v = data_of<T>(rv)[c * rv->strides[0]];
      double tol = dtype == KILN_F32 ? 1e-6 : 1e-14;
      stats_ok = stats_ok && fabs((double)a - (double)rmv[(size_t)c]) <= tol * fmax(1.0, fabs((double)a)) &&
                 fabs((double)v - (double)rvv[(size_t)c]) <= tol * fmax(1.0, fabs((double)v));
    }
    T mt = (T)m, it = (T)is;   /* bn_grad_sums_kernel, bn_grad_apply_kernel: from the saved mean and invstd */
    double md = (double)mt, id = (double)it;
    double sg = chunked_sum(c, [&](int64_t k) { return (double)gv[bn_at(k, c, C, S)]; });
    double sgx = chunked_sum(c, [&](int64_t k) {
      int64_t at = bn_at(k, c, C, S);
      return (double)gv[at] * ((double)xv[at] - md);
    });
    data_of<T>(gw)[c] = (T)(sgx * id);
    data_of<T>(gb)[c] = (T)sg;
    double kk[3];
    bn_backward_coefs(batch_stats, md, id, wv ? (double)wv[c] : 1.0, sg, sgx, M, kk);
    T t1 = (T)kk[0], t2 = (T)kk[1], t3 = (T)kk[2];
    for (int64_t k = 0; k < per; k++) {
      int64_t at = bn_at(k, c, C, S);
      data_of<T>(gx)[at] = t1 * gv[at] + t2 * xv[at] + t3;
      mag_gx = fmax(mag_gx, fabs((double)t1 * (double)gv[at]) + fabs((double)t2 * (double)xv[at]) + fabs((double)t3));
    }
  }
  char what[256];
  snprintf(what, sizeof what, "batch_norm %s %s, %s%s%s, seed %llu", kiln_dtype_name(dtype), kiln_shape_string(x),
           mode == 0 ? "training, running stats" : mode == 1 ? "training, no running stats" : "evaluation",
           strided && running ? " (strided)" : "", affine ? ", weight and bias" : "", (unsigned long long)seed);
  double tol = dtype == KILN_F32 ? 2e-5 : 1e-12;
  if (!stats_ok) fprintf(stderr, "%s: the running stats differ\n", what);
  ok = ok && stats_ok && same_values(y, want, fused_tol(tol, dtype, mag_y), what) &&
       grads_match(gx, x, fused_tol(tol, dtype, mag_gx), what, "gx");
  if (w) ok = ok && grads_match(gw, w, tol, what, "gw") && grads_match(gb, b, tol, what, "gb");
  report(ok, __LINE__, what);
  if (!want) fprintf(stderr, "  %s\n", kiln_error_message());
  kiln_error_clear();
  struct kiln_tensor *all[] = {x, w, b, gy, base[0], base[1], rm, rv, want, y, gx, gw, gb};
  for (struct kiln_tensor *t : all) kiln_tensor_release(t);
}

/* The batch-norm kernels' walk over a channel (bn_cursor) visits what bn_at names, in order, for
   images smaller, equal and larger than the block's step. */
static void test_bn_cursor() {
  using namespace kiln_norm;
  int bad = 0;
  long visits = 0;
  for (int64_t S : {1, 2, 3, 7, 255, 256, 257, 1000, 12544})
    for (int64_t step : {1, 32, 256})
      for (int64_t first : {(int64_t)0, (int64_t)1, step - 1})
        for (int64_t N : {1, 3, 5})
          for (int64_t C : {1, 4}) {
            int64_t per = N * S, c = C - 1, count = 0;
            for (struct bn_cursor q = bn_cursor_start(first, S); q.k < per; bn_cursor_next(&q, step, S)) {
              if (bn_cursor_at(&q, c, C, S) != bn_at(q.k, c, C, S) || q.k != first + count * step) bad++;
              count++;
              visits++;
            }
            if (count != (per > first ? (per - first + step - 1) / step : 0)) bad++;
          }
  report(bad == 0, __LINE__, "bn_cursor visits what bn_at names, in order");
  /* bn_walk: a thread's part of a chunk [k0, end), four at a time, is the same visits in order */
  long walk_bad = 0, walks = 0;
  for (int64_t S : {1, 7, 64, 300})
    for (int64_t step : {32, 256})
      for (int64_t k0 : {(int64_t)0, (int64_t)5, 3 * step + 1})
        for (int64_t len : {(int64_t)0, (int64_t)1, 4 * step - 1, 4 * step, 9 * step + 3})
          for (int64_t t : {(int64_t)0, step - 1}) {
            const int64_t C = 3, c = 1, end = k0 + len;
            std::vector<int64_t> want, got;
            for (int64_t k = k0 + t; k < end; k += step) want.push_back(bn_at(k, c, C, S));
            bn_walk(c, C, S, k0 + t, end, step, [&](int64_t at) { got.push_back(at); });
            walk_bad += want != got;
            walks++;
          }
  report(walk_bad == 0 && walks > 200, __LINE__, "bn_walk visits a thread's part of a chunk in order");
  report(visits > 100000, __LINE__, "bn_cursor: the walks visited enough elements");
}

static void test_batch_norm() {
  int64_t chunk, nchunks;
  int threads;
  kiln_cuda_chunk_rows(3, 5 * 40 * 41, 4224, &chunk, &nchunks, &threads);
  report(threads == 256 && nchunks == 3 && chunk == 2734, __LINE__, "batch norm: 8200 elements a channel are three chunks");
  kiln_cuda_chunk_rows(3, 5 * 40 * 41, 2, &chunk, &nchunks, &threads);
  report(nchunks == 1 && chunk == 8200, __LINE__, "batch norm: one chunk a channel when the channels fill the blocks");
  const int64_t img[] = {4, 6, 5, 3}, rows[] = {37, 11}, big[] = {3, 2, 40, 30}, two[] = {2, 3};
  const int64_t no_images[] = {0, 2}, no_pixels[] = {7, 8, 0, 8};   /* the sweep's failing geometries */
  for (int dt : {KILN_F32, KILN_F64})
    for (bool affine : {false, true})
      for (int mode : {0, 1, 2})
        for (bool strided : {false, true}) {
          if (strided && mode == 1) continue;
          uint64_t seed = (uint64_t)(dt * 100 + affine * 10 + mode * 2 + strided);
          for (const int64_t *sz : {img, big}) {
            if (dt == KILN_F32) check_batch_norm<float>(4, sz, affine, mode, strided, dt, seed);
            else check_batch_norm<double>(4, sz, affine, mode, strided, dt, seed);
          }
          for (const int64_t *sz : {rows, two}) {
            if (dt == KILN_F32) check_batch_norm<float>(2, sz, affine, mode, strided, dt, seed);
            else check_batch_norm<double>(2, sz, affine, mode, strided, dt, seed);
          }
          /* channels of 8200 elements: three chunks (16 per thread of 256), or one with few blocks */
          for (int64_t max_blocks : {(int64_t)4224, (int64_t)2}) {
            const int64_t chunked[] = {5, 3, 40, 41};
            if (dt == KILN_F32) check_batch_norm<float>(4, chunked, affine, mode, strided, dt, seed, max_blocks);
            else check_batch_norm<double>(4, chunked, affine, mode, strided, dt, seed, max_blocks);
          }
          for (const int64_t *sz : {no_images, no_pixels}) {   /* empty batches: running stats untouched */
            if (dt == KILN_F32) check_batch_norm<float>(sz == no_images ? 2 : 4, sz, affine, mode, strided, dt, seed);
            else check_batch_norm<double>(sz == no_images ? 2 : 4, sz, affine, mode, strided, dt, seed);
          }
        }
}

/* ---- pooling: every output element forward, every input element's gathered grad backward,
   against the CPU's forward and autograd backward, bit for bit ---- */

/* ints: kh, kw, sh, sw, ph, pw, then max: dil_h, dil_w, ceil_mode; avg: ceil_mode,
   count_include_pad; adaptive: out_h, out_w. nan_pairs: NaN at many places, several per window. */
template <class T>
static void check_pool(int op, bool adaptive, int ndim, const int64_t *sizes, const int64_t *p, bool specials, bool nan_pairs,
                       int dtype, uint64_t seed) {
  using namespace kiln_pool;
  struct kiln_tensor *x = make_input(ndim, sizes, dtype, true, specials, seed);
  if (nan_pairs)
    for (int64_t i = 0; i < x->numel; i++)
      if (i % 5 == 0 || i % 7 == 0) data_of<T>(x)[i] = (T)NAN;
  kiln_requires_grad_(x, 1);
  bool max = op == KILN_OP_MAX_POOL2D;
  struct kiln_tensor *want = max ? kiln_max_pool2d(x, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], (int)p[8])
                             : adaptive ? kiln_adaptive_avg_pool2d(x, p[0], p[1])
                                        : kiln_avg_pool2d(x, p[0], p[1], p[2], p[3], p[4], p[5], (int)p[6], (int)p[7]);
  char what[256];
  snprintf(what, sizeof what, "%s %s %s, params %lld %lld %lld %lld %lld %lld %lld %lld %lld%s%s, seed %llu",
           adaptive ? "adaptive_avg_pool2d" : kiln_op_name(op), kiln_dtype_name(dtype), kiln_shape_string(x), (long long)p[0],
           (long long)p[1], (long long)p[2], (long long)p[3], (long long)p[4], (long long)p[5], (long long)p[6],
           (long long)p[7], (long long)p[8], specials ? ", specials" : "", nan_pairs ? ", NaN pairs" : "",
           (unsigned long long)seed);
  if (!want) {
    fprintf(stderr, "%s: refused: %s\n", what, kiln_error_message());
    report(false, __LINE__, what);
    kiln_error_clear();
    kiln_tensor_release(x);
    return;
  }
  struct kiln_tensor *gy = make_input(want->ndim, want->sizes, dtype, false, false, seed + 1);
  bool ok = kiln_backward(want, gy, 0) == KILN_OK;
  /* the call's ints, as nn.c makes them */
  int64_t ints[8];
  if (max) for (int k = 0; k < 8; k++) ints[k] = p[k];
  else if (adaptive) { for (int k = 0; k < 7; k++) ints[k] = 0; ints[7] = 1; }
  else { for (int k = 0; k < 6; k++) ints[k] = p[k]; ints[6] = p[7] != 0; ints[7] = 0; }
  int nd = ndim;
  struct geom g = geom_of(op, ints, sizes[nd - 2], sizes[nd - 1], want->sizes[nd - 2], want->sizes[nd - 1]);
  int64_t planes = x->numel / (g.H * g.W), ohw = g.OH * g.OW, hw = g.H * g.W;
  struct kiln_tensor *y = kiln_tensor_empty(want->ndim, want->sizes, dtype, CPU), *gx = kiln_tensor_empty(ndim, sizes, dtype, CPU);
  std::vector<int64_t> idx((size_t)(planes * ohw + 1));
  for (int64_t i = 0; i < planes * ohw; i++) {   /* the forward kernel */
    int64_t pl = i / ohw, o = i % ohw;
    const T *xp = data_of<T>(x) + pl * hw;
    if (max) max_pool_at<T>(xp, g, o / g.OW, o % g.OW, &data_of<T>(y)[i], &idx[(size_t)i]);
    else data_of<T>(y)[i] = avg_pool_at<T>(xp, g, o / g.OW, o % g.OW);
  }
  for (int64_t i = 0; i < planes * hw; i++) {    /* the backward kernel */
    int64_t pl = i / hw, q = i % hw;
    const T *gp = data_of<T>(gy) + pl * ohw;
    data_of<T>(gx)[i] = max ? max_pool_grad_at<T>(gp, idx.data() + pl * ohw, g, q / g.W, q % g.W)
                            : avg_pool_grad_at<T>(gp, g, q / g.W, q % g.W);
  }
  ok = ok && same_values(y, want, 0, what) && grads_match(gx, x, 0, what, "gx");
  report(ok, __LINE__, what);
  kiln_error_clear();
  struct kiln_tensor *all[] = {x, want, gy, y, gx};
  for (struct kiln_tensor *t : all) kiln_tensor_release(t);
}

static void test_pooling() {
  const int64_t even[] = {2, 3, 8, 10}, odd[] = {2, 3, 9, 11}, tall[] = {1, 4, 13, 10}, chw[] = {3, 7, 8}, tiny[] = {1, 2, 3, 4},
                one[] = {2, 2, 1, 1}, narrow[] = {2, 3, 5, 2};
  struct pcase { const int64_t *sizes; int ndim; int64_t p[9]; };
  const pcase maxes[] = {
    {even, 4, {2, 2, 2, 2, 0, 0, 1, 1, 0}},   /* the CPU's fast path */
    {odd, 4, {2, 2, 2, 2, 0, 0, 1, 1, 1}},    /* ceil_mode: the last window hangs over */
    {odd, 4, {3, 3, 2, 2, 1, 1, 1, 1, 0}},
    {odd, 4, {3, 3, 2, 2, 1, 1, 1, 1, 1}},
    {tall, 4, {3, 2, 2, 1, 1, 1, 2, 1, 1}},   /* dilation */
    {chw, 3, {5, 3, 3, 2, 2, 1, 1, 2, 1}},
    {tall, 4, {4, 4, 3, 3, 2, 2, 2, 2, 0}},
    {tiny, 4, {1, 1, 1, 1, 0, 0, 1, 1, 0}},
    {one, 4, {1, 1, 2, 2, 0, 0, 1, 1, 1}},
    {tiny, 4, {3, 4, 1, 1, 1, 2, 1, 1, 0}},   /* windows bigger than the plane, padded */
    {narrow, 4, {2, 2, 2, 1, 0, 1, 1, 3, 0}}, /* every window's taps fall in the padding: index 0 */
  };
  const pcase avgs[] = {
    {odd, 4, {3, 3, 2, 2, 1, 1, 0, 1, 0}}, {odd, 4, {3, 3, 2, 2, 1, 1, 0, 0, 0}},
    {odd, 4, {3, 3, 2, 2, 1, 1, 1, 1, 0}}, {odd, 4, {3, 3, 2, 2, 1, 1, 1, 0, 0}},
    {even, 4, {2, 2, 2, 2, 0, 0, 0, 1, 0}}, {tall, 4, {3, 2, 3, 1, 1, 1, 1, 0, 0}},
    {chw, 3, {4, 2, 3, 2, 2, 1, 1, 1, 0}}, {chw, 3, {4, 2, 3, 2, 2, 1, 1, 0, 0}},
    {one, 4, {1, 1, 1, 1, 0, 0, 0, 1, 0}},
  };
  const pcase adaptives[] = {
    {odd, 4, {3, 4}}, {odd, 4, {9, 11}}, {tiny, 4, {5, 7}}, {odd, 4, {1, 1}}, {chw, 3, {3, 5}}, {one, 4, {2, 3}},
  };
  for (int dt : {KILN_F32, KILN_F64}) {
    uint64_t seed = (uint64_t)dt * 1000;
    for (const pcase &c : maxes)
      for (int sp = 0; sp < 3; sp++) {
        if (dt == KILN_F32) check_pool<float>(KILN_OP_MAX_POOL2D, false, c.ndim, c.sizes, c.p, sp == 1, sp == 2, dt, ++seed);
        else check_pool<double>(KILN_OP_MAX_POOL2D, false, c.ndim, c.sizes, c.p, sp == 1, sp == 2, dt, ++seed);
      }
    for (const pcase &c : avgs) {
      if (dt == KILN_F32) check_pool<float>(KILN_OP_AVG_POOL2D, false, c.ndim, c.sizes, c.p, false, false, dt, ++seed);
      else check_pool<double>(KILN_OP_AVG_POOL2D, false, c.ndim, c.sizes, c.p, false, false, dt, ++seed);
    }
    for (const pcase &c : adaptives) {
      if (dt == KILN_F32) check_pool<float>(KILN_OP_AVG_POOL2D, true, c.ndim, c.sizes, c.p, false, false, dt, ++seed);
      else check_pool<double>(KILN_OP_AVG_POOL2D, true, c.ndim, c.sizes, c.p, false, false, dt, ++seed);
    }
  }
}

/* ---- recurrent layers: rnn.cu's sequence of products and kernels, the products as plain loops
   over the column-major calls cuBLAS gets (rnn.cuh's blas_call_of), the kernels' per-unit
   functions of rnn.cuh, against the CPU's layer and its backward through autograd ---- */

/* A CPU tensor of values in [-scale, scale). */
static struct kiln_tensor *rnn_input(int ndim, const int64_t *sizes, int dtype, double scale, uint64_t seed) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sizes[d];
  std::vector<double> v((size_t)(n > 0 ? n : 1));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < n; i++) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    v[(size_t)i] = ((double)(s >> 11) * 0x1p-53 * 2 - 1) * scale;
  }
  return kiln_tensor_from_f64(ndim, sizes, v.data(), dtype, CPU);
}

/* Row-major C[M,N] = op(A) op(B) + beta C through rnn.cuh's blas_call_of, as cuBLAS computes
   that column-major call: C'[i + j ldc] = sum_p op1(i, p) op2(p, j), the first operand B. A call
   cuBLAS would refuse for its leading dimensions fails the case. */
static bool blas_calls_ok = true;
template <class T>
static void host_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const T *A, int64_t lda, const T *B, int64_t ldb,
                      double beta, T *C, int64_t ldc) {
  struct kiln_rnn::blas_call c = kiln_rnn::blas_call_of(ta, tb, M, N, K, lda, ldb, ldc);
  if (!kiln_rnn::blas_call_valid(c)) blas_calls_ok = false;
  const T *first = B, *second = A;
  for (int64_t i = 0; i < c.m; i++)
    for (int64_t j = 0; j < c.n; j++) {
      double acc = 0;
      for (int64_t p = 0; p < c.k; p++) {
        T u = c.trans_first ? first[p + i * c.ld_first] : first[i + p * c.ld_first];
        T v = c.trans_second ? second[j + p * c.ld_second] : second[p + j * c.ld_second];
        acc += (double)u * (double)v;
      }
      T *o = C + i + j * c.ldc;
      *o = (T)(acc + (beta != 0 ? beta * (double)*o : 0.0));
    }
}

/* One layer: lens the B lengths (NULL: none), state 1 an initial h0, 2 an initial c0 (LSTM), need
   the leaves that require grad (bit k of x, h0, c0, w_ih, w_hh, b_ih, b_hh; at least one given). */
template <class T>
static void check_rnn(int mode, int64_t Tn, int64_t B, int64_t I, int64_t H, const int64_t *lens, bool reverse, int state,
                      bool bias, int need, int dtype, uint64_t seed) {
  using kiln_rnn::layer;
  int64_t G = kiln_rnn_gates(mode), GH = G * H, S = kiln_rnn_states(mode), RS = kiln_rnn_reserve(mode);
  int64_t sx[3] = {Tn, B, I}, sh[2] = {B, H}, sih[2] = {GH, I}, shh[2] = {GH, H}, sb[1] = {GH}, sz[3] = {Tn + S, B, H};
  struct kiln_tensor *x = rnn_input(3, sx, dtype, 1.0, seed);
  struct kiln_tensor *h0 = state & 1 ? rnn_input(2, sh, dtype, 0.5, seed + 1) : NULL;
  struct kiln_tensor *c0 = state & 2 && mode == KILN_RNN_LSTM ? rnn_input(2, sh, dtype, 0.5, seed + 2) : NULL;
  struct kiln_tensor *w_ih = rnn_input(2, sih, dtype, 0.4, seed + 3), *w_hh = rnn_input(2, shh, dtype, 0.4, seed + 4);
  struct kiln_tensor *b_ih = bias ? rnn_input(1, sb, dtype, 0.3, seed + 5) : NULL;
  struct kiln_tensor *b_hh = bias ? rnn_input(1, sb, dtype, 0.3, seed + 6) : NULL;
  struct kiln_tensor *gz = rnn_input(3, sz, dtype, 1.0, seed + 7);
  std::vector<int64_t> lv((size_t)B);
  for (int64_t b = 0; b < B; b++) lv[(size_t)b] = lens ? lens[b] : Tn;
  int64_t sl[1] = {B};
  struct kiln_tensor *len = NULL;
  if (lens) {
    len = kiln_tensor_empty(1, sl, KILN_I64, CPU);
    memcpy(kiln_tensor_data(len), lv.data(), sizeof(int64_t) * (size_t)B);
  }
  struct kiln_tensor *leaves[] = {x, h0, c0, w_ih, w_hh, b_ih, b_hh};
  struct kiln_tensor *graded[7];   /* the leaves whose grads are compared, NULL for the others */
  for (int k = 0; k < 7; k++) {
    graded[k] = leaves[k] && need & (1 << k) ? leaves[k] : NULL;
    if (graded[k]) kiln_requires_grad_(graded[k], 1);
  }
  struct kiln_tensor *want = kiln_rnn_layer(mode, x, h0, c0, w_ih, w_hh, b_ih, b_hh, len, reverse, KILN_RNN_GEMM);
  bool ok = want && kiln_backward(want, gz, 0) == KILN_OK;

  /* forward, as rnn.cu's forward<T> */
  blas_calls_ok = true;
  layer<T> L;
  memset(&L, 0, sizeof L);
  L.mode = mode; L.reverse = reverse; L.T_ = Tn; L.B = B; L.H = H; L.GH = GH; L.RS = RS;
  L.len = lens ? lv.data() : NULL;
  L.h0 = data_of<T>(h0); L.c0 = data_of<T>(c0); L.b_hh = data_of<T>(b_hh);
  /* rnn.cu's buffers from the caching allocator hold old values: NaN here, but where rnn.cu zeroes or fills them */
  const T stale = (T)NAN;
  std::vector<T> xp((size_t)(Tn * B * GH), stale), hh((size_t)(B * GH), stale), h((size_t)(B * H), stale);
  std::vector<T> hn((size_t)(B * H), stale), c((size_t)(B * H), stale), res((size_t)(Tn * B * RS * H + 1), stale);
  struct kiln_tensor *z = kiln_tensor_empty(3, sz, dtype, CPU);
  T *zv = data_of<T>(z);
  memset(zv, 0, sizeof(T) * (size_t)z->numel);
  for (int64_t i = 0; i < Tn * B * GH; i++) xp[(size_t)i] = bias ? data_of<T>(b_ih)[i % GH] : (T)0;   /* rnn_bias_rows_kernel */
  if (I > 0) host_gemm<T>(0, 1, Tn * B, GH, I, data_of<T>(x), I, data_of<T>(w_ih), I, 1.0, xp.data(), GH);
  for (int64_t i = 0; i < B * H; i++) {
    h[(size_t)i] = h0 ? data_of<T>(h0)[i] : (T)0;
    c[(size_t)i] = c0 ? data_of<T>(c0)[i] : (T)0;
  }
  L.xp = xp.data(); L.hh = hh.data(); L.z = zv; L.res = RS ? res.data() : NULL;
  L.h = h.data(); L.hnext = hn.data(); L.c = c.data();
  for (int64_t s = 0; s < Tn; s++) {
    host_gemm<T>(0, 1, B, GH, H, L.h, H, data_of<T>(w_hh), H, 0.0, hh.data(), GH);
    for (int64_t i = 0; i < B * H; i++) kiln_rnn::forward_at<T>(L, s, i / H, i % H);   /* rnn_step_kernel */
    T *swap = L.h; L.h = L.hnext; L.hnext = swap;
  }
  memcpy(zv + Tn * B * H, L.h, sizeof(T) * (size_t)(B * H));
  if (mode == KILN_RNN_LSTM) memcpy(zv + (Tn + 1) * B * H, L.c, sizeof(T) * (size_t)(B * H));

  /* backward, as rnn.cu's backward<T>, from the replay's own Z and reserve */
  bool gru = mode == KILN_RNN_GRU;
  std::vector<T> dgx((size_t)(Tn * B * GH), (T)0), dgh(gru ? dgx.size() : 0, (T)0), dgs((size_t)(B * GH), stale);
  std::vector<T> dh((size_t)(B * H), stale), dc((size_t)(B * H), (T)0), prod((size_t)(B * H), stale);
  std::vector<T> hprev((size_t)(Tn * B * H), stale);
  const T *gzv = data_of<T>(gz);
  L.gz = gzv; L.dgx = dgx.data(); L.dgh = gru ? dgh.data() : dgx.data(); L.dgs = dgs.data();
  L.dh = dh.data(); L.dc = dc.data(); L.prod = prod.data();
  for (int64_t i = 0; i < B * H; i++) {
    dh[(size_t)i] = gzv[Tn * B * H + i];
    if (mode == KILN_RNN_LSTM) dc[(size_t)i] = gzv[(Tn + 1) * B * H + i];
  }
  for (int64_t s = Tn - 1; s >= 0; s--) {
    for (int64_t i = 0; i < B * H; i++) kiln_rnn::backward_at<T>(L, s, i / H, i % H);   /* rnn_step_backward_kernel */
    host_gemm<T>(0, 0, B, H, GH, dgs.data(), GH, data_of<T>(w_hh), H, 0.0, prod.data(), H);
    for (int64_t i = 0; i < B * H; i++) kiln_rnn::carry_at<T>(L, s, i / H, i % H);     /* rnn_carry_kernel */
  }
  struct kiln_tensor *gx = kiln_tensor_empty(3, sx, dtype, CPU), *gh0 = kiln_tensor_empty(2, sh, dtype, CPU);
  struct kiln_tensor *gc0 = kiln_tensor_empty(2, sh, dtype, CPU), *gwi = kiln_tensor_empty(2, sih, dtype, CPU);
  struct kiln_tensor *gwh = kiln_tensor_empty(2, shh, dtype, CPU), *gbi = kiln_tensor_empty(1, sb, dtype, CPU);
  struct kiln_tensor *gbh = kiln_tensor_empty(1, sb, dtype, CPU);
  memcpy(data_of<T>(gh0), dh.data(), sizeof(T) * dh.size());
  memcpy(data_of<T>(gc0), dc.data(), sizeof(T) * dc.size());
  if (I > 0) {   /* as rnn.cu: no products without input features */
    host_gemm<T>(0, 0, Tn * B, I, GH, dgx.data(), GH, data_of<T>(w_ih), I, 0.0, data_of<T>(gx), I);
    host_gemm<T>(1, 0, GH, I, Tn * B, dgx.data(), GH, data_of<T>(x), I, 0.0, data_of<T>(gwi), I);
  }
  for (int64_t i = 0; i < Tn * B * H; i++)   /* rnn_hprev_kernel */
    hprev[(size_t)i] = kiln_rnn::hprev_at<T>(L, i / (B * H), (i % (B * H)) / H, i % H);
  host_gemm<T>(1, 0, GH, H, Tn * B, L.dgh, GH, hprev.data(), H, 0.0, data_of<T>(gwh), H);
  for (int64_t q = 0; q < GH; q++) {   /* rnn_column_sum_kernel */
    data_of<T>(gbi)[q] = kiln_rnn::column_sum<T>(dgx.data(), Tn * B, GH, q);
    data_of<T>(gbh)[q] = kiln_rnn::column_sum<T>(L.dgh, Tn * B, GH, q);
  }

  static const char *const names[] = {"rnn_tanh", "rnn_relu", "gru", "lstm"};
  char what[400], lstr[160] = "";
  for (int64_t b = 0; lens && b < B && strlen(lstr) < sizeof lstr - 24; b++)
    snprintf(lstr + strlen(lstr), sizeof lstr - strlen(lstr), "%s%lld", b ? " " : ", lengths ", (long long)lv[(size_t)b]);
  snprintf(what, sizeof what, "%s %s T %lld B %lld I %lld H %lld%s%s%s%s%s, grads of 0x%x, seed %llu", names[mode],
           kiln_dtype_name(dtype), (long long)Tn, (long long)B, (long long)I, (long long)H, lstr, reverse ? ", reverse" : "",
           h0 ? ", h0" : "", c0 ? ", c0" : "", bias ? ", biases" : "", need, (unsigned long long)seed);
  double tol = dtype == KILN_F32 ? 1e-4 : 1e-10;
  if (!blas_calls_ok) fprintf(stderr, "%s: a product has leading dimensions cuBLAS refuses\n", what);
  ok = ok && blas_calls_ok && same_values(z, want, tol, what) && grads_match(gx, graded[0], tol, what, "gx") &&
       grads_match(gh0, graded[1], tol, what, "gh0") && grads_match(gc0, graded[2], tol, what, "gc0") &&
       grads_match(gwi, graded[3], tol, what, "gw_ih") && grads_match(gwh, graded[4], tol, what, "gw_hh") &&
       grads_match(gbi, graded[5], tol, what, "gb_ih") && grads_match(gbh, graded[6], tol, what, "gb_hh");
  report(ok, __LINE__, what);
  if (!want) fprintf(stderr, "  %s\n", kiln_error_message());
  kiln_error_clear();
  struct kiln_tensor *all[] = {x, h0, c0, w_ih, w_hh, b_ih, b_hh, gz, len, want, z, gx, gh0, gc0, gwi, gwh, gbi, gbh};
  for (struct kiln_tensor *t : all) kiln_tensor_release(t);
}

static void test_rnn() {
  struct shape { int64_t T, B, I, H; };
  const shape shapes[] = {{5, 4, 3, 6}, {1, 1, 2, 3}, {7, 5, 0, 4}, {6, 3, 5, 33}};
  uint64_t seed = 100;
  for (int dt : {KILN_F32, KILN_F64})
    for (int mode = KILN_RNN_TANH; mode <= KILN_RNN_LSTM; mode++)
      for (const shape &sh : shapes)
        for (int v = 0; v < 4; v++) {
          bool lengths = v & 1, reverse = v & 2, state = (v + mode) % 2 == 0, bias = v != 1;
          if (sh.I == 0 && v != 3) continue;   /* no input features: once per mode */
          ++seed;
          std::vector<int64_t> lv((size_t)sh.B);   /* the first sequence the longest, the rest from the seed */
          for (int64_t b = 0; b < sh.B; b++) lv[(size_t)b] = b == 0 ? sh.T : 1 + (int64_t)((uint64_t)(b * 5) + seed) % sh.T;
          const int64_t *lens = lengths ? lv.data() : NULL;
          if (dt == KILN_F32) check_rnn<float>(mode, sh.T, sh.B, sh.I, sh.H, lens, reverse, state ? 3 : 0, bias, 127, dt, seed);
          else check_rnn<double>(mode, sh.T, sh.B, sh.I, sh.H, lens, reverse, state ? 3 : 0, bias, 127, dt, seed);
        }
}

/* ---- randomized sweeps: random geometries, parameters and dtypes through the check_* helpers
   above. Each family draws its cases from a fixed seed, so CI runs the same ones every time;
   KILN_TEST_SWEEP=N draws N times as many (the first ones unchanged). A failing case prints the
   helper's arguments with its seed: call the helper with them to replay it. ---- */


/* Case i of a family: its own generator (state: a hash of both), so that a case does not depend
   on the ones before it. */
static sweep_rng sweep_case(uint64_t family, int i) {
  sweep_rng h = {family << 32 | (uint64_t)(uint32_t)i};
  sweep_rng r = {h.next()};
  return r;
}

static void sweep_summary(const char *family, int cases, int failed_before, const char *extra) {
  printf("sweep %s: %d cases, %d failed%s\n", family, cases, failures - failed_before, extra);
}

/* nn.c's pool_size: the outputs along a dim, 0 where the op refuses. */
static int64_t pool_out(int64_t n, int64_t k, int64_t s, int64_t p, int64_t d, int ceil_mode) {
  int64_t span = n + 2 * p - d * (k - 1) - 1;
  int64_t o = span < 0 ? 0 : (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (o > 0 && ceil_mode && (o - 1) * s >= n + p) o--;
  return o < 1 ? 0 : o;
}

/* Max, average and adaptive average pooling: planes from 1x1 up, windows larger than the plane,
   padding up to half the window (nn.c's limit), dilation, ceil_mode, [C,H,W] and [N,C,H,W]. */
static void sweep_pooling(int n) {
  int before = failures, empty = 0, fast = 0, overhang = 0;
  for (int i = 0; i < n; i++) {
    sweep_rng r = sweep_case(1, i);
    int kind = (int)r.in(0, 4);   /* 0, 1: max; 2, 3: avg; 4: adaptive */
    bool max = kind < 2, adaptive = kind == 4;
    int ndim = r.one_in(3) ? 3 : 4;
    auto side = [&]() { return r.one_in(4) ? r.in(1, 3) : r.one_in(10) ? r.in(15, 40) : r.in(1, 14); };
    int64_t sizes[4], H = side(), W = side();
    if (ndim == 4) { sizes[0] = r.in(1, 3); sizes[1] = r.in(1, 3); }
    else sizes[0] = r.in(1, 4);
    sizes[ndim - 2] = H;
    sizes[ndim - 1] = W;
    int64_t p[9] = {0};
    if (adaptive) {
      p[0] = r.in(1, H + 3);
      p[1] = r.in(1, W + 3);
    } else {
      for (int tries = 0;; tries++) {
        int64_t kh = r.in(1, 6), kw = r.in(1, 6), sh = r.in(1, 4), sw = r.in(1, 4), dh = 1, dw = 1;
        int64_t ph = r.in(0, kh / 2), pw = r.in(0, kw / 2), ceil_mode = r.in(0, 1);
        if (max && !r.one_in(3)) { dh = r.in(1, 5); dw = r.in(1, 5); }   /* past a small plane: empty windows */
        if (max && r.one_in(10)) { kh = 2; ph = 1; dh = H + 1; }   /* each window's two taps in the padding, */
        if (max && r.one_in(10)) { kw = 2; pw = 1; dw = W + 1; }   /* one before the plane, one past it */
        if (r.one_in(6)) { kh = kw = sh = sw = 2; ph = pw = 0; dh = dw = 1; }   /* the CPU's fast path */
        if (tries > 100) { kh = kw = sh = sw = 1; ph = pw = 0; dh = dw = 1; }
        int64_t oh = pool_out(H, kh, sh, ph, dh, (int)ceil_mode), ow = pool_out(W, kw, sw, pw, dw, (int)ceil_mode);
        if (oh < 1 || ow < 1) continue;
        int64_t q[9] = {kh, kw, sh, sw, ph, pw, dh, dw, ceil_mode};
        if (!max) { q[6] = ceil_mode; q[7] = r.in(0, 1); q[8] = 0; }
        memcpy(p, q, sizeof p);
        if (max && (kiln_pool::has_empty_window(H, oh, kh, sh, ph, dh) || kiln_pool::has_empty_window(W, ow, kw, sw, pw, dw))) empty++;
        if (kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0 && dh == 1 && dw == 1) fast++;
        if (ceil_mode && (oh != pool_out(H, kh, sh, ph, dh, 0) || ow != pool_out(W, kw, sw, pw, dw, 0))) overhang++;
        break;
      }
    }
    bool specials = r.one_in(4), nan_pairs = !specials && r.one_in(6);
    int op = max ? KILN_OP_MAX_POOL2D : KILN_OP_AVG_POOL2D;
    uint64_t seed = (r.next() >> 40) + 1;
    if (r.one_in(2)) check_pool<float>(op, adaptive, ndim, sizes, p, specials, nan_pairs, KILN_F32, seed);
    else check_pool<double>(op, adaptive, ndim, sizes, p, specials, nan_pairs, KILN_F64, seed);
  }
  char extra[160];
  snprintf(extra, sizeof extra, " (max pooling with an empty window: %d; 2x2 stride 2: %d; ceil_mode overhanging: %d)", empty,
           fast, overhang);
  sweep_summary("pooling", n, before, extra);
}

/* Every reduction on 0-d to 4-d inputs, sizes 0 to 9 and now and then one long dim (several
   chunks per row when the plan has blocks to spare), random masks (one dim or all for argmax and
   argmin), norm orders and var/std corrections, float and integer dtypes, ties and specials. */
static void sweep_reductions(int n) {
  const int ops[] = {KILN_OP_SUM, KILN_OP_MEAN, KILN_OP_PROD, KILN_OP_MAX, KILN_OP_MIN, KILN_OP_ARGMAX, KILN_OP_ARGMIN,
                     KILN_OP_VAR, KILN_OP_STD, KILN_OP_NORM, KILN_OP_LOGSUMEXP};
  const int dtypes[] = {KILN_F32, KILN_F64, KILN_F32, KILN_F64, KILN_F16, KILN_BF16, KILN_I64, KILN_I32, KILN_U8, KILN_BOOL};
  const double orders[] = {0, 0.5, 1, 2, 3, INFINITY, -INFINITY};
  const int64_t blocks[] = {1, 5, 64, 1056, 1 << 20};
  int before = failures, chunked = 0, strided = 0;
  for (int i = 0; i < n; i++) {
    sweep_rng r = sweep_case(2, i);
    int op = ops[r.in(0, 10)], dt = dtypes[r.in(0, 9)], ndim = (int)r.in(0, 4);
    int64_t sizes[4], numel = 1;
    for (int d = 0; d < ndim; d++) sizes[d] = r.one_in(15) ? 0 : r.one_in(4) ? 1 : r.one_in(4) ? r.in(10, 80) : r.in(2, 9);
    if (ndim && r.one_in(5)) sizes[r.in(0, ndim - 1)] = r.in(300, 9000);   /* rows longer than a block */
    for (int d = 0; d < ndim; d++) numel *= sizes[d];
    for (int d = 0; d < ndim && numel > 40000; d++)
      if (sizes[d] < 300) { numel /= sizes[d]; sizes[d] = 1; }
    int64_t all = ((int64_t)1 << ndim) - 1, mask = ndim ? r.in(1, all) : 0;
    if ((op == KILN_OP_ARGMAX || op == KILN_OP_ARGMIN) && ndim) mask = r.one_in(4) ? all : (int64_t)1 << r.in(0, ndim - 1);
    while (op == KILN_OP_PROD) {   /* thousands of factors in [-3, 3] reach 1e308 part way, at a place that */
      int64_t R = 1;               /* depends on the order: inf on one side only. At most 1500 of them. */
      int big = 0;
      for (int d = 0; d < ndim; d++)
        if (mask & ((int64_t)1 << d)) { R *= sizes[d]; if (sizes[d] > sizes[big] || !(mask & ((int64_t)1 << big))) big = d; }
      if (R <= 1500) break;
      sizes[big] = (sizes[big] + 1) / 2;
    }
    double p = op == KILN_OP_NORM ? orders[r.in(0, 6)] : op == KILN_OP_VAR || op == KILN_OP_STD ? (double)r.in(0, 2) : 0;
    bool ties = r.one_in(2), specials = r.one_in(2);
    int64_t max_blocks = blocks[r.in(0, 4)];
    struct kiln_cuda_reduce_plan pl;
    kiln_cuda_reduce_plan(ndim, sizes, mask, max_blocks, &pl);
    chunked += pl.nchunks > 1;
    strided += pl.M > 0 && pl.R > pl.threads;
    check_reduce(op, ndim, sizes, dt, mask, p, ties, specials, max_blocks, false, (r.next() >> 40) + 1);
  }
  char extra[120];
  snprintf(extra, sizeof extra, " (rows longer than their block: %d; several chunks per row: %d)", strided, chunked);
  sweep_summary("reductions", n, before, extra);
}

/* Layer norm over the last 1 to ndim dims of 1-d to 4-d inputs, group norm on [N,C,...] with 1 to
   4 groups, batch norm in its three modes (running stats through a strided view in some):
   sizes from 1 (now and then 0), and now and then a dim of hundreds (more elements than the
   block's threads), affine on and off, f32 and f64. */
static void sweep_norms(int n) {
  int before = failures, wide = 0;
  for (int i = 0; i < n; i++) {
    sweep_rng r = sweep_case(3, i);
    int kind = (int)r.in(0, 2);   /* layer, group, batch */
    bool affine = r.one_in(2), f32 = r.one_in(2);
    int dt = f32 ? KILN_F32 : KILN_F64;
    int ndim = (int)(kind == 0 ? r.in(1, 4) : r.in(2, 4));
    int64_t sizes[4];
    for (int d = 0; d < ndim; d++) sizes[d] = r.one_in(40) ? 0 : r.one_in(4) ? 1 : r.in(2, 8);
    if (r.one_in(5)) sizes[r.in(kind == 0 ? 0 : 2 < ndim ? 2 : 1, ndim - 1)] = r.in(200, 1500);
    uint64_t seed = (r.next() >> 40) + 1;
    if (kind == 0) {
      int64_t k = r.in(1, ndim), L = 1;
      for (int d = ndim - (int)k; d < ndim; d++) L *= sizes[d];
      wide += L > 256;
      if (f32) check_row_norm<float>(KILN_OP_LAYER_NORM, ndim, sizes, k, affine, dt, seed);
      else check_row_norm<double>(KILN_OP_LAYER_NORM, ndim, sizes, k, affine, dt, seed);
    } else if (kind == 1) {
      int64_t groups = r.in(1, 4), L = 1;
      sizes[1] = groups * r.in(1, 3);
      for (int d = 1; d < ndim; d++) L *= sizes[d];
      wide += L / groups > 256;
      if (f32) check_row_norm<float>(KILN_OP_GROUP_NORM, ndim, sizes, groups, affine, dt, seed);
      else check_row_norm<double>(KILN_OP_GROUP_NORM, ndim, sizes, groups, affine, dt, seed);
    } else {
      int mode = (int)r.in(0, 2);   /* training with running stats, training without, evaluation */
      bool strided = mode != 1 && r.one_in(2);
      int64_t per = 1;
      if (sizes[1] == 0) sizes[1] = 1;
      for (int d = 0; d < ndim; d++) per *= d == 1 ? 1 : sizes[d];
      if (mode != 2 && per == 1) sizes[0] = 2;   /* training needs two values per channel */
      wide += per > 256;
      if (f32) check_batch_norm<float>(ndim, sizes, affine, mode, strided, dt, seed);
      else check_batch_norm<double>(ndim, sizes, affine, mode, strided, dt, seed);
    }
  }
  char extra[80];
  snprintf(extra, sizeof extra, " (more elements per row or channel than threads: %d)", wide);
  sweep_summary("norms", n, before, extra);
}

/* The recurrent layers: every mode, T 1 to 12, B 1 to 7, I from 0 (no input features) to 9, H from
   1 to 8 and now and then 30 to 40 (a step's B*H threads past a warp), lengths unsorted with
   some 1 and some T (or none), reverse, initial h0 and c0 each on or off, biases, some leaves
   without grad, f32 and f64. */
static void sweep_rnn(int n) {
  int before = failures, unsorted = 0, short_ones = 0, no_input = 0;
  for (int i = 0; i < n; i++) {
    sweep_rng r = sweep_case(4, i);
    int mode = (int)r.in(KILN_RNN_TANH, KILN_RNN_LSTM);
    int64_t Tn = r.one_in(6) ? 1 : r.in(2, r.one_in(4) ? 12 : 6), B = r.one_in(5) ? 1 : r.in(2, 7);
    int64_t I = r.one_in(6) ? 0 : r.in(1, 9), H = r.one_in(6) ? r.in(30, 40) : r.in(1, 8);
    std::vector<int64_t> lv((size_t)B);
    bool lengths = !r.one_in(3);
    for (int64_t b = 0; b < B; b++) lv[(size_t)b] = r.one_in(4) ? 1 : r.one_in(3) ? Tn : r.in(1, Tn);
    if (B > 1 && r.one_in(2)) lv[(size_t)r.in(0, B - 1)] = Tn;   /* one of them the longest */
    bool reverse = r.one_in(2), bias = !r.one_in(4);
    int state = (int)r.in(0, 3), need = 0;
    for (int k = 0; k < 7; k++) need |= r.one_in(6) ? 0 : 1 << k;
    if (!(need & (1 << 0 | 1 << 3 | 1 << 4))) need |= 1 << 4;   /* at least one leaf that is always there */
    bool f32 = r.one_in(2);
    uint64_t seed = (r.next() >> 40) + 1;
    bool rising = false, one = false;
    for (int64_t b = 0; b < B; b++) { rising |= b > 0 && lv[(size_t)b] > lv[(size_t)b - 1]; one |= lv[(size_t)b] == 1; }
    unsorted += lengths && rising;
    short_ones += lengths && one && Tn > 1;
    no_input += I == 0;
    const int64_t *lens = lengths ? lv.data() : NULL;
    if (f32) check_rnn<float>(mode, Tn, B, I, H, lens, reverse, state, bias, need, KILN_F32, seed);
    else check_rnn<double>(mode, Tn, B, I, H, lens, reverse, state, bias, need, KILN_F64, seed);
  }
  char extra[160];
  snprintf(extra, sizeof extra, " (lengths not in decreasing order: %d; a sequence of 1 step in a longer input: %d; no input "
           "features: %d)", unsorted, short_ones, no_input);
  sweep_summary("rnn", n, before, extra);
}

/* nll_loss and cross entropy: N from 0, C from 1 and now and then in the hundreds, 0 to 3 extra
   dims (now and then more positions than the block's 256 threads), class weights (some 0) or none,
   ignore_index -100, -1, C or a class (every target ignored in some), label smoothing in [0, 1]
   for cross entropy, every reduction, f32 and f64. */
static void sweep_losses(int n) {
  int before = failures, wide = 0, all_ignored = 0, empty = 0;
  for (int i = 0; i < n; i++) {
    sweep_rng r = sweep_case(5, i);
    bool fused = !r.one_in(3), weighted = r.one_in(2), f32 = r.one_in(2);
    int ndim = (int)r.in(2, 5), reduction = (int)r.in(KILN_REDUCTION_NONE, KILN_REDUCTION_SUM);
    int64_t sizes[5];
    sizes[0] = r.one_in(20) ? 0 : r.one_in(4) ? 1 : r.in(2, 9);
    sizes[1] = r.one_in(6) ? 1 : r.one_in(8) ? r.in(100, 300) : r.in(2, 12);
    for (int d = 2; d < ndim; d++) sizes[d] = r.one_in(25) ? 0 : r.one_in(3) ? 1 : r.in(2, 6);
    if (ndim > 2 && r.one_in(6)) sizes[r.in(2, ndim - 1)] = r.in(100, 400);
    int64_t numel = 1, P = 1;
    for (int d = 0; d < ndim; d++) { numel *= sizes[d]; P *= d == 1 ? 1 : sizes[d]; }
    while (numel > 60000) {   /* keep the case small: halve the largest dim */
      int big = 0;
      for (int d = 1; d < ndim; d++) big = sizes[d] > sizes[big] ? d : big;
      numel /= sizes[big]; P /= big == 1 ? 1 : sizes[big];
      sizes[big] = (sizes[big] + 1) / 2;
      numel *= sizes[big]; P *= big == 1 ? 1 : sizes[big];
    }
    int64_t C = sizes[1];
    const int64_t ignores[] = {-100, -1, C, r.in(0, C - 1)};
    int64_t ignore = ignores[r.in(0, 3)];
    int ignored = r.one_in(8) ? 1 : (int)r.in(2, 6);
    double eps = 0;
    if (fused && r.one_in(2)) eps = r.one_in(5) ? 1.0 : (double)r.in(1, 99) / 100;
    uint64_t seed = (r.next() >> 40) + 1;
    wide += P > 256;
    all_ignored += ignored == 1 && (ignore < 0 || ignore >= C) && P > 0;
    empty += numel == 0;
    if (f32) check_loss<float>(fused, ndim, sizes, weighted, ignore, ignored, eps, reduction, KILN_F32, seed);
    else check_loss<double>(fused, ndim, sizes, weighted, ignore, ignored, eps, reduction, KILN_F64, seed);
  }
  char extra[160];
  snprintf(extra, sizeof extra, " (more positions than the block's threads: %d; every target ignored: %d; empty input: %d)", wide,
           all_ignored, empty);
  sweep_summary("losses", n, before, extra);
}

/* Dropout: 0 to about 5000 elements in 1 to 4 dims (transposed views in some), p from 0 to 0.999,
   random 64-bit seeds and offsets (some near 2^64, where the block counter wraps), f32 and f64. */
static void sweep_dropout(int n) {
  int before = failures, wraps = 0;
  for (int i = 0; i < n; i++) {
    sweep_rng r = sweep_case(6, i);
    int ndim = (int)r.in(1, 4);
    int64_t sizes[4], numel = 1;
    for (int d = 0; d < ndim; d++) { sizes[d] = r.one_in(20) ? 0 : r.one_in(4) ? 1 : r.in(2, ndim == 1 ? 5000 : ndim == 2 ? 70 : 15); numel *= sizes[d]; }
    double p = r.one_in(10) ? 0.0 : r.one_in(10) ? 0.999 : r.one_in(3) ? (double)r.in(1, 7) / 8 : (double)(r.next() >> 11) * 0x1p-53;
    if (p >= 1) p = 0.5;
    uint64_t seed = r.next(), offset = r.one_in(5) ? ~(uint64_t)0 - (uint64_t)r.in(0, 2000) : r.one_in(3) ? r.next() : (uint64_t)r.in(0, 1 << 20);
    wraps += offset + (uint64_t)(numel + 3) / 4 < offset;
    bool strided = r.one_in(3), f32 = r.one_in(2);
    uint64_t xseed = (r.next() >> 40) + 1;
    if (f32) check_dropout_case<float>(ndim, sizes, strided, p, seed, offset, KILN_F32, xseed);
    else check_dropout_case<double>(ndim, sizes, strided, p, seed, offset, KILN_F64, xseed);
  }
  char extra[80];
  snprintf(extra, sizeof extra, " (Philox counter wrapping past 2^64: %d)", wraps);
  sweep_summary("dropout", n, before, extra);
}

int main() {
  test_reductions();
  test_row_norms();
  test_bn_cursor();
  test_batch_norm();
  test_pooling();
  test_rnn();
  int times = sweep_times();
  sweep_pooling(300 * times);
  sweep_reductions(400 * times);
  sweep_norms(400 * times);
  sweep_rnn(300 * times);
  sweep_losses(400 * times);
  sweep_dropout(300 * times);
  check_nll<float>(KILN_F32);
  check_nll<double>(KILN_F64);
  for (double p : {0.1, 0.5, 0.75}) {
    check_dropout<float>(KILN_F32, p);
    check_dropout<double>(KILN_F64, p);
  }
  printf("test_cuda_kernels: %d checks, %d failed\n", checks, failures);
  return failures != 0 || checks == 0;
}
