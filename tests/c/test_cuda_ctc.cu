/* test_cuda_ctc.cu: the CUDA CTC kernels' per-position code (ctc.cuh), played on the CPU (no GPU
   needed) in ctc.cu's order (a sample's steps one after another, the positions of a step in any
   order, then per class), against libkiln's CPU op on the same inputs: kiln_ctc_loss and its
   backward through autograd, for random small cases: several T, N, C and blanks, padded and
   concatenated targets, empty targets, repeated labels, input lengths of 0 and shorter than T,
   samples too short for their target (zero_infinity), classes of probability 0 (infinite losses),
   every reduction, f32 and f64. The labels are packed here as nn_calls.h describes them, apart
   from the front end's packing. The device build may differ only where the device's exp and log1p
   do (an ulp or two); tests/gpu checks that part.
   Besides those, a randomized sweep draws 400 cases from a fixed seed (the same on every run):
   T up to 80, N up to 7 (and 0), C from 1, targets up to the longest each input allows.
   KILN_TEST_SWEEP=N draws N times as many, for a longer run by hand (N = 1000: about 20 s). A
   failing sweep case prints its number, lengths and parameters. */
#include "sweep.h"
#include "ctc.cuh"
extern "C" {
#include "internal.h"
}
#include "check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

/* one check: what names it in a failure */
static void report(bool ok, int line, const char *what) { check_report(ok, __FILE__, line, "%s", what); }


struct rng {
  uint64_t s;
  uint64_t next() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }
  int64_t below(int64_t n) { return (int64_t)(next() % (uint64_t)n); }
  double uniform() { return (double)(next() >> 11) * 0x1p-53; }
};

static std::vector<double> values_of(const struct kiln_tensor *t) {
  std::vector<double> v((size_t)(t->numel > 0 ? t->numel : 1));
  if (kiln_tensor_to_f64(t, v.data())) v.assign(v.size(), NAN);
  v.resize((size_t)t->numel);
  return v;
}

/* got against want: NaN meets NaN, an infinity the same infinity, the rest within
   tol * max(1, |want|). Prints the first difference under what. */
static double largest_error[2];   /* f32, f64: the largest difference seen, for the summary */
static int infinite_losses, zeroed_samples;

static bool same_values(const std::vector<double> &g, const std::vector<double> &w, double tol, const char *what,
                        int f64) {
  if (g.size() != w.size()) {
    fprintf(stderr, "%s: %zu values, the CPU gives %zu\n", what, g.size(), w.size());
    return false;
  }
  for (size_t i = 0; i < g.size(); i++) {
    bool ok;
    if (w[i] != w[i]) ok = g[i] != g[i];
    else if (isinf(w[i])) ok = g[i] == w[i];
    else {
      double e = fabs(g[i] - w[i]) / fmax(1.0, fabs(w[i]));
      ok = e <= tol;
      if (e > largest_error[f64]) largest_error[f64] = e;
    }
    if (!ok) {
      fprintf(stderr, "%s: element %zu is %.17g, the CPU gives %.17g\n", what, i, g[i], w[i]);
      return false;
    }
  }
  return true;
}

struct ctc_case {
  int64_t T, N, C, blank;
  int reduction, zero_infinity, padded, dtype;
  int64_t pad = 1;          /* padded: columns past the longest target (filled with C + 7) */
  int lengths_dtype = KILN_I32;   /* of target_lengths (input_lengths: i64) */
  std::vector<int64_t> il, tl;
  std::vector<std::vector<int64_t>> targets;
  std::vector<double> lp;   /* [T,N,C] */
  std::vector<double> g;    /* the loss's grad: N values, or 1 */
};

/* A random case: log_softmax of normal-ish logits, some classes at -inf when impossible is set;
   targets with repeats; input lengths long enough for them unless zero_infinity lets them fall short. */
