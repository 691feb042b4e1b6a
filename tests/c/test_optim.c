/* test_optim.c: the C API of the optimizer steps and of gradient clipping: values against
   PyTorch's algorithm written out here, the paths a Lua test reaches less easily (more than 64
   parameters, non-contiguous parameters, mixed dtypes, thread counts), and every check. */
#include "check.h"

static struct kiln_tensor *vec(int64_t n, const double *v, int dtype) { return T(1, (int64_t[]){n}, v, dtype); }

/* SGD with momentum and Nesterov over 3 steps on [1, -2, 3], f32 and f64. */
static void test_sgd_values(void) {
  static const double g[3][3] = {{0.5, -1, 2}, {-0.3, 0.2, 1}, {1.5, -0.5, -2}};
  for (int dt = 0; dt < 2; dt++) {
    int dtype = dt ? KILN_F64 : KILN_F32;
    struct kiln_tensor *p = vec(3, (double[]){1, -2, 3}, dtype), *buf = kiln_tensor_full(1, (int64_t[]){3}, 0, dtype, CPU);
    double want[3] = {1, -2, 3}, b[3];
    for (int s = 0; s < 3; s++) {
      struct kiln_tensor *gr = vec(3, g[s], dtype);
      CHECK(kiln_sgd_step(1, &p, &gr, &buf, 0.1, 0.9, 0, 0.01, 1, s == 0) == 0);
      for (int i = 0; i < 3; i++) {
        double d = g[s][i] + 0.01 * want[i];
        b[i] = s == 0 ? d : 0.9 * b[i] + d;
        want[i] -= 0.1 * (d + 0.9 * b[i]);
      }
      kiln_tensor_release(gr);
    }
    double *got = V(p);
    CHECK_ARRAY_CLOSE(got, want, 3, dt ? 1e-14 : 1e-6);
    free(got);
    kiln_tensor_release(p);
    kiln_tensor_release(buf);
  }
}

/* Adam (one step) on 100 parameters of odd sizes, two of them transposed, with some grads NULL:
   more than the front end's stack arrays hold, and big enough for the thread pool. */
static void test_adam_many(void) {
  enum { N = 100 };
  struct kiln_tensor *p[N], *g[N], *m[N], *v[N];
  int64_t sizes[N];
  for (int k = 0; k < N; k++) {
    sizes[k] = k == 50 ? 100003 : (k * 7) % 13;   /* includes empty ones */
    int64_t rows = 1, cols = sizes[k];
    if (k == 3 || k == 60) { rows = 3; cols = 5; sizes[k] = 15; }
    double *vals = malloc(sizeof(double) * (size_t)(sizes[k] + 1));
    for (int64_t i = 0; i < sizes[k]; i++) vals[i] = hashval((uint64_t)(k * 1000003 + i));
    if (rows > 1) {
      struct kiln_tensor *base = T(2, (int64_t[]){cols, rows}, vals, KILN_F64);
      p[k] = kiln_transpose(base, 0, 1);          /* [3,5], not contiguous */
      kiln_tensor_release(base);
    } else {
      p[k] = vec(sizes[k], vals, KILN_F64);
    }
    for (int64_t i = 0; i < sizes[k]; i++) vals[i] = hashval((uint64_t)(k * 7777 + i + 99));
    g[k] = k % 9 == 4 ? NULL : kiln_tensor_from_f64(p[k]->ndim, p[k]->sizes, vals, KILN_F64, CPU);
    m[k] = kiln_tensor_full(p[k]->ndim, p[k]->sizes, 0, KILN_F64, CPU);
    v[k] = kiln_tensor_full(p[k]->ndim, p[k]->sizes, 0, KILN_F64, CPU);
    free(vals);
  }
  CHECK(!kiln_is_contiguous(p[3]));
  double *before[N];
  for (int k = 0; k < N; k++) before[k] = V(p[k]);
  CHECK(kiln_adam_step(N, p, g, m, v, NULL, 1, 0.01, 0.9, 0.999, 1e-8, 0.1, 1, 0) == 0);
  int bad = 0;
  for (int k = 0; k < N && !bad; k++) {
    double *after = V(p[k]), *gv = g[k] ? V(g[k]) : NULL;
    for (int64_t i = 0; i < p[k]->numel; i++) {
      double want = before[k][i];
      if (gv) {   /* step 1: m = 0.1 g, v = 0.001 g^2, bias corrections 0.1 and 0.001 */
        double x = want * (1 - 0.01 * 0.1), mm = 0.1 * gv[i], vv = 0.001 * gv[i] * gv[i];
        want = x - 0.01 / 0.1 * mm / (sqrt(vv) / sqrt(0.001) + 1e-8);
      }
      if (fabs(after[i] - want) > 1e-12 * (1 + fabs(want))) {
        bad = 1;
        check_report(0, __FILE__, __LINE__, "parameter %d element %lld: %.17g, expected %.17g", k, (long long)i, after[i], want);
        break;
      }
    }
    free(after);
    free(gv);
  }
  CHECK(!bad);
  for (int k = 0; k < N; k++) {
    free(before[k]);
    kiln_tensor_release(p[k]); kiln_tensor_release(g[k]); kiln_tensor_release(m[k]); kiln_tensor_release(v[k]);
  }
}

