/* test_parallel.c: the thread pool. Results of big elementwise ops and reductions are bitwise the
   same whatever the thread count, and right against a naive loop. Matrix products cut into panels
   agree with the whole product to rounding: OpenBLAS picks its kernels and blocking by a call's
   size, so a panel's rows may round differently (seen with its Haswell kernels on a Zen 5). */
#include "check.h"
#include <pthread.h>

static int same_bits(const struct kiln_tensor *a, const struct kiln_tensor *b) {
  if (!a || !b || a->numel != b->numel || a->dtype != b->dtype || !kiln_is_contiguous(a) || !kiln_is_contiguous(b)) return 0;
  int es = kiln_dtype_size(a->dtype);
  return memcmp((const char *)a->storage->data + a->offset * es, (const char *)b->storage->data + b->offset * es,
                (size_t)a->numel * (size_t)es) == 0;
}

static struct kiln_tensor *data(int ndim, const int64_t *sizes, int dtype, uint64_t seed) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sizes[d];
  double *v = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = hashval(seed * 7919 + (uint64_t)i);
  struct kiln_tensor *t = T(ndim, sizes, v, dtype);
  free(v);
  return t;
}

static void test_settings(void) {
  int n = kiln_get_num_threads();
  CHECK(n >= 1 && n <= 256);
  CHECK_ERR(kiln_set_num_threads(0), "0 threads");
  CHECK_ERR(kiln_set_num_threads(-3), "expected 1 to 256");
  CHECK_ERR(kiln_set_num_threads(257), "257");
  CHECK(kiln_get_num_threads() == n);   /* a refused setting changes nothing */
  for (int k = 1; k <= 4; k++) CHECK(kiln_set_num_threads(k) == 0 && kiln_get_num_threads() == k);
  CHECK(kiln_set_num_threads(n) == 0);
}

/* Every result of run() at 1..4 threads must match the 1-thread result bit for bit. */
typedef struct kiln_tensor *(*run_fn)(struct kiln_tensor *const *in);

/* a and b agree to within tol times the largest magnitude of a (f32 or f64, contiguous). */
static int near(const struct kiln_tensor *a, const struct kiln_tensor *b, double tol) {
  if (!a || !b || a->numel != b->numel || a->dtype != b->dtype || !kiln_is_contiguous(a) || !kiln_is_contiguous(b)) return 0;
  double big = 0, worst = 0;
  for (int64_t i = 0; i < a->numel; i++) {
    double x = a->dtype == KILN_F32 ? ((const float *)a->storage->data)[a->offset + i] : ((const double *)a->storage->data)[a->offset + i];
    double y = b->dtype == KILN_F32 ? ((const float *)b->storage->data)[b->offset + i] : ((const double *)b->storage->data)[b->offset + i];
    if (fabs(x) > big) big = fabs(x);
    if (fabs(x - y) > worst || x != x || y != y) worst = x != x || y != y ? INFINITY : fabs(x - y);
  }
  return worst <= tol * big;
}

/* The products at 2..max_threads threads against the 1-thread one, to rounding (see the top). */
static void check_threads_near(const char *what, run_fn run, struct kiln_tensor *const *in, int max_threads, int line) {
  kiln_set_num_threads(1);
  struct kiln_tensor *ref = run(in);
  check_report(ref != NULL, __FILE__, line, "%s: %s", what, kiln_error_message());
  double tol = ref && ref->dtype == KILN_F32 ? 1e-5 : 1e-13;
  for (int nt = 2; nt <= max_threads; nt++) {
    kiln_set_num_threads(nt);
    struct kiln_tensor *r = run(in);
    check_report(near(ref, r, tol), __FILE__, line, "%s: %d threads differ from 1 beyond rounding", what, nt);
    kiln_tensor_release(r);
  }
  kiln_tensor_release(ref);
}

static void check_threads(const char *what, run_fn run, struct kiln_tensor *const *in, int max_threads, int line) {
  kiln_set_num_threads(1);
  struct kiln_tensor *ref = run(in);
  check_report(ref != NULL, __FILE__, line, "%s: %s", what, kiln_error_message());
  for (int nt = 2; nt <= max_threads; nt++) {
    kiln_set_num_threads(nt);
    struct kiln_tensor *r = run(in);
    check_report(same_bits(ref, r), __FILE__, line, "%s: %d threads differ from 1", what, nt);
    kiln_tensor_release(r);
  }
  kiln_tensor_release(ref);
}