static ctc_case random_case(rng &r, int dtype, int reduction, int zero_infinity, int padded, bool impossible) {
  ctc_case k;
  k.T = 1 + r.below(12); k.N = 1 + r.below(5); k.C = 2 + r.below(6); k.blank = r.below(k.C);
  k.reduction = reduction; k.zero_infinity = zero_infinity; k.padded = padded; k.dtype = dtype;
  for (int64_t n = 0; n < k.N; n++) {
    int64_t L = r.below(1 + (k.T + 1) / 2 + (zero_infinity ? 3 : 0));
    std::vector<int64_t> l;
    for (int64_t i = 0; i < L; i++) {
      int64_t c;
      if (i > 0 && r.below(3) == 0) c = l[(size_t)i - 1];   /* a repeat */
      else do c = r.below(k.C); while (c == k.blank);
      l.push_back(c);
    }
    int64_t repeats = 0;
    for (int64_t i = 1; i < L; i++) repeats += l[(size_t)i] == l[(size_t)i - 1];
    int64_t need = L + repeats, Tn;
    if (zero_infinity) Tn = r.below(k.T + 1);
    else if (need > k.T) { l.clear(); L = 0; Tn = r.below(k.T + 1); }
    else Tn = need + r.below(k.T - need + 1);
    k.targets.push_back(l); k.tl.push_back(L); k.il.push_back(Tn);
  }
  if (r.below(4) == 0) k.il[(size_t)r.below(k.N)] = 0;   /* no input: loss 0 for an empty target, else inf */
  if (!zero_infinity)
    for (int64_t n = 0; n < k.N; n++)
      if (k.il[(size_t)n] == 0) { k.targets[(size_t)n].clear(); k.tl[(size_t)n] = 0; }
  k.lp.resize((size_t)(k.T * k.N * k.C));
  for (int64_t row = 0; row < k.T * k.N; row++) {
    double *x = k.lp.data() + row * k.C, m = -INFINITY, s = 0;
    for (int64_t c = 0; c < k.C; c++) { x[c] = (r.uniform() - 0.5) * 6; m = fmax(m, x[c]); }
    for (int64_t c = 0; c < k.C; c++) s += exp(x[c] - m);
    for (int64_t c = 0; c < k.C; c++) x[c] -= m + log(s);
  }
  if (impossible) {   /* a class of probability 0 at one step of every sample: some paths, or all, are cut */
    int64_t c = r.below(k.C);
    for (int64_t n = 0; n < k.N; n++) k.lp[(size_t)((r.below(k.T) * k.N + n) * k.C + c)] = -INFINITY;
  }
  k.g.resize(reduction == KILN_REDUCTION_NONE ? (size_t)k.N : 1);
  for (double &v : k.g) v = 0.25 + r.uniform();
  return k;
}