/* The result does not depend on the thread count, and f32 and f64 parameters share a call. */
static void test_threads_and_dtypes(void) {
  int64_t n = 200001;
  double *vals = malloc(sizeof(double) * (size_t)(n + 1));
  for (int64_t i = 0; i <= n; i++) vals[i] = hashval((uint64_t)i);
  double *results[2];
  int threads = kiln_get_num_threads();
  for (int r = 0; r < 2; r++) {
    kiln_set_num_threads(r == 0 ? 1 : (threads > 1 ? threads : 2));
    struct kiln_tensor *p[2] = {vec(n, vals, KILN_F32), vec(5, vals, KILN_F64)};
    struct kiln_tensor *g[2] = {vec(n, vals + 1, KILN_F32), vec(5, vals + 1, KILN_F64)};
    struct kiln_tensor *s[2] = {kiln_tensor_full(1, &n, 0.1, KILN_F32, CPU), kiln_tensor_full(1, (int64_t[]){5}, 0.1, KILN_F64, CPU)};
    CHECK(kiln_rmsprop_step(2, p, g, s, NULL, NULL, 0.01, 0.99, 1e-8, 0, 0, 0) == 0);
    CHECK(kiln_adagrad_step(2, p, g, s, 2, 0.01, 0.1, 0.01, 1e-10) == 0);
    results[r] = V(p[0]);
    double *small = V(p[1]);
    /* f64: RMSprop then Adagrad on element 0, by hand. */
    double x = vals[0], gg = vals[1], sq = 0.99 * 0.1 + 0.01 * gg * gg;
    x -= 0.01 * gg / (sqrt(sq) + 1e-8);
    gg += 0.01 * x;
    sq += gg * gg;
    x -= 0.01 / 1.1 * gg / (sqrt(sq) + 1e-10);
    CHECK_NEAR(small[0], x, 1e-14);
    free(small);
    for (int k = 0; k < 2; k++) { kiln_tensor_release(p[k]); kiln_tensor_release(g[k]); kiln_tensor_release(s[k]); }
  }
  kiln_set_num_threads(threads);
  CHECK(memcmp(results[0], results[1], sizeof(double) * (size_t)n) == 0);
  free(results[0]); free(results[1]); free(vals);
}