static struct kiln_tensor *run_mul(struct kiln_tensor *const *in) { return kiln_binary(KILN_OP_MUL, in[0], in[1]); }
static struct kiln_tensor *run_exp(struct kiln_tensor *const *in) { return kiln_unary(KILN_OP_EXP, in[0]); }
static struct kiln_tensor *run_bcast(struct kiln_tensor *const *in) { return kiln_binary(KILN_OP_SUB, in[2], in[3]); }
static struct kiln_tensor *run_sum(struct kiln_tensor *const *in) { return kiln_reduce(KILN_OP_SUM, in[0], 0, NULL, 0, 0); }
static struct kiln_tensor *run_rowsum(struct kiln_tensor *const *in) { return kiln_reduce(KILN_OP_SUM, in[2], 1, (int[]){1}, 0, 0); }
static struct kiln_tensor *run_colvar(struct kiln_tensor *const *in) { return kiln_reduce(KILN_OP_VAR, in[2], 1, (int[]){0}, 0, 1); }
static struct kiln_tensor *run_argmax(struct kiln_tensor *const *in) { return kiln_reduce(KILN_OP_ARGMAX, in[2], 1, (int[]){1}, 0, 0); }
static struct kiln_tensor *run_lse(struct kiln_tensor *const *in) { return kiln_reduce(KILN_OP_LOGSUMEXP, in[0], 0, NULL, 0, 0); }
static struct kiln_tensor *run_mm(struct kiln_tensor *const *in) { return kiln_matmul(in[0], in[1]); }
static struct kiln_tensor *run_mm_t(struct kiln_tensor *const *in) { return kiln_matmul(in[2], in[3]); }

static void test_elementwise_and_sums(void) {
  enum { N = 2000003 };
  struct kiln_tensor *a = data(1, (int64_t[]){N}, KILN_F32, 1), *b = data(1, (int64_t[]){N}, KILN_F32, 2);
  struct kiln_tensor *m0 = data(2, (int64_t[]){3001, 700}, KILN_F32, 3), *m = kiln_transpose(m0, 0, 1);   /* [700,3001], strided */
  struct kiln_tensor *col = data(2, (int64_t[]){700, 1}, KILN_F64, 4);
  struct kiln_tensor *in[4] = {a, b, m, col};
  check_threads("mul (contiguous, 2M)", run_mul, in, 4, __LINE__);
  check_threads("exp (contiguous, 2M)", run_exp, in, 4, __LINE__);
  check_threads("sub (transposed, broadcast, f32 - f64)", run_bcast, in, 4, __LINE__);
  check_threads("sum (2M)", run_sum, in, 4, __LINE__);
  check_threads("sum over rows of a transposed [700,3001]", run_rowsum, in, 4, __LINE__);
  check_threads("var over columns", run_colvar, in, 4, __LINE__);
  check_threads("argmax over rows", run_argmax, in, 4, __LINE__);
  check_threads("logsumexp (2M)", run_lse, in, 4, __LINE__);

  /* and the values are right (two threads) */
  kiln_set_num_threads(2);
  struct kiln_tensor *r = run_mul(in);
  double *va = V(a), *vb = V(b), *vr = V(r), *want = malloc(sizeof(double) * 700 * 3001);   /* > N */
  for (int64_t i = 0; i < N; i++) want[i] = (double)(float)(va[i] * vb[i]);
  CHECK_ARRAY_NEAR(vr, want, N, 0);
  free(vr); kiln_tensor_release(r);
  r = run_sum(in);
  double s = 0, x = 0;
  for (int64_t i = 0; i < N; i++) s += va[i];
  CHECK(kiln_tensor_item(r, &x) == 0);
  CHECK_NEAR(x, s, 1e-6 * (fabs(s) + 1));
  kiln_tensor_release(r);
  r = run_bcast(in);
  double *vm = V(m), *vc = V(col);
  vr = V(r);
  for (int64_t i = 0; i < 700; i++)
    for (int64_t j = 0; j < 3001; j++) want[i * 3001 + j] = vm[i * 3001 + j] - vc[i];   /* f32 - f64: an f64 result */
  CHECK_ARRAY_NEAR(vr, want, 700 * 3001, 0);
  free(vr); kiln_tensor_release(r);
  r = run_rowsum(in);
  vr = V(r);
  for (int64_t i = 0; i < 700; i++) {
    double rs = 0;
    for (int64_t j = 0; j < 3001; j++) rs += vm[i * 3001 + j];
    want[i] = rs;
  }
  CHECK_ARRAY_NEAR(vr, want, 700, 1e-4);
  free(vr); kiln_tensor_release(r);
  free(va); free(vb); free(vm); free(vc); free(want);
  kiln_tensor_release(col); kiln_tensor_release(m); kiln_tensor_release(m0);
  kiln_tensor_release(a); kiln_tensor_release(b);
}