/* The CPU op: loss and the gradient of log_probs for the incoming grad k.g; false with a message. */
static bool cpu_run(const ctc_case &k, std::vector<double> &loss, std::vector<double> &grad) {
  int64_t sx[3] = {k.T, k.N, k.C}, N = k.N;
  std::vector<double> flat, padded;
  int64_t S = 0;
  for (int64_t L : k.tl) S = L > S ? L : S;
  for (int64_t n = 0; n < N; n++) {
    const std::vector<int64_t> &l = k.targets[(size_t)n];
    for (size_t i = 0; i < l.size(); i++) flat.push_back((double)l[i]);
    for (int64_t i = 0; i < S + k.pad; i++)   /* k.pad columns more than needed, filled past the lengths */
      padded.push_back(i < (int64_t)l.size() ? (double)l[(size_t)i] : (double)(k.C + 7));
  }
  if (padded.empty()) padded.push_back(0);
  std::vector<double> il(k.il.begin(), k.il.end()), tl(k.tl.begin(), k.tl.end());
  int64_t sp[2] = {N, S + k.pad}, sf[1] = {(int64_t)flat.size()};
  struct kiln_tensor *x = kiln_tensor_from_f64(3, sx, k.lp.data(), k.dtype, CPU);
  struct kiln_tensor *tg = k.padded ? kiln_tensor_from_f64(2, sp, padded.data(), KILN_I64, CPU)
                                    : kiln_tensor_from_f64(1, sf, flat.empty() ? padded.data() : flat.data(), KILN_I64, CPU);
  struct kiln_tensor *ilt = kiln_tensor_from_f64(1, &N, il.data(), KILN_I64, CPU);
  struct kiln_tensor *tlt = kiln_tensor_from_f64(1, &N, tl.data(), k.lengths_dtype, CPU);
  struct kiln_tensor *gt = kiln_tensor_from_f64(k.reduction == KILN_REDUCTION_NONE ? 1 : 0, &N, k.g.data(), k.dtype, CPU);
  struct kiln_tensor *l = NULL;
  bool ok = x && tg && ilt && tlt && gt && kiln_requires_grad_(x, 1) == 0;
  if (ok) ok = (l = kiln_ctc_loss(x, tg, ilt, tlt, k.blank, k.reduction, k.zero_infinity)) != NULL;
  if (ok) ok = kiln_backward(l, gt, 0) == 0 && x->grad;
  if (ok) { loss = values_of(l); grad = values_of(x->grad); }
  else fprintf(stderr, "the CPU op failed: %s\n", kiln_error_message());
  kiln_error_clear();
  struct kiln_tensor *all[] = {x, tg, ilt, tlt, gt, l};
  for (struct kiln_tensor *t : all) kiln_tensor_release(t);
  return ok;
}

/* ctc.cu's kernels played on the CPU: the same per-position functions, positions of a step in
   descending order when `backwards` (a kernel's threads run them in any order). */
template <class T>
static void replay(const ctc_case &k, bool backwards, std::vector<double> &loss, std::vector<double> &grad) {
  int64_t S = 0;
  for (int64_t L : k.tl) S = L > S ? L : S;
  int64_t W = 2 * S + 1;
  std::vector<int64_t> labels((size_t)(k.N * (2 + S)), 0);
  for (int64_t n = 0; n < k.N; n++) {
    int64_t *row = labels.data() + n * (2 + S);
    row[0] = k.il[(size_t)n]; row[1] = k.tl[(size_t)n];
    for (int64_t i = 0; i < row[1]; i++) row[2 + i] = k.targets[(size_t)n][(size_t)i];
  }
  std::vector<T> lp(k.lp.size()), nll((size_t)k.N), alpha((size_t)(k.N * k.T * W + 1), (T)NAN), g(k.g.size());
  std::vector<T> out(k.reduction == KILN_REDUCTION_NONE ? (size_t)k.N : 1), gx(k.lp.size(), (T)NAN);
  std::vector<double> beta((size_t)(k.N * 2 * W + 1), NAN);
  for (size_t i = 0; i < lp.size(); i++) lp[i] = (T)k.lp[i];
  for (size_t i = 0; i < g.size(); i++) g[i] = (T)k.g[i];
  kiln_ctc::problem<T> p = {};
  p.T_ = k.T; p.N = k.N; p.C = k.C; p.S = S; p.W = W; p.blank = k.blank;
  p.reduction = k.reduction; p.zero_infinity = k.zero_infinity;
  p.lp = lp.data(); p.labels = labels.data(); p.nll = nll.data(); p.alpha = alpha.data();
  p.g = g.data(); p.grad = gx.data(); p.beta = beta.data();
  /* ctc_forward_kernel, then ctc_reduce_kernel */
  for (int64_t n = 0; n < k.N; n++) {
    int64_t Tn = kiln_ctc::input_length(p, n), E = 2 * kiln_ctc::target_length(p, n) + 1;
    for (int64_t t = 0; t < Tn; t++)
      for (int64_t i = 0; i < E; i++) kiln_ctc::alpha_at<T>(p, n, t, backwards ? E - 1 - i : i);
    nll[(size_t)n] = (T)kiln_ctc::nll_of<T>(p, n);
    if (k.reduction == KILN_REDUCTION_NONE) out[(size_t)n] = (T)kiln_ctc::loss_of<T>(p, n);
  }
  if (k.reduction != KILN_REDUCTION_NONE) out[0] = (T)kiln_ctc::reduced_loss<T>(p);
  /* ctc_backward_kernel */
  for (int64_t n = 0; n < k.N; n++) {
    int64_t Tn = kiln_ctc::input_length(p, n), E = 2 * kiln_ctc::target_length(p, n) + 1;
    bool zero = kiln_ctc::grad_is_zero<T>(p, n);
    int64_t from = zero ? 0 : Tn;
    for (int64_t i = 0; i < (k.T - from) * k.C; i++) gx[(size_t)(((from + i / k.C) * k.N + n) * k.C + i % k.C)] = (T)0;
    if (zero) continue;
    for (int64_t t = Tn - 1; t >= 0; t--) {
      for (int64_t i = 0; i < E; i++) kiln_ctc::beta_at<T>(p, n, t, backwards ? E - 1 - i : i);
      for (int64_t c = 0; c < k.C; c++) kiln_ctc::grad_at<T>(p, n, t, backwards ? k.C - 1 - c : c);
    }
  }
  loss.assign(out.begin(), out.end());
  grad.assign(gx.begin(), gx.end());
}