static void test_errors(void) {
  struct kiln_tensor *p = vec(3, (double[]){1, 2, 3}, KILN_F32), *q = kiln_tensor_full(2, (int64_t[]){2, 2}, 1, KILN_F32, CPU);
  struct kiln_tensor *ps[2] = {p, q};
  struct kiln_tensor *wrong = kiln_tensor_full(1, (int64_t[]){4}, 1, KILN_F32, CPU), *g3 = kiln_tensor_full(1, (int64_t[]){3}, 1, KILN_F32, CPU);
  struct kiln_tensor *g64 = kiln_tensor_full(2, (int64_t[]){2, 2}, 1, KILN_F64, CPU);
  struct kiln_tensor *gs[2] = {g3, wrong};
  CHECK_ERR(kiln_sgd_step(2, ps, gs, NULL, 0.1, 0, 0, 0, 0, 0), "sgd_step: parameter 1: grad [4] does not match the parameter's shape [2,2]");
  double *v = V(p);
  CHECK(v[0] == 1 && v[1] == 2);                    /* checked before anything was written */
  free(v);
  gs[1] = g64;
  CHECK_ERR(kiln_sgd_step(2, ps, gs, NULL, 0.1, 0, 0, 0, 0, 0), "parameter 1: grad [2,2] is f64, the parameter is f32");
  gs[1] = NULL;
  CHECK_ERR(kiln_sgd_step(2, ps, gs, NULL, 0.1, 0.9, 0, 0, 0, 0), "parameter 0 [3] has a grad but no momentum buffer");
  struct kiln_tensor *m[2] = {q, NULL};
  CHECK_ERR(kiln_sgd_step(2, ps, gs, m, 0.1, 0.9, 0, 0, 0, 0), "parameter 0: momentum buffer [2,2] does not match");
  m[0] = p;
  CHECK_ERR(kiln_sgd_step(2, ps, gs, m, 0.1, 0.9, 0, 0, 0, 0), "momentum buffer [3] shares memory with the parameter");
  CHECK_ERR(kiln_sgd_step(2, ps, gs, NULL, -1, 0, 0, 0, 0, 0), "sgd_step: lr = -1");
  CHECK_ERR(kiln_sgd_step(2, ps, gs, NULL, 0.1, 0, 0.5, 0, 1, 0), "nesterov momentum needs momentum > 0 and dampening = 0");
  CHECK_ERR(kiln_adam_step(2, ps, gs, NULL, NULL, NULL, 0, 0.1, 0.9, 0.999, 1e-8, 0, 0, 0), "adam_step: step = 0");
  CHECK_ERR(kiln_adam_step(2, ps, gs, NULL, NULL, NULL, 1, 0.1, 1.0, 0.999, 1e-8, 0, 0, 0), "beta1 = 1");
  struct kiln_tensor *base = kiln_tensor_full(1, (int64_t[]){6}, 0, KILN_F32, CPU);
  struct kiln_tensor *strided = kiln_tensor_full(2, (int64_t[]){3, 2}, 0, KILN_F32, CPU), *col = kiln_select(strided, 1, 0);
  struct kiln_tensor *sums[2] = {col, NULL};
  CHECK_ERR(kiln_adagrad_step(2, ps, gs, sums, 1, 0.1, 0, 0, 1e-10), "adagrad_step: parameter 0: sum [3] is not contiguous");
  struct kiln_tensor *i64 = kiln_tensor_full(1, (int64_t[]){3}, 0, KILN_I64, CPU);
  struct kiln_tensor *gi[1] = {g3};
  CHECK_ERR(kiln_sgd_step(1, &i64, gi, NULL, 0.1, 0, 0, 0, 0, 0), "parameter 0 [3] is i64");
  CHECK_ERR(kiln_sgd_step(-1, ps, gs, NULL, 0.1, 0, 0, 0, 0, 0), "sgd_step: -1 parameters");
  CHECK(kiln_sgd_step(0, NULL, NULL, NULL, 0.1, 0, 0, 0, 0, 0) == 0);
  /* The process still works: a good step after the failures. */
  CHECK(kiln_sgd_step(2, ps, gs, NULL, 0.5, 0, 0, 0, 0, 0) == 0);
  v = V(p);
  CHECK_NEAR(v[0], 0.5, 0);
  free(v);
  kiln_tensor_release(p); kiln_tensor_release(q); kiln_tensor_release(wrong); kiln_tensor_release(g3);
  kiln_tensor_release(g64); kiln_tensor_release(base); kiln_tensor_release(strided); kiln_tensor_release(col);
  kiln_tensor_release(i64);
}

static void test_clip(void) {
  struct kiln_tensor *a = vec(3, (double[]){3, -4, 12}, KILN_F32), *b = vec(2, (double[]){0, 0}, KILN_F64);
  struct kiln_tensor *gs[3] = {a, NULL, b};
  double total = -1;
  CHECK(kiln_clip_grad_norm(3, gs, 6.5, 2, &total) == 0);
  CHECK_NEAR(total, 13, 1e-12);
  double *v = V(a);
  CHECK_NEAR(v[2], (double)(float)(12 * (6.5 / (13 + 1e-6))), 1e-6);
  free(v);
  CHECK(kiln_clip_grad_norm(3, gs, 100, INFINITY, &total) == 0);
  CHECK_NEAR(total, (double)(float)(12 * (6.5 / (13 + 1e-6))), 1e-12);
  CHECK(kiln_clip_grad_value(3, gs, 1) == 0);
  v = V(a);
  CHECK(v[0] == 1 && v[1] == -1 && v[2] == 1);
  free(v);
  CHECK_ERR(kiln_clip_grad_norm(3, gs, 1, 0, &total), "clip_grad_norm: norm_type = 0");
  CHECK_ERR(kiln_clip_grad_value(3, gs, NAN), "clip_grad_value: clip = nan");
  CHECK(kiln_clip_grad_norm(0, NULL, 1, 2, &total) == 0 && total == 0);
  kiln_tensor_release(a); kiln_tensor_release(b);
}

int main(void) {
  test_sgd_values();
  test_adam_many();
  test_threads_and_dtypes();
  test_errors();
  test_clip();
  return check_done("test_optim");
}