static void test_matmul_threads(void) {
  for (int dt = KILN_F32; dt <= KILN_F64; dt++) {
    struct kiln_tensor *a = data(2, (int64_t[]){300, 200}, dt, 10), *b = data(2, (int64_t[]){200, 500}, dt, 11);
    /* and the same product from transposed storage */
    struct kiln_tensor *at0 = data(2, (int64_t[]){200, 300}, dt, 12), *at = kiln_transpose(at0, 0, 1);
    struct kiln_tensor *bt0 = data(2, (int64_t[]){500, 200}, dt, 13), *bt = kiln_transpose(bt0, 0, 1);
    struct kiln_tensor *in[4] = {a, b, at, bt};
    check_threads_near(dt == KILN_F32 ? "matmul f32 300x200 @ 200x500" : "matmul f64 300x200 @ 200x500", run_mm, in, 2, __LINE__);
    check_threads_near(dt == KILN_F32 ? "matmul f32, transposed operands" : "matmul f64, transposed operands", run_mm_t, in, 2, __LINE__);
    /* tall and wide shapes split the other way; a batch splits by matrices */
    struct kiln_tensor *tall = data(2, (int64_t[]){700, 64}, dt, 14), *thin = data(2, (int64_t[]){64, 30}, dt, 15);
    struct kiln_tensor *in2[4] = {tall, thin, NULL, NULL};
    check_threads_near("matmul tall @ thin", run_mm, in2, 3, __LINE__);
    struct kiln_tensor *ba = data(3, (int64_t[]){6, 40, 50}, dt, 16), *bb = data(3, (int64_t[]){6, 50, 30}, dt, 17);
    struct kiln_tensor *in3[4] = {ba, bb, NULL, NULL};
    check_threads_near("batched matmul", run_mm, in3, 4, __LINE__);

    /* against a naive triple loop, with two threads */
    kiln_set_num_threads(2);
    struct kiln_tensor *r = run_mm(in);
    double *va = V(a), *vb = V(b), *vr = V(r), *want = malloc(sizeof(double) * 300 * 500);
    for (int i = 0; i < 300; i++)
      for (int j = 0; j < 500; j++) {
        double s = 0;
        for (int p = 0; p < 200; p++) s += va[i * 200 + p] * vb[p * 500 + j];
        want[i * 500 + j] = s;
      }
    CHECK_SIZES(r, 300, 500);
    CHECK_ARRAY_NEAR(vr, want, 300 * 500, dt == KILN_F32 ? 2e-4 : 1e-11);
    free(vr); kiln_tensor_release(r);
    r = run_mm_t(in);
    double *vat = V(at), *vbt = V(bt);
    vr = V(r);
    for (int i = 0; i < 300; i++)
      for (int j = 0; j < 500; j++) {
        double s = 0;
        for (int p = 0; p < 200; p++) s += vat[i * 200 + p] * vbt[p * 500 + j];
        want[i * 500 + j] = s;
      }
    CHECK_ARRAY_NEAR(vr, want, 300 * 500, dt == KILN_F32 ? 2e-4 : 1e-11);
    free(vr); free(vat); free(vbt); kiln_tensor_release(r);
    free(va); free(vb); free(want);
    kiln_tensor_release(ba); kiln_tensor_release(bb); kiln_tensor_release(tall); kiln_tensor_release(thin);
    kiln_tensor_release(at); kiln_tensor_release(at0); kiln_tensor_release(bt); kiln_tensor_release(bt0);
    kiln_tensor_release(a); kiln_tensor_release(b);
  }
}

/* Two threads of the caller's use kiln at once: the pool serves one, the other runs inline;
   both get right results and their own error messages. */
struct worker { struct kiln_tensor *a; double want; int bad, errors_ok; };

static void *worker_main(void *arg) {
  struct worker *w = arg;
  for (int k = 0; k < 20; k++) {
    struct kiln_tensor *r = kiln_reduce(KILN_OP_SUM, w->a, 0, NULL, 0, 0);
    double x = 0;
    if (!r || kiln_tensor_item(r, &x) || fabs(x - w->want) > 1e-6 * (fabs(w->want) + 1)) w->bad++;
    kiln_tensor_release(r);
    struct kiln_tensor *e = kiln_reduce(KILN_OP_SUM, w->a, 1, (int[]){5}, 0, 0);
    w->errors_ok += e == NULL && strstr(kiln_error_message(), "dim 5 out of range") != NULL;
    kiln_tensor_release(e);
  }
  return NULL;
}

static void test_concurrent_callers(void) {
  kiln_set_num_threads(2);
  struct worker ws[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    ws[i].a = data(1, (int64_t[]){500000}, KILN_F64, 20 + (uint64_t)i);
    double *v = V(ws[i].a);
    ws[i].want = 0;
    for (int64_t k = 0; k < 500000; k++) ws[i].want += v[k];
    free(v);
    ws[i].bad = ws[i].errors_ok = 0;
  }
  for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, worker_main, &ws[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++) {
    CHECK(ws[i].bad == 0);
    CHECK(ws[i].errors_ok == 20);
    kiln_tensor_release(ws[i].a);
  }
}

int main(void) {
  struct kiln_memory_stats *ms = kiln_memory_stats(KILN_CPU);
  int64_t live0 = ms->live_bytes;
  int saved = kiln_get_num_threads();
  test_settings();
  test_elementwise_and_sums();
  test_matmul_threads();
  test_concurrent_callers();
  kiln_set_num_threads(saved);
  CHECK(ms->live_bytes == live0);
  return check_done("test_parallel");
}