static void check_case(const ctc_case &k, bool backwards, const char *kind) {
  std::string lens = "input lengths";
  for (int64_t v : k.il) lens += " " + std::to_string(v);
  lens += ", target lengths";
  for (int64_t v : k.tl) lens += " " + std::to_string(v);
  char what[512];
  snprintf(what, sizeof what, "%s %s T %lld N %lld C %lld blank %lld, %s targets, reduction %d%s, %.300s%s", kind,
           k.dtype == KILN_F32 ? "f32" : "f64", (long long)k.T, (long long)k.N, (long long)k.C, (long long)k.blank,
           k.padded ? "padded" : "concatenated", k.reduction, k.zero_infinity ? ", zero_infinity" : "", lens.c_str(),
           backwards ? ", positions in descending order" : "");
  std::vector<double> cl, cg, rl, rg;
  if (!cpu_run(k, cl, cg)) { report(false, __LINE__, what); return; }
  if (k.dtype == KILN_F32) replay<float>(k, backwards, rl, rg);
  else replay<double>(k, backwards, rl, rg);
  /* the same double arithmetic in the same order on the same host: equal but for the compilers' choices */
  double tol = k.dtype == KILN_F32 ? 1e-6 : 1e-13;
  std::string lw = std::string(what) + ": loss", gw = std::string(what) + ": grad of log_probs";
  int f64 = k.dtype == KILN_F64;
  report(same_values(rl, cl, tol, lw.c_str(), f64), __LINE__, lw.c_str());
  report(same_values(rg, cg, tol, gw.c_str(), f64), __LINE__, gw.c_str());
  for (double v : cl) infinite_losses += isinf(v);
  for (int64_t n = 0; n < k.N; n++) {
    int64_t L = k.tl[(size_t)n], repeats = 0;
    for (int64_t i = 1; i < L; i++) repeats += k.targets[(size_t)n][(size_t)i] == k.targets[(size_t)n][(size_t)i - 1];
    zeroed_samples += k.zero_infinity && k.il[(size_t)n] < L + repeats;
  }
}

/* Hand-made cases at the edges: T = 1, a single class besides the blank, all repeats, every sample
   without input, a blank that is the last class. */
