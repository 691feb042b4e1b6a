/* test_ctc.c: the C API of the CTC loss: values against a brute-force sum over every alignment,
   the gradient against central differences (f64), a larger batch run under the sanitizers with
   the per-step gradient sums (-1 each), and the checks of the front end. Classes count from 0. */
#include "check.h"

enum { T_ = 4, N_ = 2, C_ = 3, S_ = 2 };

static const int64_t il_v[N_] = {4, 3}, tl_v[N_] = {2, 1};
static const int64_t tg_v[N_ * S_] = {1, 2, 2, 0};   /* padded; the 0 past sample 1's length is ignored */

/* -log p(target | lp) for sample n by enumerating the C^Tn paths (blank 0). */
static double brute_nll(const double *lp, int n) {
  int Tn = (int)il_v[n], L = (int)tl_v[n];
  const int64_t *target = tg_v + n * S_;
  int total = 1;
  for (int t = 0; t < Tn; t++) total *= C_;
  double p = 0;
  for (int code = 0; code < total; code++) {
    int path[T_], k = code, out[T_], m = 0, prev = -1;
    double logp = 0;
    for (int t = 0; t < Tn; t++) { path[t] = k % C_; k /= C_; logp += lp[(t * N_ + n) * C_ + path[t]]; }
    for (int t = 0; t < Tn; t++) {
      if (path[t] != prev && path[t] != 0) out[m++] = path[t];
      prev = path[t];
    }
    int same = m == L;
    for (int i = 0; same && i < L; i++) same = out[i] == target[i];
    if (same) p += exp(logp);
  }
  return -log(p);
}

static void random_lp(double *lp, int64_t n, int64_t C, uint32_t seed) {
  for (int64_t r = 0; r < n / C; r++) {
    double s = 0;
    for (int64_t c = 0; c < C; c++) {
      seed = seed * 1664525u + 1013904223u;
      lp[r * C + c] = 3.0 * (seed >> 8) / (double)(1u << 24);
      s += exp(lp[r * C + c]);
    }
    for (int64_t c = 0; c < C; c++) lp[r * C + c] -= log(s);
  }
}

static struct kiln_tensor *i64(int ndim, const int64_t *sizes, const int64_t *v) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sizes[d];
  double *buf = malloc(sizeof(double) * (size_t)(n + 1));
  if (!buf) abort();
  for (int64_t i = 0; i < n; i++) buf[i] = (double)v[i];
  struct kiln_tensor *t = T(ndim, sizes, buf, KILN_I64);
  free(buf);
  return t;
}

static double loss_of(const double *lp, int reduction) {
  struct kiln_tensor *x = T(3, (int64_t[]){T_, N_, C_}, lp, KILN_F64);
  struct kiln_tensor *tg = i64(2, (int64_t[]){N_, S_}, tg_v), *il = i64(1, (int64_t[]){N_}, il_v), *tl = i64(1, (int64_t[]){N_}, tl_v);
  struct kiln_tensor *l = kiln_ctc_loss(x, tg, il, tl, 0, reduction, 0);
  double v = NAN;
  if (l) kiln_tensor_item(l, &v);
  kiln_tensor_release(l); kiln_tensor_release(x); kiln_tensor_release(tg); kiln_tensor_release(il); kiln_tensor_release(tl);
  return v;
}