static void test_edges() {
  for (int dtype : {KILN_F32, KILN_F64})
    for (int red = KILN_REDUCTION_NONE; red <= KILN_REDUCTION_SUM; red++) {
      rng r = {0x5eedull + (uint64_t)red};
      ctc_case k = random_case(r, dtype, red, 0, 1, false);
      k.T = 1; k.N = 2; k.C = 2; k.blank = 1;
      k.il = {1, 1}; k.tl = {1, 0}; k.targets = {{0}, {}};
      k.lp = {log(0.3), log(0.7), log(0.9), log(0.1)};
      k.g.assign(red == KILN_REDUCTION_NONE ? 2 : 1, 1.5);
      check_case(k, false, "T = 1");
      k.T = 7; k.N = 1; k.C = 2; k.blank = 0; k.il = {7}; k.tl = {3}; k.targets = {{1, 1, 1}};
      k.lp.resize(14);
      for (int i = 0; i < 14; i++) k.lp[(size_t)i] = log(i % 2 ? 0.6 : 0.4);
      k.g.assign(1, 0.5);
      check_case(k, true, "all repeats");
      k.N = 3; k.il = {0, 0, 0}; k.tl = {0, 0, 0}; k.targets = {{}, {}, {}};
      k.lp.resize(42, log(0.5));
      k.g.assign(red == KILN_REDUCTION_NONE ? 3 : 1, 2.0);
      check_case(k, false, "no input");
    }
}

/* ---- randomized sweep: cases drawn from a fixed seed (the same on every run); KILN_TEST_SWEEP=N
   draws N times as many (the first ones unchanged). A failing case prints its sweep case number,
   which names everything: sweep_ctc_case(i) rebuilds it. ---- */


static int64_t steps_needed(const std::vector<int64_t> &l) {
  int64_t need = (int64_t)l.size();
  for (size_t i = 1; i < l.size(); i++) need += l[i] == l[i - 1];
  return need;
}

/* Case i of the sweep: T from 0 (now and then up to 80), N from 0 to 7, C from 1 (the blank
   alone) to 8 and now and then 40, the blank first, last or between; per sample an input length
   of 0, T or between, and a target of length 0, the longest the input allows (its length plus
   repeated neighbours = the input length), or between (past it under zero_infinity), with
   repeats; padded (with 1 to 4 spare columns) or concatenated targets, i32 or i64 target
   lengths, every reduction, f32 and f64, logits of spread 6 or 40, classes of probability 0. */
static ctc_case sweep_ctc_case(int i, bool *backwards, int *longest) {
  sweep_rng h = {(uint64_t)7 << 32 | (uint64_t)(uint32_t)i};
  sweep_rng r = {h.next()};
  ctc_case k;
  k.T = r.one_in(40) ? 0 : r.one_in(8) ? 1 : r.in(2, r.one_in(5) ? 80 : 16);
  k.N = r.one_in(40) ? 0 : r.one_in(6) ? 1 : r.in(2, 7);
  k.C = r.one_in(10) ? 1 : r.in(2, r.one_in(6) ? 40 : 8);
  k.blank = r.one_in(3) ? 0 : r.one_in(2) ? k.C - 1 : r.in(0, k.C - 1);
  k.reduction = (int)r.in(KILN_REDUCTION_NONE, KILN_REDUCTION_SUM);
  k.zero_infinity = r.one_in(2);
  k.padded = r.one_in(2);
  k.pad = r.in(1, 4);
  k.lengths_dtype = r.one_in(2) ? KILN_I32 : KILN_I64;
  k.dtype = r.one_in(2) ? KILN_F32 : KILN_F64;
  *backwards = r.one_in(2);
  auto label = [&](const std::vector<int64_t> &l, bool repeat) {
    if (repeat && !l.empty()) return l.back();
    int64_t c;
    do c = r.in(0, k.C - 1); while (c == k.blank);
    return c;
  };
  for (int64_t n = 0; n < k.N; n++) {
    int64_t Tn = r.one_in(6) ? 0 : r.one_in(3) ? k.T : r.in(0, k.T);
    std::vector<int64_t> l;
    int kind = k.C == 1 ? 0 : r.one_in(5) ? 0 : r.one_in(3) ? 1 : 2;   /* empty, the longest, between */
    if (kind == 1) {   /* add labels while they fit: a repeat needs two steps */
      for (;;) {
        int64_t need = steps_needed(l);
        if (need >= Tn) break;
        bool repeat = r.one_in(3) && need + 2 <= Tn;
        int64_t c = label(l, repeat);
        if (!l.empty() && c == l.back() && need + 2 > Tn) break;   /* only the blank's neighbour left: C = 2 */
        l.push_back(c);
      }
      *longest += Tn > 0 && steps_needed(l) == Tn;
    } else if (kind == 2) {
      int64_t L = r.in(0, Tn + (k.zero_infinity ? 3 : 0));
      for (int64_t j = 0; j < L; j++) l.push_back(label(l, r.one_in(3)));
      while (!k.zero_infinity && steps_needed(l) > Tn) l.pop_back();
    }
    k.targets.push_back(l);
    k.tl.push_back((int64_t)l.size());
    k.il.push_back(Tn);
  }
  double spread = r.one_in(4) ? 40 : 6;
  k.lp.resize((size_t)(k.T * k.N * k.C));
  for (int64_t row = 0; row < k.T * k.N; row++) {
    double *x = k.lp.data() + row * k.C, m = -INFINITY, sum = 0;
    for (int64_t c = 0; c < k.C; c++) { x[c] = (r.uniform() - 0.5) * spread; m = fmax(m, x[c]); }
    for (int64_t c = 0; c < k.C; c++) sum += exp(x[c] - m);
    for (int64_t c = 0; c < k.C; c++) x[c] -= m + log(sum);
  }
  if (k.T > 0 && k.N > 0 && r.one_in(6)) {   /* a class of probability 0 at a few places */
    int64_t c = r.in(0, k.C - 1), times = r.in(1, 3);
    for (int64_t j = 0; j < times; j++) k.lp[(size_t)((r.in(0, k.T - 1) * k.N + r.in(0, k.N - 1)) * k.C + c)] = -INFINITY;
  }
  k.g.resize(k.reduction == KILN_REDUCTION_NONE ? (size_t)k.N : 1);
  for (double &v : k.g) v = 0.25 + r.uniform();
  return k;
}

static void sweep_ctc(int n) {
  int before = check_failed, longest = 0, long_inputs = 0, repeats = 0;
  for (int i = 0; i < n; i++) {
    bool backwards;
    ctc_case k = sweep_ctc_case(i, &backwards, &longest);
    long_inputs += k.T > 16;
    for (const std::vector<int64_t> &l : k.targets) repeats += steps_needed(l) > (int64_t)l.size();
    char kind[48];
    snprintf(kind, sizeof kind, "sweep case %d:", i);
    check_case(k, backwards, kind);
  }
  printf("sweep ctc: %d cases, %d failed (targets as long as the input allows: %d; repeated labels in %d targets; T > 16: %d)\n", n,
         check_failed - before, longest, repeats, long_inputs);
}

int main() {
  report(kiln_ctc::threads_for(1, 1) == 32, __LINE__, "threads_for: a warp at least");
  report(kiln_ctc::threads_for(33, 2) == 64 && kiln_ctc::threads_for(5, 100) == 128, __LINE__, "threads_for: the wider");
  report(kiln_ctc::threads_for(4001, 7) == 256, __LINE__, "threads_for: 256 at most");
  test_edges();
  rng r = {20261201};
  int seeds = 0;
  for (int dtype : {KILN_F32, KILN_F64})
    for (int red = KILN_REDUCTION_NONE; red <= KILN_REDUCTION_SUM; red++)
      for (int zi = 0; zi < 2; zi++)
        for (int padded = 0; padded < 2; padded++)
          for (int rep = 0; rep < 6; rep++, seeds++)
            check_case(random_case(r, dtype, red, zi, padded, rep == 5), rep % 2 == 1, "random");
  sweep_ctc(400 * sweep_times());
  printf("test_cuda_ctc: %d checks (%d random cases; %d infinite losses, %d samples too short under zero_infinity), "
         "largest difference f32 %.3g, f64 %.3g; %d failed\n", check_count, seeds, infinite_losses, zeroed_samples,
         largest_error[0], largest_error[1], check_failed);
  return check_failed != 0 || check_count == 0;
}