static void test_values_and_gradient(void) {
  double lp[T_ * N_ * C_];
  random_lp(lp, T_ * N_ * C_, C_, 7);
  double nll0 = brute_nll(lp, 0), nll1 = brute_nll(lp, 1);
  CHECK_NEAR(loss_of(lp, KILN_REDUCTION_SUM), nll0 + nll1, 1e-12);
  CHECK_NEAR(loss_of(lp, KILN_REDUCTION_MEAN), (nll0 / 2 + nll1 / 1) / 2, 1e-12);
  for (int dt = 0; dt < 2; dt++) {
    int dtype = dt ? KILN_F64 : KILN_F32;
    struct kiln_tensor *x = T(3, (int64_t[]){T_, N_, C_}, lp, dtype);
    struct kiln_tensor *tg = i64(2, (int64_t[]){N_, S_}, tg_v), *il = i64(1, (int64_t[]){N_}, il_v), *tl = i64(1, (int64_t[]){N_}, tl_v);
    CHECK(kiln_requires_grad_(x, 1) == 0);
    struct kiln_tensor *l = kiln_ctc_loss(x, tg, il, tl, 0, KILN_REDUCTION_NONE, 0);
    CHECK(l && l->ndim == 1 && l->sizes[0] == N_);
    double *v = V(l);
    CHECK_NEAR(v[0], nll0, dt ? 1e-12 : 1e-5);
    CHECK_NEAR(v[1], nll1, dt ? 1e-12 : 1e-5);
    free(v);
    /* backward of sum(loss * [1, 2]) against central differences of the f64 loss */
    struct kiln_tensor *w = T(1, (int64_t[]){N_}, (double[]){1, 2}, dtype);
    CHECK(kiln_backward(l, w, 0) == 0);
    double *g = V(x->grad);
    double want[T_ * N_ * C_];
    for (int i = 0; i < T_ * N_ * C_; i++) {
      double a[T_ * N_ * C_], b[T_ * N_ * C_];
      memcpy(a, lp, sizeof a); memcpy(b, lp, sizeof b);
      a[i] += 1e-6; b[i] -= 1e-6;
      want[i] = (brute_nll(a, 0) - brute_nll(b, 0) + 2 * (brute_nll(a, 1) - brute_nll(b, 1))) / 2e-6;
    }
    CHECK_ARRAY_NEAR(g, want, T_ * N_ * C_, dt ? 1e-7 : 1e-4);
    CHECK(g[(3 * N_ + 1) * C_] == 0 && g[(3 * N_ + 1) * C_ + 1] == 0 && g[(3 * N_ + 1) * C_ + 2] == 0);  /* t = 3 >= il[1] */
    free(g);
    kiln_tensor_release(w); kiln_tensor_release(l); kiln_tensor_release(x);
    kiln_tensor_release(tg); kiln_tensor_release(il); kiln_tensor_release(tl);
  }
}

/* A batch of 9 samples, T = 40, 7 classes, concatenated targets, blank 3: the per-step gradient of
   free log_probs sums to -1 where t < input length (every alignment passes one class), else 0. */
static void test_batch(void) {
  enum { TB = 40, NB = 9, CB = 7 };
  static double lp[TB * NB * CB];
  random_lp(lp, TB * NB * CB, CB, 3);
  int64_t il[NB], tl[NB], tg[NB * 12], total = 0;
  for (int n = 0; n < NB; n++) {
    il[n] = TB - 3 * n;
    tl[n] = n % 4 == 3 ? 0 : 1 + (n * 5) % 12;
    for (int i = 0; i < tl[n]; i++) { int64_t c = (n + 2 * i) % CB; tg[total++] = c == 3 ? 4 : c; }
  }
  for (int dt = 0; dt < 2; dt++) {
    struct kiln_tensor *x = T(3, (int64_t[]){TB, NB, CB}, lp, dt ? KILN_F64 : KILN_F32);
    struct kiln_tensor *t = i64(1, (int64_t[]){total}, tg), *a = i64(1, (int64_t[]){NB}, il), *b = i64(1, (int64_t[]){NB}, tl);
    CHECK(kiln_requires_grad_(x, 1) == 0);
    struct kiln_tensor *l = kiln_ctc_loss(x, t, a, b, 3, KILN_REDUCTION_SUM, 0);
    double v = NAN;
    CHECK(l && kiln_tensor_item(l, &v) == 0 && isfinite(v) && v > 0);
    CHECK(l && kiln_backward(l, NULL, 0) == 0);
    double *g = V(x->grad);
    int bad = 0;
    for (int s = 0; s < TB; s++)
      for (int n = 0; n < NB; n++) {
        double sum = 0;
        for (int c = 0; c < CB; c++) sum += g[(s * NB + n) * CB + c];
        bad += fabs(sum - (s < il[n] ? -1 : 0)) > (dt ? 1e-9 : 1e-3);
      }
    CHECK(bad == 0);
    free(g);
    kiln_tensor_release(l); kiln_tensor_release(x); kiln_tensor_release(t); kiln_tensor_release(a); kiln_tensor_release(b);
  }
}

static void test_errors(void) {
  double lp[T_ * N_ * C_];
  random_lp(lp, T_ * N_ * C_, C_, 5);
  struct kiln_tensor *x = T(3, (int64_t[]){T_, N_, C_}, lp, KILN_F64), *x2 = T(2, (int64_t[]){T_ * N_, C_}, lp, KILN_F64);
  struct kiln_tensor *tg = i64(2, (int64_t[]){N_, S_}, tg_v), *il = i64(1, (int64_t[]){N_}, il_v), *tl = i64(1, (int64_t[]){N_}, tl_v);
  struct kiln_tensor *il_long = i64(1, (int64_t[]){N_}, (int64_t[]){5, 3}), *tl_rep = i64(1, (int64_t[]){N_}, (int64_t[]){2, 2});
  struct kiln_tensor *tg_rep = i64(2, (int64_t[]){N_, S_}, (int64_t[]){1, 1, 2, 2}), *il_short = i64(1, (int64_t[]){N_}, (int64_t[]){2, 3});
  struct kiln_tensor *tg_blank = i64(2, (int64_t[]){N_, S_}, (int64_t[]){1, 0, 2, 0});
  CHECK_ERR(kiln_ctc_loss(x2, tg, il, tl, 0, 1, 0), "ctc_loss: log_probs [8,3] has 2 dims");
  CHECK_ERR(kiln_ctc_loss(x, tg, il, tl, 3, 1, 0), "blank 3 (from 0) is out of range");
  CHECK_ERR(kiln_ctc_loss(x, tg, il, tl, 0, 7, 0), "reduction 7");
  CHECK_ERR(kiln_ctc_loss(x, tg, il_long, tl, 0, 1, 0), "input length 5 of sample 0 (from 0) is out of range 0..4");
  CHECK_ERR(kiln_ctc_loss(x, tg, x, tl, 0, 1, 0), "input_lengths [4,2,3] is f64");
  CHECK_ERR(kiln_ctc_loss(x, tg_blank, il, tl, 0, 1, 0), "label 0 (from 0) at position 1 (from 0) of the target of sample 0 (from 0) is the blank");
  CHECK_ERR(kiln_ctc_loss(x, tg_rep, il_short, tl_rep, 0, 1, 0), "sample 0 (from 0) has input length 2, too short");
  struct kiln_tensor *ok = kiln_ctc_loss(x, tg_rep, il_short, tl_rep, 0, KILN_REDUCTION_NONE, 1);
  double *v = V(ok);
  CHECK(v[0] == 0 && v[1] > 0 && isfinite(v[1]));
  free(v);
  kiln_tensor_release(ok);
  struct kiln_tensor *all[] = {x, x2, tg, il, tl, il_long, tl_rep, tg_rep, il_short, tg_blank};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
}

int main(void) {
  test_values_and_gradient();
  test_batch();
  test_errors();
  CHECK(kiln_op_supported(KILN_OP_CTC_LOSS, KILN_CPU) && kiln_op_supported(KILN_OP_CTC_LOSS_BACKWARD, KILN_CPU));
  CHECK(strcmp(kiln_op_name(KILN_OP_CTC_LOSS_BACKWARD), "ctc_loss_backward") == 0);
  return check_done("test_ctc");
}
